//! The GPU sharing form of a running model: its group's Shared GPU memory panel, opened on today's shares,
//! and each member's memory estimate beside it, the opened model's first.
//! Save becomes available after a change and while the plan is not refused; a confirmation names each
//! model that restarts; Save again commits the plan on the server, which judges it again first.

use crate::components::confirm::Confirm;
use crate::components::estimate_panel::EstimatePanel;
use crate::components::share_panel::SharedGpuMemoryPanel;
use crate::error::AppError;
use crate::share_form::{self, ShareRow};
use crate::views::{ChangeOutcome, GroupPlan, SharingForm};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::{use_navigate, use_params_map, use_query_map};
use placement::{transition, BasisPoints, Demand, Verdict};

/// The form of `model`'s group, as committed now.
#[server(prefix = "/rpc", endpoint = "load_sharing_form", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_sharing_form(model: String) -> Result<SharingForm, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.sharing_form(model)).await
}

/// Commits a group's shares, read at `revision`.
#[server(prefix = "/rpc", endpoint = "save_shares", input = Json, client = crate::csrf::CsrfClient)]
pub async fn save_shares(
    group: String,
    revision: i64,
    shares: Vec<(String, BasisPoints)>,
    // Only the members whose demand changes; a form that sends none changes none.
    #[server(default)] demand: Vec<(String, Demand)>,
) -> Result<ChangeOutcome, AppError> {
    let actor = crate::auth::require(crate::auth::Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.change_shares(actor, group, revision, shares, demand)).await
}

/// The page.
#[component]
pub fn SharingPage() -> impl IntoView {
    let params = use_params_map();
    let model = move || params.read().get("name").unwrap_or_default();
    let form = Resource::new(model, load_sharing_form);
    // The Models tab's right-size offer opens the form with that share proposed for this model.
    let query = use_query_map();
    let proposed = move || query.with_untracked(|q| q.get("share"));
    view! {
        <div class="page">
            <p class="crumbs"><A href="/models">"Models"</A> " / " {model} " / GPU sharing"</p>
            <Suspense fallback=|| view! { <p>"Loading the plan…"</p> }>
                {move || form.get().map(|answer| match answer {
                    Ok(form) => view! { <SharingEditor form proposed=proposed() /> }.into_any(),
                    Err(e) => view! { <h1>"GPU sharing"</h1><p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Suspense>
        </div>
    }
}

/// The models that restart when the rows are saved, in plan order: of those whose engines run.
pub fn restarts(group: &GroupPlan, rows: &[ShareRow]) -> Vec<String> {
    let (before, after) = group.running(&share_form::plan(rows));
    transition(&before, &after, &[])
        .restarts
        .into_iter()
        .map(|r| r.member)
        .collect()
}

/// The rows the form opens on: today's shares, with `proposed` (a percentage, as typed) in `model`'s row
/// when it is given and the row may be edited, so that the change is there to be judged and confirmed.
pub fn opening_rows(form: &SharingForm, proposed: Option<&str>) -> Vec<ShareRow> {
    form.group
        .members
        .iter()
        .map(|member| {
            let mut row = ShareRow::from_member(member);
            if let Some(text) = proposed.filter(|_| row.name == form.model && !row.locked) {
                text.clone_into(&mut row.text);
            }
            row
        })
        .collect()
}

#[component]
fn SharingEditor(
    form: SharingForm,
    /// A share proposed for the model, as a percentage.
    proposed: Option<String>,
) -> impl IntoView {
    let opened: Vec<ShareRow> = form
        .group
        .members
        .iter()
        .map(ShareRow::from_member)
        .collect();
    let rows = RwSignal::new(opening_rows(&form, proposed.as_deref()));
    let gpus = form.gpus.clone();
    let verdict: Memo<Verdict> = Memo::new(move |_| rows.with(|r| share_form::verdict(r, &gpus)));
    let changed = Memo::new(move |_| rows.with(|r| *r != opened));
    let save_available = move || {
        changed.get()
            && !verdict.with(Verdict::is_refused)
            && rows.with(|r| share_form::keep_alives_valid(r))
    };
    let before = form.group.clone();
    let gpu_total = form.gpus.first().map(|g| g.total).unwrap_or_default();
    let confirming = RwSignal::new(None::<(Vec<String>, Vec<String>)>);
    let save = ServerAction::<SaveShares>::new();
    let group = form.group.name.clone();
    let members = form.group.members.clone();
    let revision = form.group.revision;
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));

    let navigate = use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(outcome)) = save.value().get() {
            navigate(
                &format!("/models?restarts={}", outcome.restarts.join(",")),
                Default::default(),
            );
        }
    });
    let error = move || match save.value().get() {
        Some(Err(e)) => Some(e.to_string()),
        _ => None,
    };
    let machine = form.gpus.first().map(|g| g.gpu.machine.clone());
    let estimated: Vec<String> = std::iter::once(form.model.clone())
        .chain(
            form.group
                .members
                .iter()
                .map(|m| m.name.clone())
                .filter(|name| *name != form.model),
        )
        .collect();
    let on_gpus = form
        .gpus
        .iter()
        .map(|g| format!("{} ({})", g.gpu, g.total))
        .collect::<Vec<_>>()
        .join(", ");
    let ask = {
        let members = form.group.members.clone();
        move |_| {
            let (names, changes) = rows.with_untracked(|r| {
                (
                    restarts(&before, r),
                    share_form::change_lines(&members, &share_form::plan(r), gpu_total),
                )
            });
            confirming.set(Some((names, changes)));
        }
    };
    view! {
        <div data-hydrated=move || hydrated.get().to_string()>
            <h1>"GPU sharing"</h1>
            <p class="lede" data-testid="group-line">
                {format!("{} runs in {}, on {on_gpus}.", form.model, form.group.name)}
            </p>
            <SharedGpuMemoryPanel rows verdict gpu_total />
            // Each member's estimate, the opened model's first.
            {estimated.into_iter().map(|model| {
                let machine = machine.clone();
                let engine = form
                    .engines
                    .iter()
                    .find(|(name, _)| *name == model)
                    .map(|(_, engine)| engine.clone())
                    .unwrap_or_default();
                view! { <EstimatePanel model engine machine gpu_total rows /> }
            }).collect_view()}
            {move || error().map(|e| view! { <p class="error" role="alert" data-testid="save-error">{e}</p> })}
            {move || match confirming.get() {
                None => view! {
                    <div class="actions">
                        <button type="button" class="primary" disabled=move || !save_available() on:click=ask.clone()>"Save"</button>
                        <A href="/models" attr:class="button secondary">"Cancel"</A>
                    </div>
                }.into_any(),
                Some((names, changes)) => {
                    let group = group.clone();
                    let members = members.clone();
                    view! {
                        <Confirm
                            title="Save the new shares?"
                            restarts=names
                            changes
                            confirm="Save"
                            pending=save.pending()
                            on_confirm=move || {
                                let plan = rows.with_untracked(|r| share_form::plan(r));
                                let demand = share_form::changed_demand(&members, &plan);
                                let shares = plan
                                    .into_iter()
                                    .filter_map(|m| Some((m.name, m.share?)))
                                    .collect();
                                save.dispatch(SaveShares { group: group.clone(), revision, shares, demand });
                            }
                            on_cancel=move || confirming.set(None)
                        />
                    }.into_any()
                }
            }}
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use placement::{KeepAlive, PlanMember};

    fn rows(shares: &[(&str, &str)]) -> Vec<ShareRow> {
        shares
            .iter()
            .map(|(name, text)| {
                ShareRow::from_member(&PlanMember {
                    share: BasisPoints::parse_percent(text).unwrap(),
                    ..PlanMember::new(*name, BasisPoints::ZERO)
                })
            })
            .collect()
    }

    fn group(unloaded: &[&str]) -> GroupPlan {
        let on_demand = Demand::OnDemand {
            keep_alive: KeepAlive::DEFAULT,
        };
        GroupPlan {
            name: "text-router".into(),
            revision: 3,
            gpus: Vec::new(),
            members: vec![
                PlanMember::new("semantic-router", BasisPoints::percent(10)),
                PlanMember::new("glm-5.3", BasisPoints::percent(40)),
                PlanMember {
                    demand: on_demand,
                    ..PlanMember::new("vision", BasisPoints::percent(25))
                },
            ],
            unloaded: unloaded.iter().map(|u| (*u).to_owned()).collect(),
        }
    }

    #[test]
    fn only_the_members_whose_share_changed_restart() {
        let before = group(&[]);
        let now = rows(&[
            ("semantic-router", "10"),
            ("glm-5.3", "35"),
            ("vision", "30"),
        ]);
        let mut now = now;
        now[2].on_demand = true;
        assert_eq!(restarts(&before, &now), ["glm-5.3", "vision"]);
        let same = rows(&[
            ("semantic-router", "10"),
            ("glm-5.3", "40"),
            ("vision", "25"),
        ]);
        let mut same = same;
        same[2].on_demand = true;
        assert!(restarts(&before, &same).is_empty());
    }

    #[test]
    fn an_on_demand_member_that_is_not_loaded_restarts_for_no_change() {
        let mut now = rows(&[
            ("semantic-router", "10"),
            ("glm-5.3", "40"),
            ("vision", "30"),
        ]);
        now[2].on_demand = true;
        assert!(restarts(&group(&["vision"]), &now).is_empty());
        // Pinned again, it starts.
        now[2].on_demand = false;
        assert_eq!(restarts(&group(&["vision"]), &now), ["vision"]);
    }

    fn form() -> SharingForm {
        let router = PlanMember {
            locked: true,
            ..PlanMember::new("router", BasisPoints::percent(5))
        };
        SharingForm {
            model: "voice".into(),
            group: GroupPlan {
                name: "g".into(),
                revision: 3,
                gpus: Vec::new(),
                members: vec![
                    router,
                    PlanMember::new("voice", BasisPoints::percent(12)),
                    PlanMember::new("embed", BasisPoints::percent(20)),
                ],
                unloaded: Vec::new(),
            },
            gpus: Vec::new(),
            engines: Vec::new(),
        }
    }

    fn texts(rows: &[ShareRow]) -> Vec<&str> {
        rows.iter().map(|r| r.text.as_str()).collect()
    }

    #[test]
    fn a_proposed_share_opens_in_the_models_own_row_and_nowhere_else() {
        assert_eq!(texts(&opening_rows(&form(), None)), ["5", "12", "20"]);
        assert_eq!(texts(&opening_rows(&form(), Some("7"))), ["5", "7", "20"]);
        let router = SharingForm {
            model: "router".into(),
            ..form()
        };
        assert_eq!(texts(&opening_rows(&router, Some("1"))), ["5", "12", "20"]);
    }
}
