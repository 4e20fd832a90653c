//! What the fleet has: machines and their GPUs, and what each GPU offers to shared work.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// One GPU of one machine: the machine's name and the GPU's index on it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuRef {
    /// The machine's name.
    pub machine: String,
    /// The GPU's index on that machine (NVML's index).
    pub index: u32,
}

impl GpuRef {
    /// GPU `index` of `machine`.
    pub fn new(machine: impl Into<String>, index: u32) -> GpuRef {
        GpuRef {
            machine: machine.into(),
            index,
        }
    }
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPU {} of {}", self.index, self.machine)
    }
}

/// A GPU as the inventory sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Index on its machine.
    pub index: u32,
    /// The GPU's UUID, as NVML reports it; may be empty for a GPU described by hand.
    pub uuid: String,
    /// The model name, such as `NVIDIA GeForce RTX 4060`.
    pub model: String,
    /// The vendor, lower case, such as `nvidia`.
    pub vendor: String,
    /// All of its memory.
    pub total: Bytes,
    /// Memory held by something outside Tessera (a desktop, a browser).
    pub held_outside: Bytes,
    /// Whether it is fit to run work.
    pub healthy: bool,
}

impl Gpu {
    /// What the GPU offers to Tessera: its total less what is held outside.
    pub fn offered(&self) -> Bytes {
        self.total.saturating_sub(self.held_outside)
    }

    /// Whether `id` names this GPU of `machine`: its UUID, or `machine:index`.
    pub fn is_named_by(&self, machine: &str, id: &str) -> bool {
        (!self.uuid.is_empty() && self.uuid == id)
            || id
                .split_once(':')
                .is_some_and(|(m, i)| m == machine && i.parse() == Ok(self.index))
    }
}

/// A machine with its CPU cores, memory and GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Machine {
    /// A unique name.
    pub name: String,
    /// CPU cores available to workers.
    pub cpu_cores: u32,
    /// Memory available to workers.
    pub memory: Bytes,
    /// A Windows PC under WSL2: every container sees every GPU, so shared work takes its memory on each.
    pub all_gpus_visible: bool,
    /// Its GPUs, by index.
    pub gpus: Vec<Gpu>,
}

/// Every machine Tessera knows, sorted by name (the tie-break order of placement).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    machines: Vec<Machine>,
}

/// An inventory that contradicts itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InventoryError {
    /// Two machines share a name.
    #[error("two machines are named {0}; give each machine its own name")]
    DuplicateMachine(String),
    /// Two GPUs of one machine share an index.
    #[error("{0} is listed twice; give each GPU of a machine its own index")]
    DuplicateGpu(GpuRef),
    /// More held outside than the GPU has.
    #[error("{gpu} holds {held} outside Tessera but has only {total}; lower held_outside_gb")]
    HeldOutsideOverTotal {
        /// The GPU.
        gpu: GpuRef,
        /// Its total.
        total: Bytes,
        /// What was said to be held outside.
        held: Bytes,
    },
    /// A machine without a name.
    #[error("a machine has no name; give it one")]
    UnnamedMachine,
}

impl Inventory {
    /// Checks the machines and sorts them (and each machine's GPUs) into placement order.
    pub fn new(mut machines: Vec<Machine>) -> Result<Inventory, InventoryError> {
        machines.sort_by(|a, b| a.name.cmp(&b.name));
        for pair in machines.windows(2) {
            if pair[0].name == pair[1].name {
                return Err(InventoryError::DuplicateMachine(pair[0].name.clone()));
            }
        }
        for machine in &mut machines {
            if machine.name.is_empty() {
                return Err(InventoryError::UnnamedMachine);
            }
            machine.gpus.sort_by_key(|g| g.index);
            for pair in machine.gpus.windows(2) {
                if pair[0].index == pair[1].index {
                    return Err(InventoryError::DuplicateGpu(GpuRef::new(
                        &machine.name,
                        pair[0].index,
                    )));
                }
            }
            for gpu in &machine.gpus {
                if gpu.held_outside > gpu.total {
                    return Err(InventoryError::HeldOutsideOverTotal {
                        gpu: GpuRef::new(&machine.name, gpu.index),
                        total: gpu.total,
                        held: gpu.held_outside,
                    });
                }
            }
        }
        Ok(Inventory { machines })
    }

    /// The machines, sorted by name.
    pub fn machines(&self) -> &[Machine] {
        &self.machines
    }

    /// The machine with this name.
    pub fn machine(&self, name: &str) -> Option<&Machine> {
        self.machines
            .binary_search_by(|m| m.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.machines[i])
    }

    /// The GPU this reference names.
    pub fn gpu(&self, gpu: &GpuRef) -> Option<&Gpu> {
        self.machine(&gpu.machine)?
            .gpus
            .iter()
            .find(|g| g.index == gpu.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{gpu, machine};

    #[test]
    fn a_gpu_offers_its_total_less_what_is_held_outside() {
        let rtx = Gpu {
            held_outside: Bytes::gb(1),
            ..gpu(0, 8)
        };
        assert_eq!(rtx.offered(), Bytes::gb(7));
    }

    #[test]
    fn machines_are_kept_in_name_order() {
        let inv = Inventory::new(vec![machine("zeta", &[8]), machine("alpha", &[8])]).unwrap();
        let names: Vec<_> = inv.machines().iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["alpha", "zeta"]);
        assert!(inv.machine("zeta").is_some());
        assert!(inv.gpu(&GpuRef::new("alpha", 0)).is_some());
        assert!(inv.gpu(&GpuRef::new("alpha", 1)).is_none());
    }

    #[test]
    fn an_inventory_that_contradicts_itself_is_refused() {
        let twice = Inventory::new(vec![machine("a", &[8]), machine("a", &[8])]);
        assert_eq!(twice, Err(InventoryError::DuplicateMachine("a".into())));
        let mut m = machine("a", &[8, 8]);
        m.gpus[1].index = 0;
        assert_eq!(
            Inventory::new(vec![m]),
            Err(InventoryError::DuplicateGpu(GpuRef::new("a", 0)))
        );
        let mut m = machine("a", &[8]);
        m.gpus[0].held_outside = Bytes::gb(9);
        let err = Inventory::new(vec![m]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "GPU 0 of a holds 9 GB outside Tessera but has only 8 GB; lower held_outside_gb"
        );
    }

    #[test]
    fn a_gpu_is_named_by_its_uuid_or_machine_and_index() {
        let g = Gpu {
            uuid: "GPU-123".into(),
            ..gpu(2, 8)
        };
        assert!(g.is_named_by("majin", "GPU-123"));
        assert!(g.is_named_by("majin", "majin:2"));
        assert!(!g.is_named_by("majin", "majin:1"));
        assert!(!g.is_named_by("other", "majin:2"));
    }
}
