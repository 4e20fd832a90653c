//! The audit log: every change, who made it and when, before → after, the revision it made and who
//! restarted; narrowed by who, what and to what.

use crate::error::AppError;
use crate::views::{AuditLine, AuditQuery};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::hooks::use_query_map;

/// The entries `query` picks, newest first.
#[server(prefix = "/rpc", endpoint = "load_audit", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_audit(query: AuditQuery) -> Result<Vec<AuditLine>, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.audit(query)).await
}

/// `/audit`.
#[component]
pub fn AuditPage() -> impl IntoView {
    let params = use_query_map();
    let query = move || {
        params.with(|p| AuditQuery {
            actor: p.get("actor").unwrap_or_default(),
            action: p.get("action").unwrap_or_default(),
            target: p.get("target").unwrap_or_default(),
        })
    };
    let entries = Resource::new(query, load_audit);
    let field = move |id: &'static str, label: &'static str, value: String| {
        view! {
            <div>
                <label for=id>{label}</label>
                <input id=id name=id type="text" value=value />
            </div>
        }
    };
    view! {
        <div class="page">
            <h1>"Audit log"</h1>
            <form class="period-picker" method="get" action="/audit">
                {move || {
                    let q = query();
                    view! {
                        {field("actor", "Who", q.actor)}
                        {field("action", "What (such as deploy, plan, worker)", q.action)}
                        {field("target", "To what", q.target)}
                    }
                }}
                <button type="submit">"Show"</button>
            </form>
            <Transition fallback=|| view! { <p>"Reading the log…"</p> }>
                {move || entries.get().map(|answer| match answer {
                    Ok(lines) if lines.is_empty() => view! { <p class="empty">"No change matches."</p> }.into_any(),
                    Ok(lines) => view! { <AuditTable lines /> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

#[component]
fn AuditTable(lines: Vec<AuditLine>) -> impl IntoView {
    view! {
        <table class="list audit" data-testid="audit">
            <thead>
                <tr>
                    <th scope="col">"When"</th>
                    <th scope="col">"Who"</th>
                    <th scope="col">"From"</th>
                    <th scope="col">"What"</th>
                    <th scope="col">"To what"</th>
                    <th scope="col">"Revision"</th>
                    <th scope="col">"Before → after"</th>
                    <th scope="col">"Restarted"</th>
                </tr>
            </thead>
            <tbody>
                {lines.into_iter().map(|l| view! {
                    <tr data-testid="audit-row">
                        <td>{l.at}</td>
                        <td data-testid="audit-actor">{l.actor}</td>
                        <td data-testid="audit-client">{l.client.unwrap_or_else(|| "—".to_owned())}</td>
                        <td data-testid="audit-action">{l.action}</td>
                        <th scope="row" data-testid="audit-target">{l.target}</th>
                        <td>{l.revision.map(|r| r.to_string()).unwrap_or_default()}</td>
                        <td class="change">
                            <code>{l.before.unwrap_or_else(|| "—".to_owned())}</code>
                            " → "
                            <code>{l.after.unwrap_or_else(|| "—".to_owned())}</code>
                        </td>
                        <td data-testid="audit-restarts">{l.restarts.join(", ")}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}
