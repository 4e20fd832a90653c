use super::metering::usage_in;
use super::*;

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
