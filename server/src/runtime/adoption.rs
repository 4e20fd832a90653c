//! After a crash: which engines the previous server left running are adopted as committed, and which are
//! stopped. The executors say which of their processes and jobs are still this installation's; the rule for
//! what is kept of them is the runtime's, the same for every executor.

use super::engines::Begin;
use super::executor::{Executor, Running};
use super::spec::EngineSpec;
use super::Shared;
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};

/// Adopts the engines a previous server left running as `desired` wants, and stops every other engine of
/// this installation, on every executor. What an executor trusts as still the engine it recorded (the same
/// process in the same boot; the same job) is its own affair. An executor that cannot say (a Ray head that
/// does not answer) holds up neither the others nor the stops of what they found: it is asked again until
/// it answers, and what it left is stopped then.
pub(super) async fn reconcile(shared: &Arc<Shared>, desired: &[EngineSpec]) {
    let wanted: BTreeMap<&str, &EngineSpec> =
        desired.iter().map(|s| (s.unit.as_str(), s)).collect();
    let mut strays = Vec::new();
    for executor in shared.executors() {
        let leftovers = match executor.leftovers(&|_| true).await {
            Ok(leftovers) => leftovers,
            Err(e) => {
                tracing::error!("the engines left by the previous server could not all be found: {e}; they are stopped once they can be");
                tokio::spawn(sweep_later(shared.clone(), executor));
                continue;
            }
        };
        for leftover in leftovers {
            match wanted.get(leftover.unit.as_str()) {
                Some(spec)
                    if shared.executor(spec).is_some()
                        && leftover.fingerprint.as_deref() == Some(&spec.fingerprint()) =>
                {
                    tracing::info!(
                        "adopting engine {}, still running as committed",
                        leftover.unit
                    );
                    super::supervisor::launch(
                        shared,
                        (*spec).clone(),
                        Begin::Adopt(leftover.running),
                        || false,
                    );
                }
                _ => {
                    tracing::info!(
                        "stopping engine {}: the committed state no longer runs it so",
                        leftover.unit
                    );
                    strays.push(leftover.running);
                }
            }
        }
    }
    stop(strays).await;
}

/// Asks `executor` for what the previous server left until it answers, then stops whatever of it this
/// server has not started since: too late to adopt, as its unit may be starting anew by then (a start ends
/// its unit's earlier engine itself).
async fn sweep_later(shared: Arc<Shared>, executor: Arc<dyn Executor>) {
    loop {
        tokio::time::sleep(shared.settings.health_interval).await;
        if *shared
            .shutting_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            return;
        }
        let Ok(leftovers) = executor.leftovers(&|unit| !shared.has(unit)).await else {
            continue;
        };
        let strays = leftovers
            .into_iter()
            .map(|leftover| {
                tracing::info!(
                    "stopping engine {}, left by the previous server",
                    leftover.unit
                );
                leftover.running
            })
            .collect();
        stop(strays).await;
        return;
    }
}

/// Stops every engine of this installation found on every executor, none adopted: answers their units, or
/// the first executor's reason for not saying what it runs, once the others' are stopped.
pub(super) async fn stop_left(shared: &Arc<Shared>) -> Result<Vec<String>, String> {
    let mut units = Vec::new();
    let mut strays = Vec::new();
    let mut failed = None;
    for executor in shared.executors() {
        match executor.leftovers(&|_| true).await {
            Ok(leftovers) => {
                for leftover in leftovers {
                    units.push(leftover.unit);
                    strays.push(leftover.running);
                }
            }
            Err(e) => failed = failed.or(Some(e.to_string())),
        }
    }
    stop(strays).await;
    match failed {
        Some(why) => Err(why),
        None => Ok(units),
    }
}

/// Stops `strays` side by side, and forgets them.
async fn stop(strays: Vec<Box<dyn Running>>) {
    futures::future::join_all(strays.into_iter().map(|mut running| async move {
        if let Some(stuck) = running.stop().await {
            tracing::warn!("a stray engine did not stop: {stuck}");
        }
        running.forget().await;
    }))
    .await;
}
