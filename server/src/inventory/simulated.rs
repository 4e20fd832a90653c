//! A simulated GPU driver for the demo fleet (`--simulate-gpus DIR`): GPUs that engines really allocate
//! from. Each GPU is a file in `DIR` with its total and what each process holds; a process allocates under
//! the GPU's lock, and an allocation past the total is refused the way CUDA refuses one (the demo engine
//! then dies, as a real engine does). A process that has exited holds nothing: the driver frees a dead
//! process's memory, and the simulation does so at its next look. Readings (used memory, per-process
//! memory) are made from what is held, so that "never overfills a GPU" is something a test observes, and
//! every refusal is written down (`refusals.jsonl`) with what held the GPU then.

use placement::{Bytes, GpuRef};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The variable that tells a demo engine where the simulated GPUs are.
pub const SIM_DIR_VAR: &str = "TESSERA_SIM_DIR";
/// The variable that names a demo engine's simulated GPUs: `atlas:0,atlas:1`.
pub const SIM_GPUS_VAR: &str = "TESSERA_SIM_GPUS";

/// Held by no process (a desktop, the driver itself): never freed.
const NO_PROCESS: u32 = 0;

/// One simulated GPU as its file keeps it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
struct Gpu {
    total: u64,
    /// What each process holds, by PID.
    holds: BTreeMap<u32, Hold>,
    /// The requests each process is answering now, by PID: its neighbours slow down while it works.
    #[serde(default)]
    answering: BTreeMap<u32, u32>,
}

impl Gpu {
    /// What every process holds, together.
    fn used(&self) -> u64 {
        self.holds.values().map(|h| h.bytes).sum()
    }

    /// `pid` takes `bytes` more, held by an engine or (`outside`) by another program.
    fn take(&mut self, pid: u32, bytes: u64, outside: bool) {
        self.holds
            .entry(pid)
            .or_insert(Hold { bytes: 0, outside })
            .bytes += bytes;
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
struct Hold {
    bytes: u64,
    /// Held by a program other than an engine (a notebook, a spike the soak makes).
    #[serde(default)]
    outside: bool,
}

/// A refused allocation, as `refusals.jsonl` keeps it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Refusal {
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// The GPU, `machine:index`.
    pub gpu: String,
    /// Who asked.
    pub pid: u32,
    /// Whether who asked is a program other than an engine (a notebook, a spike the soak makes).
    #[serde(default)]
    pub by_outside: bool,
    /// What it asked for, in bytes.
    pub asked: u64,
    /// What it held there already.
    pub held: u64,
    /// The GPU's memory.
    pub total: u64,
    /// What the other engines' processes held.
    pub engines: u64,
    /// What programs other than engines held.
    pub outside: u64,
}

impl Refusal {
    /// Whether the engines alone left no room for an engine's allocation: Tessera placed or started more
    /// than the GPU holds. A refusal only because another program took memory meanwhile is that program's
    /// doing, and so is a refusal of another program.
    pub fn overfill(&self) -> bool {
        !self.by_outside && self.engines + self.held + self.asked > self.total
    }
}

/// Why the simulation refused.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Past the GPU's total: CUDA's own words.
    #[error("CUDA out of memory. Tried to allocate {asked}. {gpu} has a total capacity of {total} of which {free} is free.")]
    OutOfMemory {
        /// The GPU.
        gpu: GpuRef,
        /// What was asked.
        asked: Bytes,
        /// Its memory.
        total: Bytes,
        /// What was free.
        free: Bytes,
    },
    /// No such simulated GPU.
    #[error("there is no simulated GPU {0}")]
    NoGpu(GpuRef),
    /// Its file could not be read or written.
    #[error("the simulated GPU {gpu} could not be read or written: {source}")]
    Io {
        /// The GPU.
        gpu: GpuRef,
        /// Why.
        source: std::io::Error,
    },
}

/// What one simulated GPU holds now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reading {
    /// Its memory.
    pub total: Bytes,
    /// In use by anyone.
    pub used: Bytes,
    /// What each live process holds (PID 0: held by no process).
    pub processes: Vec<(u32, Bytes)>,
    /// The requests its processes are answering now.
    pub answering: u32,
}

/// The simulated GPUs in one folder.
#[derive(Debug, Clone)]
pub struct SimulatedGpus {
    dir: PathBuf,
}

impl SimulatedGpus {
    /// The simulated GPUs in `dir`, made where missing with each GPU's total and what is held outside it
    /// from the start (`gpus`: GPU, total, held outside). A GPU made before keeps what live processes hold.
    pub fn create(dir: &Path, gpus: &[(GpuRef, Bytes, Bytes)]) -> Result<SimulatedGpus, SimError> {
        let sim = SimulatedGpus::open(dir);
        for (gpu, total, outside) in gpus {
            std::fs::create_dir_all(dir).map_err(|source| io(gpu, source))?;
            sim.with(gpu, true, |state| {
                state.total = total.get();
                state.holds.insert(
                    NO_PROCESS,
                    Hold {
                        bytes: outside.get(),
                        outside: true,
                    },
                );
                Ok(())
            })?;
        }
        Ok(sim)
    }

    /// The simulated GPUs already made in `dir`.
    pub fn open(dir: &Path) -> SimulatedGpus {
        SimulatedGpus {
            dir: dir.to_path_buf(),
        }
    }

    fn path(&self, gpu: &GpuRef) -> PathBuf {
        self.dir.join(format!("{}-{}.json", gpu.machine, gpu.index))
    }

    /// Runs `f` on `gpu`'s state under its lock, with what dead processes held freed, and keeps what it
    /// leaves.
    fn with<T>(
        &self,
        gpu: &GpuRef,
        create: bool,
        f: impl FnOnce(&mut Gpu) -> Result<T, SimError>,
    ) -> Result<T, SimError> {
        let path = self.path(gpu);
        if !create && !path.exists() {
            return Err(SimError::NoGpu(gpu.clone()));
        }
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_extension("lock"))
            .map_err(|source| io(gpu, source))?;
        lock.lock().map_err(|source| io(gpu, source))?;
        let mut state: Gpu = match std::fs::read(&path) {
            Ok(text) => serde_json::from_slice(&text).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Gpu::default(),
            Err(source) => return Err(io(gpu, source)),
        };
        state
            .holds
            .retain(|pid, _| *pid == NO_PROCESS || alive(*pid));
        state.answering.retain(|pid, n| *n > 0 && alive(*pid));
        let answer = f(&mut state)?;
        let text = serde_json::to_vec(&state).expect("a GPU's state is JSON");
        let next = path.with_extension("next");
        std::fs::write(&next, text).map_err(|source| io(gpu, source))?;
        std::fs::rename(&next, &path).map_err(|source| io(gpu, source))?;
        drop(lock);
        Ok(answer)
    }

    /// Simulates `gpu` with `total`, where it is not yet (a cluster's node met for the first time); one
    /// simulated already keeps what it holds.
    pub fn ensure(&self, gpu: &GpuRef, total: Bytes) -> Result<(), SimError> {
        if self.path(gpu).exists() {
            return Ok(());
        }
        std::fs::create_dir_all(&self.dir).map_err(|source| io(gpu, source))?;
        self.with(gpu, true, |state| {
            if state.total == 0 {
                state.total = total.get();
            }
            Ok(())
        })
    }

    /// `pid` takes `bytes` more of `gpu`; refused (and written down) past the GPU's total.
    pub fn allocate(
        &self,
        gpu: &GpuRef,
        pid: u32,
        bytes: Bytes,
        outside: bool,
    ) -> Result<(), SimError> {
        let refused = self.with(gpu, false, |state| {
            if state.used() + bytes.get() <= state.total {
                state.take(pid, bytes.get(), outside);
                return Ok(None);
            }
            let (engines, others): (Vec<_>, Vec<_>) = state
                .holds
                .iter()
                .filter(|(p, _)| **p != pid)
                .map(|(_, h)| *h)
                .partition(|h| !h.outside);
            Ok(Some(Refusal {
                at_ms: now_ms(),
                gpu: format!("{}:{}", gpu.machine, gpu.index),
                pid,
                by_outside: outside,
                asked: bytes.get(),
                held: state.holds.get(&pid).map_or(0, |h| h.bytes),
                total: state.total,
                engines: engines.iter().map(|h| h.bytes).sum(),
                outside: others.iter().map(|h| h.bytes).sum(),
            }))
        })?;
        let Some(refusal) = refused else {
            return Ok(());
        };
        self.write_down(gpu, &refusal)?;
        Err(SimError::OutOfMemory {
            gpu: gpu.clone(),
            asked: bytes,
            total: Bytes(refusal.total),
            free: Bytes(
                refusal
                    .total
                    .saturating_sub(refusal.engines + refusal.outside + refusal.held),
            ),
        })
    }

    /// Another program, `pid`, takes all that is free on `gpu` but `leave`, in one step (between a
    /// reading and an allocation an engine may take more): what it took.
    pub fn fill(&self, gpu: &GpuRef, pid: u32, leave: Bytes) -> Result<Bytes, SimError> {
        self.with(gpu, false, |state| {
            let took = state
                .total
                .saturating_sub(state.used())
                .saturating_sub(leave.get());
            state.take(pid, took, true);
            Ok(Bytes(took))
        })
    }

    /// `pid` begins answering a request on `gpu` (or ends one, where `begins` is false); says how many
    /// requests the GPU's other processes are answering now.
    pub fn answering(&self, gpu: &GpuRef, pid: u32, begins: bool) -> Result<u32, SimError> {
        self.with(gpu, false, |state| {
            let mine = state.answering.entry(pid).or_default();
            *mine = if begins {
                *mine + 1
            } else {
                mine.saturating_sub(1)
            };
            Ok(state
                .answering
                .iter()
                .filter(|(p, _)| **p != pid)
                .map(|(_, n)| n)
                .sum())
        })
    }

    /// `pid` frees all it holds on `gpu`.
    pub fn release(&self, gpu: &GpuRef, pid: u32) -> Result<(), SimError> {
        self.with(gpu, false, |state| {
            state.holds.remove(&pid);
            Ok(())
        })
    }

    /// What `gpu` holds now.
    pub fn read(&self, gpu: &GpuRef) -> Result<Reading, SimError> {
        self.with(gpu, false, |state| {
            let processes: Vec<(u32, Bytes)> = state
                .holds
                .iter()
                .filter(|(_, h)| h.bytes > 0)
                .map(|(pid, h)| (*pid, Bytes(h.bytes)))
                .collect();
            Ok(Reading {
                total: Bytes(state.total),
                used: processes.iter().map(|(_, b)| *b).sum(),
                processes,
                answering: state.answering.values().sum(),
            })
        })
    }

    fn write_down(&self, gpu: &GpuRef, refusal: &Refusal) -> Result<(), SimError> {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("refusals.jsonl"))
            .map_err(|source| io(gpu, source))?;
        let line = serde_json::to_string(refusal).expect("a refusal is JSON");
        writeln!(log, "{line}").map_err(|source| io(gpu, source))
    }

    /// Every refusal so far.
    pub fn refusals(&self) -> Vec<Refusal> {
        let Ok(text) = std::fs::read_to_string(self.dir.join("refusals.jsonl")) else {
            return Vec::new();
        };
        text.lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

fn io(gpu: &GpuRef, source: std::io::Error) -> SimError {
    SimError::Io {
        gpu: gpu.clone(),
        source,
    }
}

/// Whether `pid` runs: a zombie, exited and not yet waited for, holds no GPU memory.
fn alive(pid: u32) -> bool {
    crate::runtime::process::start_ticks(pid).is_some()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allocation_past_the_total_is_refused_as_cuda_refuses_one_and_a_dead_process_holds_nothing(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let gpu = GpuRef::new("majin", 0);
        let sim = SimulatedGpus::create(dir.path(), &[(gpu.clone(), Bytes::gb(8), Bytes::gb(1))])
            .unwrap();
        let me = std::process::id();
        sim.allocate(&gpu, me, Bytes::gb(5), false).unwrap();
        let refused = sim.allocate(&gpu, me, Bytes::gb(4), false).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "CUDA out of memory. Tried to allocate 4 GB. GPU 0 of majin has a total capacity of 8 GB of which 2 GB is free."
        );
        let refusals = sim.refusals();
        assert_eq!(refusals.len(), 1);
        assert!(refusals[0].overfill(), "{refusals:?}");
        let reading = sim.read(&gpu).unwrap();
        assert_eq!(reading.used, Bytes::gb(6));
        assert_eq!(reading.processes, [(0, Bytes::gb(1)), (me, Bytes::gb(5))]);
        // A process that has exited holds nothing.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        sim.allocate(&gpu, pid, Bytes::gb(1), false).ok();
        assert_eq!(sim.read(&gpu).unwrap().used, Bytes::gb(6));
        sim.release(&gpu, me).unwrap();
        assert_eq!(sim.read(&gpu).unwrap().used, Bytes::gb(1));
    }

    #[test]
    fn a_refusal_only_because_another_program_took_memory_is_no_overfill() {
        let dir = tempfile::tempdir().unwrap();
        let gpu = GpuRef::new("majin", 0);
        let sim =
            SimulatedGpus::create(dir.path(), &[(gpu.clone(), Bytes::gb(8), Bytes::ZERO)]).unwrap();
        let me = std::process::id();
        sim.allocate(&gpu, me, Bytes::gb(4), false).unwrap();
        // A spike outside Tessera, held by a process of its own.
        let mut spike = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        sim.allocate(&gpu, spike.id(), Bytes::gb(3), true).unwrap();
        let mut engine = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        assert!(sim
            .allocate(&gpu, engine.id(), Bytes::gb(2), false)
            .is_err());
        assert!(!sim.refusals()[0].overfill());
        // Nor is a refusal of the other program, whatever the engines hold.
        assert!(sim.allocate(&gpu, spike.id(), Bytes::gb(3), true).is_err());
        let refusal = &sim.refusals()[1];
        assert!(refusal.by_outside && !refusal.overfill(), "{refusal:?}");
        spike.kill().unwrap();
        spike.wait().unwrap();
        sim.allocate(&gpu, engine.id(), Bytes::gb(2), false)
            .unwrap();
        engine.kill().unwrap();
        engine.wait().unwrap();
    }

    #[test]
    fn a_program_that_fills_a_gpu_while_an_engine_loads_takes_what_is_free_then_and_the_engine_s_next_part_is_refused(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let gpu = GpuRef::new("majin", 0);
        // Thousands of parts: the engine is still loading when the program fills the GPU.
        let sim =
            SimulatedGpus::create(dir.path(), &[(gpu.clone(), Bytes::gb(8_000), Bytes::ZERO)])
                .unwrap();
        // An engine loads in parts of 2 GB, as fast as it can, until one is refused.
        let engine = {
            let (sim, gpu) = (sim.clone(), gpu.clone());
            std::thread::spawn(move || {
                let me = std::process::id();
                while sim.allocate(&gpu, me, Bytes::gb(2), false).is_ok() {}
            })
        };
        let mut notebook = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        while sim.read(&gpu).unwrap().used == Bytes::ZERO {}
        let took = sim.fill(&gpu, notebook.id(), Bytes::gb(1)).unwrap();
        engine.join().unwrap();
        let now = sim.read(&gpu).unwrap();
        assert!(took > Bytes::ZERO && now.used <= now.total, "{now:?}");
        let refusals = sim.refusals();
        assert!(
            refusals
                .iter()
                .all(|r| r.pid == std::process::id() && !r.overfill()),
            "{refusals:?}"
        );
        notebook.kill().unwrap();
        notebook.wait().unwrap();
    }
}
