//! The audit log: every change, who made it and when, before → after, the revision it made and who
//! restarted; narrowed by who, what and to what.

use crate::error::AppError;
use crate::views::{AuditLine, AuditQuery, AUDIT_PAGE};
use crate::when::When;
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
            before: p.get("before").and_then(|b| b.parse().ok()),
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
                    Ok(mut lines) => {
                        // A page, and the way to the one before it when the server had more.
                        let older = (lines.len() > AUDIT_PAGE).then(|| {
                            lines.truncate(AUDIT_PAGE);
                            older_page(&query(), lines.last().map_or(0, |l| l.id))
                        });
                        let newest = query().before.is_some().then(|| older_page(&AuditQuery { before: None, ..query() }, 0));
                        view! {
                            <AuditTable lines />
                            <nav class="pages" aria-label="Pages of the audit log">
                                {newest.map(|href| view! { <a href=href data-testid="audit-newest">"Newest"</a> })}
                                {older.map(|href| view! { <a href=href data-testid="audit-older">"Older entries"</a> })}
                            </nav>
                        }.into_any()
                    }
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

/// The address of the Audit page narrowed as `query`, from entries older than `before` (0: the newest).
fn older_page(query: &AuditQuery, before: i64) -> String {
    let before = if before > 0 {
        before.to_string()
    } else {
        String::new()
    };
    crate::address::with_query(
        "/audit",
        &[
            ("actor", query.actor.clone()),
            ("action", query.action.clone()),
            ("target", query.target.clone()),
            ("before", before),
        ],
    )
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
                    <th scope="col">"What changed"</th>
                    <th scope="col">"Restarted"</th>
                </tr>
            </thead>
            <tbody>
                {lines.into_iter().map(|l| view! {
                    <tr data-testid="audit-row">
                        <td><When at=l.at /></td>
                        <td data-testid="audit-actor">{l.actor}</td>
                        <td data-testid="audit-client">{l.client.unwrap_or_else(|| "—".to_owned())}</td>
                        <td data-testid="audit-action">{l.action}</td>
                        <th scope="row" data-testid="audit-target">{l.target}</th>
                        <td>{l.revision.map(|r| r.to_string()).unwrap_or_default()}</td>
                        <td class="change">
                            <ul class="changed" data-testid="audit-changes">
                                {l.changes.into_iter().map(|line| view! { <li><code>{line}</code></li> }).collect_view()}
                            </ul>
                            <details>
                                <summary>"As recorded"</summary>
                                <code>{l.before.unwrap_or_else(|| "—".to_owned())}</code>
                                " → "
                                <code>{l.after.unwrap_or_else(|| "—".to_owned())}</code>
                            </details>
                        </td>
                        <td data-testid="audit-restarts">{l.restarts.join(", ")}</td>
                    </tr>
                }).collect_view()}
            </tbody>
        </table>
    }
    .into_any()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_keeps_what_the_log_is_narrowed_to() {
        let query = AuditQuery {
            actor: "admin".into(),
            action: String::new(),
            target: "text router".into(),
            before: Some(90),
        };
        assert_eq!(
            older_page(&query, 40),
            "/audit?actor=admin&target=text%20router&before=40"
        );
        assert_eq!(older_page(&AuditQuery::default(), 0), "/audit");
    }
}
