//! The Overview page: the fleet at a glance (its GPUs and their memory, the models and how they are, the
//! gateway's last hour) and every open alarm, each a link to where it is dealt with.

use placement::Bytes;
use serde::{Deserialize, Serialize};

/// The whole fleet, as of the last reading and write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overview {
    /// Machines, and how many of them are unreachable now.
    pub machines: u32,
    /// Of those, unreachable now.
    pub unreachable: u32,
    /// GPUs (MIG instances count as the GPUs they are cut from).
    pub gpus: u32,
    /// GPUs no one holds.
    pub free_gpus: u32,
    /// Every GPU's memory.
    pub total: Bytes,
    /// What shared work holds.
    pub shared: Bytes,
    /// What work on whole GPUs holds.
    pub whole: Bytes,
    /// What programs outside Tessera hold.
    pub outside: Bytes,
    /// What is offered and held by no one.
    pub free: Bytes,
    /// Of the free memory, what lies on GPUs that are partly held: fragments a repack can gather.
    pub stranded: Bytes,
    /// Deployed models.
    pub models: u32,
    /// Models whose every engine serves.
    pub serving: u32,
    /// Models loading or starting.
    pub loading: u32,
    /// On-demand models not loaded (the next request loads them).
    pub idle: u32,
    /// Models with a failed or unhealthy engine.
    pub failing: u32,
    /// Requests through the gateway since the start of the last clock hour.
    pub requests: u64,
    /// Of those, failed ones.
    pub failed_requests: u64,
    /// When that count begins (RFC 3339).
    pub since: String,
    /// What needs an operator now, worst first; past a few of a kind, one line counts the rest.
    pub alarms: Vec<Alarm>,
    /// How many alarms are open, those counted in a line included.
    #[serde(default)]
    pub alarm_count: u32,
}

/// Something that needs an operator, and where it is dealt with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alarm {
    /// What kind.
    pub kind: AlarmKind,
    /// The sentence that says it.
    pub line: String,
    /// The console page where it is dealt with.
    pub href: String,
}

/// The kinds of alarm, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AlarmKind {
    /// The Ray cluster does not answer: its machines are shown as last read.
    ClusterDown,
    /// A machine that does not answer.
    Unreachable,
    /// A GPU that offers less than its holders take.
    Overcommitted,
    /// An engine that failed.
    Failed,
    /// An engine that keeps restarting: crashing, or failing its health checks.
    Restarting,
    /// An engine that should serve and is stopped.
    Stopped,
    /// A worker that waits for room: nothing of it runs.
    Waiting,
    /// The gateway's requests this hour failing past a tenth.
    GatewayErrors,
    /// A GPU a reading found unhealthy.
    Unhealthy,
    /// An engine measured past its share: a promise broken.
    OverShare,
    /// A model slowed by its neighbours.
    Slowed,
}

impl AlarmKind {
    /// The word the page shows for it.
    pub fn label(self) -> &'static str {
        match self {
            AlarmKind::ClusterDown => "Cluster down",
            AlarmKind::Unreachable => "Unreachable",
            AlarmKind::Overcommitted => "Over-committed",
            AlarmKind::Failed => "Failed",
            AlarmKind::Restarting => "Restarting",
            AlarmKind::Stopped => "Stopped",
            AlarmKind::Waiting => "Waiting",
            AlarmKind::GatewayErrors => "Gateway errors",
            AlarmKind::Unhealthy => "Unhealthy",
            AlarmKind::OverShare => "Past its share",
            AlarmKind::Slowed => "Slowed",
        }
    }
}
