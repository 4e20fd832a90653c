//! The HTTP surface, driven through the router without a socket.

mod upgrades;

use crate::testing::{TestApp, MAJIN};
use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;

/// Sends `request` as the test admin.
async fn send(request: Request<Body>) -> (StatusCode, String) {
    let app = TestApp::new(MAJIN).await;
    let mut request = request;
    request.headers_mut().insert(
        axum::http::header::AUTHORIZATION,
        format!("Bearer {}", app.token).parse().unwrap(),
    );
    let response = app.send(request).await;
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

#[tokio::test]
async fn health_answers_ok() {
    let (status, body) = send(Request::get("/api/health").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains(r#""status":"ok""#), "{body}");
}

#[tokio::test]
async fn every_page_is_rendered_on_the_server_and_loads_its_wasm_bundle() {
    for uri in [
        "/",
        "/models",
        "/nodes",
        "/deploy",
        "/machines/majin",
        "/usage",
    ] {
        let (status, body) = send(Request::get(uri).body(Body::empty()).unwrap()).await;
        assert_eq!(status, StatusCode::OK, "{uri}");
        assert!(body.contains("/pkg/tessera.js"), "{uri}: {body}");
        assert!(body.contains(r#"<main id="main""#), "{uri}: {body}");
    }
}

#[tokio::test]
async fn server_functions_live_under_their_own_prefix_beside_the_rest_api() {
    let (status, body) = send(
        Request::post("/rpc/list_nodes")
            .header("content-type", "application/x-www-form-urlencoded")
            .body(Body::from("search=&page=1"))
            .unwrap(),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    let nodes = &page["rows"];
    assert_eq!(nodes[0]["name"], "majin");
    assert_eq!(
        nodes[0]["free"],
        7 * (1u64 << 30),
        "8 GB less the 1 GB held outside"
    );
    let (status, _) = send(Request::get("/api/machines").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
}

/// Tests build a router each, and a restarted server builds another beside the pages being rendered: listing
/// the console's routes suppresses resource loads process-wide (leptos#4773), so it must happen once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_rendered_while_another_router_is_built_still_answers() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let app = TestApp::new(MAJIN).await;
    let rendering = std::sync::Arc::new(AtomicBool::new(true));
    let builder = std::thread::spawn({
        let rendering = rendering.clone();
        move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let _inside = runtime.enter();
            while rendering.load(Ordering::Relaxed) {
                drop(crate::route_list());
            }
        }
    });
    for _ in 0..100 {
        let mut request = Request::get("/usage").body(Body::empty()).unwrap();
        request.headers_mut().insert(
            axum::http::header::AUTHORIZATION,
            format!("Bearer {}", app.token).parse().unwrap(),
        );
        let answer = tokio::time::timeout(std::time::Duration::from_secs(10), async {
            let response = app.send(request).await;
            let status = response.status();
            response.into_body().collect().await.unwrap();
            status
        })
        .await;
        assert_eq!(answer, Ok(StatusCode::OK), "the page answers in time");
    }
    rendering.store(false, Ordering::Relaxed);
    builder.join().unwrap();
}
