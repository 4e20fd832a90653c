//! The header's account box: who is signed in, with which role, and the sign-out form.

use crate::auth::{page_csrf, Caller};
use crate::error::AppError;
use leptos::prelude::*;

/// The caller of this page, if someone is signed in.
#[server(prefix = "/rpc", endpoint = "current_caller", client = crate::csrf::CsrfClient)]
pub async fn current_caller() -> Result<Option<Caller>, AppError> {
    Ok(crate::auth::caller())
}

/// The signed-in account, read once per page load and shared by the header's pieces.
#[derive(Debug, Clone, Copy)]
pub struct SignedIn(pub Resource<Result<Option<Caller>, AppError>>);

/// Provides [`SignedIn`].
pub fn provide_signed_in() {
    provide_context(SignedIn(Resource::new(|| (), |_| current_caller())));
}

/// The signed-in account, as far as it is known yet.
pub fn signed_in() -> Option<Caller> {
    expect_context::<SignedIn>()
        .0
        .get()
        .and_then(Result::ok)
        .flatten()
}

/// Who is signed in, and the sign-out form.
#[component]
pub fn AccountMenu() -> impl IntoView {
    view! {
        <Suspense fallback=|| ()>
            {move || signed_in().map(|caller| view! {
                <form class="account" method="post" action="/logout">
                    <span data-testid="signed-in">{format!("{} · {}", caller.name, caller.role.as_str())}</span>
                    <input type="hidden" name="csrf" value=page_csrf() />
                    <button type="submit" class="secondary small">"Sign out"</button>
                </form>
            })}
        </Suspense>
    }
}
