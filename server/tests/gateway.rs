//! The OpenAI-compatible gateway of the real binary, in front of the demo fleet's real demo-engine
//! processes.

mod support;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
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
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", server.port))
        .await
        .unwrap();
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(connection);
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
    let dir = tempfile::tempdir().unwrap();
    let server = Arc::new(Server::start(dir.path(), 100).await);
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
