//! The HTTP surface, driven through the router without a socket.

use crate::testing::{TestApp, MAJIN};
use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

async fn send(request: Request<Body>) -> (StatusCode, String) {
    let app = TestApp::new(MAJIN).await;
    let response = app.router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

fn check_plan(body: &str) -> Request<Body> {
    Request::post("/rpc/check_share_plan")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::ACCEPT, "application/json")
        .body(Body::from(body.to_owned()))
        .unwrap()
}

#[tokio::test]
async fn health_answers_ok() {
    let (status, body) = send(Request::get("/api/health").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains(r#""status":"ok""#), "{body}");
}

#[tokio::test]
async fn the_share_plan_page_is_rendered_on_the_server_with_its_verdict() {
    let (status, body) = send(Request::get("/").body(Body::empty()).unwrap()).await;
    assert_eq!(status, StatusCode::OK);
    assert!(body.contains("Shared GPU memory"), "{body}");
    assert!(
        body.contains("The shares add up to 85% of one accelerator, which fits."),
        "{body}"
    );
    assert!(body.contains("not editable"), "{body}");
    assert!(
        body.contains("/pkg/tessera.js"),
        "the page loads its wasm bundle: {body}"
    );
}

#[tokio::test]
async fn the_server_judges_a_plan_with_placement() {
    let plan = r#"{"members": [
        {"name": "semantic-router", "share": 1000, "locked": true},
        {"name": "glm-5.3", "share": 7000, "locked": false},
        {"name": "vision", "share": 2500, "locked": false},
        {"name": "speech", "share": 0, "locked": false}]}"#;
    let (status, body) = send(check_plan(plan)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let verdict: placement::Verdict = serde_json::from_str(&body).unwrap();
    assert_eq!(
        verdict.problems,
        [
            placement::Problem::NoShare {
                member: "speech".into()
            },
            placement::Problem::OverAccelerator
        ]
    );
}

#[tokio::test]
async fn the_server_keeps_the_routers_committed_share_whatever_the_browser_sends() {
    let plan = r#"{"members": [
        {"name": "semantic-router", "share": 0, "locked": false},
        {"name": "glm-5.3", "share": 4000, "locked": false},
        {"name": "vision", "share": 2500, "locked": false},
        {"name": "speech", "share": 1000, "locked": false}]}"#;
    let (status, body) = send(check_plan(plan)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let verdict: placement::Verdict = serde_json::from_str(&body).unwrap();
    assert_eq!(verdict.total, placement::BasisPoints::percent(85));
    assert!(!verdict.is_refused());
}

#[tokio::test]
async fn a_plan_naming_a_stranger_is_refused_with_what_to_fix() {
    let plan = r#"{"members": [{"name": "intruder", "share": 1000, "locked": false}]}"#;
    let (status, body) = send(check_plan(plan)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("text-router has no member named intruder; send the group's members only."),
        "{body}"
    );
}

#[tokio::test]
async fn a_plan_that_repeats_a_member_is_refused() {
    let plan = r#"{"members": [
        {"name": "semantic-router", "share": 1000, "locked": true},
        {"name": "glm-5.3", "share": 4000, "locked": false},
        {"name": "glm-5.3", "share": 4000, "locked": false},
        {"name": "speech", "share": 1000, "locked": false}]}"#;
    let (status, body) = send(check_plan(plan)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body.contains("Send every member of text-router once; glm-5.3 is missing or repeated."),
        "{body}"
    );
}
