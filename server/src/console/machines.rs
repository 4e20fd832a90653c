//! The Nodes tab and a machine's page: each machine's GPUs, what they hold and who shares them, what waits
//! for them; and a GPU's sharing mode, set from that page. The deploy forms offer the same GPUs.

use super::{app_error, whole_deployments, ConsoleService};
use crate::error::ApiError;
use crate::fleet::groups::Group;
use crate::fleet::{GpuView, MachineView};
use crate::input::SharingCommand;
use crate::runtime::{EngineState, EngineView};
use app::auth::Caller;
use app::error::AppError;
use app::views::{
    GpuCell, GpuDetail, GpuOption, GpuUse, MachineDetail, NodeModel, NodeOption, NodeRow,
    PendingLine, Sharer, WorkerLine,
};
use placement::Bytes;

fn sharers(gpu: &GpuView) -> Vec<Sharer> {
    gpu.sharers
        .iter()
        .map(|s| Sharer {
            name: s.worker.clone(),
            group: s.group.clone(),
            bytes: Bytes(s.bytes),
        })
        .collect()
}

fn gpu_option(gpu: &GpuView) -> GpuOption {
    GpuOption {
        index: gpu.index,
        model: gpu.model.clone(),
        total: Bytes(gpu.total_bytes),
        held_outside: Bytes(gpu.held_outside_bytes),
        healthy: gpu.healthy,
        held_whole: gpu.mode == "whole",
        sharers: sharers(gpu),
    }
}

pub(super) fn node_options(machines: &[MachineView]) -> Vec<NodeOption> {
    machines
        .iter()
        .filter(|m| !m.gpus.is_empty())
        .map(|m| NodeOption {
            name: m.name.clone(),
            // A GPU cut into MIG instances is not one to deploy on: its instances are.
            gpus: m
                .gpus
                .iter()
                .filter(|g| g.mig != Some(placement::MigRole::Cut))
                .map(gpu_option)
                .collect(),
        })
        .collect()
}

/// An engine's state, and its message where it is not serving (a loading engine's progress, a failure).
fn engine_of(engine: Option<&EngineView>) -> (Option<EngineState>, Option<String>) {
    match engine {
        Some(e) if e.state == EngineState::Healthy => (Some(e.state), None),
        Some(e) => (Some(e.state), e.message.clone()),
        None => (None, None),
    }
}

/// Whether a pending reason is about `machine`: `GPU 0 of majin: …`, `majin has …`, `majin: …`.
pub(super) fn concerns(reason: &str, machine: &str) -> bool {
    reason
        .strip_prefix(machine)
        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with(':'))
        || reason.contains(&format!(" of {machine}:"))
        || reason.contains(&format!(" of {machine} "))
}

impl ConsoleService {
    pub(super) async fn node_rows(&self) -> Result<Vec<NodeRow>, ApiError> {
        let committed = self.fleet.committed();
        let groups = &committed.groups;
        let workers = self.fleet.workers();
        Ok(self
            .fleet
            .machines()
            .iter()
            .map(|machine| {
                let here: Vec<&Group> = groups
                    .iter()
                    .filter(|g| g.gpus.iter().any(|gpu| gpu.machine == machine.name))
                    .map(|g| g.as_ref())
                    .collect();
                let mut models: Vec<NodeModel> = here
                    .iter()
                    .flat_map(|g| g.members.iter())
                    .map(|s| NodeModel {
                        name: s.member.clone(),
                        share: Some(s.share),
                    })
                    .collect();
                models.extend(
                    whole_deployments(&workers)
                        .filter(|w| w.machine.as_deref() == Some(&machine.name))
                        .map(|w| NodeModel {
                            name: w.model.clone().unwrap_or_default(),
                            share: None,
                        }),
                );
                // A GPU cut into MIG instances is counted as its instances, which hold an engine whole.
                let usable: Vec<&GpuView> = machine
                    .gpus
                    .iter()
                    .filter(|g| g.mig != Some(placement::MigRole::Cut))
                    .collect();
                let shareable: Vec<&GpuView> = usable
                    .iter()
                    .copied()
                    .filter(|g| g.healthy && g.mode != "whole" && g.mig.is_none())
                    .collect();
                NodeRow {
                    name: machine.name.clone(),
                    groups: here.iter().map(|g| g.name.clone()).collect(),
                    models,
                    gpus: usable.len() as u32,
                    shareable: shareable.len() as u32,
                    total: usable.iter().map(|g| Bytes(g.total_bytes)).sum(),
                    free: shareable
                        .iter()
                        .map(|g| Bytes(g.offered_bytes).saturating_sub(Bytes(g.taken_bytes)))
                        .sum(),
                    cells: usable
                        .iter()
                        .map(|g| {
                            let whole = g.mode == "whole";
                            GpuCell {
                                total: Bytes(g.total_bytes),
                                taken: if whole {
                                    Bytes(g.offered_bytes)
                                } else {
                                    Bytes(g.taken_bytes)
                                },
                                outside: Bytes(g.held_outside_bytes),
                                whole,
                                healthy: g.healthy,
                            }
                        })
                        .collect(),
                    gpu_model: match usable.split_first() {
                        Some((first, rest)) if rest.iter().all(|g| g.model == first.model) => {
                            first.model.clone()
                        }
                        Some(_) => "mixed".to_owned(),
                        None => String::new(),
                    },
                }
            })
            .collect())
    }

    pub(super) async fn machine_detail(&self, name: &str) -> Result<MachineDetail, ApiError> {
        let machine = self.fleet.machine(name)?;
        let since = crate::fleet::usage::now_ms()
            .saturating_sub(crate::fleet::readings::HISTORY.as_millis() as u64);
        let mut history = self.fleet.gpu_history(name, since).await?;
        let engines = self.fleet.runtime().engines();
        let workers = self.fleet.workers();
        let sharer_bytes = |who: &str| {
            machine
                .gpus
                .iter()
                .flat_map(|g| g.sharers.iter())
                .find(|s| s.worker == who)
                .map(|s| Bytes(s.bytes))
        };
        let mut lines: Vec<WorkerLine> = workers
            .iter()
            .filter(|w| w.machine.as_deref() == Some(name))
            .map(|w| {
                let (status, message) = engine_of(
                    engines
                        .iter()
                        .find(|e| e.worker.as_deref() == Some(&w.name)),
                );
                WorkerLine {
                    name: w.model.clone().unwrap_or_else(|| w.name.clone()),
                    group: None,
                    gpus: w.gpus.clone(),
                    shared: w.gpu_shared_gb.and(sharer_bytes(&w.name)),
                    status,
                    message,
                }
            })
            .collect();
        for group in &self.fleet.committed().groups {
            let gpus: Vec<u32> = group
                .gpus
                .iter()
                .filter(|g| g.machine == name)
                .map(|g| g.index)
                .collect();
            let Some(first) = gpus.first() else {
                continue;
            };
            let total = machine
                .gpus
                .iter()
                .find(|g| g.index == *first)
                .map(|g| Bytes(g.total_bytes))
                .unwrap_or_default();
            for share in &group.members {
                let (status, message) = engine_of(engines.iter().find(|e| {
                    e.group.as_deref() == Some(&group.name)
                        && e.model.as_deref() == Some(&share.member)
                        && e.machine == name
                }));
                lines.push(WorkerLine {
                    name: share.member.clone(),
                    group: Some(group.name.clone()),
                    gpus: gpus.clone(),
                    shared: Some(total.share(share.share)),
                    status,
                    message,
                });
            }
        }
        let pending = workers
            .iter()
            .filter(|w| w.state == "pending")
            .filter_map(|w| {
                let reasons: Vec<String> = w
                    .pending_reasons
                    .iter()
                    .filter(|r| concerns(r, name))
                    .cloned()
                    .collect();
                (!reasons.is_empty()).then(|| PendingLine {
                    name: w.name.clone(),
                    reasons,
                })
            })
            .collect();
        Ok(MachineDetail {
            unreachable_since: machine.unreachable_since.clone(),
            cpu_cores: machine.cpu_cores,
            cpu_cores_used: machine.cpu_cores_used,
            memory: Bytes(machine.memory_bytes),
            memory_used: Bytes(machine.memory_bytes_used),
            all_gpus_visible: machine.all_gpus_visible,
            gpus: machine
                .gpus
                .iter()
                .map(|g| GpuDetail {
                    index: g.index,
                    model: g.model.clone(),
                    uuid: g.uuid.clone(),
                    healthy: g.healthy,
                    total: Bytes(g.total_bytes),
                    held_outside: Bytes(g.held_outside_bytes),
                    usage: match (g.mode.as_str(), &g.held_by) {
                        ("whole", Some(by)) => GpuUse::Whole(by.clone()),
                        ("shared", _) => GpuUse::Shared,
                        _ => GpuUse::Free,
                    },
                    sharers: sharers(g),
                    summary: g.summary.clone(),
                    slowed: g
                        .sharers
                        .iter()
                        .filter_map(|s| {
                            Some(format!("{}: {}", s.worker, self.fleet.slowed(&s.worker)?))
                        })
                        .collect(),
                    sharing: g.sharing,
                    over_share: g
                        .sharers
                        .iter()
                        .filter_map(|s| s.over_share.clone())
                        .collect(),
                    history: history.remove(&g.index).unwrap_or_default(),
                    demo_figures: self.fleet.is_demo(name),
                    made_up: self.fleet.made_up(name),
                    mig: g.mig.clone(),
                    problem: g.problem.clone(),
                })
                .collect(),
            workers: lines,
            pending,
            name: machine.name,
        })
    }

    pub(super) async fn set_gpu_sharing(
        &self,
        actor: Caller,
        machine: String,
        index: u32,
        mode: String,
        compute_percent: Option<i64>,
        instances: Option<Vec<String>>,
    ) -> Result<app::views::SharingChange, AppError> {
        let command = SharingCommand::parse(
            placement::GpuRef::new(machine, index),
            &mode,
            compute_percent,
            instances,
        )
        .map_err(app_error)?;
        self.fleet
            .set_sharing(command, &actor.name)
            .await
            .map_err(app_error)
    }
}
