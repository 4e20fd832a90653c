//! The Nodes tab: each node's sharing group, its models with their shares, and its GPU memory
//! (`2 of 2 shareable · 180 GB free (94%)`).

use crate::components::cluster_tabs::ClusterTabs;
use crate::components::live::use_live;
use crate::error::AppError;
use crate::views::NodeRow;
use leptos::prelude::*;
use leptos_router::components::A;

/// Every node.
#[server(prefix = "/rpc", endpoint = "list_nodes", client = crate::csrf::CsrfClient)]
pub async fn list_nodes() -> Result<Vec<NodeRow>, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.nodes()).await
}

/// The tab.
#[component]
pub fn NodesPage() -> impl IntoView {
    let live = use_live();
    let nodes = Resource::new(move || live.track(), |_| list_nodes());
    view! {
        <div class="page">
            <h1>"Cluster"</h1>
            <ClusterTabs />
            <h2>"Nodes"</h2>
            <Transition fallback=|| view! { <p>"Loading the nodes…"</p> }>
                {move || nodes.get().map(|answer| match answer {
                    Ok(rows) if rows.is_empty() => view! {
                        <p class="empty">"No nodes: start the server on a machine with NVIDIA GPUs, with --inventory, or with --demo."</p>
                    }.into_any(),
                    Ok(rows) => view! { <NodesTable rows /> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

/// The table of nodes.
#[component]
pub fn NodesTable(
    /// The rows.
    rows: Vec<NodeRow>,
) -> impl IntoView {
    view! {
        <table class="list nodes" data-testid="nodes">
            <thead>
                <tr>
                    <th scope="col">"Node"</th>
                    <th scope="col">"Group"</th>
                    <th scope="col">"Models"</th>
                    <th scope="col">"GPU memory"</th>
                </tr>
            </thead>
            <tbody>
                {rows
                    .into_iter()
                    .map(|node| {
                        let models = node
                            .models
                            .iter()
                            .map(|m| match m.share {
                                Some(share) => format!("{} {share}", m.name),
                                None => format!("{} (whole)", m.name),
                            })
                            .collect::<Vec<_>>()
                            .join(", ");
                        let name = node.name.clone();
                        let href = format!("/machines/{name}");
                        let key = name.clone();
                        view! {
                            <tr data-testid="node-row" data-node=key>
                                <th scope="row"><A href=href>{name}</A></th>
                                <td data-testid="node-group">{if node.groups.is_empty() { "—".to_owned() } else { node.groups.join(", ") }}</td>
                                <td data-testid="node-models">{if models.is_empty() { "—".to_owned() } else { models }}</td>
                                <td data-testid="node-memory">{node.summary()}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
}
