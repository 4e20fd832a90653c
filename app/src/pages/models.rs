//! The Models tab: every deployed model with its group, share, nodes, health, memory, restarts, errors and
//! state, and a three-dot menu per row (GPU sharing, Serving configuration, Remove); searched by model,
//! group or node and shown 50 to a page, so that it stays quick with thousands of models.

use crate::components::cluster_tabs::ClusterTabs;
use crate::components::confirm::Confirm;
use crate::components::live::use_live;
use crate::components::pager::{page_param, use_replace, use_search_and_page, Pager};
use crate::error::AppError;
use crate::views::{
    ChangeOutcome, EngineState, LoadState, ModelRow, OnDemand, Page, PlanProgress, Replicas,
    StepState,
};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::use_query_map;
use placement::rightsize::Fit;
use std::collections::HashMap;

/// One page of the deployed models whose name, group or node holds `search`.
#[server(prefix = "/rpc", endpoint = "list_models", client = crate::csrf::CsrfClient)]
pub async fn list_models(
    // A page loaded before the tab had pages sends neither: the first page of all.
    #[server(default)] search: String,
    #[server(default)] page: usize,
) -> Result<Page<ModelRow>, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.models(search, page)).await
}

/// The restarts under way, and those that failed.
#[server(prefix = "/rpc", endpoint = "list_changes", client = crate::csrf::CsrfClient)]
pub async fn list_changes() -> Result<Vec<PlanProgress>, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.changes()).await
}

/// Removes a model: its engines stop, and the other members of its group keep their shares.
#[server(prefix = "/rpc", endpoint = "remove_model", input = Json, client = crate::csrf::CsrfClient)]
pub async fn remove_model(model: String, revision: i64) -> Result<ChangeOutcome, AppError> {
    let actor = crate::auth::require(crate::auth::Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.remove(actor, model, revision)).await
}

/// The line the tab shows after a change elsewhere sent the operator here.
fn notice(query: &leptos_router::params::ParamsMap, rows: &[ModelRow]) -> Option<String> {
    if let Some(model) = query.get("deployed") {
        // Kept up with its row, which the live updates refresh: a banner that still says "being deployed"
        // beside a row that says Serving is one the eye learns to skip.
        let row = rows.iter().find(|r| r.name == model);
        let on_demand = row.is_some_and(|r| {
            r.on_demand
                .as_ref()
                .is_some_and(|o| o.state == LoadState::NotLoaded)
        });
        return Some(match row.map(|r| r.state().0) {
            _ if on_demand => format!("{model} is deployed: its first request loads it."),
            Some(EngineState::Healthy) => format!("{model} is deployed and serving."),
            Some(EngineState::Failed) => {
                format!("{model} is deployed, but its engine failed: its row says why.")
            }
            _ => format!("{model} is being deployed."),
        });
    }
    let restarts = query.get("restarts")?;
    let names: Vec<&str> = restarts.split(',').filter(|n| !n.is_empty()).collect();
    Some(match names.as_slice() {
        [] => "Saved. Nothing restarts.".to_owned(),
        [one] => format!("Saved. {one} restarts with its new settings."),
        many => format!(
            "Saved. {} and {} restart with their new settings.",
            many[..many.len() - 1].join(", "),
            many[many.len() - 1]
        ),
    })
}

/// The tab.
#[component]
pub fn ModelsPage() -> impl IntoView {
    let live = use_live();
    let remove = ServerAction::<RemoveModel>::new();
    let query = use_query_map();
    let replace = use_replace();
    let (search, page) = use_search_and_page();
    let models = Resource::new(
        move || {
            (
                live.track(),
                remove.version().get(),
                search.get(),
                page.get(),
            )
        },
        |(_, _, search, page)| list_models(search, page),
    );
    let changes = Resource::new(move || live.track(), |_| list_changes());
    let shown = Signal::derive(move || models.get().and_then(Result::ok));
    let notice = move || {
        let rows = shown.with(|p| p.as_ref().map(|p| p.rows.clone()).unwrap_or_default());
        query.with(|q| notice(q, &rows))
    };
    let go = move |search: String, page: usize| {
        let query = [("q", search), ("page", page_param(page))];
        replace(&crate::address::with_query("/models", &query));
    };
    let typed = {
        let go = go.clone();
        move |ev| go(event_target_value(&ev), 1)
    };
    let removed = move || match remove.value().get() {
        Some(Ok(_)) => Some(Ok(remove.input().get().map(|r| r.model))),
        Some(Err(e)) => Some(Err(e.to_string())),
        None => None,
    };
    view! {
        <div class="page">
            <h1>"Cluster"</h1>
            <ClusterTabs />
            <div class="toolbar">
                <h2>"Models"</h2>
                <label for="models-search" class="visually-hidden">"Search models"</label>
                <input id="models-search" type="search" placeholder="Model, group or node" autocomplete="off"
                    data-testid="models-search" prop:value=search on:input=typed />
                <A href="/deploy" attr:class="button primary">"Deploy Model"</A>
            </div>
            // Inside a Transition: the line reads the rows, and outside one the server would write it before
            // they are read and hydration would keep that.
            <Transition fallback=|| ()>
                {move || notice().map(|line| view! { <p class="notice" role="status" data-testid="notice">{line}</p> })}
            </Transition>
            {move || removed().map(|r| match r {
                Ok(_) => view! { <p class="notice" role="status">"Removed. Its engines stop."</p> }.into_any(),
                Err(e) => view! { <p class="error" role="alert">{e}</p> }.into_any(),
            })}
            <Transition fallback=|| ()>
                {move || changes.get().and_then(Result::ok).map(|changes| view! { <Changes changes /> })}
            </Transition>
            <Transition fallback=|| view! { <p>"Loading the models…"</p> }>
                {move || models.get().and_then(Result::err).map(|e| view! { <p class="error" role="alert">{e.to_string()}</p> })}
                <ModelsTable
                    rows=Signal::derive(move || shown.with(|p| p.as_ref().map(|p| p.rows.clone()).unwrap_or_default()))
                    all=Signal::derive(move || shown.with(|p| p.as_ref().map_or(0, |p| p.all)))
                    remove
                />
                {move || shown.get().filter(|p| p.all > 0).map(|p| {
                    let search = search.get();
                    if p.matching == 0 {
                        return view! {
                            <p class="empty" data-testid="no-match">{format!("No model, group or node holds {search:?}.")}</p>
                        }.into_any();
                    }
                    let go = go.clone();
                    let to = move |page| go(search.clone(), page);
                    let shown = p.shown_text("model", "models");
                    view! {
                        <Pager page=p.page pages=p.pages shown label="Pages of models" testid="models-page" go=to />
                    }.into_any()
                })}
            </Transition>
        </div>
    }
}

/// Each plan change under way, step by step, and each that failed, with why.
#[component]
fn Changes(
    /// The changes.
    changes: Vec<PlanProgress>,
) -> impl IntoView {
    view! {
        <section class="changes" aria-live="polite" aria-label="Restarts" data-testid="changes">
            {changes
                .into_iter()
                .map(|change| {
                    let failed = !change.is_underway();
                    view! {
                        <div class="panel change" class:failed=failed data-group=change.group.clone()>
                            <h3>{change.heading()}</h3>
                            <ol>
                                {change
                                    .steps
                                    .iter()
                                    .map(|s| {
                                        let class = match s.state {
                                            StepState::Waiting => "waiting",
                                            StepState::Running => "running",
                                            StepState::Done => "done",
                                            StepState::Failed => "failed",
                                        };
                                        view! { <li class=class data-testid="step-line">{s.text()}</li> }
                                    })
                                    .collect_view()}
                            </ol>
                        </div>
                    }
                })
                .collect_view()}
        </section>
    }
    .into_any()
}

/// The table of deployed models. Rows are keyed by model, so that a live refresh updates each row in place
/// and an open menu or confirmation stays open.
#[component]
fn ModelsTable(
    /// The rows of this page, as last read.
    #[prop(into)]
    rows: Signal<Vec<ModelRow>>,
    /// Every deployed model, on all pages.
    #[prop(into)]
    all: Signal<usize>,
    /// The Remove action, confirmed in the row's menu.
    remove: ServerAction<RemoveModel>,
) -> impl IntoView {
    let none = move || all.get() == 0;
    let empty = move || rows.with(Vec::is_empty);
    // Where each model's row is: each line finds its own in one look, not by searching every row (a fleet
    // runs thousands of models, and every live refresh asks again).
    let at: Memo<HashMap<String, usize>> = Memo::new(move |_| {
        rows.with(|rows| {
            rows.iter()
                .enumerate()
                .map(|(i, r)| (r.name.clone(), i))
                .collect()
        })
    });
    view! {
        <p class="empty" data-testid="no-models" hidden=move || !none()>
            "No model runs yet. Select Deploy Model to deploy one."
        </p>
        <table class="list models" data-testid="models" hidden=empty>
            <thead>
                <tr>
                    <th scope="col">"Name"</th>
                    <th scope="col">"Group"</th>
                    <th scope="col">"Share"</th>
                    <th scope="col">"Nodes"</th>
                    <th scope="col">"Health"</th>
                    <th scope="col" class="number">"Memory"</th>
                    <th scope="col" class="number">"Restarts"</th>
                    <th scope="col" class="number">"Errors this hour"</th>
                    <th scope="col">"State"</th>
                    <th scope="col"><span class="visually-hidden">"Actions"</span></th>
                </tr>
            </thead>
            <tbody>
                <For
                    each=move || rows.get()
                    key=|row| row.name.clone()
                    children=move |row| {
                        let name = row.name.clone();
                        let row = Memo::new(move |_| {
                            let i = at.with(|at| at.get(&name).copied());
                            i.and_then(|i| rows.with(|rows| rows.get(i).cloned()))
                                .unwrap_or_else(|| row.clone())
                        });
                        view! { <ModelLine row remove /> }
                    }
                />
            </tbody>
        </table>
    }
}

/// One model's row, updated in place as the model changes.
#[component]
fn ModelLine(
    /// The model, as last read.
    row: Memo<ModelRow>,
    /// The Remove action.
    remove: ServerAction<RemoveModel>,
) -> impl IntoView {
    let confirming = RwSignal::new(false);
    let menu = NodeRef::<leptos::html::Details>::new();
    let (name, system, in_group) =
        row.with_untracked(|r| (r.name.clone(), r.system, r.group.is_some()));
    let state = move || row.with(ModelRow::state);
    let healthy = move || state().0 == EngineState::Healthy;
    let sharing = format!("/models/{name}/sharing");
    let serving = format!("/models/{name}/serving");
    let right_size = sharing.clone();
    let remove_name = name.clone();
    let own_page = format!("/models/{name}");
    let label = name.clone();
    view! {
        <tr data-testid="model-row" data-model=name.clone()>
            <th scope="row"><A href=own_page>{label}</A></th>
            <td data-testid="group">{move || row.with(|r| r.group.clone()).unwrap_or_else(|| "—".to_owned())}</td>
            <td data-testid="share">
                {move || row.with(ModelRow::share_text)}
                {move || row.with(|r| r.share_enforced).then(|| view! {
                    <span class="why" data-testid="share-enforced">"enforced by MPS"</span>
                })}
                {move || row.with(|r| r.peak).map(|peak| {
                    let fit = peak.fit();
                    let bad = matches!(fit, Fit::Close | Fit::Past);
                    let offer = match fit {
                        Fit::Smaller { share } if !system => Some(share),
                        _ => None,
                    };
                    let sharing = right_size.clone();
                    view! {
                        <span class="why" class:bad=bad data-testid="peak">{peak.line()}</span>
                        {offer.map(|share| view! {
                            <A href=format!("{sharing}?share={}", share.percent_text()) attr:data-testid="right-size">
                                {format!("Right-size to {} %", share.percent_text())}
                            </A>
                        })}
                    }
                })}
            </td>
            <td>{move || row.with(|r| r.nodes.join(", "))}</td>
            <td>
                <span class="chip" class:ok=healthy data-testid="health">{move || row.with(ModelRow::health)}</span>
            </td>
            <td class="number" data-testid="memory" class:bad=move || row.with(|r| r.memory_text().1)>{move || row.with(|r| r.memory_text().0)}</td>
            <td class="number" data-testid="restarts">{move || row.with(ModelRow::restarts)}</td>
            <td class="number" data-testid="errors" class:bad=move || row.with(|r| r.hour_failed > 0)>{move || row.with(ModelRow::errors_text)}</td>
            <td data-testid="state">
                <span class=move || format!("state {}", state().0.css_class())>{move || state().0.label()}</span>
                {move || state().1.map(|m| view! { <span class="why">{m}</span> })}
                {move || row.with(ModelRow::sizing).into_iter().map(|line| view! {
                    <span class="why" data-testid="sizing">{line}</span>
                }).collect_view()}
                {move || row.with(|r| r.on_demand.as_ref().map(OnDemand::line)).map(|line| view! {
                    <span class="why" data-testid="on-demand">{line}</span>
                })}
                {move || row.with(|r| r.replicas.as_ref().map(Replicas::line)).map(|line| view! {
                    <span class="why" data-testid="replicas">{line}</span>
                })}
                {move || row.with(|r| r.slowed.clone()).map(|line| view! {
                    <span class="why bad" data-testid="slowed">{line}</span>
                })}
                {move || row.with(|r| r.over_share.clone()).map(|line| view! {
                    <span class="why bad" data-testid="over-share">{line}</span>
                })}
            </td>
            <td class="menu-cell">
                <details class="menu" node_ref=menu>
                    <summary aria-label=format!("Actions for {name}")>"⋮"</summary>
                    <ul>
                        {in_group.then(|| view! { <li><A href=sharing>"GPU sharing"</A></li> })}
                        <li><A href=serving>"Serving configuration"</A></li>
                        <li>
                            {if system {
                                view! { <span class="muted">"Remove (the semantic router stays)"</span> }.into_any()
                            } else {
                                view! {
                                    <button type="button" class="link" on:click=move |_| {
                                        // The menu closes behind the question it asked.
                                        if let Some(menu) = menu.get() {
                                            menu.set_open(false);
                                        }
                                        confirming.set(true);
                                    }>"Remove"</button>
                                }.into_any()
                            }}
                        </li>
                    </ul>
                </details>
                {move || confirming.get().then(|| {
                    let name = remove_name.clone();
                    view! {
                        <Confirm
                            title=format!("Remove {name}?")
                            restarts=Vec::new()
                            line="Its engines stop; the other models keep running."
                            confirm="Remove"
                            destructive=true
                            pending=remove.pending()
                            on_confirm=move || {
                                let revision = row.with_untracked(|r| r.revision);
                                remove.dispatch(RemoveModel { model: name.clone(), revision });
                                confirming.set(false);
                            }
                            on_cancel=move || confirming.set(false)
                        />
                    }
                })}
            </td>
        </tr>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leptos_router::params::ParamsMap;

    fn query(pairs: &[(&'static str, &str)]) -> ParamsMap {
        let mut map = ParamsMap::new();
        for (k, v) in pairs {
            map.insert(*k, (*v).to_owned());
        }
        map
    }

    #[test]
    fn the_notice_names_the_model_being_deployed_until_its_row_says_it_serves() {
        let deployed = query(&[("deployed", "vision")]);
        assert_eq!(notice(&deployed, &[]).unwrap(), "vision is being deployed.");
        let mut row = ModelRow::testing("vision", &[EngineState::Starting]);
        assert_eq!(
            notice(&deployed, &[row.clone()]).unwrap(),
            "vision is being deployed."
        );
        row.engines[0].status = EngineState::Healthy;
        assert_eq!(
            notice(&deployed, &[row.clone()]).unwrap(),
            "vision is deployed and serving."
        );
        row.engines[0].status = EngineState::Failed;
        assert_eq!(
            notice(&deployed, &[row]).unwrap(),
            "vision is deployed, but its engine failed: its row says why."
        );
    }

    #[test]
    fn the_notice_names_every_model_that_restarts() {
        assert_eq!(
            notice(&query(&[("restarts", "glm-5.3,vision,speech")]), &[]).unwrap(),
            "Saved. glm-5.3, vision and speech restart with their new settings."
        );
        assert_eq!(
            notice(&query(&[("restarts", "vision")]), &[]).unwrap(),
            "Saved. vision restarts with its new settings."
        );
        assert_eq!(notice(&query(&[]), &[]), None);
    }
}
