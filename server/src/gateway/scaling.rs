//! The gateway's half of replicas that follow traffic: twice a second it samples each autoscaled model's
//! load (its requests in flight to its engines and those waiting for one, the counts the gateway keeps
//! for its drain and its queue) and hands it to the fleet, which decides with `placement::scale` and
//! carries out what it decides as a fleet write.

use crate::AppState;
use std::collections::HashMap;
use std::time::Duration;

/// How often each autoscaled model's load is sampled. A burst is seen at most this late (the panic rule acts
/// on one sample), and queues on the replicas that run until it is; `scripts/bench-autoscale` cannot tell
/// 1 s from 500 ms apart over its run-to-run noise (BENCHMARKS.md).
pub const SAMPLE: Duration = Duration::from_millis(500);

/// Samples the load of every autoscaled model every `every`, for as long as the server runs.
pub async fn keep_scaling(state: AppState, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        sample(&state).await;
    }
}

/// One sample of every autoscaled model's load, and the decisions it brings carried out.
async fn sample(state: &AppState) {
    let autoscaled = state.fleet.autoscaled();
    if autoscaled.is_empty() {
        return;
    }
    let waiting: HashMap<String, usize> = state.gateway.waiting().into_iter().collect();
    let runtime = state.fleet.runtime();
    for model in autoscaled {
        // Taken for each: a step carried out for the one before may have waited for the write lock.
        let now = crate::fleet::usage::now_ms();
        let in_flight: usize = runtime
            .engines_of(&model.model)
            .iter()
            .map(|e| runtime.requests_in_flight(&e.unit))
            .sum();
        let load = in_flight + waiting.get(&model.model).copied().unwrap_or(0);
        let load = u32::try_from(load).unwrap_or(u32::MAX);
        let Some(decision) = state
            .fleet
            .observe_load(&model.model, model.running, load, now)
        else {
            continue;
        };
        if let Err(e) = state.fleet.scale(&model.model, decision).await {
            tracing::warn!("{} could not be scaled: {e}", model.model);
        }
    }
}
