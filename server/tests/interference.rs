//! Seed 002's interference alarm through the real binary: a model's p99 through the gateway beside a busy
//! neighbour, against its p99 alone, with demo engines that can be told to slow down.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use support::{request_bytes, wait_until_within, Server};

async fn chat(server: &Server, model: &str, stream: bool) -> u16 {
    let (status, _) = server
        .send(
            "POST",
            "/v1/chat/completions",
            json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hello there, how are you"}]}),
        )
        .await;
    status
}

/// Tells `model`'s demo engine to take `ms` more before each answer.
async fn slow(server: &Server, model: &str, ms: u64) {
    let port = server.engine(model).await["port"].as_u64().unwrap() as u16;
    let (status, _) = request_bytes(port, None, "POST", "/slow", Some(json!({ "ms": ms }))).await;
    assert_eq!(status, 204);
}

/// The audit log's entries of `action` about `model`, newest first.
async fn said(server: &Server, action: &str, model: &str) -> Vec<Value> {
    let (_, audit) = server.get("/api/audit?target=glm-5.3&limit=50").await;
    audit
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == action && e["target"] == model)
        .cloned()
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interference_alarm_rises_when_a_neighbours_load_doubles_a_models_p99_and_clears_when_it_stops(
) {
    let dir = tempfile::tempdir().unwrap();
    let server =
        Arc::new(Server::start_with(dir.path(), 100, &["--demo", "--latency-window-s", "3"]).await);
    for (revision, model, share) in [(None, "glm-5.3", 40), (Some(1), "vision", 25)] {
        let (status, answer) = server
            .send(
                "POST",
                "/api/deployments",
                json!({"model": model, "gpus": ["atlas:0"], "share": share, "revision": revision}),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
    }
    server.wait_healthy(2).await;

    // Alone: glm-5.3's dedicated baseline.
    for _ in 0..100 {
        assert_eq!(chat(&server, "glm-5.3", false).await, 200);
    }
    // vision gets busy (three clients of streamed answers keep a request in flight at all times), and
    // glm-5.3 slows down beside it.
    let busy = Arc::new(AtomicBool::new(true));
    let load: Vec<_> = (0..3)
        .map(|_| {
            let (server, busy) = (server.clone(), busy.clone());
            tokio::spawn(async move {
                while busy.load(Ordering::SeqCst) {
                    assert_eq!(chat(&server, "vision", true).await, 200);
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    slow(&server, "glm-5.3", 60).await;
    for _ in 0..30 {
        assert_eq!(chat(&server, "glm-5.3", false).await, 200);
    }
    wait_until_within("the alarm rises", Duration::from_secs(10), || async {
        !said(&server, "model.interference", "glm-5.3")
            .await
            .is_empty()
    })
    .await;
    let raised = &said(&server, "model.interference", "glm-5.3").await[0];
    assert_eq!(raised["actor"], "tessera");
    assert_eq!(
        raised["after"]["busy_neighbours"],
        json!(["vision"]),
        "{raised}"
    );
    assert_eq!(raised["after"]["threshold"], "1.50×");
    let shared = raised["after"]["shared_p99_ms"].as_f64().unwrap();
    let alone = raised["after"]["alone_p99_ms"].as_f64().unwrap();
    assert!(shared >= 60.0 && shared > 1.5 * alone, "{raised}");
    let (_, metrics) = server.get_bytes("/metrics").await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    assert!(
        metrics.contains(r#"tessera_model_slowed_by_neighbours{model="glm-5.3"} 1"#),
        "{metrics}"
    );

    // The neighbour stops and glm-5.3 is itself again: once its slow requests leave the window, it clears.
    busy.store(false, Ordering::SeqCst);
    for client in load {
        client.await.unwrap();
    }
    slow(&server, "glm-5.3", 0).await;
    wait_until_within("the alarm clears", Duration::from_secs(15), || async {
        assert_eq!(chat(&server, "glm-5.3", false).await, 200);
        !said(&server, "model.interference.clear", "glm-5.3")
            .await
            .is_empty()
    })
    .await;
    let (_, metrics) = server.get_bytes("/metrics").await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    assert!(
        metrics.contains(r#"tessera_model_slowed_by_neighbours{model="glm-5.3"} 0"#),
        "{metrics}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}
