//! A request for a model with no engine ready waits for one, up to the gateway's wait: a model whose engines
//! restart (or load) is waited for, and an on-demand model that is not loaded is loaded for it, a fleet
//! change like any other. Its own room because the wait, the load and the cold start belong together and
//! not with the routing.

use super::drain::{self, Taken};
use super::unavailable;
use crate::error::ApiError;
use crate::fleet::demand::Load;
use crate::AppState;
use axum::response::Response;
use std::time::Duration;

/// How often a request waiting for a model to be ready looks again.
const READY_POLL: Duration = Duration::from_millis(100);

/// The next healthy engine of `model`, waited for up to `wait` (and loaded for, where the model is on
/// demand); else the 503 that says why not.
pub(super) async fn ready_engine(
    state: &AppState,
    model: &str,
    wait: Duration,
) -> Result<Taken, Response> {
    let asked = tokio::time::Instant::now();
    // A model whose engines all restart (or load) is waited for, up to the gateway's wait.
    let deadline = asked + wait;
    // An on-demand model is busy while a request waits for it: no keep-alive or other load unloads it.
    let mut on_demand = state.fleet.on_demand(model);
    let waiting = on_demand.map(|_| state.fleet.activity().wait(model));
    let mut cold = false;
    let taken = loop {
        // Not loaded (or unloaded by its keep-alive just as the request came): loaded for it, a fleet change
        // carried out after what makes way has stopped. Where the room is taken by models with requests in
        // flight, the load waits for one of them to end.
        if on_demand == Some(false) {
            match state.fleet.load(model).await {
                Ok(load) => {
                    cold |= matches!(load, Load::Loading { .. });
                    on_demand = Some(true);
                }
                Err(ApiError::Conflict(_)) if tokio::time::Instant::now() < deadline => {}
                Err(e) => {
                    let message = match e {
                        ApiError::Internal(detail) => {
                            tracing::error!("{model} could not be loaded: {detail}");
                            format!("{model} could not be loaded; it has been logged")
                        }
                        refused => refused.to_string(),
                    };
                    return Err(unavailable("model_not_loaded", message));
                }
            }
        }
        if let Some(taken) = drain::take(state, model) {
            break taken;
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(unavailable(
                "model_not_ready",
                format!(
                    "{model} is deployed but none of its engines was ready within {} s; try again shortly",
                    wait.as_secs()
                ),
            ));
        }
        tokio::time::sleep(READY_POLL).await;
        // A pinned model stays pinned; an on-demand one may have been unloaded meanwhile.
        if on_demand.is_some() {
            on_demand = state.fleet.on_demand(model);
        }
    };
    if cold {
        state.fleet.activity().cold_started(model, asked.elapsed());
    }
    drop(waiting);
    Ok(taken)
}
