//! What a plan change restarts, and in what order, so that no GPU of the group is ever overfilled.

use crate::units::BasisPoints;
use serde::{Deserialize, Serialize};

/// A member's committed share.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// The member.
    pub member: String,
    /// Its share of one GPU.
    pub share: BasisPoints,
}

impl Share {
    /// `member` at `share`.
    pub fn new(member: impl Into<String>, share: BasisPoints) -> Share {
        Share {
            member: member.into(),
            share,
        }
    }
}

/// How a member's place in the group changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// A new member.
    Joins,
    /// A member that runs elsewhere now (the router) and moves into this group.
    Moves,
    /// Its share grows.
    Grows {
        /// Before.
        from: BasisPoints,
        /// After.
        to: BasisPoints,
    },
    /// Its share shrinks.
    Shrinks {
        /// Before.
        from: BasisPoints,
        /// After.
        to: BasisPoints,
    },
    /// It leaves the group.
    Leaves,
}

/// A member that restarts (or stops) because of the change. On the wire it speaks as requests do: `kind`
/// in snake_case and shares in percent; `change` (variant labels, basis points) is kept one release,
/// deprecated.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "RestartWire")]
pub struct Restart {
    /// The member.
    pub member: String,
    /// Why.
    pub change: Change,
}

/// One step of a transition. On the wire, `action` (`stop` or `start`), `member` and, for a start,
/// `share_percent`, beside the deprecated `{"Stop": member}` / `{"Start": [member, basis points]}` key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "StepWire", try_from = "StepIn")]
pub enum Step {
    /// Stop the member and wait until its memory is free.
    Stop(String),
    /// Start the member with this share.
    Start(String, BasisPoints),
}

impl Change {
    /// The kind, in snake_case as requests name things.
    pub fn kind(self) -> &'static str {
        match self {
            Change::Joins => "joins",
            Change::Moves => "moves",
            Change::Grows { .. } => "grows",
            Change::Shrinks { .. } => "shrinks",
            Change::Leaves => "leaves",
        }
    }

    /// The shares before and after, for a member that grows or shrinks.
    pub fn shares(self) -> Option<(BasisPoints, BasisPoints)> {
        match self {
            Change::Grows { from, to } | Change::Shrinks { from, to } => Some((from, to)),
            Change::Joins | Change::Moves | Change::Leaves => None,
        }
    }
}

/// How a [`Restart`] is written.
#[derive(Serialize)]
struct RestartWire {
    member: String,
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    from_percent: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    to_percent: Option<f64>,
    /// Deprecated: `kind`, `from_percent` and `to_percent` say the same.
    change: Change,
}

impl From<Restart> for RestartWire {
    fn from(r: Restart) -> RestartWire {
        let shares = r.change.shares();
        RestartWire {
            kind: r.change.kind(),
            from_percent: shares.map(|(from, _)| from.as_percent_f64()),
            to_percent: shares.map(|(_, to)| to.as_percent_f64()),
            change: r.change,
            member: r.member,
        }
    }
}

/// How a [`Step`] is written: the deprecated externally tagged key beside the new fields.
#[derive(Serialize)]
struct StepWire {
    #[serde(rename = "Stop", skip_serializing_if = "Option::is_none")]
    old_stop: Option<String>,
    #[serde(rename = "Start", skip_serializing_if = "Option::is_none")]
    old_start: Option<(String, BasisPoints)>,
    action: &'static str,
    member: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    share_percent: Option<f64>,
}

impl From<Step> for StepWire {
    fn from(step: Step) -> StepWire {
        match step {
            Step::Stop(member) => StepWire {
                old_stop: Some(member.clone()),
                old_start: None,
                action: "stop",
                member,
                share_percent: None,
            },
            Step::Start(member, share) => StepWire {
                old_stop: None,
                old_start: Some((member.clone(), share)),
                action: "start",
                member,
                share_percent: Some(share.as_percent_f64()),
            },
        }
    }
}

/// A [`Step`] as read back: the old key decides, as it is exact (basis points).
#[derive(Deserialize)]
struct StepIn {
    #[serde(rename = "Stop")]
    old_stop: Option<String>,
    #[serde(rename = "Start")]
    old_start: Option<(String, BasisPoints)>,
}

impl TryFrom<StepIn> for Step {
    type Error = &'static str;
    fn try_from(step: StepIn) -> Result<Step, &'static str> {
        match (step.old_stop, step.old_start) {
            (Some(member), None) => Ok(Step::Stop(member)),
            (None, Some((member, share))) => Ok(Step::Start(member, share)),
            _ => Err("a step is either Stop or Start"),
        }
    }
}

/// The restart set of a plan change and the order of its steps.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// Every member that restarts, stops or starts, in plan order.
    pub restarts: Vec<Restart>,
    /// Stops and starts in an order that never puts the group's GPUs over the larger of the two plans.
    pub steps: Vec<Step>,
}

/// The transition from the committed plan `before` to `after`. `moving_in` names members of `after` that now
/// run in another group (the router moving into a new group): they stop there and start here.
///
/// Members whose share shrinks, who leave or who move stop first; shrinking members start again at once
/// (the group now holds less than before); only then do growing members stop and start, and new members
/// start last. At every step the group's GPUs hold at most the larger of the two plans' totals.
pub fn transition(before: &[Share], after: &[Share], moving_in: &[&str]) -> Transition {
    let was = |name: &str| before.iter().find(|s| s.member == name).map(|s| s.share);
    let mut restarts = Vec::new();
    for s in after {
        let change = match was(&s.member) {
            _ if moving_in.contains(&s.member.as_str()) => Change::Moves,
            None => Change::Joins,
            Some(from) if from < s.share => Change::Grows { from, to: s.share },
            Some(from) if from > s.share => Change::Shrinks { from, to: s.share },
            Some(_) => continue,
        };
        restarts.push(Restart {
            member: s.member.clone(),
            change,
        });
    }
    for s in before {
        if !after.iter().any(|a| a.member == s.member) {
            restarts.push(Restart {
                member: s.member.clone(),
                change: Change::Leaves,
            });
        }
    }
    let share_after = |name: &str| {
        after
            .iter()
            .find(|s| s.member == name)
            .map(|s| s.share)
            .unwrap_or_default()
    };
    let with = |pred: fn(&Change) -> bool| restarts.iter().filter(move |r| pred(&r.change));
    let mut steps = Vec::new();
    steps.extend(
        with(|c| matches!(c, Change::Shrinks { .. } | Change::Leaves | Change::Moves))
            .map(|r| Step::Stop(r.member.clone())),
    );
    steps.extend(
        with(|c| matches!(c, Change::Shrinks { .. }))
            .map(|r| Step::Start(r.member.clone(), share_after(&r.member))),
    );
    steps.extend(with(|c| matches!(c, Change::Grows { .. })).flat_map(|r| {
        [
            Step::Stop(r.member.clone()),
            Step::Start(r.member.clone(), share_after(&r.member)),
        ]
    }));
    steps.extend(
        with(|c| matches!(c, Change::Joins | Change::Moves))
            .map(|r| Step::Start(r.member.clone(), share_after(&r.member))),
    );
    Transition { restarts, steps }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn shares(list: &[(&str, u32)]) -> Vec<Share> {
        list.iter()
            .map(|&(m, p)| Share::new(m, BasisPoints::percent(p)))
            .collect()
    }

    fn names(t: &Transition) -> Vec<&str> {
        t.restarts.iter().map(|r| r.member.as_str()).collect()
    }

    #[test]
    fn only_members_whose_share_changed_restart() {
        let t = transition(
            &shares(&[("router", 10), ("glm", 50), ("vision", 30)]),
            &shares(&[("router", 10), ("glm", 40), ("vision", 30)]),
            &[],
        );
        assert_eq!(names(&t), ["glm"]);
        assert_eq!(
            t.steps,
            [
                Step::Stop("glm".into()),
                Step::Start("glm".into(), BasisPoints::percent(40))
            ]
        );
    }

    #[test]
    fn a_new_member_starts_after_the_shrinking_member_restarts() {
        let t = transition(
            &shares(&[("router", 10), ("glm", 60)]),
            &shares(&[("router", 10), ("glm", 40), ("speech", 20)]),
            &[],
        );
        assert_eq!(names(&t), ["glm", "speech"]);
        assert_eq!(
            t.steps,
            [
                Step::Stop("glm".into()),
                Step::Start("glm".into(), BasisPoints::percent(40)),
                Step::Start("speech".into(), BasisPoints::percent(20)),
            ]
        );
    }

    #[test]
    fn shrinking_members_stop_before_any_growing_member_starts() {
        let t = transition(
            &shares(&[("a", 50), ("b", 40)]),
            &shares(&[("a", 30), ("b", 60)]),
            &[],
        );
        let first_grow_start = t
            .steps
            .iter()
            .position(|s| *s == Step::Start("b".into(), BasisPoints::percent(60)))
            .unwrap();
        let shrink_stop = t
            .steps
            .iter()
            .position(|s| *s == Step::Stop("a".into()))
            .unwrap();
        assert!(shrink_stop < first_grow_start);
    }

    #[test]
    fn the_router_moves_into_a_new_group_and_restarts_with_it() {
        let t = transition(&[], &shares(&[("router", 10), ("glm", 50)]), &["router"]);
        assert_eq!(
            t.restarts[0],
            Restart {
                member: "router".into(),
                change: Change::Moves
            }
        );
        assert_eq!(
            t.restarts[1],
            Restart {
                member: "glm".into(),
                change: Change::Joins
            }
        );
        assert_eq!(t.steps[0], Step::Stop("router".into()));
        assert_eq!(
            t.steps.last(),
            Some(&Step::Start("glm".into(), BasisPoints::percent(50)))
        );
    }

    #[test]
    fn a_member_that_leaves_stops_first() {
        let t = transition(&shares(&[("a", 50), ("b", 40)]), &shares(&[("b", 90)]), &[]);
        assert_eq!(t.steps[0], Step::Stop("a".into()));
        assert_eq!(
            t.restarts.iter().find(|r| r.member == "a").unwrap().change,
            Change::Leaves
        );
    }

    fn plan_strategy() -> impl Strategy<Value = Vec<Share>> {
        proptest::collection::btree_map(0u8..8, 1u32..=4000, 0..6).prop_map(|m| {
            m.into_iter()
                .map(|(k, v)| Share::new(format!("m{k}"), BasisPoints(v)))
                .collect()
        })
    }

    proptest! {
        /// Replays the steps against the memory the group holds: it never exceeds what the larger plan needs.
        #[test]
        fn no_step_of_a_restart_order_overfills_a_gpu(before in plan_strategy(), after in plan_strategy()) {
            let sum = |p: &[Share]| p.iter().map(|s| s.share.0).sum::<u32>();
            let limit = sum(&before).max(sum(&after));
            let t = transition(&before, &after, &[]);
            let mut running: BTreeMap<String, u32> = before.iter().map(|s| (s.member.clone(), s.share.0)).collect();
            for step in &t.steps {
                match step {
                    Step::Stop(m) => { prop_assert!(running.remove(m).is_some(), "stopped {m} twice"); }
                    Step::Start(m, share) => { prop_assert!(running.insert(m.clone(), share.0).is_none(), "started {m} twice"); }
                }
                prop_assert!(running.values().sum::<u32>() <= limit);
            }
            let end: BTreeMap<String, u32> = after.iter().map(|s| (s.member.clone(), s.share.0)).collect();
            prop_assert_eq!(running, end);
            for s in &after {
                let unchanged = before.iter().any(|b| b == s);
                prop_assert_eq!(t.restarts.iter().any(|r| r.member == s.member), !unchanged);
            }
        }
    }

    #[test]
    fn a_restart_and_a_step_speak_percent_and_snake_case_beside_the_deprecated_fields() {
        let restart = Restart {
            member: "scribe".into(),
            change: Change::Shrinks {
                from: BasisPoints::percent(40),
                to: BasisPoints::percent(30),
            },
        };
        let json = serde_json::to_value(&restart).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"member": "scribe", "kind": "shrinks", "from_percent": 40.0,
                "to_percent": 30.0, "change": {"Shrinks": {"from": 4000, "to": 3000}}})
        );
        assert_eq!(serde_json::from_value::<Restart>(json).unwrap(), restart);
        let joins = Restart {
            member: "vision".into(),
            change: Change::Joins,
        };
        assert_eq!(
            serde_json::to_value(&joins).unwrap(),
            serde_json::json!({"member": "vision", "kind": "joins", "change": "Joins"})
        );
        let steps = [
            Step::Stop("scribe".into()),
            Step::Start("scribe".into(), BasisPoints(3_333)),
        ];
        let json = serde_json::to_value(&steps).unwrap();
        assert_eq!(
            json,
            serde_json::json!([
                {"Stop": "scribe", "action": "stop", "member": "scribe"},
                {"Start": ["scribe", 3333], "action": "start", "member": "scribe", "share_percent": 33.33}
            ])
        );
        assert_eq!(serde_json::from_value::<Vec<Step>>(json).unwrap(), steps);
    }
}
