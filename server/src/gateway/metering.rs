//! What each request through the gateway is counted as: its model, key, tokens and latency, recorded when
//! it ends. Its own room because it rides along with the answer's body and knows nothing of routing.

use crate::fleet::calls::{Counts, Key};
use crate::runtime::Runtime;
use crate::AppState;
use axum::http::StatusCode;
use placement::interference::Sample;
use serde_json::Value;
use std::time::Duration;

/// How much of an answer's end is kept to find its `usage` in: an OpenAI answer ends with it (or, streamed,
/// its last event carries it), followed by little.
const USAGE_TAIL: usize = 16 << 10;

/// Counts one request when it ends (its answer sent, or the caller gone), with the tokens its answer's
/// `usage` reports.
pub(super) struct Meter {
    state: AppState,
    model: String,
    key: Key,
    failed: bool,
    /// The answer's last bytes.
    tail: Vec<u8>,
    /// When the request came.
    asked_ms: u64,
    /// When it was sent on to the engine.
    sent: Option<std::time::Instant>,
    /// From then to the answer's first bytes.
    first_bytes: Option<Duration>,
    /// The other models busy on the engine's GPUs as it was sent.
    busy_neighbours: Vec<String>,
    /// The engine it went to, and its requests in flight then.
    engine: String,
    queue_depth: u32,
}

impl Meter {
    /// A request for `model` under `key`, come now: failed unless an engine's answer says otherwise.
    pub(super) fn new(state: &AppState, model: &str, key: Key) -> Meter {
        Meter {
            state: state.clone(),
            model: model.to_owned(),
            key,
            failed: true,
            tail: Vec::new(),
            asked_ms: crate::fleet::usage::now_ms(),
            sent: None,
            first_bytes: None,
            busy_neighbours: Vec::new(),
            engine: String::new(),
            queue_depth: 0,
        }
    }

    /// The request goes to `unit`'s engine now.
    pub(super) fn sending(&mut self, runtime: &Runtime, unit: String) {
        // Who else is busy on its GPUs as it goes (none, and it counts toward the model's latency alone), and
        // how many requests its engine has in flight.
        self.busy_neighbours = runtime.busy_beside(&unit);
        self.queue_depth = runtime.requests_in_flight(&unit) as u32;
        self.engine = unit;
        self.sent = Some(std::time::Instant::now());
    }

    /// The engine answered with `status`.
    pub(super) fn answered(&mut self, status: StatusCode) {
        self.failed = !status.is_success();
    }

    /// The engine stopped before the end of its answer: whatever its status said, the request failed.
    pub(super) fn cut_short(&mut self) {
        self.failed = true;
    }

    pub(super) fn saw(&mut self, data: &[u8]) {
        if self.first_bytes.is_none() {
            self.first_bytes = self.sent.map(|sent| sent.elapsed());
        }
        self.tail.extend_from_slice(data);
        if self.tail.len() > 2 * USAGE_TAIL {
            self.tail.drain(..self.tail.len() - USAGE_TAIL);
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        self.state.fleet.activity().touch(&self.model);
        let (prompt_tokens, completion_tokens) = usage_in(&self.tail).unwrap_or_default();
        if let Some(sent) = self.sent {
            let request = sent.elapsed();
            self.state.fleet.latencies().record(
                &self.model,
                Sample {
                    at_ms: self.asked_ms,
                    engine: std::mem::take(&mut self.engine),
                    latency_us: self.first_bytes.unwrap_or(request).as_micros() as u64,
                    request_us: request.as_micros() as u64,
                    completion_tokens,
                    queue_depth: self.queue_depth,
                    failed: self.failed,
                    busy_neighbours: std::mem::take(&mut self.busy_neighbours),
                },
            );
        }
        self.state.fleet.calls().record(
            &self.model,
            &self.key,
            Counts {
                requests: 1,
                failed: u64::from(self.failed),
                prompt_tokens,
                completion_tokens,
            },
            self.asked_ms,
        );
    }
}

/// The prompt and completion tokens of the last `"usage"` object in `tail` (an answer's JSON, or the
/// events of a streamed one); `None` where there is none with figures.
pub(super) fn usage_in(tail: &[u8]) -> Option<(u64, u64)> {
    const NEEDLE: &[u8] = b"\"usage\"";
    let at = tail.windows(NEEDLE.len()).rposition(|w| w == NEEDLE)?;
    let rest = tail[at + NEEDLE.len()..].trim_ascii_start();
    let rest = rest.strip_prefix(b":")?;
    let usage: Value = serde_json::Deserializer::from_slice(rest)
        .into_iter::<Value>()
        .next()?
        .ok()?;
    let count = |name: &str| usage.get(name).and_then(Value::as_u64);
    let prompt = count("prompt_tokens");
    let completion = count("completion_tokens");
    (prompt.is_some() || completion.is_some())
        .then(|| (prompt.unwrap_or(0), completion.unwrap_or(0)))
}
