//! Tessera's console: the pages, their components and the server functions behind them.
//!
//! Built twice: with `ssr` into the server, which renders every page, and with `hydrate` into the wasm
//! bundle that makes the rendered page live in the browser.
#![forbid(unsafe_code)]
// The pages are deeply nested views; release builds (which keep their full types) need the room.
#![recursion_limit = "256"]

pub mod components;
pub mod deploy_form;
pub mod error;
pub mod pages;
#[cfg(feature = "ssr")]
pub mod services;
pub mod share_form;
pub mod views;

use components::live::provide_live;
use leptos::prelude::*;
use leptos_meta::{provide_meta_context, Link, MetaTags, Stylesheet, Title};
use leptos_router::components::{Route, Router, Routes, A};
use leptos_router::path;
use pages::deploy::DeployPage;
use pages::machine::MachinePage;
use pages::models::ModelsPage;
use pages::nodes::NodesPage;
use pages::serving::ServingPage;
use pages::sharing::SharingPage;
use pages::usage::UsagePage;

/// The HTML document around the app, rendered on the server.
pub fn shell(options: LeptosOptions) -> impl IntoView {
    view! {
        <!DOCTYPE html>
        <html lang="en">
            <head>
                <meta charset="utf-8" />
                <meta name="viewport" content="width=device-width, initial-scale=1" />
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
    provide_live();
    view! {
        <Stylesheet id="leptos" href="/pkg/tessera.css" />
        <Title text="Tessera" />
        <Link rel="icon" type_="image/svg+xml" href="/favicon.svg" />
        <Router>
            <a class="skip" href="#main">"Skip to the content"</a>
            <header class="top">
                <A href="/" attr:class="brand">"Tessera"</A>
                <nav aria-label="Console">
                    <A href="/" exact=true>"Cluster"</A>
                    <A href="/usage">"Usage"</A>
                </nav>
            </header>
            <main id="main">
                <Routes fallback=|| view! { <h1>"Page not found"</h1> }>
                    <Route path=path!("") view=ModelsPage />
                    <Route path=path!("nodes") view=NodesPage />
                    <Route path=path!("deploy") view=DeployPage />
                    <Route path=path!("machines/:name") view=MachinePage />
                    <Route path=path!("models/:name/sharing") view=SharingPage />
                    <Route path=path!("models/:name/serving") view=ServingPage />
                    <Route path=path!("usage") view=UsagePage />
                </Routes>
            </main>
        </Router>
    }
}

/// The wasm entry point: makes the server-rendered page live.
#[cfg(feature = "hydrate")]
#[wasm_bindgen::prelude::wasm_bindgen]
pub fn hydrate() {
    console_error_panic_hook::set_once();
    leptos::mount::hydrate_body(App);
}
