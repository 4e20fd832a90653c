//! One OpenAI-compatible endpoint for every model Tessera runs: `/v1/models`, and every other `/v1/*` path
//! passed to an engine of the model the request names (its `model` field), round-robin over that model's
//! healthy engines on any machine. The engine's status, headers and body come back as they come (a streamed
//! answer is never buffered); what is Tessera's own to say (no such model, not ready, no key, too large) is
//! said in OpenAI's error shape.

use crate::accounts;
use crate::runtime::spec::Host;
use crate::runtime::{EngineState, EngineView};
use crate::AppState;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The largest request body the gateway takes (an audio upload fits).
pub const BODY_LIMIT: usize = 32 << 20;

/// How long a client is told to wait before it asks again for a model that is not ready.
const RETRY_AFTER_S: u64 = 5;

/// How often a request waiting for a model to be ready looks again.
const READY_POLL: Duration = Duration::from_millis(100);

/// What the gateway keeps between requests: its connections to the engines and its place in each rotation.
pub struct Gateway {
    client: Client<HttpConnector, Full<Bytes>>,
    turn: AtomicUsize,
    /// How long a request for a model with no engine ready waits for one.
    wait: Duration,
}

impl Default for Gateway {
    fn default() -> Gateway {
        Gateway::new(Duration::from_secs(30))
    }
}

impl Gateway {
    /// A gateway whose requests wait up to `wait` for a model's engine to be ready.
    pub fn new(wait: Duration) -> Gateway {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(5)));
        Gateway {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(60))
                .build(connector),
            turn: AtomicUsize::new(0),
            wait,
        }
    }
}

/// The gateway's routes, under `/v1`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/{*path}", any(forward))
}

/// An error in OpenAI's shape.
fn openai_error(status: StatusCode, kind: &str, code: &str, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": code, "param": null}});
    (status, Json(body)).into_response()
}

/// The caller's key, checked as the rest of the API checks it (a token seen lately answers from memory).
async fn authorised(state: &AppState, headers: &HeaderMap) -> Result<(), Response> {
    let unauthorised = |message: &str| {
        openai_error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            message.to_owned(),
        )
    };
    let Some(secret) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return Err(unauthorised(
            "send a Tessera API token as Authorization: Bearer tsr_…",
        ));
    };
    if accounts::cached_caller(&state.tokens, secret).is_some() {
        return Ok(());
    }
    match accounts::caller_by_token(&state.pool, &state.tokens, secret).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(unauthorised(
            "that API token is unknown or revoked; an admin can make another (POST /api/tokens)",
        )),
        Err(e) => {
            tracing::error!("a gateway key could not be checked: {e}");
            Err(openai_error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
                "the key could not be checked; try again".to_owned(),
            ))
        }
    }
}

/// The models deployed now (group members and workers that run a model), by name.
fn deployed(state: &AppState) -> Vec<String> {
    let mut names: Vec<String> = state
        .fleet
        .runtime()
        .engines()
        .into_iter()
        .filter_map(|e| e.model.or(e.worker))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// `GET /v1/models`: every model deployed, as OpenAI lists them.
async fn models(State(state): State<AppState>, request: Request) -> Response {
    if let Err(refused) = authorised(&state, request.headers()).await {
        return refused;
    }
    let data: Vec<Value> = deployed(&state)
        .into_iter()
        .map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "tessera"}))
        .collect();
    Json(json!({"object": "list", "data": data})).into_response()
}

/// The model a request names: its JSON body's `model`, or a multipart form's `model` field.
fn model_named(headers: &HeaderMap, body: &Bytes) -> Option<String> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if let Some(boundary) = content_type
        .strip_prefix("multipart/form-data")
        .and_then(|rest| rest.split("boundary=").nth(1))
    {
        return form_field(body, boundary.trim_matches('"'), "model");
    }
    let value: Value = serde_json::from_slice(body).ok()?;
    value.get("model")?.as_str().map(str::to_owned)
}

/// A text field of a multipart form.
fn form_field(body: &[u8], boundary: &str, name: &str) -> Option<String> {
    let delimiter = format!("--{boundary}");
    let text = String::from_utf8_lossy(body);
    let wanted = format!("name=\"{name}\"");
    text.split(delimiter.as_str()).find_map(|part| {
        let (head, value) = part.split_once("\r\n\r\n")?;
        head.contains(&wanted)
            .then(|| value.trim_end_matches("\r\n").to_owned())
    })
}

/// Where an engine answers.
fn address(engine: &EngineView) -> Option<(String, u16)> {
    let port = engine.port?;
    let host = match &engine.host {
        Host::Cluster { address, .. } => address.clone(),
        Host::Local | Host::Simulated | Host::Remote => "127.0.0.1".to_owned(),
    };
    Some((host, port))
}

/// Every other `/v1/*` path: to the next healthy engine of the model the request names.
async fn forward(State(state): State<AppState>, request: Request) -> Response {
    if let Err(refused) = authorised(&state, request.headers()).await {
        return refused;
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, BODY_LIMIT).await {
        Ok(body) => body,
        Err(_) => {
            return openai_error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
                format!("the request body is over {} MiB", BODY_LIMIT >> 20),
            )
        }
    };
    let Some(model) = model_named(&parts.headers, &body) else {
        return openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "model_required",
            "name the model in the body's \"model\" field (GET /v1/models lists them)".to_owned(),
        );
    };
    let runtime = state.fleet.runtime();
    let engines_of = || -> Vec<EngineView> {
        runtime
            .engines()
            .into_iter()
            .filter(|e| e.model.as_deref() == Some(&model) || e.worker.as_deref() == Some(&model))
            .collect()
    };
    if engines_of().is_empty() {
        return openai_error(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("no model named {model:?} is deployed; GET /v1/models lists those that are"),
        );
    }
    // A model whose engines all restart (or load) is waited for, up to the gateway's wait.
    let deadline = tokio::time::Instant::now() + state.gateway.wait;
    let (in_flight, host, port) = loop {
        let ready: Vec<(EngineView, (String, u16))> = engines_of()
            .into_iter()
            .filter(|e| e.state == EngineState::Healthy)
            .filter_map(|e| address(&e).map(|a| (e, a)))
            .collect();
        let first = state.gateway.turn.fetch_add(1, Ordering::Relaxed);
        let taken = (0..ready.len()).find_map(|k| {
            let (engine, (host, port)) = &ready[(first + k) % ready.len()];
            runtime
                .begin_request(&engine.unit)
                .map(|counted| (counted, host.clone(), *port))
        });
        if let Some(taken) = taken {
            break taken;
        }
        if tokio::time::Instant::now() >= deadline {
            let mut answer = openai_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "model_not_ready",
                format!(
                    "{model} is deployed but none of its engines was ready within {} s; try again shortly",
                    state.gateway.wait.as_secs()
                ),
            );
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            return answer;
        }
        tokio::time::sleep(READY_POLL).await;
    };
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let Ok(uri) = format!("http://{host}:{port}{path}").parse::<Uri>() else {
        return openai_error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "bad_path",
            "the path cannot be passed on".to_owned(),
        );
    };
    let mut onward = hyper::Request::builder()
        .method(parts.method)
        .uri(uri)
        .body(Full::new(body))
        .expect("a request from the parts of one");
    *onward.headers_mut() = passed_on(parts.headers);
    match state.gateway.client.request(onward).await {
        Ok(answer) => {
            let (mut parts, body) = answer.into_parts();
            parts.headers = passed_on(parts.headers);
            // Counted in flight until the last of the answer has gone (or the caller has left).
            let body = body.map_frame(move |frame| {
                let _counted = &in_flight;
                frame
            });
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            tracing::warn!(
                "the gateway could not reach an engine of {model} at {host}:{port}: {e}"
            );
            let mut answer = openai_error(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "engine_unreachable",
                format!("an engine of {model} did not answer; try again shortly"),
            );
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
            answer
        }
    }
}

/// The headers that go on to the other side: not the hop-by-hop ones (RFC 9110, 7.6.1), not the caller's
/// Tessera key (an engine is not told it), and not the host, which the client sets for its connection.
fn passed_on(mut headers: HeaderMap) -> HeaderMap {
    for name in [
        header::CONNECTION,
        header::HOST,
        header::AUTHORIZATION,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    headers
}

#[cfg(test)]
mod tests;
