//! Sharing groups (seed 003): the model catalog, each group's committed share plan, deploying a model into
//! a group, and changing a plan. Every member holds its share on each of the group's GPUs in the scheduler,
//! so shared workers and groups never overfill a GPU between them.

use crate::api::VerdictView;
use crate::error::ApiError;
use crate::fleet::Fleet;
use crate::inventory::demo::{CatalogModel, Engine};
use crate::runtime::spec::{EngineSpec, Recipe};
use crate::runtime::{EngineState, Progress};
use placement::{
    choose_group, judge, transition, Assignment, BasisPoints, GpuRef, GroupChoice, GroupGpu, Hold,
    PlanMember, Restart, Scheduler, Share, Step,
};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use std::collections::BTreeMap;

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
    /// The sum of the shares, percent.
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

/// `POST /api/deployments`: a catalog model onto a share of the chosen GPUs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Deploy {
    /// The catalog model.
    pub model: String,
    /// The GPUs, as `machine:index`.
    pub gpus: Vec<String>,
    /// Share the GPUs with a group (the default), or take them whole (`false`: one machine's GPUs).
    #[serde(default = "sharing_by_default")]
    pub shared: bool,
    /// Its share, percent; the catalog's default share when absent.
    #[serde(default)]
    pub share: Option<f64>,
    /// New shares for other members of the group it joins, percent.
    #[serde(default)]
    pub shares: BTreeMap<String, f64>,
    /// The revision of the group it joins; required when it joins one.
    #[serde(default)]
    pub revision: Option<i64>,
    /// Serving configuration: arguments added to the model's recipe.
    #[serde(default)]
    pub args: Vec<String>,
    /// Serving configuration: environment variables added to the model's recipe.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
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

fn sharing_by_default() -> bool {
    true
}

/// A deployment's own serving configuration.
#[derive(Debug, Clone, Default)]
pub(crate) struct Serving {
    pub(crate) args: Vec<String>,
    pub(crate) env: BTreeMap<String, String>,
}

/// `PUT /api/groups/{name}/plan`: every member's share, against the revision it was read at.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanUpdate {
    /// The revision the plan was read at.
    pub revision: i64,
    /// Each member's share, percent. A member left out has no explicit share, which the verdict refuses.
    pub shares: BTreeMap<String, f64>,
}

/// A group as stored.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub(crate) name: String,
    pub(crate) gpus: Vec<GpuRef>,
    /// 0 for a group a deploy is about to start, not yet stored.
    pub(crate) revision: i64,
    pub(crate) members: Vec<Share>,
}

/// The scheduler's name for what `member` of `group` holds on `machine`; worker names cannot contain `:`,
/// `/` or `@`, so the two never meet.
fn holder(group: &str, member: &str, machine: &str) -> String {
    format!("group:{group}/{member}@{machine}")
}

/// Who a sharer is, as shown: a worker's own name, or a group member's model name with its group.
pub(crate) fn sharer(holder: &str) -> (&str, Option<&str>) {
    holder
        .strip_prefix("group:")
        .and_then(|rest| rest.split_once('/'))
        .and_then(|(group, member)| Some((member.rsplit_once('@')?.0, Some(group))))
        .unwrap_or((holder, None))
}

fn holder_prefix(group: &str) -> String {
    format!("group:{group}/")
}

/// What each member of `group` holds, one assignment per machine of its GPUs.
fn holdings(
    scheduler: &Scheduler,
    gpus: &[GpuRef],
    members: &[Share],
) -> Result<Vec<(String, String, Assignment)>, ApiError> {
    let mut by_machine: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for gpu in gpus {
        by_machine
            .entry(gpu.machine.as_str())
            .or_default()
            .push(gpu.index);
    }
    let mut out = Vec::new();
    for (machine, indices) in by_machine {
        let total = scheduler
            .inventory()
            .gpu(&GpuRef::new(machine, indices[0]))
            .ok_or_else(|| {
                ApiError::Unprocessable(format!(
                    "{} is not in the inventory",
                    GpuRef::new(machine, indices[0])
                ))
            })?
            .total;
        for m in members {
            let assignment = Assignment {
                machine: machine.to_owned(),
                gpus: indices.clone(),
                shared: Some(total.share(m.share)),
                cpu_cores: 0,
                memory: placement::Bytes::ZERO,
            };
            out.push((m.member.clone(), machine.to_owned(), assignment));
        }
    }
    Ok(out)
}

/// Holds every committed group plan in a fresh scheduler (at start, or after a failed write).
pub(crate) async fn hold_groups(
    pool: &SqlitePool,
    scheduler: &mut Scheduler,
) -> Result<(), ApiError> {
    for group in load_groups(pool).await? {
        for (member, machine, assignment) in holdings(scheduler, &group.gpus, &group.members)? {
            if let Err(e) = scheduler.hold_for(&holder(&group.name, &member, &machine), assignment)
            {
                tracing::warn!(
                    "{member} of group {} cannot hold its share on {machine}: {e}",
                    group.name
                );
            }
        }
    }
    Ok(())
}

pub(crate) async fn load_groups(pool: &SqlitePool) -> Result<Vec<Group>, ApiError> {
    let groups: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT name, gpus, revision FROM groups ORDER BY name")
            .fetch_all(pool)
            .await?;
    let members: Vec<(String, String, i64)> = sqlx::query_as(
        "SELECT group_name, model, share FROM group_members ORDER BY group_name, position",
    )
    .fetch_all(pool)
    .await?;
    groups
        .into_iter()
        .map(|(name, gpus, revision)| {
            Ok(Group {
                gpus: serde_json::from_str(&gpus).map_err(ApiError::internal)?,
                revision,
                members: members
                    .iter()
                    .filter(|(g, _, _)| *g == name)
                    .map(|(_, m, share)| Share::new(m, BasisPoints(*share as u32)))
                    .collect(),
                name,
            })
        })
        .collect()
}

/// A share in percent from a request, read once into basis points.
pub(crate) fn percent(share: f64, whose: &str) -> Result<BasisPoints, ApiError> {
    BasisPoints::from_percent(share).map_err(|e| {
        ApiError::Unprocessable(format!(
            "the share of {whose} {e}; give a percentage such as 33.33"
        ))
    })
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
    /// The model catalog.
    pub async fn models(&self) -> Result<Vec<CatalogModel>, ApiError> {
        type Row = (
            String,
            String,
            i64,
            Option<String>,
            String,
            bool,
            Option<String>,
            String,
            String,
        );
        let rows: Vec<Row> =
            sqlx::query_as("SELECT name, engine, default_share, group_name, model_path, system, command, args, env FROM models ORDER BY name")
                .fetch_all(&self.pool)
                .await?;
        rows.into_iter()
            .map(
                |(name, engine, share, group, model_path, system, command, args, env)| {
                    Ok(CatalogModel {
                        engine: serde_json::from_value(serde_json::Value::String(engine))
                            .map_err(ApiError::internal)?,
                        name,
                        default_share: BasisPoints(share as u32),
                        group,
                        model_path,
                        system,
                        command,
                        args: serde_json::from_str(&args).map_err(ApiError::internal)?,
                        env: serde_json::from_str(&env).map_err(ApiError::internal)?,
                    })
                },
            )
            .collect()
    }

    /// Adds a model to the catalog.
    pub async fn add_model(
        &self,
        model: CatalogModel,
        actor: &str,
    ) -> Result<CatalogModel, ApiError> {
        crate::fleet::check_name(&model.name)?;
        if model.default_share == BasisPoints::ZERO || model.default_share > BasisPoints::WHOLE {
            return Err(ApiError::Unprocessable(
                "default_share_percent must be more than 0 and at most 100".to_owned(),
            ));
        }
        if model.engine == Engine::Command
            && model
                .command
                .as_deref()
                .and_then(shlex::split)
                .is_none_or(|words| words.is_empty())
        {
            return Err(ApiError::Unprocessable(format!(
                "{} runs on the command engine, so it needs a \"command\" template, such as \"my-server --port {{port}} --model {{model}}\" (without unclosed quotes)",
                model.name
            )));
        }
        check_recipe(&model)?;
        let mut tx = crate::db::write(&self.pool).await?;
        sqlx::query("INSERT INTO models (name, engine, default_share, group_name, model_path, system, command, args, env) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
            .bind(&model.name)
            .bind(engine_name(model.engine))
            .bind(i64::from(model.default_share.get()))
            .bind(&model.group)
            .bind(&model.model_path)
            .bind(model.system)
            .bind(&model.command)
            .bind(serde_json::to_string(&model.args).map_err(ApiError::internal)?)
            .bind(serde_json::to_string(&model.env).map_err(ApiError::internal)?)
            .execute(&mut *tx)
            .await
            .map_err(|e| ApiError::on_unique(e, || format!("the catalog has a model named {} already", model.name)))?;
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, "model.add", &model.name)
                .after(serde_json::to_value(&model).map_err(ApiError::internal)?),
        )
        .await?;
        tx.commit().await?;
        Ok(model)
    }

    /// Adds the models the catalog lacks (the demo's), leaving the ones it has as they are.
    pub async fn seed_catalog(&self, models: &[CatalogModel]) -> Result<(), ApiError> {
        for model in models {
            match self.add_model(model.clone(), crate::audit::TESSERA).await {
                Ok(_) | Err(ApiError::Conflict(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Every group and its committed plan.
    pub async fn groups(&self) -> Result<Vec<GroupView>, ApiError> {
        let system = self.system_models().await?;
        let engines = self.runtime.engines();
        Ok(load_groups(&self.pool)
            .await?
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
                }
                view.progress = self.runtime.progress(&g.name);
                view
            })
            .collect())
    }

    /// One group.
    pub async fn group(&self, name: &str) -> Result<GroupView, ApiError> {
        self.groups()
            .await?
            .into_iter()
            .find(|g| g.name == name)
            .ok_or_else(|| no_group(name))
    }

    /// A GPU as a group's plan is judged against it: what shared work outside `group` takes there.
    pub async fn group_gpu(&self, gpu: &GpuRef, group: Option<&str>) -> Result<GroupGpu, ApiError> {
        let scheduler = self.scheduler.lock().await;
        group_gpu(&scheduler, gpu, group)
    }

    /// Changes a group's shares. Refused (422, with the verdict) when the plan does not fit, and (409) when
    /// the group changed since `revision`; either way nothing changes.
    pub async fn change_plan(
        &self,
        name: &str,
        update: PlanUpdate,
        actor: &str,
    ) -> Result<PlanChange, ApiError> {
        let system = self.system_models().await?;
        let mut scheduler = self.scheduler.lock().await;
        let group = load_groups(&self.pool)
            .await?
            .into_iter()
            .find(|g| g.name == name)
            .ok_or_else(|| no_group(name))?;
        check_revision(&group, Some(update.revision))?;
        let plan = plan_with(&group, &system, &update.shares, false)?;
        let note = Note::new(actor, "plan.change", name);
        self.commit(&mut scheduler, &group, plan, None, None, note)
            .await
    }

    /// Deploys a catalog model onto a share of the chosen GPUs: it joins the group that runs there, or
    /// starts one (named by its recipe, or after the model), into which the router moves.
    pub async fn deploy(&self, deploy: Deploy, actor: &str) -> Result<PlanChange, ApiError> {
        let catalog = self.models().await?;
        let model = catalog
            .iter()
            .find(|m| m.name == deploy.model)
            .ok_or_else(|| {
                ApiError::Unprocessable(format!(
                    "the catalog has no model named {}; GET /api/models lists them",
                    deploy.model
                ))
            })?;
        if deploy.gpus.is_empty() {
            return Err(ApiError::Unprocessable(
                "choose at least one GPU, such as \"gpus\": [\"majin:0\"]".to_owned(),
            ));
        }
        check_serving(&deploy.args, &deploy.env)?;
        if let Some(worker) = self.whole_deployment(&model.name).await? {
            return Err(ApiError::Conflict(format!(
                "{} runs on whole GPUs of {} already",
                model.name,
                worker.machine.as_deref().unwrap_or("a machine")
            )));
        }
        if !deploy.shared {
            return self.deploy_whole(model, &deploy, actor).await;
        }
        let chosen = deploy
            .gpus
            .iter()
            .map(|id| crate::api::parse_gpu_ref(id))
            .collect::<Result<Vec<_>, _>>()?;
        let system: Vec<String> = catalog
            .iter()
            .filter(|m| m.system)
            .map(|m| m.name.clone())
            .collect();
        let mut scheduler = self.scheduler.lock().await;
        let groups = load_groups(&self.pool).await?;
        if let Some(g) = groups
            .iter()
            .find(|g| g.members.iter().any(|s| s.member == model.name))
        {
            return Err(ApiError::Conflict(format!(
                "{} runs in group {} already",
                model.name, g.name
            )));
        }
        let on_nodes: Vec<&str> = groups
            .iter()
            .filter(|g| g.gpus.iter().any(|gpu| chosen.contains(gpu)))
            .map(|g| g.name.as_str())
            .collect();
        let choice = choose_group(&model.name, model.group.as_deref(), &on_nodes)
            .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        let share = percent(
            deploy.share.unwrap_or(model.default_share.as_percent_f64()),
            &model.name,
        )?;
        let (group, mut plan, moving) = match &choice {
            GroupChoice::Join(name) => {
                let group = groups
                    .iter()
                    .find(|g| &g.name == name)
                    .cloned()
                    .ok_or_else(|| no_group(name))?;
                check_revision(&group, deploy.revision)?;
                let plan = plan_with(&group, &system, &deploy.shares, true)?;
                (group, plan, None)
            }
            GroupChoice::New { name, .. } => {
                if groups.iter().any(|g| &g.name == name) {
                    return Err(ApiError::Conflict(format!(
                        "a group named {name} runs on other GPUs; choose its GPUs to join it"
                    )));
                }
                let totals: Vec<_> = chosen
                    .iter()
                    .map(|g| scheduler.inventory().gpu(g).map(|gpu| gpu.total))
                    .collect();
                if totals.iter().any(Option::is_none) {
                    return Err(ApiError::Unprocessable(format!(
                        "a GPU of {} is not in the inventory",
                        deploy.gpus.join(", ")
                    )));
                }
                if totals.windows(2).any(|w| w[0] != w[1]) {
                    return Err(ApiError::Unprocessable(
                        "a group's shares are of one GPU's memory: choose GPUs of the same size"
                            .to_owned(),
                    ));
                }
                // The router moves out of the group it runs in, with its share, into the new one.
                let router = groups.iter().find_map(|g| {
                    g.members
                        .iter()
                        .find(|s| system.contains(&s.member))
                        .map(|s| (g.clone(), s.clone()))
                });
                let mut plan = Vec::new();
                if let Some((_, s)) = &router {
                    plan.push(PlanMember {
                        name: s.member.clone(),
                        share: Some(s.share),
                        locked: true,
                    });
                }
                let group = Group {
                    name: name.clone(),
                    gpus: chosen.clone(),
                    revision: 0,
                    members: Vec::new(),
                };
                (group, plan, router)
            }
        };
        plan.push(PlanMember {
            name: model.name.clone(),
            share: Some(share),
            locked: model.system,
        });
        let serving = Serving {
            args: deploy.args.clone(),
            env: deploy.env.clone(),
        };
        let mut change = self
            .commit(
                &mut scheduler,
                &group,
                plan,
                moving,
                Some((&model.name, serving)),
                Note::new(actor, "deploy", &model.name),
            )
            .await?;
        change.line = Some(choice.line());
        Ok(change)
    }

    pub(crate) async fn system_models(&self) -> Result<Vec<String>, ApiError> {
        Ok(self
            .models()
            .await?
            .into_iter()
            .filter(|m| m.system)
            .map(|m| m.name)
            .collect())
    }

    /// Judges `plan` for `group` and, when it fits, commits it: the database first (one transaction), then
    /// the scheduler's holds; then the runtime carries the change out. `moving` is the router leaving the
    /// group it runs in for this (new) one; `serving` the serving configuration of a model being deployed.
    pub(crate) async fn commit(
        &self,
        scheduler: &mut Scheduler,
        group: &Group,
        plan: Vec<PlanMember>,
        moving: Option<(Group, Share)>,
        serving: Option<(&str, Serving)>,
        note: Note<'_>,
    ) -> Result<PlanChange, ApiError> {
        let gpus = group
            .gpus
            .iter()
            .map(|g| group_gpu(scheduler, g, Some(&group.name)))
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
                verdict: Box::new(VerdictView::from(&verdict)),
            });
        }
        let after: Vec<Share> = plan
            .iter()
            .map(|m| Share::new(&m.name, m.share.unwrap_or_default()))
            .collect();
        let moving_in: Vec<&str> = moving.iter().map(|(_, s)| s.member.as_str()).collect();
        let change = transition(&group.members, &after, &moving_in);

        let mut tx = crate::db::write(&self.pool).await?;
        // Members keep their serving configuration through a change of shares (and the router through a move).
        let mut configs: BTreeMap<String, Serving> = BTreeMap::new();
        for s in &after {
            let row: Option<(String, String)> =
                sqlx::query_as("SELECT args, env FROM group_members WHERE model = ?")
                    .bind(&s.member)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some((args, env)) = row {
                configs.insert(
                    s.member.clone(),
                    Serving {
                        args: serde_json::from_str(&args).map_err(ApiError::internal)?,
                        env: serde_json::from_str(&env).map_err(ApiError::internal)?,
                    },
                );
            }
        }
        // A deploy's serving configuration is part of what it changed.
        let deployed = serving.as_ref().map(|(model, serving)| {
            serde_json::json!({ "model": model, "args": serving.args, "env": serving.env })
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
            sqlx::query("INSERT INTO group_members (group_name, model, share, position, args, env) VALUES (?, ?, ?, ?, ?, ?)")
                .bind(&group.name)
                .bind(&s.member)
                .bind(i64::from(s.share.get()))
                .bind(position as i64)
                .bind(serde_json::to_string(&serving.args).map_err(ApiError::internal)?)
                .bind(serde_json::to_string(&serving.env).map_err(ApiError::internal)?)
                .execute(&mut *tx)
                .await?;
        }
        let shares = |members: &[Share]| -> serde_json::Value {
            members
                .iter()
                .map(|s| {
                    (
                        s.member.clone(),
                        serde_json::json!(s.share.as_percent_f64()),
                    )
                })
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(note.actor, note.action, note.target)
                .before(
                    serde_json::json!({ "group": group.name, "shares": shares(&group.members) }),
                )
                .after(match deployed {
                    Some(serving) => serde_json::json!({ "group": group.name, "shares": shares(&after), "serving": serving }),
                    None => serde_json::json!({ "group": group.name, "shares": shares(&after) }),
                })
                .revision(revision)
                .restarts(change.restarts.iter().map(|r| r.member.clone()).collect()),
        )
        .await?;
        tx.commit().await?;

        // The database now says what holds where; make the scheduler say the same, then the engines.
        self.rebuild(scheduler).await?;
        self.publish(scheduler).await?;
        self.runtime.submit(crate::runtime::Change::Plan {
            group: group.name.clone(),
            revision,
            steps: change.steps.clone(),
            members: member_engines(&self.pool, scheduler, &self.hosts, Some(&group.name)).await?,
        });
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

fn group_gpu(
    scheduler: &Scheduler,
    gpu: &GpuRef,
    group: Option<&str>,
) -> Result<GroupGpu, ApiError> {
    let found = scheduler
        .inventory()
        .gpu(gpu)
        .ok_or_else(|| ApiError::Unprocessable(format!("{gpu} is not in the inventory")))?;
    let prefix = group.map(holder_prefix);
    let taken_by_others = match scheduler.hold(gpu) {
        Some(Hold::Whole(by)) => {
            return Err(ApiError::Conflict(format!(
                "{gpu} is held whole by {by}; choose a shared or free GPU"
            )))
        }
        Some(Hold::Shared(sharers)) => sharers
            .iter()
            .filter(|(w, _)| prefix.as_ref().is_none_or(|p| !w.starts_with(p.as_str())))
            .map(|(_, b)| *b)
            .sum(),
        _ => placement::Bytes::ZERO,
    };
    Ok(GroupGpu {
        gpu: gpu.clone(),
        total: found.total,
        held_outside: found.held_outside,
        taken_by_others,
    })
}

/// The group's members with the shares asked for, in percent. The router keeps its share (asking to change
/// it is refused), and a member not asked about keeps its share when `keep_unasked`, or has none (which the
/// verdict refuses) when the whole plan was sent.
fn plan_with(
    group: &Group,
    system: &[String],
    asked: &BTreeMap<String, f64>,
    keep_unasked: bool,
) -> Result<Vec<PlanMember>, ApiError> {
    if let Some(stranger) = asked
        .keys()
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
            let share = asked
                .get(&s.member)
                .map(|p| percent(*p, &s.member))
                .transpose()?;
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
            Ok(PlanMember {
                name: s.member.clone(),
                share,
                locked,
            })
        })
        .collect()
}

/// The engines of every group member (of `only` that group): one per member and machine of its group's
/// GPUs, in plan order.
pub(crate) async fn member_engines(
    pool: &SqlitePool,
    scheduler: &Scheduler,
    hosts: &crate::runtime::Hosts,
    only: Option<&str>,
) -> Result<Vec<EngineSpec>, ApiError> {
    type Row = (
        String,
        String,
        i64,
        String,
        String,
        String,
        String,
        Option<String>,
        String,
        String,
        String,
    );
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT gm.group_name, gm.model, gm.share, gm.args, gm.env, m.engine, m.model_path, m.command, m.args, m.env, g.gpus \
         FROM group_members gm JOIN models m ON m.name = gm.model JOIN groups g ON g.name = gm.group_name \
         WHERE ?1 IS NULL OR gm.group_name = ?1 ORDER BY gm.group_name, gm.position",
    )
    .bind(only)
    .fetch_all(pool)
    .await?;
    let json =
        |text: &str| serde_json::from_str::<serde_json::Value>(text).map_err(ApiError::internal);
    let mut out = Vec::new();
    for (
        group,
        model,
        share,
        args,
        env,
        engine,
        model_path,
        command,
        model_args,
        model_env,
        gpus,
    ) in rows
    {
        let gpus: Vec<GpuRef> = serde_json::from_str(&gpus).map_err(ApiError::internal)?;
        let mut recipe_args: Vec<String> =
            serde_json::from_value(json(&model_args)?).map_err(ApiError::internal)?;
        recipe_args.extend(
            serde_json::from_value::<Vec<String>>(json(&args)?).map_err(ApiError::internal)?,
        );
        let mut recipe_env: BTreeMap<String, String> =
            serde_json::from_value(json(&model_env)?).map_err(ApiError::internal)?;
        recipe_env.extend(
            serde_json::from_value::<BTreeMap<String, String>>(json(&env)?)
                .map_err(ApiError::internal)?,
        );
        let recipe = Recipe {
            engine: serde_json::from_value(serde_json::Value::String(engine))
                .map_err(ApiError::internal)?,
            model_path,
            command,
            args: recipe_args,
            env: recipe_env,
        };
        let share = Share::new(&model, BasisPoints(share as u32));
        for (member, machine, assignment) in
            holdings(scheduler, &gpus, std::slice::from_ref(&share))?
        {
            let offered = assignment
                .gpus
                .iter()
                .filter_map(|i| scheduler.inventory().gpu(&GpuRef::new(&machine, *i)))
                .map(placement::Gpu::offered)
                .min()
                .unwrap_or_default();
            let total = scheduler
                .inventory()
                .gpu(&GpuRef::new(&machine, assignment.gpus[0]))
                .map(|g| g.total)
                .unwrap_or_default();
            out.push(EngineSpec {
                unit: holder(&group, &member, &machine),
                host: hosts.host(&machine),
                gpus: assignment.gpus,
                gpu_total: total,
                share: assignment.shared,
                gpu_offered: offered,
                recipe: recipe.clone(),
                machine,
            });
        }
    }
    Ok(out)
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
fn check_recipe(model: &CatalogModel) -> Result<(), ApiError> {
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
            })
            .collect(),
        total_percent: group
            .members
            .iter()
            .map(|s| s.share)
            .sum::<BasisPoints>()
            .as_percent_f64(),
        progress: None,
    }
}

#[cfg(test)]
mod tests;
