//! Signing in, and setting Tessera up: the first start, with no account yet, asks for the first admin.
//! Plain HTML forms that post to the server, so that they work before (and without) the wasm.

use crate::auth::page_csrf;
use leptos::prelude::*;
use leptos_router::hooks::use_query_map;

/// The sign-in page's line for the `error` the server sent back.
pub fn sign_in_error(error: &str, wait: Option<&str>) -> String {
    match error {
        // One answer for an unknown name and a wrong password: the page gives no name away.
        "wrong" => "The name or the password is wrong.".to_owned(),
        "throttled" => format!(
            "Too many failed sign-ins: wait {} seconds, then try again.",
            wait.unwrap_or("a few")
        ),
        "expired" => "The form had expired; it is fresh now, so try again.".to_owned(),
        _ => "Signing in failed; try again.".to_owned(),
    }
}

/// The setup page's line for the `error` the server sent back.
pub fn setup_error(error: &str) -> String {
    match error {
        "mismatch" => "The two passwords differ; type the same one twice.".to_owned(),
        "expired" => "The form had expired; it is fresh now, so try again.".to_owned(),
        why => format!("The admin could not be made: {why}."),
    }
}

/// `/login`.
#[component]
pub fn SignInPage() -> impl IntoView {
    let query = use_query_map();
    let error = move || {
        query.with(|q| {
            q.get("error")
                .map(|e| sign_in_error(&e, q.get("wait").as_deref()))
        })
    };
    let next = move || {
        query
            .with(|q| q.get("next"))
            .unwrap_or_else(|| "/".to_owned())
    };
    view! {
        <div class="page narrow">
            <h1>"Sign in to Tessera"</h1>
            {move || error().map(|e| view! { <p class="error" role="alert" data-testid="sign-in-error">{e}</p> })}
            <form class="panel" method="post" action="/login">
                <input type="hidden" name="csrf" value=page_csrf() />
                <input type="hidden" name="next" value=next />
                <label for="name">"Name"</label>
                <input id="name" name="name" type="text" class="wide" autocomplete="username" required=true />
                <label for="password">"Password"</label>
                <input id="password" name="password" type="password" class="wide" autocomplete="current-password" required=true />
                <div class="actions"><button type="submit" class="primary">"Sign in"</button></div>
            </form>
        </div>
    }
}

/// `/setup`: makes the first admin, then signs them in.
#[component]
pub fn SetupPage() -> impl IntoView {
    let query = use_query_map();
    let error = move || query.with(|q| q.get("error").map(|e| setup_error(&e)));
    view! {
        <div class="page narrow">
            <h1>"Set up Tessera"</h1>
            <p class="lede">"No account exists yet. Make the first admin: they can then add operators and viewers."</p>
            {move || error().map(|e| view! { <p class="error" role="alert" data-testid="setup-error">{e}</p> })}
            <form class="panel" method="post" action="/setup">
                <input type="hidden" name="csrf" value=page_csrf() />
                <label for="name">"Admin name"</label>
                <input id="name" name="name" type="text" class="wide" autocomplete="username" required=true />
                <label for="password">"Password (at least 12 characters)"</label>
                <input id="password" name="password" type="password" class="wide" autocomplete="new-password" minlength="12" required=true />
                <label for="again">"The password again"</label>
                <input id="again" name="again" type="password" class="wide" autocomplete="new-password" minlength="12" required=true />
                <div class="actions"><button type="submit" class="primary">"Make the admin"</button></div>
            </form>
        </div>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_name_and_a_wrong_password_read_the_same() {
        assert_eq!(
            sign_in_error("wrong", None),
            "The name or the password is wrong."
        );
        assert_eq!(
            sign_in_error("throttled", Some("30")),
            "Too many failed sign-ins: wait 30 seconds, then try again."
        );
    }
}
