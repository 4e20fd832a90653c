//! Sharing groups and their plans: read a group, change its members' shares, and judge a plan before it is
//! sent (the verdict scripts read, also beside a refused change).

use super::{page, percent, percents, ApiJson};
use crate::auth::Actor;
use crate::error::ApiError;
use crate::fleet::groups::{GroupView, PlanChange};
use crate::input::PlanCommand;
use crate::AppState;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::http::Uri;
use axum::response::Response;
use axum::Json;
use placement::estimate::Settings;
use placement::rightsize::below_estimate;
use placement::{judge, Demand, GpuRef, PlanMember, Verdict};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `GET /api/groups`' query: a page, and the groups on one machine or with one model among their members.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct GroupsQuery {
    limit: Option<String>,
    cursor: Option<String>,
    machine: Option<String>,
    model: Option<String>,
}

pub(super) async fn list_groups(
    State(state): State<AppState>,
    uri: Uri,
    q: Result<Query<GroupsQuery>, QueryRejection>,
) -> Result<Response, ApiError> {
    let q = page::query(q)?;
    let groups: Vec<GroupView> = state
        .fleet
        .groups()
        .into_iter()
        .filter(|g| {
            q.machine.as_deref().is_none_or(|machine| {
                g.gpus
                    .iter()
                    .any(|gpu| gpu.rsplit_once(':').is_some_and(|(m, _)| m == machine))
            }) && q
                .model
                .as_deref()
                .is_none_or(|model| g.members.iter().any(|m| m.name == model))
        })
        .collect();
    let asked = page::PageQuery {
        limit: q.limit,
        cursor: q.cursor,
    };
    page::page(groups, |g| g.name.clone(), &asked, &uri)
}

pub(super) async fn get_group(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> Result<Json<GroupView>, ApiError> {
    Ok(Json(state.fleet.group(&name)?))
}

pub(super) async fn change_plan(
    State(state): State<AppState>,
    Actor(actor): Actor,
    Path(name): Path<String>,
    ApiJson(update): ApiJson<PlanUpdate>,
) -> Result<Json<PlanChange>, ApiError> {
    let update = update.parse()?;
    Ok(Json(
        state.fleet.change_plan(&name, update, &actor.name).await?,
    ))
}

/// `POST /api/plans/validate`: a group's members with their shares in percent, and the GPUs it runs on.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PlanRequest {
    members: Vec<PlanMemberRequest>,
    /// GPUs as `machine:index`.
    #[serde(default)]
    gpus: Vec<String>,
    /// The group the plan is for, whose own memory on those GPUs does not count against it.
    #[serde(default)]
    group: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanMemberRequest {
    name: String,
    /// Percent of one GPU's memory; absent or null for a member with no share yet.
    #[serde(default)]
    share: Option<f64>,
    #[serde(default)]
    locked: bool,
    /// Pinned (the default) or on demand: on-demand members take turns beside the pinned ones.
    #[serde(default)]
    demand: Demand,
    /// Replicas that follow its load, each on one GPU: the verdict counts its most where they would run.
    #[serde(default)]
    replicas: Option<placement::scale::Autoscale>,
}

/// A GPU named `machine:index`.
fn parse_gpu_ref(id: &str) -> Result<GpuRef, ApiError> {
    id.parse()
        .map_err(|e: placement::GpuRefError| ApiError::Unprocessable(e.to_string()))
}

/// `PUT /api/groups/{name}/plan`: every member's share, against the revision it was read at.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanUpdate {
    /// The revision the plan was read at.
    pub revision: i64,
    /// Each member's share, percent. A member left out has no explicit share, which the verdict refuses.
    pub shares: BTreeMap<String, f64>,
    /// Members whose demand changes (`{"mode": "pinned"}` or `{"mode": "on_demand", "keep_alive": 300}`);
    /// the others keep theirs.
    #[serde(default)]
    pub demand: BTreeMap<String, Demand>,
}

impl PlanUpdate {
    /// The plan change as the fleet takes it, its shares read once.
    pub fn parse(self) -> Result<PlanCommand, ApiError> {
        Ok(PlanCommand {
            revision: self.revision,
            shares: percents(self.shares)?,
            demand: self.demand,
        })
    }
}

/// The verdict as scripts read it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VerdictView {
    /// `fits` or `refused`.
    pub verdict: String,
    /// The sum of the shares, percent.
    pub total_percent: f64,
    /// What is left of one GPU, percent.
    pub free_percent: f64,
    /// The line under the bar when it fits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Free row's warning over 90 %.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Why it is refused, each naming its member where there is one.
    pub problems: Vec<ProblemView>,
    /// With on-demand members: `On-demand models take turns in the 30% the pinned ones leave.`
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turns: Option<String>,
    /// Members with replicas of which fewer than their most fit now (a warning: the rest wait for room),
    /// each a sentence naming the member, how many fit and why the other GPUs cannot hold one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waits: Vec<String>,
    /// Each catalog member's memory estimate against its share (`POST /api/plans/validate`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub estimates: Vec<MemberEstimate>,
}

/// A member's memory estimate (llama.cpp's defaults: its own context, one slot) against its share.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MemberEstimate {
    /// The member.
    pub member: String,
    /// What the estimate says it needs, in bytes; absent where it has no estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needed_bytes: Option<u64>,
    /// The same in GB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub needed_gb: Option<f64>,
    /// The warning when its share is below the estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warning: Option<String>,
    /// Why it has no estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_estimate: Option<String>,
}

/// One reason a plan is refused.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProblemView {
    /// The seed's sentence.
    pub message: String,
    /// The member it is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

impl From<&Verdict> for VerdictView {
    fn from(verdict: &Verdict) -> VerdictView {
        VerdictView {
            verdict: if verdict.is_refused() {
                "refused"
            } else {
                "fits"
            }
            .to_owned(),
            total_percent: verdict.total.as_percent_f64(),
            free_percent: verdict.free().as_percent_f64(),
            message: verdict.fits_message(),
            warning: verdict
                .warns()
                .then(|| placement::plan::FREE_ROW_WARNING.to_owned()),
            problems: verdict
                .problems
                .iter()
                .map(|p| ProblemView {
                    message: p.message(),
                    member: p.member().map(str::to_owned),
                })
                .collect(),
            turns: verdict.turns_message(),
            waits: verdict
                .waits
                .iter()
                .map(placement::ReplicasWait::message)
                .collect(),
            estimates: Vec::new(),
        }
    }
}

pub(super) async fn validate_plan(
    State(state): State<AppState>,
    ApiJson(plan): ApiJson<PlanRequest>,
) -> Result<Json<VerdictView>, ApiError> {
    let mut members = Vec::with_capacity(plan.members.len());
    for m in &plan.members {
        let share = m.share.map(|p| percent(p, &m.name)).transpose()?;
        members.push(PlanMember {
            name: m.name.clone(),
            share,
            locked: m.locked,
            demand: m.demand,
            replicas: m.replicas,
        });
    }
    let mut gpus = Vec::with_capacity(plan.gpus.len());
    for id in &plan.gpus {
        gpus.push(
            state
                .fleet
                .group_gpu(&parse_gpu_ref(id)?, plan.group.as_deref())
                .await?,
        );
    }
    let mut view = VerdictView::from(&judge(&members, &gpus));
    if let Some(first) = plan.gpus.first() {
        let gpu = parse_gpu_ref(first)?;
        let total = gpus.first().map(|g| g.total).unwrap_or_default();
        for m in &members {
            let Some(share) = m.share else { continue };
            let line = match state
                .fleet
                .estimate_model(&m.name, Some(&gpu.machine), Settings::default())
                .await
            {
                Ok(e) => MemberEstimate {
                    member: m.name.clone(),
                    needed_bytes: Some(e.total().get()),
                    needed_gb: Some(e.total().as_gb_f64()),
                    warning: below_estimate(share, total, e.total()),
                    no_estimate: None,
                },
                // A member that is no catalog model (a name typed for a plan not yet deployed).
                Err(ApiError::NotFound(_)) => continue,
                Err(ApiError::Unprocessable(why)) => MemberEstimate {
                    member: m.name.clone(),
                    needed_bytes: None,
                    needed_gb: None,
                    warning: None,
                    no_estimate: Some(why),
                },
                Err(e) => return Err(e),
            };
            view.estimates.push(line);
        }
    }
    Ok(Json(view))
}
