//! What every answer carries, whoever asks: the security headers, a page's policy, and the body limit.

use super::Browser;
use crate::testing::{TestApp, ADMIN, ADMIN_PASSWORD, MAJIN};
use axum::http::{header, Method, StatusCode};

#[tokio::test]
async fn every_answer_carries_the_security_headers_and_a_page_its_policy() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    browser.sign_in(ADMIN, ADMIN_PASSWORD).await;
    let page = browser.get("/nodes").await;
    let policy = page.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap();
    let nonce = page
        .body
        .split("nonce=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .expect("the hydration script has a nonce");
    assert!(policy.contains(&format!("'nonce-{nonce}'")), "{policy}");
    assert!(policy.contains("'wasm-unsafe-eval'"), "{policy}");
    assert!(policy.contains("frame-ancestors 'none'"), "{policy}");
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    assert_eq!(page.headers[header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    assert_eq!(page.headers[header::X_FRAME_OPTIONS], "DENY");
    let json = browser.get("/api/health").await;
    assert_eq!(
        json.headers[header::CONTENT_SECURITY_POLICY],
        "default-src 'none'; frame-ancestors 'none'"
    );
}

#[tokio::test]
async fn a_body_past_the_limit_is_refused_with_413() {
    let app = TestApp::new(MAJIN).await;
    let name = "x".repeat(crate::security::MAX_BODY_BYTES + 1);
    let body = format!(r#"{{"name": "{name}", "requested_resources": {{}}}}"#);
    let (status, answer) = app.call(Method::POST, "/api/workers", Some(&body)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{answer}");
    assert_eq!(
        answer["error"],
        "the request body is larger than the 256 KiB a request may send"
    );
}

#[test]
fn behind_a_trusted_proxy_the_client_is_the_last_forwarded_address_that_is_not_a_proxy_and_otherwise_the_connection_s(
) {
    use std::net::IpAddr;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let proxies = [ip("10.0.0.2"), ip("10.0.0.3")];
    // A client may write anything first; the proxies append what they saw.
    let forwarded = ["6.6.6.6, 203.0.113.7", "10.0.0.3"];
    assert_eq!(
        super::super::client(ip("10.0.0.2"), forwarded.into_iter(), &proxies),
        ip("203.0.113.7")
    );
    // Not through a trusted proxy: what it says of itself is not believed.
    assert_eq!(
        super::super::client(ip("198.51.100.9"), forwarded.into_iter(), &proxies),
        ip("198.51.100.9")
    );
    // A proxy that forwards nothing is the client.
    assert_eq!(
        super::super::client(ip("10.0.0.2"), std::iter::empty(), &proxies),
        ip("10.0.0.2")
    );
}

#[test]
fn behind_a_trusted_proxy_a_hop_that_is_no_address_ends_the_walk_so_that_a_client_cannot_choose_its_own(
) {
    use std::net::IpAddr;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let proxies = [ip("10.0.0.2"), ip("10.0.0.3")];
    // The proxy nearest the client wrote something that is no address: what came before it is the
    // client's own writing, and the proxy is as far as the walk believes.
    for written in ["unknown", "203.0.113.7 junk", "_hidden", ""] {
        let forwarded = [format!("6.6.6.6, {written}, 10.0.0.3")];
        assert_eq!(
            super::super::client(
                ip("10.0.0.2"),
                forwarded.iter().map(String::as_str),
                &proxies
            ),
            ip("10.0.0.3"),
            "{written:?}"
        );
    }
    // Addresses with their ports, as some proxies write them, are addresses.
    for (written, client) in [
        ("203.0.113.7:4711", "203.0.113.7"),
        ("[2001:db8::1]:443", "2001:db8::1"),
    ] {
        let forwarded = [format!("6.6.6.6, {written}")];
        assert_eq!(
            super::super::client(
                ip("10.0.0.2"),
                forwarded.iter().map(String::as_str),
                &proxies
            ),
            ip(client)
        );
    }
}

#[tokio::test]
async fn a_client_that_takes_gzip_gets_json_and_pages_compressed_and_the_same_once_unpacked_and_events_as_they_come(
) {
    use http_body_util::BodyExt;
    let app = TestApp::new(MAJIN).await;
    let get = |uri: &str, gzip: bool| {
        let mut request = axum::http::Request::get(uri)
            .header(header::AUTHORIZATION, format!("Bearer {}", app.token));
        if gzip {
            request = request.header(header::ACCEPT_ENCODING, "gzip");
        }
        app.send(request.body(axum::body::Body::empty()).unwrap())
    };
    for uri in ["/api/machines", "/api/openapi.json", "/nodes"] {
        let plain = get(uri, false).await;
        assert!(plain.headers().get(header::CONTENT_ENCODING).is_none());
        let plain = plain.into_body().collect().await.unwrap().to_bytes();
        let packed = get(uri, true).await;
        assert_eq!(packed.headers()[header::CONTENT_ENCODING], "gzip", "{uri}");
        let packed = packed.into_body().collect().await.unwrap().to_bytes();
        let mut unpacked = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(&packed[..]),
            &mut unpacked,
        )
        .unwrap();
        if uri == "/nodes" {
            // A page carries a nonce of its own each time; its text is the same.
            assert!(
                String::from_utf8(unpacked).unwrap().contains("majin"),
                "{uri}"
            );
        } else {
            assert_eq!(unpacked, plain, "{uri}");
        }
    }
    // An event stream is not held back to be compressed.
    let events = get("/api/events", true).await;
    assert_eq!(events.headers()[header::CONTENT_TYPE], "text/event-stream");
    assert!(events.headers().get(header::CONTENT_ENCODING).is_none());
}
