//! The demo engine (`tessera demo-engine`): a real HTTP process that stands in for an inference engine on
//! machines that do not exist (the demo fleet) and in the tests. It serves a health check, reports the
//! share and environment it was started with, and can be told to fail its health check or to crash. It also
//! speaks the OpenAI routes an engine serves (`/v1/models`, `/v1/chat/completions` streamed or not,
//! `/v1/completions`, `/v1/embeddings`), answering with words of its own, so that the gateway can be tried
//! without a GPU; each answer says which engine gave it (`x-tessera-engine`). For the gateway's tests it can
//! add headers of its own to its answers and die in the middle of a streamed one.

mod profile;
mod sleep;

use crate::runtime::spec::ENGINE_KEY_VAR;
use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use profile::{Answering, KvSizing, Memory, Profile};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the demo engine was started as.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Its PID.
    pub pid: u32,
    /// The engine it is (`TESSERA_ENGINE`).
    pub engine: String,
    /// The command line of the real engine it stands in for.
    pub stands_in_for: Vec<String>,
    /// The share it was given, GB (`TESSERA_GPU_MEMORY_GB`).
    pub gpu_memory_gb: String,
    /// `CUDA_VISIBLE_DEVICES`.
    pub cuda_visible_devices: String,
    /// Every `TESSERA_*` and `CUDA_*` variable it was given.
    pub env: BTreeMap<String, String>,
}

#[derive(Clone)]
struct Engine {
    report: Arc<Report>,
    failing: Arc<AtomicBool>,
    /// How long each answer waits before its first byte, as an engine slowed by its neighbours does.
    slow_ms: Arc<AtomicU64>,
    /// Headers added to each of its OpenAI answers (`TESSERA_DEMO_ANSWER_HEADERS`).
    answer_headers: Arc<HeaderMap>,
    /// The key its OpenAI routes and its router take requests with, where it was given one (as vLLM's
    /// `--api-key`).
    key: Option<Arc<str>>,
    /// How it behaves like a real engine (`TESSERA_DEMO_PROFILE`).
    profile: Arc<Profile>,
    /// The requests it has begun to answer.
    answered: Arc<AtomicU64>,
    /// Its simulated GPUs, where it runs on some: its answers count there, and slow beside busy neighbours.
    memory: Option<Arc<Memory>>,
    /// Its share of each GPU (`TESSERA_GPU_MEMORY_BYTES`): what its weights are a part of.
    share: placement::Bytes,
    /// How it sleeps, while it does (locked while it falls asleep or wakes).
    asleep: Arc<tokio::sync::Mutex<Option<sleep::Asleep>>>,
    /// From the moment it begins to fall asleep until it is awake again: it answers no request.
    sleeping: Arc<AtomicBool>,
}

/// A request being answered: how much slower than alone its neighbours make it, and (on simulated GPUs)
/// its count there, which lasts until the whole answer has gone.
struct Busy {
    slower: f64,
    neighbours: u32,
    _counted: Option<Answering>,
}

/// Serves on `TESSERA_HOST` (127.0.0.1 unless set), port `TESSERA_PORT`, until SIGTERM. `TESSERA_DEMO_START_MS` (default 200) is how long it "loads"
/// before it listens, as a real engine loads its weights; with `TESSERA_DEMO_EXIT_AFTER_MS` it exits with
/// status 70 that long after it starts, as an engine that cannot load. `TESSERA_DEMO_ANSWER_HEADERS` (a JSON
/// object of names and values) is added to each OpenAI answer's headers; with
/// `TESSERA_DEMO_DIE_AFTER_CHUNKS` it exits with status 70 after that many events of a streamed answer, as
/// an engine that crashes while it answers.
pub async fn run(stands_in_for: Vec<String>) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    if let Ok(bytes) = var(profile::HELPER_VAR).parse() {
        return profile::help(bytes).await;
    }
    let port: u16 = var("TESSERA_PORT")
        .parse()
        .map_err(|_| "TESSERA_PORT must be set to the port to serve on".to_owned())?;
    let profile = Profile::from_env()?;
    let memory = Memory::from_env().map(Arc::new);
    let report = Report {
        pid: std::process::id(),
        engine: var("TESSERA_ENGINE"),
        stands_in_for,
        gpu_memory_gb: var("TESSERA_GPU_MEMORY_GB"),
        cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
        env: std::env::vars()
            .filter(|(k, _)| k.starts_with("TESSERA_") || k.starts_with("CUDA_"))
            .filter(|(k, _)| k != ENGINE_KEY_VAR)
            .collect(),
    };
    println!(
        "demo engine {} (PID {}): standing in for `{}` with {} GB on GPU {}",
        report.engine,
        report.pid,
        report.stands_in_for.join(" "),
        report.gpu_memory_gb,
        report.cuda_visible_devices
    );
    if let Ok(after) = var("TESSERA_DEMO_EXIT_AFTER_MS").parse::<u64>() {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            println!("exiting after {after} ms, as told");
            std::process::exit(70);
        });
    }
    let sizing = KvSizing::of(&report.stands_in_for);
    if let Err(out_of_memory) = profile::load(&profile, memory.as_deref(), pick(), sizing).await {
        // As a real engine dies of CUDA's out-of-memory error while it loads.
        eprintln!("{out_of_memory}");
        std::process::exit(1);
    }
    // On a cluster's node, its address (`TESSERA_HOST`): the server checks its health from elsewhere.
    let host = std::env::var("TESSERA_HOST").unwrap_or_else(|_| "127.0.0.1".to_owned());
    let listener = tokio::net::TcpListener::bind((host.as_str(), port))
        .await
        .map_err(|e| format!("could not listen on {host}:{port}: {e}"))?;
    println!("loaded; serving on {host}:{port}");
    let engine = Engine {
        report: Arc::new(report),
        failing: Arc::default(),
        slow_ms: Arc::default(),
        answer_headers: Arc::new(answer_headers(&var("TESSERA_DEMO_ANSWER_HEADERS"))?),
        key: std::env::var(ENGINE_KEY_VAR).ok().map(Arc::from),
        profile: Arc::new(profile.clone()),
        answered: Arc::default(),
        memory,
        share: placement::Bytes(var("TESSERA_GPU_MEMORY_BYTES").parse().unwrap_or(0)),
        asleep: Arc::default(),
        sleeping: Arc::default(),
    };
    // SIGTERM ends it at once, its answers in flight cut off, as an engine may: whatever must not be
    // lost is drained by Tessera before the signal.
    tokio::select! {
        served = axum::serve(listener, app(engine)) => served.map_err(|e| e.to_string()),
        () = terminated(profile.ignore_sigterm) => {
            println!("SIGTERM: stopping");
            // A real engine holds its memory a while yet, freeing its KV cache and its workers.
            tokio::time::sleep(profile.scaled(profile.exit_delay_s)).await;
            Ok(())
        }
    }
}

/// SIGTERM, unless told to ignore it (then only SIGKILL ends it).
async fn terminated(ignore: bool) {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => loop {
            s.recv().await;
            if !ignore {
                return;
            }
            println!("SIGTERM: ignored, as told");
        },
        Err(_) => std::future::pending().await,
    }
}

/// A number from 0 to 1, a different one in each engine: where in its range its load falls.
fn pick() -> f64 {
    use argon2::password_hash::rand_core::{OsRng, RngCore};
    f64::from(OsRng.next_u32()) / f64::from(u32::MAX)
}

fn app(engine: Engine) -> Router {
    Router::new()
        .route("/", get(report))
        .route("/health", get(health))
        .route("/fail-health", post(fail_health))
        .route("/crash", post(crash))
        .route("/slow", post(slow))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/embeddings", post(embeddings))
        .route("/route", post(route))
        .route("/sleep", post(sleep::sleep))
        .route("/wake_up", post(sleep::wake_up))
        .route("/is_sleeping", get(sleep::is_sleeping))
        .route("/release_memory_occupation", post(sleep::release))
        .route("/resume_memory_occupation", post(sleep::wake_up))
        .layer(axum::middleware::from_fn_with_state(
            engine.clone(),
            with_key,
        ))
        .with_state(engine)
}

/// Where the engine has a key, its OpenAI routes and its router answer only requests that carry it, as
/// vLLM's do; its health and its report answer anyone.
async fn with_key(
    State(engine): State<Engine>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let guarded = request.uri().path().starts_with("/v1/") || request.uri().path() == "/route";
    // Asleep (or falling asleep, or waking), it answers no request: its memory is not there.
    if guarded && engine.sleeping.load(Ordering::SeqCst) {
        return sleep::refused();
    }
    let Some(key) = engine.key.as_deref().filter(|_| guarded) else {
        return next.run(request).await;
    };
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key) {
        return next.run(request).await;
    }
    (
        StatusCode::UNAUTHORIZED,
        Json(json!({"error": {"message": "this engine takes only requests with its key", "type": "invalid_request_error", "code": "invalid_api_key"}})),
    )
        .into_response()
}

/// The model the engine serves: the one a request names, or its own unit.
fn model_of(engine: &Engine, request: &Value) -> String {
    request["model"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| engine.report.engine.clone())
}

/// The headers `TESSERA_DEMO_ANSWER_HEADERS` asks for: a JSON object of names and values (none if unset).
fn answer_headers(asked: &str) -> Result<HeaderMap, String> {
    if asked.is_empty() {
        return Ok(HeaderMap::new());
    }
    let bad = || {
        format!(
            "TESSERA_DEMO_ANSWER_HEADERS is not a JSON object of header names and values: {asked}"
        )
    };
    let asked: BTreeMap<String, String> = serde_json::from_str(asked).map_err(|_| bad())?;
    asked
        .iter()
        .map(|(name, value)| {
            Ok((
                HeaderName::try_from(name.as_str()).map_err(|_| bad())?,
                HeaderValue::try_from(value.as_str()).map_err(|_| bad())?,
            ))
        })
        .collect()
}

/// Says how many requests its GPUs' other engines were answering as it began (`x-tessera-demo-neighbours`):
/// what slowed it, on simulated GPUs.
fn beside(mut answer: Response, neighbours: u32) -> Response {
    answer
        .headers_mut()
        .insert("x-tessera-demo-neighbours", HeaderValue::from(neighbours));
    answer
}

/// Says which engine answered, with the headers it was told to add.
fn signed(engine: &Engine, mut answer: Response) -> Response {
    if let Ok(value) = HeaderValue::from_str(&engine.report.engine) {
        answer.headers_mut().insert("x-tessera-engine", value);
    }
    for (name, value) in engine.answer_headers.iter() {
        answer.headers_mut().append(name, value.clone());
    }
    answer
}

async fn models(State(engine): State<Engine>) -> Response {
    let id = engine.report.engine.clone();
    let answer = Json(
        json!({"object": "list", "data": [{"id": id, "object": "model", "owned_by": "tessera-demo"}]}),
    );
    signed(&engine, answer.into_response())
}

/// The words of an answer to `prompt`: who answers, and what it heard.
fn words(engine: &Engine, prompt: &str) -> Vec<String> {
    format!(
        "demo engine {} (PID {}) heard: {}",
        engine.report.engine, engine.report.pid, prompt
    )
    .split_whitespace()
    .map(|w| format!("{w} "))
    .collect()
}

fn usage(prompt: &str, words: &[String]) -> Value {
    let prompt_tokens = prompt.split_whitespace().count();
    json!({"prompt_tokens": prompt_tokens, "completion_tokens": words.len(), "total_tokens": prompt_tokens + words.len()})
}

/// Whether a streamed answer ends with an event of its usage, as OpenAI's `stream_options` asks.
fn wants_usage(request: &Value) -> bool {
    request["stream_options"]["include_usage"] == true
}

/// How long each streamed word takes (`TESSERA_DEMO_TOKEN_MS`, 20 by default).
fn word_pause() -> Duration {
    let ms = std::env::var("TESSERA_DEMO_TOKEN_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    Duration::from_millis(ms)
}

/// `data: …` events, one per chunk, a pause before each (longer as `busy` is slowed), then `data: [DONE]`;
/// or, told to die after N (`TESSERA_DEMO_DIE_AFTER_CHUNKS`), N of them and an exit. The request counts as
/// answered until the last event has gone.
fn event_stream(chunks: Vec<Value>, busy: Busy) -> Response {
    let pause = word_pause().mul_f64(busy.slower);
    let die_after: Option<usize> = std::env::var("TESSERA_DEMO_DIE_AFTER_CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok());
    let chunks = chunks.into_iter().enumerate();
    let events = futures::stream::unfold((chunks, busy), move |(mut rest, busy)| async move {
        let event = match rest.next() {
            Some((sent, _)) if Some(sent) == die_after => {
                // The events before have gone out meanwhile: the client holds part of an answer.
                tokio::time::sleep(pause).await;
                println!("dying after {sent} events of an answer, as told");
                std::process::exit(70);
            }
            Some((_, chunk)) => {
                tokio::time::sleep(pause).await;
                format!("data: {chunk}\n\n")
            }
            None => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(event), (rest, busy)))
    });
    let done = futures::stream::once(async { Ok("data: [DONE]\n\n".to_owned()) });
    let mut answer = Body::from_stream(futures::StreamExt::chain(events, done)).into_response();
    answer.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    answer
}

/// `POST /slow` with `{"ms": N}`: from now on every answer waits N ms before its first byte (0: none), as
/// an engine slowed by busy neighbours on its GPU; for the interference alarm's tests and demos.
async fn slow(State(engine): State<Engine>, Json(request): Json<Value>) -> StatusCode {
    let Some(ms) = request["ms"].as_u64() else {
        return StatusCode::UNPROCESSABLE_ENTITY;
    };
    println!("told to take {ms} ms more before each answer");
    engine.slow_ms.store(ms, Ordering::Relaxed);
    StatusCode::NO_CONTENT
}

/// Before each answer: its profile's faults (a crash or a hang after so many answers), then its time to
/// the first token (slower for each request its GPUs' other engines are answering), and as long more as it
/// was told to (`POST /slow`).
async fn slowed(engine: &Engine) -> Busy {
    let answered = engine.answered.fetch_add(1, Ordering::SeqCst);
    let profile = &engine.profile;
    if profile.crash_after == Some(answered) {
        println!("crashing after {answered} answers, as told");
        std::process::exit(70);
    }
    if profile.hang_after.is_some_and(|n| answered >= n) {
        println!("hanging after {answered} answers, as told");
        engine.failing.store(true, Ordering::Relaxed);
        std::future::pending::<()>().await;
    }
    let counted = engine.memory.as_ref().map(|m| m.answering());
    let neighbours = counted.as_ref().map_or(0, |c| c.neighbours);
    let slower = 1.0 + profile.neighbour_slowdown.max(0.0) * f64::from(neighbours);
    tokio::time::sleep(profile.scaled(profile.first_token_s).mul_f64(slower)).await;
    let ms = engine.slow_ms.load(Ordering::Relaxed);
    if ms > 0 {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    Busy {
        slower,
        neighbours,
        _counted: counted,
    }
}

/// `POST /v1/chat/completions`: an answer to the last message, streamed word by word when asked.
async fn chat(State(engine): State<Engine>, Json(request): Json<Value>) -> Response {
    let busy = slowed(&engine).await;
    let neighbours = busy.neighbours;
    let model = model_of(&engine, &request);
    let prompt = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_owned();
    let words = words(&engine, &prompt);
    let answer = if request["stream"] == true {
        let mut chunks: Vec<Value> = words
            .iter()
            .map(|w| {
                json!({"id": "chatcmpl-demo", "object": "chat.completion.chunk", "model": model,
                "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": null}]})
            })
            .collect();
        if wants_usage(&request) {
            chunks.push(
                json!({"id": "chatcmpl-demo", "object": "chat.completion.chunk", "model": model,
                "choices": [], "usage": usage(&prompt, &words)}),
            );
        }
        event_stream(chunks, busy)
    } else {
        Json(json!({
            "id": "chatcmpl-demo", "object": "chat.completion", "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": words.concat()}, "finish_reason": "stop"}],
            "usage": usage(&prompt, &words),
        }))
        .into_response()
    };
    beside(signed(&engine, answer), neighbours)
}

/// `POST /v1/completions`: the prompt, answered.
async fn completion(State(engine): State<Engine>, Json(request): Json<Value>) -> Response {
    let busy = slowed(&engine).await;
    let neighbours = busy.neighbours;
    let model = model_of(&engine, &request);
    let prompt = request["prompt"].as_str().unwrap_or_default().to_owned();
    let words = words(&engine, &prompt);
    let answer = if request["stream"] == true {
        let mut chunks: Vec<Value> = words
            .iter()
            .map(|w| {
                json!({"id": "cmpl-demo", "object": "text_completion", "model": model,
                "choices": [{"index": 0, "text": w, "finish_reason": null}]})
            })
            .collect();
        if wants_usage(&request) {
            chunks.push(
                json!({"id": "cmpl-demo", "object": "text_completion", "model": model,
                "choices": [], "usage": usage(&prompt, &words)}),
            );
        }
        event_stream(chunks, busy)
    } else {
        Json(json!({
            "id": "cmpl-demo", "object": "text_completion", "model": model,
            "choices": [{"index": 0, "text": words.concat(), "finish_reason": "stop"}],
            "usage": usage(&prompt, &words),
        }))
        .into_response()
    };
    beside(signed(&engine, answer), neighbours)
}

/// `POST /route`, the router's contract (docs/src/gateway.md): of `models`, the first whose name the request's last
/// message (or prompt) mentions, else the first.
async fn route(State(engine): State<Engine>, Json(question): Json<Value>) -> Response {
    let request = &question["request"];
    let said = request["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .or_else(|| request["prompt"].as_str())
        .unwrap_or_default();
    let models: Vec<&str> = question["models"]
        .as_array()
        .map(|m| m.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let Some(chosen) = models
        .iter()
        .find(|m| said.contains(**m))
        .or(models.first())
    else {
        return (StatusCode::BAD_REQUEST, "no models to choose from").into_response();
    };
    signed(&engine, Json(json!({"model": chosen})).into_response())
}

/// `POST /v1/embeddings`: eight numbers for each input, the same for the same text.
async fn embeddings(State(engine): State<Engine>, Json(request): Json<Value>) -> Response {
    let model = model_of(&engine, &request);
    let inputs: Vec<String> = match &request["input"] {
        Value::String(one) => vec![one.clone()],
        Value::Array(many) => many
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect(),
        _ => Vec::new(),
    };
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let vector: Vec<f64> = (0..8u64)
                .map(|k| {
                    let h = text
                        .bytes()
                        .fold(k + 1, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
                    (h % 2000) as f64 / 1000.0 - 1.0
                })
                .collect();
            json!({"object": "embedding", "index": i, "embedding": vector})
        })
        .collect();
    let tokens: usize = inputs.iter().map(|t| t.split_whitespace().count()).sum();
    let answer = Json(json!({"object": "list", "model": model, "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}));
    signed(&engine, answer.into_response())
}

async fn report(State(engine): State<Engine>) -> Json<Report> {
    Json((*engine.report).clone())
}

async fn health(State(engine): State<Engine>) -> (StatusCode, &'static str) {
    if engine.failing.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "failing, as told")
    } else {
        (StatusCode::OK, "ok")
    }
}

/// From now on the health check fails.
async fn fail_health(State(engine): State<Engine>) -> StatusCode {
    println!("told to fail its health check");
    engine.failing.store(true, Ordering::Relaxed);
    StatusCode::NO_CONTENT
}

/// Exits with status 70 just after answering, as an engine that crashes.
async fn crash() -> StatusCode {
    println!("told to crash");
    tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        std::process::exit(70);
    });
    StatusCode::ACCEPTED
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn engine() -> Engine {
        Engine {
            report: Arc::new(Report {
                pid: 1,
                engine: "glm".into(),
                stands_in_for: vec!["vllm".into(), "serve".into()],
                gpu_memory_gb: "32".into(),
                cuda_visible_devices: "0".into(),
                env: BTreeMap::new(),
            }),
            failing: Arc::default(),
            slow_ms: Arc::default(),
            answer_headers: Arc::default(),
            key: None,
            profile: Arc::default(),
            answered: Arc::default(),
            memory: None,
            share: placement::Bytes(32_000_000_000),
            asleep: Arc::default(),
            sleeping: Arc::default(),
        }
    }

    async fn status(router: &Router, method: &str, uri: &str) -> StatusCode {
        router
            .clone()
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
            .status()
    }

    #[tokio::test]
    async fn given_a_key_it_answers_openai_routes_only_with_it_and_its_health_to_anyone() {
        let router = app(Engine {
            key: Some(Arc::from("k3y")),
            ..engine()
        });
        assert_eq!(status(&router, "GET", "/health").await, StatusCode::OK);
        assert_eq!(
            status(&router, "GET", "/v1/models").await,
            StatusCode::UNAUTHORIZED
        );
        let with = |key: &str| {
            Request::builder()
                .uri("/v1/models")
                .header(header::AUTHORIZATION, format!("Bearer {key}"))
                .body(Body::empty())
                .unwrap()
        };
        let status_with = |key: &'static str| {
            let router = router.clone();
            async move { router.oneshot(with(key)).await.unwrap().status() }
        };
        assert_eq!(status_with("k3y").await, StatusCode::OK);
        assert_eq!(status_with("other").await, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn it_is_healthy_until_told_to_fail() {
        let router = app(engine());
        assert_eq!(status(&router, "GET", "/health").await, StatusCode::OK);
        assert_eq!(status(&router, "GET", "/").await, StatusCode::OK);
        assert_eq!(
            status(&router, "POST", "/fail-health").await,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            status(&router, "GET", "/health").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn asleep_it_answers_no_request_says_so_and_wakes_in_the_time_its_weights_take_over_the_link(
    ) {
        // 32 GB, 60 % weights, at 25 GB/s compressed 100 times: 7.7 ms.
        let router = app(Engine {
            profile: Arc::new(Profile {
                speed: 100.0,
                ..Profile::default()
            }),
            ..engine()
        });
        let sleeping = || async {
            let answer = router
                .clone()
                .oneshot(Request::get("/is_sleeping").body(Body::empty()).unwrap())
                .await
                .unwrap();
            let body = axum::body::to_bytes(answer.into_body(), 1 << 16)
                .await
                .unwrap();
            serde_json::from_slice::<Value>(&body).unwrap()["is_sleeping"] == true
        };
        assert!(!sleeping().await);
        assert_eq!(
            status(&router, "POST", "/sleep?level=3").await,
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            status(&router, "POST", "/sleep?level=1").await,
            StatusCode::OK
        );
        assert!(sleeping().await);
        assert_eq!(
            status(&router, "GET", "/v1/models").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(status(&router, "GET", "/health").await, StatusCode::OK);
        let woke = std::time::Instant::now();
        assert_eq!(status(&router, "POST", "/wake_up").await, StatusCode::OK);
        assert!(
            woke.elapsed() >= Duration::from_micros(7_600),
            "{:?}",
            woke.elapsed()
        );
        assert!(!sleeping().await);
        assert_eq!(status(&router, "GET", "/v1/models").await, StatusCode::OK);
    }
}
