use super::metering::usage_in;
use super::model_field::Rename;
use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

#[test]
fn the_model_is_read_from_a_json_body_or_a_form_field() {
    let json_headers = HeaderMap::from_iter([(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    )]);
    let body = Bytes::from_static(br#"{"model": "glm", "messages": []}"#);
    assert_eq!(model_named(&json_headers, &body).as_deref(), Some("glm"));
    assert_eq!(model_named(&json_headers, &Bytes::from_static(b"{}")), None);
    assert_eq!(
        model_named(&json_headers, &Bytes::from_static(b"not json")),
        None
    );

    let form_headers = HeaderMap::from_iter([(
        header::CONTENT_TYPE,
        HeaderValue::from_static("multipart/form-data; boundary=XyZ"),
    )]);
    let form = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF....\r\n\
                --XyZ\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--XyZ--\r\n";
    assert_eq!(
        model_named(&form_headers, &Bytes::from(form)).as_deref(),
        Some("whisper")
    );
}

#[test]
fn the_callers_key_session_csrf_token_and_the_hop_by_hop_headers_never_reach_an_engine() {
    let headers = HeaderMap::from_iter([
        (
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer tsr_secret"),
        ),
        (
            header::COOKIE,
            HeaderValue::from_static("id=session-secret"),
        ),
        (
            header::HeaderName::from_static(app::auth::CSRF_HEADER),
            HeaderValue::from_static("csrf-secret"),
        ),
        (header::CONNECTION, HeaderValue::from_static("keep-alive")),
        (header::HOST, HeaderValue::from_static("tessera:3000")),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
        (
            header::ACCEPT,
            HeaderValue::from_static("text/event-stream"),
        ),
    ]);
    let passed = passed_on(headers);
    let names: Vec<&str> = passed.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["content-type", "accept"]);
}

#[test]
fn the_tokens_are_read_from_the_last_usage_of_an_answer_or_of_its_events() {
    let answer = br#"{"id": "1", "choices": [{"message": {"content": "the \"usage\": {\"prompt_tokens\": 99}"}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 34, "total_tokens": 46}, "timings": {"n": 1}}"#;
    assert_eq!(usage_in(answer), Some((12, 34)));

    let events = b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n\
                   data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":7}}\n\n\
                   data: [DONE]\n\n";
    assert_eq!(usage_in(events), Some((5, 7)));

    let embeddings = br#"{"data": [], "usage": {"prompt_tokens": 8, "total_tokens": 8}}"#;
    assert_eq!(usage_in(embeddings), Some((8, 0)));

    let streamed_without =
        b"data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n";
    assert_eq!(usage_in(streamed_without), None);
    assert_eq!(usage_in(br#"{"usage": null}"#), None);
    assert_eq!(usage_in(br#"{"usage": {"prompt_tok"#), None, "cut short");
}

#[test]
fn the_headers_a_connection_header_names_and_an_engines_cookies_never_cross_the_gateway() {
    let headers = HeaderMap::from_iter([
        (
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, X-Hop-One"),
        ),
        (header::CONNECTION, HeaderValue::from_static("x-hop-two")),
        (
            header::HeaderName::from_static("x-hop-one"),
            HeaderValue::from_static("1"),
        ),
        (
            header::HeaderName::from_static("x-hop-two"),
            HeaderValue::from_static("2"),
        ),
        (
            header::SET_COOKIE,
            HeaderValue::from_static("engine=1; Path=/"),
        ),
        (
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        ),
    ]);
    let passed = passed_on(headers);
    let names: Vec<&str> = passed.keys().map(|k| k.as_str()).collect();
    assert_eq!(names, ["content-type"]);
}

/// `body` through a rename to `name` in frames of `size` bytes, as `content_type`.
fn renamed(content_type: &'static str, name: &str, body: &[u8], size: usize) -> Vec<u8> {
    let headers =
        HeaderMap::from_iter([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))]);
    let mut rename = Rename::of_answer(&headers, name).expect("JSON or events are renamed");
    body.chunks(size)
        .flat_map(|frame| rename.pass(Bytes::copy_from_slice(frame)).to_vec())
        .collect()
}

#[test]
fn the_model_a_json_request_names_is_read_from_its_first_bytes_and_what_follows_is_not_read() {
    let named = |body: &[u8]| model_field::named(body);
    // What follows the model, cut short or not JSON at all, is not read.
    assert_eq!(
        named(br#"{"model": "glm", "messages": [{"role"#).as_deref(),
        Some("glm")
    );
    // Values before it are skipped, a `model` inside them included; escapes are read.
    assert_eq!(
        named(br#" {"a": {"model": "no"}, "b": ["model", "}"], "model" : "q\"w\u00e9"}"#)
            .as_deref(),
        Some("q\"w\u{e9}")
    );
    for none in [
        &br#"{"model": null}"#[..],
        br#"{"modelx": "a", "mode": "b"}"#,
        br#"[{"model": "a"}]"#,
        b"",
        br#"{"model": "unterminated"#,
    ] {
        assert_eq!(named(none), None, "{}", String::from_utf8_lossy(none));
    }
}

fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z\"\\\\{}\\[\\],: é]{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z\"]{0,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { failure_persistence: None, ..Default::default() })]
    #[test]
    fn the_model_read_from_a_request_s_first_bytes_is_the_one_serde_reads_from_the_whole(
        before in proptest::collection::vec(("[a-z\"]{0,6}", json_value()), 0..4),
        model in "[a-zA-Z0-9/\"\\\\é .:-]{0,16}",
        after in proptest::collection::vec(("[a-z\"]{0,6}", json_value()), 0..4),
        spaced in proptest::bool::ANY,
    ) {
        let field = |(k, v): &(String, Value)| (k != "model").then(|| format!("{}:{v}", Value::from(k.as_str())));
        let fields: Vec<String> = before
            .iter()
            .filter_map(field)
            .chain([format!("\"model\":{}", Value::from(model.as_str()))])
            .chain(after.iter().filter_map(field))
            .collect();
        let sep = if spaced { " , " } else { "," };
        let body = format!("{{{}}}", fields.join(sep));
        let whole: Value = serde_json::from_str(&body).unwrap();
        let named = model_field::named(body.as_bytes());
        proptest::prop_assert_eq!(named.as_deref(), whole["model"].as_str());
    }
}

#[test]
fn the_model_of_a_json_answer_and_of_each_event_is_renamed_to_the_name_asked_for_wherever_the_frames_cut(
) {
    // llama.cpp's keys come in alphabetical order: the model after the choices, a key named in a string.
    let answer = br#"{"choices":[{"message":{"content":"the \"model\": \"x\" {[","role":"assistant"}}],"created":1,"id":"c","model":"/srv/weights/tiny.gguf","object":"chat.completion","usage":{"prompt_tokens":1}}"#;
    let expected = String::from_utf8(answer.to_vec())
        .unwrap()
        .replace("/srv/weights/tiny.gguf", "tiny");
    for size in [1, 2, 7, 64, answer.len()] {
        let out = renamed("application/json; charset=utf-8", "tiny", answer, size);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            expected,
            "frames of {size}"
        );
    }
    let escaped = br#" { "model" : "C:\\weights\\\"q\".gguf", "model": "kept" }"#;
    assert_eq!(
        renamed("application/json", "a \"b\"", escaped, 3),
        br#" { "model" : "a \"b\"", "model": "kept" }"#
    );
    let untouched: &[&[u8]] = &[
        br#"{"data":[{"model":"x"}],"modelx":"y","mode":"z","model":null}"#,
        b"[1,2]",
        b"not json",
    ];
    for body in untouched {
        assert_eq!(renamed("application/json", "tiny", body, 5), body.to_vec());
    }

    let events = b"data: {\"id\":\"1\",\"model\":\"/srv/w.gguf\",\"choices\":[]}\n\n\
                   : a comment with \"model\":\"x\"\n\n\
                   data:{\"choices\":[{\"delta\":{\"content\":\"model\"}}],\"model\":\"/srv/w.gguf\"}\r\n\r\n\
                   data: [DONE]\n\n";
    let expected = String::from_utf8(events.to_vec())
        .unwrap()
        .replace("/srv/w.gguf", "tiny");
    for size in [1, 3, 16, events.len()] {
        let out = renamed("text/event-stream", "tiny", events, size);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            expected,
            "frames of {size}"
        );
    }
}

#[test]
fn renaming_reads_only_json_answers_and_events_and_a_json_answer_only_up_to_its_model() {
    let headers = |content_type: &'static str| {
        HeaderMap::from_iter([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))])
    };
    for other in ["audio/wav", "text/plain", "application/octet-stream"] {
        assert!(Rename::of_answer(&headers(other), "m").is_none(), "{other}");
    }
    let mut gzipped = headers("application/json");
    gzipped.insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
    assert!(Rename::of_answer(&gzipped, "m").is_none());

    // Fed a byte at a time, it stops reading at the closing quote of the model's name.
    let answer = br#"{"id":"1","model":"/srv/w.gguf","data":[0.1,0.2]}"#;
    let mut rename = Rename::of_answer(&headers("application/json"), "m").unwrap();
    let read = answer
        .iter()
        .take_while(|&&b| {
            rename.pass(Bytes::copy_from_slice(&[b]));
            rename.reading()
        })
        .count();
    assert_eq!(&answer[..=read], br#"{"id":"1","model":"/srv/w.gguf""#);

    // An embedding of 4 MiB after it: every frame after the first passes as it came, not copied.
    let mut big = br#"{"object":"list","model":"/srv/w.gguf","data":[{"embedding":["#.to_vec();
    while big.len() < 4 << 20 {
        big.extend_from_slice(b"0.123456789,");
    }
    big.extend_from_slice(b"0]}]}");
    let frames: Vec<Bytes> = big.chunks(16 << 10).map(Bytes::copy_from_slice).collect();
    let mut rename = Rename::of_answer(&headers("application/json"), "m").unwrap();
    let first = rename.pass(frames[0].clone());
    assert!(first.starts_with(br#"{"object":"list","model":"m","data""#));
    assert!(!rename.reading());
    let started = std::time::Instant::now();
    for frame in &frames[1..] {
        assert_eq!(rename.pass(frame.clone()).as_ptr(), frame.as_ptr());
    }
    eprintln!(
        "the {} frames after the model's passed in {:?}",
        frames.len() - 1,
        started.elapsed()
    );
}

#[tokio::test]
async fn requests_waiting_for_one_on_demand_model_share_one_load_attempt() {
    use crate::testing::majin_and_atlas_with_catalog;
    let app = majin_and_atlas_with_catalog().await;
    let on_demand = json!({"mode": "on_demand", "keep_alive": 60});
    for (model, revision) in [("vision", None), ("speech", Some(1))] {
        let (status, change) = app
            .deploy(json!({"model": model, "gpus": ["atlas:1"], "share": 60, "revision": revision, "demand": on_demand}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{change}");
    }
    // vision holds the room, a request waiting on it: speech cannot load while it does.
    app.fleet.load("vision").await.unwrap();
    let _vision_waits = app.fleet.activity().wait("vision");
    let state = crate::AppState::serving(
        leptos::prelude::LeptosOptions::builder()
            .output_name("tessera")
            .build(),
        app.fleet.clone(),
        app.pool.clone(),
        false,
        super::Gateway::new(Duration::from_secs(1), super::Routing::Prefix),
        Vec::new(),
    );
    let waiters = (0..20)
        .map(|_| on_demand::ready_engine(&state, "speech", Duration::from_secs(1), None, b"{}"));
    let answers = futures::future::join_all(waiters).await;
    assert!(answers.iter().all(Result::is_err));
    // One attempt per look (every 100 ms) for all twenty, not one each.
    let attempts = app.fleet.activity().usage("speech").load_attempts;
    assert!((1..=15).contains(&attempts), "{attempts} load attempts");
}

/// An engine that answers the first request of each connection, and closes it as the next one comes in
/// (its keep-alive ran out as the request went out): answers how many connections it took.
async fn engine_closing_kept_connections() -> (u16, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                if socket.read(&mut request).await.unwrap_or(0) == 0 {
                    return;
                }
                let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{\"ok\":true}";
                socket.write_all(answer.as_bytes()).await.unwrap();
                // The next request on it is read, and the connection dropped unanswered.
                let _ = socket.read(&mut request).await;
            });
        }
    });
    (port, connections)
}

#[tokio::test]
async fn a_request_sent_on_a_kept_connection_the_engine_closes_meanwhile_is_sent_again_and_answered(
) {
    let (port, connections) = engine_closing_kept_connections().await;
    let client = engine_client();
    let uri: Uri = format!("http://127.0.0.1:{port}/v1/chat/completions")
        .parse()
        .unwrap();
    let request = || {
        hyper::Request::post(uri.clone())
            .body(Full::new(Bytes::from_static(b"{}")))
            .unwrap()
    };
    for n in 0..5 {
        let answer = send(&client, request).await;
        let answer = answer.unwrap_or_else(|e| panic!("request {n}: {e:?}"));
        assert_eq!(answer.status(), StatusCode::OK);
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{\"ok\":true}");
    }
    assert!(
        connections.load(Ordering::SeqCst) >= 5,
        "each request after the first met a kept connection that was closed under it"
    );
}

#[tokio::test]
async fn a_request_to_an_engine_that_refuses_connections_is_not_sent_again() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = engine_client();
    let uri: Uri = format!("http://127.0.0.1:{port}/health").parse().unwrap();
    let tries = AtomicUsize::new(0);
    let request = || {
        tries.fetch_add(1, Ordering::SeqCst);
        hyper::Request::get(uri.clone())
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let refused = send(&client, request).await.unwrap_err();
    assert!(refused.is_connect(), "{refused:?}");
    assert_eq!(tries.load(Ordering::SeqCst), 1);
}
