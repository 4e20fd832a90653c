//! The OpenAI-compatible gateway of the real binary, in front of the demo fleet's real demo-engine
//! processes.

mod support;

#[path = "gateway/answers.rs"]
mod answers;

#[path = "gateway/scaling.rs"]
mod scaling;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::Server;

/// A gateway answer: status, headers, and the body's frames with when each came.
struct Answer {
    status: u16,
    headers: hyper::HeaderMap,
    frames: Vec<(Duration, Bytes)>,
}

impl Answer {
    fn json(&self) -> Value {
        let all: Vec<u8> = self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect();
        serde_json::from_slice(&all).unwrap_or(Value::Null)
    }

    fn text(&self) -> String {
        let all: Vec<u8> = self.frames.iter().flat_map(|(_, b)| b.to_vec()).collect();
        String::from_utf8(all).unwrap()
    }
}

/// Sends `body` to the gateway's `path`, with `token` as the key.
async fn call(server: &Server, token: Option<&str>, path: &str, body: Bytes) -> Answer {
    let mut sender = support::connect(server.port)
        .await
        .expect("the server listens");
    let mut request = hyper::Request::post(path)
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let sent = Instant::now();
    let response = sender
        .send_request(request.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    let (parts, mut body) = response.into_parts();
    let mut frames = Vec::new();
    // An answer cut off ends here: what came is what the caller got.
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            frames.push((sent.elapsed(), data));
        }
    }
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        frames,
    }
}

async fn ask(server: &Server, path: &str, body: Value) -> Answer {
    call(
        server,
        Some(&server.token),
        path,
        Bytes::from(body.to_string()),
    )
    .await
}

async fn deploy(server: &Server, body: Value) -> Value {
    let (status, answer) = server.send("POST", "/api/deployments", body).await;
    assert_eq!(status, 201, "{answer}");
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_goes_to_an_engine_of_the_model_it_names_and_its_answer_comes_back_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &server,
        json!({"model": "embedder", "gpus": ["atlas:0"], "share": 5, "revision": 1}),
    )
    .await;
    server.wait_healthy(2).await;

    let (status, models) = server.get("/v1/models").await;
    assert_eq!(status, 200, "{models}");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["embedder", "glm-5.3"]);

    let chat = ask(
        &server,
        "/v1/chat/completions",
        json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "hello there"}]}),
    )
    .await;
    assert_eq!(chat.status, 200, "{}", chat.text());
    assert_eq!(
        chat.headers["x-tessera-engine"],
        "group:text-router/glm-5.3@atlas"
    );
    let answer = chat.json();
    assert!(
        answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .ends_with("heard: hello there "),
        "{answer}"
    );
    assert_eq!(answer["usage"]["prompt_tokens"], 2);

    let embedded = ask(
        &server,
        "/v1/embeddings",
        json!({"model": "embedder", "input": ["a", "b"]}),
    )
    .await;
    assert_eq!(embedded.status, 200, "{}", embedded.text());
    assert!(embedded.headers["x-tessera-engine"]
        .to_str()
        .unwrap()
        .ends_with("/embedder@atlas"));
    assert_eq!(embedded.json()["data"].as_array().unwrap().len(), 2);
    server.stop().await;
}

/// The value of the `/metrics` series whose line starts `series{` and holds `label`, if there is one.
fn series(metrics: &str, name: &str, label: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && l.contains(label))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_requests_waiting_for_an_engine_and_those_in_flight_to_each_engine_are_in_the_metrics(
) {
    let dir = tempfile::tempdir().unwrap();
    // Engines that take five seconds to load: a request sent at once waits, even on a machine so busy
    // that the request and the polls of the metrics lag by seconds; its answer streams for seconds too.
    let server = Arc::new(Server::start(dir.path(), 5_000).await);
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40,
               "env": {"TESSERA_DEMO_TOKEN_MS": "400"}}),
    )
    .await;
    let asking = {
        let server = server.clone();
        tokio::spawn(async move {
            let body = json!({"model": "glm-5.3", "stream": true, "messages": [{"role": "user", "content": "hello"}]});
            ask(&server, "/v1/chat/completions", body).await
        })
    };
    let metrics =
        || async { String::from_utf8(server.get_bytes("/metrics").await.1.to_vec()).unwrap() };
    support::wait_until("the request waits for glm-5.3", || async {
        series(
            &metrics().await,
            "tessera_model_requests_waiting",
            r#"model="glm-5.3""#,
        ) == Some(1.0)
    })
    .await;
    support::wait_until("the request is in flight to glm-5.3's engine", || async {
        let now = metrics().await;
        series(&now, "tessera_engine_requests_in_flight", "glm-5.3") == Some(1.0)
            && series(&now, "tessera_model_requests_waiting", "glm-5.3").is_none()
    })
    .await;
    let answer = asking.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(
        series(
            &metrics().await,
            "tessera_engine_requests_in_flight",
            "glm-5.3"
        ),
        Some(0.0)
    );
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_answer_passes_through_chunk_by_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40, "env": {"TESSERA_DEMO_TOKEN_MS": "150"}}),
    )
    .await;
    server.wait_healthy(1).await;
    let streamed = ask(
        &server,
        "/v1/chat/completions",
        json!({"model": "glm-5.3", "stream": true, "messages": [{"role": "user", "content": "one two three"}]}),
    )
    .await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert_eq!(
        streamed.headers[hyper::header::CONTENT_TYPE],
        "text/event-stream"
    );
    let text = streamed.text();
    let events = text.matches("data: ").count();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    // Eight words at 150 ms each: had the gateway buffered the answer, it would come in one piece at the end.
    assert!(
        streamed.frames.len() >= events - 1,
        "{} frames for {events} events",
        streamed.frames.len()
    );
    let (first, _) = streamed.frames[0];
    let (last, _) = *streamed.frames.last().unwrap();
    assert!(
        last - first >= Duration::from_millis(800),
        "the first chunk came {first:?} after the request, the last {last:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateways_own_answers_are_in_openais_error_shape() {
    let dir = tempfile::tempdir().unwrap();
    // A request for a model not ready waits a second for it here (30 s by default).
    let server = Server::start_with(dir.path(), 100, &["--demo", "--gateway-wait-s", "1"]).await;
    // vision "loads" for ten minutes: deployed, never ready in this test.
    deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 25, "env": {"TESSERA_DEMO_START_MS": "600000"}}),
    )
    .await;
    let chat =
        |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let code = |answer: &Answer| {
        answer.json()["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };

    let no_key = call(
        &server,
        None,
        "/v1/chat/completions",
        Bytes::from(chat("vision").to_string()),
    )
    .await;
    assert_eq!(
        (no_key.status, code(&no_key)),
        (401, "invalid_api_key".to_owned())
    );
    let bad_key = call(
        &server,
        Some("tsr_nope"),
        "/v1/chat/completions",
        Bytes::from(chat("vision").to_string()),
    )
    .await;
    assert_eq!(
        (bad_key.status, code(&bad_key)),
        (401, "invalid_api_key".to_owned())
    );

    let unknown = ask(&server, "/v1/chat/completions", chat("no-such-model")).await;
    assert_eq!(
        (unknown.status, code(&unknown)),
        (404, "model_not_found".to_owned())
    );
    assert!(unknown.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("GET /v1/models"));

    let loading = ask(&server, "/v1/chat/completions", chat("vision")).await;
    assert_eq!(
        (loading.status, code(&loading)),
        (503, "model_not_ready".to_owned())
    );
    assert_eq!(loading.headers[hyper::header::RETRY_AFTER], "5");

    let unnamed = ask(&server, "/v1/chat/completions", json!({"messages": []})).await;
    assert_eq!(
        (unnamed.status, code(&unnamed)),
        (400, "model_required".to_owned())
    );

    let huge = Bytes::from(vec![b' '; 33 << 20]);
    let too_large = call(&server, Some(&server.token), "/v1/chat/completions", huge).await;
    assert_eq!(
        (too_large.status, code(&too_large)),
        (413, "request_too_large".to_owned())
    );
    for answer in [&no_key, &unknown, &loading, &too_large] {
        assert!(
            answer.json()["error"]["type"].is_string(),
            "{}",
            answer.text()
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_change_under_a_steady_stream_of_requests_loses_none() {
    share_change_under_requests(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_change_under_a_steady_stream_of_requests_loses_none_with_engines_that_take_seconds_to_load_and_to_exit(
) {
    // Time-compressed 20 times: loads of 1 to 3 s, memory held 0.5 s after SIGTERM.
    let profile = json!({"speed": 20, "load_s": [20, 60], "exit_delay_s": 10});
    share_change_under_requests(Some(profile)).await;
}

/// Three clients ask glm-5.3 all along while a plan change restarts it and its neighbour; every answer
/// comes whole. The demo engines behave as `profile` says, where given.
async fn share_change_under_requests(profile: Option<Value>) {
    let dir = tempfile::tempdir().unwrap();
    let profile = profile.map(|p| p.to_string());
    let env: Vec<(&str, &str)> = profile
        .iter()
        .map(|p| ("TESSERA_DEMO_PROFILE", p.as_str()))
        .collect();
    let server = Arc::new(Server::start_with_env(dir.path(), 100, &["--demo"], &env).await);
    let slow = json!({"TESSERA_DEMO_TOKEN_MS": "60"});
    let first = deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40, "env": slow}),
    )
    .await;
    let second = deploy(
        &server,
        json!({"model": "embedder", "gpus": ["atlas:0"], "share": 5, "revision": first["revision"]}),
    )
    .await;
    server.wait_healthy(2).await;
    let events = server.follow_events().await;

    // Three clients, each asking glm-5.3 again as soon as its streamed answer (about half a second) ends.
    let done = Arc::new(AtomicBool::new(false));
    let answers = Arc::new(Mutex::new(Vec::new()));
    let clients: Vec<_> = (0..3)
        .map(|_| {
            let (server, done, answers) = (server.clone(), done.clone(), answers.clone());
            tokio::spawn(async move {
                while !done.load(Ordering::Relaxed) {
                    let answer = ask(
                        &server,
                        "/v1/chat/completions",
                        json!({"model": "glm-5.3", "stream": true, "messages": [{"role": "user", "content": "go"}]}),
                    )
                    .await;
                    let whole = answer.text().ends_with("data: [DONE]\n\n");
                    answers.lock().unwrap().push((answer.status, whole, answer.text()));
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(700)).await;

    // glm-5.3 shrinks, the embedder grows: both restart, glm-5.3 first.
    let (status, change) = server
        .send(
            "PUT",
            "/api/groups/text-router/plan",
            json!({"revision": second["revision"], "shares": {"glm-5.3": 30, "embedder": 15}}),
        )
        .await;
    assert_eq!(status, 200, "{change}");
    support::wait_until("the plan change is carried out", || async {
        let (_, group) = server.get("/api/groups/text-router").await;
        group["progress"]["revision"] == change["revision"]
            && group["progress"]["steps"]
                .as_array()
                .is_some_and(|steps| steps.iter().all(|s| s["status"] == "done"))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(700)).await;
    done.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.unwrap();
    }

    let answers = std::mem::take(&mut *answers.lock().unwrap());
    assert!(answers.len() >= 6, "{} requests", answers.len());
    for (status, whole, text) in answers.iter() {
        assert_eq!((*status, *whole), (200, true), "a request was lost: {text}");
    }
    let drained = events
        .all()
        .iter()
        .any(|e| e["engine"] == "group:text-router/glm-5.3@atlas" && e["state"] == "draining");
    assert!(drained, "glm-5.3 drained before it stopped");
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_naming_a_group_goes_where_its_router_says_and_to_the_default_model_while_the_router_is_down(
) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let glm = deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    let router = deploy(
        &server,
        json!({"model": "semantic-router", "gpus": ["atlas:0"], "share": 10, "revision": glm["revision"]}),
    )
    .await;
    deploy(
        &server,
        json!({"model": "embedder", "gpus": ["atlas:0"], "share": 5, "revision": router["revision"]}),
    )
    .await;
    server.wait_healthy(3).await;
    let ask_group = |content: &str| json!({"model": "text-router", "messages": [{"role": "user", "content": content}]});

    let routed = ask(
        &server,
        "/v1/chat/completions",
        ask_group("a question for the embedder"),
    )
    .await;
    assert_eq!(routed.status, 200, "{}", routed.text());
    assert_eq!(routed.headers["x-tessera-routing"], "semantic");
    assert_eq!(routed.headers["x-tessera-routed-to"], "embedder");
    assert!(routed.headers["x-tessera-engine"]
        .to_str()
        .unwrap()
        .ends_with("/embedder@atlas"));
    assert_eq!(
        routed.json()["model"],
        "embedder",
        "the engine is asked for its own model"
    );

    // The router stops answering its health checks: requests go on, unclassified, to the default model.
    let router = server.engine("semantic-router").await;
    let port = router["port"].as_u64().unwrap() as u16;
    assert_eq!(
        support::request(port, "POST", "/fail-health", None).await.0,
        204
    );
    support::wait_until("the router is unhealthy", || async {
        server
            .engine_if_any("semantic-router")
            .await
            .is_some_and(|e| e["state"] != "healthy")
    })
    .await;
    let fallback = ask(
        &server,
        "/v1/chat/completions",
        ask_group("a question for the embedder"),
    )
    .await;
    assert_eq!(fallback.status, 200, "{}", fallback.text());
    assert_eq!(fallback.headers["x-tessera-routing"], "fallback");
    assert_eq!(
        fallback.headers["x-tessera-routed-to"], "glm-5.3",
        "the largest share"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_limited_to_one_model_may_call_only_that_one_and_nothing_but_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let glm = deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &server,
        json!({"model": "embedder", "gpus": ["atlas:0"], "share": 5, "revision": glm["revision"]}),
    )
    .await;
    server.wait_healthy(2).await;
    let (status, issued) = server
        .send(
            "POST",
            "/api/tokens",
            json!({"name": "chat", "scope": "inference", "models": ["glm-5.3"]}),
        )
        .await;
    assert_eq!(status, 201, "{issued}");
    let key = issued["secret"].as_str().unwrap();
    let chat = |model: &str| {
        Bytes::from(
            json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
        )
    };

    let allowed = call(&server, Some(key), "/v1/chat/completions", chat("glm-5.3")).await;
    assert_eq!(allowed.status, 200, "{}", allowed.text());
    let refused = call(&server, Some(key), "/v1/chat/completions", chat("embedder")).await;
    assert_eq!(refused.status, 403, "{}", refused.text());
    assert_eq!(refused.json()["error"]["code"], "model_not_allowed");
    assert_eq!(
        refused.json()["error"]["message"],
        "this API token may call only glm-5.3, not embedder"
    );

    let (status, body) =
        support::request_bytes(server.port, Some(key), "GET", "/v1/models", None).await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(models["data"].as_array().unwrap().len(), 1, "{models}");
    assert_eq!(models["data"][0]["id"], "glm-5.3");

    let (status, body) =
        support::request_bytes(server.port, Some(key), "GET", "/api/workers", None).await;
    assert_eq!(status, 403, "an inference key is not an API key");
    let refusal: Value = serde_json::from_slice(&body).unwrap();
    assert!(refusal["error"]
        .as_str()
        .unwrap()
        .contains("inference only"));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_their_tokens_are_counted_per_model_and_key_in_the_usage_report_its_csv_and_metrics(
) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    server.wait_healthy(1).await;
    let mut prompt_tokens = 0;
    let mut completion_tokens = 0;
    for _ in 0..2 {
        let answer = ask(
            &server,
            "/v1/chat/completions",
            json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "one two three"}]}),
        )
        .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        prompt_tokens += answer.json()["usage"]["prompt_tokens"].as_u64().unwrap();
        completion_tokens += answer.json()["usage"]["completion_tokens"]
            .as_u64()
            .unwrap();
    }
    let streamed = ask(
        &server,
        "/v1/chat/completions",
        json!({"model": "glm-5.3", "stream": true, "stream_options": {"include_usage": true},
               "messages": [{"role": "user", "content": "four five"}]}),
    )
    .await;
    let text = streamed.text();
    let last: Value = text
        .split("data: ")
        .filter_map(|event| serde_json::from_str::<Value>(event.trim()).ok())
        .last()
        .unwrap();
    prompt_tokens += last["usage"]["prompt_tokens"].as_u64().unwrap();
    completion_tokens += last["usage"]["completion_tokens"].as_u64().unwrap();

    let (status, report) = server.get("/api/usage").await;
    assert_eq!(status, 200, "{report}");
    let rows = report["requests"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{report}");
    assert_eq!(rows[0]["model"], "glm-5.3");
    assert!(rows[0]["key"]
        .as_str()
        .unwrap()
        .starts_with("tester/tests (tsr_"));
    assert_eq!(rows[0]["requests"], 3);
    assert_eq!(rows[0]["failed"], 0);
    assert_eq!(rows[0]["prompt_tokens"], prompt_tokens);
    assert_eq!(rows[0]["completion_tokens"], completion_tokens);

    let (status, csv) = server.get_bytes("/api/usage/requests.csv").await;
    assert_eq!(status, 200);
    let csv = String::from_utf8(csv.to_vec()).unwrap();
    let line = csv.lines().nth(1).unwrap();
    assert!(
        line.starts_with("glm-5.3,tester/tests (tsr_")
            && line.ends_with(&format!(",3,0,{prompt_tokens},{completion_tokens}")),
        "{csv}"
    );

    let (_, metrics) = server.get_bytes("/metrics").await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    let prefix = &server.token[..10];
    for line in [
        format!("tessera_gateway_requests_total{{key=\"{prefix}\",model=\"glm-5.3\"}} 3"),
        format!("tessera_gateway_prompt_tokens_total{{key=\"{prefix}\",model=\"glm-5.3\"}} {prompt_tokens}"),
        format!("tessera_gateway_completion_tokens_total{{key=\"{prefix}\",model=\"glm-5.3\"}} {completion_tokens}"),
    ] {
        assert!(metrics.contains(&line), "{line} not in {metrics}");
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_consoles_playground_answers_as_the_chat_route_and_is_counted_under_the_account() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    server.wait_healthy(1).await;
    let (status, answer) = server
        .send(
            "POST",
            "/api/playground",
            json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "hello there"}]}),
        )
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["object"], "chat.completion", "{answer}");
    let (status, missing) = server
        .send(
            "POST",
            "/api/playground",
            json!({"model": "nope", "messages": []}),
        )
        .await;
    assert_eq!(status, 404);
    assert_eq!(missing["error"]["code"], "model_not_found");

    let (_, report) = server.get("/api/usage").await;
    assert_eq!(report["requests"][0]["key"], "tester (console)", "{report}");
    assert_eq!(report["requests"][0]["requests"], 1, "{report}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_alone_answers_on_an_address_of_its_own_and_the_console_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let own = std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap();
    let server = Server::start_with(
        dir.path(),
        100,
        &["--demo", "--gateway-listen", &own.to_string()],
    )
    .await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    server.wait_healthy(1).await;
    let token = Some(server.token.as_str());

    let (status, body) = support::request_bytes(
        own.port(),
        token,
        "POST",
        "/v1/chat/completions",
        Some(json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "hi"}]})),
    )
    .await;
    assert_eq!(status, 200, "{body:?}");
    let answer: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(answer["object"], "chat.completion");
    for path in ["/api/health", "/api/workers", "/"] {
        let (status, _) = support::request_bytes(own.port(), token, "GET", path, None).await;
        assert_eq!(status, 404, "{path} on the gateway's own address");
    }
    server.stop().await;
}
