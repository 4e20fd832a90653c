//! Tessera's console: the pages, their components and the server functions behind them.
//!
//! Built twice: with `ssr` into the server, which renders every page, and with `hydrate` into the wasm
//! bundle that makes the rendered page live in the browser.
#![forbid(unsafe_code)]
// The pages are deeply nested views; release builds (which keep their full types) need the room.
#![recursion_limit = "256"]

pub mod components;
pub mod error;
pub mod pages;
pub mod sample;
pub mod share_form;

use leptos::prelude::*;
use leptos_meta::{provide_meta_context, Link, MetaTags, Stylesheet, Title};
use leptos_router::components::{Route, Router, Routes, A};
use leptos_router::path;
use pages::share_plan::SharePlanPage;

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
    view! {
        <Stylesheet id="leptos" href="/pkg/tessera.css" />
        <Title text="Tessera" />
        <Link rel="icon" type_="image/svg+xml" href="/favicon.svg" />
        <Router>
            <header class="top">
                <A href="/" attr:class="brand">"Tessera"</A>
                <span class="tagline">"GPU sharing for models"</span>
            </header>
            <main>
                <Routes fallback=|| view! { <h1>"Page not found"</h1> }>
                    <Route path=path!("") view=SharePlanPage />
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
