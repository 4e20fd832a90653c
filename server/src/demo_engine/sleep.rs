//! Sleep mode, as vLLM and SGLang serve it, so that Tessera's warm tier can be tried without a GPU. The
//! shapes are read from the released wheels: vLLM 0.11.0's `vllm/entrypoints/openai/api_server.py`
//! (with `VLLM_SERVER_DEV_MODE=1`: `POST /sleep?level=1` and `POST /wake_up` answering 200 with no body,
//! `GET /is_sleeping` answering `{"is_sleeping": …}`; 0.34.0 keeps the paths and answers JSON) and SGLang
//! 0.5.23's `sglang/srt/entrypoints/http_server.py` (`POST /release_memory_occupation` and `POST
//! /resume_memory_occupation`, a body of `{"tags": …}`, all when none; no query of its state). Asleep, it
//! keeps the profile's `asleep_holds` of its share on its simulated GPUs; level 1 keeps its weights in
//! host memory and wakes in the time they take to come back over the profile's host-to-device link,
//! level 2 drops them and wakes in the time its weights took to load. A request while it sleeps is
//! refused with a 503 (vLLM 0.11 fails it on freed memory, 0.34 holds it until the wake): Tessera's
//! gateway sends none to a sleeping engine.

use super::profile::Profile;
use super::Engine;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use placement::Bytes;
use serde_json::json;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How it sleeps, while it does.
#[derive(Debug, Clone)]
pub(super) struct Asleep {
    level: u8,
    /// What it held on each simulated GPU before it slept: what a wake takes back.
    held: Vec<Bytes>,
}

#[derive(serde::Deserialize)]
pub(super) struct Level {
    level: Option<u8>,
}

/// How long waking from `level` takes an engine whose weights are `weights` of `share`.
pub(super) fn wake_time(profile: &Profile, share: Bytes, level: u8) -> Duration {
    match level {
        1 => {
            let bytes = share.get() as f64 * profile.weights;
            profile.scaled(bytes / (profile.host_to_device_gb_s * 1e9))
        }
        // The weights read again: their part of a load.
        _ => profile.load(0.5).mul_f64(0.9),
    }
}

/// `POST /sleep?level=N` (vLLM; level 1 unless said).
pub(super) async fn sleep(State(engine): State<Engine>, Query(q): Query<Level>) -> Response {
    fall_asleep(&engine, q.level.unwrap_or(1)).await
}

/// `POST /release_memory_occupation` (SGLang): its weights and KV cache released, as level 1.
pub(super) async fn release(State(engine): State<Engine>) -> Response {
    fall_asleep(&engine, 1).await
}

async fn fall_asleep(engine: &Engine, level: u8) -> Response {
    if !(1..=2).contains(&level) {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": format!("level must be 1 or 2, not {level}")})),
        )
            .into_response();
    }
    let mut asleep = engine.asleep.lock().await;
    if asleep.is_some() {
        return StatusCode::OK.into_response();
    }
    engine.sleeping.store(true, Ordering::SeqCst);
    let held = engine
        .memory
        .as_ref()
        .map(|m| m.holding())
        .unwrap_or_default();
    if let Some(memory) = &engine.memory {
        if let Err(e) = memory.keep_only(engine.profile.asleep_holds) {
            engine.sleeping.store(false, Ordering::SeqCst);
            return (StatusCode::INTERNAL_SERVER_ERROR, e).into_response();
        }
    }
    println!("asleep at level {level}");
    *asleep = Some(Asleep { level, held });
    StatusCode::OK.into_response()
}

/// `POST /wake_up` (vLLM) and `POST /resume_memory_occupation` (SGLang): back to what it held, after the
/// profile's wake time. A GPU that lacks the room kills it, as CUDA's out-of-memory error does.
pub(super) async fn wake_up(State(engine): State<Engine>) -> Response {
    let mut asleep = engine.asleep.lock().await;
    let Some(was) = asleep.clone() else {
        return StatusCode::OK.into_response();
    };
    tokio::time::sleep(wake_time(&engine.profile, engine.share, was.level)).await;
    if let Some(memory) = &engine.memory {
        if let Err(out_of_memory) = memory.hold_again(&was.held) {
            eprintln!("{out_of_memory}");
            std::process::exit(1);
        }
    }
    println!("awake");
    *asleep = None;
    engine.sleeping.store(false, Ordering::SeqCst);
    StatusCode::OK.into_response()
}

/// `GET /is_sleeping` (vLLM).
pub(super) async fn is_sleeping(State(engine): State<Engine>) -> Json<serde_json::Value> {
    Json(json!({"is_sleeping": engine.asleep.lock().await.is_some()}))
}

/// What an OpenAI request gets while the engine sleeps.
pub(super) fn refused() -> Response {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        Json(json!({"error": {"message": "the engine is asleep", "type": "server_error", "code": 503}})),
    )
        .into_response()
}
