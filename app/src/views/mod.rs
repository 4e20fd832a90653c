//! What the console's pages show, as the server sends it, and the requests the pages send back. Plain
//! serde types in the units of `placement`: the server fills them in, the browser only shows them (and
//! judges plans with `placement`).
//!
//! One file per page or family of pages; every type is re-exported here, so `app::views::X` is the one
//! path the server and the pages use.

mod accounts;
mod audit;
mod deploy;
mod groups;
mod machines;
mod models;
mod overview;
mod page;
mod playground;
mod repack;

pub use accounts::{Account, AccountsPage, ApiToken, NewApiToken, TokenLimits, TokenScope};
pub use audit::{AuditLine, AuditQuery, AUDIT_PAGE};
pub use deploy::{
    CatalogEntry, DeployOptions, DeployRequest, EstimateAnswer, EstimateQuery, GpuOption,
    NodeOption, Serving, ServingForm,
};
pub use groups::{ChangeOutcome, GroupPlan, PlanProgress, SharingForm, StepLine, StepState};
pub use machines::{
    GpuCell, GpuDetail, GpuPoint, GpuUse, MachineDetail, MigPlan, NodeModel, NodeRow, NodeSort,
    NodesPage, PendingLine, Sharer, SharingChange, WorkerLine,
};
pub use models::{
    AsleepView, EngineLine, EngineState, LoadState, ModelPage, ModelRow, OnDemand, Replicas,
    ReplicasSaved, ScaleEvent,
};
pub use overview::{Alarm, AlarmKind, Overview};
pub use page::{holds, Page, PER_PAGE};
pub use playground::Playground;
pub use repack::{RepackPreview, RepackProgress, RepackRun, RightSized};
