//! The verdict on a share plan (seed 003): the members of a sharing group and each one's share of a GPU.

use crate::demand::Demand;
use crate::inventory::GpuRef;
use crate::reason::PendingReason;
use crate::restart::Share;
use crate::scale::Autoscale;
use crate::units::{BasisPoints, Bytes};
use serde::{Deserialize, Serialize};

/// The seed's message for a plan over 100 %.
pub const OVER_ACCELERATOR: &str = "The shares add up to more than the accelerator holds.";
/// The seed's message for a member with a share of 0.
pub const NO_SHARE: &str = "A model reserves no share of the accelerator.";
/// The seed's message for a member with no share at all.
pub const NO_EXPLICIT_SHARE: &str =
    "A model has no explicit share, so the planned total cannot include it.";
/// The Free row's warning above 90 %; it does not block.
pub const FREE_ROW_WARNING: &str =
    "More than 90% of the accelerator is shared out: lower a share to leave the engines room for their own overhead.";

/// One member of a sharing group as the plan has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanMember {
    /// The model's name.
    pub name: String,
    /// Its share of one GPU's memory; `None` when the field is empty.
    pub share: Option<BasisPoints>,
    /// A system member (the router): shown, counted, never edited.
    pub locked: bool,
    /// Always loaded, or loaded when asked for.
    #[serde(default)]
    pub demand: Demand,
    /// Replicas that follow its load, each holding its share on one GPU of the group; none: it holds its
    /// share on every GPU of the group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<Autoscale>,
}

impl PlanMember {
    /// A pinned member with an explicit share, editable.
    pub fn new(name: impl Into<String>, share: BasisPoints) -> PlanMember {
        PlanMember {
            name: name.into(),
            share: Some(share),
            locked: false,
            demand: Demand::Pinned,
            replicas: None,
        }
    }
}

/// A GPU the group runs on, with what else holds its memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GroupGpu {
    /// Which GPU.
    pub gpu: GpuRef,
    /// Its memory; shares are percentages of it.
    pub total: Bytes,
    /// Memory held outside Tessera.
    pub held_outside: Bytes,
    /// Memory taken by shared work outside the group.
    pub taken_by_others: Bytes,
}

impl GroupGpu {
    /// `gpu` as a plan of `group` is judged against it: the memory its sharers outside the group take
    /// counts against it (every sharer, for a group not yet started). `sharers` are each sharer's group,
    /// if it is a group's member, and the memory it takes.
    pub fn of<'a>(
        gpu: GpuRef,
        total: Bytes,
        held_outside: Bytes,
        sharers: impl IntoIterator<Item = (Option<&'a str>, Bytes)>,
        group: Option<&str>,
    ) -> GroupGpu {
        GroupGpu {
            gpu,
            total,
            held_outside,
            taken_by_others: sharers
                .into_iter()
                .filter(|(of, _)| group.is_none() || *of != group)
                .map(|(_, bytes)| bytes)
                .sum(),
        }
    }

    /// What the GPU offers: its total less what is held outside.
    pub fn offered(&self) -> Bytes {
        self.total.saturating_sub(self.held_outside)
    }
}

/// One reason a plan is refused, naming the member it is about where there is one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Problem {
    /// The shares add up to more than 100 %.
    OverAccelerator,
    /// A member's share is 0.
    NoShare {
        /// The member.
        member: String,
    },
    /// A member has no share.
    NoExplicitShare {
        /// The member.
        member: String,
    },
    /// A GPU of the group does not offer what the plan needs, in seed 000's words.
    GpuShort(PendingReason),
}

impl Problem {
    /// The sentence the panel states, as the seeds word it.
    pub fn message(&self) -> String {
        match self {
            Problem::OverAccelerator => OVER_ACCELERATOR.to_owned(),
            Problem::NoShare { .. } => NO_SHARE.to_owned(),
            Problem::NoExplicitShare { .. } => NO_EXPLICIT_SHARE.to_owned(),
            Problem::GpuShort(reason) => reason.to_string(),
        }
    }

    /// The member the problem is about, if it is about one.
    pub fn member(&self) -> Option<&str> {
        match self {
            Problem::NoShare { member } | Problem::NoExplicitShare { member } => Some(member),
            Problem::OverAccelerator | Problem::GpuShort(_) => None,
        }
    }
}

/// The verdict on a share plan: refused when it has problems; otherwise it fits, perhaps with a warning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    /// The most the plan holds at once: the pinned shares, and the largest on-demand one (they take turns).
    /// With every member pinned, the sum of the explicit shares.
    pub total: BasisPoints,
    /// What the pinned members leave of one accelerator, when some members are on demand: they take
    /// turns in it.
    #[serde(default)]
    pub turns: Option<BasisPoints>,
    /// Why the plan is refused; empty when it fits.
    pub problems: Vec<Problem>,
    /// Members whose most replicas the group's GPUs cannot all hold now: a warning, not a refusal (the
    /// replicas beyond the room wait for it).
    #[serde(default)]
    pub waits: Vec<ReplicasWait>,
}

/// A member with replicas of which fewer than its most fit on the group's GPUs beside the rest of the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicasWait {
    /// The member.
    pub member: String,
    /// How many of its replicas fit now.
    pub fit: u32,
    /// Its most replicas.
    pub max: u32,
    /// Why each GPU that holds none of them cannot, in seed 000's words.
    pub reasons: Vec<PendingReason>,
}

impl ReplicasWait {
    /// `vision: 1 of its 2 replicas fits now; the other one waits for room: GPU 0 of west: 70 of 80 GB
    /// taken by shared work; it needs 24`.
    pub fn message(&self) -> String {
        let reasons: Vec<String> = self.reasons.iter().map(ToString::to_string).collect();
        if self.fit == 0 {
            let none = if self.max == 1 {
                "its replica does not fit now beside the others; it waits".to_owned()
            } else {
                format!(
                    "none of its {} replicas fits now beside the others; they wait",
                    self.max
                )
            };
            return format!("{}: {none} for room: {}", self.member, reasons.join("; "));
        }
        let rest = self.max - self.fit;
        format!(
            "{}: {} of its {} replicas {} now; {} for room: {}",
            self.member,
            self.fit,
            self.max,
            if self.fit == 1 { "fits" } else { "fit" },
            if rest == 1 {
                "the other one waits".to_owned()
            } else {
                format!("the other {rest} wait")
            },
            reasons.join("; ")
        )
    }
}

impl Verdict {
    /// Whether Deploy and Save are unavailable.
    pub fn is_refused(&self) -> bool {
        !self.problems.is_empty()
    }

    /// Whether the Free row warns (over 90 %, not refused). It does not block.
    pub fn warns(&self) -> bool {
        !self.is_refused() && self.total > BasisPoints::WARN_ABOVE
    }

    /// What is left of one accelerator.
    pub fn free(&self) -> BasisPoints {
        self.total.free()
    }

    /// The panel's line of its own when some members are on demand: `On-demand models take turns in the
    /// 30% the pinned ones leave.`
    pub fn turns_message(&self) -> Option<String> {
        self.turns
            .map(|left| format!("On-demand models take turns in the {left} the pinned ones leave."))
    }

    /// The line under the bar when the plan fits: `The shares add up to 85% of one accelerator, which fits.`
    pub fn fits_message(&self) -> Option<String> {
        (!self.is_refused()).then(|| {
            format!(
                "The shares add up to {} of one accelerator, which fits.",
                self.total
            )
        })
    }
}

/// Judges a plan: every member needs a share above 0; the pinned shares, with each on-demand share on its own
/// (on-demand models take turns), may add up to at most 100 %; and each GPU of the group must offer what
/// the plan holds at most beside the shared work already on it. A member with replicas holds its share on
/// the GPUs its replicas run on, not on every one: every such member's most replicas are placed where they
/// would run, best fit first, beside the members without replicas; fewer than its most fitting is a
/// warning ([`ReplicasWait`]: the rest wait for room), and a member one replica of which could not run on
/// any GPU of the group, whatever the other replicas do, is refused (it could never serve).
pub fn judge(members: &[PlanMember], gpus: &[GroupGpu]) -> Verdict {
    let mut problems = Vec::new();
    for member in members {
        match member.share {
            None => problems.push(Problem::NoExplicitShare {
                member: member.name.clone(),
            }),
            Some(BasisPoints::ZERO) => problems.push(Problem::NoShare {
                member: member.name.clone(),
            }),
            Some(_) => {}
        }
    }
    let pinned: BasisPoints = members
        .iter()
        .filter(|m| !m.demand.is_on_demand() && m.replicas.is_none())
        .filter_map(|m| m.share)
        .sum();
    let largest_turn = members
        .iter()
        .filter(|m| m.demand.is_on_demand())
        .map(|m| m.share.unwrap_or_default())
        .max();
    let largest_replica = members
        .iter()
        .filter(|m| m.replicas.is_some())
        .filter_map(|m| m.share)
        .max()
        .unwrap_or_default();
    // What every GPU of the group holds: the members without replicas, and the largest turn.
    let everywhere = pinned + largest_turn.unwrap_or_default();
    // The most the replicas put on one GPU of the group.
    let mut replicas_on_one = largest_replica;
    let mut waits = Vec::new();
    if everywhere + largest_replica > BasisPoints::WHOLE {
        problems.push(Problem::OverAccelerator);
    } else {
        let mut taken: Vec<Bytes> = Vec::with_capacity(gpus.len());
        for gpu in gpus {
            let needs = gpu.total.share(everywhere);
            problems.extend(short(gpu, gpu.taken_by_others, needs).map(Problem::GpuShort));
            taken.push(gpu.taken_by_others + needs);
        }
        if problems.is_empty() {
            let beside_everywhere = taken.clone();
            let placed = place_replicas(members, gpus, &mut taken);
            replicas_on_one = replicas_on_one.max(placed.most_on_one);
            for wait in placed.waits {
                let share = members
                    .iter()
                    .find(|m| m.name == wait.member)
                    .and_then(|m| m.share)
                    .unwrap_or_default();
                // Where no GPU could hold one of its replicas even with no other replica there, it
                // could never serve.
                let never: Vec<PendingReason> = gpus
                    .iter()
                    .zip(&beside_everywhere)
                    .map_while(|(gpu, &taken)| short(gpu, taken, gpu.total.share(share)))
                    .collect();
                if never.len() == gpus.len() && !gpus.is_empty() {
                    problems.extend(never.into_iter().map(Problem::GpuShort));
                } else {
                    waits.push(wait);
                }
            }
        }
    }
    Verdict {
        total: everywhere + replicas_on_one,
        turns: largest_turn.map(|_| (pinned + replicas_on_one).free()),
        problems,
        waits,
    }
}

/// Why `gpu`, with `taken` of it taken by shared work, cannot hold `needs` more; `None` when it can.
fn short(gpu: &GroupGpu, taken: Bytes, needs: Bytes) -> Option<PendingReason> {
    if needs > gpu.offered() {
        Some(PendingReason::OffersTooLittle {
            gpu: gpu.gpu.clone(),
            total: gpu.total,
            held_outside: gpu.held_outside,
            needs,
        })
    } else if taken + needs > gpu.offered() {
        Some(PendingReason::SharedFull {
            gpu: gpu.gpu.clone(),
            taken,
            offered: gpu.offered(),
            needs,
        })
    } else {
        None
    }
}

/// The replicas of a plan as [`place_replicas`] placed them.
struct Placed {
    /// The members holding fewer than their most, with why each GPU that holds none of theirs cannot.
    waits: Vec<ReplicasWait>,
    /// The most the replicas put on one GPU, as a share of it.
    most_on_one: BasisPoints,
}

/// Places the replicas of `members` that have them, one on each GPU, best fit first (the GPU left with the
/// least room), adding what each takes to `taken`: in rounds, each member's first replica before any
/// member's second, so that one member's most does not leave another none.
fn place_replicas(members: &[PlanMember], gpus: &[GroupGpu], taken: &mut [Bytes]) -> Placed {
    let scaled: Vec<(&PlanMember, BasisPoints, u32)> = members
        .iter()
        .filter_map(|m| Some((m, m.share?, m.replicas?.max())))
        .collect();
    let mut on: Vec<Vec<bool>> = vec![vec![false; gpus.len()]; scaled.len()];
    let mut shares_on = vec![BasisPoints::ZERO; gpus.len()];
    let mut full = vec![false; scaled.len()];
    let rounds = scaled.iter().map(|&(_, _, max)| max).max().unwrap_or(0);
    for round in 0..rounds {
        for (s, &(_, share, max)) in scaled.iter().enumerate() {
            if full[s] || round >= max {
                continue;
            }
            let best = gpus
                .iter()
                .enumerate()
                .filter(|&(i, gpu)| {
                    !on[s][i] && short(gpu, taken[i], gpu.total.share(share)).is_none()
                })
                .min_by_key(|&(i, gpu)| (gpu.offered() - taken[i] - gpu.total.share(share), i));
            match best {
                Some((i, gpu)) => {
                    on[s][i] = true;
                    taken[i] += gpu.total.share(share);
                    shares_on[i] = shares_on[i] + share;
                }
                None => full[s] = true,
            }
        }
    }
    let waits = scaled
        .iter()
        .zip(&on)
        .filter_map(|(&(member, share, max), on)| {
            let fit = on.iter().filter(|&&b| b).count() as u32;
            (fit < max).then(|| ReplicasWait {
                member: member.name.clone(),
                fit,
                max,
                reasons: gpus
                    .iter()
                    .enumerate()
                    .filter(|&(i, _)| !on[i])
                    .filter_map(|(i, gpu)| short(gpu, taken[i], gpu.total.share(share)))
                    .collect(),
            })
        })
        .collect();
    Placed {
        waits,
        most_on_one: shares_on.into_iter().max().unwrap_or_default(),
    }
}

/// The members whose engines run before a change from `before` to `after`, and after it, with their shares
/// (for [`crate::transition`]): every member but an on-demand one in `unloaded`; after the change, an
/// on-demand member only if it ran before (one that stays on demand keeps its engine, and one turned
/// on-demand keeps it until its keep-alive runs out); a new on-demand member waits for its first request.
pub fn running(
    before: &[PlanMember],
    unloaded: &[String],
    after: &[PlanMember],
) -> (Vec<Share>, Vec<Share>) {
    let share = |m: &PlanMember| Share::new(&m.name, m.share.unwrap_or_default());
    let ran =
        |name: &str| before.iter().any(|m| m.name == name) && !unloaded.iter().any(|u| u == name);
    (
        before.iter().filter(|m| ran(&m.name)).map(share).collect(),
        after
            .iter()
            .filter(|m| !m.demand.is_on_demand() || ran(&m.name))
            .map(share)
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demand::KeepAlive;

    fn plan(shares: &[(&str, Option<u32>)]) -> Vec<PlanMember> {
        shares
            .iter()
            .map(|&(name, pct)| PlanMember {
                name: name.into(),
                share: pct.map(BasisPoints::percent),
                locked: false,
                demand: Demand::Pinned,
                replicas: None,
            })
            .collect()
    }

    fn gpu96() -> GroupGpu {
        GroupGpu {
            gpu: GpuRef::new("atlas", 0),
            total: Bytes::gb(96),
            held_outside: Bytes::ZERO,
            taken_by_others: Bytes::ZERO,
        }
    }

    #[test]
    fn a_plan_that_fits_says_its_total() {
        let v = judge(
            &plan(&[
                ("semantic-router", Some(10)),
                ("glm", Some(50)),
                ("vision", Some(25)),
            ]),
            &[gpu96()],
        );
        assert!(!v.is_refused());
        assert!(!v.warns());
        assert_eq!(
            v.fits_message().unwrap(),
            "The shares add up to 85% of one accelerator, which fits."
        );
        assert_eq!(v.free(), BasisPoints::percent(15));
    }

    #[test]
    fn shares_over_one_hundred_percent_are_refused() {
        let v = judge(&plan(&[("a", Some(60)), ("b", Some(41))]), &[gpu96()]);
        assert_eq!(v.problems, [Problem::OverAccelerator]);
        assert_eq!(
            v.problems[0].message(),
            "The shares add up to more than the accelerator holds."
        );
        assert_eq!(v.fits_message(), None);
    }

    #[test]
    fn exactly_one_hundred_percent_fits_with_a_warning() {
        let members = ["33.33", "33.33", "33.34"]
            .iter()
            .enumerate()
            .map(|(i, s)| {
                PlanMember::new(
                    format!("m{i}"),
                    BasisPoints::parse_percent(s).unwrap().unwrap(),
                )
            })
            .collect::<Vec<_>>();
        let v = judge(&members, &[gpu96()]);
        assert!(!v.is_refused());
        assert!(v.warns());
        assert_eq!(
            v.fits_message().unwrap(),
            "The shares add up to 100% of one accelerator, which fits."
        );
    }

    #[test]
    fn a_share_of_zero_is_refused_and_names_its_member() {
        let v = judge(&plan(&[("a", Some(30)), ("vision", Some(0))]), &[gpu96()]);
        assert_eq!(
            v.problems,
            [Problem::NoShare {
                member: "vision".into()
            }]
        );
        assert_eq!(
            v.problems[0].message(),
            "A model reserves no share of the accelerator."
        );
        assert_eq!(v.problems[0].member(), Some("vision"));
    }

    #[test]
    fn a_member_without_a_share_is_refused_and_named() {
        let v = judge(&plan(&[("a", Some(30)), ("speech", None)]), &[gpu96()]);
        assert_eq!(
            v.problems,
            [Problem::NoExplicitShare {
                member: "speech".into()
            }]
        );
        assert_eq!(
            v.problems[0].message(),
            "A model has no explicit share, so the planned total cannot include it."
        );
    }

    #[test]
    fn over_ninety_percent_warns_on_the_free_row_but_does_not_block() {
        let v = judge(&plan(&[("a", Some(60)), ("b", Some(31))]), &[gpu96()]);
        assert!(!v.is_refused());
        assert!(v.warns());
        let at_ninety = judge(&plan(&[("a", Some(60)), ("b", Some(30))]), &[gpu96()]);
        assert!(!at_ninety.warns());
    }

    #[test]
    fn a_plan_is_checked_against_what_each_gpu_offers() {
        let majin = GroupGpu {
            gpu: GpuRef::new("majin", 0),
            total: Bytes::gb(8),
            held_outside: Bytes::gb(1),
            taken_by_others: Bytes::ZERO,
        };
        // 90 % of 8 GB is 7.2 GB, more than the 7 GB it offers.
        let v = judge(
            &plan(&[("a", Some(50)), ("b", Some(40))]),
            std::slice::from_ref(&majin),
        );
        assert_eq!(v.problems.len(), 1);
        assert_eq!(
            v.problems[0].message(),
            "GPU 0 of majin offers 7 of its 8 GB (1 GB held outside Tessera); it needs 7.2"
        );
        let busy = GroupGpu {
            taken_by_others: Bytes::from_gb(6.5).unwrap(),
            ..majin
        };
        let v = judge(&plan(&[("a", Some(10)), ("b", Some(10))]), &[busy]);
        assert_eq!(
            v.problems[0].message(),
            "GPU 0 of majin: 6.5 of 7 GB taken by shared work; it needs 1.6"
        );
    }

    fn on_demand(name: &str, pct: u32) -> PlanMember {
        PlanMember {
            demand: Demand::OnDemand {
                keep_alive: crate::demand::KeepAlive::DEFAULT,
            },
            ..PlanMember::new(name, BasisPoints::percent(pct))
        }
    }

    #[test]
    fn on_demand_models_take_turns_in_what_the_pinned_ones_leave() {
        // 70 % pinned; 25 % and 30 % on demand: each fits beside the pinned ones on its own.
        let members = [
            PlanMember::new("glm", BasisPoints::percent(60)),
            PlanMember::new("router", BasisPoints::percent(10)),
            on_demand("vision", 25),
            on_demand("speech", 30),
        ];
        let v = judge(&members, &[gpu96()]);
        assert!(!v.is_refused());
        assert_eq!(v.total, BasisPoints::percent(100));
        assert_eq!(
            v.turns_message().unwrap(),
            "On-demand models take turns in the 30% the pinned ones leave."
        );
        assert_eq!(
            v.fits_message().unwrap(),
            "The shares add up to 100% of one accelerator, which fits."
        );
        assert_eq!(judge(&members[..2], &[gpu96()]).turns_message(), None);
    }

    #[test]
    fn an_on_demand_share_that_does_not_fit_beside_the_pinned_ones_is_refused() {
        let members = [
            PlanMember::new("glm", BasisPoints::percent(70)),
            on_demand("vision", 25),
            on_demand("speech", 31),
        ];
        let v = judge(&members, &[gpu96()]);
        assert_eq!(v.problems, [Problem::OverAccelerator]);
        assert_eq!(
            v.problems[0].message(),
            "The shares add up to more than the accelerator holds."
        );
    }

    #[test]
    fn a_gpu_must_offer_the_pinned_shares_and_the_largest_turn() {
        let busy = GroupGpu {
            taken_by_others: Bytes::gb(24),
            ..gpu96()
        };
        // 50 % pinned and a 30 % turn: 76.8 GB beside the 24 taken, on a 96 GB GPU.
        let members = [
            PlanMember::new("glm", BasisPoints::percent(50)),
            on_demand("vision", 30),
            on_demand("speech", 20),
        ];
        let v = judge(&members, std::slice::from_ref(&busy));
        assert_eq!(
            v.problems[0].message(),
            "GPU 0 of atlas: 24 of 96 GB taken by shared work; it needs 76.8"
        );
        let fits = judge(&members[..1], &[busy]);
        assert!(!fits.is_refused());
    }

    #[test]
    fn an_on_demand_member_without_a_share_is_named_as_any_other() {
        let mut speech = on_demand("speech", 10);
        speech.share = None;
        let v = judge(&[speech], &[gpu96()]);
        assert_eq!(
            v.problems,
            [Problem::NoExplicitShare {
                member: "speech".into()
            }]
        );
    }

    #[test]
    fn every_problem_is_listed_in_member_order() {
        let v = judge(&plan(&[("a", None), ("b", Some(0)), ("c", Some(120))]), &[]);
        assert_eq!(
            v.problems,
            [
                Problem::NoExplicitShare { member: "a".into() },
                Problem::NoShare { member: "b".into() },
                Problem::OverAccelerator
            ]
        );
    }

    #[test]
    fn only_engines_that_run_restart_when_a_plan_changes() {
        let on = |name: &str, pct: u32| PlanMember {
            demand: Demand::OnDemand {
                keep_alive: KeepAlive::DEFAULT,
            },
            ..PlanMember::new(name, BasisPoints::percent(pct))
        };
        let pinned = |name: &str, pct: u32| PlanMember::new(name, BasisPoints::percent(pct));
        let before = [
            pinned("glm", 50),
            on("vision", 20),
            on("speech", 20),
            pinned("embed", 10),
        ];
        // vision is not loaded; speech is. embed turns on-demand; a new on-demand member joins.
        let after = [
            pinned("glm", 50),
            on("vision", 25),
            on("speech", 25),
            on("embed", 10),
            on("rerank", 5),
        ];
        let (was, will) = running(&before, &["vision".to_owned()], &after);
        let names = |s: &[Share]| s.iter().map(|s| s.member.clone()).collect::<Vec<_>>();
        assert_eq!(names(&was), ["glm", "speech", "embed"]);
        assert_eq!(names(&will), ["glm", "speech", "embed"]);
        let restarts = crate::transition(&was, &will, &[]).restarts;
        assert_eq!(
            restarts
                .iter()
                .map(|r| r.member.as_str())
                .collect::<Vec<_>>(),
            ["speech"]
        );
    }

    /// Three 80 GB GPUs of east; GPU 2 with 70 GB taken by another group's work.
    fn three_of_east() -> Vec<GroupGpu> {
        (0..3)
            .map(|i| GroupGpu {
                gpu: GpuRef::new("east", i),
                total: Bytes::gb(80),
                held_outside: Bytes::ZERO,
                taken_by_others: if i == 2 { Bytes::gb(70) } else { Bytes::ZERO },
            })
            .collect()
    }

    fn with_replicas(name: &str, pct: u32, min: u32, max: u32) -> PlanMember {
        PlanMember {
            replicas: Some(Autoscale::new(min, max).unwrap()),
            ..PlanMember::new(name, BasisPoints::percent(pct))
        }
    }

    #[test]
    fn a_member_with_replicas_holds_its_share_only_where_they_would_run_so_a_busy_gpu_refuses_it_no_longer(
    ) {
        // glm holds 10 % (8 GB) of each GPU: GPU 2 has room for it (70 + 8 of 80), not for a 30 % replica.
        let members = [
            PlanMember::new("glm", BasisPoints::percent(10)),
            with_replicas("vision", 30, 1, 2),
        ];
        let v = judge(&members, &three_of_east());
        assert!(!v.is_refused(), "{:?}", v.problems);
        assert!(v.waits.is_empty(), "two replicas fit on GPUs 0 and 1");
        assert_eq!(v.total, BasisPoints::percent(40));
        // The same share on every GPU, without replicas, is refused on GPU 2.
        let everywhere = judge(
            &[
                members[0].clone(),
                PlanMember::new("vision", BasisPoints::percent(30)),
            ],
            &three_of_east(),
        );
        assert_eq!(
            everywhere.problems[0].message(),
            "GPU 2 of east: 70 of 80 GB taken by shared work; it needs 32"
        );
    }

    #[test]
    fn fewer_gpus_with_room_than_a_member_s_most_replicas_is_warned_not_refused_saying_why_the_rest_wait(
    ) {
        let members = [
            PlanMember::new("glm", BasisPoints::percent(10)),
            with_replicas("vision", 30, 1, 3),
        ];
        let v = judge(&members, &three_of_east());
        assert!(!v.is_refused());
        assert_eq!(
            v.waits.iter().map(ReplicasWait::message).collect::<Vec<_>>(),
            ["vision: 2 of its 3 replicas fit now; the other one waits for room: GPU 2 of east: 78 of 80 GB taken by shared work; it needs 24"]
        );
    }

    #[test]
    fn each_member_s_first_replica_is_placed_before_any_member_s_second() {
        // Two GPUs with 30 GB taken: one 40 % (32 GB) replica fits beside it, not two.
        let gpus: Vec<GroupGpu> = three_of_east()[..2]
            .iter()
            .map(|g| GroupGpu {
                taken_by_others: Bytes::gb(30),
                ..g.clone()
            })
            .collect();
        let members = [
            with_replicas("vision", 40, 1, 2),
            with_replicas("speech", 40, 1, 2),
        ];
        let v = judge(&members, &gpus);
        assert!(!v.is_refused(), "{:?}", v.problems);
        assert_eq!(
            v.waits.iter().map(ReplicasWait::message).collect::<Vec<_>>(),
            [
                "vision: 1 of its 2 replicas fits now; the other one waits for room: GPU 1 of east: 62 of 80 GB taken by shared work; it needs 32",
                "speech: 1 of its 2 replicas fits now; the other one waits for room: GPU 0 of east: 62 of 80 GB taken by shared work; it needs 32",
            ]
        );
    }

    #[test]
    fn members_with_replicas_whose_shares_add_up_past_one_gpu_fit_where_each_runs_on_a_gpu_of_its_own(
    ) {
        let members = [
            with_replicas("vision", 60, 1, 1),
            with_replicas("speech", 60, 1, 1),
        ];
        let v = judge(&members, &three_of_east()[..2]);
        assert!(!v.is_refused(), "{:?}", v.problems);
        assert!(v.waits.is_empty());
        assert_eq!(v.total, BasisPoints::percent(60), "the most on one GPU");
        // Each on every GPU, they would not fit.
        let pinned = [
            PlanMember::new("vision", BasisPoints::percent(60)),
            PlanMember::new("speech", BasisPoints::percent(60)),
        ];
        assert_eq!(
            judge(&pinned, &three_of_east()[..2]).problems,
            [Problem::OverAccelerator]
        );
        // One replica past what a GPU holds beside the members without replicas never fits.
        let too_big = [
            PlanMember::new("glm", BasisPoints::percent(50)),
            with_replicas("vision", 60, 0, 1),
        ];
        assert_eq!(
            judge(&too_big, &three_of_east()[..2]).problems,
            [Problem::OverAccelerator]
        );
    }

    #[test]
    fn a_member_whose_replicas_the_others_take_the_room_of_is_warned_not_refused_where_one_could_run_alone(
    ) {
        // Two 80 GB GPUs, five models of 50 % with a min of 0 and a most of 1: four run at once, packed
        // two to a GPU (best fit), and the fifth waits for one of them to stop.
        let members: Vec<PlanMember> = ["a", "b", "c", "d", "e"]
            .iter()
            .map(|name| with_replicas(name, 50, 0, 1))
            .collect();
        let v = judge(&members, &three_of_east()[..2]);
        assert!(!v.is_refused(), "{:?}", v.problems);
        assert_eq!(v.total, BasisPoints::percent(100));
        assert_eq!(
            v.waits.iter().map(ReplicasWait::message).collect::<Vec<_>>(),
            ["e: its replica does not fit now beside the others; it waits for room: GPU 0 of east: 80 of 80 GB taken by shared work; it needs 40; GPU 1 of east: 80 of 80 GB taken by shared work; it needs 40"]
        );
    }

    #[test]
    fn a_member_none_of_whose_replicas_fit_is_refused_with_each_gpu_s_reason() {
        let busy: Vec<GroupGpu> = three_of_east()
            .into_iter()
            .map(|g| GroupGpu {
                taken_by_others: Bytes::gb(60),
                ..g
            })
            .collect();
        let v = judge(&[with_replicas("vision", 30, 1, 3)], &busy);
        assert!(v.is_refused());
        assert_eq!(
            v.problems.iter().map(Problem::message).collect::<Vec<_>>(),
            (0..3)
                .map(|i| format!("GPU {i} of east: 60 of 80 GB taken by shared work; it needs 24"))
                .collect::<Vec<_>>()
        );
    }
}
