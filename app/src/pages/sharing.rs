//! The GPU sharing form of a running model: its group's Shared GPU memory panel, opened on today's shares.
//! Save becomes available after a change and while the plan is not refused; a confirmation names each
//! model that restarts; Save again commits the plan on the server, which judges it again first.

use crate::components::confirm::Confirm;
use crate::components::share_panel::SharedGpuMemoryPanel;
use crate::error::AppError;
use crate::share_form::{self, ShareRow};
use crate::views::{ChangeOutcome, SharingForm};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::{use_navigate, use_params_map};
use placement::{transition, BasisPoints, Share, Verdict};

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
) -> Result<ChangeOutcome, AppError> {
    let actor = crate::auth::require(crate::auth::Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.change_shares(actor, group, revision, shares)).await
}

/// The page.
#[component]
pub fn SharingPage() -> impl IntoView {
    let params = use_params_map();
    let model = move || params.read().get("name").unwrap_or_default();
    let form = Resource::new(model, load_sharing_form);
    view! {
        <div class="page">
            <p class="crumbs"><A href="/">"Models"</A> " / " {model} " / GPU sharing"</p>
            <Suspense fallback=|| view! { <p>"Loading the plan…"</p> }>
                {move || form.get().map(|answer| match answer {
                    Ok(form) => view! { <SharingEditor form /> }.into_any(),
                    Err(e) => view! { <h1>"GPU sharing"</h1><p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Suspense>
        </div>
    }
}

/// The shares of today: what Save compares the form with.
fn committed(form: &SharingForm) -> Vec<Share> {
    form.group
        .members
        .iter()
        .map(|m| Share::new(&m.name, m.share.unwrap_or_default()))
        .collect()
}

/// The models that restart when the rows are saved, in plan order.
pub fn restarts(before: &[Share], rows: &[ShareRow]) -> Vec<String> {
    let after: Vec<Share> = share_form::plan(rows)
        .into_iter()
        .map(|m| Share::new(m.name, m.share.unwrap_or_default()))
        .collect();
    transition(before, &after, &[])
        .restarts
        .into_iter()
        .map(|r| r.member)
        .collect()
}

#[component]
fn SharingEditor(form: SharingForm) -> impl IntoView {
    let opened: Vec<ShareRow> = form
        .group
        .members
        .iter()
        .map(ShareRow::from_member)
        .collect();
    let rows = RwSignal::new(opened.clone());
    let gpus = form.gpus.clone();
    let verdict: Memo<Verdict> = Memo::new(move |_| rows.with(|r| share_form::verdict(r, &gpus)));
    let changed = Memo::new(move |_| rows.with(|r| *r != opened));
    let save_available = move || changed.get() && !verdict.with(Verdict::is_refused);
    let before = committed(&form);
    let confirming = RwSignal::new(None::<Vec<String>>);
    let save = ServerAction::<SaveShares>::new();
    let group = form.group.name.clone();
    let revision = form.group.revision;
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));

    let navigate = use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(outcome)) = save.value().get() {
            navigate(
                &format!("/?restarts={}", outcome.restarts.join(",")),
                Default::default(),
            );
        }
    });
    let error = move || match save.value().get() {
        Some(Err(e)) => Some(e.to_string()),
        _ => None,
    };
    let gpu_total = form.gpus.first().map(|g| g.total).unwrap_or_default();
    let on_gpus = form
        .gpus
        .iter()
        .map(|g| format!("{} ({})", g.gpu, g.total))
        .collect::<Vec<_>>()
        .join(", ");
    let ask = move |_| {
        confirming.set(Some(rows.with_untracked(|r| restarts(&before, r))));
    };
    view! {
        <div data-hydrated=move || hydrated.get().to_string()>
            <h1>"GPU sharing"</h1>
            <p class="lede" data-testid="group-line">
                {format!("{} runs in {}, on {on_gpus}.", form.model, form.group.name)}
            </p>
            <SharedGpuMemoryPanel rows verdict gpu_total />
            {move || error().map(|e| view! { <p class="error" role="alert" data-testid="save-error">{e}</p> })}
            {move || match confirming.get() {
                None => view! {
                    <div class="actions">
                        <button type="button" class="primary" disabled=move || !save_available() on:click=ask.clone()>"Save"</button>
                        <A href="/" attr:class="button secondary">"Cancel"</A>
                    </div>
                }.into_any(),
                Some(names) => {
                    let group = group.clone();
                    view! {
                        <Confirm
                            title="Save the new shares?"
                            restarts=names
                            confirm="Save"
                            pending=save.pending()
                            on_confirm=move || {
                                let shares = rows.with_untracked(|r| {
                                    share_form::plan(r)
                                        .into_iter()
                                        .filter_map(|m| Some((m.name, m.share?)))
                                        .collect()
                                });
                                save.dispatch(SaveShares { group: group.clone(), revision, shares });
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

    fn rows(shares: &[(&str, &str)]) -> Vec<ShareRow> {
        shares
            .iter()
            .map(|(name, text)| ShareRow {
                name: (*name).into(),
                text: (*text).into(),
                locked: false,
            })
            .collect()
    }

    #[test]
    fn only_the_members_whose_share_changed_restart() {
        let before = vec![
            Share::new("semantic-router", BasisPoints::percent(10)),
            Share::new("glm-5.3", BasisPoints::percent(40)),
            Share::new("vision", BasisPoints::percent(25)),
        ];
        let now = rows(&[
            ("semantic-router", "10"),
            ("glm-5.3", "35"),
            ("vision", "30"),
        ]);
        assert_eq!(restarts(&before, &now), ["glm-5.3", "vision"]);
        let same = rows(&[
            ("semantic-router", "10"),
            ("glm-5.3", "40"),
            ("vision", "25"),
        ]);
        assert!(restarts(&before, &same).is_empty());
    }
}
