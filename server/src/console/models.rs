//! The Models tab, a model's own page and the playground: what runs where, with which engines, and how far
//! each group's change has got; the playground's models and the log of the engine it shows.

use super::{app_error, engine_line, whole_deployments, ConsoleService};
use crate::error::ApiError;
use crate::fleet::authority;
use crate::fleet::groups::Group;
use crate::runtime::StepStatus;
use app::auth::{Caller, Role};
use app::error::AppError;
use app::views::{
    EngineLine, ModelPage, ModelRow, Page, PlanProgress, Playground, StepLine, StepState,
};
use std::collections::HashMap;

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

impl ConsoleService {
    /// A page of the Models tab: [`ConsoleService::model_rows`] that `search` finds, and the figures from
    /// the database of that page's rows alone.
    pub(super) async fn models_tab(
        &self,
        search: &str,
        page: usize,
    ) -> Result<Page<ModelRow>, ApiError> {
        let mut page = Page::models(self.model_rows(), search, page);
        self.with_figures(&mut page.rows).await?;
        Ok(page)
    }

    /// What `rows` show that is read from the database: this hour's requests and failures through the
    /// gateway, and each group member's fullest measured peak.
    async fn with_figures(&self, rows: &mut [ModelRow]) -> Result<(), ApiError> {
        let now = crate::fleet::usage::now_ms();
        let calls = self
            .fleet
            .calls()
            .report(&self.pool, now - now % placement::usage::HOUR_MS, now + 1)
            .await?;
        for row in rows.iter_mut() {
            for call in calls.iter().filter(|c| c.model == row.name) {
                row.hour_requests += call.requests;
                row.hour_failed += call.failed;
            }
            if let Some(group) = &row.group {
                row.peak = self
                    .fleet
                    .peaks(group, &row.name)
                    .await?
                    .into_iter()
                    .next()
                    .map(|p| p.peak);
            }
        }
        Ok(())
    }

    /// Every deployed model with its engines and flags, as of the last write and reading.
    pub(super) fn model_rows(&self) -> Vec<ModelRow> {
        self.model_rows_where(|_| true)
    }

    /// The deployed models `wanted` keeps, each with its engines and flags: one model's row is built
    /// without the thousands of others a fleet runs (their replicas, turns and neighbours read).
    fn model_rows_where(&self, wanted: impl Fn(&str) -> bool) -> Vec<ModelRow> {
        let system = self.fleet.system_models();
        let engines = self.fleet.runtime().engines();
        // Each row's engines looked up, not searched for: a fleet runs thousands.
        let mut of_member: HashMap<(&str, &str), Vec<EngineLine>> = HashMap::new();
        let mut of_worker: HashMap<&str, Vec<EngineLine>> = HashMap::new();
        for e in engines
            .iter()
            .filter(|e| e.model.as_deref().is_none_or(&wanted))
        {
            if let (Some(group), Some(model)) = (&e.group, &e.model) {
                of_member
                    .entry((group, model))
                    .or_default()
                    .push(engine_line(e));
            }
            if let Some(worker) = &e.worker {
                of_worker.entry(worker).or_default().push(engine_line(e));
            }
        }
        let over_shares = self.fleet.over_shares();
        let mut rows = Vec::new();
        let committed = self.fleet.committed();
        for group in &committed.groups {
            for share in group.members.iter().filter(|s| wanted(&s.member)) {
                rows.push(ModelRow {
                    name: share.member.clone(),
                    group: Some(group.name.clone()),
                    share: Some(share.share),
                    whole_gpus: None,
                    nodes: group_machines(group),
                    engines: of_member
                        .remove(&(group.name.as_str(), share.member.as_str()))
                        .unwrap_or_default(),
                    system: system.contains(&share.member),
                    revision: group.revision,
                    on_demand: self.fleet.on_demand_view(&share.member),
                    replicas: self.fleet.replicas_view(&share.member),
                    slowed: self.fleet.slowed(&share.member),
                    over_share: over_shares.get(&share.member).cloned(),
                    peak: None,
                    // Not on made-up GPUs, where no daemon runs: the demo engines stand in.
                    share_enforced: !group.gpus.is_empty()
                        && group.gpus.iter().all(|gpu| {
                            committed.sharing(gpu).mode.enforces_memory()
                                && self.fleet.runs_daemons(&gpu.machine)
                        }),
                    hour_requests: 0,
                    hour_failed: 0,
                });
            }
        }
        let workers = self.fleet.workers();
        for worker in
            whole_deployments(&workers).filter(|w| w.model.as_deref().is_some_and(&wanted))
        {
            rows.push(ModelRow {
                name: worker.model.clone().unwrap_or_default(),
                group: None,
                share: None,
                whole_gpus: Some(worker.gpus.len() as u32),
                nodes: worker.machine.iter().cloned().collect(),
                engines: of_worker.remove(worker.name.as_str()).unwrap_or_default(),
                system: false,
                revision: worker.revision,
                on_demand: None,
                replicas: None,
                slowed: worker.model.as_deref().and_then(|m| self.fleet.slowed(m)),
                over_share: None,
                peak: None,
                share_enforced: false,
                hour_requests: 0,
                hour_failed: 0,
            });
        }
        rows.sort_by(|a, b| a.name.cmp(&b.name));
        rows
    }

    pub(super) async fn progress(&self) -> Result<Vec<PlanProgress>, ApiError> {
        Ok(self
            .fleet
            .committed()
            .groups
            .iter()
            .filter_map(|g| self.last_change(&g.name))
            // Done changes drop out; a failed step stays in sight until the next change.
            .filter(|p| p.steps.iter().any(|s| s.state != StepState::Done))
            .collect())
    }

    /// `group`'s last plan change, step by step, done or not.
    fn last_change(&self, group: &str) -> Option<PlanProgress> {
        let p = self.fleet.runtime().progress(group)?;
        Some(PlanProgress {
            group: group.to_owned(),
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
    }

    /// `model` as the Models tab shows it, with its figures; `None` where it is not deployed.
    pub async fn deployed_model(&self, model: &str) -> Result<Option<ModelRow>, ApiError> {
        // Its own figures alone: not every member's peaks read to show one.
        let mut rows = self.model_rows_where(|name| name == model);
        self.with_figures(&mut rows).await?;
        Ok(rows.pop())
    }

    /// A model's own page.
    pub(super) async fn model_own_page(
        &self,
        caller: Caller,
        model: &str,
    ) -> Result<ModelPage, AppError> {
        let row = self
            .deployed_model(model)
            .await
            .map_err(app_error)?
            .ok_or_else(|| AppError::NotFound(format!("no model named {model} is deployed")))?;
        let neighbours = row
            .group
            .as_deref()
            .and_then(|g| self.fleet.committed().group(g).cloned())
            .map(|g| {
                g.members
                    .iter()
                    .map(|m| m.member.clone())
                    .filter(|m| m != model)
                    .collect()
            })
            .unwrap_or_default();
        let change = row.group.as_deref().and_then(|g| self.last_change(g));
        let (logs, log_engine) = self.engine_logs(&caller, model).await;
        Ok(ModelPage {
            row,
            neighbours,
            logs,
            log_engine,
            change,
        })
    }

    /// The last log lines of `model`'s engine most able to serve (a crashed one's only where no other
    /// runs), redacted for all but admins, and which engine they are from.
    async fn engine_logs(&self, caller: &Caller, model: &str) -> (Vec<String>, Option<String>) {
        let runtime = self.fleet.runtime();
        let Some(engine) = runtime
            .engines_of(model)
            .into_iter()
            .filter(|e| e.model.as_deref() == Some(model))
            .min_by_key(|e| (e.state.concern(), e.machine.clone()))
        else {
            return (Vec::new(), None);
        };
        let described = match &engine.message {
            Some(why) => format!("on {}: {}: {why}", engine.machine, engine.state.label()),
            None => format!("on {}: {}", engine.machine, engine.state.label()),
        };
        let mut logs = match runtime
            .logs(&engine.id, app::pages::playground::LOG_LINES)
            .await
        {
            Some(Ok(lines)) => lines,
            Some(Err(e)) => {
                tracing::warn!("the log of {} could not be read: {e}", engine.id);
                Vec::new()
            }
            None => Vec::new(),
        };
        if caller.role != Role::Admin {
            let secrets = self.fleet.engine_secrets(&engine);
            for line in &mut logs {
                *line = authority::redact_line(line, &secrets);
            }
        }
        (logs, Some(described))
    }

    pub(super) async fn playground_page(
        &self,
        caller: Caller,
        model: Option<String>,
    ) -> Result<Playground, AppError> {
        let models = self.fleet.served_models();
        let shown = model.or_else(|| models.first().cloned());
        let (logs, described) = match &shown {
            Some(shown) => self.engine_logs(&caller, shown).await,
            None => (Vec::new(), None),
        };
        Ok(Playground {
            models,
            logs,
            engine: described,
        })
    }
}
