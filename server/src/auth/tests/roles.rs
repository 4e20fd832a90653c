//! API tokens and roles: no caller, a viewer, an operator, a revoked or unknown token.

use super::{account, WORKER};
use crate::testing::{TestApp, MAJIN};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use serde_json::json;

#[tokio::test]
async fn a_write_without_a_session_or_token_gets_401_and_changes_nothing() {
    let app = TestApp::new(MAJIN).await;
    let (status, body) = app
        .call_with(None, Method::POST, "/api/workers", Some(WORKER))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(
        body["error"],
        "sign in, or send an API token as Authorization: Bearer tsr_…"
    );
    let (status, _) = app
        .call_with(None, Method::GET, "/api/machines", None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "reads need a caller too");
    let (status, _) = app.call_with(None, Method::GET, "/metrics", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = app.call_with(None, Method::GET, "/api/health", None).await;
    assert_eq!(status, StatusCode::OK, "health is open");
    let (_, workers) = app.get("/api/workers").await;
    assert_eq!(workers, json!([]));
}

#[tokio::test]
async fn a_viewer_reads_and_its_writes_get_403() {
    let app = TestApp::new(MAJIN).await;
    let viewer = account(&app, "vera", "viewer").await;
    let (status, _) = app
        .call_with(Some(&viewer), Method::GET, "/api/machines", None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app
        .call_with(Some(&viewer), Method::POST, "/api/workers", Some(WORKER))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(
        body["error"],
        "vera is a viewer: this needs the operator role"
    );
    let (status, _) = app
        .call_with(Some(&viewer), Method::GET, "/api/users", None)
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "accounts are for admins");
    // Server functions check their own role.
    let request = Request::post("/rpc/remove_model")
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::AUTHORIZATION, format!("Bearer {viewer}"))
        .body(Body::from(r#"{"model": "x", "revision": 1}"#))
        .unwrap();
    assert_eq!(app.send(request).await.status(), StatusCode::FORBIDDEN);

    let operator = account(&app, "otto", "operator").await;
    let (status, body) = app
        .call_with(Some(&operator), Method::POST, "/api/workers", Some(WORKER))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (_, log) = app.get("/api/audit?action=worker").await;
    assert_eq!(log[0]["actor"], "otto");
    assert_eq!(log[0]["target"], "listen");
}

#[tokio::test]
async fn a_revoked_or_unknown_token_gets_401() {
    let app = TestApp::new(MAJIN).await;
    let secret = account(&app, "otto", "operator").await;
    let (_, tokens) = app.get("/api/tokens").await;
    let id = tokens
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["user"] == "otto")
        .unwrap()["id"]
        .as_i64()
        .unwrap();
    assert!(
        tokens.to_string().find(&secret).is_none(),
        "a secret is never listed"
    );
    let (status, _) = app
        .call(Method::DELETE, &format!("/api/tokens/{id}"), None)
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = app
        .call_with(Some(&secret), Method::GET, "/api/machines", None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    let (status, _) = app
        .call_with(Some("tsr_0000"), Method::GET, "/api/machines", None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let basic = Request::get("/api/machines")
        .header(header::AUTHORIZATION, "Basic YWRhOnBhc3N3b3Jk")
        .body(Body::empty())
        .unwrap();
    assert_eq!(app.send(basic).await.status(), StatusCode::UNAUTHORIZED);
}
