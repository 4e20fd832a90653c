//! How a demo engine behaves like a real one (`TESSERA_DEMO_PROFILE`, a JSON object): a load that takes
//! seconds to minutes, its memory growing as it loads (the weights shard by shard, then the KV cache block
//! vLLM sizes from its share), slower answers, an exit that lingers after SIGTERM, and faults on request:
//! a crash or a hang after so many requests, SIGTERM ignored, a helper process that outlives it. One time-compression factor (`speed`) makes
//! a 3-minute load take 3 s in CI; the same profile at speed 1 takes real time. On a simulated GPU
//! (`TESSERA_SIM_DIR`) the memory is really allocated, and an allocation past the GPU's total kills the
//! engine as CUDA's out-of-memory error kills a real one.

use crate::inventory::simulated::{SimulatedGpus, SIM_DIR_VAR, SIM_GPUS_VAR};
use placement::{Bytes, GpuRef};
use serde::Deserialize;
use std::os::unix::process::CommandExt;
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
    /// The part of its share (0 to `weights`) that a helper process of its own holds: in a session of its
    /// own, deaf to SIGTERM, it outlives the engine (as a compile worker or a leaked worker process does)
    /// until Tessera's clean-up after the stop ends it.
    pub helper: f64,
    /// The part of its share (from `weights` to 1) it holds once loaded where it sizes itself by neither
    /// vLLM's nor SGLang's rule: llama.cpp sized to its share holds 90 to 100 % of it.
    pub holds: f64,
    /// The part of its share it keeps on its GPUs asleep: the CUDA context and what the engine keeps.
    pub asleep_holds: f64,
    /// How fast its weights come back from host memory as it wakes from sleep level 1, GB/s (a PCIe 4.0
    /// x16 link carries about 25).
    pub host_to_device_gb_s: f64,
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
            helper: 0.0,
            holds: 1.0,
            asleep_holds: 0.05,
            host_to_device_gb_s: 25.0,
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
        if profile.speed.is_nan()
            || profile.speed <= 0.0
            || !(0.0..=1.0).contains(&profile.weights)
            || !(0.0..=profile.weights).contains(&profile.helper)
            || !(profile.weights..=1.0).contains(&profile.holds)
            || !(0.0..=profile.weights).contains(&profile.asleep_holds)
            || profile.host_to_device_gb_s.is_nan()
            || profile.host_to_device_gb_s <= 0.0
        {
            return Err(format!(
                "{PROFILE_VAR}: speed must be above 0, weights from 0 to 1, helper from 0 to weights, holds from weights to 1, asleep_holds from 0 to weights and host_to_device_gb_s above 0"
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
        let bytes = self.part(part);
        for gpu in &self.gpus {
            self.take_on(gpu, bytes)?;
        }
        Ok(())
    }

    /// What it holds on each of its GPUs now.
    pub fn holding(&self) -> Vec<Bytes> {
        let me = [std::process::id()];
        self.gpus.iter().map(|g| self.held_by(g, &me)).collect()
    }

    /// Frees all it holds on its GPUs but `part` of its share on each: what it keeps asleep.
    pub fn keep_only(&self, part: f64) -> Result<(), String> {
        for gpu in &self.gpus {
            self.sim
                .release(gpu, std::process::id())
                .map_err(|e| e.to_string())?;
        }
        self.take(part)
    }

    /// Holds `bytes` on each of its GPUs again (what [`Memory::holding`] said), in place of what it holds
    /// now; CUDA's error where a GPU refuses.
    pub fn hold_again(&self, bytes: &[Bytes]) -> Result<(), String> {
        let me = std::process::id();
        for (gpu, want) in self.gpus.iter().zip(bytes) {
            let now = self.held_by(gpu, &[me]);
            self.take_on(gpu, want.saturating_sub(now))?;
        }
        Ok(())
    }

    fn part(&self, part: f64) -> Bytes {
        Bytes((self.share.get() as f64 * part) as u64)
    }

    fn take_on(&self, gpu: &GpuRef, bytes: Bytes) -> Result<(), String> {
        self.sim
            .allocate(gpu, std::process::id(), bytes, false)
            .map_err(|e| format!("torch.OutOfMemoryError: {e}"))
    }

    /// Each of its GPUs' total and what is free on it now, as `torch.cuda.mem_get_info` says.
    fn free(&self) -> Result<Vec<(Bytes, Bytes)>, String> {
        self.gpus
            .iter()
            .map(|gpu| {
                let now = self.sim.read(gpu).map_err(|e| e.to_string())?;
                Ok((now.total, now.total.saturating_sub(now.used)))
            })
            .collect()
    }

    /// What `pids` hold on `gpu` now.
    fn held_by(&self, gpu: &GpuRef, pids: &[u32]) -> Bytes {
        self.sim.read(gpu).map_or(Bytes(0), |now| {
            now.processes
                .iter()
                .filter(|(pid, _)| pids.contains(pid))
                .map(|(_, b)| *b)
                .sum()
        })
    }
}

/// How the engine it stands in for sizes its KV cache, read from that engine's command line.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum KvSizing {
    /// vLLM's `--gpu-memory-utilization U`: U of each GPU's total is its own, less what it holds once its
    /// weights are in; it refuses to start where less than that is free.
    Utilization(f64),
    /// SGLang's `--mem-fraction-static F`: F of the memory free at its start holds its weights and its KV
    /// cache, whatever its neighbours do meanwhile (its pool is what is free after the weights, less the
    /// rest of what was free at its start), the least free of its GPUs counting for each of them.
    FreeFraction(f64),
    /// Anything else: the rest of its share.
    Share,
}

impl KvSizing {
    /// As the command line `command` sizes it.
    pub fn of(command: &[String]) -> KvSizing {
        let value = |flag: &str| {
            command
                .iter()
                .position(|a| a == flag)
                .and_then(|i| command.get(i + 1)?.parse::<f64>().ok())
        };
        if let Some(u) = value("--gpu-memory-utilization") {
            KvSizing::Utilization(u)
        } else if let Some(f) = value("--mem-fraction-static") {
            KvSizing::FreeFraction(f)
        } else {
            KvSizing::Share
        }
    }
}

/// The part of an SGLang engine's load before it reads what is free: its imports.
const IMPORTS: f64 = 0.3;

const GIB: f64 = (1u64 << 30) as f64;

fn gib(bytes: Bytes) -> f64 {
    bytes.get() as f64 / GIB
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
/// the KV cache, sized as the engine it stands in for sizes it (`sizing`); on a simulated GPU each part
/// is really allocated, and refused as the real engine refuses it. A helper process, where the profile
/// has one, holds its part from the first shard on.
pub async fn load(
    profile: &Profile,
    memory: Option<&Memory>,
    pick: f64,
    sizing: KvSizing,
) -> Result<(), String> {
    let took = profile.load(pick);
    let shards = profile.shards.max(1);
    // SGLang reads what is free once its imports are done (10 to 60 s into a real start): the first
    // `IMPORTS` of its load here. What its neighbours free meanwhile becomes its fraction's.
    let imports = match sizing {
        KvSizing::FreeFraction(_) => took.mul_f64(IMPORTS),
        KvSizing::Utilization(_) | KvSizing::Share => Duration::ZERO,
    };
    tokio::time::sleep(imports).await;
    let at_start = memory.map(Memory::free).transpose()?;
    if let (Some(at_start), KvSizing::Utilization(u)) = (&at_start, sizing) {
        for (total, free) in at_start {
            let wanted = Bytes((total.get() as f64 * u) as u64);
            if *free < wanted {
                return Err(format!(
                    "ValueError: Free memory on device ({:.2}/{:.2} GiB) on startup is less than desired GPU memory utilization ({u}, {:.2} GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes.",
                    gib(*free), gib(*total), gib(wanted)
                ));
            }
        }
    }
    let mut helper = None;
    // The weights take most of a load; the KV cache's profiling run the last tenth.
    let per_shard = took.mul_f64(0.9).saturating_sub(imports) / shards;
    for shard in 1..=shards {
        tokio::time::sleep(per_shard).await;
        if let Some(memory) = memory {
            if shard == 1 && profile.helper > 0.0 {
                helper = Some(spawn_helper(memory.part(profile.helper)).await?);
            }
            memory.take((profile.weights - profile.helper) / f64::from(shards))?;
        }
        println!(
            "Loading safetensors checkpoint shards: {:>3}% Completed | {shard}/{shards}",
            shard * 100 / shards
        );
    }
    tokio::time::sleep(took.mul_f64(0.1)).await;
    let (Some(memory), Some(at_start)) = (memory, at_start) else {
        return Ok(());
    };
    let ours: Vec<u32> = std::iter::once(std::process::id()).chain(helper).collect();
    let now = memory.free()?;
    // SGLang sizes one pool for all its GPUs (its tensor-parallel ranks), by the least free on any of
    // them at each reading.
    let least = |readings: &[(Bytes, Bytes)]| readings.iter().map(|(_, free)| *free).min();
    let (least_at_start, least_now) = (least(&at_start), least(&now));
    let mut kv_cache = Bytes(0);
    for (gpu, (total, _)) in memory.gpus.iter().zip(at_start) {
        let bytes = match sizing {
            KvSizing::Share => memory.part(profile.holds - profile.weights),
            KvSizing::Utilization(u) => {
                Bytes((total.get() as f64 * u) as u64).saturating_sub(memory.held_by(gpu, &ours))
            }
            KvSizing::FreeFraction(f) => {
                let (free_at_start, free) = (
                    least_at_start.unwrap_or_default(),
                    least_now.unwrap_or_default(),
                );
                let rest = Bytes((free_at_start.get() as f64 * (1.0 - f)) as u64);
                if free <= rest {
                    return Err("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.".to_owned());
                }
                free.saturating_sub(rest)
            }
        };
        memory.take_on(gpu, bytes)?;
        kv_cache = kv_cache.max(bytes);
    }
    println!("KV cache: {:.2} GiB allocated", gib(kv_cache));
    Ok(())
}

/// The variable that makes a demo engine a helper of another, holding this many bytes of its GPUs.
pub const HELPER_VAR: &str = "TESSERA_DEMO_HELPER_BYTES";

/// Starts a helper holding `bytes` of each of the engine's GPUs, in a session of its own: its PID.
async fn spawn_helper(bytes: Bytes) -> Result<u32, String> {
    let exe = std::env::current_exe().map_err(|e| format!("no helper: {e}"))?;
    let child = std::process::Command::new(exe)
        .arg("demo-engine")
        .env(HELPER_VAR, bytes.get().to_string())
        .process_group(0)
        .stdin(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("no helper: {e}"))?;
    // Its allocation, made before the engine goes on: the engine's own then counts it as held.
    let memory = Memory::from_env().ok_or("no helper: no simulated GPUs")?;
    for _ in 0..200 {
        if memory
            .gpus
            .iter()
            .all(|g| memory.held_by(g, &[child.id()]).get() > 0)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "a helper process, PID {}, holds {bytes} of each GPU",
        child.id()
    );
    Ok(child.id())
}

/// A helper: holds `bytes` of each of its engine's GPUs, deaf to SIGTERM, until SIGKILL ends it.
pub async fn help(bytes: u64) -> Result<(), String> {
    let memory = Memory::from_env().ok_or("a helper needs simulated GPUs")?;
    for gpu in &memory.gpus {
        memory.take_on(gpu, Bytes(bytes))?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    loop {
        term.recv().await;
    }
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

    const GB: u64 = 1_000_000_000;

    /// Simulated GPU `sim:0` of 80 GB, with `others` held by another process, and an engine's memory there
    /// with a share of `share` GB.
    fn gpu(dir: &std::path::Path, others: u64, share: u64) -> Memory {
        let gpu: GpuRef = "sim:0".parse().unwrap();
        let sim = SimulatedGpus::create(dir, &[(gpu.clone(), Bytes(80 * GB), Bytes(0))]).unwrap();
        // A live process other than this one: the test's parent.
        sim.allocate(
            &gpu,
            std::os::unix::process::parent_id(),
            Bytes(others * GB),
            false,
        )
        .unwrap();
        Memory {
            sim,
            gpus: vec![gpu],
            share: Bytes(share * GB),
        }
    }

    fn held(memory: &Memory) -> u64 {
        memory.held_by(&memory.gpus[0], &[std::process::id()]).get()
    }

    #[test]
    fn the_kv_cache_is_sized_from_the_command_line_as_vllm_and_sglang_size_theirs() {
        let command =
            |words: &str| -> Vec<String> { words.split(' ').map(str::to_owned).collect() };
        assert_eq!(
            KvSizing::of(&command("vllm serve m --gpu-memory-utilization 0.25")),
            KvSizing::Utilization(0.25)
        );
        assert_eq!(
            KvSizing::of(&command(
                "python3 -m sglang.launch_server --mem-fraction-static 0.5"
            )),
            KvSizing::FreeFraction(0.5)
        );
        assert_eq!(KvSizing::of(&command("llama-server -m m")), KvSizing::Share);
    }

    #[tokio::test]
    async fn sglang_takes_its_fraction_of_what_was_free_at_its_start_and_vllm_refuses_to_start_without_its_part_free(
    ) {
        let profile = Profile {
            load_s: [0.0, 0.0],
            weights: 0.5,
            ..Profile::default()
        };
        // SGLang, given 20 GB as a fraction of the 40 GB free: its weights and its pool are 20 GB.
        let dir = tempfile::tempdir().unwrap();
        let memory = gpu(dir.path(), 40, 20);
        load(&profile, Some(&memory), 0.0, KvSizing::FreeFraction(0.5))
            .await
            .unwrap();
        assert_eq!(held(&memory), 20 * GB);

        // The same fraction where more was free at its start than Tessera reckoned (a neighbour not yet
        // loaded): it takes more than its share.
        let dir = tempfile::tempdir().unwrap();
        let memory = gpu(dir.path(), 20, 20);
        load(&profile, Some(&memory), 0.0, KvSizing::FreeFraction(0.5))
            .await
            .unwrap();
        assert_eq!(held(&memory), 30 * GB);

        // vLLM, told to use a quarter of the GPU where less is free, refuses as vLLM does.
        let dir = tempfile::tempdir().unwrap();
        let memory = gpu(dir.path(), 70, 20);
        let refused = load(&profile, Some(&memory), 0.0, KvSizing::Utilization(0.25))
            .await
            .unwrap_err();
        assert!(
            refused.starts_with("ValueError: Free memory on device (9.31/74.51 GiB)"),
            "{refused}"
        );
        assert_eq!(held(&memory), 0);

        // Where it is free, its weights and KV cache come to its part of the GPU.
        let dir = tempfile::tempdir().unwrap();
        let memory = gpu(dir.path(), 40, 20);
        load(&profile, Some(&memory), 0.0, KvSizing::Utilization(0.25))
            .await
            .unwrap();
        assert_eq!(held(&memory), 20 * GB);
    }
}
