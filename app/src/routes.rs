//! The console's routes, each page's code loaded the first time it is shown: the first download holds only
//! the shell, the router and the reactive runtime, and each page's view comes in a chunk of its own
//! (BENCHMARKS.md). The browser half must therefore always be built with `--split` (`cargo leptos serve
//! --split`, `end-to-end --split`, `build --release --split`): without it the pages' code imports a module
//! that does not exist and no page hydrates.

use crate::pages::admin::AdminPage;
use crate::pages::audit::AuditPage;
use crate::pages::deploy::DeployPage;
use crate::pages::machine::MachinePage;
use crate::pages::models::ModelsPage;
use crate::pages::nodes::NodesPage;
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

/// Cluster → Models.
pub struct Models;

#[lazy_route]
impl LazyRoute for Models {
    fn data() -> Self {
        Models
    }

    fn view(_this: Self) -> AnyView {
        view! { <ModelsPage /> <Hydrated /> }.into_any()
    }
}

/// Cluster → Nodes.
pub struct Nodes;

#[lazy_route]
impl LazyRoute for Nodes {
    fn data() -> Self {
        Nodes
    }

    fn view(_this: Self) -> AnyView {
        view! { <NodesPage /> <Hydrated /> }.into_any()
    }
}

/// The Deploy a model wizard.
pub struct Deploy;

#[lazy_route]
impl LazyRoute for Deploy {
    fn data() -> Self {
        Deploy
    }

    fn view(_this: Self) -> AnyView {
        view! { <DeployPage /> <Hydrated /> }.into_any()
    }
}

/// A machine's page.
pub struct MachineRoute;

#[lazy_route]
impl LazyRoute for MachineRoute {
    fn data() -> Self {
        MachineRoute
    }

    fn view(_this: Self) -> AnyView {
        view! { <MachinePage /> <Hydrated /> }.into_any()
    }
}

/// The GPU sharing form of a running model.
pub struct Sharing;

#[lazy_route]
impl LazyRoute for Sharing {
    fn data() -> Self {
        Sharing
    }

    fn view(_this: Self) -> AnyView {
        view! { <SharingPage /> <Hydrated /> }.into_any()
    }
}

/// The Serving configuration form of a running model.
pub struct ServingRoute;

#[lazy_route]
impl LazyRoute for ServingRoute {
    fn data() -> Self {
        ServingRoute
    }

    fn view(_this: Self) -> AnyView {
        view! { <ServingPage /> <Hydrated /> }.into_any()
    }
}

/// The Usage page.
pub struct Usage;

#[lazy_route]
impl LazyRoute for Usage {
    fn data() -> Self {
        Usage
    }

    fn view(_this: Self) -> AnyView {
        view! { <UsagePage /> <Hydrated /> }.into_any()
    }
}

/// The audit log.
pub struct Audit;

#[lazy_route]
impl LazyRoute for Audit {
    fn data() -> Self {
        Audit
    }

    fn view(_this: Self) -> AnyView {
        view! { <AuditPage /> <Hydrated /> }.into_any()
    }
}

/// Accounts and API tokens.
pub struct Admin;

#[lazy_route]
impl LazyRoute for Admin {
    fn data() -> Self {
        Admin
    }

    fn view(_this: Self) -> AnyView {
        view! { <AdminPage /> <Hydrated /> }.into_any()
    }
}

/// Signing in.
pub struct SignIn;

#[lazy_route]
impl LazyRoute for SignIn {
    fn data() -> Self {
        SignIn
    }

    fn view(_this: Self) -> AnyView {
        view! { <SignInPage /> <Hydrated /> }.into_any()
    }
}

/// The first start's setup.
pub struct Setup;

#[lazy_route]
impl LazyRoute for Setup {
    fn data() -> Self {
        Setup
    }

    fn view(_this: Self) -> AnyView {
        view! { <SetupPage /> <Hydrated /> }.into_any()
    }
}
