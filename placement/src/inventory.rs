//! What the fleet has: machines and their GPUs, and what each GPU offers to shared work.

use crate::units::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

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

    /// The `machine:index` form that [`GpuRef::from_str`] reads back, such as `majin:0`.
    pub fn id(&self) -> String {
        format!("{}:{}", self.machine, self.index)
    }
}

impl fmt::Display for GpuRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match instance_of(self.index) {
            Some((parent, n)) => write!(f, "MIG instance {n} of GPU {parent} of {}", self.machine),
            None => write!(f, "GPU {} of {}", self.index, self.machine),
        }
    }
}

/// A GPU named in a form other than `machine:index`, a choice of no GPU, or a GPU chosen twice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuRefError {
    /// No `:` between a machine and an index.
    #[error("GPU \"{0}\": name it as machine:index, such as majin:0")]
    NotMachineIndex(String),
    /// Nothing before the last `:`.
    #[error("GPU \"{0}\": name its machine before the ':', such as majin:0")]
    NoMachine(String),
    /// What follows the last `:` is not a GPU's index (digits only, as NVML numbers them).
    #[error(
        "GPU \"{0}\": after the ':' give the GPU's index on its machine in digits, such as majin:0"
    )]
    BadIndex(String),
    /// No GPU at all.
    #[error("choose at least one GPU, such as \"gpus\": [\"majin:0\"]")]
    NoGpu,
    /// The same GPU twice in one choice.
    #[error("{gpu} is chosen twice; choose each GPU once")]
    ChosenTwice {
        /// The GPU.
        gpu: GpuRef,
        /// Where it stands first in the choice.
        first: usize,
        /// Where it stands again.
        again: usize,
    },
    /// Two entries of one list name the same GPU: [`GpuRefError::ChosenTwice`] in the words written.
    #[error("{}", listed_twice(first, again, gpu))]
    ListedTwice {
        /// The entry that named it first, as written.
        first: String,
        /// The later entry that names it again, as written.
        again: String,
        /// The GPU both name.
        gpu: GpuRef,
    },
}

fn listed_twice(first: &str, again: &str, gpu: &GpuRef) -> String {
    if first == again {
        format!("\"{again}\" is listed twice; list each GPU once")
    } else {
        format!("\"{again}\" names {gpu}, which \"{first}\" names already; list each GPU once")
    }
}

impl FromStr for GpuRef {
    type Err = GpuRefError;

    /// Reads `machine:index`, split at the last `:`; the index is digits only (`atlas:00` is GPU 0 of atlas).
    fn from_str(id: &str) -> Result<GpuRef, GpuRefError> {
        let Some((machine, index)) = id.rsplit_once(':') else {
            return Err(GpuRefError::NotMachineIndex(id.to_owned()));
        };
        if machine.is_empty() {
            return Err(GpuRefError::NoMachine(id.to_owned()));
        }
        if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(GpuRefError::BadIndex(id.to_owned()));
        }
        let index = index
            .parse()
            .map_err(|_| GpuRefError::BadIndex(id.to_owned()))?;
        Ok(GpuRef::new(machine, index))
    }
}

/// Reads a list of `machine:index` names in order, refusing one that is malformed or names a GPU named before.
pub fn parse_gpu_list(ids: &[String]) -> Result<GpuChoice, GpuRefError> {
    let gpus = ids
        .iter()
        .map(|id| id.parse())
        .collect::<Result<Vec<GpuRef>, _>>()?;
    GpuChoice::new(gpus).map_err(|e| match e {
        GpuRefError::ChosenTwice { gpu, first, again } => GpuRefError::ListedTwice {
            first: ids[first].clone(),
            again: ids[again].clone(),
            gpu,
        },
        other => other,
    })
}

/// The GPUs chosen for one deployment: at least one, each once, in the order chosen. The REST API reads
/// one from `machine:index` names ([`parse_gpu_list`]); the console builds one from the GPUs it shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuChoice(Vec<GpuRef>);

impl GpuChoice {
    /// `gpus` as a choice, refused when empty or when it names a GPU twice.
    pub fn new(gpus: Vec<GpuRef>) -> Result<GpuChoice, GpuRefError> {
        if gpus.is_empty() {
            return Err(GpuRefError::NoGpu);
        }
        for (again, gpu) in gpus.iter().enumerate() {
            if let Some(first) = gpus[..again].iter().position(|g| g == gpu) {
                return Err(GpuRefError::ChosenTwice {
                    gpu: gpu.clone(),
                    first,
                    again,
                });
            }
        }
        Ok(GpuChoice(gpus))
    }

    /// The GPUs, in the order chosen.
    pub fn gpus(&self) -> &[GpuRef] {
        &self.0
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
    /// Its part in MIG, where it has one: cut into instances, or one of those instances.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<MigRole>,
}

/// A GPU's part in MIG (seed 004).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "role")]
pub enum MigRole {
    /// Its MIG mode is on: work runs in its instances, each listed as a GPU of its own, and none on it.
    Cut,
    /// A MIG instance, held whole by one engine: its index is [`instance_index`] of its GPU's.
    Instance {
        /// The index of the GPU it is cut from.
        parent: u32,
        /// Its profile, such as `3g.40gb`.
        profile: String,
    },
}

/// The index on its machine of MIG instance `n` of GPU `parent` (NVML's order of the GPU's MIG devices):
/// GPUs are numbered from 0 and instances from 1000 up, so an instance's address never meets a GPU's and
/// says which GPU it is cut from (instance 2 of GPU 0 is 1002, of GPU 1 2002).
pub fn instance_index(parent: u32, n: u32) -> u32 {
    INSTANCES_FROM * (parent + 1) + n
}

/// The GPU and the instance number an index names, where it names a MIG instance.
pub fn instance_of(index: u32) -> Option<(u32, u32)> {
    (index >= INSTANCES_FROM).then(|| (index / INSTANCES_FROM - 1, index % INSTANCES_FROM))
}

/// Where instance numbers start; NVML numbers a machine's GPUs (at most 64) and a GPU's instances (at most
/// 7) far below it.
const INSTANCES_FROM: u32 = 1000;

/// What a GPU of `total` offers to Tessera: its total less what is held outside; nothing where it is cut
/// into MIG instances (`mig`), whose memory its instances offer.
pub fn offered(total: Bytes, held_outside: Bytes, mig: Option<&MigRole>) -> Bytes {
    if mig == Some(&MigRole::Cut) {
        return Bytes::ZERO;
    }
    total.saturating_sub(held_outside)
}

impl Gpu {
    /// What the GPU offers to Tessera: [`offered`].
    pub fn offered(&self) -> Bytes {
        offered(self.total, self.held_outside, self.mig.as_ref())
    }

    /// Whether it is a MIG instance cut from GPU `index` of its machine.
    pub fn is_instance_of(&self, index: u32) -> bool {
        matches!(&self.mig, Some(MigRole::Instance { parent, .. }) if *parent == index)
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

impl Machine {
    /// Whether `other` is this machine read again: the same GPUs (indices, UUIDs, models, vendors, totals,
    /// MIG roles) and the same capacity, with at most what other programs hold on each GPU, and whether
    /// each is healthy, changed.
    pub fn same_but_readings(&self, other: &Machine) -> bool {
        let unread = |m: &Machine| {
            let mut m = m.clone();
            for gpu in &mut m.gpus {
                gpu.held_outside = Bytes::ZERO;
                gpu.healthy = true;
            }
            m
        };
        unread(self) == unread(other)
    }
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
    /// A GPU numbered where MIG instances are numbered (from 1000 up), or a MIG instance numbered elsewhere.
    #[error("GPU index {} of {} is where MIG instances are numbered (from 1000 up); number a GPU as NVML does, from 0", .0.index, .0.machine)]
    MisnumberedGpu(GpuRef),
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
                let instance = matches!(gpu.mig, Some(MigRole::Instance { parent, .. })
                    if instance_of(gpu.index).is_some_and(|(p, _)| p == parent));
                if instance != instance_of(gpu.index).is_some() {
                    return Err(InventoryError::MisnumberedGpu(GpuRef::new(
                        &machine.name,
                        gpu.index,
                    )));
                }
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

    /// The inventory with `machine` as a fresh reading has it: in place of the machine of that name, or
    /// added when there was none.
    pub fn with_machine(&self, machine: Machine) -> Result<Inventory, InventoryError> {
        let mut machines: Vec<Machine> = self
            .machines
            .iter()
            .filter(|m| m.name != machine.name)
            .cloned()
            .collect();
        machines.push(machine);
        Inventory::new(machines)
    }

    /// Takes the readings of `machine` (what other programs hold on each GPU, whether each is healthy)
    /// into machine `m`, which is [`Machine::same_but_readings`] it.
    pub(crate) fn set_readings(&mut self, m: usize, machine: &Machine) {
        for (gpu, read) in self.machines[m].gpus.iter_mut().zip(&machine.gpus) {
            gpu.held_outside = read.held_outside;
            gpu.healthy = read.healthy;
        }
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
    fn a_fresh_reading_of_a_machine_takes_its_place_and_a_new_one_is_added() {
        let inv = Inventory::new(vec![machine("alpha", &[8]), machine("zeta", &[8])]).unwrap();
        let read = inv.with_machine(machine("alpha", &[24, 24])).unwrap();
        assert_eq!(read.machines().len(), 2);
        assert_eq!(read.machine("alpha").unwrap().gpus.len(), 2);
        let grown = inv.with_machine(machine("beta", &[8])).unwrap();
        let names: Vec<_> = grown.machines().iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["alpha", "beta", "zeta"]);
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
    fn a_gpu_ref_reads_back_from_its_id() {
        for gpu in [
            GpuRef::new("majin", 0),
            GpuRef::new("atlas", 7),
            GpuRef::new("host:8080", 4_294_967_295),
        ] {
            assert_eq!(gpu.id().parse::<GpuRef>(), Ok(gpu.clone()));
        }
        assert_eq!(GpuRef::new("majin", 0).id(), "majin:0");
        assert_eq!(GpuRef::new("majin", 0).to_string(), "GPU 0 of majin");
    }

    #[test]
    fn a_gpu_ref_splits_at_the_last_colon_and_reads_leading_zeros() {
        assert_eq!("atlas:00".parse(), Ok(GpuRef::new("atlas", 0)));
        assert_eq!("a:b:3".parse(), Ok(GpuRef::new("a:b", 3)));
    }

    #[test]
    fn a_gpu_not_named_as_machine_and_index_is_refused_with_what_to_fix() {
        let read = |s: &str| s.parse::<GpuRef>().map_err(|e| e.to_string());
        assert_eq!(
            read("atlas"),
            Err("GPU \"atlas\": name it as machine:index, such as majin:0".into())
        );
        assert_eq!(
            read(":0"),
            Err("GPU \":0\": name its machine before the ':', such as majin:0".into())
        );
        for bad in [
            "a:b",
            "atlas:-1",
            "atlas: 1",
            "atlas:",
            "atlas:1 ",
            "atlas:+1",
            "atlas:4294967296",
        ] {
            assert_eq!(
                read(bad),
                Err(format!(
                    "GPU \"{bad}\": after the ':' give the GPU's index on its machine in digits, such as majin:0"
                )),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_list_of_gpus_is_read_in_order() {
        let ids = ["node:1".to_owned(), "atlas:0".to_owned()];
        assert_eq!(
            parse_gpu_list(&ids).unwrap().gpus(),
            [GpuRef::new("node", 1), GpuRef::new("atlas", 0)]
        );
        assert_eq!(parse_gpu_list(&[]), Err(GpuRefError::NoGpu));
        let bad = ["node:1".to_owned(), "atlas".to_owned()];
        assert_eq!(
            parse_gpu_list(&bad),
            Err(GpuRefError::NotMachineIndex("atlas".into()))
        );
    }

    #[test]
    fn a_list_that_names_one_gpu_twice_is_refused() {
        let ids = [
            "atlas:0".to_owned(),
            "node:1".to_owned(),
            "atlas:00".to_owned(),
        ];
        let err = parse_gpu_list(&ids).unwrap_err();
        assert_eq!(
            err,
            GpuRefError::ListedTwice {
                first: "atlas:0".into(),
                again: "atlas:00".into(),
                gpu: GpuRef::new("atlas", 0),
            }
        );
        assert_eq!(
            err.to_string(),
            "\"atlas:00\" names GPU 0 of atlas, which \"atlas:0\" names already; list each GPU once"
        );
        let same = ["node:1".to_owned(), "node:1".to_owned()];
        assert_eq!(
            parse_gpu_list(&same).unwrap_err().to_string(),
            "\"node:1\" is listed twice; list each GPU once"
        );
    }

    #[test]
    fn a_choice_of_gpus_has_at_least_one_and_each_once() {
        let atlas0 = GpuRef::new("atlas", 0);
        assert_eq!(
            GpuChoice::new(Vec::new()).unwrap_err().to_string(),
            "choose at least one GPU, such as \"gpus\": [\"majin:0\"]"
        );
        let twice = GpuChoice::new(vec![atlas0.clone(), GpuRef::new("node", 1), atlas0.clone()]);
        assert_eq!(
            twice.unwrap_err().to_string(),
            "GPU 0 of atlas is chosen twice; choose each GPU once"
        );
        assert_eq!(
            GpuChoice::new(vec![atlas0.clone()]).unwrap().gpus(),
            [atlas0]
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
