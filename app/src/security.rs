//! The Content Security Policy of the console's pages, sent with each page by the shell.

/// Scripts only from the console itself or with this page's nonce (the hydration script), WebAssembly
/// allowed to compile, styles only from the console's stylesheet, no plugins, no framing.
pub fn page_policy(nonce: &str) -> String {
    format!(
        "default-src 'self'; script-src 'self' 'nonce-{nonce}' 'wasm-unsafe-eval'; style-src 'self'; \
         img-src 'self' data:; connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'self'; \
         form-action 'self'; frame-ancestors 'none'"
    )
}
