//! What crosses the gateway in headers: the one rule for what an engine is told of the caller and what the
//! caller is told of the engine, kept apart so it reads (and is tested) on its own.

use axum::http::{header, HeaderMap};

/// The headers that go on to the other side: not the hop-by-hop ones (RFC 9110, 7.6.1), not the caller's
/// Tessera key, session cookie or CSRF token (an engine is not told them), and not the host, which the
/// client sets for its connection.
pub(super) fn passed_on(mut headers: HeaderMap) -> HeaderMap {
    for name in [
        header::CONNECTION,
        header::HOST,
        header::AUTHORIZATION,
        header::COOKIE,
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
