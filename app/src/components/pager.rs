//! The way between the pages of a long table (Nodes, Models): where this page is among them, and the
//! buttons to the one before and the one after. The search and the page are in the address
//! (`?q=whisper&page=2`), so that a link or a reload shows the same rows.

use leptos::prelude::*;
use leptos_router::hooks::{use_navigate, use_query_map};
use leptos_router::NavigateOptions;

/// The search and the page (from 1) the address holds.
pub fn use_search_and_page() -> (Signal<String>, Signal<usize>) {
    let query = use_query_map();
    let search = Signal::derive(move || query.with(|q| q.get("q").unwrap_or_default()));
    let page = Signal::derive(move || {
        query.with(|q| {
            q.get("page")
                .and_then(|p| p.parse::<usize>().ok())
                .unwrap_or(1)
        })
    });
    (search, page)
}

/// The value of `page=` in the address: none for the first page.
pub fn page_param(page: usize) -> String {
    if page > 1 {
        page.to_string()
    } else {
        String::new()
    }
}

/// Shows an address in place of this one: a search typed or a page turned is not a step to go back to.
pub fn use_replace() -> impl Fn(&str) + Clone + Send + Sync + 'static {
    let navigate = use_navigate();
    move |address: &str| {
        navigate(
            address,
            NavigateOptions {
                replace: true,
                ..Default::default()
            },
        )
    }
}

/// "Page 2 of 25 · nodes 51–100 of 1254", Previous and Next.
#[component]
pub fn Pager<F>(
    /// This page, from 1.
    page: usize,
    /// Pages in all.
    pages: usize,
    /// Which rows it shows, of how many.
    shown: String,
    /// What the pages are of, for a screen reader: "Pages of nodes".
    label: &'static str,
    /// The test id of the line that says where it is.
    testid: &'static str,
    /// Shows a page.
    go: F,
) -> impl IntoView
where
    F: Fn(usize) + Clone + Send + Sync + 'static,
{
    let back = {
        let go = go.clone();
        move |_: leptos::ev::MouseEvent| go(page - 1)
    };
    let forward = move |_: leptos::ev::MouseEvent| go(page + 1);
    view! {
        <nav class="pages" aria-label=label>
            <span data-testid=testid>{format!("Page {page} of {pages} · {shown}")}</span>
            <button type="button" class="secondary" disabled={page <= 1} on:click=back>"Previous"</button>
            <button type="button" class="secondary" disabled={page >= pages} on:click=forward>"Next"</button>
        </nav>
    }
}
