//! The verdict on a share plan (seed 003): the members of a sharing group and each one's share of a GPU.

use crate::inventory::GpuRef;
use crate::reason::PendingReason;
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
}

impl PlanMember {
    /// A member with an explicit share, editable.
    pub fn new(name: impl Into<String>, share: BasisPoints) -> PlanMember {
        PlanMember {
            name: name.into(),
            share: Some(share),
            locked: false,
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
    /// The sum of the explicit shares.
    pub total: BasisPoints,
    /// Why the plan is refused; empty when it fits.
    pub problems: Vec<Problem>,
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

/// Judges a plan: every member needs a share above 0, the shares may add up to at most 100 %, and each GPU of
/// the group must offer what the plan needs beside the shared work already on it.
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
    let total: BasisPoints = members.iter().filter_map(|m| m.share).sum();
    if total > BasisPoints::WHOLE {
        problems.push(Problem::OverAccelerator);
    } else {
        for gpu in gpus {
            let needs = gpu.total.share(total);
            let reason = if needs > gpu.offered() {
                Some(PendingReason::OffersTooLittle {
                    gpu: gpu.gpu.clone(),
                    total: gpu.total,
                    held_outside: gpu.held_outside,
                    needs,
                })
            } else if gpu.taken_by_others + needs > gpu.offered() {
                Some(PendingReason::SharedFull {
                    gpu: gpu.gpu.clone(),
                    taken: gpu.taken_by_others,
                    offered: gpu.offered(),
                    needs,
                })
            } else {
                None
            };
            problems.extend(reason.map(Problem::GpuShort));
        }
    }
    Verdict { total, problems }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(shares: &[(&str, Option<u32>)]) -> Vec<PlanMember> {
        shares
            .iter()
            .map(|&(name, pct)| PlanMember {
                name: name.into(),
                share: pct.map(BasisPoints::percent),
                locked: false,
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
}
