//! Sharing groups (seed 003): each group's committed share plan as stored and as the API shows it, what a
//! GPU offers a group, and the serving configuration each member runs with. Every member holds its share
//! on each of the group's GPUs in the scheduler, so shared workers and groups never overfill a GPU between
//! them. Changing a plan is in [`plan`]; carrying out a deploy is a deployment's ([`super::deployments`]).

mod plan;

pub use plan::PlanChange;
pub(crate) use plan::{check_revision, Note};
pub(super) use plan::{judged, plan_with, router_runs_everywhere, router_stays_pinned};

use super::{Fleet, Views};
use crate::catalog::Engine;
use crate::error::ApiError;
use crate::input::ServingSettings;
use crate::runtime::{EngineState, Progress};
use placement::holder::{self, Holder};
use placement::scale::Autoscale;
use placement::{
    judge, BasisPoints, Demand, GpuRef, GroupGpu, Hold, KeepAlive, PlanMember, Scheduler, Share,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// A group as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GroupView {
    /// Its name.
    pub name: String,
    /// The GPUs it runs on, as `machine:index`.
    pub gpus: Vec<String>,
    /// The revision to name when changing its plan.
    pub revision: i64,
    /// Its members in plan order.
    pub members: Vec<MemberView>,
    /// The most its plan holds at once, percent: the pinned shares and the largest on-demand one.
    pub total_percent: f64,
    /// The last plan change carried out (or being carried out) since the server started, step by step.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
}

/// A member of a group.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberView {
    /// The model.
    pub name: String,
    /// Its share of one GPU, percent.
    pub share_percent: f64,
    /// A system member (the router): not editable.
    pub locked: bool,
    /// Its engine on each machine of the group, and how each is.
    #[serde(default)]
    pub engines: Vec<MemberEngine>,
    /// Why it holds nothing on a machine of the group (a GPU left the inventory): its engine there does
    /// not run.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub not_held: Vec<String>,
    /// For a member loaded on demand: loaded or not, last used, its last cold start.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub on_demand: Option<app::views::OnDemand>,
    /// For a member whose replicas follow its load: how many, where, and the last decisions.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub replicas: Option<app::views::Replicas>,
}

/// A member's engine on one machine.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberEngine {
    /// The machine.
    pub machine: String,
    /// Its state.
    pub state: EngineState,
    /// Why it is not as wanted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A deployment's own serving configuration, as committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Serving {
    /// Arguments added to the model's recipe.
    pub args: Vec<String>,
    /// Environment variables added to the model's recipe.
    pub env: BTreeMap<String, String>,
}

impl From<ServingSettings> for Serving {
    fn from(settings: ServingSettings) -> Serving {
        let (args, env) = settings.into_parts();
        Serving { args, env }
    }
}

/// A group as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Group {
    pub(crate) name: String,
    /// The GPUs it holds: those chosen, and every GPU of a machine that sees them all (WSL2).
    pub(crate) gpus: Vec<GpuRef>,
    /// 0 for a group a deploy is about to start, not yet stored.
    pub(crate) revision: i64,
    pub(crate) members: Vec<Share>,
    /// Each member's own serving configuration.
    pub(crate) serving: BTreeMap<String, Serving>,
    /// The on-demand members and their keep-alives; every other member is pinned.
    pub(crate) demand: BTreeMap<String, KeepAlive>,
    /// The on-demand members loaded now.
    pub(crate) loaded: BTreeSet<String>,
    /// The members whose replicas follow their load, each replica on one GPU of the group; every other
    /// member runs on each of the group's machines, across the group's GPUs there.
    pub(crate) autoscale: BTreeMap<String, Autoscale>,
    /// The GPUs each of those runs a replica on now.
    pub(crate) placed: BTreeMap<String, BTreeSet<GpuRef>>,
    /// The loaded on-demand members asleep now: their engines run, holding only what they keep asleep.
    pub(crate) asleep: BTreeMap<String, Asleep>,
}

/// An on-demand member asleep: its engine runs with its weights in host memory, and holds on its GPUs only
/// what it keeps asleep, once that was measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Asleep {
    /// When it was put to sleep, ms since the epoch.
    pub(crate) since_ms: u64,
    /// What it keeps on each of its GPUs, measured once it slept, as a share of the GPU rounded up; none
    /// until then, while it holds its whole share.
    pub(crate) held: Option<BasisPoints>,
    /// The same in bytes, on the most-used of its GPUs, as measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) held_bytes: Option<placement::Bytes>,
    /// What its sleep freed on its GPUs (on one machine, the most of any), as measured: the most it keeps
    /// in host memory; none until then, while its share stands for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) host_bytes: Option<placement::Bytes>,
}

impl Group {
    /// Whether `member` is pinned or on demand.
    pub(crate) fn demand_of(&self, member: &str) -> Demand {
        match self.demand.get(member) {
            Some(&keep_alive) => Demand::OnDemand { keep_alive },
            None => Demand::Pinned,
        }
    }

    /// What `member`, which runs, holds on each of its GPUs: its share, or what it keeps asleep.
    pub(crate) fn held(&self, share: &Share) -> BasisPoints {
        match self.asleep.get(&share.member) {
            Some(Asleep {
                held: Some(held), ..
            }) => (*held).min(share.share),
            _ => share.share,
        }
    }

    /// What `member`'s share takes of its GPUs on `machine`, all together.
    pub(crate) fn share_on(
        &self,
        inventory: &placement::Inventory,
        member: &str,
        machine: &str,
    ) -> placement::Bytes {
        let Some(share) = self.members.iter().find(|s| s.member == member) else {
            return placement::Bytes::ZERO;
        };
        self.gpus
            .iter()
            .filter(|g| g.machine == machine)
            .filter_map(|g| inventory.gpu(g))
            .map(|g| g.total.share(share.share))
            .sum()
    }

    /// What `member` asleep keeps of `machine`'s memory: what its sleep was measured to free there
    /// (`measured`), else its share of its GPUs there, the most it can be.
    pub(crate) fn host_kept(
        &self,
        inventory: &placement::Inventory,
        member: &str,
        machine: &str,
        measured: Option<placement::Bytes>,
    ) -> placement::Bytes {
        measured.unwrap_or_else(|| self.share_on(inventory, member, machine))
    }

    /// Whether `member`, on demand, is loaded and awake: it takes requests.
    pub(crate) fn awake(&self, member: &str) -> bool {
        self.loaded.contains(member) && !self.asleep.contains_key(member)
    }

    /// Whether `member` runs an engine now: pinned, or on demand and loaded.
    pub(crate) fn runs(&self, member: &str) -> bool {
        !self.demand.contains_key(member) || self.loaded.contains(member)
    }

    /// Whether `member` runs an engine on `machine` now: where it runs, on each machine of the group, or
    /// where a replica of it was placed.
    pub(crate) fn runs_on(&self, member: &str, machine: &str) -> bool {
        self.runs(member)
            && (!self.autoscale.contains_key(member)
                || self
                    .placed
                    .get(member)
                    .is_some_and(|p| p.iter().any(|g| g.machine == machine)))
    }

    /// `member`'s units that run now, each with the GPUs it holds its share on: one on each of the group's
    /// machines across its GPUs there, or one for each GPU a replica of it is placed on.
    pub(crate) fn units(&self, member: &str) -> Vec<(String, Vec<GpuRef>)> {
        if !self.runs(member) {
            return Vec::new();
        }
        if self.autoscale.contains_key(member) {
            return self
                .gpus
                .iter()
                .filter(|g| self.placed.get(member).is_some_and(|p| p.contains(*g)))
                .map(|g| (holder::replica(&self.name, member, g), vec![g.clone()]))
                .collect();
        }
        self.machines()
            .into_iter()
            .map(|machine| {
                let gpus = self.gpus.iter().filter(|g| g.machine == machine).cloned();
                (holder::member(&self.name, member, machine), gpus.collect())
            })
            .collect()
    }

    /// The unit under which `member` holds (or would hold) its share on `gpu`.
    pub(crate) fn unit_on(&self, member: &str, gpu: &GpuRef) -> String {
        if self.autoscale.contains_key(member) {
            holder::replica(&self.name, member, gpu)
        } else {
            holder::member(&self.name, member, &gpu.machine)
        }
    }

    /// The machines of the group, in name order.
    pub(crate) fn machines(&self) -> Vec<&str> {
        let machines: BTreeSet<&str> = self.gpus.iter().map(|g| g.machine.as_str()).collect();
        machines.into_iter().collect()
    }

    /// Its committed plan, with `system` members (the router) locked.
    pub(crate) fn plan(&self, system: &[String]) -> Vec<PlanMember> {
        self.members
            .iter()
            .map(|s| PlanMember {
                locked: system.contains(&s.member),
                demand: self.demand_of(&s.member),
                replicas: self.autoscale.get(&s.member).copied(),
                ..PlanMember::new(&s.member, s.share)
            })
            .collect()
    }

    /// Its on-demand members not loaded now.
    pub(crate) fn unloaded(&self) -> Vec<String> {
        self.demand
            .keys()
            .filter(|m| !self.loaded.contains(*m))
            .cloned()
            .collect()
    }

    /// The members that run an engine now, with what each holds: its share, or what it keeps asleep.
    pub(crate) fn running(&self) -> Vec<Share> {
        self.members
            .iter()
            .filter(|s| self.runs(&s.member))
            .map(|s| Share::new(&s.member, self.held(s)))
            .collect()
    }
}

pub(crate) fn engine_name(engine: Engine) -> &'static str {
    match engine {
        Engine::Vllm => "vllm",
        Engine::Sglang => "sglang",
        Engine::LlamaCpp => "llamacpp",
        Engine::Command => "command",
    }
}

impl Fleet {
    /// Every group and its committed plan.
    pub fn groups(&self) -> Vec<GroupView> {
        let views = self.views();
        let system = views.committed.system_models();
        views
            .committed
            .groups
            .iter()
            .map(|g| self.view_of(&views, g, &system))
            .collect()
    }

    /// One group.
    pub fn group(&self, name: &str) -> Result<GroupView, ApiError> {
        let views = self.views();
        let group = views.committed.group(name).ok_or_else(|| no_group(name))?;
        let system = views.committed.system_models();
        Ok(self.view_of(&views, group, &system))
    }

    /// `g` and its committed plan, with its members' engines now.
    fn view_of(&self, views: &Views, g: &Group, system: &[String]) -> GroupView {
        let mut view = group_view(g, system);
        for member in &mut view.members {
            member.engines = self
                .runtime
                .engines_of(&member.name)
                .into_iter()
                .filter(|e| e.group.as_deref() == Some(&g.name))
                .map(|e| MemberEngine {
                    machine: e.machine,
                    state: e.state,
                    message: e.message,
                })
                .collect();
            let prefix = placement::holder::member_prefix(&g.name, &member.name);
            member.on_demand = self.on_demand_view(&member.name);
            member.replicas = self.replicas_view(&member.name);
            member.not_held = views
                .unplaced
                .iter()
                .filter(|(who, _)| who.starts_with(&prefix))
                .map(|(who, why)| match placement::holder::Holder::parse(who) {
                    placement::holder::Holder::Member { machine, .. } => {
                        self.said_of_unreachable(why.clone(), &[machine])
                    }
                    placement::holder::Holder::Worker(_) => why.clone(),
                })
                .collect();
        }
        view.progress = self.runtime.progress(&g.name);
        view
    }

    /// A GPU as a group's plan is judged against it: what shared work outside `group` takes there.
    pub async fn group_gpu(&self, gpu: &GpuRef, group: Option<&str>) -> Result<GroupGpu, ApiError> {
        let state = self.state.lock().await;
        group_gpu(state.ledger.scheduler(), gpu, group)
    }

    /// The system members (the semantic router).
    pub(crate) fn system_models(&self) -> Vec<String> {
        self.committed().system_models()
    }
}

pub(crate) fn no_model(name: &str) -> ApiError {
    ApiError::Unprocessable(format!(
        "the catalog has no model named {name}; GET /api/models lists them"
    ))
}

fn group_gpu(
    scheduler: &Scheduler,
    gpu: &GpuRef,
    group: Option<&str>,
) -> Result<GroupGpu, ApiError> {
    let found = scheduler
        .inventory()
        .gpu(gpu)
        .ok_or_else(|| ApiError::Unprocessable(format!("{gpu} is not in the inventory")))?;
    let sharers = match scheduler.hold(gpu) {
        Some(Hold::Whole(by)) => {
            return Err(ApiError::Conflict(format!(
                "{gpu} is held whole by {by}; choose a shared or free GPU"
            )))
        }
        Some(Hold::Shared(sharers)) => Some(sharers),
        _ => None,
    };
    Ok(GroupGpu::of(
        gpu.clone(),
        found.total,
        found.held_outside,
        sharers
            .into_iter()
            .flatten()
            .map(|(holder, bytes)| (Holder::parse(holder).group(), *bytes)),
        group,
    ))
}

pub(super) fn no_group(name: &str) -> ApiError {
    ApiError::NotFound(format!(
        "there is no group named {name}; GET /api/groups lists them"
    ))
}

fn group_view(group: &Group, system: &[String]) -> GroupView {
    GroupView {
        name: group.name.clone(),
        gpus: group
            .gpus
            .iter()
            .map(|g| format!("{}:{}", g.machine, g.index))
            .collect(),
        revision: group.revision,
        members: group
            .members
            .iter()
            .map(|s| MemberView {
                name: s.member.clone(),
                share_percent: s.share.as_percent_f64(),
                locked: system.contains(&s.member),
                engines: Vec::new(),
                not_held: Vec::new(),
                on_demand: None,
                replicas: None,
            })
            .collect(),
        // The most the plan holds at once: on-demand members take turns.
        total_percent: judge(&group.plan(&[]), &[]).total.as_percent_f64(),
        progress: None,
    }
}

#[cfg(test)]
mod tests;
