//! The console's service: [`app::services::Console`] over the fleet. It turns what the fleet holds into what
//! the pages show, and the pages' requests into the fleet's calls, so that a server function is one line and
//! the REST API and the console change the fleet through the same code.

use crate::error::ApiError;
use crate::fleet::authority;
use crate::fleet::deployments::Deployed;
use crate::fleet::groups::{
    DeployCommand, Group, PlanChange, PlanCommand, Serving as FleetServing, Sharing,
};
use crate::fleet::{Fleet, GpuView, MachineView, WorkerView};
use crate::runtime::{EngineState, EngineView, StepStatus};
use crate::{accounts, audit};
use app::auth::{Caller, Role};
use app::error::AppError;
use app::services::{Answer, Console};
use app::views::{
    AccountsPage, AuditLine, AuditQuery, CatalogEntry, ChangeOutcome, DeployOptions, DeployRequest,
    EngineLine, EngineStatus, GpuDetail, GpuOption, GpuUse, GroupPlan, MachineDetail, ModelRow,
    NewApiToken, NodeModel, NodeOption, NodeRow, PendingLine, PlanProgress, Playground, Serving,
    ServingForm, Sharer, SharingForm, StepLine, StepState, TokenLimits, WorkerLine,
};
use placement::{BasisPoints, Bytes, Demand, GpuChoice, GpuRef, Grouping, UsageReport};
use sqlx::SqlitePool;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The console's view of the fleet.
pub struct ConsoleService {
    fleet: Arc<Fleet>,
    /// The database, for accounts and the audit log (the fleet's own state goes through the fleet).
    pool: SqlitePool,
    tokens: Arc<accounts::TokenCache>,
}

impl ConsoleService {
    /// The console over `fleet`, with accounts in `pool`; `tokens` is forgotten when an account or a
    /// token goes.
    pub fn new(
        fleet: Arc<Fleet>,
        pool: SqlitePool,
        tokens: Arc<accounts::TokenCache>,
    ) -> ConsoleService {
        ConsoleService {
            fleet,
            pool,
            tokens,
        }
    }
}

/// The fleet's error as the console states it; an internal error is logged and answered opaquely.
fn app_error(e: ApiError) -> AppError {
    match e {
        ApiError::BadRequest(m) | ApiError::TooLarge(m) => AppError::BadRequest(m),
        ApiError::Unauthorized(m) => AppError::Unauthorized(m),
        ApiError::Forbidden(m) => AppError::Forbidden(m),
        ApiError::NotFound(m) => AppError::NotFound(m),
        ApiError::Conflict(m) => AppError::Conflict(m),
        ApiError::Unprocessable(m) | ApiError::Refused { message: m, .. } => AppError::Refused(m),
        ApiError::Internal(detail) => {
            tracing::error!("{detail}");
            AppError::Transport("something went wrong on the server; it has been logged".to_owned())
        }
    }
}

fn status(state: EngineState) -> EngineStatus {
    match state {
        EngineState::Starting => EngineStatus::Starting,
        EngineState::Healthy => EngineStatus::Healthy,
        EngineState::Unhealthy => EngineStatus::Unhealthy,
        EngineState::Draining => EngineStatus::Draining,
        EngineState::Restarting => EngineStatus::Restarting,
        EngineState::Stopped => EngineStatus::Stopped,
        EngineState::Failed => EngineStatus::Failed,
    }
}

fn engine_line(e: &EngineView) -> EngineLine {
    EngineLine {
        machine: e.machine.clone(),
        status: status(e.state),
        message: e.message.clone(),
    }
}

/// The machines a group runs on, in the order of its GPUs.
fn group_machines(group: &Group) -> Vec<String> {
    let mut machines: Vec<String> = Vec::new();
    for gpu in &group.gpus {
        if !machines.contains(&gpu.machine) {
            machines.push(gpu.machine.clone());
        }
    }
    machines
}

fn plan_of(group: &Group, system: &[String]) -> GroupPlan {
    GroupPlan {
        name: group.name.clone(),
        revision: group.revision,
        gpus: group.gpus.clone(),
        members: group.plan(system),
        unloaded: group.unloaded(),
    }
}

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

fn node_options(machines: &[MachineView]) -> Vec<NodeOption> {
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

/// The deployments on whole GPUs: workers that name a catalog model.
fn whole_deployments(workers: &[WorkerView]) -> impl Iterator<Item = &WorkerView> {
    workers.iter().filter(|w| w.model.is_some())
}

/// Whether a pending reason is about `machine`: `GPU 0 of majin: …`, `majin has …`, `majin: …`.
fn concerns(reason: &str, machine: &str) -> bool {
    reason
        .strip_prefix(machine)
        .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with(':'))
        || reason.contains(&format!(" of {machine}:"))
        || reason.contains(&format!(" of {machine} "))
}

impl ConsoleService {
    async fn model_rows(&self) -> Result<Vec<ModelRow>, ApiError> {
        let system = self.fleet.system_models();
        let engines = self.fleet.runtime().engines();
        let mut rows = Vec::new();
        let committed = self.fleet.committed();
        for group in &committed.groups {
            for share in &group.members {
                rows.push(ModelRow {
                    name: share.member.clone(),
                    group: Some(group.name.clone()),
                    share: Some(share.share),
                    whole_gpus: None,
                    nodes: group_machines(group),
                    engines: engines
                        .iter()
                        .filter(|e| {
                            e.group.as_deref() == Some(&group.name)
                                && e.model.as_deref() == Some(&share.member)
                        })
                        .map(engine_line)
                        .collect(),
                    system: system.contains(&share.member),
                    revision: group.revision,
                    on_demand: self.fleet.on_demand_view(&share.member),
                    slowed: self.fleet.slowed(&share.member),
                    over_share: self.fleet.over_share(&share.member),
                    // Not on made-up GPUs, where no daemon runs: the demo engines stand in.
                    share_enforced: !group.gpus.is_empty()
                        && group.gpus.iter().all(|gpu| {
                            committed.sharing(gpu).mode.enforces_memory()
                                && self.fleet.runs_daemons(&gpu.machine)
                        }),
                });
            }
        }
        for worker in whole_deployments(&self.fleet.workers()) {
            rows.push(ModelRow {
                name: worker.model.clone().unwrap_or_default(),
                group: None,
                share: None,
                whole_gpus: Some(worker.gpus.len() as u32),
                nodes: worker.machine.iter().cloned().collect(),
                engines: engines
                    .iter()
                    .filter(|e| e.worker.as_deref() == Some(&worker.name))
                    .map(engine_line)
                    .collect(),
                system: false,
                revision: worker.revision,
                on_demand: None,
                slowed: worker.model.as_deref().and_then(|m| self.fleet.slowed(m)),
                over_share: None,
                share_enforced: false,
            });
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(rows)
    }

    async fn progress(&self) -> Result<Vec<PlanProgress>, ApiError> {
        let runtime = self.fleet.runtime();
        Ok(self
            .fleet
            .committed()
            .groups
            .iter()
            .filter_map(|g| runtime.progress(&g.name).map(|p| (g.name.clone(), p)))
            .map(|(group, p)| PlanProgress {
                group,
                revision: p.revision,
                steps: p
                    .steps
                    .into_iter()
                    .map(|s| StepLine {
                        action: s.action,
                        member: s.member,
                        state: match s.status {
                            StepStatus::Waiting => StepState::Waiting,
                            StepStatus::Running => StepState::Running,
                            StepStatus::Done => StepState::Done,
                            StepStatus::Failed => StepState::Failed,
                        },
                        message: s.message,
                    })
                    .collect(),
            })
            // Done changes drop out; a failed step stays in sight until the next change.
            .filter(|p| p.steps.iter().any(|s| s.state != StepState::Done))
            .collect())
    }

    async fn node_rows(&self) -> Result<Vec<NodeRow>, ApiError> {
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
                }
            })
            .collect())
    }

    async fn machine_detail(&self, name: &str) -> Result<MachineDetail, ApiError> {
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
            .map(|w| WorkerLine {
                name: w.model.clone().unwrap_or_else(|| w.name.clone()),
                group: None,
                gpus: w.gpus.clone(),
                shared: w.gpu_shared_gb.and(sharer_bytes(&w.name)),
                status: engines
                    .iter()
                    .find(|e| e.worker.as_deref() == Some(&w.name))
                    .map(|e| status(e.state)),
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
                lines.push(WorkerLine {
                    name: share.member.clone(),
                    group: Some(group.name.clone()),
                    gpus: gpus.clone(),
                    shared: Some(total.share(share.share)),
                    status: engines
                        .iter()
                        .find(|e| {
                            e.group.as_deref() == Some(&group.name)
                                && e.model.as_deref() == Some(&share.member)
                                && e.machine == name
                        })
                        .map(|e| status(e.state)),
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

    async fn options(&self) -> Result<DeployOptions, ApiError> {
        let committed = self.fleet.committed();
        let groups = &committed.groups;
        let system = committed.system_models();
        let workers = self.fleet.workers();
        let catalog = self
            .fleet
            .models()
            .into_iter()
            .map(|m| CatalogEntry {
                deployed: groups
                    .iter()
                    .any(|g| g.members.iter().any(|s| s.member == m.name))
                    || whole_deployments(&workers).any(|w| w.model.as_ref() == Some(&m.name)),
                engine: crate::fleet::groups::engine_name(m.engine).to_owned(),
                default_share: m.default_share,
                group: m.group,
                system: m.system,
                name: m.name,
            })
            .collect();
        Ok(DeployOptions {
            catalog,
            nodes: node_options(&self.fleet.machines()),
            groups: groups.iter().map(|g| plan_of(g, &system)).collect(),
        })
    }

    async fn sharing(&self, model: &str) -> Result<SharingForm, ApiError> {
        let group = match self.fleet.deployed(model) {
            Some(Deployed::Group(group)) => group,
            Some(Deployed::Whole(_)) => {
                return Err(ApiError::Unprocessable(format!(
                    "{model} runs on whole GPUs, so it has no share to change; remove it and deploy it with GPU sharing on to share"
                )))
            }
            None => return Err(not_running(model)),
        };
        let system = self.fleet.system_models();
        let mut gpus = Vec::with_capacity(group.gpus.len());
        for gpu in &group.gpus {
            gpus.push(self.fleet.group_gpu(gpu, Some(&group.name)).await?);
        }
        Ok(SharingForm {
            model: model.to_owned(),
            group: plan_of(&group, &system),
            gpus,
        })
    }

    /// The serving form, its secrets redacted for everyone but admins.
    async fn serving(&self, caller: &Caller, model: &str) -> Result<ServingForm, ApiError> {
        let (group, revision, placed) = match self.fleet.deployed(model) {
            Some(Deployed::Group(group)) => {
                (Some(group.name.clone()), group.revision, group.gpus.clone())
            }
            Some(Deployed::Whole(worker)) => {
                let view = self.fleet.worker(&worker.name)?;
                let machine = view.machine.clone().unwrap_or_default();
                let placed = view
                    .gpus
                    .iter()
                    .map(|i| GpuRef::new(&machine, *i))
                    .collect();
                (None, worker.revision, placed)
            }
            None => return Err(not_running(model)),
        };
        let (mut args, mut env) = self.fleet.serving_of(model)?;
        if caller.role != Role::Admin {
            let marked = self.fleet.secret_env_of(model);
            env = authority::redact_env(&env, &marked);
            args = authority::redact_args(&args);
        }
        Ok(ServingForm {
            model: model.to_owned(),
            group,
            revision,
            nodes: node_options(&self.fleet.machines()),
            placed,
            serving: Serving {
                args,
                env: env.into_iter().collect(),
            },
        })
    }
}

fn not_running(model: &str) -> ApiError {
    ApiError::NotFound(format!(
        "{model} does not run; the Models tab lists what runs"
    ))
}

/// Environment variables from a form, refusing a name given twice.
fn env_map(env: Vec<(String, String)>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut map = BTreeMap::new();
    for (name, value) in env {
        if map.insert(name.clone(), value).is_some() {
            return Err(ApiError::Unprocessable(format!(
                "the environment variable {name} is set twice; keep one"
            )));
        }
    }
    Ok(map)
}

fn outcome(change: PlanChange) -> ChangeOutcome {
    ChangeOutcome {
        group: change.group,
        restarts: change.restarts.into_iter().map(|r| r.member).collect(),
        warning: change.warning,
    }
}

impl Console for ConsoleService {
    fn models(&self) -> Answer<'_, Vec<ModelRow>> {
        Box::pin(async move { self.model_rows().await.map_err(app_error) })
    }

    fn changes(&self) -> Answer<'_, Vec<PlanProgress>> {
        Box::pin(async move { self.progress().await.map_err(app_error) })
    }

    fn nodes(&self) -> Answer<'_, Vec<NodeRow>> {
        Box::pin(async move { self.node_rows().await.map_err(app_error) })
    }

    fn machine(&self, name: String) -> Answer<'_, MachineDetail> {
        Box::pin(async move { self.machine_detail(&name).await.map_err(app_error) })
    }

    fn deploy_options(&self) -> Answer<'_, DeployOptions> {
        Box::pin(async move { self.options().await.map_err(app_error) })
    }

    fn deploy(&self, actor: Caller, request: DeployRequest) -> Answer<'_, ChangeOutcome> {
        Box::pin(async move {
            let sharing = Sharing::new(
                request.shared,
                request.share,
                request.shares.into_iter().collect(),
                request.revision,
                request.demand,
                request.demands.into_iter().collect(),
            );
            let deploy = DeployCommand {
                model: request.model,
                gpus: GpuChoice::new(request.gpus)
                    .map_err(|e| app_error(ApiError::Unprocessable(e.to_string())))?,
                sharing: sharing.map_err(app_error)?,
                serving: FleetServing {
                    args: request.serving.args,
                    env: env_map(request.serving.env).map_err(app_error)?,
                },
            };
            self.fleet
                .deploy(deploy, &actor)
                .await
                .map(outcome)
                .map_err(app_error)
        })
    }

    fn sharing_form(&self, model: String) -> Answer<'_, SharingForm> {
        Box::pin(async move { self.sharing(&model).await.map_err(app_error) })
    }

    fn change_shares(
        &self,
        actor: Caller,
        group: String,
        revision: i64,
        shares: Vec<(String, BasisPoints)>,
        demand: Vec<(String, Demand)>,
    ) -> Answer<'_, ChangeOutcome> {
        Box::pin(async move {
            let update = PlanCommand {
                revision,
                shares: shares.into_iter().collect(),
                demand: demand.into_iter().collect(),
            };
            self.fleet
                .change_plan(&group, update, &actor.name)
                .await
                .map(outcome)
                .map_err(app_error)
        })
    }

    fn serving_form(&self, caller: Caller, model: String) -> Answer<'_, ServingForm> {
        Box::pin(async move { self.serving(&caller, &model).await.map_err(app_error) })
    }

    fn change_serving(
        &self,
        actor: Caller,
        model: String,
        revision: i64,
        serving: Serving,
    ) -> Answer<'_, ChangeOutcome> {
        Box::pin(async move {
            let serving = FleetServing {
                args: serving.args,
                env: env_map(serving.env).map_err(app_error)?,
            };
            let change = self
                .fleet
                .change_serving(&model, revision, serving, &actor)
                .await
                .map_err(app_error)?;
            Ok(ChangeOutcome {
                group: change.group,
                restarts: change.restarts,
                warning: None,
            })
        })
    }

    fn remove(&self, actor: Caller, model: String, revision: i64) -> Answer<'_, ChangeOutcome> {
        Box::pin(async move {
            self.fleet
                .remove_deployment(&model, revision, &actor.name)
                .await
                .map(outcome)
                .map_err(app_error)
        })
    }

    fn accounts(&self) -> Answer<'_, AccountsPage> {
        Box::pin(async move {
            let pool = &self.pool;
            let accounts = accounts::users(pool).await.map_err(app_error)?;
            let tokens = accounts::tokens(pool).await.map_err(app_error)?;
            Ok(AccountsPage { accounts, tokens })
        })
    }

    fn create_account(
        &self,
        actor: Caller,
        name: String,
        role: Role,
        password: String,
    ) -> Answer<'_, ()> {
        Box::pin(async move {
            let new = accounts::NewUser {
                name,
                role,
                password,
            };
            accounts::create_user(&self.pool, &new, &actor.name)
                .await
                .map(drop)
                .map_err(app_error)
        })
    }

    fn delete_account(&self, actor: Caller, name: String) -> Answer<'_, ()> {
        Box::pin(async move {
            accounts::delete_user(&self.pool, &name, &actor.name)
                .await
                .map_err(app_error)?;
            self.tokens.forget();
            Ok(())
        })
    }

    fn create_token(
        &self,
        actor: Caller,
        user: String,
        name: String,
        limits: TokenLimits,
    ) -> Answer<'_, NewApiToken> {
        Box::pin(async move {
            let limits = accounts::check_limits(limits).map_err(app_error)?;
            accounts::create_token(&self.pool, &user, &name, &limits, &actor.name)
                .await
                .map_err(app_error)
        })
    }

    fn revoke_token(&self, actor: Caller, id: i64) -> Answer<'_, ()> {
        Box::pin(async move {
            accounts::revoke_token(&self.pool, id, &actor.name)
                .await
                .map_err(app_error)?;
            self.tokens.forget();
            Ok(())
        })
    }

    fn audit(&self, query: AuditQuery) -> Answer<'_, Vec<AuditLine>> {
        Box::pin(async move {
            let text = |s: String| (!s.is_empty()).then_some(s);
            let filter = audit::AuditFilter {
                actor: text(query.actor),
                action: text(query.action),
                target: text(query.target),
                limit: None,
            };
            let entries = audit::entries(&self.pool, &filter)
                .await
                .map_err(app_error)?;
            Ok(entries
                .into_iter()
                .map(|e| AuditLine {
                    id: e.id,
                    at: e.at,
                    actor: e.actor,
                    action: e.action,
                    target: e.target,
                    before: e.before.map(|v| v.to_string()),
                    after: e.after.map(|v| v.to_string()),
                    revision: e.revision,
                    restarts: e.restarts,
                })
                .collect())
        })
    }

    fn usage(&self, from_ms: u64, to_ms: u64, by: Grouping) -> Answer<'_, UsageReport> {
        Box::pin(async move {
            self.fleet
                .usage(from_ms, to_ms, by)
                .await
                .map_err(app_error)
        })
    }

    fn now_ms(&self) -> u64 {
        crate::fleet::usage::now_ms()
    }

    fn repack_input(&self) -> Answer<'_, placement::RepackInput> {
        Box::pin(async move { Ok(self.fleet.repack_input().await) })
    }

    fn start_repack(
        &self,
        actor: Caller,
        free: Option<usize>,
        expect: Vec<placement::Move>,
    ) -> Answer<'_, app::views::RepackRun> {
        Box::pin(async move {
            let goal = placement::repack::Goal::from_free(free)
                .map_err(|e| AppError::Refused(e.to_string()))?;
            self.fleet
                .start_repack(goal, Some(expect), &actor.name)
                .await
                .map_err(app_error)
        })
    }

    fn set_sharing(
        &self,
        actor: Caller,
        machine: String,
        index: u32,
        mode: String,
        compute_percent: Option<i64>,
        instances: Option<Vec<String>>,
    ) -> Answer<'_, app::views::SharingChange> {
        Box::pin(async move {
            let sharing = placement::sharing::GpuSharing::parse(&mode, compute_percent)
                .map_err(|e| AppError::Refused(e.to_string()))?;
            self.fleet
                .set_sharing(
                    placement::GpuRef::new(machine, index),
                    sharing,
                    instances,
                    &actor.name,
                )
                .await
                .map_err(app_error)
        })
    }

    fn repack_run(&self) -> Answer<'_, Option<app::views::RepackRun>> {
        Box::pin(async move { Ok(self.fleet.repack_run()) })
    }

    fn stop_repack(&self, actor: Caller) -> Answer<'_, app::views::RepackRun> {
        Box::pin(async move { self.fleet.stop_repack(&actor.name).await.map_err(app_error) })
    }

    fn playground(&self, caller: Caller, model: Option<String>) -> Answer<'_, Playground> {
        Box::pin(async move {
            let models = self.fleet.served();
            let shown = model.or_else(|| models.first().cloned());
            let runtime = self.fleet.runtime();
            let engine = runtime
                .engines()
                .into_iter()
                .find(|e| shown.is_some() && (e.model == shown || e.worker == shown));
            let mut logs = match &engine {
                Some(engine) => match runtime
                    .logs(&engine.id, app::pages::playground::LOG_LINES)
                    .await
                {
                    Some(Ok(lines)) => lines,
                    Some(Err(e)) => {
                        tracing::warn!("the log of {} could not be read: {e}", engine.id);
                        Vec::new()
                    }
                    None => Vec::new(),
                },
                None => Vec::new(),
            };
            if let Some(engine) = engine.filter(|_| caller.role != Role::Admin) {
                let secrets = self.fleet.engine_secrets(&engine);
                for line in &mut logs {
                    *line = authority::redact_line(line, &secrets);
                }
            }
            Ok(Playground { models, logs })
        })
    }
}

#[cfg(test)]
mod tests;
