//! The gateway's half of an engine's drain: a request goes only to an engine that serves now, and is counted
//! in flight there until the last of its answer has gone (`answer` holds the count that long), so an engine
//! taken out of the rotation finishes what it was given before it is stopped. The same count chooses among
//! a model's engines: the least busy first.

use crate::runtime::{InFlight, Serving};
use crate::AppState;

/// An engine a request goes to, and the request's count in flight there.
pub(super) struct Taken {
    pub(super) in_flight: InFlight,
    pub(super) engine: Serving,
}

/// The healthy engine of `model` with the fewest requests in flight, the request counted in flight to it;
/// `None` while none serves. Among engines as busy as each other the model's own rotation decides, so that
/// requests that never overlap still take turns, whatever other models are asked meanwhile.
pub(super) fn take(state: &AppState, model: &str) -> Option<Taken> {
    let runtime = state.fleet.runtime();
    let mut ready = runtime.serving(model);
    if ready.is_empty() {
        return None;
    }
    let first = state.gateway.turn(model) % ready.len();
    ready.rotate_left(first);
    // Stable: the rotation's order stays among equals.
    ready.sort_by_cached_key(|engine| runtime.requests_in_flight(&engine.unit));
    ready.into_iter().find_map(|engine| {
        let in_flight = runtime.begin_request(&engine.unit)?;
        Some(Taken { in_flight, engine })
    })
}
