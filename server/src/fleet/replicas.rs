//! Replicas that follow traffic: a group member deployed with `replicas` runs on some of its group's GPUs,
//! between `min` and `max` of them, an engine on each. Each replica holds the member's share on its GPU in
//! the ledger from the moment it is decided, placed by best fit (the GPU left with the least room);
//! one that finds no room waits with the reasons, and the model serves on what it has. The gateway samples
//! each model's load; `placement::scale` decides; a decision is a fleet write like any other (committed
//! with its audit entry, held, carried out by the runtime, which drains a replica before it stops it).

use super::committed::Committed;
use super::groups::Group;
use super::ledger::Ledger;
use super::Fleet;
use crate::error::ApiError;
use crate::runtime::sizing::flag_value;
use app::views::{Replicas as ReplicasView, ScaleEvent};
use placement::holder::{self, Holder};
use placement::scale::{Autoscale, Decision, Scaler};
use placement::{BasisPoints, Bytes, Gpu, GpuRef, Hold};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Mutex, PoisonError};

/// How long a model whose new replica found no room waits before it is tried again, ms.
const NO_ROOM_AGAIN_MS: u64 = 5_000;

/// How long after other models' replicas made way for a model's it asks no more of them (they drain and
/// stop meanwhile), ms.
const MADE_WAY_PAUSE_MS: u64 = 10_000;

/// How soon a model whose new replica waits for replicas making way for it tries again, ms.
const MADE_WAY_AGAIN_MS: u64 = 1_000;

/// How many scale decisions of a model are kept to show.
const DECISIONS_KEPT: usize = 10;

/// What the fleet keeps in memory of each autoscaled model: its load of late, and its decisions.
#[derive(Default)]
pub(super) struct Scaling {
    models: Mutex<BTreeMap<String, ModelScaling>>,
}

#[derive(Default)]
struct ModelScaling {
    scaler: Scaler,
    /// What the last decision asked for, where it was not all placed.
    desired: Option<u32>,
    pending_reasons: Vec<String>,
    decisions: VecDeque<ScaleEvent>,
    /// A replica found no room: no step is tried again before this (ms since the epoch), so that models
    /// waiting for room do not take the write lock every second.
    retry_at_ms: u64,
    /// When other models' replicas last made way for this one's (ms since the epoch).
    made_way_at_ms: u64,
}

impl Scaling {
    /// Forgets `model`: removed.
    pub(super) fn forget(&self, model: &str) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        models.remove(model);
    }

    fn with<T>(&self, model: &str, f: impl FnOnce(&mut ModelScaling) -> T) -> T {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        f(models.entry(model.to_owned()).or_default())
    }
}

/// The requests in flight one replica of `member` aims for: `set`, else its engine's own slots as its
/// arguments say (llama.cpp's `--parallel`, vLLM's `--max-num-seqs`, SGLang's `--max-running-requests`),
/// else one.
fn target_of(set: Option<u32>, args: &[String]) -> u32 {
    set.or_else(|| {
        flag_value(
            args,
            &[
                "-np",
                "--parallel",
                "--max-num-seqs",
                "--max-running-requests",
            ],
        )?
        .parse()
        .ok()
    })
    .filter(|&n| n > 0)
    .unwrap_or(1)
}

/// The GPUs of `group` not in `placed` where a replica of `model` with `share` fits beside what `ledger`
/// holds there for others (what `model` holds itself there, as a member without replicas taking them, is
/// room it leaves), best fit first (the least room left after); and why each other one does not.
fn best_fit(
    ledger: &Ledger,
    group: &Group,
    model: &str,
    share: BasisPoints,
    placed: &BTreeSet<GpuRef>,
) -> (Vec<GpuRef>, Vec<String>) {
    let mut fits: Vec<(Bytes, GpuRef)> = Vec::new();
    let mut reasons = Vec::new();
    for gpu in group.gpus.iter().filter(|g| !placed.contains(*g)) {
        let Some(found) = ledger.inventory().gpu(gpu) else {
            reasons.push(format!("{gpu} is gone"));
            continue;
        };
        let need = found.total.share(share);
        let hold = ledger.scheduler().hold(gpu);
        if let Some(Hold::Whole(worker)) = hold {
            reasons.push(format!("{gpu} is held whole by {worker}"));
            continue;
        }
        let free = free_beside(
            found,
            hold,
            |holder| matches!(Holder::parse(holder), Holder::Member { group: g, member, .. } if g == group.name && member == model),
        );
        if free < need {
            reasons.push(format!(
                "{gpu}: {} free, a replica needs {}",
                free.size_text(),
                need.size_text()
            ));
            continue;
        }
        fits.push((Bytes(free.get() - need.get()), gpu.clone()));
    }
    fits.sort();
    (fits.into_iter().map(|(_, g)| g).collect(), reasons)
}

/// What `gpu` offers shared work beyond what its sharers hold (`hold`, the ledger's hold there), but those
/// `leaving`.
fn free_beside(gpu: &Gpu, hold: Option<&Hold>, leaving: impl Fn(&str) -> bool) -> Bytes {
    let taken: Bytes = match hold {
        Some(Hold::Shared(sharers)) => sharers
            .iter()
            .filter(|(holder, _)| !leaving(holder))
            .map(|(_, bytes)| *bytes)
            .sum(),
        _ => Bytes::ZERO,
    };
    Bytes(gpu.offered().get().saturating_sub(taken.get()))
}

/// Where the first `min` replicas of `model` with `share` go in `group`, best fit first; fewer where fewer
/// GPUs have the room (the rest wait for it).
pub(super) fn first_placed(
    ledger: &Ledger,
    group: &Group,
    model: &str,
    share: BasisPoints,
    min: u32,
) -> BTreeSet<GpuRef> {
    let (fits, _) = best_fit(ledger, group, model, share, &BTreeSet::new());
    fits.into_iter().take(min as usize).collect()
}

/// The arguments `model`'s engines run with: its recipe's, then its deployment's.
fn args_of(committed: &Committed, model: &str) -> Vec<String> {
    let mut args = committed
        .model(model)
        .map(|m| m.args.clone())
        .unwrap_or_default();
    if let Some(serving) = committed.group_of(model).and_then(|g| g.serving.get(model)) {
        args.extend(serving.args.iter().cloned());
    }
    args
}

/// `model`'s share in `group`.
fn share_of(group: &Group, model: &str) -> Result<BasisPoints, ApiError> {
    group
        .members
        .iter()
        .find(|s| s.member == model)
        .map(|s| s.share)
        .ok_or_else(|| ApiError::internal(format!("{model} is not a member of {}", group.name)))
}

/// The `count` replicas of `model` in `placed` to remove: the least busy first; among those as busy, the
/// last by GPU.
fn least_busy(
    fleet: &Fleet,
    group: &Group,
    model: &str,
    placed: &BTreeSet<GpuRef>,
    count: usize,
) -> Vec<GpuRef> {
    let mut by_load: Vec<(usize, std::cmp::Reverse<&GpuRef>)> = placed
        .iter()
        .map(|g| {
            let unit = holder::replica(&group.name, model, g);
            (
                fleet.runtime.requests_in_flight(&unit),
                std::cmp::Reverse(g),
            )
        })
        .collect();
    by_load.sort();
    by_load
        .into_iter()
        .take(count)
        .map(|(_, std::cmp::Reverse(g))| g.clone())
        .collect()
}

/// A change of a model's replicas, as `PUT /api/deployments/{model}/replicas` answers it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ReplicasChange {
    /// The model.
    pub model: String,
    /// Its group.
    pub group: String,
    /// The group's revision after the change.
    pub revision: i64,
    /// Its replicas now; none where it runs without them.
    pub replicas: Option<ReplicasView>,
    /// Whether its engines restart: it took replicas or gave them up.
    pub restarts: bool,
    /// Loaded on-demand members of its group that no longer fitted beside it, unloaded.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unloaded: Vec<String>,
    /// The Free row's warning when its plan, judged again, is over 90 %; it did not block.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Members with replicas of which fewer than their most fit now: the rest wait for room.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<String>,
}

/// A model whose replicas a change of plan had wait: where they no longer fit beside it, they went.
#[derive(Debug)]
pub(super) struct Waited {
    /// The model.
    pub model: String,
    /// Its replicas before.
    pub from: u32,
    /// The GPUs its replicas are on now.
    pub placed: BTreeSet<GpuRef>,
}

/// An autoscaled model as the gateway samples it.
#[derive(Debug, Clone)]
pub struct Autoscaled {
    /// The model.
    pub model: String,
    /// Its replicas placed now.
    pub running: u32,
}

/// The audit entry of a step of `model`'s replicas, from `from` to those `placed`.
fn scale_entry(
    model: &str,
    from: u32,
    placed: &BTreeSet<GpuRef>,
    why: &str,
) -> crate::audit::Entry {
    let gpus: Vec<String> = placed.iter().map(GpuRef::id).collect();
    crate::audit::Entry::new(crate::audit::TESSERA, "model.scale", model)
        .after(serde_json::json!({ "from": from, "to": placed.len(), "why": why, "gpus": gpus }))
}

/// The GPUs `model`'s replicas hold their share on in `group`: placed there, a GPU of the group (a repack
/// may have moved the group), and held by the ledger (not kept aside, with why: its GPU left the
/// inventory, or the hold was refused).
fn holding(group: &Group, model: &str, unplaced: &BTreeMap<String, String>) -> BTreeSet<GpuRef> {
    group
        .placed
        .get(model)
        .into_iter()
        .flatten()
        .filter(|_| group.runs(model))
        .filter(|g| group.gpus.contains(g))
        .filter(|g| !unplaced.contains_key(&holder::replica(&group.name, model, g)))
        .cloned()
        .collect()
}

impl Fleet {
    /// Every autoscaled model, with its replicas that hold their share now.
    pub fn autoscaled(&self) -> Vec<Autoscaled> {
        let views = self.views();
        views
            .committed
            .groups
            .iter()
            .flat_map(|g| {
                g.autoscale.keys().map(|m| Autoscaled {
                    model: m.clone(),
                    running: holding(g, m, &views.unplaced).len() as u32,
                })
            })
            .collect()
    }

    /// Whether `model` is deployed with replicas: with a min of 0 it may run none, and a request for it
    /// waits for one all the same.
    pub fn is_autoscaled(&self, model: &str) -> bool {
        self.committed()
            .group_of(model)
            .is_some_and(|g| g.autoscale.contains_key(model))
    }

    /// How `model` is scaled now (none: it runs without replicas), and the GPUs of its group (the most
    /// replicas it may have).
    pub fn replicas_setting(&self, model: &str) -> Result<(Option<Autoscale>, u32), ApiError> {
        let committed = self.committed();
        let group = committed
            .group_of(model)
            .ok_or_else(|| super::not_deployed(model))?;
        Ok((group.autoscale.get(model).copied(), group.gpus.len() as u32))
    }

    /// `model`'s setting and target, where it is autoscaled.
    fn scale_of(&self, model: &str) -> Option<(Autoscale, u32)> {
        let committed = self.committed();
        let scale = *committed.group_of(model)?.autoscale.get(model)?;
        Some((
            scale,
            target_of(scale.target(), &args_of(&committed, model)),
        ))
    }

    /// The requests one engine of `model` takes at once, as the gateway keeps a prompt's prefixes on it:
    /// its replicas' target where it is autoscaled, else its engine's own slots as its arguments say, else
    /// one.
    pub fn slots(&self, model: &str) -> u32 {
        let committed = self.committed();
        let set = committed
            .group_of(model)
            .and_then(|g| g.autoscale.get(model))
            .and_then(|a| a.target());
        target_of(set, &args_of(&committed, model))
    }

    /// `model`'s load was `load` (requests in flight and waiting) at `now_ms`, with `running` replicas
    /// placed: what it asks for, if anything.
    pub fn observe_load(
        &self,
        model: &str,
        running: u32,
        load: u32,
        now_ms: u64,
    ) -> Option<Decision> {
        let (scale, target) = self.scale_of(model)?;
        self.scaling.with(model, |s| {
            s.scaler.observe(now_ms, load, scale.keep_s());
            let decision = s.scaler.decide(scale, running, target, now_ms);
            if decision.is_none() {
                s.desired = None;
                s.pending_reasons.clear();
            }
            if now_ms < s.retry_at_ms {
                return None;
            }
            decision
        })
    }

    /// `model`'s replicas as the API shows them; `None` for a model that is not autoscaled.
    pub fn replicas_view(&self, model: &str) -> Option<ReplicasView> {
        let (scale, target) = self.scale_of(model)?;
        let views = self.views();
        let group = views.committed.group_of(model)?;
        let gpus: Vec<GpuRef> = holding(group, model, &views.unplaced).into_iter().collect();
        let running = gpus.len() as u32;
        self.scaling.with(model, |s| {
            let desired = s.desired.unwrap_or(running);
            Some(ReplicasView {
                min: scale.min(),
                max: scale.max(),
                target,
                running,
                desired,
                pending: desired.saturating_sub(running),
                pending_reasons: s.pending_reasons.clone(),
                gpus,
                decisions: s.decisions.iter().rev().cloned().collect(),
            })
        })
    }

    /// Sets `model`'s replicas to `replicas`, read at its group's `revision`. Between one setting and
    /// another no engine restarts: replicas past the new most go, the least busy first (each drained);
    /// fewer than the new least are added by the next sample, as any step. A model that runs without
    /// replicas takes them (`Some`), and one with them gives them up (`None`): its plan judged again with
    /// it so, and its engines change, from one on each machine of its group to one on each GPU a replica
    /// is placed on (its first `min`, best fit, beside the others' holds), or back.
    pub async fn change_replicas(
        self: &std::sync::Arc<Self>,
        model: &str,
        revision: i64,
        replicas: Option<Autoscale>,
        actor: &str,
    ) -> Result<ReplicasChange, ApiError> {
        let (model, actor) = (model.to_owned(), actor.to_owned());
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            let committed = state.committed.clone();
            let group = committed
                .group_of(&model)
                .ok_or_else(|| super::not_deployed(&model))?;
            super::groups::check_revision(group, Some(revision))?;
            let before = group.autoscale.get(&model).copied();
            let replicas = replicas
                .map(|r| r.within(group.gpus.len() as u32))
                .transpose()
                .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
            let restarts = before.is_some() != replicas.is_some();
            let (mut placed, mut verdict) = (BTreeSet::new(), None);
            let (mut unloaded, mut waited) = (Vec::new(), Vec::new());
            match (before, replicas) {
                (None, None) => {
                    return Ok(ReplicasChange {
                        model,
                        group: group.name.clone(),
                        revision,
                        replicas: None,
                        restarts,
                        unloaded: Vec::new(),
                        warning: None,
                        waits: Vec::new(),
                    });
                }
                (Some(_), Some(replicas)) => {
                    placed = holding(group, &model, state.ledger.all_unplaced());
                    let from = placed.len() as u32;
                    if from > replicas.max() {
                        let gone = (from - replicas.max()) as usize;
                        for gpu in least_busy(&fleet, group, &model, &placed, gone) {
                            placed.remove(&gpu);
                        }
                    }
                }
                (_, replicas) => {
                    let system = committed.system_models();
                    if system.contains(&model) {
                        return Err(super::groups::router_runs_everywhere(&model));
                    }
                    Autoscale::check_demand(replicas, group.demand_of(&model))
                        .map_err(|e| ApiError::Unprocessable(format!("{model}: {e}")))?;
                    let mut plan = super::groups::plan_with(
                        group,
                        &system,
                        &BTreeMap::new(),
                        &BTreeMap::new(),
                        true,
                    )?;
                    for member in plan.iter_mut().filter(|m| m.name == model) {
                        member.replicas = replicas;
                    }
                    verdict = Some(super::groups::judged(&state, group, &plan)?);
                    let mut planned = group.clone();
                    match replicas {
                        Some(replicas) => {
                            let share = share_of(group, &model)?;
                            placed =
                                first_placed(&state.ledger, group, &model, share, replicas.min());
                            planned.autoscale.insert(model.clone(), replicas);
                            planned.placed.insert(model.clone(), placed.clone());
                        }
                        None => {
                            planned.autoscale.remove(&model);
                            planned.placed.remove(&model);
                        }
                    }
                    (unloaded, waited) = fleet.fitted(&state, &mut planned, Some(&model));
                }
            }
            let autoscale = replicas
                .map(|r| serde_json::to_string(&r).map_err(ApiError::internal))
                .transpose()?;
            let placed_json = replicas
                .map(|_| super::committed::placed_json(&placed))
                .transpose()?;
            let mut tx = crate::db::write(&fleet.pool).await?;
            sqlx::query("UPDATE group_members SET autoscale = ?, placed = ? WHERE model = ?")
                .bind(autoscale)
                .bind(placed_json)
                .bind(&model)
                .execute(&mut *tx)
                .await?;
            for member in &unloaded {
                sqlx::query("UPDATE group_members SET loaded = 0, asleep = NULL WHERE model = ?")
                    .bind(member)
                    .execute(&mut *tx)
                    .await?;
            }
            for w in &waited {
                sqlx::query("UPDATE group_members SET placed = ? WHERE model = ?")
                    .bind(super::committed::placed_json(&w.placed)?)
                    .bind(&w.model)
                    .execute(&mut *tx)
                    .await?;
            }
            let why = format!("waits for room: {model} changed its replicas");
            Fleet::record_waits(&mut tx, &waited, &why).await?;
            sqlx::query("UPDATE groups SET revision = revision + 1 WHERE name = ?")
                .bind(&group.name)
                .execute(&mut *tx)
                .await?;
            let revision = group.revision + 1;
            let mut entry = crate::audit::Entry::new(&actor, "model.replicas", &model)
                .before(serde_json::to_value(before).map_err(ApiError::internal)?)
                .after(serde_json::to_value(replicas).map_err(ApiError::internal)?)
                .revision(revision);
            if restarts {
                let restarted = std::iter::once(&model).chain(&unloaded).cloned();
                entry = entry.restarts(restarted.collect());
            }
            crate::audit::record(&mut tx, entry).await?;
            let group_name = group.name.clone();
            fleet.finish(&mut state, tx, None, None).await?;
            drop(state);
            fleet.noted_waits(waited, &why);
            if replicas.is_some() {
                // The windows and the target may differ: the load of late is judged afresh.
                fleet.scaling.with(&model, |s| {
                    s.scaler.reset();
                    s.retry_at_ms = 0;
                });
            } else {
                fleet.scaling.forget(&model);
            }
            let view = fleet.replicas_view(&model);
            if replicas.is_some() && view.is_none() {
                return Err(ApiError::internal(format!(
                    "{model} is not autoscaled after its change"
                )));
            }
            Ok(ReplicasChange {
                model,
                group: group_name,
                revision,
                replicas: view,
                restarts,
                unloaded,
                warning: verdict
                    .as_ref()
                    .filter(|v| v.warns())
                    .map(|_| placement::plan::FREE_ROW_WARNING.to_owned()),
                waits: verdict
                    .iter()
                    .flat_map(|v| &v.waits)
                    .map(placement::ReplicasWait::message)
                    .collect(),
            })
        })
        .await
    }

    /// Carries out `decision` for `model`: adds replicas where they fit, best fit first (where none has the
    /// room, idle replicas of the group's other models above their least make way, longest idle first;
    /// those that still do not fit wait, with why), or removes the least busy ones (the runtime drains
    /// each before it stops it). Committed with its audit entry (`model.scale`, by Tessera), as is the
    /// removal of a replica that holds nothing; a decision that changes nothing (no room for any new
    /// replica, or taken on a count that changed since) writes nothing. Says how many replicas it has now.
    pub async fn scale(
        self: &std::sync::Arc<Self>,
        model: &str,
        decision: Decision,
    ) -> Result<u32, ApiError> {
        let model = model.to_owned();
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            let committed = state.committed.clone();
            let group = committed
                .group_of(&model)
                .filter(|g| g.autoscale.contains_key(&model))
                .ok_or_else(|| ApiError::NotFound(format!("{model} is not autoscaled")))?
                .clone();
            // A replica placed where it holds nothing (its GPU left the group or the inventory) is
            // none: it goes, and the count starts from those that hold their share.
            let mut placed = holding(&group, &model, state.ledger.all_unplaced());
            let dropped = group.placed.get(&model).is_some_and(|p| *p != placed);
            let from = placed.len() as u32;
            // Decided on a count that changed since (a GPU left): the next sample decides again.
            if decision.from != from && !dropped {
                return Ok(from);
            }
            let (mut reasons, mut unloads) = (Vec::new(), Vec::new());
            if decision.to > from {
                let share = share_of(&group, &model)?;
                let wanted = (decision.to - from) as usize;
                let (mut fits, mut why) = best_fit(&state.ledger, &group, &model, share, &placed);
                // Idle replicas of other models make way, each its own step committed first, so that
                // the runtime stops it before this model's replica starts on its GPU: as many as are
                // missing, and not again while those drain (their engines hold the memory until they
                // have stopped, and a GPU's reading counts it until then).
                let now = super::usage::now_ms();
                let may_ask = fleet
                    .scaling
                    .with(&model, |s| now >= s.made_way_at_ms + MADE_WAY_PAUSE_MS);
                let mut yielded = 0;
                while may_ask && fits.len() + yielded < wanted {
                    let latest = state.committed.clone();
                    let Some(now_group) = latest.group_of(&model) else {
                        break;
                    };
                    let Some((other, gpu)) =
                        fleet.yielder(&state, now_group, &model, share, &placed)
                    else {
                        break;
                    };
                    let mut kept = holding(now_group, &other, state.ledger.all_unplaced());
                    let before = kept.len() as u32;
                    if !kept.remove(&gpu) {
                        break;
                    }
                    let made_way = format!("made way for {model}: idle");
                    fleet
                        .commit_step(&mut state, &other, before, &kept, made_way, &[])
                        .await?;
                    yielded += 1;
                    (fits, why) = best_fit(&state.ledger, &group, &model, share, &placed);
                }
                if yielded > 0 {
                    fleet.scaling.with(&model, |s| s.made_way_at_ms = now);
                }
                let missing = wanted.saturating_sub(fits.len() + yielded);
                let (made_room, unloading) =
                    fleet.on_demand_make_way(&state, &model, &placed, &fits, missing);
                unloads = unloading;
                placed.extend(fits.into_iter().take(wanted));
                placed.extend(made_room);
                reasons = why;
            } else {
                for gpu in least_busy(
                    &fleet,
                    &group,
                    &model,
                    &placed,
                    (from - decision.to) as usize,
                ) {
                    placed.remove(&gpu);
                }
            }
            let to = placed.len() as u32;
            let now = super::usage::now_ms();
            fleet.scaling.with(&model, |s| {
                s.desired = (decision.to != to).then_some(decision.to);
                s.pending_reasons = if decision.to > to {
                    reasons
                } else {
                    Vec::new()
                };
            });
            if to == from && !dropped {
                // Asked for more and none fitted: not tried again at every sample, but at the next
                // where others are making way for it.
                fleet.scaling.with(&model, |s| {
                    let again = if now < s.made_way_at_ms + MADE_WAY_PAUSE_MS {
                        MADE_WAY_AGAIN_MS
                    } else {
                        NO_ROOM_AGAIN_MS
                    };
                    s.retry_at_ms = now + again;
                });
                return Ok(to);
            }
            fleet
                .commit_step(&mut state, &model, from, &placed, decision.why, &unloads)
                .await?;
            Ok(to)
        })
        .await
    }

    /// `planned` (a group as a change of plan leaves it, `changing` the member it deploys or changes) made
    /// to fit on its GPUs. The verdict holds one on-demand turn and has replicas wait where they no longer
    /// fit; but more turns may be loaded where there was room, and those replicas run. So: the loaded
    /// on-demand members that no longer fit beside it unload, the least recently used idle first; where
    /// that is not enough, the replicas of the other members on a GPU it would overfill wait (taken from
    /// `planned`, those above their model's least first, then the least busy), on each GPU where their
    /// going makes it fit; then idle on-demand members again, and every loaded one where still needed (as
    /// a change of plan always did). Says which members unloaded, and whose replicas wait.
    pub(super) fn fitted(
        &self,
        state: &super::State,
        planned: &mut Group,
        changing: Option<&str>,
    ) -> (Vec<String>, Vec<Waited>) {
        let trial_of = |planned: &Group| {
            let mut trial = (*state.committed).clone();
            trial.groups.put(std::sync::Arc::new(planned.clone()));
            trial
        };
        let unload = |planned: &mut Group, members: &[String]| {
            for m in members {
                planned.loaded.remove(m);
                planned.asleep.remove(m);
            }
        };
        if let Some(unloaded) = self.make_room(state, &trial_of(planned), &planned.gpus, None) {
            unload(planned, &unloaded);
            return (unloaded, Vec::new());
        }
        let before = planned.placed.clone();
        for gpu in planned.gpus.clone() {
            let on_gpu = std::slice::from_ref(&gpu);
            let fits = |planned: &Group| {
                super::demand::fits(&state.ledger, &state.committed, &trial_of(planned), on_gpu)
            };
            let mut candidates: Vec<(bool, usize, String)> = planned
                .autoscale
                .iter()
                .filter(|(m, _)| Some(m.as_str()) != changing)
                .filter(|(m, _)| planned.placed.get(*m).is_some_and(|p| p.contains(&gpu)))
                .map(|(m, scale)| {
                    let running = planned.placed.get(m).map_or(0, BTreeSet::len) as u32;
                    let unit = holder::replica(&planned.name, m, &gpu);
                    let busy = self.runtime.requests_in_flight(&unit);
                    (running <= scale.min(), busy, m.clone())
                })
                .collect();
            candidates.sort();
            // Only where their going makes the GPU fit: else they run on, and the members on demand go.
            let mut without = planned.clone();
            for (_, _, m) in &candidates {
                if let Some(placed) = without.placed.get_mut(m) {
                    placed.remove(&gpu);
                }
            }
            if fits(planned) || !fits(&without) {
                continue;
            }
            for (_, _, m) in candidates {
                if let Some(placed) = planned.placed.get_mut(&m) {
                    placed.remove(&gpu);
                }
                if fits(planned) {
                    break;
                }
            }
        }
        let unloaded = self
            .make_room(state, &trial_of(planned), &planned.gpus, None)
            .unwrap_or_else(|| planned.loaded.iter().cloned().collect());
        unload(planned, &unloaded);
        let waited = before
            .into_iter()
            .filter_map(|(model, was)| {
                let now = planned.placed.get(&model)?;
                (*now != was).then(|| Waited {
                    model,
                    from: was.len() as u32,
                    placed: now.clone(),
                })
            })
            .collect();
        (unloaded, waited)
    }

    /// Writes `waited`'s steps, each as the audit entry of a scale step (`model.scale`, by Tessera), in the
    /// change of plan's transaction.
    pub(super) async fn record_waits(
        tx: &mut sqlx::SqliteConnection,
        waited: &[Waited],
        why: &str,
    ) -> Result<(), ApiError> {
        for w in waited {
            crate::audit::record(&mut *tx, scale_entry(&w.model, w.from, &w.placed, why)).await?;
        }
        Ok(())
    }

    /// Once its change of plan is committed, `waited`'s steps as events and decisions.
    pub(super) fn noted_waits(&self, waited: Vec<Waited>, why: &str) {
        for w in waited {
            self.noted_step(&w.model, w.from, w.placed.len() as u32, why.to_owned());
        }
    }

    /// The GPUs of `model`'s group, not in `placed` nor `fits`, where idle on-demand members loaded
    /// beside the plan's turn going lets a replica of it run: up to `missing` of them, with those members
    /// (least recently used first, as a load makes way). Under the write lock.
    fn on_demand_make_way(
        &self,
        state: &super::State,
        model: &str,
        placed: &BTreeSet<GpuRef>,
        fits: &[GpuRef],
        missing: usize,
    ) -> (Vec<GpuRef>, Vec<String>) {
        let (mut made_room, mut unloads) = (Vec::new(), Vec::new());
        let latest = state.committed.clone();
        let Some(mut planned) = latest.group_of(model).cloned() else {
            return (made_room, unloads);
        };
        let candidates: Vec<GpuRef> = planned
            .gpus
            .iter()
            .filter(|g| !placed.contains(*g) && !fits.contains(*g))
            .cloned()
            .collect();
        for gpu in candidates {
            if made_room.len() >= missing {
                break;
            }
            let mut trial_group = planned.clone();
            trial_group
                .placed
                .entry(model.to_owned())
                .or_default()
                .insert(gpu.clone());
            let mut trial = (*latest).clone();
            trial.groups.put(std::sync::Arc::new(trial_group.clone()));
            let Some(unload) = self
                .make_room(state, &trial, std::slice::from_ref(&gpu), None)
                .filter(|u| !u.is_empty())
            else {
                continue;
            };
            for m in &unload {
                trial_group.loaded.remove(m);
                trial_group.asleep.remove(m);
            }
            planned = trial_group;
            made_room.push(gpu);
            unloads.extend(unload);
        }
        (made_room, unloads)
    }

    /// Commits `model`'s replicas as `placed` (from `from`), with its audit entry (`model.scale`, by
    /// Tessera), its event and its decision kept, and the on-demand members `unloading` to make way for
    /// it unloaded; the ledger and the runtime follow. Under the write lock.
    async fn commit_step(
        &self,
        state: &mut super::State,
        model: &str,
        from: u32,
        placed: &BTreeSet<GpuRef>,
        why: String,
        unloading: &[String],
    ) -> Result<(), ApiError> {
        let to = placed.len() as u32;
        let mut tx = crate::db::write(&self.pool).await?;
        sqlx::query("UPDATE group_members SET placed = ? WHERE model = ?")
            .bind(super::committed::placed_json(placed)?)
            .bind(model)
            .execute(&mut *tx)
            .await?;
        for other in unloading {
            sqlx::query("UPDATE group_members SET loaded = 0, asleep = NULL WHERE model = ?")
                .bind(other)
                .execute(&mut *tx)
                .await?;
            let reason = format!("idle, it makes room for a replica of {model}");
            crate::audit::record(
                &mut tx,
                crate::audit::Entry::new(crate::audit::TESSERA, "model.unload", other)
                    .after(serde_json::json!({ "reason": reason })),
            )
            .await?;
        }
        // The plan (its shares) is as it was: its revision stays, so that a change of plan read before
        // the step still saves.
        crate::audit::record(&mut tx, scale_entry(model, from, placed, &why)).await?;
        self.finish(state, tx, None, None).await?;
        self.noted_step(model, from, to, why);
        Ok(())
    }

    /// A step of `model`'s replicas, committed: logged, an event, and kept among its decisions.
    fn noted_step(&self, model: &str, from: u32, to: u32, why: String) {
        tracing::info!("{model}: {from} → {to} replicas ({why})");
        let at = super::usage::rfc3339(super::usage::now_ms()).unwrap_or_default();
        self.runtime.publish(crate::runtime::Event::Scale {
            at: at.clone(),
            model: model.to_owned(),
            from,
            to,
            why: why.clone(),
        });
        self.scaling.with(model, |s| {
            s.scaler.carried_out(from, to);
            s.decisions.push_back(ScaleEvent { at, from, to, why });
            while s.decisions.len() > DECISIONS_KEPT {
                s.decisions.pop_front();
            }
        });
    }

    /// A replica of another autoscaled model of `group` that would make room for one of `model` (`share`,
    /// on a GPU of the group not in `placed`) by going: its model above its least, idle (no request in
    /// flight or waiting at its last sample, none in flight to that replica now), the one idle longest
    /// first.
    fn yielder(
        &self,
        state: &super::State,
        group: &Group,
        model: &str,
        share: BasisPoints,
        placed: &BTreeSet<GpuRef>,
    ) -> Option<(String, GpuRef)> {
        let now = super::usage::now_ms();
        let mut found: Option<(u64, String, GpuRef)> = None;
        for (other, scale) in group.autoscale.iter().filter(|(m, _)| *m != model) {
            let theirs = holding(group, other, state.ledger.all_unplaced());
            if theirs.len() as u32 <= scale.min() {
                continue;
            }
            let Some(idle_ms) = self.scaling.with(other, |s| s.scaler.idle_for(now)) else {
                continue;
            };
            let Ok(their_share) = share_of(group, other) else {
                continue;
            };
            for gpu in theirs.iter().filter(|g| !placed.contains(*g)) {
                let unit = holder::replica(&group.name, other, gpu);
                if self.runtime.requests_in_flight(&unit) > 0 {
                    continue;
                }
                let Some(found_gpu) = state.ledger.inventory().gpu(gpu) else {
                    continue;
                };
                let free_after =
                    free_beside(found_gpu, state.ledger.scheduler().hold(gpu), |_| false).get()
                        + found_gpu.total.share(their_share).get();
                if free_after < found_gpu.total.share(share).get() {
                    continue;
                }
                if found
                    .as_ref()
                    .is_none_or(|(longest, _, _)| idle_ms > *longest)
                {
                    found = Some((idle_ms, other.clone(), gpu.clone()));
                }
            }
        }
        found.map(|(_, other, gpu)| (other, gpu))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::TestApp;
    use axum::http::StatusCode;
    use serde_json::{json, Value};

    /// east and west: one 80 GB GPU each.
    const EAST_AND_WEST: &str = r#"
[[machine]]
name = "east"
cpu_cores = 32
memory_gb = 256
[[machine.gpu]]
index = 0
model = "NVIDIA H100 80GB HBM3"
memory_gb = 80
[[machine]]
name = "west"
cpu_cores = 32
memory_gb = 256
[[machine.gpu]]
index = 0
model = "NVIDIA H100 80GB HBM3"
memory_gb = 80
"#;

    /// What `who` holds on `machine`'s GPU 0, in GB, as its machine view shows it.
    async fn held(app: &TestApp, machine: &str, who: &str) -> Option<f64> {
        let (_, view) = app.get(&format!("/api/machines/{machine}")).await;
        view["gpus"][0]["sharers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["worker"] == who)
            .map(|s| s["gb"].as_f64().unwrap())
    }

    async fn east_and_west() -> TestApp {
        let app = TestApp::new(EAST_AND_WEST).await;
        app.fleet
            .seed_catalog(&crate::inventory::demo::demo_catalog())
            .await
            .unwrap();
        app
    }

    /// vision deployed at 20 % on east and west with replicas 1 to 2: the app, the deploy's answer, the
    /// machine its replica went to and the other one.
    async fn vision_on_one_of_two() -> (TestApp, Value, String, &'static str) {
        let app = east_and_west().await;
        let (status, change) = app
            .deploy(
                json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 20,
                           "replicas": {"min": 1, "max": 2}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{change}");
        let placed = app.fleet.replicas_view("vision").unwrap().gpus[0]
            .machine
            .clone();
        let other = if placed == "east" { "west" } else { "east" };
        (app, change, placed, other)
    }

    /// `machine` (of east and west) read again with `gb` GB of its GPU taken by another program.
    async fn taken_outside(app: &TestApp, machine: &str, gb: u64) {
        let mut found = crate::inventory::file::parse_inventory(EAST_AND_WEST)
            .unwrap()
            .into_iter()
            .find(|m| m.name == machine)
            .unwrap();
        found.gpus[0].held_outside = Bytes::gb(gb);
        app.fleet.refresh_machine(found).await.unwrap();
    }

    /// The first scale step the event stream carries.
    async fn scale_event(
        events: impl futures::Stream<Item = crate::runtime::Event>,
    ) -> crate::runtime::Event {
        use futures::StreamExt;
        let mut scales =
            std::pin::pin!(events
                .filter(|e| std::future::ready(matches!(e, crate::runtime::Event::Scale { .. }))));
        tokio::time::timeout(std::time::Duration::from_secs(5), scales.next())
            .await
            .expect("a scale event within 5 s")
            .expect("the stream is open")
    }

    fn decision(from: u32, to: u32) -> Decision {
        Decision {
            from,
            to,
            why: "a test asked".to_owned(),
        }
    }

    #[tokio::test]
    async fn get_api_models_name_shows_the_recipe_and_how_the_model_runs_with_its_replicas_and_last_steps_and_an_unknown_name_is_not_found(
    ) {
        let (app, _, _, _) = vision_on_one_of_two().await;
        app.fleet.scale("vision", decision(1, 2)).await.unwrap();
        let (status, answer) = app.get("/api/models/vision").await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["recipe"]["name"], "vision", "{answer}");
        let replicas = &answer["deployed"]["replicas"];
        assert_eq!(
            (
                replicas["running"].as_u64(),
                replicas["max"].as_u64(),
                replicas["decisions"][0]["to"].as_u64(),
                replicas["decisions"][0]["why"].as_str(),
            ),
            (Some(2), Some(2), Some(2), Some("a test asked")),
            "{answer}"
        );

        let (status, answer) = app.get("/api/models/nothing-of-the-kind").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
        assert_eq!(
            answer["error"],
            "no model named nothing-of-the-kind is in the catalog or deployed"
        );
    }

    #[tokio::test]
    async fn a_replica_holds_its_share_only_on_the_machine_it_is_placed_on_from_the_moment_it_is_decided_and_the_kept_state_agrees_with_a_rebuild(
    ) {
        let (app, change, on, off) = vision_on_one_of_two().await;
        let view = app.fleet.replicas_view("vision").unwrap();
        assert_eq!((view.running, view.gpus.len()), (1, 1), "{view:?}");
        let on = on.as_str();
        assert_eq!(held(&app, on, "vision").await, Some(16.0));
        assert_eq!(held(&app, off, "vision").await, None);
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());

        let group = change["group"].as_str().unwrap();
        let revision = app.fleet.group(group).unwrap().revision;
        let events = app.fleet.runtime().events();
        assert_eq!(app.fleet.scale("vision", decision(1, 2)).await.unwrap(), 2);
        assert_eq!(
            app.fleet.group(group).unwrap().revision,
            revision,
            "a scale step is no change of plan"
        );
        assert_eq!(held(&app, off, "vision").await, Some(16.0));
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
        let (_, audit) = app.get("/api/audit?action=model.scale").await;
        assert_eq!(audit[0]["actor"], "tessera", "{audit}");
        assert_eq!(audit[0]["after"]["why"], "a test asked", "{audit}");
        let crate::runtime::Event::Scale {
            at,
            model,
            from,
            to,
            why,
        } = scale_event(events).await
        else {
            unreachable!("only scale events are taken")
        };
        assert_eq!(
            (model.as_str(), from, to, why.as_str()),
            ("vision", 1, 2, "a test asked"),
            "the step is an event on /api/events too, at {at}"
        );
        assert!(at.starts_with("20"), "{at}");

        assert_eq!(app.fleet.scale("vision", decision(2, 1)).await.unwrap(), 1);
        let left: Vec<Option<f64>> = vec![
            held(&app, "east", "vision").await,
            held(&app, "west", "vision").await,
        ];
        assert_eq!(left.iter().flatten().count(), 1, "{left:?}");
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());

        // A restart of Tessera finds the replica where it was.
        let placed = app.fleet.replicas_view("vision").unwrap().gpus;
        let app = app.restart().await;
        assert_eq!(app.fleet.replicas_view("vision").unwrap().gpus, placed);
    }

    #[tokio::test]
    async fn a_replica_whose_machine_leaves_the_inventory_is_none_and_the_model_is_placed_again_where_there_is_room(
    ) {
        let (app, _, gone, stays) = vision_on_one_of_two().await;
        let only = EAST_AND_WEST
            .split("[[machine]]")
            .find(|m| m.contains(&format!("name = \"{stays}\"")))
            .unwrap();
        let app = app.restart_with(&format!("[[machine]]{only}")).await;

        let autoscaled = app.fleet.autoscaled();
        assert_eq!(autoscaled[0].running, 0, "{gone} holds nothing now");
        let decision = app.fleet.observe_load("vision", 0, 0, 1_000).unwrap();
        assert_eq!((decision.from, decision.to), (0, 1));
        assert_eq!(decision.why, "fewer than its least, 1 replica");
        assert_eq!(app.fleet.scale("vision", decision).await.unwrap(), 1);
        assert_eq!(
            app.fleet.replicas_view("vision").unwrap().gpus,
            [GpuRef::new(stays, 0)]
        );
        assert_eq!(held(&app, stays, "vision").await, Some(16.0));
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_replica_that_finds_no_room_waits_with_why_and_is_tried_again_after_a_pause_not_at_every_sample(
    ) {
        let (app, _, _, other) = vision_on_one_of_two().await;
        let filler = json!({"name": "filler", "requested_resources": {"gpu_requests": {
            "count": 1, "ids": [format!("{other}:0")], "shared": true, "memory_gb": 70}}});
        let (status, worker) = app.post_worker(&filler.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{worker}");

        // Four requests on one replica of target 1 for the whole short window (6 s).
        let now = crate::fleet::usage::now_ms();
        let mut decision = None;
        for s in (0..=6).rev() {
            decision = app.fleet.observe_load("vision", 1, 4, now - s * 1000);
        }
        let decision = decision.expect("a step up");
        assert_eq!((decision.from, decision.to), (1, 2));
        assert_eq!(app.fleet.scale("vision", decision).await.unwrap(), 1);
        let view = app.fleet.replicas_view("vision").unwrap();
        assert_eq!((view.running, view.desired, view.pending), (1, 2, 1));
        assert_eq!(
            view.pending_reasons,
            [format!(
                "GPU 0 of {other}: 10 GB free, a replica needs 16 GB"
            )]
        );
        assert_eq!(held(&app, other, "vision").await, None);
        // The next second asks for the same, and is not tried: the pause after no room.
        assert_eq!(app.fleet.observe_load("vision", 1, 4, now + 1000), None);
        assert_eq!(app.fleet.replicas_view("vision").unwrap().pending, 1);
        // Well past the pause, whatever this machine's speed: tried again.
        let later = app
            .fleet
            .observe_load("vision", 1, 4, now + 3 * NO_ROOM_AGAIN_MS);
        assert_eq!(later.map(|d| d.to), Some(2));
    }

    #[tokio::test]
    async fn a_plan_whose_gpus_hold_fewer_replicas_than_the_most_is_deployed_with_a_warning_saying_why_the_rest_wait_where_the_same_share_on_every_gpu_is_refused(
    ) {
        let app = east_and_west().await;
        let filler = json!({"name": "filler", "requested_resources": {"gpu_requests": {
            "count": 1, "ids": ["west:0"], "shared": true, "memory_gb": 70}}});
        let (status, worker) = app.post_worker(&filler.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{worker}");
        let wait = "vision: 1 of its 2 replicas fits now; the other one waits for room: GPU 0 of west: 70 of 80 GB taken by shared work; it needs 16";

        // The wizard's check, through the API: warned, not refused.
        let (status, verdict) = app
            .call(
                axum::http::Method::POST,
                "/api/plans/validate",
                Some(
                    &json!({"members": [{"name": "vision", "share": 20, "replicas": {"min": 1, "max": 2}}],
                            "gpus": ["east:0", "west:0"]})
                    .to_string(),
                ),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{verdict}");
        assert_eq!(verdict["verdict"], "fits", "{verdict}");
        assert_eq!(verdict["waits"], json!([wait]));

        // One engine on each machine (no replicas) needs west's room too: refused, in the seed's words.
        let (status, refused) = app
            .deploy(json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 20}))
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        assert_eq!(
            refused["error"],
            "GPU 0 of west: 70 of 80 GB taken by shared work; it needs 16"
        );

        let (status, change) = app
            .deploy(
                json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 20,
                           "replicas": {"min": 1, "max": 2}}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{change}");
        assert_eq!(change["waits"], json!([wait]));
        let view = app.fleet.replicas_view("vision").unwrap();
        assert_eq!(view.gpus, [GpuRef::new("east", 0)]);
        assert_eq!(held(&app, "east", "vision").await, Some(16.0));
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());

        // A plan change is judged the same way: the group's plan carries the member's replicas.
        let (status, changed) = app
            .put_plan(
                change["group"].as_str().unwrap(),
                json!({"revision": change["revision"], "shares": {"vision": 25}}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{changed}");
        assert_eq!(
            changed["waits"],
            json!([wait.replace("it needs 16", "it needs 20")])
        );

        // With no GPU that holds one, the model could not serve: refused with each GPU's reason.
        let small = json!({"name": "small", "requested_resources": {"gpu_requests": {
            "count": 1, "ids": ["east:0"], "shared": true, "memory_gb": 10}}});
        let (status, worker) = app.post_worker(&small.to_string()).await;
        assert_eq!(status, StatusCode::CREATED, "{worker}");
        let (status, none) = app
            .put_plan(
                change["group"].as_str().unwrap(),
                json!({"revision": changed["revision"], "shares": {"vision": 95}}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{none}");
        assert_eq!(
            none["verdict"]["problems"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p["message"].as_str().unwrap())
                .collect::<Vec<_>>(),
            [
                "GPU 0 of east: 10 of 80 GB taken by shared work; it needs 76",
                "GPU 0 of west: 70 of 80 GB taken by shared work; it needs 76"
            ]
        );
    }

    /// vision and speech at 60 % on east and west, replicas 0 to 2 each: vision's two replicas running,
    /// speech none (neither GPU has room for both).
    async fn vision_on_both_speech_on_none() -> TestApp {
        let app = east_and_west().await;
        let mut revision = Value::Null;
        for model in ["vision", "speech"] {
            let (status, change) = app
                .deploy(
                    json!({"model": model, "gpus": ["east:0", "west:0"], "share": 60,
                               "revision": revision, "replicas": {"min": 0, "max": 2}}),
                )
                .await;
            assert_eq!(status, StatusCode::CREATED, "{change}");
            revision = change["revision"].clone();
        }
        assert_eq!(app.fleet.scale("vision", decision(0, 2)).await.unwrap(), 2);
        app
    }

    #[tokio::test]
    async fn a_model_that_finds_no_room_for_a_replica_has_an_idle_replica_of_another_model_above_its_least_make_way_and_a_busy_one_never(
    ) {
        let app = vision_on_both_speech_on_none().await;
        // vision busy: speech's replica waits.
        let now = crate::fleet::usage::now_ms();
        app.fleet.observe_load("vision", 2, 1, now);
        assert_eq!(app.fleet.scale("speech", decision(0, 1)).await.unwrap(), 0);
        assert_eq!(app.fleet.replicas_view("vision").unwrap().running, 2);

        // vision idle (no request in flight or waiting at its last samples): one of its replicas makes
        // way, committed before speech's, and speech's replica runs on the GPU it left.
        app.fleet.observe_load("vision", 2, 0, now + 1000);
        app.fleet.observe_load("vision", 2, 0, now + 2000);
        assert_eq!(app.fleet.scale("speech", decision(0, 1)).await.unwrap(), 1);
        let vision = app.fleet.replicas_view("vision").unwrap();
        let speech = app.fleet.replicas_view("speech").unwrap();
        assert_eq!(vision.running, 1);
        assert_eq!(vision.decisions[0].why, "made way for speech: idle");
        assert_eq!(speech.running, 1);
        assert!(
            !vision.gpus.contains(&speech.gpus[0]),
            "{vision:?} {speech:?}"
        );
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
        let (_, audit) = app.get("/api/audit?action=model.scale").await;
        let steps: Vec<(Value, Value, Value)> = audit
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                (
                    e["target"].clone(),
                    e["after"]["from"].clone(),
                    e["after"]["to"].clone(),
                )
            })
            .collect();
        assert_eq!(
            steps[..2],
            [
                (json!("speech"), json!(0), json!(1)),
                (json!("vision"), json!(2), json!(1))
            ],
            "{audit}"
        );
    }

    #[tokio::test]
    async fn a_replica_that_made_way_whose_engine_s_memory_is_still_read_on_its_gpu_is_the_only_one_asked_until_it_has_gone_and_the_waiting_replica_then_takes_its_room(
    ) {
        let app = vision_on_both_speech_on_none().await;
        let now = crate::fleet::usage::now_ms();
        app.fleet.observe_load("vision", 2, 0, now);
        app.fleet.observe_load("vision", 2, 0, now + 1000);
        // Each GPU reads 48 GB taken outside the plan: what it reads of a replica's engine that has left
        // the plan and not yet stopped (draining). Read before the replica leaves, so that the step that
        // makes way already finds it (until then it counts that memory twice, which changes no choice).
        for machine in ["east", "west"] {
            taken_outside(&app, machine, 48).await;
        }
        // One of vision's replicas makes way; its room is not free yet, so speech's replica waits, with
        // why, and no other replica is asked, however often speech asks again meanwhile.
        for _ in 0..5 {
            assert_eq!(app.fleet.scale("speech", decision(0, 1)).await.unwrap(), 0);
        }
        let vision = app.fleet.replicas_view("vision").unwrap();
        assert_eq!(vision.running, 1, "{vision:?}");
        let made_way: Vec<_> = vision
            .decisions
            .iter()
            .filter(|d| d.why == "made way for speech: idle")
            .collect();
        assert_eq!(made_way.len(), 1, "{vision:?}");
        let speech = app.fleet.replicas_view("speech").unwrap();
        assert_eq!((speech.desired, speech.pending), (1, 1), "{speech:?}");
        assert!(!speech.pending_reasons.is_empty(), "{speech:?}");
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());

        // The engine has stopped: its GPU reads free, and speech's replica takes the room it left.
        let left = ["east", "west"]
            .into_iter()
            .find(|m| vision.gpus.iter().all(|g| g.machine != *m))
            .unwrap();
        taken_outside(&app, left, 0).await;
        assert_eq!(app.fleet.scale("speech", decision(0, 1)).await.unwrap(), 1);
        let speech = app.fleet.replicas_view("speech").unwrap();
        assert_eq!(speech.gpus[0].machine, left, "{speech:?}");
        assert_eq!(app.fleet.replicas_view("vision").unwrap().running, 1);
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_machine_of_the_group_where_no_replica_runs_stays_the_group_s_no_worker_takes_it_whole_and_no_plan_makes_the_model_on_demand(
    ) {
        let (app, change, _, other) = vision_on_one_of_two().await;
        assert_eq!(held(&app, other, "replica room").await, Some(0.0));
        let whole = json!({"name": "trainer", "requested_resources": {"gpu_requests": {
            "count": 1, "ids": [format!("{other}:0")]}}});
        let (_, worker) = app.post_worker(&whole.to_string()).await;
        assert_eq!(worker["assignment"], Value::Null, "{worker}");

        let group = change["group"].as_str().unwrap();
        let (status, answer) = app
            .put_plan(
                group,
                json!({"revision": change["revision"], "shares": {"vision": 20},
                       "demand": {"vision": {"mode": "on_demand", "keep_alive": 60}}}),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
        assert!(
            answer["error"]
                .as_str()
                .unwrap()
                .starts_with("vision: an on-demand model loads on every machine"),
            "{answer}"
        );
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn replicas_past_the_gpus_of_the_group_for_whole_gpus_or_for_an_on_demand_model_are_refused_with_what_to_fix(
    ) {
        let app = east_and_west().await;
        let refused = |body: Value| {
            let app = &app;
            async move {
                let (status, answer) = app.deploy(body).await;
                assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{answer}");
                answer["error"].as_str().unwrap_or_default().to_owned()
            }
        };
        // vision at 20 % on both machines, with `fields` too.
        let on_both = |fields: Value| {
            let mut body = json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 20});
            for (field, value) in fields.as_object().into_iter().flatten() {
                body[field] = value.clone();
            }
            body
        };
        let more = refused(on_both(json!({"replicas": {"min": 1, "max": 3}}))).await;
        assert!(
            more.starts_with("replicas.max (3) is more than the 2 GPU(s) of its group"),
            "{more}"
        );
        let whole = refused(
            json!({"model": "vision", "gpus": ["east:0"], "shared": false,
                                   "replicas": {"max": 1}}),
        )
        .await;
        assert!(
            whole.starts_with("replicas are for a model that shares its GPUs"),
            "{whole}"
        );
        let on_demand = refused(on_both(json!({
            "demand": {"mode": "on_demand", "keep_alive": 60}, "replicas": {"max": 2}
        })))
        .await;
        assert!(
            on_demand.starts_with("an on-demand model loads on every machine"),
            "{on_demand}"
        );
        let backwards = refused(on_both(json!({"replicas": {"min": 2, "max": 1}}))).await;
        assert_eq!(
            backwards,
            "replicas.min (2) is above replicas.max (1): make max at least min"
        );
        assert!(app.fleet.groups().is_empty());
    }

    #[tokio::test]
    async fn put_replicas_changes_an_autoscaled_model_s_replicas_at_its_revision_with_no_restart_removing_those_past_the_new_most_and_refuses_what_it_cannot_do(
    ) {
        let (app, change, _, _) = vision_on_one_of_two().await;
        assert_eq!(app.fleet.scale("vision", decision(1, 2)).await.unwrap(), 2);
        let group = change["group"].as_str().unwrap().to_owned();
        let revision = app.fleet.group(&group).unwrap().revision;
        let engines = app.fleet.desired().await;
        let put = |body: Value| put_replicas(&app, "vision", body);

        let (status, answer) = put(json!({"revision": revision,
            "replicas": {"min": 1, "max": 1, "target": 3, "down_s": 30}}))
        .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["revision"], revision + 1, "{answer}");
        assert_eq!(answer["restarts"], false, "{answer}");
        let replicas = &answer["replicas"];
        assert_eq!(
            (&replicas["max"], &replicas["target"], &replicas["running"]),
            (&json!(1), &json!(3), &json!(1)),
            "the replica past the new most goes: {answer}"
        );
        let kept = app.fleet.desired().await;
        assert_eq!(kept.len(), 1);
        assert!(
            engines
                .iter()
                .any(|e| e.unit == kept[0].unit && e.fingerprint() == kept[0].fingerprint()),
            "the replica that stays is the engine it was"
        );
        let (_, audit) = app.get("/api/audit?action=model.replicas").await;
        assert_eq!(audit[0]["before"]["max"], 2, "{audit}");
        assert_eq!(audit[0]["after"]["max"], 1, "{audit}");
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());

        let (status, stale) = put(json!({"revision": revision, "replicas": {"max": 2}})).await;
        assert_eq!(status, StatusCode::CONFLICT, "{stale}");
        let (status, more) = put(json!({"revision": revision + 1, "replicas": {"max": 3}})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{more}");
        assert!(
            more["error"]
                .as_str()
                .unwrap()
                .starts_with("replicas.max (3) is more than the 2 GPU(s)"),
            "{more}"
        );
        let (status, missing) = put(json!({"revision": revision + 1})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{missing}");
        assert!(
            missing["error"].as_str().unwrap().contains("replicas"),
            "a body without replicas changes nothing, not them to none: {missing}"
        );
        assert!(app.fleet.is_autoscaled("vision"));
        let (status, _) = put_replicas(
            &app,
            "nothing",
            json!({"revision": 1, "replicas": {"max": 2}}),
        )
        .await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    /// `PUT /api/deployments/{model}/replicas` with `body`.
    async fn put_replicas(app: &TestApp, model: &str, body: Value) -> (StatusCode, Value) {
        app.call(
            axum::http::Method::PUT,
            &format!("/api/deployments/{model}/replicas"),
            Some(&body.to_string()),
        )
        .await
    }

    /// The units of the engines the fleet wants, in name order.
    async fn units(app: &TestApp) -> Vec<String> {
        let mut units: Vec<String> = app
            .fleet
            .desired()
            .await
            .into_iter()
            .map(|e| e.unit)
            .collect();
        units.sort();
        units
    }

    #[tokio::test]
    async fn a_member_without_replicas_takes_them_in_the_room_it_held_itself_its_engines_changing_to_one_on_the_gpu_of_each_replica_and_gives_them_up_again(
    ) {
        let app = east_and_west().await;
        let (status, change) = app
            .deploy(json!({"model": "glm-5.3", "gpus": ["east:0", "west:0"], "share": 60}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{change}");
        let group = change["group"].as_str().unwrap().to_owned();
        let revision = change["revision"].as_i64().unwrap();
        let on_each_machine = vec![
            holder::member(&group, "glm-5.3", "east"),
            holder::member(&group, "glm-5.3", "west"),
        ];
        assert_eq!(units(&app).await, on_each_machine);

        // 48 GB of each 80 GB GPU: a replica fits only in the room the member itself leaves.
        let (status, answer) = put_replicas(
            &app,
            "glm-5.3",
            json!({"revision": revision, "replicas": {"min": 1, "max": 2}}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["restarts"], true, "{answer}");
        assert_eq!(answer["revision"], revision + 1, "{answer}");
        assert_eq!(answer["replicas"]["running"], 1, "{answer}");
        let gpu: GpuRef = serde_json::from_value(answer["replicas"]["gpus"][0].clone()).unwrap();
        assert_eq!(
            units(&app).await,
            [holder::replica(&group, "glm-5.3", &gpu)],
            "one engine, on its replica's GPU alone"
        );
        let other = if gpu.machine == "east" {
            "west"
        } else {
            "east"
        };
        assert_eq!(held(&app, &gpu.machine, "glm-5.3").await, Some(48.0));
        assert_eq!(held(&app, other, "glm-5.3").await, None);
        let (_, audit) = app.get("/api/audit?action=model.replicas").await;
        assert_eq!(audit[0]["before"], Value::Null, "{audit}");
        assert_eq!(audit[0]["after"]["max"], 2, "{audit}");
        assert_eq!(audit[0]["restarts"], json!(["glm-5.3"]), "{audit}");
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());

        let (status, back) = put_replicas(
            &app,
            "glm-5.3",
            json!({"revision": revision + 1, "replicas": null}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{back}");
        assert_eq!(
            (&back["restarts"], &back["replicas"]),
            (&json!(true), &Value::Null),
            "{back}"
        );
        assert!(!app.fleet.is_autoscaled("glm-5.3"));
        assert_eq!(units(&app).await, on_each_machine);
        assert_eq!(held(&app, "east", "glm-5.3").await, Some(48.0));
        assert_eq!(held(&app, "west", "glm-5.3").await, Some(48.0));
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());

        let (status, same) = put_replicas(
            &app,
            "glm-5.3",
            json!({"revision": revision + 2, "replicas": null}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{same}");
        assert_eq!(
            (&same["restarts"], &same["revision"]),
            (&json!(false), &json!(revision + 2)),
            "none asked of a model without replicas writes nothing: {same}"
        );
    }

    #[tokio::test]
    async fn giving_up_replicas_where_the_member_on_every_gpu_would_not_fit_and_taking_them_on_demand_are_refused_and_change_nothing(
    ) {
        let app = east_and_west().await;
        // Each one replica on a GPU of its own: 60 % and 50 %.
        let (_, first) = app
            .deploy(
                json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 60,
                           "replicas": {"min": 1, "max": 1}}),
            )
            .await;
        let (status, second) = app
            .deploy(
                json!({"model": "glm-5.3", "gpus": ["east:0", "west:0"], "share": 50,
                           "replicas": {"min": 1, "max": 1}, "revision": first["revision"]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{second}");
        let revision = second["revision"].as_i64().unwrap();
        let before = units(&app).await;
        assert_eq!(before.len(), 2);

        // vision on both GPUs would be 60 % beside glm-5.3's replica of 50 % on one of them.
        let (status, refused) = put_replicas(
            &app,
            "vision",
            json!({"revision": revision, "replicas": null}),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{refused}");
        assert!(
            refused["verdict"]["problems"]
                .as_array()
                .is_some_and(|p| !p.is_empty()),
            "refused with the verdict: {refused}"
        );
        assert!(app.fleet.is_autoscaled("vision"));
        assert_eq!(units(&app).await, before);
        let group = second["group"].as_str().unwrap();
        assert_eq!(app.fleet.group(group).unwrap().revision, revision);

        let (status, speech) = app
            .deploy(
                json!({"model": "speech", "gpus": ["east:0", "west:0"], "share": 10,
                           "demand": {"mode": "on_demand", "keep_alive": 60},
                           "revision": revision}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{speech}");
        let revision = speech["revision"].as_i64().unwrap();
        let (status, on_demand) = put_replicas(
            &app,
            "speech",
            json!({"revision": revision, "replicas": {"min": 0, "max": 2}}),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{on_demand}");
        assert!(
            on_demand["error"]
                .as_str()
                .unwrap()
                .starts_with("speech: an on-demand model loads on every machine"),
            "{on_demand}"
        );
        assert!(!app.fleet.is_autoscaled("speech"));
        assert_eq!(app.fleet.group(group).unwrap().revision, revision);
    }

    #[tokio::test]
    async fn giving_up_replicas_where_another_member_s_replica_runs_on_a_gpu_it_would_overfill_has_that_replica_wait(
    ) {
        // Another program takes 20 GB of east: 60 GB left there.
        let app = east_and_west().await;
        taken_outside(&app, "east", 20).await;
        // vision's two replicas, 32 GB on each GPU; glm-5.3's one replica, 36 GB, fits on west alone.
        let (_, first) = app
            .deploy(
                json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 40,
                           "replicas": {"min": 2, "max": 2}}),
            )
            .await;
        let (status, second) = app
            .deploy(
                json!({"model": "glm-5.3", "gpus": ["east:0", "west:0"], "share": 45,
                           "replicas": {"min": 1, "max": 1}, "revision": first["revision"]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{second}");
        assert_eq!(held(&app, "west", "glm-5.3").await, Some(36.0));

        // glm-5.3 on east too would be 68 GB of its 60 beside vision's replica there: the verdict has
        // that replica wait, and it goes, as a scale step of its own.
        let revision = second["revision"].as_i64().unwrap();
        let (status, answer) = put_replicas(
            &app,
            "glm-5.3",
            json!({"revision": revision, "replicas": null}),
        )
        .await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert!(!answer["waits"].as_array().unwrap().is_empty(), "{answer}");
        assert_eq!(held(&app, "east", "glm-5.3").await, Some(36.0));
        assert_eq!(held(&app, "east", "vision").await, None, "it waits");
        assert_eq!(held(&app, "west", "vision").await, Some(32.0));
        let vision = app.fleet.replicas_view("vision").unwrap();
        assert_eq!(vision.running, 1, "{vision:?}");
        assert_eq!(
            vision.decisions.first().map(|d| d.why.as_str()),
            Some("waits for room: glm-5.3 changed its replicas"),
            "{vision:?}"
        );
        let (_, audit) = app.get("/api/audit?action=model.scale").await;
        assert_eq!(audit[0]["target"], "vision", "{audit}");
        assert_eq!(audit[0]["after"]["to"], 1, "{audit}");
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn a_plan_change_that_leaves_no_room_for_a_running_replica_has_it_wait_rather_than_overfill_its_gpu(
    ) {
        // Another program takes 20 GB of east: 60 GB left there.
        let app = east_and_west().await;
        taken_outside(&app, "east", 20).await;
        // vision's two replicas, 32 GB on each GPU, beside glm-5.3's 24 GB on each: 56 of east's 60.
        let (_, first) = app
            .deploy(
                json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 40,
                           "replicas": {"min": 1, "max": 2}}),
            )
            .await;
        assert_eq!(app.fleet.scale("vision", decision(1, 2)).await.unwrap(), 2);
        let (status, second) = app
            .deploy(
                json!({"model": "glm-5.3", "gpus": ["east:0", "west:0"], "share": 30,
                           "revision": first["revision"]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{second}");

        // glm-5.3 at 40 %: 32 + 32 on east is over its 60 GB; the plan is warned, vision's replica there
        // waits.
        let group = second["group"].as_str().unwrap().to_owned();
        let body = json!({"revision": second["revision"], "shares": {"vision": 40, "glm-5.3": 40}});
        let (status, change) = app
            .call(
                axum::http::Method::PUT,
                &format!("/api/groups/{group}/plan"),
                Some(&body.to_string()),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{change}");
        assert!(!change["waits"].as_array().unwrap().is_empty(), "{change}");
        assert_eq!(held(&app, "east", "glm-5.3").await, Some(32.0));
        assert_eq!(held(&app, "east", "vision").await, None, "it waits");
        let vision = app.fleet.replicas_view("vision").unwrap();
        assert_eq!(vision.running, 1, "{vision:?}");
        assert_eq!(
            vision.decisions.first().map(|d| d.why.clone()),
            Some(format!("waits for room: the plan of {group} changed")),
            "{vision:?}"
        );
        assert!(
            app.fleet
                .desired()
                .await
                .iter()
                .all(|e| e.unit != holder::replica(&group, "vision", &GpuRef::new("east", 0))),
            "its engine there is not wanted"
        );
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn where_a_plan_change_leaves_room_for_fewer_replicas_on_a_gpu_one_above_its_model_s_least_waits_before_one_at_it(
    ) {
        // Another program takes 20 GB of east: 60 GB left there.
        let app = east_and_west().await;
        taken_outside(&app, "east", 20).await;
        // vision's two replicas (its least 1) on both GPUs, speech's one (its least 1) on east, 20 GB
        // each, beside glm-5.3's 16 GB on each: 56 of east's 60.
        let (_, first) = app
            .deploy(
                json!({"model": "vision", "gpus": ["east:0", "west:0"], "share": 25,
                           "replicas": {"min": 1, "max": 2}}),
            )
            .await;
        assert_eq!(app.fleet.scale("vision", decision(1, 2)).await.unwrap(), 2);
        let (_, second) = app
            .deploy(
                json!({"model": "speech", "gpus": ["east:0", "west:0"], "share": 25,
                           "replicas": {"min": 1, "max": 1}, "revision": first["revision"]}),
            )
            .await;
        assert_eq!(held(&app, "east", "speech").await, Some(20.0));
        let (status, third) = app
            .deploy(
                json!({"model": "glm-5.3", "gpus": ["east:0", "west:0"], "share": 20,
                           "revision": second["revision"]}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{third}");

        // glm-5.3 at 30 %: east holds one replica beside it, not two. vision has one to spare.
        let group = third["group"].as_str().unwrap().to_owned();
        let body = json!({"revision": third["revision"],
                          "shares": {"vision": 25, "speech": 25, "glm-5.3": 30}});
        let (status, change) = app
            .call(
                axum::http::Method::PUT,
                &format!("/api/groups/{group}/plan"),
                Some(&body.to_string()),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{change}");
        assert_eq!(held(&app, "east", "speech").await, Some(20.0));
        assert_eq!(held(&app, "east", "vision").await, None);
        assert_eq!(held(&app, "west", "vision").await, Some(20.0));
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
    }

    /// octo: one machine of four 80 GB GPUs.
    const OCTO: &str = r#"
[[machine]]
name = "octo"
cpu_cores = 64
memory_gb = 512
"#;

    /// What `who` holds on each of `machine`'s GPUs, in GB, as its machine view shows it.
    async fn held_on_each(app: &TestApp, machine: &str, who: &str) -> Vec<Option<f64>> {
        let (_, view) = app.get(&format!("/api/machines/{machine}")).await;
        view["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|gpu| {
                gpu["sharers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|s| s["worker"] == who)
                    .map(|s| s["gb"].as_f64().unwrap())
            })
            .collect()
    }

    #[tokio::test]
    async fn replicas_on_one_machine_of_four_gpus_each_run_on_a_gpu_of_their_own_beside_a_member_across_all_four_and_grow_onto_the_others(
    ) {
        let gpus: String = (0..4)
            .map(|i| {
                format!("[[machine.gpu]]\nindex = {i}\nmodel = \"NVIDIA H100 80GB HBM3\"\nmemory_gb = 80\n")
            })
            .collect();
        let app = TestApp::new(&format!("{OCTO}{gpus}")).await;
        app.fleet
            .seed_catalog(&crate::inventory::demo::demo_catalog())
            .await
            .unwrap();
        let all = json!(["octo:0", "octo:1", "octo:2", "octo:3"]);
        let (status, change) = app
            .deploy(json!({"model": "vision", "gpus": all, "share": 20,
                           "replicas": {"min": 1, "max": 3}}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{change}");
        let (status, answer) = app
            .deploy(json!({"model": "glm-5.3", "gpus": all, "share": 30,
                           "revision": change["revision"]}))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{answer}");
        let first = held_on_each(&app, "octo", "vision").await;
        assert_eq!(
            first.iter().flatten().count(),
            1,
            "one GPU holds it: {first:?}"
        );
        assert_eq!(
            held_on_each(&app, "octo", "glm-5.3").await,
            [Some(24.0); 4],
            "a member without replicas runs across the group's GPUs"
        );

        assert_eq!(app.fleet.scale("vision", decision(1, 3)).await.unwrap(), 3);
        let grown = held_on_each(&app, "octo", "vision").await;
        assert_eq!(
            grown.iter().flatten().collect::<Vec<_>>(),
            [&16.0; 3],
            "{grown:?}"
        );
        assert_eq!(app.fleet.replicas_view("vision").unwrap().gpus.len(), 3);
        // Each replica is an engine on its GPU alone; the other member's is one across all four.
        let mut engines: Vec<(String, Vec<u32>)> = app
            .fleet
            .desired()
            .await
            .into_iter()
            .map(|spec| (spec.unit, spec.gpus))
            .collect();
        engines.sort();
        let replicas: Vec<&(String, Vec<u32>)> = engines
            .iter()
            .filter(|(unit, _)| unit.contains("/vision@"))
            .collect();
        assert_eq!(replicas.len(), 3, "{engines:?}");
        for (unit, gpus) in &replicas {
            assert_eq!(
                unit,
                &holder::replica(
                    change["group"].as_str().unwrap(),
                    "vision",
                    &GpuRef::new("octo", gpus[0])
                ),
            );
            assert_eq!(gpus.len(), 1, "{unit}");
        }
        assert!(
            engines
                .iter()
                .any(|(unit, gpus)| unit.ends_with("/glm-5.3@octo") && gpus == &[0, 1, 2, 3]),
            "{engines:?}"
        );
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
        app.fleet.check_engines().await.unwrap();

        // Down to one: the GPUs it left are the group's again, kept for replicas, holding nothing.
        assert_eq!(app.fleet.scale("vision", decision(3, 1)).await.unwrap(), 1);
        let left = held_on_each(&app, "octo", "vision").await;
        assert_eq!(left.iter().flatten().count(), 1, "{left:?}");
        assert_eq!(
            held_on_each(&app, "octo", "replica room")
                .await
                .iter()
                .flatten()
                .count(),
            0
        );
        assert_eq!(app.fleet.check().await.unwrap(), Vec::<String>::new());
        let placed = app.fleet.replicas_view("vision").unwrap().gpus;
        let app = app.restart().await;
        assert_eq!(app.fleet.replicas_view("vision").unwrap().gpus, placed);
    }

    #[test]
    fn a_replica_aims_at_its_engines_own_slots_unless_a_target_is_set() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(target_of(None, &args(&["--parallel", "4"])), 4);
        assert_eq!(target_of(None, &args(&["--max-num-seqs", "8"])), 8);
        assert_eq!(target_of(Some(2), &args(&["-np", "4"])), 2);
        assert_eq!(target_of(None, &[]), 1);
        assert_eq!(target_of(None, &args(&["--parallel", "zero"])), 1);
    }
}
