//! What the server functions ask of the server. `app` never depends on `server`: the server implements
//! [`Console`] and provides it in the Leptos context of every page and server function, so that each
//! server function stays a thin call.

use crate::auth::{Caller, Role};
use crate::error::AppError;
use crate::views::{
    AccountsPage, AuditLine, AuditQuery, ChangeOutcome, DeployOptions, DeployRequest,
    EstimateAnswer, EstimateQuery, MachineDetail, ModelRow, NewApiToken, NodeRow, PlanProgress,
    Playground, RepackRun, Serving, ServingForm, SharingForm, TokenLimits,
};
use placement::{BasisPoints, Grouping, UsageReport};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A boxed future, so that the trait stays object-safe.
pub type Answer<'a, T> = Pin<Box<dyn Future<Output = Result<T, AppError>> + Send + 'a>>;

/// The fleet as the console reads and changes it.
pub trait Console: Send + Sync {
    /// The Overview page: the fleet at a glance, and its open alarms.
    fn overview(&self) -> Answer<'_, crate::views::Overview>;
    /// A page of the Models tab: the deployed models whose name, group or node holds `search`.
    fn models(&self, search: String, page: usize) -> Answer<'_, crate::views::Page<ModelRow>>;
    /// The plan changes being carried out, and those with a failed step.
    fn changes(&self) -> Answer<'_, Vec<PlanProgress>>;
    /// The Nodes tab.
    fn nodes(&self) -> Answer<'_, Vec<NodeRow>>;
    /// One machine's page.
    fn machine(&self, name: String) -> Answer<'_, MachineDetail>;
    /// What the Deploy a model wizard judges a deploy against.
    fn deploy_options(&self) -> Answer<'_, DeployOptions>;
    /// Deploys a model; the server judges the plan again before it commits.
    fn deploy(&self, actor: Caller, request: DeployRequest) -> Answer<'_, ChangeOutcome>;
    /// A catalog model's memory estimate from its file's header, or why it has none.
    fn estimate(&self, query: EstimateQuery) -> Answer<'_, EstimateAnswer>;
    /// The GPU sharing form of a running model.
    fn sharing_form(&self, model: String) -> Answer<'_, SharingForm>;
    /// Commits a group's new shares (and the demand of members whose demand changes), read at `revision`.
    fn change_shares(
        &self,
        actor: Caller,
        group: String,
        revision: i64,
        shares: Vec<(String, BasisPoints)>,
        demand: Vec<(String, placement::Demand)>,
    ) -> Answer<'_, ChangeOutcome>;
    /// The Serving configuration form of a running model.
    fn serving_form(&self, caller: Caller, model: String) -> Answer<'_, ServingForm>;
    /// Changes a running model's serving configuration, read at `revision`; it restarts alone.
    fn change_serving(
        &self,
        actor: Caller,
        model: String,
        revision: i64,
        serving: Serving,
    ) -> Answer<'_, ChangeOutcome>;
    /// Sets a model's fewest and most replicas as typed (`fewest` empty is 1; `most` empty is none), read
    /// at its group's `revision`, keeping its target and windows: no engine restarts unless it takes
    /// replicas or gives them up.
    fn change_replicas(
        &self,
        actor: Caller,
        model: String,
        revision: i64,
        fewest: String,
        most: String,
    ) -> Answer<'_, crate::views::ReplicasSaved>;
    /// Removes a running model, read at `revision`; its engines stop.
    fn remove(&self, actor: Caller, model: String, revision: i64) -> Answer<'_, ChangeOutcome>;
    /// Every account and API token.
    fn accounts(&self) -> Answer<'_, AccountsPage>;
    /// Makes an account.
    fn create_account(
        &self,
        actor: Caller,
        name: String,
        role: Role,
        password: String,
    ) -> Answer<'_, ()>;
    /// Removes an account and its tokens.
    fn delete_account(&self, actor: Caller, name: String) -> Answer<'_, ()>;
    /// Makes an API token acting for `user`.
    fn create_token(
        &self,
        actor: Caller,
        user: String,
        name: String,
        limits: TokenLimits,
    ) -> Answer<'_, NewApiToken>;
    /// Revokes an API token.
    fn revoke_token(&self, actor: Caller, id: i64) -> Answer<'_, ()>;
    /// The audit log, newest first, as `query` narrows it.
    fn audit(&self, query: AuditQuery) -> Answer<'_, Vec<AuditLine>>;
    /// The usage report of `[from_ms, to_ms)` by `by`.
    fn usage(&self, from_ms: u64, to_ms: u64, by: Grouping) -> Answer<'_, UsageReport>;

    /// The playground for `caller`: the models that can be tried, and `model`'s engine's last log lines.
    fn playground(&self, caller: Caller, model: Option<String>) -> Answer<'_, Playground>;

    /// A model's own page, its log redacted for all but admins.
    fn model_page(&self, caller: Caller, model: String) -> Answer<'_, crate::views::ModelPage>;
    /// Milliseconds since the epoch, now.
    fn now_ms(&self) -> u64;

    /// What a repack is planned from (the fleet as committed now), and the plan that frees the most.
    fn repack_preview(&self) -> Answer<'_, crate::views::RepackPreview>;
    /// The members whose measured peak allows a smaller share, with that share.
    fn right_sized(&self) -> Answer<'_, Vec<crate::views::RightSized>>;
    /// Shares GPU `index` of `machine` as `mode` says (`time-slicing`, `mps` with each engine's compute
    /// share, or `mig` cut into `instances`' profiles); its sharers restart.
    fn set_sharing(
        &self,
        actor: Caller,
        machine: String,
        index: u32,
        mode: String,
        compute_percent: Option<i64>,
        instances: Option<Vec<String>>,
    ) -> Answer<'_, crate::views::SharingChange>;
    /// Plans the repack that frees `free` GPUs (the most it can when `None`) again and starts carrying it
    /// out; refused when its moves are no longer `expect`, the moves the operator was shown.
    fn start_repack(
        &self,
        actor: Caller,
        free: Option<usize>,
        expect: Vec<placement::Move>,
    ) -> Answer<'_, RepackRun>;
    /// The repack being carried out, or the last one.
    fn repack_run(&self) -> Answer<'_, Option<RepackRun>>;
    /// Stops the repack before its next move.
    fn stop_repack(&self, actor: Caller) -> Answer<'_, RepackRun>;
}

/// Everything the server provides to the console.
#[derive(Clone)]
pub struct Services {
    /// The fleet.
    pub console: Arc<dyn Console>,
}

/// The console service of this request.
pub fn console() -> Result<Arc<dyn Console>, AppError> {
    leptos::prelude::use_context::<Services>()
        .map(|s| s.console)
        .ok_or_else(|| AppError::Transport("the server provides no console service".to_owned()))
}

/// Awaits `answer`, and on an error sets the response's status to the error's.
pub async fn answer<T>(answer: Answer<'_, T>) -> Result<T, AppError> {
    // Read before the await: the context belongs to the request's owner.
    let options = leptos::prelude::use_context::<leptos_axum::ResponseOptions>();
    let result = answer.await;
    if let Err(e) = &result {
        if let Some(options) = options {
            options.set_status(
                http::StatusCode::from_u16(e.status())
                    .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR),
            );
        }
    }
    result
}
