//! What every answer carries to keep a browser from being turned against the console: a Content Security
//! Policy, no framing, no content sniffing, HSTS where the console is served over https, and a bound on
//! request bodies.

use app::security::{page_policy, PageNonce};
use axum::extract::Request;
use axum::http::{header, HeaderValue, Method};
use axum::response::Response;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// The largest request body any route takes: a deploy or a plan is a few kilobytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// The policy of everything that is not a page (JSON, CSV, events, assets).
const OTHER_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// Whether `request` may be answered with a page: only those get a nonce to render (the REST API, assets
/// and server functions are most of the traffic, and a nonce is a random number and an allocation).
fn may_be_page(request: &Request) -> bool {
    let path = request.uri().path();
    matches!(*request.method(), Method::GET | Method::HEAD)
        && !["/api/", "/pkg/", "/rpc/"]
            .iter()
            .any(|prefix| path.starts_with(prefix))
        && path != "/metrics"
}

/// Adds the security headers to every answer: a page's policy with the nonce its shell rendered, any other
/// answer's policy that allows nothing. A layer of its own rather than a middleware function, which would
/// box the rest of the stack and its own future on every request.
#[derive(Debug, Clone, Copy, Default)]
pub struct HeadersLayer {
    /// Served over https: browsers are told to come back over https only (HSTS).
    https: bool,
}

impl HeadersLayer {
    /// The headers of a console served over https (`https`) or plain http.
    pub fn new(https: bool) -> HeadersLayer {
        HeadersLayer { https }
    }
}

impl<S> tower::Layer<S> for HeadersLayer {
    type Service = Headers<S>;

    fn layer(&self, inner: S) -> Headers<S> {
        Headers {
            inner,
            https: self.https,
        }
    }
}

/// The service of [`HeadersLayer`].
#[derive(Debug, Clone)]
pub struct Headers<S> {
    inner: S,
    https: bool,
}

/// A year of https only, as browsers keep it (no subdomains: they may be other servers').
const HSTS: &str = "max-age=31536000";

impl<S> tower::Service<Request> for Headers<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = WithHeaders<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request) -> WithHeaders<S::Future> {
        let nonce = may_be_page(&request).then(|| {
            let nonce = PageNonce::default();
            request.extensions_mut().insert(nonce.clone());
            nonce
        });
        WithHeaders {
            inner: self.inner.call(request),
            nonce,
            https: self.https,
        }
    }
}

pin_project_lite::pin_project! {
    /// An answer on its way, to get the headers.
    pub struct WithHeaders<F> {
        #[pin]
        inner: F,
        nonce: Option<PageNonce>,
        https: bool,
    }
}

impl<F, E> Future for WithHeaders<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = std::task::ready!(this.inner.poll(cx))?;
        let policy = this
            .nonce
            .as_ref()
            .and_then(|nonce| nonce.0.get())
            .and_then(|n| HeaderValue::from_str(&page_policy(n)).ok())
            .unwrap_or(HeaderValue::from_static(OTHER_POLICY));
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_SECURITY_POLICY, policy);
        headers.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        headers.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("same-origin"),
        );
        if *this.https {
            headers.insert(
                header::STRICT_TRANSPORT_SECURITY,
                HeaderValue::from_static(HSTS),
            );
        }
        Poll::Ready(Ok(response))
    }
}
