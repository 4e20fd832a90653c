//! The Nodes tab: each node's sharing group, its models with their shares, and its GPU memory
//! (`2 of 2 shareable · 180 GB free (94%)`), searched by node, group or model and shown 50 to a page, so
//! that it stays quick with 1,250 machines.

use crate::components::cluster_tabs::ClusterTabs;
use crate::components::live::use_live;
use crate::error::AppError;
use crate::views::{NodeRow, NodesPage, NODES_PER_PAGE};
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::{use_navigate, use_query_map};
use leptos_router::NavigateOptions;

/// One page of the nodes whose name, group or model holds `search`.
#[server(prefix = "/rpc", endpoint = "list_nodes", client = crate::csrf::CsrfClient)]
pub async fn list_nodes(search: String, page: usize) -> Result<NodesPage, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    let rows = crate::services::answer(console.nodes()).await?;
    Ok(NodesPage::of(rows, &search, page))
}

/// The tab. The search and the page are in the address (`?q=whisper&page=2`), so that a link or a reload
/// shows the same rows.
#[component]
pub fn NodesPage() -> impl IntoView {
    let live = use_live();
    let query = use_query_map();
    let navigate = use_navigate();
    let search = move || query.with(|q| q.get("q").unwrap_or_default());
    let page = move || {
        query.with(|q| {
            q.get("page")
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(1)
        })
    };
    let nodes = Resource::new(
        move || (live.track(), search(), page()),
        |(_, search, page)| list_nodes(search, page),
    );
    let go = move |search: String, page: usize| {
        let mut address = String::from("/nodes");
        let mut parts = Vec::new();
        if !search.is_empty() {
            parts.push(format!("q={}", crate::address::query_value(&search)));
        }
        if page > 1 {
            parts.push(format!("page={page}"));
        }
        if !parts.is_empty() {
            address.push('?');
            address.push_str(&parts.join("&"));
        }
        navigate(
            &address,
            NavigateOptions {
                replace: true,
                ..Default::default()
            },
        );
    };
    let typed = {
        let go = go.clone();
        move |ev| go(event_target_value(&ev), 1)
    };
    view! {
        <div class="page">
            <h1>"Cluster"</h1>
            <ClusterTabs />
            <div class="toolbar">
                <h2>"Nodes"</h2>
                <label for="nodes-search" class="visually-hidden">"Search nodes"</label>
                <input id="nodes-search" type="search" placeholder="Node, group or model" autocomplete="off"
                    data-testid="nodes-search" prop:value=search on:input=typed />
            </div>
            <Transition fallback=|| view! { <p>"Loading the nodes…"</p> }>
                {move || nodes.get().map(|answer| match answer {
                    Ok(p) if p.all == 0 => view! {
                        <p class="empty">"No nodes: start the server on a machine with NVIDIA GPUs, with --inventory, or with --demo."</p>
                    }.into_any(),
                    Ok(p) if p.matching == 0 => view! {
                        <p class="empty" data-testid="no-match">{format!("No node, group or model holds {:?}.", search())}</p>
                    }.into_any(),
                    Ok(p) => {
                        let go = go.clone();
                        view! { <NodesTable rows=p.rows.clone() /> <Pages p go /> }.into_any()
                    }
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

/// Where this page is among those that match, and the way to the others.
#[component]
fn Pages<F>(p: NodesPage, go: F) -> impl IntoView
where
    F: Fn(String, usize) + Clone + Send + Sync + 'static,
{
    let search = use_query_map().with_untracked(|q| q.get("q").unwrap_or_default());
    let (page, pages) = (p.page, p.pages);
    let shown = shown_text(&p);
    let back = {
        let (go, search) = (go.clone(), search.clone());
        move |_: leptos::ev::MouseEvent| go(search.clone(), page - 1)
    };
    let forward = move |_: leptos::ev::MouseEvent| go(search.clone(), page + 1);
    view! {
        <nav class="pages" aria-label="Pages of nodes">
            <span data-testid="nodes-page">
                {format!("Page {page} of {pages} · {shown}")}
            </span>
            <button type="button" class="secondary" disabled={page <= 1} on:click=back>"Previous"</button>
            <button type="button" class="secondary" disabled={page >= pages} on:click=forward>"Next"</button>
        </nav>
    }
}

/// Which nodes the page shows, of how many: "nodes 51–100 of 1254", "node 1 of 1 matching, of 1254".
fn shown_text(p: &NodesPage) -> String {
    let first = (p.page.max(1) - 1) * NODES_PER_PAGE + 1;
    let which = match p.rows.len() {
        0 => "no nodes".to_owned(),
        1 => format!("node {first}"),
        n => format!("nodes {first}–{}", first + n - 1),
    };
    if p.matching == p.all {
        format!("{which} of {}", p.all)
    } else {
        format!("{which} of {} matching, of {}", p.matching, p.all)
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
