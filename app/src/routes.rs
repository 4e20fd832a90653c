//! The console's routes, each page's code loaded the first time it is shown: the first download holds only
//! the shell, the router and the reactive runtime, and each page's view comes in a chunk of its own
//! (BENCHMARKS.md). The browser half must therefore always be built with `--split` (`cargo leptos serve
//! --split`, `build --split --frontend-only` in the tests, `build --release --split`): without it the
//! pages' code imports a module that does not exist and no page hydrates.

use crate::pages::admin::AdminPage;
use crate::pages::audit::AuditPage;
use crate::pages::deploy::DeployPage;
use crate::pages::machine::MachinePage;
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

/// A route whose view is `$page` and whose code is loaded when it is first shown.
macro_rules! lazy_page {
    ($(#[$doc:meta])* $route:ident => $page:ident) => {
        $(#[$doc])*
        pub struct $route;

        #[lazy_route]
        impl LazyRoute for $route {
            fn data() -> Self {
                $route
            }

            fn view(_this: Self) -> AnyView {
                view! { <$page /> <Hydrated /> }.into_any()
            }
        }
    };
}

lazy_page!(/// The Overview, the landing page.
    OverviewRoute => OverviewPage);
lazy_page!(/// Cluster → Models.
    Models => ModelsPage);
lazy_page!(/// Cluster → Nodes.
    Nodes => NodesPage);
lazy_page!(/// The Deploy a model wizard.
    Deploy => DeployPage);
lazy_page!(/// A machine's page.
    MachineRoute => MachinePage);
lazy_page!(/// The GPU sharing form of a running model.
    Sharing => SharingPage);
lazy_page!(/// The Serving configuration form of a running model.
    ServingRoute => ServingPage);
lazy_page!(/// Cluster → Repack.
    Repack => RepackPage);
lazy_page!(/// The Usage page.
    Usage => UsagePage);
lazy_page!(/// The playground.
    PlaygroundRoute => PlaygroundPage);
lazy_page!(/// The audit log.
    Audit => AuditPage);
lazy_page!(/// Accounts and API tokens.
    Admin => AdminPage);
lazy_page!(/// Signing in.
    SignIn => SignInPage);
lazy_page!(/// The first start's setup.
    Setup => SetupPage);
