//! Tessera's console: the pages, their components and the server functions behind them.
//!
//! Built twice: with `ssr` into the server, which renders every page, and with `hydrate` into the wasm
//! bundle that makes the rendered page live in the browser.
#![forbid(unsafe_code)]
// The pages are deeply nested views; release builds (which keep their full types) need the room.
#![recursion_limit = "256"]

pub mod address;
pub mod auth;
pub mod components;
pub mod csrf;
pub mod deploy_form;
pub mod error;
pub mod pages;
pub mod routes;
pub mod security;
#[cfg(feature = "ssr")]
pub mod services;
pub mod share_form;
pub mod views;
pub mod when;

use components::account_menu::{provide_signed_in, AccountMenu};
use components::cluster_tabs::TopNav;
use components::live::provide_live;
use leptos::prelude::*;
use leptos_meta::{provide_meta_context, Link, MetaTags, Stylesheet, Title};
use leptos_router::components::{Route, Router, Routes, A};
use leptos_router::{path, Lazy, SsrMode};

/// The HTML document around the app, rendered on the server: the session's CSRF token for the page's
/// changes to carry, and the page's nonce for its Content Security Policy (`security`).
pub fn shell(options: LeptosOptions) -> impl IntoView {
    #[cfg(feature = "ssr")]
    let csrf = auth::csrf_token().unwrap_or_default();
    #[cfg(not(feature = "ssr"))]
    let csrf = String::new();
    #[cfg(feature = "ssr")]
    if let (Some(parts), Some(nonce)) = (
        use_context::<http::request::Parts>(),
        leptos::nonce::use_nonce(),
    ) {
        if let Some(slot) = parts.extensions.get::<security::PageNonce>() {
            let _ = slot.0.set(nonce.to_string());
        }
    }
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
                <meta name="csrf-token" content=csrf />
                <AutoReload options=options.clone() />
                <HydrationScripts options />
                <MetaTags />
            </head>
            <body>
                <App />
            </body>
        </html>
    }
}

/// The console: the header and the routed pages.
#[component]
pub fn App() -> impl IntoView {
    provide_meta_context();
    provide_signed_in();
    provide_live();
    // Flips once the page on show has hydrated (routes::Hydrated), for tests to wait on.
    let hydrated = RwSignal::new(false);
    provide_context(routes::PageHydrated(hydrated));
    view! {
        <Stylesheet id="leptos" href="/pkg/tessera.css" />
        // Each page names itself first ("Nodes · Tessera"), so that tabs and history tell pages apart.
        <Title formatter=|page: String| if page.is_empty() { "Tessera".to_owned() } else { format!("{page} · Tessera") } />
        <Link rel="icon" type_="image/svg+xml" href="/favicon.svg" />
        <Router>
            <a class="skip" href="#main">"Skip to the content"</a>
            <header class="top">
                <A href="/" attr:class="brand">"Tessera"</A>
                <TopNav />
                <AccountMenu />
            </header>
            <main id="main" data-hydrated=move || hydrated.get().to_string()>
                // Async: each page is sent once its data is read, so it reads in full before any wasm runs.
                <Routes fallback=|| view! { <h1>"Page not found"</h1> }>
                    <Route path=path!("") view={Lazy::<routes::OverviewRoute>::new()} ssr=SsrMode::Async />
                    <Route path=path!("models") view={Lazy::<routes::Models>::new()} ssr=SsrMode::Async />
                    <Route path=path!("nodes") view={Lazy::<routes::Nodes>::new()} ssr=SsrMode::Async />
                    <Route path=path!("repack") view={Lazy::<routes::Repack>::new()} ssr=SsrMode::Async />
                    <Route path=path!("deploy") view={Lazy::<routes::Deploy>::new()} ssr=SsrMode::Async />
                    <Route path=path!("machines/:name") view={Lazy::<routes::MachineRoute>::new()} ssr=SsrMode::Async />
                    <Route path=path!("models/:name") view={Lazy::<routes::ModelRoute>::new()} ssr=SsrMode::Async />
                    <Route path=path!("models/:name/sharing") view={Lazy::<routes::Sharing>::new()} ssr=SsrMode::Async />
                    <Route path=path!("models/:name/serving") view={Lazy::<routes::ServingRoute>::new()} ssr=SsrMode::Async />
                    <Route path=path!("usage") view={Lazy::<routes::Usage>::new()} ssr=SsrMode::Async />
                    <Route path=path!("playground") view={Lazy::<routes::PlaygroundRoute>::new()} ssr=SsrMode::Async />
                    <Route path=path!("audit") view={Lazy::<routes::Audit>::new()} ssr=SsrMode::Async />
                    <Route path=path!("admin") view={Lazy::<routes::Admin>::new()} ssr=SsrMode::Async />
                    <Route path=path!("login") view={Lazy::<routes::SignIn>::new()} ssr=SsrMode::Async />
                    <Route path=path!("setup") view={Lazy::<routes::Setup>::new()} ssr=SsrMode::Async />
                </Routes>
            </main>
        </Router>
    }
}

/// For BENCHMARKS.md: the mean time, in microseconds, of the verdict the Shared GPU memory panel works out on
/// a keystroke (its fields read, then `placement::judge`), for a group of `members` on one 96 GB GPU, over
/// `rounds` verdicts, timed with `performance.now()` in the browser that runs it.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn time_verdict(members: u32, rounds: u32) -> f64 {
    use placement::{BasisPoints, Bytes, GpuRef, GroupGpu};
    let each = BasisPoints::WHOLE.get() / members.max(1);
    let rows: Vec<share_form::ShareRow> = (0..members)
        .map(|i| {
            share_form::ShareRow::from_member(&placement::PlanMember {
                locked: i == 0,
                ..placement::PlanMember::new(format!("model-{i}"), BasisPoints(each))
            })
        })
        .collect();
    let gpus = [GroupGpu {
        gpu: GpuRef::new("atlas", 0),
        total: Bytes::gb(96),
        held_outside: Bytes::ZERO,
        taken_by_others: Bytes::ZERO,
    }];
    let Some(clock) = web_sys::window().and_then(|w| w.performance()) else {
        return f64::NAN;
    };
    let start = clock.now();
    let mut refused = 0u32;
    for _ in 0..rounds {
        refused += u32::from(share_form::verdict(std::hint::black_box(&rows), &gpus).is_refused());
    }
    let elapsed = clock.now() - start;
    std::hint::black_box(refused);
    elapsed * 1000.0 / f64::from(rounds.max(1))
}

/// The wasm entry point: makes the server-rendered page live.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_lazy(App);
}
