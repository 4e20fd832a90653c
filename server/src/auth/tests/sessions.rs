//! Browser sessions: the CSRF token a change must carry, no session stored for what needs none, and only a
//! digest of each session's id in the database.

use super::Browser;
use crate::auth::same_token;
use crate::testing::{TestApp, ADMIN, ADMIN_PASSWORD, MAJIN};
use axum::http::{header, StatusCode};
use serde_json::json;

#[tokio::test]
async fn a_browser_change_without_the_csrf_token_gets_403() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    let signed_in = browser.sign_in(ADMIN, ADMIN_PASSWORD).await;
    assert_eq!(signed_in.status, StatusCode::SEE_OTHER);
    assert_eq!(signed_in.location(), "/nodes");
    let cookie = signed_in
        .headers
        .get(header::SET_COOKIE)
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(cookie.contains("HttpOnly"), "{cookie}");
    assert!(cookie.contains("SameSite=Lax"), "{cookie}");

    let page = browser.get("/nodes").await;
    assert_eq!(page.status, StatusCode::OK);
    let csrf = page.csrf();
    let deploy = json!({"name": "listen", "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 2}}});
    let refused = browser
        .post_json("/api/workers", deploy.clone(), None)
        .await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN, "{}", refused.body);
    assert!(refused.body.contains("CSRF token"), "{}", refused.body);
    let forged = browser
        .post_json("/api/workers", deploy.clone(), Some("not-the-token"))
        .await;
    assert_eq!(forged.status, StatusCode::FORBIDDEN);
    let rpc = browser
        .post_json(
            "/rpc/remove_model",
            json!({"model": "nothing", "revision": 1}),
            None,
        )
        .await;
    assert_eq!(rpc.status, StatusCode::FORBIDDEN, "server functions too");
    let (_, workers) = app.get("/api/workers").await;
    assert_eq!(workers, json!([]), "nothing changed");

    let made = browser.post_json("/api/workers", deploy, Some(&csrf)).await;
    assert_eq!(made.status, StatusCode::CREATED, "{}", made.body);
    let (_, log) = app.get("/api/audit?target=listen").await;
    assert_eq!(log[0]["actor"], ADMIN);

    let out = browser.post_form("/logout", &[("csrf", &csrf)]).await;
    assert_eq!(out.location(), "/login");
    let after = browser.get("/nodes").await;
    assert_eq!(after.status, StatusCode::SEE_OTHER, "signed out");
}

#[tokio::test]
async fn a_request_to_a_public_path_or_a_visit_sent_to_sign_in_stores_no_session() {
    let app = TestApp::new(MAJIN).await;
    for path in [
        "/api/health",
        "/api/openapi.json",
        "/favicon.svg",
        "/pkg/tessera.css",
        "/nodes",
    ] {
        let answer = Browser::new(&app).get(path).await;
        assert!(
            !answer.headers.contains_key(header::SET_COOKIE),
            "{path}: {:?}",
            answer.headers
        );
    }
    let sessions: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM sessions")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(sessions, 0);
    // The sign-in page does need one, for its form's CSRF token.
    let login = Browser::new(&app).get("/login").await;
    assert!(login.headers.contains_key(header::SET_COOKIE));
}

#[tokio::test]
async fn the_database_holds_a_digest_of_each_session_id_and_never_the_id() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    browser.sign_in(ADMIN, ADMIN_PASSWORD).await;
    let cookie = browser.cookie.clone().unwrap();
    let id = cookie.split_once('=').unwrap().1.to_owned();
    let stored: Vec<String> = sqlx::query_scalar("SELECT id FROM sessions")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert!(!stored.is_empty());
    assert!(!stored.iter().any(|s| s.contains(&id)), "{stored:?}");
    // And the cookie still signs in.
    assert_eq!(browser.get("/nodes").await.status, StatusCode::OK);
}

#[test]
fn csrf_tokens_match_only_whole_and_exact() {
    assert!(same_token("a1b2c3", "a1b2c3"));
    assert!(!same_token("a1b2c3", "a1b2c4"));
    assert!(!same_token("a1b2c3", "a1b2c"));
    assert!(!same_token("a1b2c3", ""));
}
