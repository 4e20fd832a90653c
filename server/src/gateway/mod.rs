//! One OpenAI-compatible endpoint for every model Tessera runs: `/v1/models`, and every other `/v1/*` path
//! passed to an engine of the model the request names (its `model` field), the least busy of that model's
//! healthy engines on any machine. The engine's status, headers and body come back as they come (a streamed
//! answer is never buffered), but for the headers that are not the client's and the name the model answers
//! under; what is Tessera's own to say (no such model, not ready, no key, too large) is said in OpenAI's
//! error shape.
//!
//! Here: the routes and a request's way through them (the model it names, a group's router, the call to the
//! engine). Beside it, each in a room of its own: the caller's key and its models (`keys`), what a request
//! is counted as (`metering`), the engine's count of requests in flight that a drain waits on and that
//! chooses the engine (`drain`), the engine a prompt's start prefers (`affinity`), the wait for a ready engine and an on-demand load (`on_demand`), what
//! headers cross (`headers`), the answer's way back (`answer`) and the renaming of its `model` field
//! (`model_field`).

mod affinity;
mod answer;
mod drain;
mod headers;
mod keys;
mod metering;
mod model_field;
mod on_demand;
pub mod scaling;

use crate::auth::Actor;
use crate::fleet::calls::Key;
use crate::fleet::groups::{GroupView, MemberView};
use crate::runtime::Serving;
use crate::AppState;
use answer::Passing;
use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, get};
use axum::{Json, Router};
use headers::passed_on;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metering::Meter;
use model_field::Rename;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The largest request body the gateway takes (an audio upload fits).
pub const BODY_LIMIT: usize = 32 << 20;

/// How long a client is told to wait before it asks again for a model that is not ready, where nothing
/// says when it will be.
const RETRY_AFTER: Duration = Duration::from_secs(5);

/// How long the router of a group may take to say which model answers.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long the console's playground waits for a model's engine to be ready: under the 30 s the guard gives
/// a request.
const PLAYGROUND_WAIT: Duration = Duration::from_secs(20);

/// What the gateway keeps between requests: its connections to the engines and its place in each model's
/// rotation.
pub struct Gateway {
    client: Client<HttpConnector, Full<Bytes>>,
    routing: Routing,
    /// Each engine's requests of late, which bound its part of its model's prefixes.
    recent: Mutex<affinity::Recent>,
    turns: Mutex<HashMap<String, usize>>,
    /// How long a request for a model with no engine ready waits for one.
    wait: Duration,
    /// Requests waiting for a ready engine of each model now: with those in flight, a model's load.
    waiting: Arc<Mutex<HashMap<String, usize>>>,
}

/// A request counted as waiting for a ready engine of its model until it is dropped.
pub(crate) struct Queued {
    waiting: Arc<Mutex<HashMap<String, usize>>>,
    model: String,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = waiting.get_mut(&self.model) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&self.model);
            }
        }
    }
}

/// How the gateway chooses among a model's engines.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Routing {
    /// A request with a prompt goes to the engine its prompt's start ranks first while that engine is not
    /// too busy, so that requests sharing a system prompt use one engine's prompt cache; others go to the
    /// least busy.
    #[default]
    Prefix,
    /// Every request goes to the least busy engine (what the prefix routing is measured against).
    LeastBusy,
}

impl Default for Gateway {
    fn default() -> Gateway {
        Gateway::new(Duration::from_secs(30), Routing::default())
    }
}

impl Gateway {
    /// A gateway whose requests wait up to `wait` for a model's engine to be ready, and choose among its
    /// engines by `routing`.
    pub fn new(wait: Duration, routing: Routing) -> Gateway {
        Gateway {
            client: engine_client(),
            routing,
            recent: Mutex::default(),
            turns: Mutex::default(),
            wait,
            waiting: Arc::default(),
        }
    }

    /// Counts a request for `model` as waiting for a ready engine, for as long as the answer is kept.
    fn queue(&self, model: &str) -> Queued {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        *waiting.entry(model.to_owned()).or_default() += 1;
        Queued {
            waiting: self.waiting.clone(),
            model: model.to_owned(),
        }
    }

    /// The requests waiting for a ready engine now, by model (those with none left out).
    pub fn waiting(&self) -> Vec<(String, usize)> {
        let waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        waiting.iter().map(|(m, n)| (m.clone(), *n)).collect()
    }

    /// Each engine's requests of late.
    fn recent(&self) -> std::sync::MutexGuard<'_, affinity::Recent> {
        self.recent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `model`'s next turn: one rotation per model, so that one model's requests do not move another's.
    fn turn(&self, model: &str) -> usize {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        // The name is copied once, at the model's first request.
        if let Some(turn) = turns.get_mut(model) {
            *turn = turn.wrapping_add(1);
            return *turn;
        }
        turns.insert(model.to_owned(), 1);
        1
    }
}

/// The client the gateway reaches engines with: pooled connections, no Nagle delay. Public for the gateway
/// benchmark's reference, which passes requests on with this same client and nothing else.
pub fn engine_client() -> Client<HttpConnector, Full<Bytes>> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(Duration::from_secs(5)));
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(ENGINE_IDLE)
        .build(connector)
}

/// How long a connection to an engine is kept idle: under the 5 s after which the engines' own servers
/// close an idle one (uvicorn's default for vLLM and SGLang, cpp-httplib's for llama.cpp), so that a kept
/// connection is not being closed by the engine as a request goes out on it.
const ENGINE_IDLE: Duration = Duration::from_secs(4);

/// Sends the request `request` makes to an engine; again, once, where the first try failed before any of
/// the answer came but for a refused connection: a connection kept from an earlier request may have been
/// closed by the engine as this one went out (its keep-alive ran out), which says nothing of the engine.
/// (An engine that got the request before its connection broke may answer it twice: an inference has no
/// effect beyond its answer.)
async fn send(
    client: &Client<HttpConnector, Full<Bytes>>,
    request: impl Fn() -> hyper::Request<Full<Bytes>>,
) -> Result<hyper::Response<hyper::body::Incoming>, hyper_util::client::legacy::Error> {
    match client.request(request()).await {
        Err(e) if !e.is_connect() => {
            tracing::debug!("an engine's connection broke as a request went out ({e}): sent again");
            client.request(request()).await
        }
        answered => answered,
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
fn unavailable(code: &str, message: String, retry_after: Duration) -> Response {
    let mut answer = openai_error(
        StatusCode::SERVICE_UNAVAILABLE,
        "server_error",
        code,
        message,
    );
    answer.headers_mut().insert(
        header::RETRY_AFTER,
        HeaderValue::from(on_demand::seconds(retry_after)),
    );
    answer
}

/// `GET /v1/models`: every model deployed, as OpenAI lists them.
async fn models(State(state): State<AppState>, request: Request) -> Response {
    let grant = match keys::authorised(&state, request.headers()).await {
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
    model_field::named(body)
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

/// Every other `/v1/*` path: to the next healthy engine of the model the request names.
async fn forward(State(state): State<AppState>, request: Request) -> Response {
    let grant = match keys::authorised(&state, request.headers()).await {
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
    if let Some(refused) = keys::out_of_scope(models, &model) {
        return refused;
    }
    // The model's engines, looked up once: a request for a model that serves goes on to one of them.
    let taken = drain::take(state, &model, Some(&body));
    if taken.is_some()
        || state.fleet.runtime().has_engines(&model)
        || state.fleet.on_demand(&model).is_some()
        || state.fleet.is_autoscaled(&model)
    {
        return to_model(state, &model, key, wait, parts, body, taken).await;
    }
    // A group's name: its router picks the member that answers.
    if let Ok(group) = state.fleet.group(&model) {
        let (chosen, how) = route(state, &group, &body).await;
        let body = with_model(body, &chosen);
        let mut answer = to_model(state, &chosen, key, wait, parts, body, None).await;
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

/// Asks a healthy engine of `router` which of `models` should answer `body` (docs/src/gateway.md, "The
/// router's contract").
async fn ask_router(
    state: &AppState,
    router: &str,
    body: &Bytes,
    models: &[&str],
) -> Option<String> {
    let drain::Taken { in_flight, engine } = drain::take(state, router, None)?;
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let question = json!({"request": request, "models": models});
    let uri: Uri = format!("http://{}:{}/route", engine.host, engine.port)
        .parse()
        .ok()?;
    let mut ask = hyper::Request::post(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(question.to_string())))
        .ok()?;
    with_engine_key(&engine, ask.headers_mut());
    let answer = state.gateway.client.request(ask).await.ok()?;
    if !answer.status().is_success() {
        return None;
    }
    let answer = answer.into_body().collect().await.ok()?.to_bytes();
    drop(in_flight);
    let answer: Value = serde_json::from_slice(&answer).ok()?;
    answer["model"].as_str().map(str::to_owned)
}

/// The engine's own key on a request to it, where it has one (an engine on a cluster's node). The
/// caller's key never reaches an engine ([`passed_on`]).
fn with_engine_key(engine: &Serving, headers: &mut HeaderMap) {
    let key = engine.api_key.as_ref();
    if let Some(value) = key.and_then(|k| HeaderValue::from_str(&format!("Bearer {k}")).ok()) {
        headers.insert(header::AUTHORIZATION, value);
    }
}

/// Sends the request to `taken`, where an engine of `model` was taken for it, else to the next healthy one
/// (for its prompt's start), waiting up to `wait` for one to be ready.
async fn to_model(
    state: &AppState,
    model: &str,
    key: Key,
    wait: Duration,
    parts: axum::http::request::Parts,
    body: Bytes,
    taken: Option<drain::Taken>,
) -> Response {
    let mut meter = Meter::new(state, model, key);
    let drain::Taken { in_flight, engine } =
        match on_demand::ready_engine(state, model, wait, taken, &body).await {
            Ok(taken) => taken,
            Err(refused) => return refused,
        };
    let (host, port) = (&engine.host, engine.port);
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
    let mut headers = passed_on(parts.headers);
    // The body may have been rewritten (a group's request names the member): its length is the client's
    // to set, from the body itself. A stale one would leave the engine waiting for bytes never sent.
    headers.remove(header::CONTENT_LENGTH);
    with_engine_key(&engine, &mut headers);
    let onward = || {
        let mut onward = hyper::Request::builder()
            .method(parts.method.clone())
            .uri(uri.clone())
            .body(Full::new(body.clone()))
            .expect("a request from the parts of one");
        *onward.headers_mut() = headers.clone();
        onward
    };
    meter.sending(state.fleet.runtime(), engine.unit.clone());
    match send(&state.gateway.client, onward).await {
        Ok(answer) => {
            let (mut parts, body) = answer.into_parts();
            parts.headers = passed_on(parts.headers);
            meter.answered(parts.status);
            let rename = Rename::of_answer(&parts.headers, model);
            if rename.is_some() {
                // The new name may be longer or shorter than the engine's.
                parts.headers.remove(header::CONTENT_LENGTH);
            }
            let events = parts
                .headers
                .get(header::CONTENT_TYPE)
                .is_some_and(|t| t.as_bytes().starts_with(b"text/event-stream"));
            let passing = Passing {
                _in_flight: in_flight,
                meter,
                rename,
                events,
                model: model.to_owned(),
            };
            Response::from_parts(parts, answer::held_to_the_end(body, passing))
        }
        Err(e) => {
            tracing::warn!(
                "the gateway could not reach an engine of {model} at {host}:{port}: {e}"
            );
            unavailable(
                "engine_unreachable",
                format!("an engine of {model} did not answer; try again shortly"),
                on_demand::retry_after(state, model, Some(&engine.unit)),
            )
        }
    }
}

#[cfg(test)]
mod tests;
