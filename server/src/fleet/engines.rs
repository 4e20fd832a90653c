//! Which engines the committed state wants running, and with which spec: the desired state the runtime
//! follows. Derived from the committed state and the ledger alone, so that it costs no database read.

use super::committed::{Committed, Models, Worker};
use super::groups::Group;
use super::ledger::Ledger;
use crate::catalog::{CatalogModel, Engine};
use crate::inventory::Ours;
use crate::runtime::spec::{EngineSpec, Host, MpsClient, Recipe};
use crate::runtime::Hosts;
use placement::sharing::Sharing;
use placement::{Assignment, BasisPoints, Bytes, GpuRef, Hold};
use std::collections::BTreeMap;

/// Every engine the committed state wants running: each group member on each machine of its group, then
/// each placed worker, oldest first. A holder the ledger could not hold (its GPU is gone) runs nothing.
pub(super) fn desired(committed: &Committed, ledger: &Ledger, hosts: &Hosts) -> Vec<EngineSpec> {
    let mut specs: Vec<EngineSpec> = committed
        .groups
        .iter()
        .flat_map(|g| group_engines(committed, ledger, hosts, &g.name))
        .collect();
    specs.extend(
        committed
            .workers
            .iter()
            .filter_map(|w| worker_engine(committed, ledger, hosts, w)),
    );
    specs
}

/// The engines of the workers `names` among those [`desired`] has: a write that changed them alone tells
/// the runtime of these.
pub(super) fn worker_engines<'a>(
    committed: &Committed,
    ledger: &Ledger,
    hosts: &Hosts,
    names: impl IntoIterator<Item = &'a String>,
) -> Vec<EngineSpec> {
    names
        .into_iter()
        .filter_map(|name| committed.worker(name))
        .filter_map(|w| worker_engine(committed, ledger, hosts, w))
        .collect()
}

/// The engine of `worker`, where it holds what it was placed on and runs something.
fn worker_engine(
    committed: &Committed,
    ledger: &Ledger,
    hosts: &Hosts,
    worker: &Worker,
) -> Option<EngineSpec> {
    let assignment = ledger.scheduler().workers().get(&worker.name)?;
    let recipe = worker_recipe(worker, &committed.models)?;
    Some(spec(
        committed,
        ledger,
        hosts,
        &worker.name,
        assignment,
        recipe,
    ))
}

/// The engines of `holders` (workers, and members on a machine) among those [`desired`] has.
pub(super) fn of_holders(
    committed: &Committed,
    ledger: &Ledger,
    hosts: &Hosts,
    holders: &std::collections::BTreeSet<String>,
) -> Vec<EngineSpec> {
    let mut workers = Vec::new();
    let mut groups = std::collections::BTreeSet::new();
    for holder in holders {
        match placement::holder::Holder::parse(holder) {
            placement::holder::Holder::Worker(name) => workers.push(name.to_owned()),
            placement::holder::Holder::Member { group, .. } => {
                groups.insert(group);
            }
        }
    }
    let mut desired = worker_engines(committed, ledger, hosts, &workers);
    for group in groups {
        desired.extend(
            group_engines(committed, ledger, hosts, group)
                .into_iter()
                .filter(|spec| holders.contains(&spec.unit)),
        );
    }
    desired
}

/// The engines of one group's members, in plan order, one per unit the member holds its share under (on a
/// machine, or a replica's GPU).
pub(super) fn group_engines(
    committed: &Committed,
    ledger: &Ledger,
    hosts: &Hosts,
    group: &str,
) -> Vec<EngineSpec> {
    let Some(group) = committed.group(group) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for member in &group.members {
        let Some(recipe) = member_recipe(committed, group, &member.member) else {
            tracing::error!(
                "{} of group {} is not in the catalog",
                member.member,
                group.name
            );
            continue;
        };
        let asleep = group.asleep.contains_key(&member.member);
        for (unit, _) in group.units(&member.member) {
            if let Some(assignment) = ledger.scheduler().workers().get(&unit) {
                let mut spec = spec(committed, ledger, hosts, &unit, assignment, recipe.clone());
                if asleep {
                    // Asleep it holds only what it keeps, but it is the engine it was started as: its
                    // whole share, so that neither a sleep nor a wake restarts it.
                    spec.share = awake_share(ledger, assignment, member.share).or(spec.share);
                    spec.asleep = true;
                }
                out.push(spec);
            }
        }
    }
    out
}

/// What `member` of `group` runs: its catalog model's recipe with its own serving configuration.
fn member_recipe(committed: &Committed, group: &Group, member: &str) -> Option<Recipe> {
    let model = committed.model(member)?;
    let serving = group.serving.get(member).cloned().unwrap_or_default();
    let mut recipe = model_recipe(model);
    recipe.args.extend(serving.args);
    recipe.env.extend(serving.env);
    Some(recipe)
}

/// Whether `member` of `group` runs an engine that can sleep (its command line asks for vLLM's or
/// SGLang's sleep mode): past its keep-alive, an on-demand one is put to sleep, not stopped.
pub(super) fn member_sleeps(committed: &Committed, group: &Group, member: &str) -> bool {
    member_recipe(committed, group, member).is_some_and(|r| r.sleep_api().is_some())
}

/// What a member's `share` takes of each GPU of `assignment` (what it holds asleep): what it took awake.
fn awake_share(ledger: &Ledger, assignment: &Assignment, share: BasisPoints) -> Option<Bytes> {
    let gpus: Vec<GpuRef> = assignment
        .gpus
        .iter()
        .map(|i| GpuRef::new(&assignment.machine, *i))
        .collect();
    placement::group::member_assignments(ledger.inventory(), &gpus, share)
        .ok()?
        .into_iter()
        .next()?
        .shared
}

fn spec(
    committed: &Committed,
    ledger: &Ledger,
    hosts: &Hosts,
    unit: &str,
    assignment: &Assignment,
    recipe: Recipe,
) -> EngineSpec {
    let gpus: Vec<&placement::Gpu> = assignment
        .gpus
        .iter()
        .filter_map(|i| {
            ledger
                .inventory()
                .gpu(&GpuRef::new(&assignment.machine, *i))
        })
        .collect();
    // Under MPS, an engine on one GPU (the only kind an MPS GPU takes) runs as its server's client.
    let mps = match (assignment.shared, gpus.as_slice()) {
        (Some(_), [gpu]) => {
            let sharing = committed.sharing(&GpuRef::new(&assignment.machine, gpu.index));
            (sharing.mode == Sharing::Mps).then(|| MpsClient {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                compute_percent: sharing.compute_percent,
            })
        }
        _ => None,
    };
    // A node's GPUs as last read, not as at startup: its instances, and UUIDs made again after a reboot.
    let host = match hosts.host(&assignment.machine) {
        Host::Cluster { address, demo, .. } => Host::Cluster {
            address,
            demo,
            uuids: ledger
                .inventory()
                .machine(&assignment.machine)
                .into_iter()
                .flat_map(|m| m.gpus.iter().map(|g| (g.index, g.uuid.clone())))
                .collect(),
        },
        host => host,
    };
    EngineSpec {
        unit: unit.to_owned(),
        host,
        gpu_total: gpus.first().map(|g| g.total).unwrap_or_default(),
        gpu_offered: gpus.iter().map(|g| g.offered()).min().unwrap_or_default(),
        gpus: assignment.gpus.clone(),
        share: assignment.shared,
        recipe,
        machine: assignment.machine.clone(),
        mps,
        mig: gpus
            .iter()
            .filter(|g| matches!(g.mig, Some(placement::MigRole::Instance { .. })))
            .map(|g| (g.index, g.uuid.clone()))
            .collect(),
        asleep: false,
    }
}

fn model_recipe(model: &CatalogModel) -> Recipe {
    Recipe {
        engine: model.engine,
        model_path: model.model_path.clone(),
        command: model.command.clone(),
        args: model.args.clone(),
        env: model.env.clone(),
    }
}

/// What a worker runs: its own command, or its catalog model's recipe with the deployment's additions.
fn worker_recipe(worker: &Worker, catalog: &Models) -> Option<Recipe> {
    let Some(name) = &worker.model else {
        return Some(Recipe {
            engine: Engine::Command,
            model_path: String::new(),
            command: worker.command.clone(),
            args: Vec::new(),
            env: worker.env.clone(),
        });
    };
    let Some(model) = catalog.get(name) else {
        tracing::error!(
            "worker {} runs {name}, which is not in the catalog",
            worker.name
        );
        return None;
    };
    let mut recipe = model_recipe(model);
    recipe.args.extend(worker.args.iter().cloned());
    recipe.env.extend(worker.env.clone());
    Some(recipe)
}

/// What Tessera's own engines hold on `machine`'s GPUs (this machine's), for a reading of them: the
/// processes of every engine that runs (`running`: each engine's unit and PIDs), and, for the drivers that
/// give no per-process figures (WSL2) or other PIDs (a container), the memory the running holders stand
/// for on each GPU.
pub(super) fn ours(ledger: &Ledger, machine: &str, running: &[(String, Vec<u32>)]) -> Ours {
    Ours {
        pids: running
            .iter()
            .flat_map(|(_, pids)| pids.iter().copied())
            .collect(),
        shares: held_on(ledger, machine, |who| {
            running.iter().any(|(unit, _)| unit == who)
        }),
    }
}

/// What every holder committed on a cluster's `machine` stands for on each GPU: Ray gives no PIDs of a
/// job's processes, so in a node's readings these stand in for Tessera's engines. A holder whose engine has
/// not started yet counts too: memory held outside is then read low, never high, so that no reading takes
/// an engine that is still adopting or starting for something outside and evicts a holder for it.
pub(super) fn committed_on(ledger: &Ledger, machine: &str) -> Ours {
    Ours {
        pids: Vec::new(),
        shares: held_on(ledger, machine, |_| true),
    }
}

/// The memory the holders `counts` keeps take on each GPU of `machine`: a whole holder its GPU's total.
pub(super) fn held_on(
    ledger: &Ledger,
    machine: &str,
    counts: impl Fn(&str) -> bool,
) -> BTreeMap<u32, Bytes> {
    let Some(m) = ledger.inventory().machine(machine) else {
        return BTreeMap::new();
    };
    m.gpus
        .iter()
        .filter_map(|gpu| {
            let taken = match ledger.scheduler().hold(&GpuRef::new(machine, gpu.index))? {
                Hold::Shared(sharers) => sharers
                    .iter()
                    .filter(|(who, _)| counts(who))
                    .map(|(_, bytes)| *bytes)
                    .sum(),
                Hold::Whole(who) if counts(who) => gpu.total,
                Hold::Whole(_) | Hold::Free => return None,
            };
            Some((gpu.index, taken))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::ray::{ClusterMachine, NodeGpu};
    use placement::{Gpu, Inventory, Machine, MigRole};

    #[test]
    fn an_engine_on_a_node_names_its_gpu_by_the_uuid_last_read_there_a_mig_instance_s_among_them() {
        // As Tessera started: one whole GPU. As read since: cut by hand, its instance offered instead.
        let node = ClusterMachine {
            name: "nimbus".into(),
            node_id: "n1".into(),
            address: "10.0.0.9".into(),
            gpus: vec![NodeGpu {
                index: 0,
                uuid: "GPU-before".into(),
                memory: Bytes::gb(80),
                resource: "tessera_gpu_0_GPU-before".into(),
                profile: None,
            }],
            demo: false,
            alive: true,
            model: "NVIDIA-H100-80GB-HBM3".into(),
            cpu_cores: 16,
            memory: Bytes::gb(64),
        };
        let hosts = Hosts {
            cluster: [("nimbus".to_owned(), node.clone())].into(),
            ..Hosts::default()
        };
        let instance = Gpu {
            index: placement::mig::instance_index(0, 0),
            uuid: "MIG-after".into(),
            total: Bytes(40448 << 20),
            mig: Some(MigRole::Instance {
                parent: 0,
                profile: "3g.40gb".into(),
            }),
            ..node.machine().gpus[0].clone()
        };
        let inventory = Inventory::new(vec![Machine {
            gpus: vec![instance],
            ..node.machine()
        }])
        .unwrap();
        let committed = Committed {
            workers: Default::default(),
            groups: Default::default(),
            models: Default::default(),
            sharing: BTreeMap::new(),
            mig: BTreeMap::new(),
        };
        let ledger = Ledger::build(inventory, &committed);
        let assignment = Assignment {
            machine: "nimbus".into(),
            gpus: vec![1000],
            shared: None,
            cpu_cores: 0,
            memory: Bytes::ZERO,
        };
        let recipe = Recipe {
            engine: Engine::Command,
            model_path: String::new(),
            command: Some("serve".into()),
            args: Vec::new(),
            env: BTreeMap::new(),
        };
        let spec = spec(&committed, &ledger, &hosts, "asr", &assignment, recipe);
        let Host::Cluster { uuids, .. } = &spec.host else {
            panic!("a node's engine runs there: {:?}", spec.host);
        };
        assert_eq!(uuids, &BTreeMap::from([(1000, "MIG-after".to_owned())]));
        let launch = spec.command_line(8001, Bytes::gb(40)).unwrap();
        assert_eq!(launch.env["CUDA_VISIBLE_DEVICES"], "MIG-after");
    }
}
