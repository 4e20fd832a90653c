//! The Models tab: every deployed model with its group, share, nodes, health and state, and a three-dot
//! menu per row (GPU sharing, Serving configuration, Remove).

use crate::components::cluster_tabs::ClusterTabs;
use crate::components::confirm::Confirm;
use crate::components::live::use_live;
use crate::error::AppError;
use crate::views::{ChangeOutcome, EngineStatus, ModelRow};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::use_query_map;

/// Every deployed model.
#[server(prefix = "/rpc", endpoint = "list_models")]
pub async fn list_models() -> Result<Vec<ModelRow>, AppError> {
    let console = crate::services::console()?;
    crate::services::answer(console.models()).await
}

/// Removes a model: its engines stop, and the other members of its group keep their shares.
#[server(prefix = "/rpc", endpoint = "remove_model", input = Json)]
pub async fn remove_model(model: String, revision: i64) -> Result<ChangeOutcome, AppError> {
    let console = crate::services::console()?;
    crate::services::answer(console.remove(model, revision)).await
}

/// The line the tab shows after a change elsewhere sent the operator here.
fn notice(query: &leptos_router::params::ParamsMap) -> Option<String> {
    if let Some(model) = query.get("deployed") {
        return Some(format!("{model} is being deployed."));
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
    let models = Resource::new(
        move || (live.track(), remove.version().get()),
        |_| list_models(),
    );
    let query = use_query_map();
    let notice = move || query.with(notice);
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
                <A href="/deploy" attr:class="button primary">"Deploy Model"</A>
            </div>
            {move || notice().map(|line| view! { <p class="notice" role="status" data-testid="notice">{line}</p> })}
            {move || removed().map(|r| match r {
                Ok(_) => view! { <p class="notice" role="status">"Removed. Its engines stop."</p> }.into_any(),
                Err(e) => view! { <p class="error" role="alert">{e}</p> }.into_any(),
            })}
            <Transition fallback=|| view! { <p>"Loading the models…"</p> }>
                {move || models.get().map(|answer| match answer {
                    Ok(rows) if rows.is_empty() => view! {
                        <p class="empty" data-testid="no-models">"No model runs yet. Select Deploy Model to deploy one."</p>
                    }.into_any(),
                    Ok(rows) => view! { <ModelsTable rows remove /> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

/// The table of deployed models.
#[component]
fn ModelsTable(
    /// The rows.
    rows: Vec<ModelRow>,
    /// The Remove action, confirmed in the row's menu.
    remove: ServerAction<RemoveModel>,
) -> impl IntoView {
    view! {
        <table class="list models" data-testid="models">
            <thead>
                <tr>
                    <th scope="col">"Name"</th>
                    <th scope="col">"Group"</th>
                    <th scope="col">"Share"</th>
                    <th scope="col">"Nodes"</th>
                    <th scope="col">"Health"</th>
                    <th scope="col">"State"</th>
                    <th scope="col"><span class="visually-hidden">"Actions"</span></th>
                </tr>
            </thead>
            <tbody>
                {rows.into_iter().map(|row| view! { <ModelLine row remove /> }).collect_view()}
            </tbody>
        </table>
    }
}

/// One model's row.
#[component]
fn ModelLine(
    /// The model.
    row: ModelRow,
    /// The Remove action.
    remove: ServerAction<RemoveModel>,
) -> impl IntoView {
    let (status, message) = row.state();
    let healthy = status == EngineStatus::Healthy;
    let confirming = RwSignal::new(false);
    let name = row.name.clone();
    let revision = row.revision;
    let menu_label = format!("Actions for {}", row.name);
    let nodes = row.nodes.join(", ");
    view! {
        <tr data-testid="model-row" data-model=row.name.clone()>
            <th scope="row">{row.name.clone()}</th>
            <td data-testid="group">{row.group.clone().unwrap_or_else(|| "—".to_owned())}</td>
            <td data-testid="share">{row.share_text()}</td>
            <td>{nodes}</td>
            <td>
                <span class="chip" class:ok=healthy data-testid="health">{row.health()}</span>
            </td>
            <td data-testid="state">
                <span class=format!("state {}", status.label().to_lowercase())>{status.label()}</span>
                {message.map(|m| view! { <span class="why">{m}</span> })}
            </td>
            <td class="menu-cell">
                <details class="menu">
                    <summary aria-label=menu_label>"⋮"</summary>
                    <ul>
                        {row.group.is_some().then(|| view! {
                            <li><A href=format!("/models/{}/sharing", row.name)>"GPU sharing"</A></li>
                        })}
                        <li><A href=format!("/models/{}/serving", row.name)>"Serving configuration"</A></li>
                        <li>
                            {if row.system {
                                view! { <span class="muted">"Remove (the semantic router stays)"</span> }.into_any()
                            } else {
                                view! {
                                    <button type="button" class="link" on:click=move |_| confirming.set(true)>"Remove"</button>
                                }.into_any()
                            }}
                        </li>
                    </ul>
                </details>
                {move || confirming.get().then(|| {
                    let name = name.clone();
                    view! {
                        <Confirm
                            title=format!("Remove {name}?")
                            restarts=Vec::new()
                            confirm="Remove"
                            pending=remove.pending()
                            on_confirm=move || {
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
    // Erased here: the row's full type is deep enough to overflow the compiler's query depth.
    .into_any()
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
    fn the_notice_names_the_model_being_deployed() {
        assert_eq!(
            notice(&query(&[("deployed", "vision")])).unwrap(),
            "vision is being deployed."
        );
    }

    #[test]
    fn the_notice_names_every_model_that_restarts() {
        assert_eq!(
            notice(&query(&[("restarts", "glm-5.3,vision,speech")])).unwrap(),
            "Saved. glm-5.3, vision and speech restart with their new settings."
        );
        assert_eq!(
            notice(&query(&[("restarts", "vision")])).unwrap(),
            "Saved. vision restarts with its new settings."
        );
        assert_eq!(notice(&query(&[])), None);
    }
}
