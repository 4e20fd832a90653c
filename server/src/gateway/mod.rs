//! One OpenAI-compatible endpoint for every model Tessera runs: `/v1/models`, and every other `/v1/*` path
//! passed to an engine of the model the request names (its `model` field), round-robin over that model's
//! healthy engines on any machine. The engine's status, headers and body come back as they come (a streamed
//! answer is never buffered); what is Tessera's own to say (no such model, not ready, no key, too large) is
//! said in OpenAI's error shape.

use crate::accounts::{self, Grant};
use crate::auth::Actor;
use crate::error::ApiError;
use crate::fleet::calls::{Counts, Key};
use crate::fleet::demand::Load;
use crate::fleet::groups::{GroupView, MemberView};
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
use placement::interference::Sample;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The largest request body the gateway takes (an audio upload fits).
pub const BODY_LIMIT: usize = 32 << 20;

/// How long a client is told to wait before it asks again for a model that is not ready.
const RETRY_AFTER_S: u64 = 5;

/// How long the router of a group may take to say which model answers.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the console's playground waits for a model's engine to be ready: under the 30 s the guard gives
/// a request.
const PLAYGROUND_WAIT: Duration = Duration::from_secs(20);

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

/// A 503 in OpenAI's shape, telling the client when to ask again.
fn unavailable(code: &str, message: String) -> Response {
    let mut answer = openai_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        code,
        message,
    );
    answer
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
    answer
}

/// The caller's key, checked as the rest of the API checks it (a token seen lately answers from memory).
async fn authorised(state: &AppState, headers: &HeaderMap) -> Result<Grant, Response> {
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
    if let Some(grant) = accounts::cached_grant(&state.tokens, secret) {
        return Ok(grant);
    }
    match accounts::grant_by_token(&state.pool, &state.tokens, secret).await {
        Ok(Ok(grant)) => Ok(grant),
        Ok(Err(refusal)) => Err(unauthorised(&refusal.message())),
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

/// `GET /v1/models`: every model deployed, as OpenAI lists them.
async fn models(State(state): State<AppState>, request: Request) -> Response {
    let grant = match authorised(&state, request.headers()).await {
        Ok(grant) => grant,
        Err(refused) => return refused,
    };
    let data: Vec<Value> = state
        .fleet
        .served()
        .into_iter()
        .filter(|model| grant.may_call(model))
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
    let grant = match authorised(&state, request.headers()).await {
        Ok(grant) => grant,
        Err(refused) => return refused,
    };
    carry(
        &state,
        grant.models.as_deref(),
        grant.key,
        state.gateway.wait,
        request,
    )
    .await
}

/// `POST /api/playground`: the console's chat as the signed-in account, whose session (and CSRF token)
/// or API token the guard has checked: answered as `/v1/chat/completions`, counted under the account.
pub async fn playground(
    State(state): State<AppState>,
    Actor(caller): Actor,
    request: Request,
) -> Response {
    let (mut parts, body) = request.into_parts();
    parts.uri = Uri::from_static("/v1/chat/completions");
    let request = Request::from_parts(parts, body);
    // Within the guard's bound on a request, which would otherwise answer first, and with less to say.
    let wait = state.gateway.wait.min(PLAYGROUND_WAIT);
    carry(&state, None, Key::console(&caller.name), wait, request).await
}

/// Carries `request` to an engine of the model it names, if `models` (where there is such a list) has it,
/// waiting up to `wait` for one to be ready.
async fn carry(
    state: &AppState,
    models: Option<&[String]>,
    key: Key,
    wait: Duration,
    request: Request,
) -> Response {
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
    if let Some(models) = models.filter(|m| !m.contains(&model)) {
        return openai_error(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "model_not_allowed",
            format!(
                "this API token may call only {}, not {model}",
                models.join(", ")
            ),
        );
    }
    if !engines_of(state, &model).is_empty() || state.fleet.on_demand(&model).is_some() {
        return to_model(state, &model, key, wait, parts, body).await;
    }
    // A group's name: its router picks the member that answers.
    if let Ok(group) = state.fleet.group(&model) {
        let (chosen, how) = route(state, &group, &body).await;
        let mut answer =
            to_model(state, &chosen, key, wait, parts, with_model(body, &chosen)).await;
        for (name, value) in [
            ("x-tessera-routed-to", chosen.as_str()),
            ("x-tessera-routing", how),
        ] {
            if let Ok(value) = HeaderValue::from_str(value) {
                answer.headers_mut().insert(name, value);
            }
        }
        return answer;
    }
    openai_error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "model_not_found",
        format!("no model named {model:?} is deployed; GET /v1/models lists those that are"),
    )
}

/// The engines of `model` (a group member's, or a worker's).
fn engines_of(state: &AppState, model: &str) -> Vec<EngineView> {
    state
        .fleet
        .runtime()
        .engines()
        .into_iter()
        .filter(|e| e.model.as_deref() == Some(model) || e.worker.as_deref() == Some(model))
        .collect()
}

/// The request's body with `model` in its JSON `model` field (a form is passed as it is).
fn with_model(body: Bytes, model: &str) -> Bytes {
    match serde_json::from_slice::<Value>(&body) {
        Ok(Value::Object(mut fields)) => {
            fields.insert("model".to_owned(), Value::String(model.to_owned()));
            Bytes::from(Value::Object(fields).to_string())
        }
        _ => body,
    }
}

/// Which member of `group` answers a request that names the group, and how it was chosen: the router's
/// choice (`semantic`) when the router member is healthy and names one of the group's models within
/// [`ROUTE_TIMEOUT`]; else the group's default model (`fallback`): its largest share, then the first by
/// name. So requests that arrive while the router restarts go on unclassified (seed 003).
async fn route(state: &AppState, group: &GroupView, body: &Bytes) -> (String, &'static str) {
    let models: Vec<&MemberView> = group.members.iter().filter(|m| !m.locked).collect();
    let default = models
        .iter()
        .max_by(|a, b| {
            a.share_percent
                .total_cmp(&b.share_percent)
                .then_with(|| b.name.cmp(&a.name))
        })
        .map(|m| m.name.clone())
        .unwrap_or_else(|| group.name.clone());
    let names: Vec<&str> = models.iter().map(|m| m.name.as_str()).collect();
    let Some(router) = group.members.iter().find(|m| m.locked) else {
        return (default, "fallback");
    };
    match tokio::time::timeout(ROUTE_TIMEOUT, ask_router(state, &router.name, body, &names)).await {
        Ok(Some(chosen)) if names.contains(&chosen.as_str()) => (chosen, "semantic"),
        _ => (default, "fallback"),
    }
}

/// Asks a healthy engine of `router` which of `models` should answer `body` (README, "The router's
/// contract").
async fn ask_router(
    state: &AppState,
    router: &str,
    body: &Bytes,
    models: &[&str],
) -> Option<String> {
    let runtime = state.fleet.runtime();
    let (counted, (host, port)) = engines_of(state, router)
        .into_iter()
        .filter(|e| e.state == EngineState::Healthy)
        .find_map(|e| Some((runtime.begin_request(&e.unit)?, address(&e)?)))?;
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let question = json!({"request": request, "models": models});
    let uri: Uri = format!("http://{host}:{port}/route").parse().ok()?;
    let ask = hyper::Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(question.to_string())))
        .ok()?;
    let answer = state.gateway.client.request(ask).await.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    let answer = answer.into_body().collect().await.ok()?.to_bytes();
    drop(counted);
    let answer: Value = serde_json::from_slice(&answer).ok()?;
    answer["model"].as_str().map(str::to_owned)
}

/// Sends the request to the next healthy engine of `model`, waiting up to `wait` for one to be ready.
async fn to_model(
    state: &AppState,
    model: &str,
    key: Key,
    wait: Duration,
    parts: axum::http::request::Parts,
    body: Bytes,
) -> Response {
    let mut meter = Meter {
        state: state.clone(),
        model: model.to_owned(),
        key,
        failed: true,
        tail: Vec::new(),
        asked_ms: crate::fleet::usage::now_ms(),
        sent: None,
        first_bytes: None,
        busy_neighbours: Vec::new(),
        engine: String::new(),
        queue_depth: 0,
    };
    let runtime = state.fleet.runtime();
    let asked = tokio::time::Instant::now();
    // A model whose engines all restart (or load) is waited for, up to the gateway's wait.
    let deadline = asked + wait;
    // An on-demand model is busy while a request waits for it: no keep-alive or other load unloads it.
    let mut on_demand = state.fleet.on_demand(model);
    let waiting = on_demand.map(|_| state.fleet.activity().wait(model));
    let mut cold = false;
    let (in_flight, host, port, unit) = loop {
        // Not loaded (or unloaded by its keep-alive just as the request came): loaded for it, a fleet change
        // carried out after what makes way has stopped. Where the room is taken by models with requests in
        // flight, the load waits for one of them to end.
        if on_demand == Some(false) {
            match state.fleet.load(model).await {
                Ok(load) => {
                    cold |= matches!(load, Load::Loading { .. });
                    on_demand = Some(true);
                }
                Err(ApiError::Conflict(_)) if tokio::time::Instant::now() < deadline => {}
                Err(e) => {
                    let message = match e {
                        ApiError::Internal(detail) => {
                            tracing::error!("{model} could not be loaded: {detail}");
                            format!("{model} could not be loaded; it has been logged")
                        }
                        refused => refused.to_string(),
                    };
                    return unavailable("model_not_loaded", message);
                }
            }
        }
        let ready: Vec<(EngineView, (String, u16))> = engines_of(state, model)
            .into_iter()
            .filter(|e| e.state == EngineState::Healthy)
            .filter_map(|e| address(&e).map(|a| (e, a)))
            .collect();
        let first = state.gateway.turn.fetch_add(1, Ordering::Relaxed);
        let taken = (0..ready.len()).find_map(|k| {
            let (engine, (host, port)) = &ready[(first + k) % ready.len()];
            runtime
                .begin_request(&engine.unit)
                .map(|counted| (counted, host.clone(), *port, engine.unit.clone()))
        });
        if let Some(taken) = taken {
            break taken;
        }
        if tokio::time::Instant::now() >= deadline {
            return unavailable(
                "model_not_ready",
                format!(
                    "{model} is deployed but none of its engines was ready within {} s; try again shortly",
                    wait.as_secs()
                ),
            );
        }
        tokio::time::sleep(READY_POLL).await;
        // A pinned model stays pinned; an on-demand one may have been unloaded meanwhile.
        if on_demand.is_some() {
            on_demand = state.fleet.on_demand(model);
        }
    };
    if cold {
        state.fleet.activity().cold_started(model, asked.elapsed());
    }
    drop(waiting);
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
    // The body may have been rewritten (a group's request names the member): its length is the client's
    // to set, from the body itself. A stale one would leave the engine waiting for bytes never sent.
    onward.headers_mut().remove(header::CONTENT_LENGTH);
    // Who else is busy on its GPUs as it goes (none, and it counts toward the model's latency alone), and
    // how many requests its engine has in flight.
    meter.busy_neighbours = runtime.busy_beside(&unit);
    meter.queue_depth = runtime.requests_in_flight(&unit) as u32;
    meter.engine = unit;
    meter.sent = Some(std::time::Instant::now());
    match state.gateway.client.request(onward).await {
        Ok(answer) => {
            let (mut parts, body) = answer.into_parts();
            parts.headers = passed_on(parts.headers);
            meter.failed = !parts.status.is_success();
            // Counted in flight, and metered, until the last of the answer has gone (or the caller has
            // left).
            let body = body.map_frame(move |frame| {
                let _counted = &in_flight;
                if let Some(data) = frame.data_ref() {
                    meter.saw(data);
                }
                frame
            });
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => {
            tracing::warn!(
                "the gateway could not reach an engine of {model} at {host}:{port}: {e}"
            );
            unavailable(
                "engine_unreachable",
                format!("an engine of {model} did not answer; try again shortly"),
            )
        }
    }
}

/// How much of an answer's end is kept to find its `usage` in: an OpenAI answer ends with it (or, streamed,
/// its last event carries it), followed by little.
const USAGE_TAIL: usize = 16 << 10;

/// Counts one request when it ends (its answer sent, or the caller gone), with the tokens its answer's
/// `usage` reports.
struct Meter {
    state: AppState,
    model: String,
    key: Key,
    failed: bool,
    /// The answer's last bytes.
    tail: Vec<u8>,
    /// When the request came.
    asked_ms: u64,
    /// When it was sent on to the engine.
    sent: Option<std::time::Instant>,
    /// From then to the answer's first bytes.
    first_bytes: Option<Duration>,
    /// The other models busy on the engine's GPUs as it was sent.
    busy_neighbours: Vec<String>,
    /// The engine it went to, and its requests in flight then.
    engine: String,
    queue_depth: u32,
}

impl Meter {
    fn saw(&mut self, data: &[u8]) {
        if self.first_bytes.is_none() {
            self.first_bytes = self.sent.map(|sent| sent.elapsed());
        }
        self.tail.extend_from_slice(data);
        if self.tail.len() > 2 * USAGE_TAIL {
            self.tail.drain(..self.tail.len() - USAGE_TAIL);
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.state.fleet.activity().touch(&self.model);
        let (prompt_tokens, completion_tokens) = usage_in(&self.tail).unwrap_or_default();
        if let Some(sent) = self.sent {
            let request = sent.elapsed();
            self.state.fleet.latencies().record(
                &self.model,
                Sample {
                    at_ms: self.asked_ms,
                    engine: std::mem::take(&mut self.engine),
                    latency_us: self.first_bytes.unwrap_or(request).as_micros() as u64,
                    request_us: request.as_micros() as u64,
                    completion_tokens,
                    queue_depth: self.queue_depth,
                    failed: self.failed,
                    busy_neighbours: std::mem::take(&mut self.busy_neighbours),
                },
            );
        }
        self.state.fleet.calls().record(
            &self.model,
            &self.key,
            Counts {
                requests: 1,
                failed: u64::from(self.failed),
                prompt_tokens,
                completion_tokens,
            },
            self.asked_ms,
        );
    }
}

/// The prompt and completion tokens of the last `"usage"` object in `tail` (an answer's JSON, or the
/// events of a streamed one); `None` where there is none with figures.
fn usage_in(tail: &[u8]) -> Option<(u64, u64)> {
    const NEEDLE: &[u8] = b"\"usage\"";
    let at = tail.windows(NEEDLE.len()).rposition(|w| w == NEEDLE)?;
    let rest = tail[at + NEEDLE.len()..].trim_ascii_start();
    let rest = rest.strip_prefix(b":")?;
    let usage: Value = serde_json::Deserializer::from_slice(rest)
        .into_iter::<Value>()
        .next()?
        .ok()?;
    let count = |name: &str| usage.get(name).and_then(Value::as_u64);
    let prompt = count("prompt_tokens");
    let completion = count("completion_tokens");
    (prompt.is_some() || completion.is_some())
        .then(|| (prompt.unwrap_or(0), completion.unwrap_or(0)))
}

/// The headers that go on to the other side: not the hop-by-hop ones (RFC 9110, 7.6.1), not the caller's
/// Tessera key, session cookie or CSRF token (an engine is not told them), and not the host, which the
/// client sets for its connection.
fn passed_on(mut headers: HeaderMap) -> HeaderMap {
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

#[cfg(test)]
mod tests;
