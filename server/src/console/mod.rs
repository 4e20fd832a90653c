//! The console's service: [`app::services::Console`] over the fleet. It turns what the fleet holds into what
//! the pages show, and the pages' requests into the fleet's calls, so that a server function is one line and
//! the REST API and the console change the fleet through the same code.
//!
//! This file holds the service, the trait's table (each method hands its page's request to the room that
//! serves it, or makes the one fleet call it is) and what several rooms use; the rooms are by page.

mod admin;
mod deploy;
mod machines;
mod models;
mod overview;

use crate::accounts;
use crate::error::ApiError;
use crate::fleet::{Fleet, WorkerView};
use crate::runtime::EngineView;
use app::auth::{Caller, Role};
use app::error::AppError;
use app::services::{Answer, Console};
use app::views::{
    AccountsPage, AuditLine, AuditQuery, ChangeOutcome, DeployOptions, DeployRequest, EngineLine,
    EstimateAnswer, EstimateQuery, MachineDetail, ModelRow, NewApiToken, NodeRow, PlanProgress,
    Playground, Serving, ServingForm, SharingForm, TokenLimits,
};
use placement::{BasisPoints, Demand, Grouping, UsageReport};
use sqlx::SqlitePool;
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

fn engine_line(e: &EngineView) -> EngineLine {
    EngineLine {
        machine: e.machine.clone(),
        status: e.state,
        message: e.message.clone(),
        restarts: e.restarts,
        sizing: e.sizing.clone(),
    }
}

/// The deployments on whole GPUs: workers that name a catalog model.
fn whole_deployments(workers: &[WorkerView]) -> impl Iterator<Item = &WorkerView> {
    workers.iter().filter(|w| w.model.is_some())
}

impl Console for ConsoleService {
    fn overview(&self) -> Answer<'_, app::views::Overview> {
        Box::pin(async move { self.overview_page().await.map_err(app_error) })
    }

    fn models(&self, search: String, page: usize) -> Answer<'_, app::views::Page<ModelRow>> {
        Box::pin(async move { self.models_tab(&search, page).await.map_err(app_error) })
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
        Box::pin(self.deploy_model(actor, request))
    }

    fn estimate(&self, query: EstimateQuery) -> Answer<'_, EstimateAnswer> {
        Box::pin(async move { self.estimate_model(query).await.map_err(app_error) })
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
        Box::pin(self.change_plan(actor, group, revision, shares, demand))
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
        Box::pin(self.change_model_serving(actor, model, revision, serving))
    }

    fn change_replicas(
        &self,
        actor: Caller,
        model: String,
        revision: i64,
        fewest: String,
        most: String,
    ) -> Answer<'_, app::views::ReplicasSaved> {
        Box::pin(self.change_model_replicas(actor, model, revision, fewest, most))
    }

    fn remove(&self, actor: Caller, model: String, revision: i64) -> Answer<'_, ChangeOutcome> {
        Box::pin(self.remove_model(actor, model, revision))
    }

    fn accounts(&self) -> Answer<'_, AccountsPage> {
        Box::pin(self.accounts_page())
    }

    fn create_account(
        &self,
        actor: Caller,
        name: String,
        role: Role,
        password: String,
    ) -> Answer<'_, ()> {
        Box::pin(self.add_account(actor, name, role, password))
    }

    fn delete_account(&self, actor: Caller, name: String) -> Answer<'_, ()> {
        Box::pin(self.remove_account(actor, name))
    }

    fn create_token(
        &self,
        actor: Caller,
        user: String,
        name: String,
        limits: TokenLimits,
    ) -> Answer<'_, NewApiToken> {
        Box::pin(self.add_token(actor, user, name, limits))
    }

    fn revoke_token(&self, actor: Caller, id: i64) -> Answer<'_, ()> {
        Box::pin(self.remove_token(actor, id))
    }

    fn audit(&self, query: AuditQuery) -> Answer<'_, Vec<AuditLine>> {
        Box::pin(self.audit_lines(query))
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

    fn repack_preview(&self) -> Answer<'_, app::views::RepackPreview> {
        Box::pin(async move { Ok(self.fleet.repack_preview().await) })
    }

    fn right_sized(&self) -> Answer<'_, Vec<app::views::RightSized>> {
        Box::pin(async move { self.fleet.right_sized().await.map_err(app_error) })
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
        Box::pin(self.set_gpu_sharing(actor, machine, index, mode, compute_percent, instances))
    }

    fn repack_run(&self) -> Answer<'_, Option<app::views::RepackRun>> {
        Box::pin(async move { Ok(self.fleet.repack_run()) })
    }

    fn stop_repack(&self, actor: Caller) -> Answer<'_, app::views::RepackRun> {
        Box::pin(async move { self.fleet.stop_repack(&actor.name).await.map_err(app_error) })
    }

    fn playground(&self, caller: Caller, model: Option<String>) -> Answer<'_, Playground> {
        Box::pin(self.playground_page(caller, model))
    }

    fn model_page(&self, caller: Caller, model: String) -> Answer<'_, app::views::ModelPage> {
        Box::pin(async move { self.model_own_page(caller, &model).await })
    }
}

#[cfg(test)]
mod tests;
