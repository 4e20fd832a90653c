//! Repack (seed 001): moves of shared work that free whole GPUs, with the fewest restarts. The plan that
//! frees the most comes with the fleet from the server (worked out there once, not again as the page
//! hydrates: seconds at ten thousand GPUs); another ask is planned here in the browser, by the same
//! `placement` code the server runs again before it commits. Shown before anything changes: each move and
//! its restarts, the GPUs freed, the GPUs it changes before and after, and the order of stops and starts
//! (fifty of each at first, and more on asking: a fleet's repack may move tens of thousands of units).
//! Carried out, it moves one unit at a time and can be stopped between moves.

use crate::auth::Role;
use crate::components::account_menu::signed_in;
use crate::components::cluster_tabs::ClusterTabs;
use crate::components::confirm::Confirm;
use crate::components::live::use_live;
use crate::error::AppError;
use crate::views::{RepackPreview, RepackRun, RightSized};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use placement::repack::Goal;
use placement::{BasisPoints, GpuLoad, GpuRef, Move, RepackInput, RepackPlan, RepackStep};

/// The fleet as committed, for the plan to be worked out from, and the plan that frees the most GPUs.
#[server(prefix = "/rpc", endpoint = "load_repack_preview", client = crate::csrf::CsrfClient)]
pub async fn load_repack_preview() -> Result<RepackPreview, AppError> {
    crate::auth::require(Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.repack_preview()).await
}

/// The members whose measured peak allows a smaller share, with that share.
#[server(prefix = "/rpc", endpoint = "load_right_sized", client = crate::csrf::CsrfClient)]
pub async fn load_right_sized() -> Result<Vec<RightSized>, AppError> {
    crate::auth::require(Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.right_sized()).await
}

/// The repack being carried out, or the last one.
#[server(prefix = "/rpc", endpoint = "load_repack_run", client = crate::csrf::CsrfClient)]
pub async fn load_repack_run() -> Result<Option<RepackRun>, AppError> {
    crate::auth::require(Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.repack_run()).await
}

/// Starts carrying out the repack whose moves the operator was shown.
#[server(prefix = "/rpc", endpoint = "start_repack", input = Json, client = crate::csrf::CsrfClient)]
pub async fn start_repack(free: Option<usize>, expect: Vec<Move>) -> Result<RepackRun, AppError> {
    let actor = crate::auth::require(Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.start_repack(actor, free, expect)).await
}

/// Stops the repack before its next move.
#[server(prefix = "/rpc", endpoint = "stop_repack", input = Json, client = crate::csrf::CsrfClient)]
pub async fn stop_repack() -> Result<RepackRun, AppError> {
    let actor = crate::auth::require(Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.stop_repack(actor)).await
}

/// How many GPUs the field asks to free: none typed is as many as the repack can.
fn goal(free: &str) -> Result<Option<usize>, String> {
    let free = free.trim();
    if free.is_empty() {
        return Ok(None);
    }
    match free.parse::<usize>() {
        Ok(0) | Err(_) => Err(format!(
            "Type a whole number of GPUs, 1 or more, or leave it empty to free as many as the repack can; {free:?} is neither."
        )),
        Ok(n) => Ok(Some(n)),
    }
}

/// What restarts when a holder moves: a worker by its name, a group member by its model; the room a
/// group keeps for its on-demand members is no engine.
fn restarted(holder: &str) -> Option<String> {
    let holder = placement::holder::Holder::parse(holder);
    (!holder.is_turns()).then(|| holder.name().to_owned())
}

fn restarts_of(moves: &[Move]) -> Vec<String> {
    moves
        .iter()
        .flat_map(|m| m.workers.iter().filter_map(|w| restarted(w)))
        .collect()
}

/// How many moves, steps and GPUs the plan lists at first, and how many more each "Show more" adds: a
/// fleet's repack may move tens of thousands of units.
const LISTED: usize = 50;
/// The most GPUs a line names before it counts the rest.
const NAMED: usize = 8;

/// The GPUs, the first [`NAMED`] by name and the rest counted.
fn gpus_text(gpus: &[GpuRef]) -> String {
    let mut text = gpus
        .iter()
        .take(NAMED)
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if gpus.len() > NAMED {
        text.push_str(&format!(" and {} more", gpus.len() - NAMED));
    }
    text
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The plan's one-line summary.
fn summary(plan: &RepackPlan) -> String {
    if plan.moves.is_empty() {
        return "Nothing to gain: no repack frees a GPU here.".to_owned();
    }
    let restarts = restarts_of(&plan.moves).len();
    let mut line = format!(
        "Frees {}: {} — {}, {}.",
        plural(plan.freed.len(), "GPU", "GPUs"),
        gpus_text(&plan.freed),
        plural(plan.moves.len(), "move", "moves"),
        plural(restarts, "restart", "restarts"),
    );
    if !plan.filled.is_empty() {
        line.push_str(&format!(
            " It puts work on {}, free now.",
            gpus_text(&plan.filled)
        ));
    }
    line
}

/// What right-sized shares would free, beside what the repack frees with the shares as they are.
fn right_sized_line(
    input: &RepackInput,
    goal: Goal,
    now: &RepackPlan,
    shares: &[RightSized],
) -> String {
    if shares.is_empty() {
        return "No model has yet run a day well below its share, so there is nothing to right-size.".to_owned();
    }
    let changes: Vec<(String, BasisPoints)> = shares
        .iter()
        .flat_map(|r| r.units.iter().map(move |u| (u.clone(), r.to)))
        .collect();
    let named = shares
        .iter()
        .map(|r| {
            format!(
                "{} {} % → {} %",
                r.member,
                r.from.percent_text(),
                r.to.percent_text()
            )
        })
        .collect::<Vec<_>>()
        .join(", ");
    let freed = match input.with_shares(&changes).plan(goal) {
        Ok(plan) => plan.freed.len(),
        Err(e) => return format!("With right-sized shares ({named}): {e}"),
    };
    let more = freed.saturating_sub(now.freed.len());
    format!(
        "With right-sized shares ({named}) the repack would free {}, {more} more than with the shares as they are. Right-size each from the Models tab first; this plan uses the shares as they are.",
        plural(freed, "GPU", "GPUs")
    )
}

/// `/repack`.
#[component]
pub fn RepackPage() -> impl IntoView {
    let live = use_live();
    let start = ServerAction::<StartRepack>::new();
    let stop = ServerAction::<StopRepack>::new();
    let tick = RwSignal::new(0u64);
    let preview = Resource::new(
        move || (live.track(), start.version().get()),
        |_| load_repack_preview(),
    );
    let run = Resource::new(
        move || {
            (
                live.track(),
                tick.get(),
                start.version().get(),
                stop.version().get(),
            )
        },
        |_| load_repack_run(),
    );
    let free = RwSignal::new(String::new());
    let right_sizing = RwSignal::new(false);
    let right_sized = Resource::new(
        move || (live.track(), right_sizing.get()),
        |(_, on)| async move {
            if on {
                load_right_sized().await.map(Some)
            } else {
                Ok(None)
            }
        },
    );
    let confirming = RwSignal::new(false);
    let operator = move || signed_in().is_some_and(|c| c.role.allows(Role::Operator));
    // While a repack runs, its progress is read again every second.
    Effect::new(move |_| {
        let running = run
            .get()
            .and_then(Result::ok)
            .flatten()
            .is_some_and(|r| r.state == "running");
        if running {
            set_timeout(
                move || tick.update(|t| *t += 1),
                std::time::Duration::from_secs(1),
            );
        }
    });
    let failed = move || {
        [
            start.value().get().and_then(Result::err),
            stop.value().get().and_then(Result::err),
        ]
        .into_iter()
        .flatten()
        .next()
    };
    view! {
        <div class="page">
            <h1>"Cluster"</h1>
            <ClusterTabs />
            <h2>"Repack"</h2>
            <p class="muted">"Moves shared work between GPUs so that whole GPUs come free, with the fewest restarts. Nothing changes until you carry it out; then it moves one unit at a time, each move's engines stopped (drained) before they start on their new GPU, and it can be stopped between moves."</p>
            {move || failed().map(|e| view! { <p class="error" role="alert" data-testid="repack-error">{e.to_string()}</p> })}
            <Transition fallback=|| view! { <p>"Reading the fleet…"</p> }>
                {move || run.get().map(|answer| match answer {
                    Ok(Some(run)) => view! { <RunPanel run stop operator=Signal::derive(operator) /> }.into_any(),
                    Ok(None) => ().into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
            <div class="inline-form">
                <label for="repack-free">"GPUs to free"</label>
                <input id="repack-free" type="text" inputmode="numeric" placeholder="as many as it can" autocomplete="off"
                    prop:value=move || free.get() on:input=move |ev| free.set(event_target_value(&ev)) />
                <label>
                    <input type="checkbox" data-testid="right-sized" prop:checked=move || right_sizing.get()
                        on:change=move |ev| right_sizing.set(event_target_checked(&ev)) />
                    " Count right-sized shares"
                </label>
            </div>
            <Transition fallback=|| view! { <p>"Working out the plan…"</p> }>
                {move || preview.get().map(|answer| match answer {
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                    Ok(RepackPreview { input, most }) => {
                        let asked = free.get();
                        let free = match goal(&asked) {
                            Ok(free) => free,
                            Err(why) => return view! { <p class="error" role="alert" data-testid="repack-refused">{why}</p> }.into_any(),
                        };
                        // The server's plan for the first ask; another ask is planned here.
                        let planned = match free {
                            None => most,
                            Some(n) => input.plan(Goal::Free(n)).map_err(|e| e.to_string()),
                        };
                        match planned {
                            Err(e) => view! { <p class="error" role="alert" data-testid="repack-refused">{e}</p> }.into_any(),
                            Ok(plan) => {
                                let moves = plan.moves.clone();
                                let restarts = restarts_of(&moves);
                                let can_start = !moves.is_empty();
                                let goal = free.map_or(Goal::Most, Goal::Free);
                                let counted = {
                                    let (input, plan) = (input.clone(), plan.clone());
                                    move || right_sized.get().and_then(|answer| match answer {
                                        Ok(Some(shares)) => Some(right_sized_line(&input, goal, &plan, &shares)),
                                        Ok(None) => None,
                                        Err(e) => Some(e.to_string()),
                                    })
                                };
                                view! {
                                    {move || counted().map(|line| view! { <p class="notice" role="status" data-testid="right-sized-line">{line}</p> })}
                                    <PlanView plan />
                                    {move || (operator() && can_start).then(|| view! {
                                        <div class="actions">
                                            <button type="button" class="primary" data-testid="repack-start" on:click=move |_| confirming.set(true)>"Carry out the repack"</button>
                                        </div>
                                    })}
                                    {move || confirming.get().then(|| {
                                        let expect = moves.clone();
                                        view! {
                                            <Confirm
                                                title="Carry out this repack?"
                                                restarts=restarts.clone()
                                                confirm="Carry out"
                                                pending=start.pending()
                                                on_confirm=move || {
                                                    start.dispatch(StartRepack { free, expect: expect.clone() });
                                                    confirming.set(false);
                                                }
                                                on_cancel=move || confirming.set(false)
                                            />
                                        }
                                    })}
                                }.into_any()
                            }
                        }
                    }
                })}
            </Transition>
        </div>
    }
}

#[component]
fn PlanView(plan: RepackPlan) -> impl IntoView {
    let most = (plan.freed.len() < plan.most).then(|| {
        format!(
            "By memory alone at most {} could come free; the requests' rules (ids, models, sizes, machines) keep the rest where they are.",
            plural(plan.most, "GPU", "GPUs")
        )
    });
    let summary_line = summary(&plan);
    // The fleet before and after, of the GPUs the plan changes: the others stay as they are.
    let changed: std::collections::BTreeSet<&GpuRef> =
        plan.moves.iter().flat_map(|m| [&m.from, &m.to]).collect();
    let fleet: Vec<(GpuLoad, GpuLoad)> = plan
        .before
        .iter()
        .zip(&plan.after)
        .filter(|(b, _)| changed.contains(&b.gpu))
        .map(|(b, a)| (b.clone(), a.clone()))
        .collect();
    let unchanged = plan.before.len() - fleet.len();
    let moves = std::sync::Arc::new(plan.moves);
    let steps = std::sync::Arc::new(plan.steps);
    let fleet = std::sync::Arc::new(fleet);
    let (moves_shown, steps_shown, fleet_shown) = (
        RwSignal::new(LISTED),
        RwSignal::new(LISTED),
        RwSignal::new(LISTED),
    );
    view! {
        <p class="summary" data-testid="repack-summary">{summary_line}</p>
        {most.map(|m| view! { <p class="muted" data-testid="repack-most">{m}</p> })}
        {(!moves.is_empty()).then(|| {
            let (listed, total) = (moves.clone(), moves.len());
            let (ordered, steps_total) = (steps.clone(), steps.len());
            let (gpus, gpus_total) = (fleet.clone(), fleet.len());
            view! {
                <table class="list" data-testid="repack-moves">
                    <caption>"Moves"</caption>
                    <thead><tr><th scope="col">"What"</th><th scope="col">"From"</th><th scope="col">"To"</th><th scope="col">"Memory"</th><th scope="col">"Restarts"</th></tr></thead>
                    <tbody>
                        {move || listed.iter().take(moves_shown.get()).map(|m| view! {
                            <tr data-testid="repack-move" data-unit=m.unit.clone()>
                                <th scope="row">{m.unit.clone()}</th>
                                <td>{m.from.to_string()}</td>
                                <td data-testid="repack-to">{m.to.to_string()}</td>
                                <td>{format!("{} GB", m.memory.gb_text())}</td>
                                <td>{restarts_of(std::slice::from_ref(m)).join(", ")}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
                <ShowMore total shown=moves_shown what="moves" testid="repack-moves-shown" />
                <h2>"In this order"</h2>
                <ol data-testid="repack-steps">
                    {move || ordered.iter().take(steps_shown.get()).map(|s| view! { <li data-testid="repack-step">{step_text(s)}</li> }).collect_view()}
                </ol>
                <ShowMore total=steps_total shown=steps_shown what="steps" testid="repack-steps-shown" />
                <table class="list" data-testid="repack-fleet">
                    <caption>"The GPUs it changes, before and after"</caption>
                    <thead><tr><th scope="col">"GPU"</th><th scope="col">"Now"</th><th scope="col">"After"</th></tr></thead>
                    <tbody>
                        {move || gpus.iter().take(fleet_shown.get()).map(|(b, a)| view! {
                            <tr data-gpu=b.gpu.id()>
                                <th scope="row">{b.gpu.to_string()}</th>
                                <td data-testid="repack-before">{load_text(b)}</td>
                                <td data-testid="repack-after">{load_text(a)}</td>
                            </tr>
                        }).collect_view()}
                    </tbody>
                </table>
                <ShowMore total=gpus_total shown=fleet_shown what="GPUs it changes" testid="repack-fleet-shown" />
                {(unchanged > 0).then(|| view! {
                    <p class="muted" data-testid="repack-unchanged">{format!("The other {} stay as they are.", plural(unchanged, "GPU", "GPUs"))}</p>
                })}
            }
        })}
    }
}

/// Under a list that shows the first `shown` of `total`: how many it shows, and a button for [`LISTED`]
/// more.
#[component]
fn ShowMore(
    total: usize,
    shown: RwSignal<usize>,
    what: &'static str,
    testid: &'static str,
) -> impl IntoView {
    move || {
        let now = shown.get();
        (now < total).then(|| {
            view! {
                <p class="muted" data-testid=testid>
                    {format!("The first {now} of {total} {what}. ")}
                    <button type="button" on:click=move |_| shown.update(|s| *s += LISTED)>
                        {format!("Show {} more", LISTED.min(total - now))}
                    </button>
                </p>
            }
        })
    }
}

fn step_text(step: &RepackStep) -> String {
    match step {
        RepackStep::Stop { unit, gpu } => format!("Stop {unit} on {gpu}"),
        RepackStep::Start { unit, gpu } => format!("Start {unit} on {gpu}"),
    }
}

fn load_text(load: &GpuLoad) -> String {
    if load.sharers.is_empty() {
        return format!("free ({} GB)", load.offered.gb_text());
    }
    format!(
        "{} — {} of {} GB",
        load.sharers.join(", "),
        load.taken.gb_text(),
        load.offered.gb_text()
    )
}

#[component]
fn RunPanel(
    run: RepackRun,
    stop: ServerAction<StopRepack>,
    operator: Signal<bool>,
) -> impl IntoView {
    let running = run.state == "running";
    let state = match run.state.as_str() {
        "running" => "Carrying out the repack",
        "done" => "The repack is done",
        "stopped" => "The repack was stopped; what moved stays moved",
        _ => "The repack stopped at a failed move; what moved before it stays moved",
    };
    view! {
        <section class="panel" aria-labelledby="repack-run" data-testid="repack-run" data-state=run.state.clone()>
            <h2 id="repack-run">{state}</h2>
            <p class="muted">{format!("Started by {}; it frees {}.", run.started_by, gpus_text(&run.plan.freed))}</p>
            <ol>
                {run.steps.iter().map(|s| {
                    let what = s.moves.iter().map(|m| format!("{} to {}", m.unit, m.to)).collect::<Vec<_>>().join(" and ");
                    view! {
                        <li data-testid="repack-progress" data-status=s.status.clone()>
                            {format!("{what}: {}", s.status)}
                            {s.message.clone().map(|m| view! { <span class="error">{format!(" — {m}")}</span> })}
                        </li>
                    }
                }).collect_view()}
            </ol>
            {move || (running && operator.get()).then(|| view! {
                <button type="button" data-testid="repack-stop" on:click=move |_| { stop.dispatch(StopRepack {}); }>"Stop after this move"</button>
            })}
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two 24 GB GPUs, chat and embed holding 14 GB each: no repack frees one.
    const TWO_HALF_FULL: &str = r#"{"inventory":{"machines":[{"name":"gpu-node-1","cpu_cores":64,"memory":549755813888,"all_gpus_visible":false,"gpus":[{"index":0,"uuid":"GPU-0","model":"NVIDIA L4","vendor":"nvidia","total":25769803776,"held_outside":0,"healthy":true},{"index":1,"uuid":"GPU-1","model":"NVIDIA L4","vendor":"nvidia","total":25769803776,"held_outside":0,"healthy":true}]}]},"holds":[["chat",{"machine":"gpu-node-1","gpus":[0],"shared":15032385536,"cpu_cores":0,"memory":0}],["embed",{"machine":"gpu-node-1","gpus":[1],"shared":15032385536,"cpu_cores":0,"memory":0}]],"movable":[{"name":"chat","workers":["chat"],"demand":{"count":1,"mode":{"Shared":0},"vendor":null,"models":[],"healthy_only":true,"ids":[],"policy":"Any"},"same_size":false},{"name":"embed","workers":["embed"],"demand":{"count":1,"mode":{"Shared":0},"vendor":null,"models":[],"healthy_only":true,"ids":[],"policy":"Any"},"same_size":false}],"sharing":[]}"#;

    #[test]
    fn counting_right_sized_shares_says_how_many_more_gpus_they_would_free() {
        let input: RepackInput = serde_json::from_str(TWO_HALF_FULL).unwrap();
        let now = input.plan(Goal::Most).unwrap();
        assert!(now.freed.is_empty());
        let chat = RightSized {
            group: "g".into(),
            member: "chat".into(),
            from: BasisPoints::from_percent(58.33).unwrap(),
            to: BasisPoints::percent(25),
            units: vec!["chat".into()],
        };
        assert_eq!(
            right_sized_line(&input, Goal::Most, &now, &[chat]),
            "With right-sized shares (chat 58.33 % → 25 %) the repack would free 1 GPU, 1 more than with the shares as they are. Right-size each from the Models tab first; this plan uses the shares as they are."
        );
        assert!(right_sized_line(&input, Goal::Most, &now, &[])
            .starts_with("No model has yet run a day"));
    }

    #[test]
    fn a_line_names_eight_gpus_and_counts_the_rest() {
        let gpus: Vec<GpuRef> = (0..10).map(|i| GpuRef::new("atlas", i)).collect();
        assert_eq!(gpus_text(&gpus[..2]), "GPU 0 of atlas, GPU 1 of atlas");
        assert_eq!(
            gpus_text(&gpus),
            "GPU 0 of atlas, GPU 1 of atlas, GPU 2 of atlas, GPU 3 of atlas, GPU 4 of atlas, GPU 5 of atlas, GPU 6 of atlas, GPU 7 of atlas and 2 more"
        );
    }

    #[test]
    fn the_field_reads_a_number_of_gpus_or_nothing_and_says_what_to_type_otherwise() {
        assert_eq!(goal(""), Ok(None));
        assert_eq!(goal(" 2 "), Ok(Some(2)));
        assert_eq!(
            goal("0"),
            Err("Type a whole number of GPUs, 1 or more, or leave it empty to free as many as the repack can; \"0\" is neither.".to_owned())
        );
        assert!(goal("two").is_err());
    }

    #[test]
    fn a_group_member_restarts_by_its_model_and_the_on_demand_room_is_no_engine() {
        assert_eq!(restarted("embed"), Some("embed".to_owned()));
        assert_eq!(
            restarted("group:speech/speech@atlas"),
            Some("speech".to_owned())
        );
        assert_eq!(restarted("group:speech/on-demand turns@atlas"), None);
    }
}
