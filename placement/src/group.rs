//! Which sharing group a deployed model joins, the line the wizard states about it (seed 003), and the rules
//! of a group's GPUs: which it holds, which a new group may be started on, and what each member holds there.

use crate::inventory::{GpuRef, Inventory};
use crate::plan::GroupGpu;
use crate::schedule::Assignment;
use crate::units::{BasisPoints, Bytes};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The group a model deployed with sharing goes into.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupChoice {
    /// The group already running on the chosen nodes.
    Join(String),
    /// A new group: named by the model's recipe, or after the model.
    New {
        /// The group's name.
        name: String,
        /// True when no recipe named it and it takes the model's name.
        named_after_model: bool,
    },
}

impl GroupChoice {
    /// The group's name.
    pub fn name(&self) -> &str {
        match self {
            GroupChoice::Join(name) | GroupChoice::New { name, .. } => name,
        }
    }

    /// Whether the deploy starts the group (the router then moves into it and restarts).
    pub fn is_new(&self) -> bool {
        matches!(self, GroupChoice::New { .. })
    }

    /// The wizard's line: `This model joins text-router.` or `Tessera names the group after this model.`
    pub fn line(&self) -> String {
        match self {
            GroupChoice::New {
                named_after_model: true,
                ..
            } => "Tessera names the group after this model.".to_owned(),
            GroupChoice::Join(name) | GroupChoice::New { name, .. } => {
                format!("This model joins {name}.")
            }
        }
    }
}

/// Nodes or GPUs that cannot take one group.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum GroupError {
    /// The chosen nodes run different groups.
    #[error("The chosen nodes run two sharing groups, {0} and {1}; choose nodes of one group.")]
    TwoGroups(String, String),
    /// No GPU was chosen for a new group.
    #[error("a group runs on GPUs: choose at least one")]
    NoGpus,
    /// A GPU the inventory does not have.
    #[error("{0} is not in the inventory")]
    UnknownGpu(GpuRef),
    /// A GPU that reports 0 bytes of memory: a share of it is 0.
    #[error("{0} reports no memory, so no share of it can be planned; check its driver")]
    NoMemory(GpuRef),
    /// An unhealthy GPU.
    #[error("{0} is unhealthy; choose another")]
    Unhealthy(GpuRef),
    /// A GPU cut into MIG instances: work runs in those, each held whole.
    #[error("{0} is cut into MIG instances, each holding one engine whole: deploy the model on one of them whole, or choose another GPU")]
    MigCut(GpuRef),
    /// A MIG instance, which one engine holds whole.
    #[error("{0} holds one engine whole: deploy the model on it whole, or choose another GPU")]
    MigInstance(GpuRef),
    /// GPUs of different sizes: one share could not mean one amount of memory on each.
    #[error("a group's shares are of one GPU's memory: choose GPUs of the same size")]
    DifferentSizes {
        /// The first GPU chosen.
        first: GpuRef,
        /// Its memory.
        first_total: Bytes,
        /// The first GPU chosen of another size.
        other: GpuRef,
        /// Its memory.
        other_total: Bytes,
    },
}

/// The group a model joins: the one running on the chosen nodes (of several, the one its recipe names);
/// when none runs, the group its recipe names; otherwise a new group named after the model.
pub fn choose_group(
    model: &str,
    recipe_group: Option<&str>,
    groups_on_nodes: &[&str],
) -> Result<GroupChoice, GroupError> {
    let mut running = groups_on_nodes.iter().copied();
    match running.next() {
        Some(first) => match running.find(|g| *g != first) {
            Some(_) if recipe_group.is_some_and(|r| groups_on_nodes.contains(&r)) => {
                Ok(GroupChoice::Join(recipe_group.expect("checked").to_owned()))
            }
            Some(other) => Err(GroupError::TwoGroups(first.to_owned(), other.to_owned())),
            None => Ok(GroupChoice::Join(first.to_owned())),
        },
        None => Ok(match recipe_group {
            Some(name) => GroupChoice::New {
                name: name.to_owned(),
                named_after_model: false,
            },
            None => GroupChoice::New {
                name: model.to_owned(),
                named_after_model: true,
            },
        }),
    }
}

/// The GPUs a group chosen on `chosen` holds, sorted by machine then index, each once: on a machine whose
/// containers see every GPU (WSL2) every GPU of it, since shared work there takes memory on each; elsewhere
/// exactly the chosen ones. A GPU the inventory does not have is kept as given, for the caller to refuse.
pub fn group_gpus(inventory: &Inventory, chosen: &[GpuRef]) -> Vec<GpuRef> {
    let mut gpus = BTreeSet::new();
    for gpu in chosen {
        if let Some(machine) = inventory
            .machine(&gpu.machine)
            .filter(|m| m.all_gpus_visible)
        {
            gpus.extend(
                machine
                    .gpus
                    .iter()
                    .map(|g| GpuRef::new(&machine.name, g.index)),
            );
        }
        gpus.insert(gpu.clone());
    }
    gpus.into_iter().collect()
}

/// Whether a new group may start on the `chosen` GPUs: at least one, each in the inventory, reporting memory
/// and healthy, and all of one size (a share is a share of one GPU's memory).
pub fn check_new_group(inventory: &Inventory, chosen: &[GpuRef]) -> Result<(), GroupError> {
    let Some(first) = chosen.first() else {
        return Err(GroupError::NoGpus);
    };
    let mut first_total = None;
    for gpu in chosen {
        let found = inventory
            .gpu(gpu)
            .ok_or_else(|| GroupError::UnknownGpu(gpu.clone()))?;
        if found.total == Bytes::ZERO {
            return Err(GroupError::NoMemory(gpu.clone()));
        }
        if !found.healthy {
            return Err(GroupError::Unhealthy(gpu.clone()));
        }
        match found.mig {
            Some(crate::MigRole::Cut) => return Err(GroupError::MigCut(gpu.clone())),
            Some(crate::MigRole::Instance { .. }) => {
                return Err(GroupError::MigInstance(gpu.clone()))
            }
            None => {}
        }
        let first_total = *first_total.get_or_insert(found.total);
        if found.total != first_total {
            return Err(GroupError::DifferentSizes {
                first: first.clone(),
                first_total,
                other: gpu.clone(),
                other_total: found.total,
            });
        }
    }
    Ok(())
}

/// What one member with `share` holds on the group's `gpus`: one assignment per machine, machines in name
/// order, each with that machine's GPU indices ascending and `share` of its first listed GPU's memory on each.
pub fn member_assignments(
    inventory: &Inventory,
    gpus: &[GpuRef],
    share: BasisPoints,
) -> Result<Vec<Assignment>, GroupError> {
    let mut by_machine: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
    for gpu in gpus {
        by_machine
            .entry(gpu.machine.as_str())
            .or_default()
            .insert(gpu.index);
    }
    by_machine
        .into_iter()
        .map(|(machine, indices)| {
            let mut total = None;
            for &index in &indices {
                let gpu = GpuRef::new(machine, index);
                let found = inventory.gpu(&gpu).ok_or(GroupError::UnknownGpu(gpu))?;
                total.get_or_insert(found.total);
            }
            Ok(Assignment {
                machine: machine.to_owned(),
                gpus: indices.into_iter().collect(),
                shared: total.map(|t: Bytes| t.share(share)),
                cpu_cores: 0,
                memory: Bytes::ZERO,
            })
        })
        .collect()
}

/// A GPU a new group could start on, as the deploy wizard sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The GPU, with what shared work already takes of it.
    pub gpu: GroupGpu,
    /// Fit to run work.
    pub healthy: bool,
    /// Held whole by a worker: no share of it can be planned.
    pub held_whole: bool,
}

/// `width` of `candidates` (one node's GPUs) for a new group whose member takes `share`: healthy, not held
/// whole, and by best fit (the fullest that still has room for the share first, so that free GPUs stay
/// whole; then those without room, whose verdict will say so), ties by index; returned by index. When
/// fewer than `width` are usable, how many are.
pub fn pick_new_group_gpus(
    candidates: &[Candidate],
    width: u32,
    share: BasisPoints,
) -> Result<Vec<GroupGpu>, usize> {
    let mut usable: Vec<(bool, Bytes, &GroupGpu)> = candidates
        .iter()
        .filter(|c| c.healthy && !c.held_whole)
        .map(|c| {
            let room = c.gpu.offered().saturating_sub(c.gpu.taken_by_others);
            let need = c.gpu.total.share(share);
            (room < need, room.saturating_sub(need), &c.gpu)
        })
        .collect();
    if usable.len() < width as usize {
        return Err(usable.len());
    }
    usable.sort_by_key(|&(short, left, gpu)| (short, left, gpu.gpu.index));
    let mut chosen: Vec<GroupGpu> = usable
        .into_iter()
        .take(width as usize)
        .map(|(_, _, gpu)| gpu.clone())
        .collect();
    chosen.sort_by_key(|g| g.gpu.index);
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::machine;

    fn refs(ids: &[&str]) -> Vec<GpuRef> {
        ids.iter().map(|id| id.parse().unwrap()).collect()
    }

    /// node: two 24 GB GPUs and a 48 GB one; desk: a WSL2 PC with a 12 GB and an 8 GB GPU.
    fn fleet() -> Inventory {
        let mut desk = machine("desk", &[12, 8]);
        desk.all_gpus_visible = true;
        Inventory::new(vec![machine("node", &[24, 24, 48]), desk]).unwrap()
    }

    #[test]
    fn a_model_joins_the_group_running_on_its_nodes() {
        let choice = choose_group("glm-5.3", None, &["text-router", "text-router"]).unwrap();
        assert_eq!(choice, GroupChoice::Join("text-router".into()));
        assert_eq!(choice.line(), "This model joins text-router.");
        assert!(!choice.is_new());
    }

    #[test]
    fn with_no_group_and_no_recipe_group_the_group_is_named_after_the_model() {
        let choice = choose_group("glm-5.3-shared-with-vision", None, &[]).unwrap();
        assert_eq!(choice.name(), "glm-5.3-shared-with-vision");
        assert_eq!(choice.line(), "Tessera names the group after this model.");
        assert!(choice.is_new());
    }

    #[test]
    fn with_no_group_running_the_recipe_names_it() {
        let choice = choose_group("glm", Some("text-router"), &[]).unwrap();
        assert_eq!(
            choice,
            GroupChoice::New {
                name: "text-router".into(),
                named_after_model: false
            }
        );
        assert_eq!(choice.line(), "This model joins text-router.");
    }

    #[test]
    fn a_group_starts_neither_on_a_gpu_cut_into_mig_instances_nor_on_an_instance() {
        let mut node = machine("node", &[80, 80]);
        node.gpus[1].mig = Some(crate::MigRole::Cut);
        node.gpus.push(crate::Gpu {
            index: crate::mig::instance_index(1, 0),
            mig: Some(crate::MigRole::Instance {
                parent: 1,
                profile: "3g.40gb".into(),
            }),
            ..crate::testing::gpu(0, 40)
        });
        let inv = Inventory::new(vec![node]).unwrap();
        assert_eq!(
            check_new_group(&inv, &refs(&["node:1"])).unwrap_err().to_string(),
            "GPU 1 of node is cut into MIG instances, each holding one engine whole: deploy the model on one of them whole, or choose another GPU"
        );
        assert_eq!(
            check_new_group(&inv, &refs(&["node:2000"])).unwrap_err().to_string(),
            "MIG instance 0 of GPU 1 of node holds one engine whole: deploy the model on it whole, or choose another GPU"
        );
        assert_eq!(check_new_group(&inv, &refs(&["node:0"])), Ok(()));
    }

    #[test]
    fn nodes_of_two_groups_are_refused_unless_the_recipe_names_one_of_them() {
        assert_eq!(
            choose_group("glm", Some("b"), &["a", "b"]).unwrap(),
            GroupChoice::Join("b".to_owned()),
            "of two groups on the nodes, the one its recipe names"
        );
        let err = choose_group("glm", Some("c"), &["a", "b"]).unwrap_err();
        assert_eq!(err, GroupError::TwoGroups("a".to_owned(), "b".to_owned()));
        let err = choose_group("glm", None, &["a", "b"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "The chosen nodes run two sharing groups, a and b; choose nodes of one group."
        );
    }

    #[test]
    fn a_group_holds_exactly_the_gpus_chosen_sorted_and_once() {
        let inv = fleet();
        assert_eq!(
            group_gpus(&inv, &refs(&["node:1", "node:0", "node:1"])),
            refs(&["node:0", "node:1"])
        );
        assert_eq!(group_gpus(&inv, &[]), Vec::<GpuRef>::new());
    }

    #[test]
    fn a_group_chosen_on_one_gpu_of_a_wsl2_pc_holds_every_gpu_of_it() {
        let inv = fleet();
        assert_eq!(
            group_gpus(&inv, &refs(&["node:2", "desk:1"])),
            refs(&["desk:0", "desk:1", "node:2"])
        );
    }

    #[test]
    fn a_gpu_not_in_the_inventory_is_kept_as_given_for_the_caller_to_refuse() {
        let inv = fleet();
        assert_eq!(
            group_gpus(&inv, &refs(&["nowhere:3", "node:9", "desk:5"])),
            refs(&["desk:0", "desk:1", "desk:5", "node:9", "nowhere:3"])
        );
    }

    #[test]
    fn a_new_group_may_start_on_healthy_gpus_of_one_size() {
        let inv = fleet();
        assert_eq!(check_new_group(&inv, &refs(&["node:0", "node:1"])), Ok(()));
        assert_eq!(check_new_group(&inv, &refs(&["desk:1"])), Ok(()));
    }

    #[test]
    fn a_new_group_on_no_gpu_or_an_unknown_one_is_refused() {
        let inv = fleet();
        assert_eq!(
            check_new_group(&inv, &[]).unwrap_err().to_string(),
            "a group runs on GPUs: choose at least one"
        );
        assert_eq!(
            check_new_group(&inv, &refs(&["node:0", "node:7"]))
                .unwrap_err()
                .to_string(),
            "GPU 7 of node is not in the inventory"
        );
    }

    #[test]
    fn a_new_group_on_a_gpu_without_memory_or_unhealthy_is_refused() {
        let mut x = machine("x", &[0, 24, 24]);
        x.gpus[2].healthy = false;
        let inv = Inventory::new(vec![x]).unwrap();
        assert_eq!(
            check_new_group(&inv, &refs(&["x:0"]))
                .unwrap_err()
                .to_string(),
            "GPU 0 of x reports no memory, so no share of it can be planned; check its driver"
        );
        assert_eq!(
            check_new_group(&inv, &refs(&["x:1", "x:2"]))
                .unwrap_err()
                .to_string(),
            "GPU 2 of x is unhealthy; choose another"
        );
    }

    #[test]
    fn a_new_group_on_gpus_of_different_sizes_is_refused() {
        let inv = fleet();
        let err = check_new_group(&inv, &refs(&["node:0", "node:2"])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "a group's shares are of one GPU's memory: choose GPUs of the same size"
        );
        assert_eq!(
            err,
            GroupError::DifferentSizes {
                first: GpuRef::new("node", 0),
                first_total: Bytes::gb(24),
                other: GpuRef::new("node", 2),
                other_total: Bytes::gb(48),
            }
        );
    }

    #[test]
    fn a_member_holds_its_share_on_each_machine_of_the_group() {
        let mut inv_machines = vec![machine("node", &[24, 24]), machine("atlas", &[80])];
        inv_machines[1].cpu_cores = 8;
        let inv = Inventory::new(inv_machines).unwrap();
        let held = member_assignments(
            &inv,
            &refs(&["node:1", "atlas:0", "node:0"]),
            BasisPoints::percent(25),
        )
        .unwrap();
        assert_eq!(
            held,
            [
                Assignment {
                    machine: "atlas".into(),
                    gpus: vec![0],
                    shared: Some(Bytes::gb(20)),
                    cpu_cores: 0,
                    memory: Bytes::ZERO,
                },
                Assignment {
                    machine: "node".into(),
                    gpus: vec![0, 1],
                    shared: Some(Bytes::gb(6)),
                    cpu_cores: 0,
                    memory: Bytes::ZERO,
                },
            ]
        );
        assert_eq!(
            member_assignments(&inv, &[], BasisPoints::percent(25)),
            Ok(Vec::new())
        );
    }

    #[test]
    fn on_a_wsl2_pc_a_member_holds_its_share_of_the_first_gpu_on_both() {
        let inv = fleet();
        let gpus = group_gpus(&inv, &refs(&["desk:0"]));
        let held = member_assignments(&inv, &gpus, BasisPoints::percent(50)).unwrap();
        assert_eq!(held.len(), 1);
        assert_eq!(held[0].machine, "desk");
        assert_eq!(held[0].gpus, [0, 1]);
        assert_eq!(held[0].shared, Some(Bytes::gb(6)));
    }

    #[test]
    fn a_member_on_a_gpu_not_in_the_inventory_is_refused_naming_it() {
        let inv = fleet();
        let err = member_assignments(
            &inv,
            &refs(&["node:0", "node:1", "node:3"]),
            BasisPoints::percent(10),
        )
        .unwrap_err();
        assert_eq!(err, GroupError::UnknownGpu(GpuRef::new("node", 3)));
        let err = member_assignments(
            &inv,
            &refs(&["node:0", "nowhere:1"]),
            BasisPoints::percent(10),
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "GPU 1 of nowhere is not in the inventory");
    }

    fn candidate(index: u32, gb: u64, taken_gb: u64, healthy: bool, held_whole: bool) -> Candidate {
        Candidate {
            gpu: GroupGpu {
                gpu: GpuRef::new("node", index),
                total: Bytes::gb(gb),
                held_outside: Bytes::ZERO,
                taken_by_others: Bytes::gb(taken_gb),
            },
            healthy,
            held_whole,
        }
    }

    #[test]
    fn a_new_group_takes_the_fullest_gpus_that_still_fit_and_leaves_free_ones_whole() {
        let node = [
            candidate(0, 80, 0, true, false),
            candidate(1, 80, 40, true, false),
            candidate(2, 80, 70, true, false),
            candidate(3, 80, 0, true, true),
            candidate(4, 80, 0, false, false),
        ];
        // 25 % is 20 GB: GPU 2 has 10 left (too little), GPU 1 has 40, GPU 0 has 80.
        let one = pick_new_group_gpus(&node, 1, BasisPoints::percent(25)).unwrap();
        assert_eq!(one.iter().map(|g| g.gpu.index).collect::<Vec<_>>(), [1]);
        let two = pick_new_group_gpus(&node, 2, BasisPoints::percent(25)).unwrap();
        assert_eq!(two.iter().map(|g| g.gpu.index).collect::<Vec<_>>(), [0, 1]);
        // Three usable at all: GPU 3 is held whole and GPU 4 unhealthy.
        assert_eq!(
            pick_new_group_gpus(&node, 4, BasisPoints::percent(25)),
            Err(3)
        );
    }

    #[test]
    fn what_a_groups_gpu_offers_counts_every_sharer_but_its_own_members() {
        let sharers = [
            (Some("text-router"), Bytes::gb(4)),
            (None, Bytes::gb(2)),
            (Some("other"), Bytes::gb(1)),
        ];
        let of = |group| {
            GroupGpu::of(
                GpuRef::new("majin", 0),
                Bytes::gb(8),
                Bytes::gb(1),
                sharers,
                group,
            )
        };
        assert_eq!(of(Some("text-router")).taken_by_others, Bytes::gb(3));
        assert_eq!(of(None).taken_by_others, Bytes::gb(7));
    }
}
