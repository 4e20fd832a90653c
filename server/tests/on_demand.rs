//! On-demand models through the real binary's gateway, in front of the demo fleet's real demo-engine
//! processes: loaded by a request, unloaded after their keep-alive, swapped in LRU order.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{member, wait_until_within, Server};

fn on_demand(keep_alive: u32) -> Value {
    json!({"mode": "on_demand", "keep_alive": keep_alive})
}

async fn deploy(server: &Server, body: Value) {
    let (status, answer) = server.send("POST", "/api/deployments", body).await;
    assert_eq!(status, 201, "{answer}");
}

/// text-router on atlas:0 (96 GB): glm-5.3 pinned at 60 %, vision and speech on demand at 30 % each
/// (one turn at a time), with a keep-alive of `keep_alive` seconds.
async fn group(server: &Server, keep_alive: u32) {
    deploy(
        server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 60}),
    )
    .await;
    for (revision, model) in [(1, "vision"), (2, "speech")] {
        deploy(
            server,
            json!({"model": model, "gpus": ["atlas:0"], "share": 30, "revision": revision, "demand": on_demand(keep_alive)}),
        )
        .await;
    }
    server.wait_healthy(1).await;
}

async fn chat(server: &Server, model: &str) -> (u16, Value) {
    server
        .send(
            "POST",
            "/v1/chat/completions",
            json!({"model": model, "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_model_loads_on_its_first_request_answers_it_and_unloads_after_its_keep_alive()
{
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 300).await;
    group(&server, 10).await;
    assert_eq!(
        member(&server, "vision").await["on_demand"]["state"],
        "not_loaded"
    );
    assert!(server.engine_if_any("vision").await.is_none());
    let (_, models) = server.get("/v1/models").await;
    assert!(
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "vision"),
        "{models}"
    );

    let (status, answer) = chat(&server, "vision").await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .ends_with("heard: hello "));
    let vision = member(&server, "vision").await;
    assert_eq!(vision["on_demand"]["state"], "loaded", "{vision}");
    let cold_start = vision["on_demand"]["cold_start_ms"].as_u64().unwrap();
    // The demo engine takes 300 ms to load.
    assert!(cold_start >= 300, "{vision}");
    assert!(vision["on_demand"]["last_used"].is_string(), "{vision}");

    // 10 s with no request: it unloads, and its engine stops.
    wait_until_within("vision unloads", Duration::from_secs(20), || async {
        member(&server, "vision").await["on_demand"]["state"] == "not_loaded"
            && server.engine_if_any("vision").await.is_none()
    })
    .await;
    let (_, audit) = server.get("/api/audit?action=model.unload").await;
    assert_eq!(audit[0]["target"], "vision", "{audit}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternating_requests_swap_two_on_demand_models_in_lru_order_never_overfilling_and_never_evicting_the_pinned_one(
) {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(Server::start(dir.path(), 200).await);
    group(&server, 600).await;
    let glm = server.engine("glm-5.3").await;

    // Watches the engines throughout: vision's and speech's never live at once (draining counts: it still
    // holds its memory).
    let overfilled = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (server, overfilled, done) = (server.clone(), overfilled.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(Ordering::SeqCst) {
                let engines = server.engines().await;
                let alive = |m: &str| engines.iter().any(|e| e["model"] == m);
                if alive("vision") && alive("speech") {
                    overfilled.store(true, Ordering::SeqCst);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    for model in ["vision", "speech", "vision", "speech"] {
        let (status, answer) = chat(&server, model).await;
        assert_eq!(status, 200, "{model}: {answer}");
        let other = if model == "vision" {
            "speech"
        } else {
            "vision"
        };
        assert_eq!(member(&server, model).await["on_demand"]["state"], "loaded");
        assert_eq!(
            member(&server, other).await["on_demand"]["state"],
            "not_loaded"
        );
    }
    done.store(true, Ordering::SeqCst);
    watcher.await.unwrap();
    assert!(
        !overfilled.load(Ordering::SeqCst),
        "vision and speech ran at once on a GPU that holds one of them"
    );
    // The pinned model's engine ran throughout: the same process.
    let glm_now = server.engine("glm-5.3").await;
    assert_eq!(glm_now["pid"], glm["pid"]);
    assert_eq!(glm_now["state"], "healthy");
    let (_, audit) = server.get("/api/audit?action=model.load").await;
    let loads: Vec<Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| json!([e["target"], e["after"]["unloaded"]]))
        .collect();
    assert_eq!(
        loads,
        [
            json!(["speech", ["vision"]]),
            json!(["vision", ["speech"]]),
            json!(["speech", ["vision"]]),
            json!(["vision", []]),
        ],
        "newest first"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

/// Asks `model` every 300 ms until it answers; says after how many tries.
async fn until_answered(server: &Server, model: &str) -> u32 {
    for attempt in 1.. {
        let (status, answer) = chat(server, model).await;
        if status == 200 {
            return attempt;
        }
        assert_eq!(status, 503, "{model}: {answer}");
        assert!(attempt < 40, "{model} never answered: {answer}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_on_demand_models_that_load_longer_than_the_gateway_waits_take_turns_and_each_answers()
{
    let dir = tempfile::tempdir().unwrap();
    // Each engine loads in 2.5 s; a request waits 1 s for one.
    let server =
        Arc::new(Server::start_with(dir.path(), 2500, &["--demo", "--gateway-wait-s", "1"]).await);
    group(&server, 600).await;
    let client = |model: &'static str| {
        let server = server.clone();
        tokio::spawn(async move { until_answered(&server, model).await })
    };
    let vision = client("vision");
    tokio::time::sleep(Duration::from_millis(100)).await;
    let speech = client("speech");
    vision.await.unwrap();
    speech.await.unwrap();
    // vision's load was never cut short for speech's: each was loaded once.
    let (_, audit) = server.get("/api/audit?action=model.load").await;
    let loads: Vec<&Value> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["target"])
        .collect();
    assert_eq!(loads, ["speech", "vision"], "newest first: {audit}");
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_start_is_the_load_itself_and_the_wait_for_room_is_reported_apart() {
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(Server::start(dir.path(), 300).await);
    group(&server, 600).await;
    assert_eq!(chat(&server, "vision").await.0, 200);
    // vision's engine takes 2.5 s over its next answer: speech, which needs its room, waits for it.
    let engine = server.engine("vision").await;
    let port = engine["port"].as_u64().unwrap() as u16;
    let (status, _) = support::request(port, "POST", "/slow", Some(json!({"ms": 2500}))).await;
    assert_eq!(status, 204);
    let slow = {
        let server = server.clone();
        tokio::spawn(async move { chat(&server, "vision").await.0 })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(chat(&server, "speech").await.0, 200);
    assert_eq!(slow.await.unwrap(), 200);
    let speech = member(&server, "speech").await;
    let load = speech["on_demand"]["cold_start_ms"].as_u64().unwrap();
    let waited = speech["on_demand"]["cold_wait_ms"].as_u64().unwrap();
    assert!((300..1_500).contains(&load), "{speech}");
    assert!(waited >= 1_500, "{speech}");
    let (_, metrics) = server.get_bytes("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("tessera_on_demand_cold_start_seconds{model=\"speech\",part=\"wait\"}"),
        "{metrics}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_503_while_an_engine_restarts_says_to_ask_again_when_its_restart_should_be_ready() {
    let dir = tempfile::tempdir().unwrap();
    // The engine loads in 2.5 s; a request waits 1 s for one.
    let server = Server::start_with(dir.path(), 2500, &["--demo", "--gateway-wait-s", "1"]).await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 60}),
    )
    .await;
    server.wait_healthy(1).await;
    let engine = server.engine("glm-5.3").await;
    support::kill(engine["pid"].as_u64().unwrap() as u32, "KILL");
    wait_until_within("the engine restarts", Duration::from_secs(10), || async {
        server.engine("glm-5.3").await["state"] != "healthy"
    })
    .await;
    let (status, headers, answer) = server
        .send_full(
            "POST",
            "/v1/chat/completions",
            json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "hello"}]}),
        )
        .await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "model_not_ready");
    // Its backoff (0.2 s) and its last load (2.5 s), less the second it was waited for: not a fixed 5.
    let retry_after: u64 = headers[hyper::header::RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=3).contains(&retry_after), "Retry-After: {retry_after}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_on_demand_model_whose_engine_fails_to_load_is_unloaded_and_refused_at_once_with_the_reason(
) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:0"], "share": 30, "demand": on_demand(600), "env": {"TESSERA_DEMO_EXIT_AFTER_MS": "50"}}),
    )
    .await;
    let asked = std::time::Instant::now();
    let (status, answer) = chat(&server, "vision").await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "model_failed", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("vision failed to load and was unloaded: ")
            && message.contains("exited"),
        "{message}"
    );
    // Refused once it failed (three restarts), not after the gateway's 30 s wait.
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "{:?}",
        asked.elapsed()
    );
    assert_eq!(
        member(&server, "vision").await["on_demand"]["state"],
        "not_loaded"
    );
    let (_, audit) = server.get("/api/audit?action=model.unload").await;
    assert!(
        audit[0]["after"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("its engine failed to load: "),
        "{audit}"
    );
    // The next request, within the cool-off, is refused at once, saying why.
    let again = std::time::Instant::now();
    let (status, answer) = chat(&server, "vision").await;
    assert_eq!(status, 503, "{answer}");
    assert_eq!(answer["error"]["code"], "model_failed", "{answer}");
    assert!(again.elapsed() < Duration::from_millis(900));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_on_demand_models_asked_without_a_pause_take_turns_and_both_answer() {
    let dir = tempfile::tempdir().unwrap();
    // A request waits up to 3 s for an engine; a cold model asks the busy one beside it for its turn once
    // it has waited a third of that, and the busy one has served as long.
    let server =
        Arc::new(Server::start_with(dir.path(), 200, &["--demo", "--gateway-wait-s", "3"]).await);
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 60}),
    )
    .await;
    for (revision, model) in [(1, "vision"), (2, "speech")] {
        deploy(
            &server,
            json!({"model": model, "gpus": ["atlas:0"], "share": 30, "revision": revision,
                   "demand": on_demand(600), "env": {"TESSERA_DEMO_TOKEN_MS": "100"}}),
        )
        .await;
    }
    server.wait_healthy(1).await;
    // Three clients a model, each asking again the moment it is answered (streamed, about 0.7 s an answer)
    // and each begun a third of an answer after the one before: two of its requests or more are in
    // flight at every moment, so the model is never idle.
    let done = Arc::new(AtomicBool::new(false));
    let began = std::time::Instant::now();
    let client = |model: &'static str, after: u64| {
        let (server, done) = (server.clone(), done.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            let mut answered = Vec::new();
            while !done.load(Ordering::SeqCst) {
                let (status, _) = server
                    .send(
                        "POST",
                        "/v1/chat/completions",
                        json!({"model": model, "stream": true,
                               "messages": [{"role": "user", "content": "hello"}]}),
                    )
                    .await;
                if status == 200 {
                    answered.push(began.elapsed());
                } else {
                    assert_eq!(status, 503, "{model}: a refusal says to ask again");
                }
            }
            answered
        })
    };
    let mut clients = vec![
        client("vision", 0),
        client("vision", 250),
        client("vision", 500),
    ];
    tokio::time::sleep(Duration::from_secs(1)).await;
    clients.extend([
        client("speech", 0),
        client("speech", 250),
        client("speech", 500),
    ]);
    tokio::time::sleep(Duration::from_secs(16)).await;
    done.store(true, Ordering::SeqCst);
    let mut answers = Vec::new();
    for c in clients {
        answers.push(c.await.unwrap());
    }
    for (model, answered) in [
        ("vision", answers[..3].concat()),
        ("speech", answers[3..].concat()),
    ] {
        let mut answered = answered;
        answered.sort();
        assert!(answered.len() >= 4, "{model} answered {answered:?}");
        // Between its turns it waits for the other's: never for as long as the other's traffic lasts.
        let longest = answered
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default();
        assert!(
            longest < Duration::from_secs(10),
            "{model} went {longest:?} without an answer: {answered:?}"
        );
    }
    let (_, audit) = server.get("/api/audit?action=model.load").await;
    assert!(
        audit.as_array().unwrap().len() >= 3,
        "they took turns: {audit}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}
