//! The console's navigation: the top bar's sections (the Overview first), and the Cluster section's tabs
//! (Models, Nodes, Repack).

use crate::auth::Role;
use crate::components::account_menu::signed_in;
use leptos::prelude::*;
use leptos_router::components::A;
use leptos_router::hooks::use_location;

/// Whether `path` is a page of the Cluster section: the tabs and the pages they lead to.
fn in_cluster(path: &str) -> bool {
    ["/models", "/nodes", "/repack", "/deploy", "/machines/"]
        .iter()
        .any(|p| path.starts_with(p))
}

/// Whether `path` is a page one sees before signing in, where the console's sections lead nowhere yet.
fn before_sign_in(path: &str) -> bool {
    matches!(path, "/login" | "/setup")
}

/// The top bar's sections; the current one is marked for assistive technology and the eye. Admins also
/// see Accounts. The sign-in and setup pages have none.
#[component]
pub fn TopNav() -> impl IntoView {
    let location = use_location();
    let cluster = move || in_cluster(&location.pathname.get()).then_some("page");
    let at = move |path: &'static str| move || (location.pathname.get() == path).then_some("page");
    let admin = move || signed_in().is_some_and(|c| c.role == Role::Admin);
    let shown = move || !before_sign_in(&location.pathname.get());
    view! {
        <Show when=shown>
        <nav aria-label="Console">
            <a href="/" aria-current=at("/")>"Overview"</a>
            <a href="/models" aria-current=cluster>"Cluster"</a>
            <a href="/playground" aria-current=at("/playground")>"Playground"</a>
            <a href="/usage" aria-current=at("/usage")>"Usage"</a>
            <a href="/audit" aria-current=at("/audit")>"Audit"</a>
            <Suspense fallback=|| ()>
                {move || admin().then(|| view! { <a href="/admin" aria-current=at("/admin")>"Accounts"</a> })}
            </Suspense>
        </nav>
        </Show>
    }
}

/// The tab bar above the Models and Nodes tabs.
#[component]
pub fn ClusterTabs() -> impl IntoView {
    view! {
        <nav class="tabs" aria-label="Cluster">
            <A href="/models" exact=true>"Models"</A>
            <A href="/nodes">"Nodes"</A>
            <A href="/repack">"Repack"</A>
        </nav>
    }
}

#[cfg(test)]
mod tests {
    use super::{before_sign_in, in_cluster};

    #[test]
    fn the_cluster_section_covers_its_tabs_and_what_they_lead_to() {
        for path in [
            "/models",
            "/nodes",
            "/repack",
            "/deploy",
            "/models/vision/sharing",
            "/machines/majin",
        ] {
            assert!(in_cluster(path), "{path}");
        }
        assert!(!in_cluster("/usage"));
        assert!(!in_cluster("/"), "the Overview is a section of its own");
    }

    #[test]
    fn the_sign_in_and_setup_pages_come_before_the_console_s_sections() {
        assert!(before_sign_in("/login"));
        assert!(before_sign_in("/setup"));
        assert!(!before_sign_in("/"));
        assert!(!before_sign_in("/admin"));
    }
}
