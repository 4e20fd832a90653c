//! A request for a model with no engine ready waits for one, up to the gateway's wait: a model whose engines
//! restart (or load) is waited for, and an on-demand model that is not loaded is loaded for it, a fleet
//! change like any other. Its own room because the wait, the load and the cold start belong together and
//! not with the routing.

use super::drain::{self, Taken};
use super::{unavailable, RETRY_AFTER};
use crate::error::ApiError;
use crate::AppState;
use axum::response::Response;
use std::time::Duration;
use tokio::sync::OwnedMutexGuard;
use tokio::time::Instant;

/// How often a request waiting for a model to be ready looks again.
const READY_POLL: Duration = Duration::from_millis(100);

/// How often a cold model waiting its turn asks the busy models that hold its room to yield it again: a
/// fleet lock each time, so not at every look.
const ASK_AGAIN: Duration = Duration::from_millis(500);

/// `taken`, where the request's engine was taken already, else the next healthy engine of `model` for the
/// request's `body`, waited
/// for up to `wait` (and loaded for, where the model is on demand); else the 503 that says why not, and
/// when to ask again.
pub(super) async fn ready_engine(
    state: &AppState,
    model: &str,
    wait: Duration,
    taken: Option<Taken>,
    body: &[u8],
) -> Result<Taken, Response> {
    let asked = Instant::now();
    // A model whose engines all restart (or load) is waited for, up to the gateway's wait.
    let deadline = asked + wait;
    let activity = state.fleet.activity();
    // An on-demand model is busy while a request waits for it: no keep-alive or other load unloads it.
    let mut on_demand = state.fleet.on_demand(model);
    let waiting = on_demand.map(|_| activity.wait(model));
    // An engine taken already serves a model that is not on demand, or one loaded: no load is tried for
    // it (an engine of an unloaded model still draining is not, nor one of a model yielding its room).
    let mut first = taken.filter(|_| match on_demand {
        None => true,
        Some(loaded) => loaded && !activity.yielding(model),
    });
    // A cold model that has waited this long for room that busy models hold asks them to yield it, once
    // each has served as long: their turn, and its.
    let their_turn = wait / 3;
    let mut asked_to_yield: Option<Instant> = None;
    // Requests waiting for one model share its load: only the one holding the model's turn tries it (a
    // fleet write), the others look for its engine.
    let mut turn: Option<OwnedMutexGuard<()>> = None;
    let mut queued = None;
    let taken = loop {
        if on_demand == Some(true) && first.is_none() {
            failed_load(state, model).await?;
        }
        // Not loaded (or unloaded by its keep-alive just as the request came): loaded for it, a fleet change
        // carried out after what makes way has stopped. Where the room is taken by models with requests in
        // flight, the load is tried again until one of them ends.
        if on_demand == Some(false) {
            if let Some((why, left)) = activity.refused(model, state.fleet.runtime().cool_off()) {
                return Err(failed_to_load(model, &why, left));
            }
            if turn.is_none() {
                turn = activity.load_turn(model).try_lock_owned().ok();
            }
            if turn.is_some() {
                match state.fleet.load_for(model, asked).await {
                    Ok(_) => {
                        on_demand = Some(true);
                        turn = None;
                    }
                    Err(ApiError::Conflict(_)) if Instant::now() < deadline => {
                        let again = asked_to_yield.is_none_or(|at| at.elapsed() >= ASK_AGAIN);
                        if again && asked.elapsed() >= their_turn {
                            asked_to_yield = Some(Instant::now());
                            state.fleet.ask_to_yield(model, their_turn).await;
                        }
                    }
                    Err(e) => {
                        let message = match e {
                            ApiError::Internal(detail) => {
                                tracing::error!("{model} could not be loaded: {detail}");
                                format!("{model} could not be loaded; it has been logged")
                            }
                            refused => refused.to_string(),
                        };
                        return Err(unavailable("model_not_loaded", message, RETRY_AFTER));
                    }
                }
            }
        }
        // A model yielding its room takes no new request: this one waits its turn.
        let yielding = on_demand == Some(true) && activity.yielding(model);
        if let Some(taken) = first.take().or_else(|| {
            (!yielding)
                .then(|| drain::take(state, model, Some(body)))
                .flatten()
        }) {
            break taken;
        }
        if Instant::now() >= deadline {
            return Err(not_ready(state, model, wait));
        }
        // Counted as waiting from its first look that found no engine ready until it has one.
        queued.get_or_insert_with(|| state.gateway.queue(model));
        tokio::time::sleep(READY_POLL).await;
        // A pinned model stays pinned; an on-demand one may have been loaded or unloaded meanwhile.
        if on_demand.is_some() {
            on_demand = state.fleet.on_demand(model);
        }
    };
    if on_demand.is_some() {
        activity.answered(model, state.fleet.runtime().last_load(&taken.engine.unit));
    }
    drop((waiting, queued));
    Ok(taken)
}

/// The 503 for `model`, none of whose engines was ready within `wait`: for a model with replicas none of
/// which is placed, why no GPU of its group has the room.
fn not_ready(state: &AppState, model: &str, wait: Duration) -> Response {
    let message = match state.fleet.replicas_view(model) {
        Some(r) if r.running == 0 && !r.pending_reasons.is_empty() => format!(
            "{model} has no replica running and none fits now ({}); try again shortly",
            r.pending_reasons.join("; ")
        ),
        _ => format!(
            "{model} is deployed but none of its engines was ready within {} s; try again shortly",
            wait.as_secs()
        ),
    };
    unavailable("model_not_ready", message, retry_after(state, model, None))
}

/// Where every engine of `model`, an on-demand model, failed to load: unloaded, so that it books no memory,
/// and the request refused at once with the reason.
async fn failed_load(state: &AppState, model: &str) -> Result<(), Response> {
    match state.fleet.unload_failed(model).await {
        Ok(None) => Ok(()),
        Ok(Some(why)) => Err(failed_to_load(
            model,
            &why,
            state.fleet.runtime().cool_off(),
        )),
        Err(e) => {
            tracing::error!("{model}, whose engine failed, could not be unloaded: {e}");
            Err(unavailable(
                "model_failed",
                format!("{model} failed to load; it has been logged"),
                RETRY_AFTER,
            ))
        }
    }
}

/// The 503 for `model`, unloaded because its engine failed to load (`why`), for `left` more of its
/// cool-off.
fn failed_to_load(model: &str, why: &str, left: Duration) -> Response {
    let message = format!(
        "{model} failed to load and was unloaded: {why}; the next request after {} s loads it again",
        seconds(left)
    );
    unavailable("model_failed", message, left)
}

/// When a client should ask again for `model`: when the first of its engines is expected to serve, from
/// its state and its last load (`unreached`, one that just did not answer, after its restart); else the
/// gateway's default.
pub(super) fn retry_after(state: &AppState, model: &str, unreached: Option<&str>) -> Duration {
    let runtime = state.fleet.runtime();
    runtime
        .engines_of(model)
        .iter()
        .filter_map(|e| {
            if Some(e.unit.as_str()) == unreached {
                runtime.restart_in(&e.unit)
            } else {
                runtime.ready_in(&e.unit)
            }
        })
        .min()
        .unwrap_or(RETRY_AFTER)
}

/// Whole seconds, rounded up, at least one.
pub(super) fn seconds(d: Duration) -> u64 {
    d.as_millis().div_ceil(1000).max(1) as u64
}
