//! What the chaos soaks share (tests/soak.rs on the demo fleet, the cluster's in tests/ray.rs): a seeded
//! generator, the server under soak (replaced when a soak kills it), and a client's request through the
//! gateway with how it ended.

use super::Server;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::RwLock;

/// A small seeded generator (xorshift64*): the same seed replays the same choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// The server under soak, replaced when the soak kills it.
pub type Current = Arc<RwLock<Option<Server>>>;

/// The port and token of the server now, if it runs.
pub async fn address(current: &Current) -> Option<(u16, String)> {
    let server = current.read().await;
    server.as_ref().map(|s| (s.port, s.token.clone()))
}

pub async fn call(current: &Current, method: &str, path: &str, body: Value) -> (u16, Value) {
    let Some((port, token)) = address(current).await else {
        return (0, Value::Null);
    };
    let (status, _, bytes) =
        super::request_full(port, Some(&token), method, path, Some(body)).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One client's request to `model`, streamed or not: how it ended.
pub enum Outcome {
    Answered,
    ToldToRetry,
    Gone,
    Failed(String),
    Down,
}

pub async fn ask(current: &Current, model: &str, stream: bool) -> Outcome {
    let Some((port, token)) = address(current).await else {
        return Outcome::Down;
    };
    let Some(mut sender) = super::connect(port).await else {
        return Outcome::Down;
    };
    let body = json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "how are you today"}]});
    let request = hyper::Request::post("/v1/chat/completions")
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let Ok(answer) = sender.send_request(request).await else {
        return Outcome::Down;
    };
    let status = answer.status().as_u16();
    let retry_after = answer
        .headers()
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let body = match answer.into_body().collect().await {
        Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        Err(e) => return Outcome::Failed(format!("{model}: the answer was cut: {e}")),
    };
    match status {
        200 if !stream && body.contains("\"choices\"") => Outcome::Answered,
        200 if stream && body.trim_end().ends_with("data: [DONE]") => Outcome::Answered,
        200 => Outcome::Failed(format!("{model}: an answer cut short: …{}", tail(&body))),
        404 if body.contains("model_not_found") => Outcome::Gone,
        503 if retry_after.is_some_and(|s| (1..=120).contains(&s)) => Outcome::ToldToRetry,
        _ => Outcome::Failed(format!("{model}: {status} {}", tail(&body))),
    }
}

pub fn tail(text: &str) -> String {
    let cut = text.len().saturating_sub(160);
    text[text.floor_char_boundary(cut)..].to_owned()
}
