//! A machine's page: each GPU's total, what it offers and what is held outside Tessera, its sharers
//! (`shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken`) and a memory bar; what runs there, with the GPUs
//! column `1 · shared 2.2 GB`; and the workers that wait, with their reasons.

use crate::components::live::use_live;
use crate::components::memory_bar::MemoryBar;
use crate::error::AppError;
use crate::views::{GpuDetail, GpuPoint, GpuUse, MachineDetail, MigPlan};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::use_params_map;
use placement::Bytes;

/// One machine.
#[server(prefix = "/rpc", endpoint = "load_machine", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_machine(name: String) -> Result<MachineDetail, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.machine(name)).await
}

/// The page.
#[component]
pub fn MachinePage() -> impl IntoView {
    let live = use_live();
    let params = use_params_map();
    let name = move || params.read().get("name").unwrap_or_default();
    let machine = Resource::new(
        move || (name(), live.track()),
        |(name, _)| load_machine(name),
    );
    view! {
        <div class="page">
            <p class="crumbs"><A href="/nodes">"Nodes"</A> " / " {name}</p>
            <Transition fallback=|| view! { <p>"Loading the machine…"</p> }>
                {move || machine.get().map(|answer| match answer {
                    Ok(machine) => view! { <Machine machine /> }.into_any(),
                    Err(e) => view! { <h1>"No such machine"</h1><p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

#[component]
fn Machine(machine: MachineDetail) -> impl IntoView {
    let facts = format!(
        "{} of {} CPU cores and {} of {} memory held by workers{}",
        machine.cpu_cores_used,
        machine.cpu_cores,
        machine.memory_used,
        machine.memory,
        if machine.all_gpus_visible {
            " · a Windows PC under WSL2: every container sees every GPU, so shared work takes its memory on each"
        } else {
            ""
        }
    );
    view! {
        <h1>{machine.name.clone()}</h1>
        <p class="lede">{facts}</p>
        {machine.unreachable_since.map(|since| view! {
            <p class="error" role="status" data-testid="unreachable">
                {format!("Unreachable since {since}: its Ray node is dead or gone. Its GPUs are out of the inventory until it is back; what it ran waits.")}
            </p>
        })}
        <section aria-labelledby="gpus">
            <h2 id="gpus">"GPUs"</h2>
            {machine.gpus.into_iter().map(|gpu| view! { <GpuCard gpu /> }).collect_view()}
        </section>
        <section class="panel" aria-labelledby="workers">
            <h2 id="workers">"Workers"</h2>
            {if machine.workers.is_empty() {
                view! { <p class="empty">"Nothing runs here."</p> }.into_any()
            } else {
                view! {
                    <table class="list" data-testid="workers">
                        <thead>
                            <tr>
                                <th scope="col">"Name"</th>
                                <th scope="col">"Group"</th>
                                <th scope="col">"GPUs"</th>
                                <th scope="col">"State"</th>
                            </tr>
                        </thead>
                        <tbody>
                            {machine.workers.into_iter().map(|w| view! {
                                <tr data-testid="worker-row" data-worker=w.name.clone()>
                                    <th scope="row">{w.name.clone()}</th>
                                    <td>{w.group.clone().unwrap_or_else(|| "—".to_owned())}</td>
                                    <td data-testid="worker-gpus">{w.gpus_text()}</td>
                                    <td>{w.status.map(|s| s.label()).unwrap_or("—")}</td>
                                </tr>
                            }).collect_view()}
                        </tbody>
                    </table>
                }.into_any()
            }}
        </section>
        {(!machine.pending.is_empty()).then(|| view! {
            <section class="panel" aria-labelledby="pending">
                <h2 id="pending">"Pending workers"</h2>
                <ul class="pending" data-testid="pending">
                    {machine.pending.into_iter().map(|p| view! {
                        <li>
                            <strong>{p.name}</strong>
                            <ul>{p.reasons.into_iter().map(|r| view! { <li data-testid="pending-reason">{r}</li> }).collect_view()}</ul>
                        </li>
                    }).collect_view()}
                </ul>
            </section>
        })}
    }
}

/// One GPU: its figures, its sharers and its memory bar.
#[component]
fn GpuCard(gpu: GpuDetail) -> impl IntoView {
    let heading = format!("GPU {} · {}", gpu.index, gpu.model);
    let usage = match &gpu.usage {
        GpuUse::Free => "Free: nothing holds it.".to_owned(),
        GpuUse::Whole(by) => format!("Held whole by {by}."),
        GpuUse::Shared => format!(
            "Shared by memory: {} left of the {} it offers.",
            gpu.offered().saturating_sub(gpu.taken()),
            gpu.offered()
        ),
    };
    view! {
        <article class="panel gpu" data-testid="gpu" data-index=gpu.index>
            <h3>{heading} {(!gpu.healthy).then(|| view! { <span class="tag bad">"unhealthy"</span> })}</h3>
            <dl class="figures">
                <div><dt>"Total"</dt><dd data-testid="gpu-total">{gpu.total.to_string()}</dd></div>
                <div><dt>"Offers"</dt><dd data-testid="gpu-offered">{gpu.offered().to_string()}</dd></div>
                <div><dt>"Held outside Tessera"</dt><dd data-testid="gpu-outside">{gpu.held_outside.to_string()}</dd></div>
            </dl>
            <p data-testid="gpu-offer">{gpu.offer_text()}</p>
            <MemoryBar gpu=gpu.clone() />
            <p data-testid="gpu-usage">{usage}</p>
            {gpu.summary.clone().map(|line| view! { <p class="sharers" data-testid="gpu-sharers">{line}</p> })}
            {(gpu.usage == GpuUse::Shared).then(|| view! { <p class="muted" data-testid="gpu-sharing">{gpu.sharing.line()}</p> })}
            {gpu.over_share.iter().map(|line| view! { <p class="error" data-testid="gpu-over-share">{line.clone()}</p> }).collect_view()}
            {gpu.slowed.iter().map(|line| view! { <p class="error" data-testid="gpu-slowed">{line.clone()}</p> }).collect_view()}
            {gpu.mig_plan().map(|plan| view! { <MigSection plan /> })}
            {gpu.history.last().map(|now| {
                let source = if gpu.demo_figures { " (demo figures, made from the demo engines' work)" } else { "" };
                view! { <p data-testid="gpu-now">{format!("Now: {}{source}", now.line(gpu.total))}</p> }
            })}
            {(gpu.history.len() > 1).then(|| view! { <GpuChart points=gpu.history.clone() total=gpu.total index=gpu.index /> })}
        </article>
    }
}

/// What MIG would make of the GPU's sharers: each in an instance with walls, or why no layout holds them
/// (seed 004). Worked out by `placement::mig`, on the server and again in the browser.
#[component]
fn MigSection(plan: MigPlan) -> impl IntoView {
    match plan {
        MigPlan::None(why) => view! {
            <details class="mig" data-testid="mig-plan">
                <summary>"Under MIG: no layout holds these models"</summary>
                <p data-testid="mig-refusal">{why}</p>
            </details>
        }
        .into_any(),
        MigPlan::Layout { instances, left, stop_first, commands } => view! {
            <details class="mig" data-testid="mig-plan">
                <summary>"Under MIG: each model in an instance of its own"</summary>
                <ul>{instances.into_iter().map(|i| view! { <li data-testid="mig-instance">{i}</li> }).collect_view()}</ul>
                <p>{left}</p>
                <p data-testid="mig-stop-first">{stop_first}</p>
                <pre><code>{commands.join("\n")}</code></pre>
            </details>
        }
        .into_any(),
    }
}

/// The last hour of a GPU: how busy it was and how much of its memory was in use, as two lines, drawn as SVG
/// on the server.
#[component]
fn GpuChart(points: Vec<GpuPoint>, total: Bytes, index: u32) -> impl IntoView {
    const WIDTH: u64 = 600;
    const HEIGHT: u64 = 100;
    let (first, last) = (points[0].at_ms, points[points.len() - 1].at_ms);
    let x = |at: u64| (at - first) * WIDTH / (last - first).max(1);
    let y = |percent: u64| HEIGHT - percent.min(100) * HEIGHT / 100;
    let used_percent = |p: &GpuPoint| {
        p.used
            .map(|u| u.get() * 100 / total.get().max(1))
            .unwrap_or_default()
    };
    let line = |percent: &dyn Fn(&GpuPoint) -> u64| {
        points
            .iter()
            .map(|p| format!("{},{}", x(p.at_ms), y(percent(p))))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let busy = line(&|p| u64::from(p.utilisation_percent));
    let memory = line(&used_percent);
    let range = |values: Vec<u64>| {
        let (low, high) = (values.iter().min().copied(), values.iter().max().copied());
        format!("{}–{}", low.unwrap_or(0), high.unwrap_or(0))
    };
    let summary = format!(
        "GPU {index} over the last {} minutes: busy {}%, memory in use {}% of {total}",
        (last - first).div_ceil(60_000),
        range(
            points
                .iter()
                .map(|p| u64::from(p.utilisation_percent))
                .collect()
        ),
        range(points.iter().map(used_percent).collect()),
    );
    view! {
        <figure class="gpu-chart">
            <svg viewBox=format!("0 0 {WIDTH} {HEIGHT}") preserveAspectRatio="none" role="img" aria-label=summary data-testid="gpu-chart">
                <rect class="frame" x="0" y="0" width=WIDTH height=HEIGHT></rect>
                <polyline class="memory" points=memory></polyline>
                <polyline class="busy" points=busy></polyline>
            </svg>
            <figcaption>
                <span class="key busy">"busy"</span>
                <span class="key memory">"memory in use"</span>
                " · the last hour, 0 to 100%"
            </figcaption>
        </figure>
    }
}
