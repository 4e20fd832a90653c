//! What the console's pages show, as the server sends it, and the requests the pages send back. Plain
//! serde types in the units of `placement`: the server fills them in, the browser only shows them (and
//! judges plans with `placement`).

use placement::{BasisPoints, Bytes, GpuRef, GroupGpu, PlanMember};
use serde::{Deserialize, Serialize};

/// Where an engine is in its life, as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineStatus {
    /// Started, not yet answering its health check.
    Starting,
    /// Answering its health check: it can serve.
    Healthy,
    /// Running, but its health checks fail.
    Unhealthy,
    /// About to stop: finishing its requests in flight, taking no new ones.
    Draining,
    /// Exited; waiting out its backoff before it starts again.
    Restarting,
    /// Not running, as wanted (or on a machine Tessera cannot start engines on).
    Stopped,
    /// Not running, against what was wanted.
    Failed,
}

impl EngineStatus {
    /// The word the Models tab shows.
    pub fn label(self) -> &'static str {
        match self {
            EngineStatus::Starting => "Starting",
            EngineStatus::Healthy => "Serving",
            EngineStatus::Unhealthy => "Unhealthy",
            EngineStatus::Draining => "Draining",
            EngineStatus::Restarting => "Restarting",
            EngineStatus::Stopped => "Stopped",
            EngineStatus::Failed => "Failed",
        }
    }

    /// Its CSS class.
    pub fn css_class(self) -> &'static str {
        match self {
            EngineStatus::Starting => "starting",
            EngineStatus::Healthy => "serving",
            EngineStatus::Unhealthy => "unhealthy",
            EngineStatus::Draining => "draining",
            EngineStatus::Restarting => "restarting",
            EngineStatus::Stopped => "stopped",
            EngineStatus::Failed => "failed",
        }
    }

    /// How much the state needs an operator's eye: the row shows its worst engine.
    fn concern(self) -> u8 {
        match self {
            EngineStatus::Healthy => 0,
            EngineStatus::Starting => 1,
            EngineStatus::Draining | EngineStatus::Restarting => 2,
            EngineStatus::Stopped => 3,
            EngineStatus::Unhealthy => 4,
            EngineStatus::Failed => 5,
        }
    }
}

/// One engine of a model: the model runs one per machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineLine {
    /// The machine it runs on.
    pub machine: String,
    /// Its state.
    pub status: EngineStatus,
    /// Why it is not as wanted.
    pub message: Option<String>,
}

/// A row of the Models tab: a deployed model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRow {
    /// The catalog model.
    pub name: String,
    /// The sharing group it runs in; `None` for a model on whole GPUs.
    pub group: Option<String>,
    /// Its share of one GPU, in a group.
    pub share: Option<BasisPoints>,
    /// How many whole GPUs it takes on each node, outside any group.
    pub whole_gpus: Option<u32>,
    /// The nodes it runs on.
    pub nodes: Vec<String>,
    /// Its engines.
    pub engines: Vec<EngineLine>,
    /// A system member (the semantic router): its share is not editable and it is not removed here.
    pub system: bool,
    /// The revision a change must name: its group's, or its own outside a group.
    pub revision: i64,
    /// For a model loaded on demand: whether it is loaded, when it was last used, its last cold start.
    #[serde(default)]
    pub on_demand: Option<OnDemand>,
    /// Why it is flagged as slowed by its neighbours, if it is (seed 002's interference alarm).
    #[serde(default)]
    pub slowed: Option<String>,
    /// Whether the driver holds it to its share on every GPU of its group (MPS); otherwise the share is a
    /// promise its engine keeps by sizing itself.
    #[serde(default)]
    pub share_enforced: bool,
    /// Why it is flagged as using more GPU memory than its share, if it is (a promise broken).
    #[serde(default)]
    pub over_share: Option<String>,
}

/// Whether an on-demand model is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadState {
    /// No engine: the next request loads it.
    NotLoaded,
    /// Loaded for a request; its engine is not ready yet.
    Loading,
    /// Its engine serves.
    Loaded,
}

impl LoadState {
    /// The word the Models tab shows.
    pub fn label(self) -> &'static str {
        match self {
            LoadState::NotLoaded => "not loaded",
            LoadState::Loading => "loading",
            LoadState::Loaded => "loaded",
        }
    }
}

/// How an on-demand model is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnDemand {
    /// How long it stays loaded with no request, seconds.
    pub keep_alive_s: u32,
    /// Loaded or not.
    pub state: LoadState,
    /// When a request last began or ended for it (RFC 3339), since the server started.
    pub last_used: Option<String>,
    /// Its last cold start, from the request that loaded it to its engine being ready, in milliseconds.
    pub cold_start_ms: Option<u64>,
}

impl OnDemand {
    /// The Models tab's line: `On demand, unloaded after 300 s idle: loaded; last used …; last cold start
    /// 1.2 s.`
    pub fn line(&self) -> String {
        let mut line = format!(
            "On demand, unloaded after {} s idle: {}",
            self.keep_alive_s,
            self.state.label()
        );
        if let Some(at) = &self.last_used {
            line.push_str(&format!("; last used {at}"));
        }
        if let Some(ms) = self.cold_start_ms {
            line.push_str(&format!(
                "; last cold start {}.{} s",
                ms / 1000,
                ms % 1000 / 100
            ));
        }
        line.push('.');
        line
    }
}

impl ModelRow {
    /// The health chip: `2/2 healthy`.
    pub fn health(&self) -> String {
        let healthy = self
            .engines
            .iter()
            .filter(|e| e.status == EngineStatus::Healthy)
            .count();
        format!("{healthy}/{} healthy", self.engines.len())
    }

    /// The state of its worst engine (`Serving` when every engine is healthy), with why.
    pub fn state(&self) -> (EngineStatus, Option<String>) {
        let idle = self
            .on_demand
            .as_ref()
            .filter(|o| o.state == LoadState::NotLoaded)
            .map(|_| "not loaded: the next request loads it".to_owned());
        self.engines
            .iter()
            .max_by_key(|e| e.status.concern())
            .map(|e| (e.status, e.message.clone()))
            .unwrap_or((EngineStatus::Stopped, idle))
    }

    /// The Share column: `40%` in a group, `2 whole GPUs` outside one.
    pub fn share_text(&self) -> String {
        match (self.share, self.whole_gpus) {
            (Some(share), _) => share.to_string(),
            (None, Some(1)) => "1 whole GPU".to_owned(),
            (None, Some(n)) => format!("{n} whole GPUs"),
            (None, None) => "—".to_owned(),
        }
    }
}

/// Where a step of a plan change is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    /// Not begun.
    Waiting,
    /// Under way.
    Running,
    /// Done.
    Done,
    /// A start that did not become healthy.
    Failed,
}

/// One stop or start of a plan change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLine {
    /// `stop` or `start`.
    pub action: String,
    /// The member.
    pub member: String,
    /// Where it is.
    pub state: StepState,
    /// Why it failed.
    pub message: Option<String>,
}

impl StepLine {
    /// `Stop glm-5.3: done`, `Start vision: failed: …`.
    pub fn text(&self) -> String {
        let action = match self.action.as_str() {
            "stop" => "Stop",
            _ => "Start",
        };
        let state = match self.state {
            StepState::Waiting => "waiting",
            StepState::Running => "under way",
            StepState::Done => "done",
            StepState::Failed => "failed",
        };
        match &self.message {
            Some(why) => format!("{action} {}: {state}: {why}", self.member),
            None => format!("{action} {}: {state}", self.member),
        }
    }
}

/// A group's last plan change, while it is carried out or when a step failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanProgress {
    /// The group.
    pub group: String,
    /// The revision being carried out.
    pub revision: i64,
    /// Its steps in order.
    pub steps: Vec<StepLine>,
}

impl PlanProgress {
    /// Whether a step is still to be done.
    pub fn is_underway(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s.state, StepState::Waiting | StepState::Running))
    }

    /// The heading: `Restarting text-router (revision 4)`, or that a step failed.
    pub fn heading(&self) -> String {
        if self.steps.iter().any(|s| s.state == StepState::Failed) {
            format!(
                "A restart of {} (revision {}) failed",
                self.group, self.revision
            )
        } else {
            format!("Restarting {} (revision {})", self.group, self.revision)
        }
    }
}

/// A model on a node, as the Nodes tab lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeModel {
    /// The model.
    pub name: String,
    /// Its share of one GPU; `None` on whole GPUs.
    pub share: Option<BasisPoints>,
}

/// A row of the Nodes tab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRow {
    /// The machine.
    pub name: String,
    /// The sharing groups running on it.
    pub groups: Vec<String>,
    /// Its models, in group order.
    pub models: Vec<NodeModel>,
    /// Its GPUs.
    pub gpus: u32,
    /// Its GPUs that shared work may use: healthy and not held whole.
    pub shareable: u32,
    /// All its GPUs' memory.
    pub total: Bytes,
    /// What its shareable GPUs offer beyond what their sharers take.
    pub free: Bytes,
}

impl NodeRow {
    /// `2 of 2 shareable · 180 GB free (94%)`: the percentage is of all the node's GPU memory.
    pub fn summary(&self) -> String {
        let percent = if self.total == Bytes::ZERO {
            0
        } else {
            // Rounded half up, in integers.
            (u128::from(self.free.get()) * 200 + u128::from(self.total.get()))
                / (2 * u128::from(self.total.get()))
        };
        format!(
            "{} of {} shareable · {} free ({percent}%)",
            self.shareable, self.gpus, self.free
        )
    }
}

/// Who holds a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuUse {
    /// Nobody.
    Free,
    /// One worker or model, whole.
    Whole(String),
    /// Shared work, by memory.
    Shared,
}

/// One sharer of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sharer {
    /// The worker, or the group's model.
    pub name: String,
    /// The group, for a group's model.
    pub group: Option<String>,
    /// What it takes.
    pub bytes: Bytes,
}

/// A GPU on the machine page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuDetail {
    /// Its index on the machine.
    pub index: u32,
    /// Its model name.
    pub model: String,
    /// Its UUID.
    pub uuid: String,
    /// Whether it is healthy.
    pub healthy: bool,
    /// All its memory.
    pub total: Bytes,
    /// Memory something outside Tessera holds.
    pub held_outside: Bytes,
    /// Who holds it.
    pub usage: GpuUse,
    /// Its sharers, largest first as the server lists them.
    pub sharers: Vec<Sharer>,
    /// The seed's line: `shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken`.
    pub summary: Option<String>,
    /// Its sharers slowed by their neighbours here: `glm-5.3: Slowed by its neighbours: …`.
    #[serde(default)]
    pub slowed: Vec<String>,
    /// How it is shared, which says whether a share is enforced or a promise.
    #[serde(default)]
    pub sharing: placement::sharing::GpuSharing,
    /// Its sharers measured using more than their share here, each in words.
    #[serde(default)]
    pub over_share: Vec<String>,
    /// Its readings of the last hour, oldest first.
    #[serde(default)]
    pub history: Vec<GpuPoint>,
    /// Those are the demo fleet's, made from its demo engines' work, not read from a driver.
    #[serde(default)]
    pub demo_figures: bool,
    /// It is made up (the demo fleet's, or a Ray node's labelled demo): demo engines stand in for what
    /// would run there, and no MPS daemon runs.
    #[serde(default)]
    pub made_up: bool,
    /// Its part in MIG: cut into instances, or one of them.
    #[serde(default)]
    pub mig: Option<placement::MigRole>,
    /// Why the last reading found it unhealthy, where it said why.
    #[serde(default)]
    pub problem: Option<String>,
}

/// One reading of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPoint {
    /// When, ms since the epoch.
    pub at_ms: u64,
    /// Percent of the period in which a kernel ran.
    pub utilisation_percent: u32,
    /// Memory in use by anyone.
    pub used: Option<Bytes>,
    /// Of that, what is held outside Tessera; the rest is Tessera's engines'.
    pub held_outside: Option<Bytes>,
    /// Temperature, °C.
    pub temperature_c: Option<u32>,
    /// Power draw, mW.
    pub power_mw: Option<u32>,
}

impl GpuPoint {
    /// The machine page's line for the latest reading: `34% busy · 30.1 of 96 GB in use (28 GB by
    /// Tessera's engines, 2.1 GB by others) · 45 °C · 210 W`.
    pub fn line(&self, total: Bytes) -> String {
        let mut parts = vec![format!("{}% busy", self.utilisation_percent)];
        if let Some(used) = self.used {
            let outside = self.held_outside.unwrap_or_default().min(used);
            parts.push(format!(
                "{} of {} in use ({} by Tessera's engines, {} by others)",
                used.gb_text(),
                total,
                used.saturating_sub(outside),
                outside
            ));
        }
        if let Some(c) = self.temperature_c {
            parts.push(format!("{c} °C"));
        }
        if let Some(mw) = self.power_mw {
            parts.push(format!("{} W", mw / 1000));
        }
        parts.join(" · ")
    }
}

/// What MIG would make of a GPU's sharers (seed 004): each in an instance of its own, or why no layout
/// holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MigPlan {
    /// The layout, and what it takes.
    Layout {
        /// Each instance: `embedder on 1g.18gb (slices 4–4, 16 GB)`.
        instances: Vec<String>,
        /// The slices it leaves: `2 of 8 memory slices and 2 of 7 compute slices left.`
        left: String,
        /// What must stop before it can be applied.
        stop_first: String,
        /// The commands that create it.
        commands: Vec<String>,
    },
    /// Why none holds them, in words a person can check against the menu.
    None(String),
}

impl GpuDetail {
    /// How it is shared, in words; on a made-up GPU, where no MPS daemon runs, said so.
    pub fn sharing_line(&self) -> String {
        let line = self.sharing.line();
        if self.made_up && self.sharing.mode != placement::sharing::Sharing::TimeSlicing {
            format!("{line} This GPU is made up, so no daemon runs: the demo engines stand in.")
        } else {
            line
        }
    }

    /// How the machine page heads it: `GPU 0 · NVIDIA H200`, or for a MIG instance the GPU it is cut from,
    /// `MIG instance 1 of GPU 0 · NVIDIA H200 MIG 3g.71gb`.
    pub fn title(&self) -> String {
        match placement::mig::instance_of(self.index) {
            Some((parent, n)) if self.mig.is_some() => {
                format!("MIG instance {n} of GPU {parent} · {}", self.model)
            }
            _ => format!("GPU {} · {}", self.index, self.model),
        }
    }

    /// What MIG makes of it, where it has a part in MIG.
    pub fn mig_line(&self) -> Option<&'static str> {
        match self.mig.as_ref()? {
            placement::MigRole::Cut => Some("Cut into MIG instances: work runs in those, each a GPU of its own below, and none on this GPU itself."),
            placement::MigRole::Instance { .. } => Some("A MIG instance, with memory and compute walls of its own: one engine holds it whole."),
        }
    }

    /// What MIG would make of its sharers, where its model has MIG and it is shared.
    pub fn mig_plan(&self) -> Option<MigPlan> {
        let menu = placement::mig::menu(&self.model)?;
        if self.sharers.is_empty() {
            return None;
        }
        let tenants: Vec<placement::mig::Tenant> = self
            .sharers
            .iter()
            .map(|s| placement::mig::Tenant::new(s.name.clone(), s.bytes))
            .collect();
        Some(match placement::mig::plan(menu, &tenants) {
            Err(why) => MigPlan::None(why.to_string()),
            Ok(layout) => {
                let names: Vec<&str> = self.sharers.iter().map(|s| s.name.as_str()).collect();
                MigPlan::Layout {
                    instances: layout.instances.iter().map(ToString::to_string).collect(),
                    left: format!(
                        "{} of 8 memory slices and {} of 7 compute slices left.",
                        layout.free_slices(),
                        layout.free_compute()
                    ),
                    stop_first: format!(
                        "A layout is made on an idle GPU, with MIG mode on (which may reset it): {} must stop first.",
                        names.join(", ")
                    ),
                    commands: layout.commands(self.index),
                }
            }
        })
    }

    /// What it offers Tessera: [`placement::offered`].
    pub fn offered(&self) -> Bytes {
        placement::offered(self.total, self.held_outside, self.mig.as_ref())
    }

    /// What its sharers take.
    pub fn taken(&self) -> Bytes {
        self.sharers.iter().map(|s| s.bytes).sum()
    }

    /// `Offers 7 of its 8 GB (1 GB held outside Tessera)`, or `Offers all of its 96 GB`.
    pub fn offer_text(&self) -> String {
        if self.mig == Some(placement::MigRole::Cut) {
            format!(
                "Offers nothing itself: its {} are its MIG instances'",
                self.total
            )
        } else if self.held_outside == Bytes::ZERO {
            format!("Offers all of its {}", self.total)
        } else {
            format!(
                "Offers {} of its {} ({} held outside Tessera)",
                self.offered().gb_text(),
                self.total,
                self.held_outside
            )
        }
    }
}

/// A worker or model placed on the machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLine {
    /// Its name.
    pub name: String,
    /// The sharing group, for a group's model.
    pub group: Option<String>,
    /// The GPU indices it holds here.
    pub gpus: Vec<u32>,
    /// What it takes on each, when shared.
    pub shared: Option<Bytes>,
    /// Its engine's state.
    pub status: Option<EngineStatus>,
}

impl WorkerLine {
    /// The GPUs column: `1 · shared 2.2 GB`, or `2 · whole`.
    pub fn gpus_text(&self) -> String {
        match self.shared {
            Some(bytes) => format!("{} · shared {bytes}", self.gpus.len()),
            None => format!("{} · whole", self.gpus.len()),
        }
    }
}

/// A worker that waits, with its reasons.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingLine {
    /// Its name.
    pub name: String,
    /// One sentence per GPU or machine, in the seed's words.
    pub reasons: Vec<String>,
}

/// The machine page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineDetail {
    /// Its name.
    pub name: String,
    /// CPU cores.
    pub cpu_cores: u32,
    /// CPU cores its workers hold.
    pub cpu_cores_used: u32,
    /// Memory.
    pub memory: Bytes,
    /// Memory its workers hold.
    pub memory_used: Bytes,
    /// A Windows PC under WSL2: shared work takes its memory on every GPU.
    pub all_gpus_visible: bool,
    /// Its GPUs.
    pub gpus: Vec<GpuDetail>,
    /// What runs here.
    pub workers: Vec<WorkerLine>,
    /// Workers that wait anywhere, with the reasons about this machine.
    pub pending: Vec<PendingLine>,
    /// Since when (RFC 3339) the machine's Ray node has been dead or gone, if it is.
    #[serde(default)]
    pub unreachable_since: Option<String>,
}

impl MachineDetail {
    /// Its GPUs as the page lists them: each followed by the MIG instances cut from it.
    pub fn gpus_in_order(&self) -> Vec<GpuDetail> {
        let mut gpus = self.gpus.clone();
        gpus.sort_by_key(|g| match &g.mig {
            Some(placement::MigRole::Instance { parent, .. }) => (*parent, g.index),
            _ => (g.index, 0),
        });
        gpus
    }
}

/// A catalog model the wizard offers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogEntry {
    /// Its name.
    pub name: String,
    /// What runs it: `vllm`, `sglang`, `llamacpp` or `command`.
    pub engine: String,
    /// The share the wizard proposes.
    pub default_share: BasisPoints,
    /// The sharing group its recipe names.
    pub group: Option<String>,
    /// The semantic router.
    pub system: bool,
    /// Whether it runs already (a model runs once).
    pub deployed: bool,
}

/// A GPU as the wizard weighs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuOption {
    /// Its index.
    pub index: u32,
    /// Its model name.
    pub model: String,
    /// All its memory.
    pub total: Bytes,
    /// Memory held outside Tessera.
    pub held_outside: Bytes,
    /// Whether it is healthy.
    pub healthy: bool,
    /// Held whole by someone: shared work cannot go there.
    pub held_whole: bool,
    /// What each sharer takes, with its group (none for a shared worker).
    pub sharers: Vec<Sharer>,
}

impl GpuOption {
    /// The GPU as a plan for `group` is judged against it: shared work outside the group counts against it.
    pub fn for_group(&self, machine: &str, group: Option<&str>) -> GroupGpu {
        GroupGpu::of(
            GpuRef::new(machine, self.index),
            self.total,
            self.held_outside,
            self.sharers.iter().map(|s| (s.group.as_deref(), s.bytes)),
            group,
        )
    }

    /// Whether nothing holds it at all.
    pub fn is_free(&self) -> bool {
        !self.held_whole && self.sharers.is_empty()
    }
}

/// A node as the wizard offers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeOption {
    /// The machine.
    pub name: String,
    /// Its GPUs.
    pub gpus: Vec<GpuOption>,
}

/// A sharing group's committed plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPlan {
    /// Its name.
    pub name: String,
    /// The revision a change must name.
    pub revision: i64,
    /// The GPUs it runs on.
    pub gpus: Vec<GpuRef>,
    /// Its members with their shares; the router locked.
    pub members: Vec<PlanMember>,
    /// Its on-demand members that are not loaded now: they run no engine, so a change restarts none.
    #[serde(default)]
    pub unloaded: Vec<String>,
}

impl GroupPlan {
    /// The members whose engines run before a change to `after`, and after it (`placement::running`).
    pub fn running(&self, after: &[PlanMember]) -> (Vec<placement::Share>, Vec<placement::Share>) {
        placement::running(&self.members, &self.unloaded, after)
    }
}

/// What the Deploy a model wizard needs to judge a deploy in the browser.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployOptions {
    /// The catalog.
    pub catalog: Vec<CatalogEntry>,
    /// Every node with GPUs.
    pub nodes: Vec<NodeOption>,
    /// Every sharing group.
    pub groups: Vec<GroupPlan>,
}

/// A model's serving configuration: extra arguments and environment variables for its engine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Serving {
    /// Added after the engine's own arguments, one per entry.
    pub args: Vec<String>,
    /// Added to the engine's environment.
    pub env: Vec<(String, String)>,
}

/// A deploy from the wizard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeployRequest {
    /// The catalog model.
    pub model: String,
    /// Share GPUs with a group (on), or take them whole (off).
    pub shared: bool,
    /// The GPUs: the group's, or the ones chosen on each node.
    pub gpus: Vec<GpuRef>,
    /// The model's share, when shared.
    pub share: Option<BasisPoints>,
    /// New shares of other members of the group it joins (only those that change).
    pub shares: Vec<(String, BasisPoints)>,
    /// Whether it is pinned or loaded on demand.
    #[serde(default)]
    pub demand: placement::Demand,
    /// New demand of other members of the group it joins (only those that change).
    #[serde(default)]
    pub demands: Vec<(String, placement::Demand)>,
    /// The revision of the group it joins, as the wizard read it.
    pub revision: Option<i64>,
    /// Its serving configuration.
    pub serving: Serving,
}

/// What a committed change does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeOutcome {
    /// The group it changed, if any.
    pub group: Option<String>,
    /// The models that restart, stop or start, in plan order.
    pub restarts: Vec<String>,
    /// The Free row's warning, when the committed plan is over 90 %.
    pub warning: Option<String>,
}

/// The GPU sharing form of a running model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingForm {
    /// The model the form was opened for.
    pub model: String,
    /// Its group's committed plan.
    pub group: GroupPlan,
    /// The group's GPUs with what else holds them.
    pub gpus: Vec<GroupGpu>,
}

/// The Serving configuration form of a running model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServingForm {
    /// The model.
    pub model: String,
    /// Its group.
    pub group: Option<String>,
    /// The revision a change must name (its group's).
    pub revision: i64,
    /// Every node, as the wizard offers them.
    pub nodes: Vec<NodeOption>,
    /// The GPUs it runs on.
    pub placed: Vec<GpuRef>,
    /// Its serving configuration today.
    pub serving: Serving,
}

/// An account, as the admin page lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// Its name.
    pub name: String,
    /// Its role.
    pub role: crate::auth::Role,
    /// When it was made.
    pub created_at: String,
}

/// An API token, as the admin page lists it (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiToken {
    /// Its id.
    pub id: i64,
    /// What it is for.
    pub name: String,
    /// Whose role it acts with.
    pub user: String,
    /// Its first characters.
    pub prefix: String,
    /// When it was made.
    pub created_at: String,
    /// When it was last used.
    pub last_used_at: Option<String>,
    /// When it was revoked.
    pub revoked_at: Option<String>,
    /// What it may call, and until when.
    #[serde(flatten)]
    pub limits: TokenLimits,
}

/// What an API token may call: the whole API with its owner's role, or only the gateway (`/v1`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenScope {
    /// Every route its owner's role allows, the gateway included.
    #[default]
    Api,
    /// Only the gateway: `/v1`, for the models it names.
    Inference,
}

impl TokenScope {
    /// Its name in the API and the database.
    pub fn as_str(self) -> &'static str {
        match self {
            TokenScope::Api => "api",
            TokenScope::Inference => "inference",
        }
    }
}

/// How an API token is limited beside its owner's role.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenLimits {
    /// `api` (the default) or `inference`.
    #[serde(default)]
    pub scope: TokenScope,
    /// For an inference token, the models it may call; every model when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// When it stops working, RFC 3339 (`2027-01-31T00:00:00Z`); never when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
}

impl TokenLimits {
    /// What the token list says of them: `API`, `inference: a, b`, with `until …`.
    pub fn describe(&self) -> String {
        let what = match (&self.scope, &self.models) {
            (TokenScope::Api, _) => "API".to_owned(),
            (TokenScope::Inference, None) => "inference, every model".to_owned(),
            (TokenScope::Inference, Some(models)) => format!("inference: {}", models.join(", ")),
        };
        match &self.expires_at {
            Some(at) => format!("{what}, until {at}"),
            None => what,
        }
    }
}

/// The playground: the models that can be tried, and the last log lines of the one on show.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Playground {
    /// The models (and workers) with an engine now, by name.
    pub models: Vec<String>,
    /// The last lines of the first engine of the model on show (the first model when none is chosen),
    /// secrets redacted for everyone but admins.
    pub logs: Vec<String>,
}

/// A token just made, with its secret: shown this once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewApiToken {
    /// The token.
    pub token: ApiToken,
    /// The secret to send as `Authorization: Bearer …`.
    pub secret: String,
}

/// The accounts and API tokens, for the admin page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountsPage {
    /// Every account.
    pub accounts: Vec<Account>,
    /// Every API token, newest first.
    pub tokens: Vec<ApiToken>,
}

/// One entry of the audit log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditLine {
    /// Its number.
    pub id: i64,
    /// When.
    pub at: String,
    /// Who.
    pub actor: String,
    /// What kind of change.
    pub action: String,
    /// What it was done to.
    pub target: String,
    /// Before, as JSON text.
    pub before: Option<String>,
    /// After, as JSON text.
    pub after: Option<String>,
    /// The revision it made.
    pub revision: Option<i64>,
    /// Who restarted.
    pub restarts: Vec<String>,
}

/// What the Audit page narrows the log to; empty fields leave it wide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditQuery {
    /// Only this account's changes.
    pub actor: String,
    /// Only this kind (or family: `plan`) of change.
    pub action: String,
    /// Only changes to this.
    pub target: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A healthy, free, time-sliced GPU of `model` with `total` memory and nothing said about it.
    fn gpu_detail(model: &str, total: Bytes) -> GpuDetail {
        GpuDetail {
            index: 0,
            model: model.into(),
            uuid: String::new(),
            healthy: true,
            total,
            held_outside: Bytes::ZERO,
            usage: GpuUse::Free,
            sharers: Vec::new(),
            summary: None,
            slowed: Vec::new(),
            sharing: placement::sharing::GpuSharing::default(),
            over_share: Vec::new(),
            history: Vec::new(),
            demo_figures: false,
            made_up: false,
            mig: None,
            problem: None,
        }
    }

    fn row(engines: &[EngineStatus]) -> ModelRow {
        ModelRow {
            name: "glm-5.3".into(),
            group: Some("text-router".into()),
            share: Some(BasisPoints::percent(40)),
            whole_gpus: None,
            nodes: vec!["atlas".into()],
            engines: engines
                .iter()
                .map(|s| EngineLine {
                    machine: "atlas".into(),
                    status: *s,
                    message: None,
                })
                .collect(),
            system: false,
            revision: 1,
            on_demand: None,
            slowed: None,
            over_share: None,
            share_enforced: false,
        }
    }

    #[test]
    fn an_on_demand_model_says_whether_it_is_loaded_when_it_was_used_and_its_last_cold_start() {
        let mut r = row(&[]);
        r.on_demand = Some(OnDemand {
            keep_alive_s: 300,
            state: LoadState::NotLoaded,
            last_used: None,
            cold_start_ms: None,
        });
        assert_eq!(
            r.state(),
            (
                EngineStatus::Stopped,
                Some("not loaded: the next request loads it".to_owned())
            )
        );
        assert_eq!(
            r.on_demand.as_ref().unwrap().line(),
            "On demand, unloaded after 300 s idle: not loaded."
        );
        let loaded = OnDemand {
            keep_alive_s: 60,
            state: LoadState::Loaded,
            last_used: Some("2026-12-04T03:10:00Z".into()),
            cold_start_ms: Some(1_234),
        };
        assert_eq!(
            loaded.line(),
            "On demand, unloaded after 60 s idle: loaded; last used 2026-12-04T03:10:00Z; last cold start 1.2 s."
        );
    }

    #[test]
    fn the_health_chip_counts_healthy_engines() {
        let r = row(&[EngineStatus::Healthy, EngineStatus::Starting]);
        assert_eq!(r.health(), "1/2 healthy");
        assert_eq!(r.state().0, EngineStatus::Starting);
        assert_eq!(
            row(&[EngineStatus::Healthy; 2]).state().0.label(),
            "Serving"
        );
        assert_eq!(
            row(&[EngineStatus::Restarting, EngineStatus::Failed])
                .state()
                .0,
            EngineStatus::Failed
        );
    }

    #[test]
    fn a_node_reads_as_the_seed_writes_it() {
        // Two 96 GB GPUs with 6 GB taken on each: 180 of 192 GB free, 93.75 % shown as 94 %.
        let node = NodeRow {
            name: "atlas".into(),
            groups: vec!["text-router".into()],
            models: Vec::new(),
            gpus: 2,
            shareable: 2,
            total: Bytes::gb(192),
            free: Bytes::gb(180),
        };
        assert_eq!(node.summary(), "2 of 2 shareable · 180 GB free (94%)");
    }

    #[test]
    fn the_gpus_column_counts_gpus_and_says_the_share() {
        let line = WorkerLine {
            name: "listen".into(),
            group: None,
            gpus: vec![0],
            shared: Some(Bytes(2_362_232_013)),
            status: None,
        };
        assert_eq!(line.gpus_text(), "1 · shared 2.2 GB");
    }

    #[test]
    fn an_h200_shows_the_mig_layout_its_sharers_would_take_and_what_must_stop_first() {
        let sharer = |name: &str, gb: u64| Sharer {
            name: name.into(),
            group: None,
            bytes: Bytes::gb(gb),
        };
        let mut gpu = GpuDetail {
            index: 2,
            usage: GpuUse::Shared,
            sharers: vec![sharer("small-llm", 45), sharer("embedder", 8)],
            ..gpu_detail("NVIDIA H200", Bytes::gb(141))
        };
        assert_eq!(
            gpu.mig_plan(),
            Some(MigPlan::Layout {
                instances: vec![
                    "small-llm on 3g.71gb (slices 0–3, 69.8 GB)".into(),
                    "embedder on 1g.18gb (slices 4–4, 16 GB)".into(),
                ],
                left: "3 of 8 memory slices and 3 of 7 compute slices left.".into(),
                stop_first: "A layout is made on an idle GPU, with MIG mode on (which may reset it): small-llm, embedder must stop first.".into(),
                commands: vec![
                    "nvidia-smi mig -i 2 -cgi 9:0 -C".into(),
                    "nvidia-smi mig -i 2 -cgi 19:4 -C".into(),
                ],
            })
        );
        gpu.sharers.push(sharer("big", 100));
        assert_eq!(
            gpu.mig_plan(),
            Some(MigPlan::None(
                "big needs 100 GB: only 7g.141gb holds that much, and it takes the whole GPU, leaving no slice for small-llm and embedder.".into()
            ))
        );
        gpu.model = "NVIDIA GeForce RTX 4090".into();
        assert_eq!(gpu.mig_plan(), None);
    }

    #[test]
    fn a_mig_instance_is_headed_by_the_gpu_it_is_cut_from_and_says_it_is_held_whole() {
        let instance = GpuDetail {
            index: placement::mig::instance_index(2, 1),
            mig: Some(placement::MigRole::Instance {
                parent: 2,
                profile: "3g.71gb".into(),
            }),
            ..gpu_detail("NVIDIA H200 MIG 3g.71gb", Bytes(71424 << 20))
        };
        assert_eq!(
            instance.title(),
            "MIG instance 1 of GPU 2 · NVIDIA H200 MIG 3g.71gb"
        );
        assert_eq!(
            instance.mig_line(),
            Some("A MIG instance, with memory and compute walls of its own: one engine holds it whole.")
        );
        let cut = GpuDetail {
            index: 2,
            mig: Some(placement::MigRole::Cut),
            ..gpu_detail("NVIDIA H200", Bytes::gb(141))
        };
        assert_eq!(cut.title(), "GPU 2 · NVIDIA H200");
        assert_eq!(cut.offered(), Bytes::ZERO);
        assert_eq!(
            cut.offer_text(),
            "Offers nothing itself: its 141 GB are its MIG instances'"
        );
        assert_eq!(
            cut.mig_line(),
            Some("Cut into MIG instances: work runs in those, each a GPU of its own below, and none on this GPU itself.")
        );
        assert_eq!(gpu_detail("NVIDIA H200", Bytes::gb(141)).mig_line(), None);
    }

    #[test]
    fn a_gpu_under_mps_says_its_shares_are_enforced_and_on_a_made_up_gpu_that_no_daemon_runs() {
        let mut gpu = GpuDetail {
            usage: GpuUse::Shared,
            demo_figures: true,
            made_up: true,
            ..gpu_detail("NVIDIA H200", Bytes::gb(141))
        };
        assert_eq!(
            gpu.sharing_line(),
            "Time-sliced: each share is a promise the engine keeps by sizing itself."
        );
        gpu.sharing.mode = placement::sharing::Sharing::Mps;
        assert_eq!(
            gpu.sharing_line(),
            "MPS: the driver holds each engine to its memory share. This GPU is made up, so no daemon runs: the demo engines stand in."
        );
        gpu.made_up = false;
        assert_eq!(
            gpu.sharing_line(),
            "MPS: the driver holds each engine to its memory share."
        );
    }

    #[test]
    fn a_gpu_says_what_it_offers_and_what_is_held_outside() {
        let gpu = GpuDetail {
            held_outside: Bytes::gb(1),
            ..gpu_detail("NVIDIA GeForce RTX 4060", Bytes::gb(8))
        };
        let reading = GpuPoint {
            at_ms: 0,
            utilisation_percent: 34,
            used: Some(Bytes::from_gb(4.5).unwrap()),
            held_outside: Some(Bytes::gb(1)),
            temperature_c: Some(45),
            power_mw: Some(110_500),
        };
        assert_eq!(
            reading.line(gpu.total),
            "34% busy · 4.5 of 8 GB in use (3.5 GB by Tessera's engines, 1 GB by others) · 45 °C · 110 W"
        );
        assert_eq!(
            gpu.offer_text(),
            "Offers 7 of its 8 GB (1 GB held outside Tessera)"
        );
    }

    #[test]
    fn a_group_is_judged_against_shared_work_outside_it_only() {
        let gpu = GpuOption {
            index: 0,
            model: "H200".into(),
            total: Bytes::gb(141),
            held_outside: Bytes::ZERO,
            healthy: true,
            held_whole: false,
            sharers: vec![
                Sharer {
                    name: "listen".into(),
                    group: None,
                    bytes: Bytes::gb(2),
                },
                Sharer {
                    name: "glm-5.3".into(),
                    group: Some("text-router".into()),
                    bytes: Bytes::gb(50),
                },
            ],
        };
        assert_eq!(
            gpu.for_group("h200-node", Some("text-router"))
                .taken_by_others,
            Bytes::gb(2)
        );
        assert_eq!(
            gpu.for_group("h200-node", None).taken_by_others,
            Bytes::gb(52)
        );
    }
}

/// A GPU's sharing setting as committed, and the engines that restart for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingChange {
    /// The GPU, as `machine:index`.
    pub gpu: String,
    /// How it is shared now.
    pub sharing: placement::sharing::GpuSharing,
    /// The engines that restart, its sharers, each stopped before it starts again (none when nothing
    /// changed).
    pub restarts: Vec<String>,
}

impl SharingChange {
    /// What the console says once it is committed.
    pub fn line(&self) -> String {
        let way = match self.sharing.mode {
            placement::sharing::Sharing::TimeSlicing => "time-sliced",
            placement::sharing::Sharing::Mps => "under MPS",
            placement::sharing::Sharing::Mig => {
                return format!(
                    "{} is cut into MIG instances, each a GPU of its own held whole.",
                    self.gpu
                )
            }
        };
        match self.restarts.as_slice() {
            [] => format!("{} is shared {way}; nothing restarts.", self.gpu),
            names => format!(
                "{} is shared {way}; restarting {}, each stopped before it starts again.",
                self.gpu,
                names.join(", ")
            ),
        }
    }
}

/// A repack being carried out, or the last one since the server started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepackRun {
    /// `running`, `done`, `stopped` (an operator stopped it between moves) or `failed`.
    pub state: String,
    /// Who started it.
    pub started_by: String,
    /// The plan it carries out, as planned when it started.
    pub plan: placement::RepackPlan,
    /// Its moves in the order they are made: one at a time, or several at once where units trade places.
    pub steps: Vec<RepackProgress>,
}

/// One step of a repack being carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepackProgress {
    /// The moves made together.
    pub moves: Vec<placement::Move>,
    /// `waiting`, `running`, `done`, `failed` or `stopped`.
    pub status: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
