//! The Nodes tab: each node's sharing group, its models with their shares, a picture of its GPUs and its
//! GPU memory (`2 of 2 shareable · 180 GB free (94%)`), searched by node, group or model, sorted by a
//! column and shown 50 to a page, so that it stays quick with 1,250 machines.

use crate::components::cluster_tabs::ClusterTabs;
use crate::components::live::use_live;
use crate::components::pager::{page_param, use_replace, use_search_and_page, Pager};
use crate::error::AppError;
use crate::views::{GpuCell, NodeRow, NodeSort, NodesPage};
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::use_query_map;

/// One page of the nodes whose name, group or model holds `search`.
#[server(prefix = "/rpc", endpoint = "list_nodes", client = crate::csrf::CsrfClient)]
pub async fn list_nodes(
    search: String,
    page: usize,
    // A page loaded before sorting existed sends none: by name.
    #[server(default)] sort: String,
) -> Result<NodesPage, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    let rows = crate::services::answer(console.nodes()).await?;
    Ok(NodesPage::nodes(
        rows,
        &search,
        page,
        NodeSort::parse(&sort),
    ))
}

/// The address of the Nodes tab with `search`, `page` and `sort`, each left out at its default.
fn nodes_address(search: &str, page: usize, sort: NodeSort) -> String {
    let sort = if sort == NodeSort::Name {
        ""
    } else {
        sort.as_str()
    };
    crate::address::with_query(
        "/nodes",
        &[
            ("q", search.to_owned()),
            ("sort", sort.to_owned()),
            ("page", page_param(page)),
        ],
    )
}

/// The tab, searched, sorted and paged by its address.
#[component]
pub fn NodesPage() -> impl IntoView {
    let live = use_live();
    let query = use_query_map();
    let replace = use_replace();
    let (search, page) = use_search_and_page();
    let sort = move || query.with(|q| NodeSort::parse(&q.get("sort").unwrap_or_default()));
    let nodes = Resource::new(
        move || (live.track(), search.get(), page.get(), sort()),
        |(_, search, page, sort)| list_nodes(search, page, sort.as_str().to_owned()),
    );
    let go = move |search: String, page: usize| replace(&nodes_address(&search, page, sort()));
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
                        <p class="empty" data-testid="no-match">{format!("No node, group or model holds {:?}.", search.get())}</p>
                    }.into_any(),
                    Ok(p) => {
                        let go = go.clone();
                        let search = search.get();
                        let shown = p.shown_text("node", "nodes");
                        let to = {
                            let search = search.clone();
                            move |page| go(search.clone(), page)
                        };
                        view! {
                            <NodesTable rows=p.rows search sort=sort() />
                            <Pager page=p.page pages=p.pages shown label="Pages of nodes" testid="nodes-page" go=to />
                        }.into_any()
                    }
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

/// A node's GPUs as one picture, a cell each: what Tessera's work takes (from the bottom), what is held
/// outside, what is left; a GPU held whole is dark, an unhealthy one outlined in red. One element per row,
/// so that fifty rows of eight GPUs are fifty pictures, not four hundred components.
#[component]
fn GpuCells(cells: Vec<GpuCell>) -> impl IntoView {
    const CELL: u64 = 14;
    const HEIGHT: u64 = 24;
    let label = cells_label(&cells);
    let height = |part: placement::Bytes, total: placement::Bytes| {
        (u128::from(part.get()) * u128::from(HEIGHT) / u128::from(total.get().max(1))) as u64
    };
    let width = (cells.len() as u64 * CELL).max(CELL);
    let drawn = cells
        .into_iter()
        .enumerate()
        .map(|(i, cell)| {
            let x = i as u64 * CELL + 1;
            let taken = height(cell.taken, cell.total);
            let outside = height(cell.outside, cell.total).min(HEIGHT - taken);
            view! {
                <g class="gpu-cell" class:whole=cell.whole class:unhealthy=!cell.healthy>
                    <rect class="room" x=x y="0" width=CELL - 2 height=HEIGHT></rect>
                    <rect class="outside" x=x y=HEIGHT - taken - outside width=CELL - 2 height=outside></rect>
                    <rect class="taken" x=x y=HEIGHT - taken width=CELL - 2 height=taken></rect>
                </g>
            }
        })
        .collect_view();
    view! {
        <svg class="gpu-cells" viewBox=format!("0 0 {width} {HEIGHT}") width=width height=HEIGHT role="img" aria-label=label data-testid="gpu-cells">
            {drawn}
        </svg>
    }
}

/// What a node's picture shows, in words: `8 GPUs: 2 whole, 3 shared, 3 free; 1 unhealthy` (free: healthy
/// and holding nothing).
fn cells_label(cells: &[GpuCell]) -> String {
    let whole = cells.iter().filter(|c| c.whole).count();
    let shared = cells
        .iter()
        .filter(|c| !c.whole && c.taken > placement::Bytes::ZERO)
        .count();
    let free = cells
        .iter()
        .filter(|c| c.healthy && !c.whole && c.taken == placement::Bytes::ZERO)
        .count();
    let unhealthy = cells.iter().filter(|c| !c.healthy).count();
    format!(
        "{} GPU{}: {whole} whole, {shared} shared, {free} free{}",
        cells.len(),
        if cells.len() == 1 { "" } else { "s" },
        if unhealthy > 0 {
            format!("; {unhealthy} unhealthy")
        } else {
            String::new()
        }
    )
}

/// A sortable column's heading: a link to the same page in its order, marked when it is the order.
#[component]
fn SortBy(label: &'static str, by: NodeSort, sort: NodeSort, search: String) -> impl IntoView {
    let current = by == sort;
    let (direction, arrow) = match by {
        NodeSort::Free | NodeSort::Health | NodeSort::Models => ("descending", " ↓"),
        _ => ("ascending", " ↑"),
    };
    view! {
        <th scope="col" aria-sort=current.then_some(direction)>
            <A href=nodes_address(&search, 1, by) attr:data-testid=format!("sort-{}", by.as_str())>
                {label}{current.then_some(arrow)}
            </A>
        </th>
    }
}

/// The table of nodes: a picture of each node's GPUs, and columns to sort by.
#[component]
pub fn NodesTable(
    /// The rows.
    rows: Vec<NodeRow>,
    /// The search, kept when the order changes.
    #[prop(optional)]
    search: String,
    /// The order shown.
    #[prop(optional)]
    sort: NodeSort,
) -> impl IntoView {
    view! {
        <table class="list nodes" data-testid="nodes">
            <thead>
                <tr>
                    <SortBy label="Node" by=NodeSort::Name sort search=search.clone() />
                    <th scope="col">"Group"</th>
                    <SortBy label="Models" by=NodeSort::Models sort search=search.clone() />
                    <SortBy label="GPU model" by=NodeSort::GpuModel sort search=search.clone() />
                    <SortBy label="GPUs" by=NodeSort::Health sort search=search.clone() />
                    <SortBy label="GPU memory" by=NodeSort::Free sort search />
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
                        let unhealthy = node.unhealthy();
                        view! {
                            <tr data-testid="node-row" data-node=key>
                                <th scope="row"><A href=href>{name}</A></th>
                                <td data-testid="node-group">{if node.groups.is_empty() { "—".to_owned() } else { node.groups.join(", ") }}</td>
                                <td data-testid="node-models">{if models.is_empty() { "—".to_owned() } else { models }}</td>
                                <td data-testid="node-gpu-model">{node.gpu_model.clone()}</td>
                                <td class="cells">
                                    <GpuCells cells=node.cells.clone() />
                                    {(unhealthy > 0).then(|| view! { <span class="tag bad" data-testid="node-unhealthy">{format!("{unhealthy} unhealthy")}</span> })}
                                </td>
                                <td data-testid="node-memory">{node.summary()}</td>
                            </tr>
                        }
                    })
                    .collect_view()}
            </tbody>
        </table>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_s_picture_says_in_words_what_its_gpus_hold() {
        let gb = placement::Bytes::gb;
        let cell = |taken, whole, healthy| GpuCell {
            total: gb(80),
            taken: gb(taken),
            outside: placement::Bytes::ZERO,
            whole,
            healthy,
        };
        assert_eq!(
            cells_label(&[
                cell(80, true, true),
                cell(20, false, true),
                cell(0, false, true),
                cell(0, false, false)
            ]),
            "4 GPUs: 1 whole, 1 shared, 1 free; 1 unhealthy"
        );
        assert_eq!(
            cells_label(&[cell(0, false, true)]),
            "1 GPU: 0 whole, 0 shared, 1 free"
        );
    }

    #[test]
    fn the_address_of_an_order_keeps_the_search_and_leaves_defaults_out() {
        assert_eq!(nodes_address("", 1, NodeSort::Name), "/nodes");
        assert_eq!(
            nodes_address("h200", 2, NodeSort::Free),
            "/nodes?q=h200&sort=free&page=2"
        );
    }
}
