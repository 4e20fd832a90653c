//! When an engine will be ready: how long its last load took (from its start to its first answered health
//! check), and when one waiting out a backoff starts again. The gateway tells a client when to ask again
//! from it, and an on-demand model's cold start is its load measured here, apart from what its request
//! waited before the load began. Kept by unit name across registrations, so that a model loaded again on
//! demand is known by its last load.

use super::EngineState;
use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// An engine's last load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    /// From its start to its first answered health check.
    pub took: Duration,
    /// When it answered that check.
    pub ready_at: Instant,
}

#[derive(Debug, Clone, Copy, Default)]
struct Timing {
    /// The start under way, if one is.
    started: Option<Instant>,
    /// When an engine waiting out its backoff starts again.
    resumes: Option<Instant>,
    last: Option<Load>,
}

/// Every unit's timings.
#[derive(Default)]
pub(super) struct Readiness {
    units: Mutex<BTreeMap<String, Timing>>,
}

impl Readiness {
    fn with<T>(&self, unit: &str, f: impl FnOnce(&mut Timing) -> T) -> T {
        let mut units = self.units.lock().unwrap_or_else(PoisonError::into_inner);
        f(units.entry(unit.to_owned()).or_default())
    }

    /// `unit`'s engine is being started at `now`.
    pub(super) fn starting(&self, unit: &str, now: Instant) {
        self.with(unit, |t| {
            t.started = Some(now);
            t.resumes = None;
        });
    }

    /// `unit`'s engine answered its first health check since its start at `now`: its load is over.
    pub(super) fn ready(&self, unit: &str, now: Instant) {
        self.with(unit, |t| {
            if let Some(started) = t.started.take() {
                t.last = Some(Load {
                    took: now - started,
                    ready_at: now,
                });
            }
        });
    }

    /// `unit`'s engine waits out a backoff until `at`.
    pub(super) fn resumes_at(&self, unit: &str, at: Instant) {
        self.with(unit, |t| {
            t.started = None;
            t.resumes = Some(at);
        });
    }

    /// `unit`'s last load, if it has loaded since the server started.
    pub(super) fn last_load(&self, unit: &str) -> Option<Load> {
        let units = self.units.lock().unwrap_or_else(PoisonError::into_inner);
        units.get(unit)?.last
    }

    /// How long until `unit`'s engine, now in `state`, is expected to serve: none left while it serves; what
    /// its last load took less what this start has run, while it starts; the rest of its backoff and then
    /// its last load, while it waits to restart. `None` where nothing says (a first load, or an engine that
    /// is not coming back by itself).
    pub(super) fn ready_in(
        &self,
        unit: &str,
        state: EngineState,
        now: Instant,
    ) -> Option<Duration> {
        let units = self.units.lock().unwrap_or_else(PoisonError::into_inner);
        let timing = units.get(unit).copied().unwrap_or_default();
        let load = timing.last.map(|l| l.took);
        match state {
            EngineState::Healthy => Some(Duration::ZERO),
            EngineState::Starting => {
                Some(load?.saturating_sub(now.saturating_duration_since(timing.started?)))
            }
            EngineState::Restarting => {
                let backoff = timing.resumes?.saturating_duration_since(now);
                Some(backoff + load.unwrap_or_default())
            }
            // A wake's length is the fleet's to say: it knows it wakes it.
            EngineState::Asleep
            | EngineState::Unhealthy
            | EngineState::Draining
            | EngineState::Stopped
            | EngineState::Failed => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_restarting_is_expected_after_its_backoff_and_its_last_load() {
        let readiness = Readiness::default();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(readiness.ready_in("emb", EngineState::Starting, t0), None);
        readiness.starting("emb", t0);
        readiness.ready("emb", at(40));
        assert_eq!(
            readiness.last_load("emb").map(|l| l.took),
            Some(Duration::from_secs(40))
        );
        assert_eq!(
            readiness.ready_in("emb", EngineState::Healthy, at(50)),
            Some(Duration::ZERO)
        );
        readiness.resumes_at("emb", at(108));
        assert_eq!(
            readiness.ready_in("emb", EngineState::Restarting, at(103)),
            Some(Duration::from_secs(45))
        );
        readiness.starting("emb", at(108));
        assert_eq!(
            readiness.ready_in("emb", EngineState::Starting, at(138)),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            readiness.ready_in("emb", EngineState::Failed, at(138)),
            None
        );
    }
}
