//! The way between the pages of a long table (Nodes, Models): where this page is among them, and the
//! buttons to the one before and the one after.

use leptos::prelude::*;

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
