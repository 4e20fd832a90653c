//! Sharing groups (seed 003): the model catalog, each group's committed share plan, deploying a model into
//! a group, and changing a plan. Every member holds its share on each of the group's GPUs in the scheduler,
//! so shared workers and groups never overfill a GPU between them.

use super::{Fleet, State};
use crate::error::ApiError;
use crate::inventory::demo::{CatalogModel, Engine};
use crate::runtime::{EngineState, Progress};
use crate::units::Holder;
use app::auth::Caller;
use placement::{
    choose_group, judge, running, transition, BasisPoints, Demand, GpuChoice, GpuRef, GroupChoice,
    GroupGpu, Hold, KeepAlive, PlanMember, Restart, Scheduler, Share, Step,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

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

/// What a committed plan change does: the new revision, and who restarts in which order.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PlanChange {
    /// The group; none for a model deployed on whole GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Its revision after the change (the worker's, for a model on whole GPUs).
    pub revision: i64,
    /// The wizard's line about the group (`This model joins text-router.`), for a deploy.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub line: Option<String>,
    /// Every member that restarts, stops or starts.
    pub restarts: Vec<Restart>,
    /// The stops and starts, in an order that never overfills a GPU.
    pub steps: Vec<Step>,
    /// The Free row's warning when the committed plan is over 90 %; it did not block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
}

/// A deploy as the fleet takes it, every field already read: the REST API parses one from its body, the
/// console builds one from the wizard's typed fields.
#[derive(Debug, Clone)]
pub struct DeployCommand {
    /// The catalog model.
    pub model: String,
    /// The GPUs chosen.
    pub gpus: GpuChoice,
    /// A share of a group's GPUs, or GPUs whole.
    pub sharing: Sharing,
    /// The deployment's own serving configuration.
    pub serving: Serving,
}

/// How a deployed model takes its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sharing {
    /// A share of each GPU, in the group that runs there or in a new one.
    Shared {
        /// Its share; the catalog's default share when none.
        share: Option<BasisPoints>,
        /// New shares for other members of the group it joins.
        shares: BTreeMap<String, BasisPoints>,
        /// The revision of the group it joins; required when it joins one.
        revision: Option<i64>,
        /// Always loaded, or loaded when asked for.
        demand: Demand,
        /// New demand for other members of the group it joins.
        demands: BTreeMap<String, Demand>,
    },
    /// The GPUs whole, all of one machine.
    Whole,
}

impl Sharing {
    /// The sharing a deploy asks for: with `shared` off it takes GPUs whole, and then no share, shares or
    /// revision belong to it.
    pub fn new(
        shared: bool,
        share: Option<BasisPoints>,
        shares: BTreeMap<String, BasisPoints>,
        revision: Option<i64>,
        demand: Demand,
        demands: BTreeMap<String, Demand>,
    ) -> Result<Sharing, ApiError> {
        if shared {
            return Ok(Sharing::Shared {
                share,
                shares,
                revision,
                demand,
                demands,
            });
        }
        if demand.is_on_demand() || !demands.is_empty() {
            return Err(ApiError::Unprocessable(
                "a model on whole GPUs is always loaded: deploy it with \"shared\": true to load it on demand".to_owned(),
            ));
        }
        if share.is_some() || !shares.is_empty() || revision.is_some() {
            return Err(ApiError::Unprocessable(
                "a deploy on whole GPUs takes no share, shares or revision; leave them out, or deploy with \"shared\": true".to_owned(),
            ));
        }
        Ok(Sharing::Whole)
    }
}

/// A plan change as the fleet takes it: every member's share, against the revision it was read at. A
/// member left out has no explicit share, which the verdict refuses.
#[derive(Debug, Clone)]
pub struct PlanCommand {
    /// The revision the plan was read at.
    pub revision: i64,
    /// Each member's share.
    pub shares: BTreeMap<String, BasisPoints>,
    /// Members whose demand changes (pinned, or on demand with a keep-alive); the others keep theirs.
    pub demand: BTreeMap<String, Demand>,
}

/// Who makes a plan change and what it is, for the audit log.
pub(crate) struct Note<'a> {
    actor: &'a str,
    action: &'a str,
    target: &'a str,
}

impl<'a> Note<'a> {
    pub(crate) fn new(actor: &'a str, action: &'a str, target: &'a str) -> Note<'a> {
        Note {
            actor,
            action,
            target,
        }
    }
}

/// A deployment's own serving configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Serving {
    /// Arguments added to the model's recipe.
    pub args: Vec<String>,
    /// Environment variables added to the model's recipe.
    pub env: BTreeMap<String, String>,
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
}

impl Group {
    /// Whether `member` is pinned or on demand.
    pub(crate) fn demand_of(&self, member: &str) -> Demand {
        match self.demand.get(member) {
            Some(&keep_alive) => Demand::OnDemand { keep_alive },
            None => Demand::Pinned,
        }
    }

    /// Whether `member` runs an engine now: pinned, or on demand and loaded.
    pub(crate) fn runs(&self, member: &str) -> bool {
        !self.demand.contains_key(member) || self.loaded.contains(member)
    }

    /// Its committed plan, with `system` members (the router) locked.
    pub(crate) fn plan(&self, system: &[String]) -> Vec<PlanMember> {
        self.members
            .iter()
            .map(|s| PlanMember {
                locked: system.contains(&s.member),
                demand: self.demand_of(&s.member),
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

    /// The members that run an engine now, with their shares.
    pub(crate) fn running(&self) -> Vec<Share> {
        self.members
            .iter()
            .filter(|s| self.runs(&s.member))
            .cloned()
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
        let committed = &views.committed;
        let system = committed.system_models();
        let engines = self.runtime.engines();
        committed
            .groups
            .iter()
            .map(|g| {
                let mut view = group_view(g, &system);
                for member in &mut view.members {
                    member.engines = engines
                        .iter()
                        .filter(|e| {
                            e.group.as_deref() == Some(&g.name)
                                && e.model.as_ref() == Some(&member.name)
                        })
                        .map(|e| MemberEngine {
                            machine: e.machine.clone(),
                            state: e.state,
                            message: e.message.clone(),
                        })
                        .collect();
                    let prefix = crate::units::member_prefix(&g.name, &member.name);
                    member.on_demand = self.on_demand_view(&member.name);
                    member.not_held = views
                        .unplaced
                        .iter()
                        .filter(|(who, _)| who.starts_with(&prefix))
                        .map(|(_, why)| why.clone())
                        .collect();
                }
                view.progress = self.runtime.progress(&g.name);
                view
            })
            .collect()
    }

    /// One group.
    pub fn group(&self, name: &str) -> Result<GroupView, ApiError> {
        self.groups()
            .into_iter()
            .find(|g| g.name == name)
            .ok_or_else(|| no_group(name))
    }

    /// A GPU as a group's plan is judged against it: what shared work outside `group` takes there.
    pub async fn group_gpu(&self, gpu: &GpuRef, group: Option<&str>) -> Result<GroupGpu, ApiError> {
        let state = self.state.lock().await;
        group_gpu(state.ledger.scheduler(), gpu, group)
    }

    /// Changes a group's shares. Refused (422, with the verdict) when the plan does not fit, and (409) when
    /// the group changed since `revision`; either way nothing changes.
    pub async fn change_plan(
        self: &Arc<Self>,
        name: &str,
        update: PlanCommand,
        actor: &str,
    ) -> Result<PlanChange, ApiError> {
        let (name, actor) = (name.to_owned(), actor.to_owned());
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            let group = state
                .committed
                .group(&name)
                .cloned()
                .ok_or_else(|| no_group(&name))?;
            check_revision(&group, Some(update.revision))?;
            let system = state.committed.system_models();
            let plan = plan_with(&group, &system, &update.shares, &update.demand, false)?;
            let note = Note::new(&actor, "plan.change", &name);
            fleet
                .commit(&mut state, &group, plan, None, None, note)
                .await
        })
        .await
    }

    /// Deploys a catalog model onto a share of the chosen GPUs: it joins the group that runs there, or
    /// starts one (named by its recipe, or after the model), into which the router moves. With sharing off
    /// it takes whole GPUs of one machine instead.
    pub async fn deploy(
        self: &Arc<Self>,
        deploy: DeployCommand,
        actor: &Caller,
    ) -> Result<PlanChange, ApiError> {
        let caller = actor.clone();
        let actor = actor.name.clone();
        self.write(|fleet| async move {
            check_serving(&deploy.serving.args, &deploy.serving.env)?;
            if let Some(model) = fleet.committed().model(&deploy.model) {
                super::authority::check_serving(
                    &caller,
                    model,
                    &deploy.serving.args,
                    &deploy.serving.env,
                )?;
            }
            let Sharing::Shared {
                share,
                shares,
                revision,
                demand,
                demands,
            } = &deploy.sharing
            else {
                return fleet.deploy_whole(&deploy, &actor).await;
            };
            let chosen = deploy.gpus.gpus();
            let mut state = fleet.state.lock().await;
            let committed = state.committed.clone();
            let model = committed.undeployed_model(&deploy.model)?;
            let system = committed.system_models();
            let on_nodes: Vec<&str> = committed
                .groups
                .iter()
                .filter(|g| g.gpus.iter().any(|gpu| chosen.contains(gpu)))
                .map(|g| g.name.as_str())
                .collect();
            let choice = choose_group(&model.name, model.group.as_deref(), &on_nodes)
                .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
            let share = share.unwrap_or(model.default_share);
            let (group, mut plan, moving) = match &choice {
                GroupChoice::Join(name) => {
                    let group = committed
                        .group(name)
                        .cloned()
                        .ok_or_else(|| no_group(name))?;
                    check_revision(&group, *revision)?;
                    let plan = plan_with(&group, &system, shares, demands, true)?;
                    (group, plan, None)
                }
                GroupChoice::New { name, .. } => {
                    if committed.group(name).is_some() {
                        return Err(ApiError::Conflict(format!(
                            "a group named {name} runs on other GPUs; choose its GPUs to join it"
                        )));
                    }
                    let inventory = state.ledger.inventory();
                    placement::check_new_group(inventory, chosen)
                        .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
                    // The router moves out of the group it runs in, with its share, into the new one.
                    let router = committed.groups.iter().find_map(|g| {
                        g.members
                            .iter()
                            .find(|s| system.contains(&s.member))
                            .map(|s| (g.clone(), s.clone()))
                    });
                    let plan = router
                        .iter()
                        .map(|(_, s)| PlanMember {
                            locked: true,
                            ..PlanMember::new(&s.member, s.share)
                        })
                        .collect();
                    let group = Group {
                        name: name.clone(),
                        gpus: placement::group_gpus(inventory, chosen),
                        revision: 0,
                        members: Vec::new(),
                        serving: BTreeMap::new(),
                        demand: BTreeMap::new(),
                        loaded: BTreeSet::new(),
                    };
                    (group, plan, router)
                }
            };
            if model.system && demand.is_on_demand() {
                return Err(router_stays_pinned(&model.name));
            }
            plan.push(PlanMember {
                locked: model.system,
                demand: *demand,
                ..PlanMember::new(&model.name, share)
            });
            let serving = deploy.serving.clone();
            let mut change = fleet
                .commit(
                    &mut state,
                    &group,
                    plan,
                    moving,
                    Some((&model.name, serving)),
                    Note::new(&actor, "deploy", &model.name),
                )
                .await?;
            change.line = Some(choice.line());
            Ok(change)
        })
        .await
    }

    /// The system members (the semantic router).
    pub(crate) fn system_models(&self) -> Vec<String> {
        self.committed().system_models()
    }

    /// Judges `plan` for `group` and, when it fits, commits it in one transaction; then the ledger and the
    /// views follow it, and the runtime carries the change out in `placement`'s order. `moving` is the
    /// router leaving the group it runs in for this (new) one; `serving` the serving configuration of a
    /// model being deployed. Runs under the write lock, inside [`Fleet::write`].
    pub(super) async fn commit(
        &self,
        state: &mut State,
        group: &Group,
        plan: Vec<PlanMember>,
        moving: Option<(Group, Share)>,
        serving: Option<(&str, Serving)>,
        note: Note<'_>,
    ) -> Result<PlanChange, ApiError> {
        let gpus = group
            .gpus
            .iter()
            .map(|g| group_gpu(state.ledger.scheduler(), g, Some(&group.name)))
            .collect::<Result<Vec<_>, _>>()?;
        let verdict = judge(&plan, &gpus);
        if verdict.is_refused() {
            let first = &verdict.problems[0];
            let message = match first.member() {
                Some(member) => format!("{member}: {}", first.message()),
                None => first.message(),
            };
            return Err(ApiError::Refused {
                message,
                verdict: Box::new(verdict),
            });
        }
        let after: Vec<Share> = plan
            .iter()
            .map(|m| Share::new(&m.name, m.share.unwrap_or_default()))
            .collect();
        let demand: BTreeMap<String, KeepAlive> = plan
            .iter()
            .filter_map(|m| Some((m.name.clone(), m.demand.keep_alive()?)))
            .collect();
        // What runs keeps running where it can (`placement::running`); loaded on-demand members that no
        // longer fit beside the new plan unload, least recently used idle first.
        let (running_before, running_after) = running(&group.plan(&[]), &group.unloaded(), &plan);
        let mut planned = group.clone();
        planned.members = after.clone();
        planned.loaded = demand
            .keys()
            .filter(|m| running_after.iter().any(|s| &s.member == *m))
            .cloned()
            .collect();
        planned.demand = demand.clone();
        let mut trial = (*state.committed).clone();
        trial.groups.retain(|g| g.name != group.name);
        trial.groups.push(planned.clone());
        let unloaded = self
            .make_room(state, &trial, &group.gpus, &[])
            .unwrap_or_else(|| planned.loaded.iter().cloned().collect());
        for m in &unloaded {
            planned.loaded.remove(m);
        }
        let moving_in: Vec<&str> = moving.iter().map(|(_, s)| s.member.as_str()).collect();
        let running_after: Vec<Share> = running_after
            .into_iter()
            .filter(|s| !unloaded.contains(&s.member))
            .collect();
        let change = transition(&running_before, &running_after, &moving_in);

        let mut tx = crate::db::write(&self.pool).await?;
        // Members keep their serving configuration through a change of shares (and the router through a move).
        let mut configs: BTreeMap<String, Serving> = group.serving.clone();
        if let Some((from, router)) = &moving {
            if let Some(serving) = from.serving.get(&router.member) {
                configs.insert(router.member.clone(), serving.clone());
            }
        }
        // A deploy's serving configuration is part of what it changed.
        let deployed = serving.as_ref().map(|(model, serving)| {
            let marked = state
                .committed
                .model(model)
                .map(|m| m.secret_env.clone())
                .unwrap_or_default();
            super::authority::redact_json(
                serde_json::json!({ "model": model, "args": serving.args, "env": serving.env }),
                &marked,
            )
        });
        if let Some((model, serving)) = serving {
            configs.insert(model.to_owned(), serving);
        }
        let revision = if group.revision == 0 {
            sqlx::query("INSERT INTO groups (name, gpus) VALUES (?, ?)")
                .bind(&group.name)
                .bind(serde_json::to_string(&group.gpus).map_err(ApiError::internal)?)
                .execute(&mut *tx)
                .await?;
            1
        } else {
            sqlx::query("UPDATE groups SET revision = revision + 1 WHERE name = ?")
                .bind(&group.name)
                .execute(&mut *tx)
                .await?;
            group.revision + 1
        };
        if let Some((from, router)) = &moving {
            sqlx::query("DELETE FROM group_members WHERE group_name = ? AND model = ?")
                .bind(&from.name)
                .bind(&router.member)
                .execute(&mut *tx)
                .await?;
            sqlx::query("UPDATE groups SET revision = revision + 1 WHERE name = ?")
                .bind(&from.name)
                .execute(&mut *tx)
                .await?;
            // A group the router was the last member of ends with its move.
            sqlx::query(
                "DELETE FROM groups WHERE name = ? AND NOT EXISTS (SELECT 1 FROM group_members WHERE group_name = ?)",
            )
            .bind(&from.name)
            .bind(&from.name)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM group_members WHERE group_name = ?")
            .bind(&group.name)
            .execute(&mut *tx)
            .await?;
        if after.is_empty() {
            // Its last member left: the group ends, and its GPUs are whole again.
            sqlx::query("DELETE FROM groups WHERE name = ?")
                .bind(&group.name)
                .execute(&mut *tx)
                .await?;
        }
        for (position, s) in after.iter().enumerate() {
            let serving = configs.remove(&s.member).unwrap_or_default();
            let keep_alive = demand.get(&s.member);
            sqlx::query("INSERT INTO group_members (group_name, model, share, position, args, env, on_demand, keep_alive_s, loaded) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
                .bind(&group.name)
                .bind(&s.member)
                .bind(i64::from(s.share.get()))
                .bind(position as i64)
                .bind(serde_json::to_string(&serving.args).map_err(ApiError::internal)?)
                .bind(serde_json::to_string(&serving.env).map_err(ApiError::internal)?)
                .bind(keep_alive.is_some())
                .bind(i64::from(keep_alive.copied().unwrap_or_default().secs()))
                .bind(planned.loaded.contains(&s.member))
                .execute(&mut *tx)
                .await?;
        }
        // Each member's share, percent; an on-demand one's with its keep-alive.
        let shares = |g: &Group| -> serde_json::Value {
            g.members
                .iter()
                .map(|s| {
                    let share = serde_json::json!(s.share.as_percent_f64());
                    let value = match g.demand.get(&s.member) {
                        Some(k) => serde_json::json!({ "share": share, "on_demand": { "keep_alive_s": k.secs() } }),
                        None => share,
                    };
                    (s.member.clone(), value)
                })
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(note.actor, note.action, note.target)
                .before(serde_json::json!({ "group": group.name, "shares": shares(group) }))
                .after(match deployed {
                    Some(serving) => serde_json::json!({ "group": group.name, "shares": shares(&planned), "serving": serving }),
                    None => serde_json::json!({ "group": group.name, "shares": shares(&planned) }),
                })
                .revision(revision)
                .restarts(change.restarts.iter().map(|r| r.member.clone()).collect()),
        )
        .await?;
        let inventory = state.ledger.inventory().clone();
        self.finish(
            state,
            tx,
            inventory,
            Some((group.name.clone(), revision, change.steps.clone())),
        )
        .await?;
        Ok(PlanChange {
            group: Some(group.name.clone()),
            revision,
            line: None,
            restarts: change.restarts,
            steps: change.steps,
            warning: verdict
                .warns()
                .then(|| placement::plan::FREE_ROW_WARNING.to_owned()),
        })
    }
}

/// The router asked to load on demand.
fn router_stays_pinned(router: &str) -> ApiError {
    ApiError::Unprocessable(format!(
        "{router} routes every request of its group: it stays pinned"
    ))
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

/// The group's members with the shares and demand asked for. The router keeps its share and stays pinned
/// (asking to change either is refused); a member not asked about keeps its share when `keep_unasked`, or
/// has none (which the verdict refuses) when the whole plan was sent; a member not asked about its demand
/// keeps it.
fn plan_with(
    group: &Group,
    system: &[String],
    asked: &BTreeMap<String, BasisPoints>,
    demands: &BTreeMap<String, Demand>,
    keep_unasked: bool,
) -> Result<Vec<PlanMember>, ApiError> {
    if let Some(stranger) = asked
        .keys()
        .chain(demands.keys())
        .find(|m| !group.members.iter().any(|s| &&s.member == m))
    {
        return Err(ApiError::Unprocessable(format!(
            "{} has no member named {stranger}",
            group.name
        )));
    }
    group
        .members
        .iter()
        .map(|s| {
            let locked = system.contains(&s.member);
            let share = asked.get(&s.member).copied();
            if locked && share.is_some_and(|p| p != s.share) {
                return Err(ApiError::Unprocessable(format!(
                    "the share of {} is not editable",
                    s.member
                )));
            }
            let share = if locked || (keep_unasked && share.is_none()) {
                Some(s.share)
            } else {
                share
            };
            let demand = match demands.get(&s.member) {
                Some(demand) if locked && demand.is_on_demand() => {
                    return Err(router_stays_pinned(&s.member));
                }
                Some(&demand) => demand,
                None => group.demand_of(&s.member),
            };
            Ok(PlanMember {
                name: s.member.clone(),
                share,
                locked,
                demand,
            })
        })
        .collect()
}

/// The most extra arguments and environment variables one recipe or deployment takes.
const MAX_SETTINGS: usize = 64;
/// The longest argument, variable value, command template or model path.
const MAX_SETTING_LEN: usize = 4096;

pub(crate) fn check_text(what: &str, text: &str) -> Result<(), ApiError> {
    if text.len() > MAX_SETTING_LEN {
        return Err(ApiError::Unprocessable(format!(
            "{what} is {} bytes long; at most {MAX_SETTING_LEN}",
            text.len()
        )));
    }
    if text.contains('\0') {
        return Err(ApiError::Unprocessable(format!(
            "{what} contains a NUL character, which no program can be given"
        )));
    }
    Ok(())
}

/// A serving configuration (extra arguments and environment) that a process can be started with.
pub(crate) fn check_serving(
    args: &[String],
    env: &BTreeMap<String, String>,
) -> Result<(), ApiError> {
    if args.len() > MAX_SETTINGS || env.len() > MAX_SETTINGS {
        return Err(ApiError::Unprocessable(format!(
            "at most {MAX_SETTINGS} extra arguments and {MAX_SETTINGS} environment variables"
        )));
    }
    for (i, arg) in args.iter().enumerate() {
        check_text(&format!("extra argument {}", i + 1), arg)?;
    }
    for (name, value) in env {
        check_text(&format!("the value of {name}"), value)?;
    }
    check_env(env)
}

/// A catalog recipe's fields, beyond its name and share.
pub(super) fn check_recipe(model: &CatalogModel) -> Result<(), ApiError> {
    if let Some(group) = &model.group {
        crate::fleet::check_name(group)?;
    }
    check_text("model_path", &model.model_path)?;
    if let Some(command) = &model.command {
        check_text("command", command)?;
    }
    check_serving(&model.args, &model.env)
}

/// Environment variable names as a shell and the engines take them.
pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let bad = env.keys().find(|k| {
        !k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    });
    match bad {
        Some(k) => Err(ApiError::Unprocessable(format!(
            "environment variable name {k:?}: use letters, digits and '_', not starting with a digit"
        ))),
        None => Ok(()),
    }
}

pub(crate) fn check_revision(group: &Group, revision: Option<i64>) -> Result<(), ApiError> {
    match revision {
        Some(r) if r == group.revision => Ok(()),
        Some(r) => Err(ApiError::Conflict(format!(
            "group {} is at revision {}, not {r}; read it again (GET /api/groups/{}) and retry",
            group.name, group.revision, group.name
        ))),
        None => Err(ApiError::Conflict(format!(
            "this changes group {}: name the revision you read (it is {})",
            group.name, group.revision
        ))),
    }
}

fn no_group(name: &str) -> ApiError {
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
            })
            .collect(),
        // The most the plan holds at once: on-demand members take turns.
        total_percent: judge(&group.plan(&[]), &[]).total.as_percent_f64(),
        progress: None,
    }
}

#[cfg(test)]
mod tests;
