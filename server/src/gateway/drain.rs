//! The gateway's half of an engine's drain: a request goes only to an engine that serves now, and is counted
//! in flight there until the last of its answer has gone (`answer` holds the count that long), so an engine
//! taken out of the rotation finishes what it was given before it is stopped. The same count chooses among
//! a model's engines: the least busy first.

use super::{address, engines_of};
use crate::runtime::{EngineState, EngineView, InFlight};
use crate::AppState;

/// An engine a request goes to: the request's count in flight there, the engine's host and port, its unit.
pub(super) type Taken = (InFlight, String, u16, String);

/// The healthy engine of `model` with the fewest requests in flight, the request counted in flight to it;
/// `None` while none serves. Among engines as busy as each other the model's own rotation decides, so that
/// requests that never overlap still take turns, whatever other models are asked meanwhile.
pub(super) fn take(state: &AppState, model: &str) -> Option<Taken> {
    let runtime = state.fleet.runtime();
    let ready: Vec<(EngineView, (String, u16))> = engines_of(state, model)
        .into_iter()
        .filter(|e| e.state == EngineState::Healthy)
        .filter_map(|e| address(&e).map(|a| (e, a)))
        .collect();
    if ready.is_empty() {
        return None;
    }
    let first = state.gateway.turn(model);
    let mut order: Vec<usize> = (0..ready.len())
        .map(|k| (first + k) % ready.len())
        .collect();
    // Stable: the rotation's order stays among equals.
    order.sort_by_cached_key(|&i| runtime.requests_in_flight(&ready[i].0.unit));
    order.into_iter().find_map(|i| {
        let (engine, (host, port)) = &ready[i];
        runtime
            .begin_request(&engine.unit)
            .map(|counted| (counted, host.clone(), *port, engine.unit.clone()))
    })
}
