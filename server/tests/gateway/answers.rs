//! Which engine of a model answers, and what of its answer reaches the client: balanced per model by
//! requests in flight, by the prompt's start where it has one, ended with an error event when the engine
//! dies in the middle, and without the engine's cookies or the headers its `Connection` header names.

use super::{ask, deploy, Answer};
use crate::support::{self, Server};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// The machine of the engine that answered (`…@atlas`).
pub(super) fn machine(answer: &Answer) -> String {
    let engine = answer.headers["x-tessera-engine"].to_str().unwrap();
    engine.rsplit('@').next().unwrap().to_owned()
}

pub(super) fn chat(model: &str, stream: bool) -> Value {
    json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "one two three"}]})
}

/// A request with no prompt: which engine takes it is the model's rotation's and the engines' load's.
fn embed(model: &str) -> Value {
    json!({"model": model, "input": "one two three"})
}

/// A machine like atlas (a 96 GB GPU) that is this one: a model on atlas:0 and twin:0 has an engine on
/// each, the demo engine on both.
const TWIN: &str = r#"
[[machine]]
name = "twin"
cpu_cores = 64
memory_gb = 512
[[machine.gpu]]
index = 0
model = "NVIDIA RTX PRO 6000 Blackwell"
memory_gb = 96
"#;

/// The server over the demo fleet and twin, with `models` (the demo engine as their command, each answer
/// taking about a second) each on atlas:0 and twin:0: an engine of each on both, all healthy.
async fn on_atlas_and_twin(dir: &std::path::Path, models: &[&str]) -> Arc<Server> {
    on_atlas_and_twin_with(dir, models, json!({}), 2, &[]).await
}

/// [`on_atlas_and_twin`], each deploy with the fields of `extra` too, once `engines_each` engines of each
/// model are healthy; the server started with `env` too.
pub(super) async fn on_atlas_and_twin_with(
    dir: &std::path::Path,
    models: &[&str],
    extra: Value,
    engines_each: usize,
    env: &[(&str, &str)],
) -> Arc<Server> {
    let inventory = dir.join("twin.toml");
    std::fs::write(&inventory, TWIN).unwrap();
    let sources = [
        "--demo",
        "--inventory",
        inventory.to_str().unwrap(),
        "--here",
        "twin",
    ];
    let server = Arc::new(Server::start_with_env(dir, 100, &sources, env).await);
    let demo_engine = format!("{} demo-engine", env!("CARGO_BIN_EXE_tessera"));
    let mut revision = Value::Null;
    for model in models {
        let (status, added) = server
            .send(
                "POST",
                "/api/models",
                json!({"name": model, "engine": "command", "default_share_percent": 10,
                       "model_path": model, "command": demo_engine}),
            )
            .await;
        assert_eq!(status, 201, "{added}");
        let mut body = json!({"model": model, "gpus": ["atlas:0", "twin:0"], "share": 10, "revision": revision,
                   "env": {"TESSERA_DEMO_TOKEN_MS": "150"}});
        for (field, value) in extra.as_object().into_iter().flatten() {
            body[field] = value.clone();
        }
        let deployed = deploy(&server, body).await;
        revision = deployed["revision"].clone();
    }
    server.wait_healthy(engines_each * models.len()).await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alternating_traffic_to_two_models_is_balanced_per_model_by_requests_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let server = on_atlas_and_twin(dir.path(), &["chat", "other"]).await;

    // One model, then the other, each request over before the next: each model's engines take turns.
    let mut answered: BTreeMap<(&str, String), usize> = BTreeMap::new();
    for _ in 0..4 {
        for model in ["chat", "other"] {
            let answer = ask(&server, "/v1/embeddings", embed(model)).await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            *answered.entry((model, machine(&answer))).or_default() += 1;
        }
    }
    let expected: BTreeMap<(&str, String), usize> = [
        (("chat", "atlas".to_owned()), 2),
        (("chat", "twin".to_owned()), 2),
        (("other", "atlas".to_owned()), 2),
        (("other", "twin".to_owned()), 2),
    ]
    .into();
    assert_eq!(answered, expected);

    // While one engine of chat streams a long answer, the next requests go to the other, though they
    // begin as it does: an idle engine is not passed over for a busy one's prompt cache.
    let streaming = {
        let server = server.clone();
        tokio::spawn(async move { ask(&server, "/v1/chat/completions", chat("chat", true)).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut meanwhile = Vec::new();
    for _ in 0..3 {
        let answer = ask(&server, "/v1/chat/completions", chat("chat", false)).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        meanwhile.push(machine(&answer));
    }
    let streamed = streaming.await.unwrap();
    assert!(
        streamed.text().ends_with("data: [DONE]\n\n"),
        "{}",
        streamed.text()
    );
    let busy = machine(&streamed);
    assert!(
        meanwhile.iter().all(|m| *m != busy),
        "{busy} was streaming, yet answered some of {meanwhile:?}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

/// The engine that answered `answer`, which must be a success.
fn answered_by(answer: &Answer) -> String {
    assert_eq!(answer.status, 200, "{}", answer.text());
    machine(answer)
}

fn with_system(system: &str, user: &str) -> Value {
    json!({"model": "chat", "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
    ]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_whose_prompts_begin_alike_go_to_one_engine_of_a_model_until_it_is_busier_than_the_least_busy(
) {
    let dir = tempfile::tempdir().unwrap();
    // Each answer takes about a second: requests sent together are in flight together.
    let server = on_atlas_and_twin(dir.path(), &["chat"]).await;

    // One long system prompt, many users, one at a time: one engine, whose prompt cache holds it.
    let manual = "You answer questions about the operations manual of the fleet. ".repeat(8);
    let mut engines = std::collections::BTreeSet::new();
    for user in [
        "drain a node",
        "what is MIG",
        "repack",
        "on demand",
        "keys",
        "usage",
    ] {
        let answer = ask(&server, "/v1/chat/completions", with_system(&manual, user)).await;
        engines.insert(answered_by(&answer));
    }
    assert_eq!(engines.len(), 1, "{engines:?}");

    // Prompts that begin differently spread over both engines.
    let mut engines = std::collections::BTreeSet::new();
    for n in 0..12 {
        let system = format!("You are assistant number {n}, and you answer briefly.");
        let answer = ask(&server, "/v1/chat/completions", with_system(&system, "hi")).await;
        engines.insert(answered_by(&answer));
    }
    assert_eq!(engines.len(), 2, "{engines:?}");

    // Eight at once with the same start: none waits on a busy engine while the other is idle.
    let together: Vec<_> = (0..8)
        .map(|n| {
            let (server, manual) = (server.clone(), manual.clone());
            tokio::spawn(async move {
                let body = with_system(&manual, &format!("question {n}"));
                answered_by(&ask(&server, "/v1/chat/completions", body).await)
            })
        })
        .collect();
    let mut counts = BTreeMap::<String, usize>::new();
    for answer in together {
        *counts.entry(answer.await.unwrap()).or_default() += 1;
    }
    assert_eq!(counts.len(), 2, "{counts:?}");
    assert!(counts.values().all(|&n| n <= 5), "{counts:?}");
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_least_busy_routing_requests_whose_prompts_begin_alike_take_turns_across_a_model_s_engines(
) {
    let dir = tempfile::tempdir().unwrap();
    let routing = [("TESSERA_GATEWAY_ROUTING", "least-busy")];
    let server = on_atlas_and_twin_with(dir.path(), &["chat"], json!({}), 2, &routing).await;
    let manual = "You answer questions about the operations manual of the fleet. ".repeat(8);
    let mut engines = std::collections::BTreeSet::new();
    for user in ["drain a node", "what is MIG", "repack", "on demand"] {
        let answer = ask(&server, "/v1/chat/completions", with_system(&manual, user)).await;
        engines.insert(answered_by(&answer));
    }
    assert_eq!(engines.len(), 2, "{engines:?}");
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_dies_mid_stream_is_counted_as_failed_and_the_stream_ends_with_an_error_event(
) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40,
               "env": {"TESSERA_DEMO_DIE_AFTER_CHUNKS": "3"}}),
    )
    .await;
    server.wait_healthy(1).await;
    let cut = ask(&server, "/v1/chat/completions", chat("glm-5.3", true)).await;
    assert_eq!(cut.status, 200);
    let text = cut.text();
    let events: Vec<Value> = text
        .split("\n\n")
        .filter_map(|event| serde_json::from_str(event.trim().strip_prefix("data: ")?).ok())
        .collect();
    assert_eq!(events.len(), 4, "three chunks, then the error: {text}");
    assert!(
        events[..3]
            .iter()
            .all(|e| e["object"] == "chat.completion.chunk"),
        "{text}"
    );
    assert_eq!(events[3]["error"]["code"], "engine_cut_short", "{text}");
    assert_eq!(events[3]["error"]["type"], "server_error", "{text}");
    assert!(!text.contains("[DONE]"), "the answer is not whole: {text}");

    let (_, report) = server.get("/api/usage").await;
    assert_eq!(report["requests"][0]["requests"], 1, "{report}");
    assert_eq!(report["requests"][0]["failed"], 1, "{report}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engines_set_cookie_and_the_headers_its_connection_header_names_never_reach_the_client()
{
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let headers = json!({"set-cookie": "id=engine; Path=/", "connection": "x-engine-hop",
                         "x-engine-hop": "1", "x-engine-kept": "1"});
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40,
               "env": {"TESSERA_DEMO_ANSWER_HEADERS": headers.to_string()}}),
    )
    .await;
    let engine = server.wait_healthy(1).await.remove(0);
    let port = engine["port"].as_u64().unwrap() as u16;
    let mut direct = support::connect(port).await.unwrap();
    let told = direct
        .send_request(
            hyper::Request::get("/v1/models")
                .header(hyper::header::HOST, "127.0.0.1")
                .body(http_body_util::Full::new(hyper::body::Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(
        told.headers()["set-cookie"],
        "id=engine; Path=/",
        "the engine sends them"
    );
    assert_eq!(told.headers()["x-engine-hop"], "1");

    let answer = ask(&server, "/v1/chat/completions", chat("glm-5.3", false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    for gone in ["set-cookie", "x-engine-hop"] {
        assert!(
            answer.headers.get(gone).is_none(),
            "{gone}: {:?}",
            answer.headers
        );
    }
    assert_eq!(answer.headers["x-engine-kept"], "1");
    server.stop().await;
}
