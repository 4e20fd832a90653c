//! After a crash: which engines the previous server left running are adopted as committed, and which are
//! stopped. The executors say which of their processes and jobs are still this installation's; the rule for
//! what is kept of them is the runtime's, the same for every executor.

use super::engines::Begin;
use super::spec::EngineSpec;
use super::Shared;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Adopts the engines a previous server left running as `desired` wants, and stops every other engine of
/// this installation, on every executor. What an executor trusts as still the engine it recorded (the same
/// process in the same boot; the same job) is its own affair.
pub(super) async fn reconcile(shared: &Arc<Shared>, desired: &[EngineSpec]) -> std::io::Result<()> {
    let wanted: BTreeMap<&str, &EngineSpec> =
        desired.iter().map(|s| (s.unit.as_str(), s)).collect();
    let mut strays = Vec::new();
    for executor in shared.executors() {
        for leftover in executor.leftovers().await? {
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
    futures::future::join_all(strays.into_iter().map(|mut running| async move {
        if let Some(stuck) = running.stop().await {
            tracing::warn!("a stray engine did not stop: {stuck}");
        }
        running.forget().await;
    }))
    .await;
    Ok(())
}
