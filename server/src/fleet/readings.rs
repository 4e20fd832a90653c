//! Each GPU's figures over time, for the machine page: what NVML read on this machine (kept by
//! [`Fleet::follow_local_gpus`]), and for the demo fleet, figures made from its demo engines' work: how long
//! the gateway's requests kept them busy, and the memory their shares hold. Those are marked as the demo's.

use super::Fleet;
use crate::inventory::simulated::SimulatedGpus;
use crate::inventory::GpuLive;
use app::views::GpuPoint;
use placement::{Bytes, GpuRef};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// How far back the machine page's charts go.
pub const HISTORY: Duration = Duration::from_secs(3600);

/// The most points a chart is drawn with: an hour of 5 s readings is thinned to this.
const MAX_POINTS: usize = 240;

impl Fleet {
    /// Whether `machine` is the demo fleet's: its figures are made up from its demo engines.
    pub fn is_demo(&self, machine: &str) -> bool {
        self.hosts().simulated.contains(machine)
    }

    /// Whether Tessera runs real programs on `machine`'s GPUs, MPS daemons among them.
    pub fn runs_daemons(&self, machine: &str) -> bool {
        self.hosts().host(machine).runs_daemons()
    }

    /// Whether `machine`'s GPUs are made up (the demo fleet's, a Ray node's labelled demo).
    pub fn made_up(&self, machine: &str) -> bool {
        self.hosts().host(machine).made_up()
    }

    /// The demo fleet's GPUs as its demo engines make them now, over the last `period`: busy for the share
    /// of the period the gateway's requests to their engines took (up to all of it), holding the shares of
    /// the engines that run plus what is held outside, warmer and drawing more power as they are busier.
    pub async fn demo_readings(&self, period: Duration) -> Vec<(placement::Machine, Vec<GpuLive>)> {
        let now = super::usage::now_ms();
        let busy_us = self
            .latencies
            .busy_us_since(now.saturating_sub(period.as_millis() as u64));
        let engines = self.runtime.engines();
        let state = self.state.lock().await;
        state
            .ledger
            .inventory()
            .machines()
            .iter()
            .filter(|m| self.is_demo(&m.name))
            .map(|machine| {
                // What the engines that run here hold on each GPU: a whole GPU, or their shares.
                let ours = super::engines::held_on(&state.ledger, &machine.name, |who| {
                    engines.iter().any(|e| e.unit == who)
                });
                let live = machine
                    .gpus
                    .iter()
                    .map(|gpu| {
                        let busy: u64 = engines
                            .iter()
                            .filter(|e| e.machine == machine.name && e.gpus.contains(&gpu.index))
                            .filter_map(|e| busy_us.get(&e.unit))
                            .sum();
                        let utilisation =
                            (busy * 100 / (period.as_micros() as u64).max(1)).min(100) as u32;
                        let ours = ours.get(&gpu.index).copied().unwrap_or_default();
                        GpuLive {
                            index: gpu.index,
                            utilisation_percent: utilisation,
                            power_mw: Some(75_000 + utilisation * 5_250),
                            temperature_c: Some(30 + utilisation * 45 / 100),
                            energy_mj: None,
                            used: (ours + gpu.held_outside).min(gpu.total),
                            processes: Vec::new(),
                            problem: None,
                        }
                    })
                    .collect();
                (machine.clone(), live)
            })
            .collect()
    }

    /// Reads the demo fleet's simulated GPUs every `every`, for as long as the server runs, as this
    /// machine's are read through NVML: the memory each process holds (its engines' measured against
    /// their shares), what other programs hold (which moves what the GPU offers, and can over-commit it),
    /// and how busy the gateway's requests kept it.
    pub async fn follow_simulated_gpus(self: Arc<Self>, sim: SimulatedGpus, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let running = self.runtime.running().await;
            let at = super::usage::now_ms();
            for (mut machine, mut live) in self.demo_readings(every).await {
                let ours = {
                    let state = self.state.lock().await;
                    super::engines::ours(&state.ledger, &machine.name, &running)
                };
                for (gpu, live) in machine.gpus.iter_mut().zip(live.iter_mut()) {
                    let reading = match sim.read(&GpuRef::new(&machine.name, gpu.index)) {
                        Ok(reading) => reading,
                        Err(e) => {
                            tracing::warn!("{e}");
                            continue;
                        }
                    };
                    gpu.held_outside = crate::inventory::held_outside(
                        reading.used,
                        &ours,
                        gpu.index,
                        &reading.processes,
                    );
                    live.used = reading.used;
                    live.processes = reading.processes;
                }
                let reported = self.runtime.reported_on(&machine.name);
                self.measure(&machine.name, &live, &running, &reported);
                if let Err(e) = self.record_samples(&machine, &live, at).await {
                    tracing::warn!("the simulated GPUs' figures could not be kept: {e}");
                }
                if let Err(e) = self.refresh_machine(machine).await {
                    tracing::warn!("a reading of the simulated GPUs could not be taken up: {e}");
                }
            }
        }
    }

    /// Keeps a reading of the demo fleet's GPUs every `every`, for as long as the server runs.
    pub async fn follow_demo_gpus(self: Arc<Self>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let at = super::usage::now_ms();
            for (machine, live) in self.demo_readings(every).await {
                if let Err(e) = self.record_samples(&machine, &live, at).await {
                    tracing::warn!("the demo fleet's figures could not be kept: {e}");
                }
            }
        }
    }

    /// The readings of `machine`'s GPUs since `since_ms`, oldest first, by GPU, each thinned to at most
    /// [`MAX_POINTS`].
    pub async fn gpu_history(
        &self,
        machine: &str,
        since_ms: u64,
    ) -> Result<BTreeMap<u32, Vec<GpuPoint>>, crate::error::ApiError> {
        type Row = (
            i64,
            i64,
            i64,
            Option<i64>,
            Option<i64>,
            Option<i64>,
            Option<i64>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT gpu_index, at_ms, utilisation_percent, used_bytes, held_outside_bytes, temperature_c, power_mw \
             FROM gpu_samples WHERE machine = ? AND at_ms >= ? ORDER BY gpu_index, at_ms",
        )
        .bind(machine)
        .bind(since_ms as i64)
        .fetch_all(&self.pool)
        .await?;
        let mut by_gpu: BTreeMap<u32, Vec<GpuPoint>> = BTreeMap::new();
        for (gpu, at, utilisation, used, outside, temperature, power) in rows {
            let count = |v: i64| u64::try_from(v).ok();
            by_gpu.entry(gpu as u32).or_default().push(GpuPoint {
                at_ms: at as u64,
                utilisation_percent: utilisation.clamp(0, 100) as u32,
                used: used.and_then(count).map(Bytes),
                held_outside: outside.and_then(count).map(Bytes),
                temperature_c: temperature.and_then(|t| u32::try_from(t).ok()),
                power_mw: power.and_then(|p| u32::try_from(p).ok()),
            });
        }
        for points in by_gpu.values_mut() {
            let step = points.len().div_ceil(MAX_POINTS).max(1);
            if step > 1 {
                let last = points.pop();
                *points = points.iter().step_by(step).cloned().chain(last).collect();
            }
        }
        Ok(by_gpu)
    }
}

#[cfg(test)]
mod tests;
