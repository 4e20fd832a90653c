//! The GPUs of this machine, read through NVML (the NVIDIA driver's management library).
//!
//! Health is kept simple: a GPU is healthy when NVML can name it and report its memory (UUID, name,
//! memory). Without those Tessera cannot say what the GPU offers, so it places nothing there. Utilisation,
//! power and energy are figures for the console that some GPUs do not report (MIG, older boards), so
//! their absence says nothing about health; retired pages and ECC are not consulted.

use super::{held_outside, local_cpu_cores, local_machine_name, local_memory, running_under_wsl};
use super::{GpuLive, InventoryError, LocalGpus, LocalReading};
use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use placement::mig::instance_index;
use placement::{Bytes, Gpu, Machine, MigRole};

/// NVML's word for a GPU whose MIG mode is on (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLED: u32 = 1;

/// This machine's NVIDIA GPUs, through a loaded NVML.
#[derive(Debug)]
pub struct NvmlGpus {
    nvml: Nvml,
}

impl NvmlGpus {
    /// Loads NVML. Fails with [`InventoryError::NvmlUnavailable`] where there is no NVIDIA driver.
    pub fn init() -> Result<NvmlGpus, InventoryError> {
        Nvml::init()
            .map(|nvml| NvmlGpus { nvml })
            .map_err(|e| match e {
                NvmlError::LibloadingError(detail) => {
                    InventoryError::NvmlUnavailable(detail.to_string())
                }
                NvmlError::FailedToLoadSymbol(detail) => InventoryError::NvmlUnavailable(detail),
                NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound => {
                    InventoryError::NvmlUnavailable(e.to_string())
                }
                other => InventoryError::NvmlInit(other),
            })
    }

    /// Reads the machine, counting the memory of `ours` (Tessera's own engines) as Tessera's
    /// rather than as held outside. A GPU with MIG on is listed as cut, followed by each of its
    /// instances as a GPU of its own.
    fn read_with(&self, ours: &super::Ours) -> Result<LocalReading, InventoryError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|source| InventoryError::NvmlQuery {
                what: "how many GPUs this machine has",
                source,
            })?;
        let mut gpus = Vec::new();
        let mut live = Vec::new();
        for index in 0..count {
            let (gpu, figures) = match self.nvml.device_by_index(index) {
                Ok(device) => {
                    let (gpu, figures) = read_device(index, &device, ours);
                    if mig_on(&device) {
                        for (n, instance) in instances(&device) {
                            let (gpu, figures) =
                                read_device(instance_index(index, n), &instance, ours);
                            gpus.push(as_instance(gpu, index));
                            live.push(figures);
                        }
                        (cut_into_instances(gpu), figures)
                    } else {
                        (gpu, figures)
                    }
                }
                Err(e) => unreadable(index, &format!("NVML could not open it: {e}")),
            };
            gpus.push(gpu);
            live.push(figures);
        }
        let machine = Machine {
            name: local_machine_name(),
            cpu_cores: local_cpu_cores(),
            memory: local_memory()?,
            all_gpus_visible: running_under_wsl(),
            gpus,
        };
        Ok(LocalReading { machine, live })
    }
}

/// What the driver says of itself and of each GPU, for `tessera doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverFacts {
    /// The driver's version.
    pub version: String,
    /// Each GPU.
    pub gpus: Vec<GpuFacts>,
}

/// One GPU as the driver describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuFacts {
    /// NVML's index.
    pub index: u32,
    /// Its name.
    pub name: String,
    /// MIG mode now and after the next reset, where the GPU has MIG.
    pub mig: Option<(bool, bool)>,
    /// Whether persistence mode is on, where the driver says.
    pub persistence: Option<bool>,
}

/// The driver's version and each GPU's name, MIG mode and persistence mode; why not, where NVML cannot
/// say.
pub fn driver_facts() -> Result<DriverFacts, String> {
    let nvml = NvmlGpus::init().map_err(|e| e.to_string())?.nvml;
    let version = nvml
        .sys_driver_version()
        .map_err(|e| format!("NVML could not report the driver's version: {e}"))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML could not count the GPUs: {e}"))?;
    let gpus = (0..count)
        .map(|index| match nvml.device_by_index(index) {
            Ok(device) => GpuFacts {
                index,
                name: device.name().unwrap_or_else(|e| format!("unnamed ({e})")),
                mig: device
                    .mig_mode()
                    .ok()
                    .map(|m| (m.current == MIG_ENABLED, m.pending == MIG_ENABLED)),
                persistence: device.is_in_persistent_mode().ok(),
            },
            Err(e) => GpuFacts {
                index,
                name: format!("not readable: {e}"),
                mig: None,
                persistence: None,
            },
        })
        .collect();
    Ok(DriverFacts { version, gpus })
}

/// Whether `device`'s MIG mode is on (a GPU without MIG says it is not supported).
fn mig_on(device: &Device<'_>) -> bool {
    device
        .mig_mode()
        .is_ok_and(|mode| mode.current == MIG_ENABLED)
}

/// The MIG instances of `device` by NVML's number for each: a number with no instance is skipped.
fn instances<'nvml>(device: &Device<'nvml>) -> Vec<(u32, Device<'nvml>)> {
    let most = device.mig_device_count().unwrap_or(0);
    (0..most)
        .filter_map(|n| device.mig_device_by_index(n).ok().map(|d| (n, d)))
        .collect()
}

/// A GPU cut into MIG instances runs work only inside them, each listed as a GPU of its own: it takes
/// none itself, and all of its memory counts as held outside (its instances' use shows on them).
fn cut_into_instances(gpu: Gpu) -> Gpu {
    Gpu {
        held_outside: gpu.total,
        mig: Some(MigRole::Cut),
        ..gpu
    }
}

/// A MIG device of GPU `parent`, as read: its profile is the end of its name (`… MIG 3g.40gb`).
fn as_instance(gpu: Gpu, parent: u32) -> Gpu {
    let profile = placement::mig::profile_in_name(&gpu.model)
        .unwrap_or("unknown")
        .to_owned();
    Gpu {
        mig: Some(MigRole::Instance { parent, profile }),
        ..gpu
    }
}

impl LocalGpus for NvmlGpus {
    fn read(&self, ours: &super::Ours) -> Result<LocalReading, InventoryError> {
        self.read_with(ours)
    }

    fn processes_on(&self, index: u32) -> Vec<u32> {
        // A GPU that cannot be asked has nothing to wait for: the next start says if memory is short.
        self.compute_processes(index)
            .map(|processes| processes.into_iter().map(|p| p.pid).collect())
            .unwrap_or_default()
    }

    fn held_by(&self, index: u32, pids: &[u32]) -> Option<Bytes> {
        let mut held = Bytes::ZERO;
        for process in self.compute_processes(index).ok()? {
            if pids.contains(&process.pid) {
                // A driver that gives no figure per process (WSL2) cannot say what a sleeper keeps.
                let UsedGpuMemory::Used(bytes) = process.used_gpu_memory else {
                    return None;
                };
                held += Bytes(bytes);
            }
        }
        Some(held)
    }
}

impl NvmlGpus {
    /// The compute processes on GPU (or MIG instance) `index` now, as the driver lists them.
    fn compute_processes(
        &self,
        index: u32,
    ) -> Result<Vec<nvml_wrapper::struct_wrappers::device::ProcessInfo>, NvmlError> {
        let device = match placement::mig::instance_of(index) {
            Some((parent, n)) => self
                .nvml
                .device_by_index(parent)
                .and_then(|parent| parent.mig_device_by_index(n)),
            None => self.nvml.device_by_index(index),
        };
        device.and_then(|device| device.running_compute_processes())
    }
}

/// One GPU and its live figures.
fn read_device(index: u32, device: &Device<'_>, ours: &super::Ours) -> (Gpu, GpuLive) {
    let (uuid, name, memory) = match (device.uuid(), device.name(), device.memory_info()) {
        (Ok(uuid), Ok(name), Ok(memory)) => (uuid, name, memory),
        (uuid, name, memory) => {
            let failure = [
                uuid.err().map(|e| format!("its UUID ({e})")),
                name.err().map(|e| format!("its name ({e})")),
                memory.err().map(|e| format!("its memory ({e})")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
            return unreadable(index, &format!("NVML could not report {failure}"));
        }
    };
    // A driver without per-process figures (WSL2's) gives no list or no sizes: then all used memory
    // counts as held outside, which only ever makes the GPU offer less.
    let processes: Vec<(u32, Bytes)> = device
        .running_compute_processes()
        .unwrap_or_default()
        .into_iter()
        .map(|p| match p.used_gpu_memory {
            UsedGpuMemory::Used(bytes) => (p.pid, Bytes(bytes)),
            UsedGpuMemory::Unavailable => (p.pid, Bytes::ZERO),
        })
        .collect();
    // Total less free, so that what the driver reserves for itself (which no one can allocate) is
    // counted as used too.
    let used = Bytes(memory.total.saturating_sub(memory.free));
    let gpu = Gpu {
        index,
        uuid,
        model: name,
        vendor: "nvidia".to_owned(),
        total: Bytes(memory.total),
        held_outside: held_outside(used, ours, index, &processes),
        healthy: true,
        mig: None,
    };
    let live = GpuLive {
        index,
        utilisation_percent: device.utilization_rates().map_or(0, |u| u.gpu),
        power_mw: device.power_usage().ok(),
        temperature_c: device.temperature(TemperatureSensor::Gpu).ok(),
        energy_mj: device.total_energy_consumption().ok(),
        used,
        processes,
        problem: None,
    };
    (gpu, live)
}

/// A GPU NVML lists but cannot describe: shown, unhealthy, offering nothing.
fn unreadable(index: u32, problem: &str) -> (Gpu, GpuLive) {
    tracing::warn!("GPU {index} of this machine is marked unhealthy: {problem}");
    let gpu = Gpu {
        index,
        uuid: String::new(),
        model: "unknown".to_owned(),
        vendor: "nvidia".to_owned(),
        total: Bytes::ZERO,
        held_outside: Bytes::ZERO,
        healthy: false,
        mig: None,
    };
    let live = GpuLive {
        index,
        utilisation_percent: 0,
        power_mw: None,
        temperature_c: None,
        energy_mj: None,
        used: Bytes::ZERO,
        processes: Vec::new(),
        problem: Some(problem.to_owned()),
    };
    (gpu, live)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_driver_init_says_nvml_could_not_be_loaded_and_tessera_goes_on() {
        match NvmlGpus::init() {
            Ok(gpus) => {
                println!("NVML loaded here, so this machine has a driver; reading it instead");
                let reading = gpus.read(&crate::inventory::Ours::default()).unwrap();
                assert_eq!(reading.machine.gpus.len(), reading.live.len());
            }
            Err(e) => {
                assert!(
                    matches!(e, InventoryError::NvmlUnavailable(_)),
                    "unexpected error: {e}"
                );
                let message = e.to_string();
                assert!(message.starts_with("NVML could not be loaded"), "{message}");
                assert!(
                    message.contains("Tessera goes on with the inventory file and the demo fleet"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn a_gpu_cut_into_mig_instances_offers_nothing_itself_and_each_instance_is_a_gpu_of_its_own() {
        let gpu = Gpu {
            index: 1,
            uuid: "GPU-1".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            vendor: "nvidia".into(),
            total: Bytes::gb(80),
            held_outside: Bytes::gb(1),
            healthy: true,
            mig: None,
        };
        let cut = cut_into_instances(gpu.clone());
        assert!(cut.healthy);
        assert_eq!(cut.offered(), Bytes::ZERO);
        assert_eq!(cut.mig, Some(MigRole::Cut));
        let instance = as_instance(
            Gpu {
                index: instance_index(1, 2),
                uuid: "MIG-4f1c".into(),
                model: "NVIDIA H100 80GB HBM3 MIG 3g.40gb".into(),
                total: Bytes(40448 << 20),
                held_outside: Bytes::ZERO,
                ..gpu
            },
            1,
        );
        assert_eq!(
            instance.mig,
            Some(MigRole::Instance {
                parent: 1,
                profile: "3g.40gb".into()
            })
        );
        assert_eq!(instance.index, 2002);
    }

    #[test]
    fn a_gpu_nvml_cannot_describe_is_unhealthy_and_offers_nothing() {
        let (gpu, live) = unreadable(3, "NVML could not report its memory (GPU is lost)");
        assert_eq!(gpu.index, 3);
        assert!(!gpu.healthy);
        assert_eq!(gpu.offered(), Bytes::ZERO);
        assert_eq!(
            live.problem.as_deref(),
            Some("NVML could not report its memory (GPU is lost)")
        );
    }
}
