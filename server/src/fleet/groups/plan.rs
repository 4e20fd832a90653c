//! Changing a group's plan: judged by `placement`, committed with its audit entry in one transaction, then
//! handed to the runtime as the steps `placement::transition` orders. A deploy into a group and a removal
//! from one commit through here too.

use super::{group_gpu, no_group, Group, Serving};
use crate::error::ApiError;
use crate::fleet::{Fleet, State};
use crate::input::PlanCommand;
use placement::{
    judge, running, transition, BasisPoints, Demand, KeepAlive, PlanMember, Restart, Share, Step,
    Verdict,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

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
    /// Members with replicas of which fewer than their most fit now: the rest wait for room (it did not
    /// block).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<String>,
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

impl Fleet {
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

    /// Judges `plan` for `group` and, when it fits, commits it in one transaction; then the ledger and the
    /// views follow it, and the runtime carries the change out in `placement`'s order. `moving` is the
    /// router leaving the group it runs in for this (new) one; `serving` the serving configuration of a
    /// model being deployed. Runs under the write lock, inside [`Fleet::write`].
    pub(in crate::fleet) async fn commit(
        &self,
        state: &mut State,
        group: &Group,
        plan: Vec<PlanMember>,
        moving: Option<(Group, Share)>,
        serving: Option<(&str, Serving)>,
        note: Note<'_>,
    ) -> Result<PlanChange, ApiError> {
        let verdict = judged(state, group, &plan)?;
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
        // A sleeper sleeps on where its share stays as it was (its engine is kept); one whose share
        // changes starts again, awake, and is judged so.
        let share_of =
            |members: &[Share], m: &str| members.iter().find(|s| s.member == m).map(|s| s.share);
        planned.asleep.retain(|m, _| {
            planned.loaded.contains(m) && share_of(&group.members, m) == share_of(&after, m)
        });
        let changing = serving.as_ref().map(|(model, _)| *model);
        let (unloaded, waited) = self.fitted(state, &mut planned, changing);
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
            crate::fleet::authority::redact_json(
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
            let autoscale = planned
                .autoscale
                .get(&s.member)
                .map(|a| serde_json::to_string(a).map_err(ApiError::internal))
                .transpose()?;
            let placed = match autoscale {
                Some(_) => Some(super::super::committed::placed_json(
                    &planned.placed.get(&s.member).cloned().unwrap_or_default(),
                )?),
                None => None,
            };
            let asleep = planned
                .asleep
                .get(&s.member)
                .map(|a| serde_json::to_string(a).map_err(ApiError::internal))
                .transpose()?;
            sqlx::query("INSERT INTO group_members (group_name, model, share, position, args, env, on_demand, keep_alive_s, loaded, autoscale, placed, asleep) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
                .bind(&group.name)
                .bind(&s.member)
                .bind(i64::from(s.share.get()))
                .bind(position as i64)
                .bind(serde_json::to_string(&serving.args).map_err(ApiError::internal)?)
                .bind(serde_json::to_string(&serving.env).map_err(ApiError::internal)?)
                .bind(keep_alive.is_some())
                .bind(i64::from(keep_alive.copied().unwrap_or_default().secs()))
                .bind(planned.loaded.contains(&s.member))
                .bind(autoscale)
                .bind(placed)
                .bind(asleep)
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
        let why = format!("waits for room: the plan of {} changed", group.name);
        Fleet::record_waits(&mut tx, &waited, &why).await?;
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
        self.finish(
            state,
            tx,
            None,
            Some((group.name.clone(), revision, change.steps.clone())),
        )
        .await?;
        self.noted_waits(waited, &why);
        Ok(PlanChange {
            group: Some(group.name.clone()),
            revision,
            line: None,
            restarts: change.restarts,
            steps: change.steps,
            warning: verdict
                .warns()
                .then(|| placement::plan::FREE_ROW_WARNING.to_owned()),
            waits: verdict
                .waits
                .iter()
                .map(placement::ReplicasWait::message)
                .collect(),
        })
    }
}

/// `plan` judged for `group` on its GPUs as the ledger holds them now: its verdict where it fits, else
/// refused (422) with the verdict and its first problem.
pub(in crate::fleet) fn judged(
    state: &State,
    group: &Group,
    plan: &[PlanMember],
) -> Result<Verdict, ApiError> {
    let gpus = group
        .gpus
        .iter()
        .map(|g| group_gpu(state.ledger.scheduler(), g, Some(&group.name)))
        .collect::<Result<Vec<_>, _>>()?;
    let verdict = judge(plan, &gpus);
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
    Ok(verdict)
}

/// The router asked for replicas.
pub(in crate::fleet) fn router_runs_everywhere(router: &str) -> ApiError {
    ApiError::Unprocessable(format!(
        "{router} routes every request of its group: it runs on each of its machines; leave replicas out"
    ))
}

/// The router asked to load on demand.
pub(in crate::fleet) fn router_stays_pinned(router: &str) -> ApiError {
    ApiError::Unprocessable(format!(
        "{router} routes every request of its group: it stays pinned"
    ))
}

/// The group's members with the shares and demand asked for. The router keeps its share and stays pinned
/// (asking to change either is refused); a member not asked about keeps its share when `keep_unasked`, or
/// has none (which the verdict refuses) when the whole plan was sent; a member not asked about its demand
/// keeps it.
pub(in crate::fleet) fn plan_with(
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
                Some(&demand) if group.autoscale.contains_key(&s.member) => {
                    placement::scale::Autoscale::check_demand(
                        group.autoscale.get(&s.member).copied(),
                        demand,
                    )
                    .map_err(|e| ApiError::Unprocessable(format!("{}: {e}", s.member)))?;
                    demand
                }
                Some(&demand) => demand,
                None => group.demand_of(&s.member),
            };
            Ok(PlanMember {
                name: s.member.clone(),
                share,
                locked,
                demand,
                replicas: group.autoscale.get(&s.member).copied(),
            })
        })
        .collect()
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
