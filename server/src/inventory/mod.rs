//! Where the server learns what GPUs there are: the machine it runs on (NVML), machines described in an
//! inventory file, and a demo fleet for trying Tessera without GPUs.
//!
//! - [`LocalGpus`]: the GPUs of this machine, behind a trait so that everything above it is testable
//!   without a GPU; [`nvml::NvmlGpus`] is the real one.
//! - [`file`]: the inventory file (TOML).
//! - [`demo`]: the demo fleet and a sample model catalog.
//! - [`ray`]: a Ray cluster's labelled nodes, and the client of its dashboard's APIs.

pub mod demo;
pub mod file;
pub mod nvml;
pub mod ray;
pub mod simulated;

use placement::{Bytes, Machine};
use serde::{Deserialize, Serialize};

/// Reads the GPUs of the machine the server runs on.
pub trait LocalGpus: Send + Sync {
    /// The machine as it is now: its GPUs with what each offers, and their live figures. The memory of
    /// `ours` (Tessera's own engines) is not counted as held outside.
    fn read(&self, ours: &Ours) -> Result<LocalReading, InventoryError>;

    /// The PIDs of the compute processes on GPU `index` now, as the driver lists them; none where it cannot
    /// say. A stopped engine's memory is free once none of its processes is listed.
    fn processes_on(&self, _index: u32) -> Vec<u32> {
        Vec::new()
    }

    /// What the processes `pids` hold on GPU `index` now, as the driver says per process; none where it
    /// cannot say.
    fn held_by(&self, _index: u32, _pids: &[u32]) -> Option<Bytes> {
        None
    }
}

/// What Tessera's own engines hold on this machine, so that a reading does not count it as held outside.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ours {
    /// Every process of every engine that runs.
    pub pids: Vec<u32>,
    /// What the running engines' shares take on each GPU (by index): what stands in for their processes'
    /// memory where the driver reports none of it (WSL2) or reports other PIDs (a container).
    pub shares: std::collections::BTreeMap<u32, Bytes>,
}

/// One reading of the local machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocalReading {
    /// The machine, with each GPU's memory held outside Tessera measured at this reading.
    pub machine: Machine,
    /// The live figures of each GPU, in the order of `machine.gpus`.
    pub live: Vec<GpuLive>,
}

/// What one GPU is doing at the moment of a reading: for the console and for splitting use among sharers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuLive {
    /// The GPU's index on its machine.
    pub index: u32,
    /// Percent of the last sample period in which a kernel ran; 0 where the GPU does not report it.
    pub utilisation_percent: u32,
    /// Power draw in milliwatts, where the GPU reports it.
    pub power_mw: Option<u32>,
    /// The GPU's temperature in °C, where it reports one.
    pub temperature_c: Option<u32>,
    /// Energy used since the driver loaded, in millijoules, where the GPU reports it.
    pub energy_mj: Option<u64>,
    /// Memory in use by anyone, Tessera included.
    pub used: Bytes,
    /// The compute processes on the GPU: pid and the memory each uses (0 where the driver does not say,
    /// as under WSL2).
    pub processes: Vec<(u32, Bytes)>,
    /// Why the GPU is marked unhealthy, when it is.
    pub problem: Option<String>,
}

/// Why the local machine could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// No NVIDIA driver: the library is missing or the driver is not running.
    #[error(
        "NVML could not be loaded, so there is no NVIDIA driver to read this machine's GPUs ({0}); \
         Tessera goes on with the inventory file and the demo fleet (--inventory, --demo)"
    )]
    NvmlUnavailable(String),
    /// The driver is there but NVML refused to start.
    #[error(
        "NVML could not start: {0}; check that this user may use the NVIDIA driver (try nvidia-smi). \
         Tessera goes on with the inventory file and the demo fleet (--inventory, --demo)"
    )]
    NvmlInit(nvml_wrapper::error::NvmlError),
    /// NVML started but could not answer a question about the whole machine.
    #[error("NVML could not report {what}: {source}; check the NVIDIA driver with nvidia-smi")]
    NvmlQuery {
        /// What was asked.
        what: &'static str,
        /// What NVML said.
        source: nvml_wrapper::error::NvmlError,
    },
    /// The machine's memory could not be read.
    #[error("could not read this machine's memory from /proc/meminfo: {0}; Tessera reads it there on Linux")]
    Memory(String),
}

/// Memory held outside Tessera on GPU `index`: NVML's used memory less what Tessera's own engines take
/// there, never below zero. What they take is what the driver reports for their processes; where it reports
/// none of them with a size (WSL2 gives no per-process figures; in a container the PIDs differ), their
/// shares stand in, so that Tessera's own engines are never counted as held outside.
pub fn held_outside(used: Bytes, ours: &Ours, index: u32, processes: &[(u32, Bytes)]) -> Bytes {
    let reported: Bytes = processes
        .iter()
        .filter(|(pid, _)| ours.pids.contains(pid))
        .map(|&(_, bytes)| bytes)
        .sum();
    let mine = if reported > Bytes::ZERO {
        reported
    } else {
        ours.shares.get(&index).copied().unwrap_or_default()
    };
    used.saturating_sub(mine)
}

/// This machine's name: its hostname from `/etc/hostname` or `HOSTNAME`, else `localhost`.
pub fn local_machine_name() -> String {
    choose_name(
        std::fs::read_to_string("/etc/hostname").ok(),
        std::env::var("HOSTNAME").ok(),
    )
}

/// The first of the two names that says something, else `localhost`.
fn choose_name(file: Option<String>, env: Option<String>) -> String {
    [file, env]
        .into_iter()
        .flatten()
        .map(|name| name.trim().to_owned())
        .find(|name| !name.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}

/// The CPU cores this process may use (1 when the OS does not say).
pub fn local_cpu_cores() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| u32::try_from(n.get()).unwrap_or(u32::MAX))
}

/// This machine's memory, from `MemTotal` in `/proc/meminfo`.
pub fn local_memory() -> Result<Bytes, InventoryError> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| InventoryError::Memory(e.to_string()))?;
    parse_meminfo(&text).ok_or_else(|| InventoryError::Memory("it has no MemTotal line".into()))
}

/// `MemTotal` from the text of `/proc/meminfo`, whose `kB` are 1024 bytes.
pub fn parse_meminfo(text: &str) -> Option<Bytes> {
    let line = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024).map(Bytes)
}

/// Whether the server runs under WSL2, where every container sees every GPU of the Windows PC.
pub fn running_under_wsl() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|r| osrelease_is_wsl(&r))
}

/// WSL kernels name themselves in their release string (`5.15.153.1-microsoft-standard-WSL2`).
fn osrelease_is_wsl(release: &str) -> bool {
    release.to_ascii_lowercase().contains("microsoft")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pids(pids: &[u32]) -> Ours {
        Ours {
            pids: pids.to_vec(),
            shares: Default::default(),
        }
    }

    #[test]
    fn held_outside_is_used_memory_less_tesseras_own_processes() {
        let processes = [
            (100, Bytes::gb(2)),
            (200, Bytes::gb(3)),
            (300, Bytes::gb(1)),
        ];
        assert_eq!(
            held_outside(Bytes::gb(7), &pids(&[100, 300]), 0, &processes),
            Bytes::gb(4)
        );
    }

    #[test]
    fn held_outside_is_all_used_memory_when_tessera_runs_nothing() {
        let processes = [(100, Bytes::gb(2))];
        assert_eq!(
            held_outside(Bytes::gb(3), &pids(&[]), 0, &processes),
            Bytes::gb(3)
        );
        assert_eq!(
            held_outside(Bytes::gb(3), &pids(&[999]), 0, &processes),
            Bytes::gb(3)
        );
    }

    #[test]
    fn held_outside_never_goes_below_zero() {
        // The used figure and the process list are read a moment apart, so they can disagree.
        let processes = [(100, Bytes::gb(5))];
        assert_eq!(
            held_outside(Bytes::gb(4), &pids(&[100]), 0, &processes),
            Bytes::ZERO
        );
    }

    #[test]
    fn where_the_driver_gives_no_per_process_figures_the_engines_shares_stand_in_for_them() {
        // WSL2: the processes are listed with no size; a container: other PIDs altogether.
        let ours = Ours {
            pids: vec![100],
            shares: [(0, Bytes::gb(2)), (1, Bytes::gb(3))].into(),
        };
        let no_sizes = [(100, Bytes::ZERO), (200, Bytes::ZERO)];
        assert_eq!(
            held_outside(Bytes::gb(5), &ours, 0, &no_sizes),
            Bytes::gb(3)
        );
        let other_pids = [(7, Bytes::gb(3))];
        assert_eq!(
            held_outside(Bytes::gb(4), &ours, 1, &other_pids),
            Bytes::gb(1)
        );
        assert_eq!(
            held_outside(Bytes::gb(4), &ours, 2, &other_pids),
            Bytes::gb(4)
        );
    }

    #[test]
    fn memtotal_is_read_from_meminfo_in_kib() {
        let sample = "MemTotal:       65843012 kB\nMemFree:        1234567 kB\nMemAvailable:   40000000 kB\n";
        assert_eq!(parse_meminfo(sample), Some(Bytes(65_843_012 * 1024)));
    }

    #[test]
    fn meminfo_without_a_readable_memtotal_gives_nothing() {
        assert_eq!(parse_meminfo("MemFree: 12 kB\n"), None);
        assert_eq!(parse_meminfo("MemTotal: lots kB\n"), None);
        assert_eq!(parse_meminfo(""), None);
    }

    #[test]
    fn the_machine_name_comes_from_the_hostname_file_then_the_environment_then_localhost() {
        assert_eq!(
            choose_name(Some("majin\n".into()), Some("other".into())),
            "majin"
        );
        assert_eq!(
            choose_name(Some("  \n".into()), Some("studio".into())),
            "studio"
        );
        assert_eq!(choose_name(None, Some("studio".into())), "studio");
        assert_eq!(choose_name(None, Some(String::new())), "localhost");
        assert_eq!(choose_name(None, None), "localhost");
    }

    #[test]
    fn this_machine_has_a_name_cores_and_memory() {
        assert!(!local_machine_name().is_empty());
        assert!(local_cpu_cores() >= 1);
        let memory = local_memory().unwrap();
        assert!(memory > Bytes::ZERO);
    }

    #[test]
    fn a_wsl2_kernel_is_recognised_by_its_release_string() {
        assert!(osrelease_is_wsl("5.15.153.1-microsoft-standard-WSL2\n"));
        assert!(osrelease_is_wsl("4.4.0-19041-Microsoft"));
        assert!(!osrelease_is_wsl("6.8.0-45-generic"));
    }
}
