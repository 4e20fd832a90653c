//! Server function calls carry the browser session's CSRF token: the server renders it into the page's
//! `<meta name="csrf-token">`, and [`CsrfClient`] (every server function's client) sends it back in the
//! `x-csrf-token` header. Another site can make a browser send the session cookie, but not read the page,
//! so it cannot send the token; the server refuses a change that lacks it.

#[cfg(not(feature = "ssr"))]
use crate::auth::CSRF_HEADER;
use futures::{Sink, Stream};
use leptos::server_fn::client::browser::BrowserClient;
use leptos::server_fn::client::Client;
use leptos::server_fn::error::FromServerFnError;
use leptos::server_fn::request::browser::BrowserRequest;
use leptos::server_fn::response::browser::BrowserResponse;
use leptos::server_fn::Bytes;
use std::future::Future;

/// The browser's `fetch`, with the CSRF token added.
pub struct CsrfClient;

impl<E, IS, OS> Client<E, IS, OS> for CsrfClient
where
    E: FromServerFnError,
    IS: FromServerFnError,
    OS: FromServerFnError,
{
    type Request = BrowserRequest;
    type Response = BrowserResponse;

    fn send(req: BrowserRequest) -> impl Future<Output = Result<BrowserResponse, E>> + Send {
        #[cfg(not(feature = "ssr"))]
        if let Some(token) = crate::auth::rendered_csrf() {
            req.headers().set(CSRF_HEADER, &token);
        }
        <BrowserClient as Client<E, IS, OS>>::send(req)
    }

    #[allow(refining_impl_trait)]
    fn open_websocket(
        path: &str,
    ) -> impl Future<
        Output = Result<
            (
                impl Stream<Item = Result<Bytes, Bytes>> + Send + 'static,
                impl Sink<Bytes> + Send + 'static,
            ),
            E,
        >,
    > + Send {
        <BrowserClient as Client<E, IS, OS>>::open_websocket(path)
    }

    fn spawn(future: impl Future<Output = ()> + Send + 'static) {
        <BrowserClient as Client<E, IS, OS>>::spawn(future)
    }
}
