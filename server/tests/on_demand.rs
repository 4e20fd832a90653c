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

/// Tessera on the demo fleet with its GPUs simulated in `sim` (the engines really allocate there), a demo
/// engine loading in 3 s and waking over a 50 GB/s link, and models asleep for at most `keep_asleep_s`.
async fn on_simulated_gpus(
    data: &std::path::Path,
    sim: &std::path::Path,
    keep_asleep_s: u32,
) -> Server {
    on_simulated_gpus_with(data, sim, &["--keep-asleep-s", &keep_asleep_s.to_string()]).await
}

/// [`on_simulated_gpus`] with flags of the test's own.
async fn on_simulated_gpus_with(
    data: &std::path::Path,
    sim: &std::path::Path,
    flags: &[&str],
) -> Server {
    let sim = sim.display().to_string();
    let profile = json!({"load_s": [3, 3], "host_to_device_gb_s": 50}).to_string();
    let mut args = vec!["--demo", "--simulate-gpus", &sim];
    args.extend(flags);
    Server::start_with_env(data, 0, &args, &[("TESSERA_DEMO_PROFILE", &profile)]).await
}

/// On atlas:0 (96 GiB), glm-5.3 (vLLM, its sleep mode on) on demand at 50 % and speech (llama.cpp, which
/// cannot sleep) on demand at 45 %, each with a keep-alive of 10 s: one turn at a time, by the plan.
async fn sleeper_and_speech(server: &Server) {
    deploy(
        server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 50, "demand": on_demand(10), "args": ["--enable-sleep-mode"]}),
    )
    .await;
    deploy(
        server,
        json!({"model": "speech", "gpus": ["atlas:0"], "share": 45, "revision": 1, "demand": on_demand(10)}),
    )
    .await;
}

/// Stops `server`, and checks that the simulated driver refused no engine's allocation all along.
async fn stop_with_no_refusal(server: Server, sim: &std::path::Path) {
    server.stop().await;
    let refusals = server::inventory::simulated::SimulatedGpus::open(sim).refusals();
    assert!(refusals.is_empty(), "{refusals:?}");
}

/// What atlas:0 holds now in the simulated driver, GB.
fn atlas_0_used_gb(sim: &std::path::Path) -> f64 {
    let gpus = server::inventory::simulated::SimulatedGpus::open(sim);
    let reading = gpus.read(&"atlas:0".parse().unwrap()).unwrap();
    reading.used.get() as f64 / 1e9
}

/// Waits until `model` is asleep with what it keeps measured; its member as the API shows it then.
async fn until_asleep(server: &Server, model: &str) -> Value {
    wait_until_within(
        &format!("{model} falls asleep"),
        Duration::from_secs(30),
        || async {
            let on_demand = &member(server, model).await["on_demand"];
            on_demand["state"] == "asleep" && on_demand["asleep"]["held_bytes"].is_u64()
        },
    )
    .await;
    member(server, model).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_idle_past_its_keep_alive_sleeps_and_its_gpu_memory_becomes_the_turns_room() {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = on_simulated_gpus(dir.path(), sim.path(), 3600).await;
    sleeper_and_speech(&server).await;
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    let awake = atlas_0_used_gb(sim.path());
    assert!(
        (51.0..=51.6).contains(&awake),
        "glm-5.3 holds its 48 GiB: {awake}"
    );

    // 10 s with no request: asleep, not stopped; it keeps 5 % of its share, measured, and says so.
    let glm = until_asleep(&server, "glm-5.3").await;
    let held = glm["on_demand"]["asleep"]["held_bytes"].as_u64().unwrap();
    // 5 % of 48 GiB.
    assert_eq!(held, 2_576_980_377, "{glm}");
    assert!(glm["on_demand"]["asleep"]["since"].is_string(), "{glm}");
    let engine = server.engine("glm-5.3").await;
    assert_eq!(engine["state"], "asleep", "{engine}");
    assert_eq!(engine["held_asleep_bytes"], held, "{engine}");
    let asleep = atlas_0_used_gb(sim.path());
    assert!(
        (2.5..=2.6).contains(&asleep),
        "only what it keeps: {asleep}"
    );
    let (_, audit) = server.get("/api/audit?action=model.sleep").await;
    assert_eq!(audit[0]["target"], "glm-5.3", "{audit}");
    assert_eq!(
        audit[0]["after"]["reason"], "no request for its keep-alive of 10 s",
        "{audit}"
    );

    // speech loads into the room it gave up, beside it: glm-5.3 is neither stopped nor woken for it.
    assert_eq!(chat(&server, "speech").await.0, 200);
    assert_eq!(
        member(&server, "glm-5.3").await["on_demand"]["state"],
        "asleep"
    );
    let (_, unloads) = server.get("/api/audit?action=model.unload").await;
    assert_eq!(unloads, json!([]), "nothing was unloaded for it");
    let both = atlas_0_used_gb(sim.path());
    assert!(both <= 96.0, "{both}");
    stop_with_no_refusal(server, sim.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_wakes_a_sleeping_model_in_its_wake_time_not_its_load_time() {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = on_simulated_gpus(dir.path(), sim.path(), 3600).await;
    sleeper_and_speech(&server).await;
    let cold = std::time::Instant::now();
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    let cold = cold.elapsed();
    let pid = server.engine("glm-5.3").await["pid"].clone();
    until_asleep(&server, "glm-5.3").await;

    let woken = std::time::Instant::now();
    let (status, answer) = chat(&server, "glm-5.3").await;
    let woken = woken.elapsed();
    assert_eq!(status, 200, "{answer}");
    // 30.9 GB of weights over 50 GB/s: 0.6 s, where its cold start took its 3 s load.
    assert!(cold >= Duration::from_secs(3), "{cold:?}");
    assert!(woken < Duration::from_millis(2_000), "{woken:?}");
    let glm = member(&server, "glm-5.3").await;
    assert_eq!(glm["on_demand"]["state"], "loaded", "{glm}");
    let wake_ms = glm["on_demand"]["last_wake_ms"].as_u64().unwrap();
    assert!((500..2_000).contains(&wake_ms), "{glm}");
    assert!(
        glm["on_demand"]["cold_start_ms"].as_u64().unwrap() >= 3_000,
        "{glm}"
    );
    // The same engine, woken: not started again.
    let engine = server.engine("glm-5.3").await;
    assert_eq!(engine["pid"], pid, "{engine}");
    assert!(engine["last_wake_ms"].as_u64().unwrap() >= 500, "{engine}");
    let (_, audit) = server.get("/api/audit?action=model.wake").await;
    assert_eq!(audit[0]["target"], "glm-5.3", "{audit}");
    let used = atlas_0_used_gb(sim.path());
    assert!(
        (51.0..=51.6).contains(&used),
        "its whole share again: {used}"
    );
    let (_, metrics) = server.get_bytes("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics.contains("tessera_on_demand_wake_seconds{model=\"glm-5.3\"}"),
        "{metrics}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_whose_engine_died_asleep_falls_back_to_a_cold_start_saying_why() {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = on_simulated_gpus(dir.path(), sim.path(), 3600).await;
    sleeper_and_speech(&server).await;
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    until_asleep(&server, "glm-5.3").await;
    let pid = server.engine("glm-5.3").await["pid"].as_u64().unwrap() as u32;
    support::kill(pid, "KILL");

    let (status, answer) = chat(&server, "glm-5.3").await;
    assert_eq!(status, 200, "a cold start answers it: {answer}");
    let glm = member(&server, "glm-5.3").await;
    assert_eq!(glm["on_demand"]["state"], "loaded", "{glm}");
    let fell_back = glm["on_demand"]["fell_back"].as_str().unwrap();
    assert!(fell_back.contains("died asleep"), "{glm}");
    let engine = server.engine("glm-5.3").await;
    assert_ne!(engine["pid"], pid, "{engine}");
    let (_, audit) = server.get("/api/audit?action=model.unload").await;
    assert!(
        audit[0]["after"]["reason"]
            .as_str()
            .unwrap()
            .starts_with("its engine died asleep"),
        "{audit}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_asleep_past_its_second_keep_alive_is_stopped() {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = on_simulated_gpus(dir.path(), sim.path(), 2).await;
    sleeper_and_speech(&server).await;
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    let glm = until_asleep(&server, "glm-5.3").await;
    assert_eq!(glm["on_demand"]["keep_asleep_s"], 2, "{glm}");
    wait_until_within("glm-5.3 is stopped", Duration::from_secs(15), || async {
        member(&server, "glm-5.3").await["on_demand"]["state"] == "not_loaded"
            && server.engine_if_any("glm-5.3").await.is_none()
    })
    .await;
    let (_, audit) = server.get("/api/audit?action=model.unload").await;
    assert_eq!(
        audit[0]["after"]["reason"], "asleep for 2 s with no request",
        "{audit}"
    );
    assert!(atlas_0_used_gb(sim.path()) < 0.01);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_restarts_a_sleeping_model_stops_it_and_its_next_request_starts_it_cold() {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = on_simulated_gpus(dir.path(), sim.path(), 3600).await;
    sleeper_and_speech(&server).await;
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    until_asleep(&server, "glm-5.3").await;
    let pid = server.engine("glm-5.3").await["pid"].clone();
    let revision = server.get("/api/groups").await.1[0]["revision"].clone();

    // A serving change restarts an engine: asleep, it would load its whole share where the plan holds
    // only what it kept. It is stopped and unloaded instead.
    let (status, answer) = server
        .send(
            "PUT",
            "/api/deployments/glm-5.3/serving",
            json!({"revision": revision, "args": ["--enable-sleep-mode", "--max-model-len", "4096"]}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    wait_until_within("glm-5.3 is unloaded", Duration::from_secs(15), || async {
        member(&server, "glm-5.3").await["on_demand"]["state"] == "not_loaded"
    })
    .await;
    assert!(server.engine_if_any("glm-5.3").await.is_none());

    let (status, answer) = chat(&server, "glm-5.3").await;
    assert_eq!(status, 200, "{answer}");
    let engine = server.engine("glm-5.3").await;
    assert_ne!(engine["pid"], pid, "started anew: {engine}");
    assert!(
        engine["command"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "4096"),
        "{engine}"
    );
    stop_with_no_refusal(server, sim.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sleeper_is_stopped_when_host_memory_for_sleepers_runs_short_least_recently_used_first() {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // atlas has 512 GiB: sleepers may keep 12 % of it, 66 GB, where each of these keeps up to 51.5.
    let server = on_simulated_gpus_with(
        dir.path(),
        sim.path(),
        &["--sleepers-host-memory-percent", "12"],
    )
    .await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 50, "demand": on_demand(10), "args": ["--enable-sleep-mode"]}),
    )
    .await;
    deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 50, "demand": on_demand(10),
               "args": ["--enable-memory-saver", "--enable-weights-cpu-backup"]}),
    )
    .await;
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(chat(&server, "vision").await.0, 200);

    // glm-5.3 idles past its keep-alive first and sleeps; then vision: the two would keep more of atlas's
    // memory than sleepers may, so glm-5.3, the least recently used, is stopped for it.
    let vision = until_asleep(&server, "vision").await;
    assert!(
        vision["on_demand"]["asleep"]["host_bytes"].is_u64(),
        "{vision}"
    );
    wait_until_within("glm-5.3 is stopped", Duration::from_secs(10), || async {
        member(&server, "glm-5.3").await["on_demand"]["state"] == "not_loaded"
    })
    .await;
    let (_, audit) = server
        .get("/api/audit?action=model.unload&target=glm-5.3")
        .await;
    let reason = audit[0]["after"]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("the memory models asleep may keep on atlas ("),
        "{audit}"
    );
    let (_, slept) = server.get("/api/audit?action=model.sleep").await;
    let slept: Vec<&Value> = slept
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["target"])
        .collect();
    assert_eq!(slept, ["vision", "glm-5.3"], "newest first");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_model_that_slept_before_is_put_to_sleep_not_stopped_to_make_room_for_a_load() {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = on_simulated_gpus(dir.path(), sim.path(), 3600).await;
    // On atlas:0, glm-5.3 at 60 % and speech at 45 %: together they do not fit.
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 60, "demand": on_demand(10), "args": ["--enable-sleep-mode"]}),
    )
    .await;
    deploy(
        &server,
        json!({"model": "speech", "gpus": ["atlas:0"], "share": 45, "revision": 1, "demand": on_demand(10)}),
    )
    .await;
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    until_asleep(&server, "glm-5.3").await;
    // speech loads beside the sleeper; glm-5.3's wake then needs speech's room (speech cannot sleep).
    assert_eq!(chat(&server, "speech").await.0, 200);
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    let pid = server.engine("glm-5.3").await["pid"].clone();
    assert_eq!(
        member(&server, "speech").await["on_demand"]["state"],
        "not_loaded"
    );

    // speech again: glm-5.3, idle and measured asleep once, sleeps to make room rather than stopping.
    assert_eq!(chat(&server, "speech").await.0, 200);
    let glm = member(&server, "glm-5.3").await;
    assert_eq!(glm["on_demand"]["state"], "asleep", "{glm}");
    assert_eq!(server.engine("glm-5.3").await["pid"], pid);
    let (_, audit) = server.get("/api/audit?action=model.sleep").await;
    assert_eq!(
        audit[0]["after"]["reason"], "idle, it makes room for speech",
        "{audit}"
    );
    // And it wakes, not loads, for its next request.
    assert_eq!(chat(&server, "glm-5.3").await.0, 200);
    let (_, wakes) = server.get("/api/audit?action=model.wake").await;
    assert_eq!(wakes.as_array().unwrap().len(), 2, "{wakes}");
    stop_with_no_refusal(server, sim.path()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wake_queued_behind_a_load_never_runs_before_the_sleep_that_makes_its_room_even_when_a_newer_request_wakes_the_model_it_first_put_to_sleep(
) {
    let (dir, sim) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let server = on_simulated_gpus(dir.path(), sim.path(), 3600).await;
    // On atlas:0, four vLLM models in sleep mode: 40 + 25 + 20 + 30 % take turns in 100 %.
    for (revision, (model, share)) in [("big", 40), ("mid", 25), ("small", 20), ("cold", 30)]
        .into_iter()
        .enumerate()
    {
        let (status, answer) = server
            .send(
                "POST",
                "/api/models",
                json!({"name": model, "engine": "vllm", "default_share_percent": share, "model_path": format!("test/{model}")}),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
        let mut body = json!({"model": model, "gpus": ["atlas:0"], "share": share, "demand": on_demand(10), "args": ["--enable-sleep-mode"]});
        if revision > 0 {
            body["revision"] = json!(revision);
        }
        deploy(&server, body).await;
    }
    // big, mid and small load together and fall asleep once: each is then put to sleep to make room.
    let server = Arc::new(server);
    let asked = |model: &'static str| {
        let server = server.clone();
        tokio::spawn(async move { chat(&server, model).await.0 })
    };
    let warm = [asked("big"), asked("mid"), asked("small")];
    for answered in warm {
        assert_eq!(answered.await.unwrap(), 200);
    }
    for model in ["big", "mid", "small"] {
        until_asleep(&server, model).await;
    }
    // mid woken before big: mid is the least recently used.
    assert_eq!(chat(&server, "mid").await.0, 200);
    assert_eq!(chat(&server, "big").await.0, 200);

    // cold loads (3 s: every job on atlas:0 waits behind it); small's wake puts mid to sleep; then mid's
    // wake makes that sleep moot and puts big to sleep instead. small must not wake before big sleeps.
    let cold = asked("cold");
    wait_until_within("cold is loading", Duration::from_secs(10), || async {
        member(&server, "cold").await["on_demand"]["state"] == "loading"
    })
    .await;
    let small = asked("small");
    wait_until_within(
        "mid is put to sleep for small",
        Duration::from_secs(10),
        || async { member(&server, "mid").await["on_demand"]["state"] == "asleep" },
    )
    .await;
    let mid = asked("mid");
    for answered in [cold, small, mid] {
        assert_eq!(answered.await.unwrap(), 200);
    }
    let (_, sleeps) = server.get("/api/audit?action=model.sleep").await;
    assert_eq!(sleeps[0]["target"], "big", "big made way for mid: {sleeps}");
    stop_with_no_refusal(Arc::into_inner(server).unwrap(), sim.path()).await;
}
