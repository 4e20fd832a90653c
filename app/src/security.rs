//! The Content Security Policy of the console's pages. The server puts an empty [`PageNonce`] into each
//! request; the shell writes the page's nonce into it as it renders; the server's security middleware then
//! sends the policy with that nonce. (Setting the header from the shell through Leptos's response options
//! lost it now and then, in release builds with split wasm.)

use std::sync::{Arc, OnceLock};

/// Where the shell leaves the nonce of the page it renders.
#[derive(Debug, Clone, Default)]
pub struct PageNonce(pub Arc<OnceLock<String>>);

/// Scripts only from the console itself or with this page's nonce (the hydration script), WebAssembly
/// allowed to compile, styles only from the console's stylesheet, no plugins, no framing.
pub fn page_policy(nonce: &str) -> String {
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; \
         img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; \
         form-action 'self'; frame-ancestors 'none'"
    )
}
