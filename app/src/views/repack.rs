//! A repack being carried out: its plan and the progress of each step.

use serde::{Deserialize, Serialize};

/// What the repack page is drawn from: the fleet as committed, and the plan the server worked out from it
/// for the page's first ask (as many GPUs as it can), or why there is none. The browser shows that plan as
/// it hydrates and plans again itself only when the operator changes the ask: at ten thousand GPUs a plan
/// takes seconds in the wasm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepackPreview {
    /// The fleet as committed now.
    pub input: placement::RepackInput,
    /// The plan that frees as many GPUs as it can, or why there is none.
    pub most: Result<placement::RepackPlan, String>,
}

/// A repack being carried out, or the last one since the server started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepackRun {
    /// `running`, `done`, `stopped` (an operator stopped it between moves) or `failed`.
    pub state: String,
    /// Who started it.
    pub started_by: String,
    /// The plan it carries out, as planned when it started.
    pub plan: placement::RepackPlan,
    /// Its moves in the order they are made: one at a time, or several at once where units trade places.
    pub steps: Vec<RepackProgress>,
}

/// One step of a repack being carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepackProgress {
    /// The moves made together.
    pub moves: Vec<placement::Move>,
    /// `waiting`, `running`, `done`, `failed` or `stopped`.
    pub status: String,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// A member's share as its measured peak would have it (`placement::rightsize`), for the repack preview
/// to count what right-sized shares would free.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RightSized {
    /// The group.
    pub group: String,
    /// The member (its model).
    pub member: String,
    /// Its share now.
    pub from: placement::BasisPoints,
    /// The share its peak allows, with the margin.
    pub to: placement::BasisPoints,
    /// The holders it is held under, one per machine.
    pub units: Vec<String>,
}
