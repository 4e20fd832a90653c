//! What every answer carries to keep a browser from being turned against the console: a Content Security
//! Policy, no framing, no content sniffing, and a bound on request bodies.

use app::security::{page_policy, PageNonce};
use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;

/// The largest request body any route takes: a deploy or a plan is a few kilobytes.
pub const MAX_BODY_BYTES: usize = 256 * 1024;

/// The policy of everything that is not a page (JSON, CSV, events, assets).
const OTHER_POLICY: &str = "default-src 'none'; frame-ancestors 'none'";

/// Adds the security headers to every answer: a page's policy with the nonce its shell rendered, any other
/// answer's policy that allows nothing.
pub async fn headers(mut request: Request, next: Next) -> Response {
    let nonce = PageNonce::default();
    request.extensions_mut().insert(nonce.clone());
    let mut response = next.run(request).await;
    let policy = nonce
        .0
        .get()
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
    response
}
