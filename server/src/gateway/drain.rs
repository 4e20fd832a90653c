//! The gateway's half of an engine's drain: a request goes only to an engine that serves now, and is counted
//! in flight there until the last of its answer has gone (`answer` holds the count that long), so an engine
//! taken out of the rotation finishes what it was given before it is stopped. The same count chooses among
//! a model's engines: the least busy first, or, for a request with a prompt, the engine its prompt's first
//! characters rank first while it has a slot free or is not too busy (`affinity`).

use super::affinity;
use crate::runtime::{InFlight, Serving};
use crate::AppState;

/// An engine a request goes to, and the request's count in flight there.
pub(super) struct Taken {
    pub(super) in_flight: InFlight,
    pub(super) engine: Serving,
}

/// A healthy engine of `model` for a request whose body is `body`, the request counted in flight to it;
/// `None` while none serves. For a prompt, the engine its start ranks first within the load bound; else
/// the engine with the fewest requests in flight, and among engines as busy as each other the model's own
/// rotation decides, so that requests that never overlap still take turns, whatever other models are asked
/// meanwhile.
pub(super) fn take(state: &AppState, model: &str, body: Option<&[u8]>) -> Option<Taken> {
    let runtime = state.fleet.runtime();
    let mut ready = runtime.serving(model);
    if ready.is_empty() {
        return None;
    }
    // The body is read for its prompt only where there is a choice to make.
    let prefix = body
        .filter(|_| ready.len() > 1 && state.gateway.routing == super::Routing::Prefix)
        .and_then(affinity::prefix_key);
    // The prefix's home, where a request taken there settles it.
    let mut home = None;
    match prefix {
        Some(key) => {
            let now = crate::fleet::usage::now_ms();
            let (busy, placed): (Vec<(&str, usize, f64)>, Option<String>) = {
                let recent = state.gateway.recent();
                let busy = ready
                    .iter()
                    .map(|e| {
                        let unit = e.unit.as_str();
                        (unit, runtime.requests_in_flight(unit), recent.of(unit, now))
                    })
                    .collect();
                (busy, recent.placed(key).map(str::to_owned))
            };
            let (order, at) = affinity::order(
                key,
                &busy,
                state.fleet.slots(model) as usize,
                placed.as_deref(),
            );
            home = at.map(|i| (key, busy[i].0.to_owned()));
            let mut slots: Vec<Option<Serving>> = ready.into_iter().map(Some).collect();
            ready = order.into_iter().filter_map(|i| slots[i].take()).collect();
        }
        _ => {
            let first = state.gateway.turn(model) % ready.len();
            ready.rotate_left(first);
            // Stable: the rotation's order stays among equals.
            ready.sort_by_cached_key(|engine| runtime.requests_in_flight(&engine.unit));
        }
    }
    let taken = ready.into_iter().find_map(|engine| {
        let in_flight = runtime.begin_request(&engine.unit)?;
        Some(Taken { in_flight, engine })
    })?;
    let now = crate::fleet::usage::now_ms();
    let mut recent = state.gateway.recent();
    recent.count(&taken.engine.unit, now);
    // A request sent past a full home leaves the prefix where it was.
    if let Some((key, unit)) = home.filter(|(_, unit)| *unit == taken.engine.unit) {
        recent.settle(key, &unit, now);
    }
    drop(recent);
    Some(taken)
}
