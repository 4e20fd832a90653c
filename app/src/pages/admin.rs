//! Accounts and API tokens, for admins: who may sign in with which role, and the tokens scripts use. A
//! token's secret is shown once, when it is made.

use crate::auth::Role;
use crate::components::account_menu::signed_in;
use crate::components::confirm::Confirm;
use crate::error::AppError;
use crate::views::{AccountsPage, ApiToken, NewApiToken, TokenLimits, TokenScope};
use crate::when::When;
use leptos::prelude::*;
use leptos::server_fn::codec::Json;

/// Every account and token.
#[server(prefix = "/rpc", endpoint = "load_accounts", client = crate::csrf::CsrfClient)]
pub async fn load_accounts() -> Result<AccountsPage, AppError> {
    crate::auth::require(Role::Admin)?;
    let console = crate::services::console()?;
    crate::services::answer(console.accounts()).await
}

/// Makes an account.
#[server(prefix = "/rpc", endpoint = "add_account", input = Json, client = crate::csrf::CsrfClient)]
pub async fn add_account(name: String, role: Role, password: String) -> Result<(), AppError> {
    let actor = crate::auth::require(Role::Admin)?;
    let console = crate::services::console()?;
    crate::services::answer(console.create_account(actor, name, role, password)).await
}

/// Removes an account and its tokens.
#[server(prefix = "/rpc", endpoint = "remove_account", input = Json, client = crate::csrf::CsrfClient)]
pub async fn remove_account(name: String) -> Result<(), AppError> {
    let actor = crate::auth::require(Role::Admin)?;
    let console = crate::services::console()?;
    crate::services::answer(console.delete_account(actor, name)).await
}

/// Makes an API token acting for `user`, limited by `limits`.
#[server(prefix = "/rpc", endpoint = "add_token", input = Json, client = crate::csrf::CsrfClient)]
pub async fn add_token(
    user: String,
    name: String,
    limits: TokenLimits,
) -> Result<NewApiToken, AppError> {
    let actor = crate::auth::require(Role::Admin)?;
    let console = crate::services::console()?;
    crate::services::answer(console.create_token(actor, user, name, limits)).await
}

/// The limits the token form describes: inference only or not, the models listed (comma-separated; every
/// model when none), and the day it expires on (at its start, UTC; never when blank).
fn form_limits(inference: bool, models: &str, expires_on: &str) -> TokenLimits {
    let models: Vec<String> = models
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect();
    TokenLimits {
        scope: if inference {
            TokenScope::Inference
        } else {
            TokenScope::Api
        },
        models: (inference && !models.is_empty()).then_some(models),
        expires_at: (!expires_on.trim().is_empty())
            .then(|| format!("{}T00:00:00Z", expires_on.trim())),
    }
}

/// Revokes an API token.
#[server(prefix = "/rpc", endpoint = "revoke_token", input = Json, client = crate::csrf::CsrfClient)]
pub async fn revoke_token(id: i64) -> Result<(), AppError> {
    let actor = crate::auth::require(Role::Admin)?;
    let console = crate::services::console()?;
    crate::services::answer(console.revoke_token(actor, id)).await
}

/// `/admin`.
#[component]
pub fn AdminPage() -> impl IntoView {
    let add = ServerAction::<AddAccount>::new();
    let remove = ServerAction::<RemoveAccount>::new();
    let issue = ServerAction::<AddToken>::new();
    let revoke = ServerAction::<RevokeToken>::new();
    let page = Resource::new(
        move || {
            (
                add.version().get(),
                remove.version().get(),
                issue.version().get(),
                revoke.version().get(),
            )
        },
        |_| load_accounts(),
    );
    let failed = move || {
        [
            add.value().get().and_then(Result::err),
            remove.value().get().and_then(Result::err),
            issue.value().get().and_then(Result::err),
            revoke.value().get().and_then(Result::err),
        ]
        .into_iter()
        .flatten()
        .next()
    };
    view! {
        <div class="page">
            <h1>"Accounts and API tokens"</h1>
            {move || failed().map(|e| view! { <p class="error" role="alert" data-testid="admin-error">{e.to_string()}</p> })}
            <Transition fallback=|| view! { <p>"Loading the accounts…"</p> }>
                {move || page.get().map(|answer| match answer {
                    Ok(page) => view! { <Accounts page add remove issue revoke /> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

#[component]
fn Accounts(
    page: AccountsPage,
    add: ServerAction<AddAccount>,
    remove: ServerAction<RemoveAccount>,
    issue: ServerAction<AddToken>,
    revoke: ServerAction<RevokeToken>,
) -> impl IntoView {
    let confirming = RwSignal::new(None::<String>);
    let name = RwSignal::new(String::new());
    let role = RwSignal::new(Role::Operator);
    let password = RwSignal::new(String::new());
    let token_name = RwSignal::new(String::new());
    let names: Vec<String> = page.accounts.iter().map(|a| a.name.clone()).collect();
    let token_user = RwSignal::new(names.first().cloned().unwrap_or_default());
    let token_inference = RwSignal::new(false);
    let token_models = RwSignal::new(String::new());
    let token_expires = RwSignal::new(String::new());
    let secret = move || issue.value().get().and_then(Result::ok);
    view! {
        <section class="panel" aria-labelledby="accounts">
            <h2 id="accounts">"Accounts"</h2>
            <table class="list" data-testid="accounts">
                <thead><tr><th scope="col">"Name"</th><th scope="col">"Role"</th><th scope="col">"Since"</th><th scope="col"><span class="visually-hidden">"Actions"</span></th></tr></thead>
                <tbody>
                    {page.accounts.into_iter().map(|a| {
                        let who = a.name.clone();
                        view! {
                            <tr data-account=a.name.clone()>
                                <th scope="row">{a.name.clone()}</th>
                                <td>{a.role.as_str()}</td>
                                <td><When at=a.created_at /></td>
                                // One's own account is removed by another admin (the server refuses it too).
                                <td>{move || {
                                    let who = who.clone();
                                    signed_in().is_none_or(|me| me.name != who).then(|| view! {
                                        <button type="button" class="link" on:click=move |_| confirming.set(Some(who.clone()))>{format!("Remove {who}")}</button>
                                    })
                                }}</td>
                            </tr>
                        }
                    }).collect_view()}
                </tbody>
            </table>
            {move || confirming.get().map(|who| {
                let gone = who.clone();
                view! {
                    <Confirm
                        title=format!("Remove {who}?")
                        restarts=Vec::new()
                        line="The account and its API tokens stop working at once."
                        confirm="Remove"
                        destructive=true
                        pending=remove.pending()
                        on_confirm=move || {
                            remove.dispatch(RemoveAccount { name: gone.clone() });
                            confirming.set(None);
                        }
                        on_cancel=move || confirming.set(None)
                    />
                }
            })}
            <form class="inline-form" on:submit=move |ev| {
                ev.prevent_default();
                add.dispatch(AddAccount { name: name.get_untracked(), role: role.get_untracked(), password: password.get_untracked() });
            }>
                <h3>"Add an account"</h3>
                <label for="account-name">"Name"</label>
                <input id="account-name" type="text" class="wide" autocomplete="off" required=true prop:value=move || name.get() on:input=move |ev| name.set(event_target_value(&ev)) />
                <label for="account-role">"Role"</label>
                <select id="account-role" on:change=move |ev| role.set(Role::parse(&event_target_value(&ev)).unwrap_or(Role::Viewer))>
                    {Role::ALL.into_iter().map(|r| view! { <option value=r.as_str() selected=move || role.get() == r>{r.as_str()}</option> }).collect_view()}
                </select>
                <label for="account-password">"Password (at least 12 characters)"</label>
                <input id="account-password" type="password" class="wide" autocomplete="new-password" required=true prop:value=move || password.get() on:input=move |ev| password.set(event_target_value(&ev)) />
                <div class="actions"><button type="submit" class="primary">"Add the account"</button></div>
            </form>
        </section>
        <section class="panel" aria-labelledby="tokens">
            <h2 id="tokens">"API tokens"</h2>
            <p class="muted">"Scripts send a token as Authorization: Bearer …; it acts with its account's role. An inference token calls only the gateway (/v1), for the models it names."</p>
            {move || secret().map(|t| view! {
                <div class="notice" role="status" data-testid="token-secret">
                    <p>{format!("The token {} for {}: copy it now, it is not shown again.", t.token.name, t.token.user)}</p>
                    <code>{t.secret}</code>
                </div>
            })}
            <TokenTable tokens=page.tokens revoke />
            <form class="inline-form" on:submit=move |ev| {
                ev.prevent_default();
                let limits = form_limits(token_inference.get_untracked(), &token_models.get_untracked(), &token_expires.get_untracked());
                issue.dispatch(AddToken { user: token_user.get_untracked(), name: token_name.get_untracked(), limits });
            }>
                <h3>"Make a token"</h3>
                <label for="token-name">"What it is for"</label>
                <input id="token-name" type="text" class="wide" autocomplete="off" placeholder="ci" required=true prop:value=move || token_name.get() on:input=move |ev| token_name.set(event_target_value(&ev)) />
                <label for="token-user">"Acting for"</label>
                <select id="token-user" on:change=move |ev| token_user.set(event_target_value(&ev))>
                    {names.into_iter().map(|n| { let v = n.clone(); view! { <option value=v selected=move || token_user.get() == n>{n.clone()}</option> } }).collect_view()}
                </select>
                <div class="toggle">
                    <input id="token-inference" type="checkbox" prop:checked=move || token_inference.get() on:change=move |ev| token_inference.set(event_target_checked(&ev)) />
                    <label for="token-inference">"Only for inference (the gateway, /v1)"</label>
                </div>
                <label for="token-models">"Models it may call (comma-separated; every model when blank)"</label>
                <input id="token-models" type="text" class="wide" autocomplete="off" placeholder="glm-5.3, embedder" disabled=move || !token_inference.get() prop:value=move || token_models.get() on:input=move |ev| token_models.set(event_target_value(&ev)) />
                <label for="token-expires">"Expires on (UTC; never when blank)"</label>
                <input id="token-expires" type="date" prop:value=move || token_expires.get() on:input=move |ev| token_expires.set(event_target_value(&ev)) />
                <div class="actions"><button type="submit" class="primary">"Make the token"</button></div>
            </form>
        </section>
    }
    .into_any()
}

#[component]
fn TokenTable(tokens: Vec<ApiToken>, revoke: ServerAction<RevokeToken>) -> impl IntoView {
    if tokens.is_empty() {
        return view! { <p class="empty">"No token yet."</p> }.into_any();
    }
    let confirming = RwSignal::new(None::<(i64, String)>);
    view! {
        <table class="list" data-testid="tokens">
            <thead><tr><th scope="col">"Token"</th><th scope="col">"For"</th><th scope="col">"Starts"</th><th scope="col">"May call"</th><th scope="col">"Made"</th><th scope="col">"Last used"</th><th scope="col">"State"</th></tr></thead>
            <tbody>
                {tokens.into_iter().map(|t| {
                    let id = t.id;
                    let state = match &t.revoked_at {
                        Some(at) => view! { <span>{format!("revoked {at}")}</span> }.into_any(),
                        None => view! {
                            <button type="button" class="link" on:click={
                                let name = t.name.clone();
                                move |_| confirming.set(Some((id, name.clone())))
                            }>{format!("Revoke {}", t.name)}</button>
                        }.into_any(),
                    };
                    view! {
                        <tr data-token=t.name.clone()>
                            <th scope="row">{t.name.clone()}</th>
                            <td>{t.user}</td>
                            <td><code>{format!("{}…", t.prefix)}</code></td>
                            <td>{t.limits.describe()}</td>
                            <td><When at=t.created_at /></td>
                            <td>{match t.last_used_at { Some(at) => view! { <When at /> }.into_any(), None => "never".into_any() }}</td>
                            <td>{state}</td>
                        </tr>
                    }
                }).collect_view()}
            </tbody>
        </table>
        {move || confirming.get().map(|(id, name)| view! {
            <Confirm
                title=format!("Revoke {name}?")
                restarts=Vec::new()
                line="Requests that carry this token are refused from now on; it cannot be restored."
                confirm="Revoke"
                destructive=true
                pending=revoke.pending()
                on_confirm=move || {
                    revoke.dispatch(RevokeToken { id });
                    confirming.set(None);
                }
                on_cancel=move || confirming.set(None)
            />
        })}
    }
    .into_any()
}
