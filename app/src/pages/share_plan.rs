//! The share plan page: the sample group's Shared GPU memory panel, judged in the browser on every keystroke,
//! with a button that asks the server for its own verdict on the same plan.

use crate::components::share_panel::SharedGpuMemoryPanel;
use crate::error::AppError;
use crate::sample::text_router;
use crate::share_form::{self, verdict_lines, ShareRow};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use placement::{PlanMember, Verdict};

/// The server's verdict on a plan for the sample group. The server takes nothing from the browser but the
/// members' names and shares: the GPUs come from its own record, and the router keeps its committed share.
#[server(prefix = "/rpc", endpoint = "check_share_plan", input = Json)]
pub async fn check_share_plan(members: Vec<PlanMember>) -> Result<Verdict, AppError> {
    let group = text_router();
    let bad_request = |message: String| {
        leptos::prelude::expect_context::<leptos_axum::ResponseOptions>()
            .set_status(http::StatusCode::BAD_REQUEST);
        AppError::BadRequest(message)
    };
    if let Some(stranger) = members
        .iter()
        .find(|sent| !group.members.iter().any(|m| m.name == sent.name))
    {
        return Err(bad_request(format!(
            "{} has no member named {}; send the group's members only.",
            group.name, stranger.name
        )));
    }
    let mut plan = Vec::with_capacity(group.members.len());
    for known in &group.members {
        let mut sent = members.iter().filter(|s| s.name == known.name);
        let (Some(sent), None) = (sent.next(), sent.next()) else {
            return Err(bad_request(format!(
                "Send every member of {} once; {} is missing or repeated.",
                group.name, known.name
            )));
        };
        let share = if known.locked {
            known.share
        } else {
            sent.share
        };
        plan.push(PlanMember {
            share,
            ..known.clone()
        });
    }
    Ok(placement::judge(&plan, &group.gpus))
}

/// The page.
#[component]
pub fn SharePlanPage() -> impl IntoView {
    let group = text_router();
    let gpu = group.gpus[0].clone();
    let rows = RwSignal::new(
        group
            .members
            .iter()
            .map(ShareRow::from_member)
            .collect::<Vec<_>>(),
    );
    let gpus = group.gpus.clone();
    let verdict = Memo::new(move |_| rows.with(|r| share_form::verdict(r, &gpus)));

    // Effects run only in the browser: this flips once the wasm has hydrated the page, for tests to wait on.
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));

    let check = ServerAction::<CheckSharePlan>::new();
    // The browser's verdict on the plan last sent, to set beside the server's.
    let sent = RwSignal::new(None::<Verdict>);
    let ask = move |_| {
        sent.set(Some(verdict.get_untracked()));
        check.dispatch(CheckSharePlan {
            members: rows.with_untracked(|r| share_form::plan(r)),
        });
    };
    let server_lines = move || match check.value().get() {
        None => Vec::new(),
        Some(Ok(v)) => verdict_lines(&v),
        Some(Err(e)) => vec![e.to_string()],
    };
    let agreement = move || match (check.value().get(), sent.get()) {
        (Some(Ok(server)), Some(browser)) if server == browser => {
            Some("The server's verdict matches the browser's.")
        }
        (Some(Ok(_)), Some(_)) => Some("The server's verdict differs from the browser's."),
        _ => None,
    };

    view! {
        <div class="page" data-hydrated=move || hydrated.get().to_string()>
        <h1>"Share plan"</h1>
        <p class="lede">
            "Group " <strong>{group.name}</strong> " on " {gpu.gpu.to_string()} " (" {group.gpu_model} ", "
            {gpu.total.to_string()} "). The verdict below is worked out in your browser as you type."
        </p>
        <SharedGpuMemoryPanel rows verdict gpu_total=gpu.total />
        <section class="panel server-check" aria-labelledby="server-check">
            <h2 id="server-check">"The server's verdict"</h2>
            <p>"The server judges every plan again before it commits anything, and never trusts the browser's answer."</p>
            <button type="button" on:click=ask disabled=move || check.pending().get()>
                "Ask the server"
            </button>
            <ul
                class="verdict"
                class:refused=move || !matches!(check.value().get(), Some(Ok(v)) if !v.is_refused())
                data-testid="server-verdict"
                aria-live="polite"
            >
                {move || server_lines().into_iter().map(|line| view! { <li>{line}</li> }).collect_view()}
            </ul>
            <p data-testid="agreement">{agreement}</p>
        </section>
        </div>
    }
}
