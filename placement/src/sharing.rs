//! How a GPU is shared (seed 004), and what that makes of a share.
//!
//! - Time-slicing: engines take turns; a share is a promise each engine keeps by sizing itself.
//! - MPS: engines run together as clients of one MPS server per GPU; the driver enforces each client's
//!   memory share (`CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`: an allocation past it fails with out of memory).
//! - MIG: the GPU is cut into instances with walls ([`crate::mig`]); each is held whole.
//!
//! What Tessera relies on from NVIDIA's MPS documentation is in docs/src/design/nvidia.md.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How a GPU is shared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sharing {
    /// Engines take turns; shares are promises.
    #[default]
    TimeSlicing,
    /// Engines run together under MPS; memory shares are enforced by the driver.
    Mps,
    /// The GPU is cut into MIG instances, each held whole.
    Mig,
}

/// A way of sharing that cannot be read, or that the GPU cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SharingError {
    /// Not one of the three.
    #[error("choose time-slicing, mps or mig, not {0:?}")]
    Unknown(String),
    /// More MPS clients than one MPS server takes on a GPU.
    #[error("an MPS server takes at most {MPS_MAX_CLIENTS} clients per GPU; {gpu} would have {clients}: move some work off it first")]
    TooManyClients {
        /// The GPU, as the console names it.
        gpu: String,
        /// Engines it would have.
        clients: usize,
    },
    /// An engine on several GPUs, one of them under MPS: each GPU has its own MPS server, and a client
    /// runs on its server's GPU alone.
    #[error("{}", several_gpus(gpu, engines))]
    SeveralGpus {
        /// The GPU, as the console names it.
        gpu: String,
        /// Those engines, as the console names them.
        engines: Vec<String>,
    },
    /// A MIG instance, which one engine holds whole, asked to be shared.
    #[error(
        "{gpu} takes one engine whole and is shared no further; set how its GPU is shared instead"
    )]
    InstanceHeldWhole {
        /// The instance, as the console names it.
        gpu: String,
    },
    /// A machine whose GPUs Tessera cannot cut.
    #[error("{gpu} is on {machine}, where Tessera cannot cut a GPU: MIG is applied to this server's own GPUs (and the demo fleet's); on a node, cut it with nvidia-smi and start Ray there again with the line `tessera ray-node` prints")]
    NoMigThere {
        /// The GPU, as the console names it.
        gpu: String,
        /// Its machine.
        machine: String,
    },
    /// A GPU that runs something, asked to be cut or joined back.
    #[error("{gpu} runs {}: a GPU is cut into MIG instances, or joined back, only while nothing runs on it; remove or move {} first", engines.join(", "), if engines.len() == 1 { "it" } else { "them" })]
    MigBusy {
        /// The GPU, as the console names it.
        gpu: String,
        /// What runs there, as the console names it.
        engines: Vec<String>,
    },
    /// Instances named for a GPU not cut into MIG instances.
    #[error("instances are named only with mode mig, such as {{\"mode\": \"mig\", \"instances\": [\"3g.40gb\"]}}")]
    InstancesWithoutMig,
    /// A machine whose engines Tessera cannot run as MPS clients.
    #[error("{gpu} is on {machine}, where Tessera cannot run an MPS daemon: MPS is set on this server's own GPUs and the Ray cluster's nodes (and the demo fleet's)")]
    NoDaemonThere {
        /// The GPU, as the console names it.
        gpu: String,
        /// Its machine.
        machine: String,
    },
    /// A compute share that is not a whole percent of the GPU.
    #[error("a compute share is a whole percent from 1 to 100, not {0}")]
    ComputeOutOfRange(i64),
    /// A compute share where nothing would enforce it.
    #[error("a compute share applies under MPS only: choose mps, or leave compute_percent out")]
    ComputeWithoutMps,
    /// MPS and MIG are NVIDIA's.
    #[error("{gpu} is not an NVIDIA GPU ({vendor}): only time-slicing shares it")]
    NotNvidia {
        /// The GPU, as the console names it.
        gpu: String,
        /// Its vendor.
        vendor: String,
    },
}

fn several_gpus(gpu: &str, engines: &[String]) -> String {
    let (who, runs, shares) = match engines {
        [one] => (one.clone(), "runs", "shares"),
        _ => (engines.join(", "), "run", "share"),
    };
    format!("{who} {runs} on several GPUs, and under MPS an engine runs on one: {gpu} cannot run MPS while {who} {shares} it")
}

/// The CUDA contexts one MPS server takes per GPU since Volta (NVIDIA's MPS documentation, "Volta MPS server
/// supports 48 client CUDA contexts per-device"): an engine is one client.
pub const MPS_MAX_CLIENTS: usize = 48;

impl Sharing {
    /// Reads `time-slicing`, `mps` or `mig`.
    pub fn parse(text: &str) -> Result<Sharing, SharingError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "time-slicing" => Ok(Sharing::TimeSlicing),
            "mps" => Ok(Sharing::Mps),
            "mig" => Ok(Sharing::Mig),
            _ => Err(SharingError::Unknown(text.to_owned())),
        }
    }

    /// As the API writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Sharing::TimeSlicing => "time-slicing",
            Sharing::Mps => "mps",
            Sharing::Mig => "mig",
        }
    }

    /// Whether the hardware or the driver holds each engine to its memory share; otherwise the share is a
    /// promise the engine keeps by sizing itself.
    pub fn enforces_memory(self) -> bool {
        !matches!(self, Sharing::TimeSlicing)
    }

    /// What the machine page says of a GPU shared this way.
    pub fn line(self) -> &'static str {
        match self {
            Sharing::TimeSlicing => {
                "Time-sliced: each share is a promise the engine keeps by sizing itself."
            }
            Sharing::Mps => "MPS: the driver holds each engine to its memory share.",
            Sharing::Mig => "MIG: cut into instances with walls, each held whole.",
        }
    }

    /// Whether `clients` engines may share `gpu` (vendor `vendor`) this way.
    pub fn check(self, gpu: &str, vendor: &str, clients: usize) -> Result<(), SharingError> {
        if self != Sharing::TimeSlicing && !vendor.eq_ignore_ascii_case("nvidia") {
            return Err(SharingError::NotNvidia {
                gpu: gpu.to_owned(),
                vendor: vendor.to_owned(),
            });
        }
        if self == Sharing::Mps && clients > MPS_MAX_CLIENTS {
            return Err(SharingError::TooManyClients {
                gpu: gpu.to_owned(),
                clients,
            });
        }
        Ok(())
    }
}

/// How one GPU is shared, as the operator set it: the way, and under MPS the most of the GPU's threads
/// each engine may use (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`), where one is set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuSharing {
    /// The way it is shared.
    pub mode: Sharing,
    /// Under MPS, each engine's compute share in percent of the GPU's threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_percent: Option<u8>,
}

impl GpuSharing {
    /// `mode`, with a compute share of `compute_percent`, refused where it is not a percent or where the
    /// mode has nothing to enforce it with.
    pub fn new(mode: Sharing, compute_percent: Option<i64>) -> Result<GpuSharing, SharingError> {
        let compute_percent = match compute_percent {
            None => None,
            Some(_) if mode != Sharing::Mps => return Err(SharingError::ComputeWithoutMps),
            Some(p @ 1..=100) => Some(p as u8),
            Some(p) => return Err(SharingError::ComputeOutOfRange(p)),
        };
        Ok(GpuSharing {
            mode,
            compute_percent,
        })
    }

    /// Reads a mode as the API writes it (`time-slicing`, `mps`, `mig`) with its compute share.
    pub fn parse(mode: &str, compute_percent: Option<i64>) -> Result<GpuSharing, SharingError> {
        GpuSharing::new(Sharing::parse(mode)?, compute_percent)
    }

    /// What the machine page says of it.
    pub fn line(&self) -> String {
        match self.compute_percent {
            Some(p) => format!(
                "{} Each engine may use at most {p} % of its compute.",
                self.mode.line()
            ),
            None => self.mode.line().to_owned(),
        }
    }
}

impl fmt::Display for Sharing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One GPU's MPS control daemon: where it and its clients meet, and how it is started and stopped. Each
/// GPU gets a daemon of its own, so that a GPU's mode changes without touching its neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDaemon {
    /// The GPU's UUID: the daemon sees that GPU alone, which its clients see as device 0.
    pub uuid: String,
    /// Its pipes and sockets (`CUDA_MPS_PIPE_DIRECTORY`), the same for the daemon and every client.
    pub pipe_dir: String,
    /// Its logs (`CUDA_MPS_LOG_DIRECTORY`).
    pub log_dir: String,
}

impl MpsDaemon {
    /// The daemon of GPU `index` of `machine` (UUID `uuid`), its directories under `data_dir`.
    pub fn new(data_dir: &str, machine: &str, index: u32, uuid: &str) -> MpsDaemon {
        let root = format!("{}/mps/{machine}-{index}", data_dir.trim_end_matches('/'));
        MpsDaemon {
            uuid: uuid.to_owned(),
            pipe_dir: format!("{root}/pipe"),
            log_dir: format!("{root}/log"),
        }
    }

    /// The daemon's environment: the one GPU it serves, and its directories.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            ("CUDA_VISIBLE_DEVICES".to_owned(), self.uuid.clone()),
            ("CUDA_MPS_PIPE_DIRECTORY".to_owned(), self.pipe_dir.clone()),
            ("CUDA_MPS_LOG_DIRECTORY".to_owned(), self.log_dir.clone()),
        ]
    }

    /// Starts it in the background, before the GPU's first client.
    pub fn start_command() -> [&'static str; 2] {
        ["nvidia-cuda-mps-control", "-d"]
    }

    /// What is written to `nvidia-cuda-mps-control`'s standard input (with [`MpsDaemon::env`]) to stop it,
    /// after the GPU's last client.
    pub const STOP: &'static str = "quit\n";

    /// An engine's environment as a client of this daemon with a memory share of `share` and, when the
    /// operator sets one, `compute_percent` of the GPU's threads. The server remaps the GPU to device 0,
    /// so the client names it so; the limit is rounded down to whole MiB, so it never exceeds the share.
    pub fn client_env(&self, share: Bytes, compute_percent: Option<u8>) -> Vec<(String, String)> {
        let mut env = vec![
            ("CUDA_VISIBLE_DEVICES".to_owned(), "0".to_owned()),
            ("CUDA_MPS_PIPE_DIRECTORY".to_owned(), self.pipe_dir.clone()),
            ("CUDA_MPS_LOG_DIRECTORY".to_owned(), self.log_dir.clone()),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_owned(),
                format!("0={}M", share.get() >> 20),
            ),
        ];
        if let Some(percent) = compute_percent {
            env.push((
                "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_owned(),
                percent.clamp(1, 100).to_string(),
            ));
        }
        env
    }
}

/// Where a share is only a promise (seed 000, "A workload that takes more than it said can leave its
/// neighbours without memory"): the line that says an engine measured at `measured` on `gpu` broke its
/// `share`, if it did.
pub fn over_share(name: &str, gpu: &str, measured: Bytes, share: Bytes) -> Option<String> {
    (measured > share).then(|| {
        format!(
            "{name} uses {} GB on {gpu}, {} GB past its {} GB share: its neighbours may run out of memory.",
            measured.gb_text(),
            (measured - share).gb_text(),
            share.gb_text()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engine_that_uses_more_than_its_share_is_named_with_how_much_more() {
        let share = Bytes::from_gb(4.2).unwrap();
        assert_eq!(over_share("voice", "GPU 0 of majin", share, share), None);
        assert_eq!(
            over_share("voice", "GPU 0 of majin", Bytes::from_gb(5.5).unwrap(), share).as_deref(),
            Some("voice uses 5.5 GB on GPU 0 of majin, 1.3 GB past its 4.2 GB share: its neighbours may run out of memory.")
        );
    }

    #[test]
    fn a_share_is_a_promise_under_time_slicing_and_enforced_under_mps_and_mig() {
        assert!(!Sharing::TimeSlicing.enforces_memory());
        assert!(Sharing::Mps.enforces_memory());
        assert!(Sharing::Mig.enforces_memory());
        assert_eq!(Sharing::default(), Sharing::TimeSlicing);
    }

    #[test]
    fn the_three_ways_read_and_write_as_the_api_names_them_and_anything_else_says_what_to_choose() {
        for s in [Sharing::TimeSlicing, Sharing::Mps, Sharing::Mig] {
            assert_eq!(Sharing::parse(s.as_str()), Ok(s));
            assert_eq!(
                serde_json::to_string(&s).unwrap(),
                format!("\"{}\"", s.as_str())
            );
        }
        assert_eq!(
            Sharing::parse("vgpu").unwrap_err().to_string(),
            "choose time-slicing, mps or mig, not \"vgpu\""
        );
    }

    #[test]
    fn each_engine_under_mps_gets_its_share_as_a_driver_limit_on_device_0_rounded_down_to_whole_mib(
    ) {
        let daemon = MpsDaemon::new("/var/lib/tessera/", "h200-node", 3, "GPU-77");
        let env = daemon.client_env(Bytes::from_gb(35.25).unwrap() + Bytes(1), Some(40));
        assert_eq!(
            env,
            [
                ("CUDA_VISIBLE_DEVICES", "0"),
                (
                    "CUDA_MPS_PIPE_DIRECTORY",
                    "/var/lib/tessera/mps/h200-node-3/pipe"
                ),
                (
                    "CUDA_MPS_LOG_DIRECTORY",
                    "/var/lib/tessera/mps/h200-node-3/log"
                ),
                ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=36096M"),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "40"),
            ]
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
        );
        assert_eq!(
            daemon.env()[0],
            ("CUDA_VISIBLE_DEVICES".to_owned(), "GPU-77".to_owned())
        );
        assert_eq!(
            MpsDaemon::start_command(),
            ["nvidia-cuda-mps-control", "-d"]
        );
        let no_compute = daemon.client_env(Bytes::gb(1), None);
        assert!(no_compute
            .iter()
            .all(|(k, _)| k != "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"));
    }

    #[test]
    fn a_compute_share_is_a_whole_percent_and_only_under_mps() {
        assert_eq!(
            GpuSharing::new(Sharing::Mps, Some(40)).unwrap().line(),
            "MPS: the driver holds each engine to its memory share. Each engine may use at most 40 % of its compute."
        );
        assert_eq!(
            GpuSharing::new(Sharing::Mps, Some(0))
                .unwrap_err()
                .to_string(),
            "a compute share is a whole percent from 1 to 100, not 0"
        );
        assert_eq!(
            GpuSharing::new(Sharing::Mps, Some(101)).unwrap_err(),
            SharingError::ComputeOutOfRange(101)
        );
        assert_eq!(
            GpuSharing::new(Sharing::TimeSlicing, Some(50))
                .unwrap_err()
                .to_string(),
            "a compute share applies under MPS only: choose mps, or leave compute_percent out"
        );
        assert_eq!(
            GpuSharing::new(Sharing::TimeSlicing, None).unwrap(),
            GpuSharing::default()
        );
    }

    #[test]
    fn an_mps_gpu_takes_at_most_48_engines_and_only_nvidia_gpus_take_mps_or_mig() {
        assert_eq!(Sharing::Mps.check("GPU 0 of node", "nvidia", 48), Ok(()));
        assert_eq!(
            Sharing::Mps
                .check("GPU 0 of node", "nvidia", 49)
                .unwrap_err()
                .to_string(),
            "an MPS server takes at most 48 clients per GPU; GPU 0 of node would have 49: move some work off it first"
        );
        assert_eq!(
            Sharing::Mig
                .check("GPU 0 of box", "amd", 1)
                .unwrap_err()
                .to_string(),
            "GPU 0 of box is not an NVIDIA GPU (amd): only time-slicing shares it"
        );
        assert_eq!(
            Sharing::TimeSlicing.check("GPU 0 of box", "amd", 100),
            Ok(())
        );
    }
}
