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
use placement::{Bytes, Gpu, Machine};

/// NVML's word for a GPU whose MIG mode is on (`NVML_DEVICE_MIG_ENABLE`).
const MIG_ENABLED: u32 = 1;

/// This machine's NVIDIA GPUs, through a loaded NVML.
#[derive(Debug)]
pub struct NvmlGpus {
    nvml: Nvml,
    /// The GPUs found under MIG and said so in the log, once each.
    said_under_mig: std::sync::Mutex<std::collections::BTreeSet<u32>>,
}

impl NvmlGpus {
    /// Loads NVML. Fails with [`InventoryError::NvmlUnavailable`] where there is no NVIDIA driver.
    pub fn init() -> Result<NvmlGpus, InventoryError> {
        Nvml::init()
            .map(|nvml| NvmlGpus {
                nvml,
                said_under_mig: Default::default(),
            })
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
    /// rather than as held outside.
    fn read_with(&self, ours: &super::Ours) -> Result<LocalReading, InventoryError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|source| InventoryError::NvmlQuery {
                what: "how many GPUs this machine has",
                source,
            })?;
        let (gpus, live) = (0..count)
            .map(|index| match self.nvml.device_by_index(index) {
                Ok(device) => {
                    let (gpu, live) = read_device(index, &device, ours);
                    if mig_on(&device) {
                        self.say_under_mig(index);
                        (cut_into_instances(gpu), live)
                    } else {
                        (gpu, live)
                    }
                }
                Err(e) => unreadable(index, &format!("NVML could not open it: {e}")),
            })
            .unzip();
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

impl NvmlGpus {
    /// The indices of the GPUs whose MIG mode is on now.
    pub fn under_mig(&self) -> Vec<u32> {
        let count = self.nvml.device_count().unwrap_or(0);
        (0..count)
            .filter(|&index| {
                self.nvml
                    .device_by_index(index)
                    .is_ok_and(|device| mig_on(&device))
            })
            .collect()
    }

    fn say_under_mig(&self, index: u32) {
        let mut said = self
            .said_under_mig
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if said.insert(index) {
            tracing::warn!(
                "GPU {index} of this machine has MIG on: work runs only in its instances, which Tessera does not place on yet, so it offers nothing"
            );
        }
    }
}

/// Whether `device`'s MIG mode is on (a GPU without MIG says it is not supported).
fn mig_on(device: &Device<'_>) -> bool {
    device
        .mig_mode()
        .is_ok_and(|mode| mode.current == MIG_ENABLED)
}

/// A GPU cut into MIG instances runs work only inside them, which Tessera does not yet hold as GPUs of
/// their own: all of it counts as held outside, so nothing is placed on it that could not run there.
fn cut_into_instances(gpu: Gpu) -> Gpu {
    Gpu {
        held_outside: gpu.total,
        ..gpu
    }
}

impl LocalGpus for NvmlGpus {
    fn read(&self, ours: &super::Ours) -> Result<LocalReading, InventoryError> {
        self.read_with(ours)
    }

    fn processes_on(&self, index: u32) -> Vec<u32> {
        // A GPU that cannot be asked has nothing to wait for: the next start says if memory is short.
        self.nvml
            .device_by_index(index)
            .and_then(|device| device.running_compute_processes())
            .map(|processes| processes.into_iter().map(|p| p.pid).collect())
            .unwrap_or_default()
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
    fn a_gpu_cut_into_mig_instances_offers_nothing_until_its_instances_are_gpus_of_their_own() {
        let gpu = Gpu {
            index: 1,
            uuid: "GPU-1".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            vendor: "nvidia".into(),
            total: Bytes::gb(80),
            held_outside: Bytes::gb(1),
            healthy: true,
        };
        let cut = cut_into_instances(gpu.clone());
        assert!(cut.healthy);
        assert_eq!(cut.offered(), Bytes::ZERO);
        assert_eq!(
            Gpu {
                held_outside: gpu.held_outside,
                ..cut
            },
            gpu,
            "only what it offers changes"
        );
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
