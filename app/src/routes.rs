//! The console's routes, each page's code loaded the first time it is shown: the first download holds only
//! the shell, the router and the reactive runtime, and each page's view comes in a chunk of its own
//! (BENCHMARKS.md). The browser half must therefore always be built with `--split` (`cargo leptos serve
//! --split`, `build --split --frontend-only` in the tests, `build --release --split`): without it the
//! pages' code imports a module that does not exist and no page hydrates.

use crate::pages::admin::AdminPage;
use crate::pages::audit::AuditPage;
use crate::pages::deploy::DeployPage;
use crate::pages::machine::MachinePage;
use crate::pages::model::ModelOwnPage;
use crate::pages::models::ModelsPage;
use crate::pages::nodes::NodesPage;
use crate::pages::overview::OverviewPage;
use crate::pages::playground::PlaygroundPage;
use crate::pages::repack::RepackPage;
use crate::pages::serving::ServingPage;
use crate::pages::sharing::SharingPage;
use crate::pages::sign_in::{SetupPage, SignInPage};
use crate::pages::usage::UsagePage;
use leptos::prelude::*;
use leptos_meta::Title;
use leptos_router::{lazy_route, LazyRoute};

/// Whether the page on show has hydrated: its code may arrive after the shell's, so the shell alone
/// cannot say.
#[derive(Debug, Clone, Copy)]
pub struct PageHydrated(pub RwSignal<bool>);

/// Marks the page as hydrated once its own code has run in the browser (effects run there only).
#[component]
fn Hydrated() -> impl IntoView {
    if let Some(PageHydrated(done)) = use_context::<PageHydrated>() {
        Effect::new(move |_| done.set(true));
    }
}

/// The route's parameter `key`, as a page's title: the machine's name.
fn named(key: &'static str) -> String {
    leptos_router::hooks::use_params_map().with_untracked(|p| p.get(key).unwrap_or_default())
}

/// [`named`], then what the page does with it: "glm-5.3: GPU sharing".
fn named_as(key: &'static str, what: &str) -> String {
    format!("{}: {what}", named(key))
}

/// A route whose view is `$page`, titled `$title` (a page's title: "Nodes · Tessera"), and whose code is
/// loaded when it is first shown.
macro_rules! lazy_page {
    ($(#[$doc:meta])* $route:ident => $page:ident, $title:expr) => {
        $(#[$doc])*
        pub struct $route;

        #[lazy_route]
        impl LazyRoute for $route {
            fn data() -> Self {
                $route
            }

            fn view(_this: Self) -> AnyView {
                view! { <Title text=$title /> <$page /> <Hydrated /> }.into_any()
            }
        }
    };
}

lazy_page!(/// The Overview, the landing page.
    OverviewRoute => OverviewPage, "Overview");
lazy_page!(/// Cluster → Models.
    Models => ModelsPage, "Models");
lazy_page!(/// Cluster → Nodes.
    Nodes => NodesPage, "Nodes");
lazy_page!(/// The Deploy a model wizard.
    Deploy => DeployPage, "Deploy a model");
lazy_page!(/// A machine's page.
    MachineRoute => MachinePage, named("name"));
lazy_page!(/// A model's own page.
    ModelRoute => ModelOwnPage, named("name"));
lazy_page!(/// The GPU sharing form of a running model.
    Sharing => SharingPage, named_as("name", "GPU sharing"));
lazy_page!(/// The Serving configuration form of a running model.
    ServingRoute => ServingPage, named_as("name", "serving configuration"));
lazy_page!(/// Cluster → Repack.
    Repack => RepackPage, "Repack");
lazy_page!(/// The Usage page.
    Usage => UsagePage, "Usage");
lazy_page!(/// The playground.
    PlaygroundRoute => PlaygroundPage, "Playground");
lazy_page!(/// The audit log.
    Audit => AuditPage, "Audit log");
lazy_page!(/// Accounts and API tokens.
    Admin => AdminPage, "Accounts and API tokens");
lazy_page!(/// Signing in.
    SignIn => SignInPage, "Sign in");
lazy_page!(/// The first start's setup.
    Setup => SetupPage, "Set up");
