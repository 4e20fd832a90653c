//! On-demand models through the real binary's gateway, in front of the demo fleet's real demo-engine
//! processes: loaded by a request, unloaded after their keep-alive, swapped in LRU order.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{wait_until_within, Server};

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

/// The member `model` of text-router, as the API shows it.
async fn member(server: &Server, model: &str) -> Value {
    let (_, group) = server.get("/api/groups/text-router").await;
    group["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == model)
        .cloned()
        .unwrap_or_else(|| panic!("{model} in {group}"))
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
