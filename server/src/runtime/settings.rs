//! How engines are supervised (timings, programs, folders) and which machines they can be started for: what
//! the runtime is opened with, kept apart from the runtime's handle that uses it.

use super::spec::Host;
use crate::inventory::LocalGpus;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How engines are supervised.
#[derive(Clone)]
pub struct Settings {
    /// The program that runs the demo engine (`tessera demo-engine`): this server's own binary.
    pub demo_engine: PathBuf,
    /// Where each engine's output is kept.
    pub log_dir: PathBuf,
    /// The data folder, under which each GPU's MPS daemon keeps its pipes and logs (`mps/`).
    pub data_dir: PathBuf,
    /// NVIDIA's MPS control program, which starts and stops each GPU's MPS daemon (here and on the
    /// cluster's nodes).
    pub mps_control: PathBuf,
    /// NVIDIA's `nvidia-smi`, which cuts this machine's GPUs into MIG instances and joins them back.
    pub nvidia_smi: PathBuf,
    /// On each node of the Ray cluster, the folder its GPUs' MPS daemons keep their pipes and logs under.
    pub node_data_dir: PathBuf,
    /// How often each engine's health is checked.
    pub health_interval: Duration,
    /// How long a starting engine may take to answer its first health check (loading weights).
    pub start_timeout: Duration,
    /// How long a stopping engine is given after SIGTERM before SIGKILL.
    pub stop_timeout: Duration,
    /// The first wait before a restart; it doubles with each failure in a row.
    pub backoff: Duration,
    /// The longest wait before a restart.
    pub backoff_max: Duration,
    /// Failures in a row after which an engine is left failed.
    pub max_restarts: u32,
    /// Failed health checks in a row after which a running engine is unhealthy.
    pub unhealthy_after: u32,
    /// Failed health checks in a row after which it is restarted.
    pub restart_unhealthy_after: u32,
    /// How long a serving engine about to stop may take to finish its requests in flight.
    pub drain_grace: Duration,
    /// How long a GPU must stay over-committed before the over-commit policy stops a shared worker there.
    pub evict_after: Duration,
    /// How long an on-demand model stays asleep with no request before its engine is stopped.
    pub keep_asleep: Duration,
    /// The part of each machine's memory, in percent, that models asleep may keep there.
    pub sleepers_host_percent: u8,
    /// How often a node's engine's job log is read again for its processes while the node's GPUs run
    /// a process that no engine's last report accounts for (one may have started since).
    pub processes_reread: Duration,
    /// The demo fleet's simulated GPUs (`--simulate-gpus`), which its demo engines allocate from.
    pub sim_dir: Option<PathBuf>,
    /// This machine's GPUs (NVML), where there are: a stopped engine's GPU memory is waited for there.
    pub gpus: Option<Arc<dyn LocalGpus>>,
    /// The Ray cluster whose machines' engines run as its jobs, where there is one.
    pub ray: Option<crate::inventory::ray::RayClient>,
    /// Where the database is opened, which says whether it is this installation's (its engines' token).
    pub identity: super::instance::Identity,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("demo_engine", &self.demo_engine)
            .field("log_dir", &self.log_dir)
            .field("health_interval", &self.health_interval)
            .field("start_timeout", &self.start_timeout)
            .field("stop_timeout", &self.stop_timeout)
            .field("backoff", &self.backoff)
            .field("backoff_max", &self.backoff_max)
            .field("max_restarts", &self.max_restarts)
            .field("unhealthy_after", &self.unhealthy_after)
            .field("restart_unhealthy_after", &self.restart_unhealthy_after)
            .field("drain_grace", &self.drain_grace)
            .field("evict_after", &self.evict_after)
            .field("keep_asleep", &self.keep_asleep)
            .field("sleepers_host_percent", &self.sleepers_host_percent)
            .field("processes_reread", &self.processes_reread)
            .field("gpus", &self.gpus.is_some())
            .field(
                "ray",
                &self
                    .ray
                    .as_ref()
                    .map(crate::inventory::ray::RayClient::address),
            )
            .finish()
    }
}

impl Settings {
    /// The defaults for engines that load real weights: health every 2 s, 15 minutes to load, 30 s to stop,
    /// restarts after 1, 2, 4 … up to 60 s, left failed after 5 failures in a row.
    pub fn new(demo_engine: PathBuf, log_dir: PathBuf) -> Settings {
        Settings {
            demo_engine,
            data_dir: log_dir.clone(),
            log_dir,
            mps_control: PathBuf::from("nvidia-cuda-mps-control"),
            nvidia_smi: PathBuf::from("nvidia-smi"),
            node_data_dir: PathBuf::from("/tmp/tessera"),
            health_interval: Duration::from_secs(2),
            start_timeout: Duration::from_secs(15 * 60),
            stop_timeout: Duration::from_secs(30),
            backoff: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            max_restarts: 5,
            unhealthy_after: 3,
            restart_unhealthy_after: 15,
            drain_grace: Duration::from_secs(30),
            evict_after: Duration::from_secs(30),
            keep_asleep: Duration::from_secs(3600),
            sleepers_host_percent: 25,
            processes_reread: Duration::from_secs(30),
            sim_dir: None,
            gpus: None,
            ray: None,
            identity: super::instance::Identity::default(),
        }
    }

    /// The wait before restart number `failures` (1-based).
    pub fn backoff(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.backoff.saturating_mul(factor).min(self.backoff_max)
    }
}

/// Which machines engines can be started for: this one (through NVML) runs recipes, the demo fleet's run
/// the demo engine in their place, the Ray cluster's run jobs, and any other is remote.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// This machine, when NVML found it.
    pub local: Option<String>,
    /// The demo fleet's machines.
    pub simulated: std::collections::BTreeSet<String>,
    /// The Ray cluster's machines.
    pub cluster: BTreeMap<String, crate::inventory::ray::ClusterMachine>,
}

impl Hosts {
    /// Where `machine` is.
    pub fn host(&self, machine: &str) -> Host {
        if let Some(node) = self.cluster.get(machine) {
            Host::Cluster {
                address: node.address.clone(),
                uuids: node
                    .gpus
                    .iter()
                    .map(|g| (g.index, g.uuid.clone()))
                    .collect(),
                demo: node.demo,
            }
        } else if self.local.as_deref() == Some(machine) {
            Host::Local
        } else if self.simulated.contains(machine) {
            Host::Simulated
        } else {
            Host::Remote
        }
    }
}
