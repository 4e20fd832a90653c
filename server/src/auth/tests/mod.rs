//! Who may do what, through the whole router on a real SQLite file: tokens, roles, browser sessions with
//! their CSRF token, sign-in with its throttle, setup, and the security headers. One room per concern;
//! here only the set-up they share: a browser that keeps its cookie, a second account, a worker to deploy.

mod engine_settings;
mod roles;
mod security;
mod sessions;
mod sign_in;

use crate::testing::TestApp;
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
            .map(|(k, v)| format!("{k}={}", app::address::query_value(v)))
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
