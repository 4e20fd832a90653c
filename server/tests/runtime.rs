//! The runtime with real processes: the `tessera` binary with the demo fleet, whose machines run the demo
//! engine (a real HTTP process) in place of vLLM, SGLang or llama.cpp.

mod support;

use serde_json::{json, Value};
use support::{alive, at, kill, processes_of, report, wait_until, Server};

async fn deploy(server: &Server, body: Value) -> Value {
    let (status, answer) = server.send("POST", "/api/deployments", body).await;
    assert_eq!(status, 201, "{answer}");
    answer
}

/// glm-5.3 (40 %), the router (10 %) and the embedder (5 %) in text-router on atlas:0 (96 GB).
async fn text_router(server: &Server) {
    deploy(
        server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        server,
        json!({"model": "semantic-router", "gpus": ["atlas:0"], "share": 10, "revision": 1}),
    )
    .await;
    deploy(
        server,
        json!({"model": "embedder", "gpus": ["atlas:0"], "share": 5, "revision": 2}),
    )
    .await;
}

/// The plan change of these tests: glm-5.3 shrinks to 30 %, the embedder grows to 15 %.
async fn shrink_glm_grow_embedder(server: &Server) -> Value {
    let (status, change) = server
        .send(
            "PUT",
            "/api/groups/text-router/plan",
            json!({"revision": 3, "shares": {"glm-5.3": 30, "semantic-router": 10, "embedder": 15}}),
        )
        .await;
    assert_eq!(status, 200, "{change}");
    change
}

fn pid(engines: &[Value], model: &str) -> u64 {
    engines
        .iter()
        .find(|e| e["model"] == model)
        .and_then(|e| e["pid"].as_u64())
        .unwrap_or_else(|| panic!("{model} runs"))
}

fn engine_events<'a>(
    events: &'a [Value],
    model: &'a str,
    state: &'a str,
) -> impl Iterator<Item = &'a Value> {
    let unit = format!("group:text-router/{model}@atlas");
    events.iter().filter(move |e| {
        e["kind"] == "engine" && e["engine"] == unit.as_str() && e["state"] == state
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharing_switch_restarts_every_engine_on_its_gpu_each_stopped_before_any_starts_again() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    text_router(&server).await;
    let before = server.wait_healthy(3).await;
    let events = server.follow_events().await;

    let (status, change) = server
        .send(
            "PUT",
            "/api/machines/atlas/gpus/0/sharing",
            json!({"mode": "mps", "compute_percent": 50}),
        )
        .await;
    assert_eq!(status, 200, "{change}");
    assert_eq!(
        change["restarts"],
        json!(["embedder", "glm-5.3", "semantic-router"])
    );
    let members = ["glm-5.3", "semantic-router", "embedder"];
    wait_until("every member serves again as an MPS client", || async {
        let seen = events.all();
        members
            .iter()
            .all(|m| engine_events(&seen, m, "healthy").count() > 0)
    })
    .await;
    let after = server.wait_healthy(3).await;
    for member in members {
        assert_ne!(pid(&before, member), pid(&after, member), "{member}");
    }
    // No share started beside one still running as it was: on a GPU whose sharing changed, every engine
    // changes, and all of them stop before any starts again.
    let seen = events.all();
    let last_stop = members
        .iter()
        .flat_map(|m| engine_events(&seen, m, "stopped").map(at))
        .max()
        .expect("the members stopped");
    let first_start = members
        .iter()
        .flat_map(|m| engine_events(&seen, m, "starting").map(at))
        .min()
        .expect("the members started again");
    assert!(
        last_stop <= first_start,
        "a member started at {first_start} before the last stopped at {last_stop}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_change_restarts_only_that_member_with_its_new_share_shrinking_stops_first() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    text_router(&server).await;
    let before = server.wait_healthy(3).await;
    let events = server.follow_events().await;

    let change = shrink_glm_grow_embedder(&server).await;
    let restarts: Vec<&str> = change["restarts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["member"].as_str().unwrap())
        .collect();
    assert_eq!(restarts, ["glm-5.3", "embedder"]);
    wait_until("the plan change is carried out", || async {
        let (_, group) = server.get("/api/groups/text-router").await;
        group["progress"]["revision"] == 4
            && group["progress"]["steps"]
                .as_array()
                .is_some_and(|steps| steps.iter().all(|s| s["status"] == "done"))
    })
    .await;
    let after = server.wait_healthy(3).await;

    // Only the members whose share changed restarted.
    assert_eq!(
        pid(&before, "semantic-router"),
        pid(&after, "semantic-router")
    );
    assert_ne!(pid(&before, "glm-5.3"), pid(&after, "glm-5.3"));
    assert_ne!(pid(&before, "embedder"), pid(&after, "embedder"));

    // Each started again with its new share: 30 % and 15 % of 96 GB.
    let glm = report(after.iter().find(|e| e["model"] == "glm-5.3").unwrap()).await;
    assert_eq!(glm["gpu_memory_gb"], "28.8");
    assert_eq!(glm["env"]["TESSERA_GPU_MEMORY_GB"], "28.8");
    assert_eq!(glm["cuda_visible_devices"], "0");
    let argv: Vec<&str> = glm["stands_in_for"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv[..3], ["vllm", "serve", "zai-org/GLM-5.3"]);
    assert!(
        argv.windows(2)
            .any(|w| w == ["--gpu-memory-utilization", "0.3"]),
        "{argv:?}"
    );
    let embedder = report(after.iter().find(|e| e["model"] == "embedder").unwrap()).await;
    assert_eq!(embedder["gpu_memory_gb"], "14.4");

    // Every shrinking stop came before any growing start.
    let seen = events.all();
    let glm_stopped = engine_events(&seen, "glm-5.3", "stopped")
        .map(at)
        .max()
        .expect("glm-5.3 stopped");
    let embedder_started = engine_events(&seen, "embedder", "starting")
        .map(at)
        .min()
        .expect("the embedder started");
    assert!(
        glm_stopped < embedder_started,
        "{glm_stopped} is not before {embedder_started}"
    );
    assert_eq!(
        engine_events(&seen, "semantic-router", "stopped").count(),
        0,
        "the router was not touched"
    );

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_growing_member_stops_only_once_the_shrinking_one_serves_again_with_its_new_share() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 300).await;
    text_router(&server).await;
    server.wait_healthy(3).await;
    let events = server.follow_events().await;

    shrink_glm_grow_embedder(&server).await;
    wait_until("the embedder serves again", || async {
        let seen = events.all();
        engine_events(&seen, "embedder", "healthy").count() > 0
    })
    .await;
    let seen = events.all();
    let glm_serves = engine_events(&seen, "glm-5.3", "healthy")
        .map(at)
        .min()
        .expect("glm-5.3 serves again");
    let embedder_stops = engine_events(&seen, "embedder", "draining")
        .chain(engine_events(&seen, "embedder", "stopped"))
        .map(at)
        .min()
        .expect("the embedder stopped");
    assert!(
        glm_serves < embedder_stops,
        "the embedder stopped at {embedder_stops}, before glm-5.3 served again at {glm_serves}"
    );

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_engine_is_restarted_after_its_backoff_and_the_state_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "speech", "gpus": ["majin:0"], "share": 10}),
    )
    .await;
    let first = server.wait_healthy(1).await[0]["pid"].as_u64().unwrap();
    let events = server.follow_events().await;

    kill(first as u32, "KILL");
    wait_until("speech runs again", || async {
        let engine = server.engine_if_any("speech").await;
        engine.is_some_and(|e| e["state"] == "healthy" && e["pid"].as_u64() != Some(first))
    })
    .await;
    let engine = server.engine("speech").await;
    assert_eq!(engine["restarts"], 1);

    let seen = events.all();
    let unit = "group:speech/speech@majin";
    let restarting = seen
        .iter()
        .find(|e| e["engine"] == unit && e["state"] == "restarting")
        .expect("a restarting event");
    let message = restarting["message"].as_str().unwrap();
    assert!(message.contains("SIGKILL"), "{message}");
    assert!(
        message.contains("restarting in 0.2 s (attempt 1 of 3)"),
        "{message}"
    );
    let started = seen
        .iter()
        .find(|e| e["engine"] == unit && e["state"] == "starting")
        .expect("a starting event");
    assert!(
        at(started) - at(restarting) >= time::Duration::milliseconds(200),
        "the backoff was waited out"
    );

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_keeps_failing_backs_off_doubling_and_the_plan_shows_why_it_failed() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 1000).await;
    let events = server.follow_events().await;
    deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 25, "env": {"TESSERA_DEMO_EXIT_AFTER_MS": "100"}}),
    )
    .await;
    wait_until("vision is left failed", || async {
        let engine = server.engine_if_any("vision").await;
        engine.is_some_and(|e| e["state"] == "failed")
    })
    .await;
    let engine = server.engine("vision").await;
    assert_eq!(engine["restarts"], 3);
    let message = engine["message"].as_str().unwrap();
    assert!(
        message.contains("it failed 4 times in a row, so it is not restarted again"),
        "{message}"
    );

    let waits: Vec<String> = events
        .all()
        .iter()
        .filter(|e| e["state"] == "restarting")
        .map(|e| {
            let m = e["message"].as_str().unwrap();
            m[m.find("restarting in").unwrap()..].to_owned()
        })
        .collect();
    assert_eq!(
        waits,
        [
            "restarting in 0.2 s (attempt 1 of 3)",
            "restarting in 0.4 s (attempt 2 of 3)",
            "restarting in 0.8 s (attempt 3 of 3)"
        ]
    );

    let (_, group) = server.get("/api/groups/vision").await;
    let step = &group["progress"]["steps"][0];
    assert_eq!(step["action"], "start");
    assert_eq!(step["status"], "failed");
    assert!(
        step["message"]
            .as_str()
            .unwrap()
            .starts_with("vision on atlas: "),
        "{step}"
    );
    assert_eq!(group["members"][0]["engines"][0]["state"], "failed");

    let id = engine["id"].as_str().unwrap();
    let (status, logs) = server.get(&format!("/api/engines/{id}/logs?lines=5")).await;
    assert_eq!(status, 200);
    let lines: Vec<&str> = logs["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    assert!(
        lines.contains(&"exiting after 100 ms, as told"),
        "{lines:?}"
    );

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_killed_in_the_middle_of_a_restart_comes_back_to_exactly_the_committed_plan() {
    let dir = tempfile::tempdir().unwrap();
    // Engines take 1.5 s to load, so that the kill lands in the middle of the change.
    let server = Server::start(dir.path(), 1500).await;
    text_router(&server).await;
    let before = server.wait_healthy(3).await;
    let router = before
        .iter()
        .find(|e| e["model"] == "semantic-router")
        .unwrap();
    let instance = report(router).await["env"]["TESSERA_INSTANCE"]
        .as_str()
        .unwrap()
        .to_owned();
    let events = server.follow_events().await;

    shrink_glm_grow_embedder(&server).await;
    wait_until("glm-5.3 stopped and is starting again", || async {
        let seen = events.all();
        engine_events(&seen, "glm-5.3", "stopped").count() == 1
            && engine_events(&seen, "glm-5.3", "starting").count() >= 1
    })
    .await;
    server.kill_9().await;

    let server = Server::start(dir.path(), 1500).await;
    let after = server.wait_healthy(3).await;
    // The router was running as committed: adopted, not restarted.
    assert_eq!(
        pid(&before, "semantic-router"),
        pid(&after, "semantic-router")
    );
    for (model, gb) in [
        ("glm-5.3", "28.8"),
        ("embedder", "14.4"),
        ("semantic-router", "9.6"),
    ] {
        let engine = after.iter().find(|e| e["model"] == model).unwrap();
        assert_eq!(report(engine).await["gpu_memory_gb"], gb, "{model}");
    }
    // Exactly these engines run: no orphan from the killed server.
    let mut running: Vec<u64> = processes_of(&instance).into_iter().map(u64::from).collect();
    running.sort_unstable();
    let mut engines: Vec<u64> = after.iter().map(|e| e["pid"].as_u64().unwrap()).collect();
    engines.sort_unstable();
    assert_eq!(running, engines);

    server.stop().await;
    assert_eq!(
        processes_of(&instance),
        Vec::<u32>::new(),
        "Ctrl-C takes the engines with it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_failing_its_health_check_is_unhealthy_then_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "speech", "gpus": ["majin:0"], "share": 10}),
    )
    .await;
    let engine = server.wait_healthy(1).await.remove(0);
    let first = engine["pid"].as_u64().unwrap();
    let events = server.follow_events().await;
    let port = engine["port"].as_u64().unwrap() as u16;
    assert_eq!(
        support::request(port, "POST", "/fail-health", None).await.0,
        204
    );

    wait_until("speech runs again, healthy", || async {
        let engine = server.engine_if_any("speech").await;
        engine.is_some_and(|e| e["state"] == "healthy" && e["pid"].as_u64() != Some(first))
    })
    .await;
    let seen = events.all();
    let mut states: Vec<&str> = seen
        .iter()
        .filter(|e| e["kind"] == "engine")
        .map(|e| e["state"].as_str().unwrap())
        .collect();
    // A loading engine says how far it has got in events of the same state.
    states.dedup();
    assert_eq!(states, ["unhealthy", "restarting", "starting", "healthy"]);
    assert_eq!(seen[0]["message"], "3 health checks in a row failed");
    assert!(
        seen[1]["message"]
            .as_str()
            .unwrap()
            .starts_with("failed 15 health checks in a row; restarting in"),
        "{}",
        seen[1]
    );

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_admitted_to_an_engine_that_then_turns_unhealthy_is_drained_before_the_engine_stops(
) {
    let dir = tempfile::tempdir().unwrap();
    let server = std::sync::Arc::new(Server::start(dir.path(), 100).await);
    deploy(
        &server,
        json!({"model": "speech", "gpus": ["majin:0"], "share": 10}),
    )
    .await;
    let engine = server.wait_healthy(1).await.remove(0);
    let port = engine["port"].as_u64().unwrap() as u16;
    // Its answers now take 2 s: the one asked next is in flight when its health checks start failing,
    // and past the 15 failed checks (0.75 s) after which it is restarted.
    let (status, _) = support::request(port, "POST", "/slow", Some(json!({"ms": 2000}))).await;
    assert_eq!(status, 204);
    let events = server.follow_events().await;
    let asked = {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .send(
                    "POST",
                    "/v1/chat/completions",
                    json!({"model": "speech", "messages": [{"role": "user", "content": "hello"}]}),
                )
                .await
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        support::request(port, "POST", "/fail-health", None).await.0,
        204
    );
    let (status, answer) = asked.await.unwrap();
    assert_eq!(status, 200, "{answer}");
    wait_until("speech runs again, healthy", || async {
        server
            .engine_if_any("speech")
            .await
            .is_some_and(|e| e["state"] == "healthy" && e["pid"] != engine["pid"])
    })
    .await;
    // The event stream is read on its own task: it may carry the last state a moment after the API shows it.
    wait_until("the event stream carries it healthy again", || async {
        events
            .all()
            .iter()
            .any(|e| e["kind"] == "engine" && e["state"] == "healthy")
    })
    .await;
    let mut states: Vec<String> = events
        .all()
        .iter()
        .filter(|e| e["kind"] == "engine")
        .map(|e| e["state"].as_str().unwrap().to_owned())
        .collect();
    states.dedup();
    assert_eq!(
        states,
        ["unhealthy", "draining", "restarting", "starting", "healthy"]
    );
    std::sync::Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_runs_with_its_share_and_environment_restarts_on_request_and_stops_when_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let (status, worker) = server
        .send(
            "POST",
            "/api/workers",
            json!({
                "name": "listen",
                "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 2.2}},
                "env": {"GREETING": "hello"}
            }),
        )
        .await;
    assert_eq!(status, 201, "{worker}");
    let engine = server.wait_healthy(1).await.remove(0);
    assert_eq!(engine["worker"], "listen");
    assert_eq!(engine["env"]["TESSERA_GPU_MEMORY_GB"], "2.2");
    let reported = report(&engine).await;
    assert_eq!(reported["gpu_memory_gb"], "2.2");
    assert_eq!(reported["cuda_visible_devices"], "0");
    let instance = reported["env"]["TESSERA_INSTANCE"]
        .as_str()
        .unwrap()
        .to_owned();

    let (status, _) = server
        .send("POST", "/api/engines/listen/restart", json!({}))
        .await;
    assert_eq!(status, 202);
    wait_until("listen runs again", || async {
        let now = server.engine_if_any("listen").await;
        now.is_some_and(|now| now["state"] == "healthy" && now["pid"] != engine["pid"])
    })
    .await;

    let (status, _) = server
        .send("DELETE", "/api/workers/listen", json!({}))
        .await;
    assert_eq!(status, 204);
    wait_until("no engine is left", || async {
        server.engines().await.is_empty()
    })
    .await;
    assert_eq!(processes_of(&instance), Vec::<u32>::new());

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_moves_into_a_new_group_and_restarts_there() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &server,
        json!({"model": "semantic-router", "gpus": ["atlas:0"], "share": 10, "revision": 1}),
    )
    .await;
    let before = server.wait_healthy(2).await;

    let change = deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 25}),
    )
    .await;
    assert_eq!(change["group"], "vision");
    wait_until("the router runs in vision", || async {
        let engines = server.engines().await;
        engines.len() == 3
            && engines.iter().all(|e| e["state"] == "healthy")
            && engines
                .iter()
                .any(|e| e["model"] == "semantic-router" && e["group"] == "vision")
    })
    .await;
    let after = server.engines().await;
    let router = after
        .iter()
        .find(|e| e["model"] == "semantic-router")
        .unwrap();
    assert_eq!(router["gpus"], json!([1]));
    assert_ne!(
        router["pid"],
        before
            .iter()
            .find(|e| e["model"] == "semantic-router")
            .unwrap()["pid"]
    );
    assert_eq!(report(router).await["gpu_memory_gb"], "9.6");
    assert_eq!(
        pid(&before, "glm-5.3"),
        pid(&after, "glm-5.3"),
        "glm-5.3 kept running"
    );

    server.stop().await;
}

/// vision on atlas:1, whose demo engine "loads" for ten minutes: it never becomes healthy in a test.
async fn never_healthy(server: &Server) -> (Value, u64) {
    never_healthy_as(server, "vision").await
}

/// [`never_healthy`], as `model`.
async fn never_healthy_as(server: &Server, model: &str) -> (Value, u64) {
    let change = deploy(
        server,
        json!({"model": model, "gpus": ["atlas:1"], "share": 25, "env": {"TESSERA_DEMO_START_MS": "600000"}}),
    )
    .await;
    wait_until(&format!("{model} is loading"), || async {
        let engine = server.engine_if_any(model).await;
        engine.is_some_and(|e| e["state"] == "starting" && e["pid"].is_u64())
    })
    .await;
    let pid = server.engine(model).await["pid"].as_u64().unwrap();
    (change, pid)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_on_another_gpu_does_not_wait_for_an_engine_that_never_becomes_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    never_healthy(&server).await;

    deploy(
        &server,
        json!({"model": "speech", "gpus": ["majin:0"], "share": 10}),
    )
    .await;
    wait_until("speech runs while vision still loads", || async {
        let engine = server.engine_if_any("speech").await;
        engine.is_some_and(|e| e["state"] == "healthy")
    })
    .await;
    assert_eq!(server.engine("vision").await["state"], "starting");

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_an_engine_that_never_becomes_healthy_stops_it_without_waiting_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let (change, pid) = never_healthy(&server).await;

    let (status, removed) = server
        .send(
            "DELETE",
            &format!("/api/deployments/vision?revision={}", change["revision"]),
            json!({}),
        )
        .await;
    assert_eq!(status, 200, "{removed}");
    wait_until("vision is stopped", || async {
        server.engines().await.is_empty()
    })
    .await;
    assert!(!alive(pid as u32), "the engine's process is gone");

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_worker_s_engine_stops_at_once_while_a_vllm_neighbour_on_its_gpu_still_loads() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let (status, worker) = server
        .send(
            "POST",
            "/api/workers",
            json!({
                "name": "leaving",
                "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 2, "ids": ["atlas:1"]}}
            }),
        )
        .await;
    assert_eq!(status, 201, "{worker}");
    let leaving = server.wait_healthy(1).await[0]["pid"].as_u64().unwrap() as u32;
    // Its neighbour loads for ten minutes, within its start timeout (15 minutes). (An SGLang neighbour,
    // which takes what is freed as it loads, would hold the stop until it has loaded: soak.rs.)
    never_healthy_as(&server, "glm-5.3").await;

    let (status, _) = server
        .send("DELETE", "/api/workers/leaving", json!({}))
        .await;
    assert_eq!(status, 204);
    wait_until("the removed worker's engine is stopped", || async {
        server.engine_if_any("leaving").await.is_none()
    })
    .await;
    assert!(!alive(leaving), "its process is gone");
    assert_eq!(server.engine("glm-5.3").await["state"], "starting");

    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_does_not_wait_for_an_engine_that_never_becomes_healthy() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let (_, pid) = never_healthy(&server).await;

    // Within the test's patience, not the engine's ten minutes (nor its 15-minute start timeout).
    server.stop().await;
    assert!(!alive(pid as u32), "the engine stopped with the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loading_engine_says_how_far_it_has_got_as_its_own_log_prints_it_in_its_events_and_on_its_machine_page(
) {
    let dir = tempfile::tempdir().unwrap();
    // A two-second load in four checkpoint shards, printed as vLLM prints them.
    let profile = json!({"load_s": [2, 2], "shards": 4}).to_string();
    let server = Server::start_with_env(
        dir.path(),
        0,
        &["--demo"],
        &[("TESSERA_DEMO_PROFILE", &profile)],
    )
    .await;
    let events = server.follow_events().await;
    deploy(
        &server,
        json!({"model": "speech", "gpus": ["majin:0"], "share": 10}),
    )
    .await;
    // Its machine's page, while it loads: its row says how far it has got.
    let mut page = String::new();
    for _ in 0..40 {
        let (_, html) = server.get_bytes("/machines/majin").await;
        page = String::from_utf8_lossy(&html).into_owned();
        if page.contains("checkpoint shards (") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(
        page.contains("data-testid=\"worker-message\"") && page.contains("loading its weights: "),
        "{page}"
    );
    server.wait_healthy(1).await;
    let said: Vec<String> = events
        .all()
        .iter()
        .filter(|e| e["kind"] == "engine" && e["state"] == "starting")
        .filter_map(|e| e["message"].as_str().map(str::to_owned))
        .collect();
    assert!(
        said.iter().any(|m| m.starts_with("loading its weights: ")
            && m.ends_with(" of 4 checkpoint shards (50%)")
            || m == "loading its weights: 3 of 4 checkpoint shards (75%)"),
        "{said:?}"
    );
    server.stop().await;
}
