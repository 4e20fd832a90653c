//! What crosses the gateway in headers: the one rule for what an engine is told of the caller and what the
//! caller is told of the engine, kept apart so it reads (and is tested) on its own.

use axum::http::{header, HeaderMap, HeaderName};

/// The headers that go on to the other side: not the hop-by-hop ones (RFC 9110, 7.6.1), those the
/// `Connection` header names among them; not the caller's Tessera key, session cookie or CSRF token (an
/// engine is not told them); not an engine's cookies (the gateway answers on the console's origin, where
/// they would sit beside the session's); and not the host, which the client sets for its connection.
pub(super) fn passed_on(mut headers: HeaderMap) -> HeaderMap {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::try_from(name.trim()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::HOST,
        header::AUTHORIZATION,
        header::COOKIE,
        header::SET_COOKIE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove(app::auth::CSRF_HEADER);
    headers.remove("proxy-connection");
    headers
}
