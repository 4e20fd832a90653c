//! The Shared GPU memory panel's form state, apart from any component so that it can be tested plainly.

use placement::scale::Autoscale;
use placement::{
    judge, BasisPoints, Bytes, Demand, GroupGpu, KeepAlive, PlanMember, ReplicasWait, Verdict,
};

/// One member's row: its name, the text in its share field, whether the field is locked (the router), and
/// whether it loads on demand, with the keep-alive field's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShareRow {
    /// The member's name.
    pub name: String,
    /// What the share field holds, as typed.
    pub text: String,
    /// A system member: shown and counted, never edited.
    pub locked: bool,
    /// Loaded when a request asks for it, rather than always.
    pub on_demand: bool,
    /// What the keep-alive field holds, in seconds, as typed.
    pub keep_alive: String,
    /// The member's memory estimate, once the estimate panel has read it: the bar marks it on the
    /// member's segment, and the row turns amber while its share is below it.
    pub estimate: Option<Bytes>,
    /// Its replicas, where it has them: the verdict counts its most where they would run.
    pub replicas: Option<Autoscale>,
}

impl ShareRow {
    /// A row opening on the member's share and demand of today.
    pub fn from_member(member: &PlanMember) -> ShareRow {
        ShareRow {
            name: member.name.clone(),
            text: member
                .share
                .map(BasisPoints::percent_text)
                .unwrap_or_default(),
            locked: member.locked,
            on_demand: member.demand.is_on_demand(),
            keep_alive: member
                .demand
                .keep_alive()
                .unwrap_or_default()
                .secs()
                .to_string(),
            estimate: None,
            replicas: member.replicas,
        }
    }

    /// Whether its share, on a GPU of `gpu_total`, is below its estimate.
    pub fn below_estimate(&self, gpu_total: Bytes) -> bool {
        match (self.member().share, self.estimate) {
            (Some(share), Some(estimate)) => gpu_total.share(share) < estimate,
            _ => false,
        }
    }

    /// What is wrong with the field's text, if it is not a share at all.
    pub fn field_error(&self) -> Option<String> {
        BasisPoints::parse_percent(&self.text)
            .err()
            .map(|e| format!("This share {e}."))
    }

    /// What is wrong with the keep-alive field of an on-demand row, if anything.
    pub fn keep_alive_error(&self) -> Option<String> {
        if !self.on_demand {
            return None;
        }
        KeepAlive::parse(&self.keep_alive).err().map(|e| {
            let e = e.to_string();
            let mut chars = e.chars();
            let first = chars.next().map(|c| c.to_ascii_uppercase());
            format!(
                "{}{}.",
                first.into_iter().collect::<String>(),
                chars.as_str()
            )
        })
    }

    /// The member as the plan has it. A field that does not hold a share gives no explicit share; a
    /// keep-alive field that holds none gives the default (its error keeps the form from being sent).
    pub fn member(&self) -> PlanMember {
        PlanMember {
            name: self.name.clone(),
            share: BasisPoints::parse_percent(&self.text).ok().flatten(),
            locked: self.locked,
            demand: if self.on_demand {
                Demand::OnDemand {
                    keep_alive: KeepAlive::parse(&self.keep_alive).unwrap_or_default(),
                }
            } else {
                Demand::Pinned
            },
            replicas: self.replicas,
        }
    }
}

/// The plan the rows describe.
pub fn plan(rows: &[ShareRow]) -> Vec<PlanMember> {
    rows.iter().map(ShareRow::member).collect()
}

/// What a plan change does to each member's share, in words, as the confirmation shows it:
/// `glm-5.3 40% → 55% (38.4 → 52.8 GB)`, `vision joins at 25% (24 GB)`, `speech leaves`; on demand and
/// back as `speech: on demand`, `speech: always loaded`. Members that keep their share and demand are not
/// named.
pub fn change_lines(before: &[PlanMember], after: &[PlanMember], gpu_total: Bytes) -> Vec<String> {
    let gb = |share: BasisPoints| gpu_total.share(share).gb_text();
    let mut lines = Vec::new();
    for member in after {
        let was = before.iter().find(|b| b.name == member.name);
        match (was.and_then(|b| b.share), member.share) {
            (Some(from), Some(to)) if from != to => lines.push(format!(
                "{} {from} → {to} ({} → {} GB)",
                member.name,
                gb(from),
                gb(to)
            )),
            (None, Some(to)) if was.is_none() => {
                lines.push(format!("{} joins at {to} ({} GB)", member.name, gb(to)))
            }
            _ => {}
        }
        if let Some(was) = was {
            if was.demand.is_on_demand() != member.demand.is_on_demand() {
                lines.push(if member.demand.is_on_demand() {
                    format!("{}: on demand", member.name)
                } else {
                    format!("{}: always loaded", member.name)
                });
            }
        }
    }
    for gone in before
        .iter()
        .filter(|b| after.iter().all(|a| a.name != b.name))
    {
        lines.push(format!("{} leaves", gone.name));
    }
    lines
}

/// Whether every keep-alive field holds one: the form may be sent.
pub fn keep_alives_valid(rows: &[ShareRow]) -> bool {
    rows.iter().all(|r| r.keep_alive_error().is_none())
}

/// The members of `plan` whose demand differs from `before` (a member not in it was pinned), as the server
/// wants them.
pub fn changed_demand(before: &[PlanMember], plan: &[PlanMember]) -> Vec<(String, Demand)> {
    plan.iter()
        .filter(|m| {
            let was = before.iter().find(|b| b.name == m.name);
            was.map_or(Demand::Pinned, |b| b.demand) != m.demand
        })
        .map(|m| (m.name.clone(), m.demand))
        .collect()
}

/// The rows' verdict: `placement`'s, on the plan they describe, against the group's GPUs.
pub fn verdict(rows: &[ShareRow], gpus: &[GroupGpu]) -> Verdict {
    judge(&plan(rows), gpus)
}

/// The verdict as the panel states it, one line per problem (naming its member), or the line that it fits
/// (with the turns on-demand models take, and the replicas that would wait for room).
pub fn verdict_lines(verdict: &Verdict) -> Vec<String> {
    match verdict.fits_message() {
        Some(line) => std::iter::once(line)
            .chain(verdict.turns_message())
            .chain(verdict.waits.iter().map(ReplicasWait::message))
            .collect(),
        None => verdict
            .problems
            .iter()
            .map(|p| match p.member() {
                Some(member) => format!("{member}: {}", p.message()),
                None => p.message(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use placement::GpuRef;

    #[test]
    fn a_confirmation_names_each_share_it_changes_with_its_memory_before_and_after() {
        let member = |name: &str, pct: u32| PlanMember::new(name, BasisPoints::percent(pct));
        let before = [
            member("glm-5.3", 40),
            member("reranker", 20),
            member("speech", 10),
        ];
        let mut after = vec![
            member("glm-5.3", 55),
            member("reranker", 20),
            member("vision", 25),
        ];
        after[1].demand = Demand::OnDemand {
            keep_alive: KeepAlive::default(),
        };
        assert_eq!(
            change_lines(&before, &after, Bytes::gb(96)),
            [
                "glm-5.3 40% → 55% (38.4 → 52.8 GB)",
                "reranker: on demand",
                "vision joins at 25% (24 GB)",
                "speech leaves",
            ]
        );
        assert!(change_lines(&before, &before, Bytes::gb(96)).is_empty());
    }

    #[test]
    fn a_row_whose_share_holds_less_than_its_estimate_is_below_it() {
        let mut row = ShareRow::from_member(&PlanMember::new("vision", BasisPoints::percent(10)));
        let gpu = Bytes::gb(96);
        assert!(!row.below_estimate(gpu), "no estimate read yet");
        row.estimate = Some(Bytes::gb(20));
        assert!(row.below_estimate(gpu), "10 % of 96 GB is 9.6 GB");
        row.text = "25".into();
        assert!(!row.below_estimate(gpu), "25 % is 24 GB");
        row.text = "not a share".into();
        assert!(!row.below_estimate(gpu));
    }

    /// text-router on one 96 GB GPU: the router (locked) and three models, 85 % in all.
    fn rows() -> Vec<ShareRow> {
        let member = |name: &str, pct: u32| PlanMember::new(name, BasisPoints::percent(pct));
        [
            PlanMember {
                locked: true,
                ..member("semantic-router", 10)
            },
            member("glm-5.3", 40),
            member("vision", 25),
            member("speech", 10),
        ]
        .iter()
        .map(ShareRow::from_member)
        .collect()
    }

    fn gpus() -> Vec<GroupGpu> {
        vec![GroupGpu {
            gpu: GpuRef::new("atlas", 0),
            total: Bytes::gb(96),
            held_outside: Bytes::ZERO,
            taken_by_others: Bytes::ZERO,
        }]
    }

    #[test]
    fn the_form_opens_on_todays_shares() {
        let texts: Vec<_> = rows().into_iter().map(|r| r.text).collect();
        assert_eq!(texts, ["10", "40", "25", "10"]);
        assert_eq!(
            verdict_lines(&verdict(&rows(), &gpus())),
            ["The shares add up to 85% of one accelerator, which fits."]
        );
    }

    #[test]
    fn typing_past_one_hundred_percent_refuses_the_plan() {
        let mut r = rows();
        r[1].text = "70".into();
        let v = verdict(&r, &gpus());
        assert!(v.is_refused());
        assert_eq!(
            verdict_lines(&v),
            ["The shares add up to more than the accelerator holds."]
        );
    }

    #[test]
    fn an_empty_field_is_a_member_without_a_share_and_is_named() {
        let mut r = rows();
        r[2].text.clear();
        assert_eq!(r[2].field_error(), None);
        assert_eq!(
            verdict_lines(&verdict(&r, &gpus())),
            ["vision: A model has no explicit share, so the planned total cannot include it."]
        );
    }

    #[test]
    fn a_zero_share_is_named() {
        let mut r = rows();
        r[3].text = "0".into();
        assert_eq!(
            verdict_lines(&verdict(&r, &gpus())),
            ["speech: A model reserves no share of the accelerator."]
        );
    }

    #[test]
    fn a_member_put_on_demand_takes_turns_and_the_panel_says_so_in_a_line_of_its_own() {
        let mut r = rows();
        r[3].on_demand = true;
        r[3].text = "15".into();
        r[2].on_demand = true;
        let v = verdict(&r, &gpus());
        assert_eq!(
            verdict_lines(&v),
            [
                "The shares add up to 75% of one accelerator, which fits.",
                "On-demand models take turns in the 50% the pinned ones leave."
            ]
        );
        let before: Vec<PlanMember> = rows().iter().map(ShareRow::member).collect();
        let changed = changed_demand(&before, &plan(&r));
        assert_eq!(
            changed.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(),
            ["vision", "speech"]
        );
    }

    #[test]
    fn an_on_demand_share_past_what_the_pinned_ones_leave_is_refused_in_the_seeds_words() {
        let mut r = rows();
        r[2].on_demand = true;
        r[2].text = "51".into();
        assert_eq!(
            verdict_lines(&verdict(&r, &gpus())),
            ["The shares add up to more than the accelerator holds."]
        );
    }

    #[test]
    fn a_keep_alive_that_is_not_one_says_what_to_enter_and_blocks_sending() {
        let mut r = rows();
        r[2].on_demand = true;
        r[2].keep_alive = "2".into();
        assert_eq!(
            r[2].keep_alive_error().unwrap(),
            "A keep-alive is a whole number of seconds from 10 to 604800 (a week)."
        );
        assert!(!keep_alives_valid(&r));
        r[2].on_demand = false;
        assert!(keep_alives_valid(&r));
    }

    #[test]
    fn text_that_is_not_a_share_says_so_and_counts_as_no_share() {
        let mut r = rows();
        r[1].text = "forty".into();
        assert_eq!(
            r[1].field_error().unwrap(),
            "This share is not a percentage; enter one such as 25 or 33.33."
        );
        assert_eq!(r[1].member().share, None);
    }
}
