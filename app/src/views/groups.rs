//! Sharing groups: a group's committed plan, the form that changes it, what a committed change does and
//! how the plan change is carried out step by step.

use placement::{GpuRef, GroupGpu, PlanMember};
use serde::{Deserialize, Serialize};

/// Where a step of a plan change is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StepState {
    /// Not begun.
    Waiting,
    /// Under way.
    Running,
    /// Done.
    Done,
    /// A start that did not become healthy.
    Failed,
}

/// One stop or start of a plan change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepLine {
    /// `stop` or `start`.
    pub action: String,
    /// The member.
    pub member: String,
    /// Where it is.
    pub state: StepState,
    /// Why it failed.
    pub message: Option<String>,
}

impl StepLine {
    /// `Stop glm-5.3: done`, `Start vision: failed: …`.
    pub fn text(&self) -> String {
        let action = match self.action.as_str() {
            "stop" => "Stop",
            _ => "Start",
        };
        let state = match self.state {
            StepState::Waiting => "waiting",
            StepState::Running => "under way",
            StepState::Done => "done",
            StepState::Failed => "failed",
        };
        match &self.message {
            Some(why) => format!("{action} {}: {state}: {why}", self.member),
            None => format!("{action} {}: {state}", self.member),
        }
    }
}

/// A group's last plan change, while it is carried out or when a step failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanProgress {
    /// The group.
    pub group: String,
    /// The revision being carried out.
    pub revision: i64,
    /// Its steps in order.
    pub steps: Vec<StepLine>,
}

impl PlanProgress {
    /// Whether a step is still to be done.
    pub fn is_underway(&self) -> bool {
        self.steps
            .iter()
            .any(|s| matches!(s.state, StepState::Waiting | StepState::Running))
    }

    /// The heading: `Restarting text-router (revision 4)`, `Starting text-router` where nothing ran before
    /// (only starts), or that a step failed.
    pub fn heading(&self) -> String {
        let first = self.steps.iter().all(|s| s.action != "stop");
        let failed = self.steps.iter().any(|s| s.state == StepState::Failed);
        match (first, failed) {
            (true, false) => format!("Starting {}", self.group),
            (true, true) => format!("Starting {} failed", self.group),
            (false, false) => format!("Restarting {} (revision {})", self.group, self.revision),
            (false, true) => format!(
                "A restart of {} (revision {}) failed",
                self.group, self.revision
            ),
        }
    }
}

/// A sharing group's committed plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupPlan {
    /// Its name.
    pub name: String,
    /// The revision a change must name.
    pub revision: i64,
    /// The GPUs it runs on.
    pub gpus: Vec<GpuRef>,
    /// Its members with their shares; the router locked.
    pub members: Vec<PlanMember>,
    /// Its on-demand members that are not loaded now: they run no engine, so a change restarts none.
    #[serde(default)]
    pub unloaded: Vec<String>,
}

impl GroupPlan {
    /// The members whose engines run before a change to `after`, and after it (`placement::running`).
    pub fn running(&self, after: &[PlanMember]) -> (Vec<placement::Share>, Vec<placement::Share>) {
        placement::running(&self.members, &self.unloaded, after)
    }
}

/// What a committed change does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeOutcome {
    /// The group it changed, if any.
    pub group: Option<String>,
    /// The models that restart, stop or start, in plan order.
    pub restarts: Vec<String>,
    /// The Free row's warning, when the committed plan is over 90 %.
    pub warning: Option<String>,
}

/// The GPU sharing form of a running model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharingForm {
    /// The model the form was opened for.
    pub model: String,
    /// Its group's committed plan.
    pub group: GroupPlan,
    /// The group's GPUs with what else holds them.
    pub gpus: Vec<GroupGpu>,
    /// What runs each member (`vllm`, `sglang`, `llamacpp`, `command`): its estimate speaks its words.
    #[serde(default)]
    pub engines: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(action: &str, state: StepState) -> StepLine {
        StepLine {
            action: action.into(),
            member: "vision".into(),
            state,
            message: None,
        }
    }

    #[test]
    fn a_change_that_only_starts_engines_is_a_start_not_a_restart_of_revision_1() {
        let mut change = PlanProgress {
            group: "text-router".into(),
            revision: 1,
            steps: vec![step("start", StepState::Running)],
        };
        assert_eq!(change.heading(), "Starting text-router");
        change.steps[0].state = StepState::Failed;
        assert_eq!(change.heading(), "Starting text-router failed");
        change.revision = 3;
        change.steps = vec![
            step("stop", StepState::Done),
            step("start", StepState::Running),
        ];
        assert_eq!(change.heading(), "Restarting text-router (revision 3)");
        change.steps[1].state = StepState::Failed;
        assert_eq!(
            change.heading(),
            "A restart of text-router (revision 3) failed"
        );
    }
}
