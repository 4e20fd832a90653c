//! The Cluster section's tabs: Models and Nodes.

use leptos::prelude::*;
use leptos_router::components::A;

/// The tab bar above the Models and Nodes tabs.
#[component]
pub fn ClusterTabs() -> impl IntoView {
    view! {
        <nav class="tabs" aria-label="Cluster">
            <A href="/" exact=true>"Models"</A>
            <A href="/nodes">"Nodes"</A>
        </nav>
    }
}
