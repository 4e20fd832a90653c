//! What a worker asks for, as the API receives it, and the same request once checked.
//!
//! [`RequestedResources`] is the wire form of seed 000; [`WorkerRequest::from_wire`] parses it once into
//! domain types, so a request that reaches the scheduler is always one the rules accept.

use crate::units::{Bytes, UnitError};
use serde::{Deserialize, Serialize};

/// The most CPU cores a request may ask for; more is a typo.
pub const MAX_CPU_CORES: u32 = 4096;
/// The most GPUs a request may ask for.
pub const MAX_GPU_COUNT: u32 = 1024;

/// `requested_resources` as a script sends it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestedResources {
    /// CPU cores, a whole number.
    #[serde(default)]
    pub cpu_cores: Option<f64>,
    /// Memory in bytes.
    #[serde(default)]
    pub memory_bytes: Option<f64>,
    /// What GPUs the worker takes, if any.
    #[serde(default)]
    pub gpu_requests: Option<GpuRequests>,
}

/// `gpu_requests` as a script sends it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuRequests {
    /// How many GPUs (default 1).
    #[serde(default)]
    pub count: Option<f64>,
    /// Share each GPU by memory with other shared work.
    #[serde(default)]
    pub shared: bool,
    /// GB the worker takes on each GPU; required with `shared`, and only with it.
    #[serde(default)]
    pub memory_gb: Option<f64>,
    /// Only GPUs of this vendor.
    #[serde(default)]
    pub vendor: Option<String>,
    /// Only GPUs of one of these models.
    #[serde(default)]
    pub models: Vec<String>,
    /// Only healthy GPUs (default true).
    #[serde(default)]
    pub healthy_only: Option<bool>,
    /// Only these GPUs: UUIDs or `machine:index`.
    #[serde(default)]
    pub ids: Vec<String>,
    /// `Any` (default): `count` GPUs. `All`: every GPU of one machine, whole.
    #[serde(default)]
    pub policy: Policy,
}

/// How many of a machine's GPUs a worker takes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    /// `count` GPUs.
    #[default]
    Any,
    /// Every GPU of one machine.
    All,
}

/// How a worker holds its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuMode {
    /// No other work on them while it runs.
    Whole,
    /// Shared by memory: it takes this much on each GPU.
    Shared(Bytes),
}

/// A checked GPU request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDemand {
    /// How many GPUs, at least 1.
    pub count: u32,
    /// Whole or shared.
    pub mode: GpuMode,
    /// Only GPUs of this vendor (lower case).
    pub vendor: Option<String>,
    /// Only GPUs of one of these models; empty means any.
    pub models: Vec<String>,
    /// Only healthy GPUs.
    pub healthy_only: bool,
    /// Only these GPUs; empty means any.
    pub ids: Vec<String>,
    /// Any `count` GPUs, or all of one machine's.
    pub policy: Policy,
}

/// A checked request for a worker: what the scheduler places.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRequest {
    /// CPU cores.
    pub cpu_cores: u32,
    /// Memory.
    pub memory: Bytes,
    /// GPUs, if it takes any.
    pub gpus: Option<GpuDemand>,
}

impl WorkerRequest {
    /// A request for `gb` of a shared GPU and nothing else, as most examples use.
    pub fn shared_gb(gb: f64) -> WorkerRequest {
        WorkerRequest {
            cpu_cores: 0,
            memory: Bytes::ZERO,
            gpus: Some(GpuDemand {
                count: 1,
                mode: GpuMode::Shared(Bytes::from_gb(gb).expect("a sane figure")),
                vendor: None,
                models: Vec::new(),
                healthy_only: true,
                ids: Vec::new(),
                policy: Policy::Any,
            }),
        }
    }

    /// The GB the worker takes on each shared GPU, if it shares.
    pub fn shared_memory(&self) -> Option<Bytes> {
        match self.gpus.as_ref()?.mode {
            GpuMode::Shared(b) => Some(b),
            GpuMode::Whole => None,
        }
    }

    /// Parses the wire form once, refusing what the rules do not allow with a sentence that says what to fix.
    pub fn from_wire(wire: &RequestedResources) -> Result<WorkerRequest, RequestError> {
        let cpu_cores = match wire.cpu_cores {
            None => 0,
            Some(c) => {
                whole_number(c, MAX_CPU_CORES as f64).map_err(RequestError::CpuCores)? as u32
            }
        };
        let memory = match wire.memory_bytes {
            None => Bytes::ZERO,
            Some(m) => Bytes(
                whole_number(m, (crate::units::MAX_GB * crate::units::GB) as f64)
                    .map_err(RequestError::MemoryBytes)?,
            ),
        };
        let gpus = wire
            .gpu_requests
            .as_ref()
            .map(GpuDemand::from_wire)
            .transpose()?;
        Ok(WorkerRequest {
            cpu_cores,
            memory,
            gpus,
        })
    }
}

impl GpuDemand {
    fn from_wire(wire: &GpuRequests) -> Result<GpuDemand, RequestError> {
        let count = match wire.count {
            None => 1,
            Some(c) => whole_number(c, MAX_GPU_COUNT as f64).map_err(RequestError::Count)? as u32,
        };
        if count == 0 {
            return Err(RequestError::ZeroCount);
        }
        let mode = match (wire.shared, wire.memory_gb) {
            (true, None) => return Err(RequestError::SharedWithoutMemory),
            (false, Some(_)) => return Err(RequestError::MemoryWithoutShared),
            (false, None) => GpuMode::Whole,
            (true, Some(gb)) => {
                let bytes = Bytes::from_gb(gb).map_err(RequestError::MemoryGb)?;
                if bytes == Bytes::ZERO {
                    return Err(RequestError::ZeroMemory);
                }
                GpuMode::Shared(bytes)
            }
        };
        if wire.policy == Policy::All && wire.shared {
            return Err(RequestError::SharedAll);
        }
        let vendor = wire
            .vendor
            .as_deref()
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_lowercase);
        Ok(GpuDemand {
            count,
            mode,
            vendor,
            models: wire
                .models
                .iter()
                .map(|m| m.trim().to_owned())
                .filter(|m| !m.is_empty())
                .collect(),
            healthy_only: wire.healthy_only.unwrap_or(true),
            ids: wire
                .ids
                .iter()
                .map(|i| i.trim().to_owned())
                .filter(|i| !i.is_empty())
                .collect(),
            policy: wire.policy,
        })
    }
}

/// A whole number from JSON, between 0 and `max`.
fn whole_number(n: f64, max: f64) -> Result<u64, UnitError> {
    if !n.is_finite() {
        Err(UnitError::NotANumber)
    } else if n < 0.0 {
        Err(UnitError::Negative)
    } else if n > max {
        Err(UnitError::TooLarge)
    } else if n.fract() != 0.0 {
        Err(UnitError::NotWhole)
    } else {
        Ok(n as u64)
    }
}

/// A request the rules refuse. Each message says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RequestError {
    /// `shared: true` without `memory_gb`.
    #[error("gpu_requests.memory_gb is required with shared: say how many GB the worker takes on each GPU")]
    SharedWithoutMemory,
    /// `memory_gb` without `shared: true`.
    #[error(
        "gpu_requests.memory_gb is only for shared GPUs: add \"shared\": true or remove memory_gb"
    )]
    MemoryWithoutShared,
    /// `policy: All` with `shared: true`.
    #[error("policy All cannot be shared: remove \"shared\" or ask for a count of GPUs instead")]
    SharedAll,
    /// `count: 0`.
    #[error(
        "gpu_requests.count must be at least 1; leave gpu_requests out for a worker without GPUs"
    )]
    ZeroCount,
    /// `memory_gb: 0`.
    #[error("gpu_requests.memory_gb must be more than 0")]
    ZeroMemory,
    /// A bad `count`.
    #[error("gpu_requests.count {0}: give a whole number of GPUs from 1 to 1024")]
    Count(UnitError),
    /// A bad `memory_gb`.
    #[error("gpu_requests.memory_gb {0}: give the GB the worker takes, such as 2.5")]
    MemoryGb(UnitError),
    /// A bad `cpu_cores`.
    #[error("cpu_cores {0}: give a whole number of cores from 0 to 4096")]
    CpuCores(UnitError),
    /// A bad `memory_bytes`.
    #[error("memory_bytes {0}: give a whole number of bytes")]
    MemoryBytes(UnitError),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<WorkerRequest, RequestError> {
        WorkerRequest::from_wire(&serde_json::from_str(json).expect("valid wire JSON"))
    }

    #[test]
    fn the_seed_example_is_a_shared_request_of_two_and_a_half_gb() {
        let req = parse(
            r#"{"cpu_cores": 2, "memory_bytes": 4294967296,
                "gpu_requests": {"count": 1, "shared": true, "memory_gb": 2.5}}"#,
        )
        .unwrap();
        assert_eq!(req.cpu_cores, 2);
        assert_eq!(req.memory, Bytes::gb(4));
        assert_eq!(req.shared_memory(), Some(Bytes::from_gb(2.5).unwrap()));
        assert!(req.gpus.unwrap().healthy_only);
    }

    #[test]
    fn memory_gb_is_required_with_shared() {
        assert_eq!(
            parse(r#"{"gpu_requests": {"shared": true}}"#),
            Err(RequestError::SharedWithoutMemory)
        );
    }

    #[test]
    fn memory_gb_is_allowed_only_with_shared() {
        assert_eq!(
            parse(r#"{"gpu_requests": {"memory_gb": 2}}"#),
            Err(RequestError::MemoryWithoutShared)
        );
    }

    #[test]
    fn policy_all_cannot_be_shared() {
        let err = parse(r#"{"gpu_requests": {"shared": true, "memory_gb": 2, "policy": "All"}}"#)
            .unwrap_err();
        assert_eq!(err, RequestError::SharedAll);
        assert!(parse(r#"{"gpu_requests": {"policy": "All"}}"#).is_ok());
    }

    #[test]
    fn a_count_of_zero_is_refused() {
        assert_eq!(
            parse(r#"{"gpu_requests": {"count": 0}}"#),
            Err(RequestError::ZeroCount)
        );
    }

    #[test]
    fn negative_fractional_and_absurd_numbers_are_refused() {
        assert_eq!(
            parse(r#"{"gpu_requests": {"count": -1}}"#),
            Err(RequestError::Count(UnitError::Negative))
        );
        assert_eq!(
            parse(r#"{"gpu_requests": {"count": 1.5}}"#),
            Err(RequestError::Count(UnitError::NotWhole))
        );
        assert_eq!(
            parse(r#"{"gpu_requests": {"shared": true, "memory_gb": -2}}"#),
            Err(RequestError::MemoryGb(UnitError::Negative))
        );
        assert_eq!(
            parse(r#"{"gpu_requests": {"shared": true, "memory_gb": 1e300}}"#),
            Err(RequestError::MemoryGb(UnitError::TooLarge))
        );
        assert_eq!(
            parse(r#"{"gpu_requests": {"shared": true, "memory_gb": 0}}"#),
            Err(RequestError::ZeroMemory)
        );
        assert_eq!(
            parse(r#"{"cpu_cores": 1e9}"#),
            Err(RequestError::CpuCores(UnitError::TooLarge))
        );
        assert_eq!(
            parse(r#"{"memory_bytes": -1}"#),
            Err(RequestError::MemoryBytes(UnitError::Negative))
        );
    }

    #[test]
    fn every_refusal_says_what_to_fix() {
        let msg = RequestError::SharedWithoutMemory.to_string();
        assert!(msg.contains("memory_gb is required with shared"), "{msg}");
        let msg = RequestError::Count(UnitError::Negative).to_string();
        assert_eq!(
            msg,
            "gpu_requests.count is negative: give a whole number of GPUs from 1 to 1024"
        );
    }

    #[test]
    fn filters_are_tidied_once() {
        let req = parse(r#"{"gpu_requests": {"vendor": " NVIDIA ", "models": ["H200", " "], "ids": ["majin:0"]}}"#).unwrap();
        let gpus = req.gpus.unwrap();
        assert_eq!(gpus.vendor.as_deref(), Some("nvidia"));
        assert_eq!(gpus.models, ["H200"]);
        assert_eq!(gpus.ids, ["majin:0"]);
        assert_eq!(gpus.mode, GpuMode::Whole);
    }
}
