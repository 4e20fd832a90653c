//! How a demo engine behaves like a real one (`TESSERA_DEMO_PROFILE`, a JSON object): a load that takes
//! seconds to minutes, its memory growing as it loads (the weights shard by shard, then the KV cache block
//! vLLM sizes from its share), slower answers, an exit that lingers after SIGTERM, and faults on request:
//! a crash or a hang after so many requests, SIGTERM ignored. One time-compression factor (`speed`) makes
//! a 3-minute load take 3 s in CI; the same profile at speed 1 takes real time. On a simulated GPU
//! (`TESSERA_SIM_DIR`) the memory is really allocated, and an allocation past the GPU's total kills the
//! engine as CUDA's out-of-memory error kills a real one.

use crate::inventory::simulated::{SimulatedGpus, SIM_DIR_VAR, SIM_GPUS_VAR};
use placement::{Bytes, GpuRef};
use serde::Deserialize;
use std::time::Duration;

/// The variable that gives a demo engine its profile.
pub const PROFILE_VAR: &str = "TESSERA_DEMO_PROFILE";

/// A real engine's timescales and faults, at real speed (seconds), compressed by `speed`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Profile {
    /// How many times faster than real time it all runs (1: real time).
    pub speed: f64,
    /// Its load takes a time drawn from `[shortest, longest]` seconds.
    pub load_s: [f64; 2],
    /// The weights' part of its share, loaded shard by shard; the KV cache takes the rest once they are in.
    pub weights: f64,
    /// How many shards its weights come in: a progress line each.
    pub shards: u32,
    /// Time to the first byte of each answer, seconds.
    pub first_token_s: f64,
    /// After SIGTERM it goes on holding its memory this long before it exits.
    pub exit_delay_s: f64,
    /// It ignores SIGTERM (the supervisor's SIGKILL ends it).
    pub ignore_sigterm: bool,
    /// How much slower each answer is for each request its GPU's other engines are answering: 0.5 makes
    /// an answer half as slow again beside one busy neighbour (on simulated GPUs).
    pub neighbour_slowdown: f64,
    /// It crashes when this many requests have been answered.
    pub crash_after: Option<u64>,
    /// It hangs (no answer, its health check unanswered) when this many requests have been answered.
    pub hang_after: Option<u64>,
}

impl Default for Profile {
    fn default() -> Profile {
        Profile {
            speed: 1.0,
            load_s: [0.2, 0.2],
            weights: 0.6,
            shards: 4,
            first_token_s: 0.0,
            exit_delay_s: 0.0,
            neighbour_slowdown: 0.5,
            ignore_sigterm: false,
            crash_after: None,
            hang_after: None,
        }
    }
}

impl Profile {
    /// The profile `TESSERA_DEMO_PROFILE` gives, over the load `TESSERA_DEMO_START_MS` sets where the
    /// profile does not say.
    pub fn from_env() -> Result<Profile, String> {
        let start_s = std::env::var("TESSERA_DEMO_START_MS")
            .ok()
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0.2, |ms| ms / 1000.0);
        let Ok(text) = std::env::var(PROFILE_VAR) else {
            return Ok(Profile {
                load_s: [start_s, start_s],
                ..Profile::default()
            });
        };
        let profile: Profile = serde_json::from_str(&text)
            .map_err(|e| format!("{PROFILE_VAR} is not a profile: {e}"))?;
        if profile.speed.is_nan() || profile.speed <= 0.0 || !(0.0..=1.0).contains(&profile.weights)
        {
            return Err(format!(
                "{PROFILE_VAR}: speed must be above 0 and weights from 0 to 1"
            ));
        }
        Ok(profile)
    }

    /// `seconds` of real time at this profile's speed.
    pub fn scaled(&self, seconds: f64) -> Duration {
        Duration::from_secs_f64((seconds / self.speed).max(0.0))
    }

    /// This load's length, drawn by `pick` (0 to 1) from the range.
    pub fn load(&self, pick: f64) -> Duration {
        let [shortest, longest] = self.load_s;
        self.scaled(shortest + (longest - shortest).max(0.0) * pick.clamp(0.0, 1.0))
    }
}

/// The simulated GPUs the engine allocates from, where it has some.
pub struct Memory {
    sim: SimulatedGpus,
    gpus: Vec<GpuRef>,
    share: Bytes,
}

impl Memory {
    /// From `TESSERA_SIM_DIR`, `TESSERA_SIM_GPUS` and its share (`TESSERA_GPU_MEMORY_BYTES`, exact).
    pub fn from_env() -> Option<Memory> {
        let dir = std::env::var(SIM_DIR_VAR).ok()?;
        let gpus = std::env::var(SIM_GPUS_VAR)
            .ok()?
            .split(',')
            .filter_map(|g| g.parse().ok())
            .collect();
        let bytes: u64 = std::env::var("TESSERA_GPU_MEMORY_BYTES")
            .ok()?
            .parse()
            .ok()?;
        Some(Memory {
            sim: SimulatedGpus::open(std::path::Path::new(&dir)),
            gpus,
            share: Bytes(bytes),
        })
    }

    /// Takes `part` (0 to 1) of its share more on each of its GPUs; CUDA's error where one refuses.
    pub fn take(&self, part: f64) -> Result<(), String> {
        let bytes = Bytes((self.share.get() as f64 * part) as u64);
        for gpu in &self.gpus {
            self.sim
                .allocate(gpu, std::process::id(), bytes, false)
                .map_err(|e| format!("torch.OutOfMemoryError: {e}"))?;
        }
        Ok(())
    }
}

/// A request being answered on the engine's simulated GPUs: its neighbours see it until it is dropped.
pub struct Answering {
    memory: std::sync::Arc<Memory>,
    /// The requests the GPUs' other engines were answering as it began.
    pub neighbours: u32,
}

impl Memory {
    /// A request begins: counted on each of its GPUs until the guard is dropped.
    pub fn answering(self: &std::sync::Arc<Self>) -> Answering {
        let pid = std::process::id();
        let neighbours = self
            .gpus
            .iter()
            .filter_map(|gpu| self.sim.answering(gpu, pid, true).ok())
            .max()
            .unwrap_or(0);
        Answering {
            memory: self.clone(),
            neighbours,
        }
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        for gpu in &self.memory.gpus {
            let _ = self.memory.sim.answering(gpu, std::process::id(), false);
        }
    }
}

/// Loads as `profile` says: the weights shard by shard, printing vLLM's progress line after each, then
/// the KV cache; on a simulated GPU each part is really allocated.
pub async fn load(profile: &Profile, memory: Option<&Memory>, pick: f64) -> Result<(), String> {
    let took = profile.load(pick);
    let shards = profile.shards.max(1);
    // The weights take most of a load; the KV cache's profiling run the last tenth.
    let per_shard = took.mul_f64(0.9) / shards;
    for shard in 1..=shards {
        tokio::time::sleep(per_shard).await;
        if let Some(memory) = memory {
            memory.take(profile.weights / f64::from(shards))?;
        }
        println!(
            "Loading safetensors checkpoint shards: {:>3}% Completed | {shard}/{shards}",
            shard * 100 / shards
        );
    }
    tokio::time::sleep(took.mul_f64(0.1)).await;
    if let Some(memory) = memory {
        memory.take(1.0 - profile.weights)?;
        println!(
            "KV cache: {:.2} GiB allocated",
            memory.share.get() as f64 * (1.0 - profile.weights) / f64::from(1u32 << 30)
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_three_minute_load_at_sixty_times_speed_takes_three_seconds() {
        let profile: Profile =
            serde_json::from_str(r#"{"speed": 60, "load_s": [120, 240]}"#).unwrap();
        assert_eq!(profile.load(0.0), Duration::from_secs(2));
        assert_eq!(profile.load(0.5), Duration::from_secs(3));
        assert_eq!(profile.load(1.0), Duration::from_secs(4));
        assert!(serde_json::from_str::<Profile>(r#"{"sped": 2}"#).is_err());
    }
}
