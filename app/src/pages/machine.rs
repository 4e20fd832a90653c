//! A machine's page: each GPU's total, what it offers and what is held outside Tessera, its sharers
//! (`shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken`) and a memory bar; what runs there, with the GPUs
//! column `1 · shared 2.2 GB`; and the workers that wait, with their reasons.

use crate::auth::Role;
use crate::components::account_menu::signed_in;
use crate::components::confirm::Confirm;
use crate::components::live::use_live;
use crate::components::memory_bar::MemoryBar;
use crate::error::AppError;
use crate::views::{GpuDetail, GpuPoint, GpuUse, MachineDetail, MigPlan, SharingChange};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::{use_params_map, use_query_map};
use placement::sharing::{GpuSharing, Sharing};
use placement::{Bytes, MigRole};

/// One machine.
#[server(prefix = "/rpc", endpoint = "load_machine", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_machine(name: String) -> Result<MachineDetail, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.machine(name)).await
}

/// Shares GPU `index` of `machine` as `mode` says (under MIG, cut into `instances`); its sharers restart.
#[server(prefix = "/rpc", endpoint = "set_sharing", input = Json, client = crate::csrf::CsrfClient)]
pub async fn set_sharing(
    machine: String,
    index: u32,
    mode: String,
    compute_percent: Option<i64>,
    instances: Option<Vec<String>>,
) -> Result<SharingChange, AppError> {
    let actor = crate::auth::require(crate::auth::Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.set_sharing(
        actor,
        machine,
        index,
        mode,
        compute_percent,
        instances,
    ))
    .await
}

/// The page.
#[component]
pub fn MachinePage() -> impl IntoView {
    let live = use_live();
    let params = use_params_map();
    let name = move || params.read().get("name").unwrap_or_default();
    let set = ServerAction::<SetSharing>::new();
    let machine = Resource::new(
        move || (name(), live.track(), set.version().get()),
        |(name, _, _)| load_machine(name),
    );
    view! {
        <div class="page">
            <p class="crumbs"><A href="/nodes">"Nodes"</A> " / " {name}</p>
            <Transition fallback=|| view! { <p>"Loading the machine…"</p> }>
                {move || machine.get().map(|answer| match answer {
                    Ok(machine) => view! { <Machine machine /> }.into_any(),
                    Err(e) => view! { <h1>"No such machine"</h1><p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
                <SharingPanel machine set />
            </Transition>
        </div>
    }
}

/// How one of the machine's GPUs is to be shared, for an operator: time-sliced, or under MPS with a
/// compute share per engine where one is typed. Its sharers restart, and the confirmation names them first.
/// It stands outside what the live updates draw again, so that what is typed stays as it was typed.
#[component]
fn SharingPanel(
    machine: Resource<Result<MachineDetail, AppError>>,
    set: ServerAction<SetSharing>,
) -> impl IntoView {
    let operator = move || signed_in().is_some_and(|c| c.role.allows(Role::Operator));
    let detail = move || machine.get().and_then(Result::ok);
    // A MIG instance is held whole and shared no further: its GPU's setting is what changes.
    let gpus = Memo::new(move |_| {
        detail()
            .map(|m| {
                m.gpus
                    .iter()
                    .filter(|g| !matches!(g.mig, Some(MigRole::Instance { .. })))
                    .map(|g| (g.index, g.title()))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    });
    // The GPU chosen (the first listed until one is), and what was chosen for it where it differs from
    // how it is shared now.
    let picked = RwSignal::new(None::<u32>);
    let index = move || {
        picked
            .get()
            .or_else(|| gpus.with(|g| g.first().map(|(i, _)| *i)))
            .unwrap_or_default()
    };
    let mode = RwSignal::new(None::<String>);
    let compute = RwSignal::new(None::<String>);
    let instances = RwSignal::new(None::<String>);
    let confirming = RwSignal::new(false);
    // Another machine's page starts afresh.
    let name = Memo::new(move |_| detail().map(|m| m.name));
    Effect::new(move |was: Option<Option<String>>| {
        let now = name.get();
        if was.is_some_and(|was| was != now) {
            picked.set(None);
            mode.set(None);
            compute.set(None);
            instances.set(None);
            confirming.set(false);
            set.value().set(None);
        }
        now
    });
    // What was chosen is kept until the server took it: a refusal leaves it to be corrected.
    Effect::new(move |_| {
        if let Some(Ok(_)) = set.value().get() {
            mode.set(None);
            compute.set(None);
            instances.set(None);
        }
    });
    let chosen = move || detail().and_then(|m| m.gpus.into_iter().find(|g| g.index == index()));
    let now = move || chosen().map(|g| g.sharing).unwrap_or_default();
    let mode_value = move || mode.get().unwrap_or_else(|| now().mode.as_str().to_owned());
    let compute_value = move || {
        compute.get().unwrap_or_else(|| {
            now()
                .compute_percent
                .map(|p| p.to_string())
                .unwrap_or_default()
        })
    };
    let mps = move || mode_value() == Sharing::Mps.as_str();
    let mig = move || mode_value() == Sharing::Mig.as_str();
    let menu = move || chosen().and_then(|g| placement::mig::menu(&g.model));
    // The profiles it is cut into now, from its instances, until others are typed.
    let instances_value = move || {
        instances.get().unwrap_or_else(|| {
            detail()
                .map(|m| {
                    m.gpus
                        .iter()
                        .filter_map(|g| match &g.mig {
                            Some(MigRole::Instance { parent, profile }) if *parent == index() => {
                                Some(profile.clone())
                            }
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                })
                .unwrap_or_default()
        })
    };
    let profiles = move || -> Vec<String> {
        instances_value()
            .split([',', ' '])
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    };
    // Under MIG, the layout the profiles typed make, judged live by the rule the server cuts by.
    let layout = move || -> Option<Result<placement::mig::Layout, String>> {
        if !mig() {
            return None;
        }
        let model = chosen().map(|g| g.model).unwrap_or_default();
        Some(
            match menu() {
                Some(menu) => placement::mig::layout_of(menu, &profiles()),
                None => Err(placement::mig::NoLayout::NoMenu { model }),
            }
            .map_err(|e| e.to_string()),
        )
    };
    // The compute share as typed: none when empty or not under MPS; refused by the rule the server holds
    // it to.
    let compute_percent = move || -> Result<Option<i64>, String> {
        let text = compute_value();
        let text = text.trim();
        if !mps() || text.is_empty() {
            return Ok(None);
        }
        let percent = text.parse().map_err(|_| {
            format!("Type the compute share as a whole percent from 1 to 100, or leave it empty; {text:?} is not one.")
        })?;
        GpuSharing::new(Sharing::Mps, Some(percent))
            .map(|_| Some(percent))
            .map_err(|e| e.to_string())
    };
    // Its engines, when the setting changes: the room a group keeps for its on-demand members (whose name
    // has a space, as no model's has) is none.
    let restarts = move || {
        let unchanged = compute_percent().ok().flatten().map(|p| p as u8) == now().compute_percent
            && mode_value() == now().mode.as_str();
        // Cutting or joining waits for an idle GPU: nothing restarts, and the server names what must stop.
        if mig() || now().mode == Sharing::Mig {
            return Vec::new();
        }
        chosen()
            .filter(|_| !unchanged)
            .map(|g| {
                g.sharers
                    .into_iter()
                    .map(|s| s.name)
                    .filter(|name| !name.contains(' '))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let apply = move || {
        let (Some(m), Ok(compute_percent)) = (detail(), compute_percent()) else {
            return;
        };
        set.dispatch(SetSharing {
            machine: m.name,
            index: untrack(index),
            mode: mode_value(),
            compute_percent,
            instances: mig().then(profiles),
        });
        confirming.set(false);
    };
    view! {
        <Show when=move || operator() && !gpus.get().is_empty()>
            <section class="panel" aria-labelledby="sharing-heading" data-testid="sharing-form">
                <h2 id="sharing-heading">"How a GPU is shared"</h2>
                <p class="muted">"Time-sliced, each share is a promise the engine keeps by sizing itself; under MPS, the driver holds each engine to its memory share; under MIG, the GPU is cut into instances with walls, each a GPU of its own held whole. The GPU's sharers restart, each stopped before it starts again."</p>
                <label for="sharing-gpu">"GPU"</label>
                <select id="sharing-gpu" data-testid="sharing-gpu" on:change=move |ev| {
                    picked.set(event_target_value(&ev).parse().ok());
                    mode.set(None);
                    compute.set(None);
                    instances.set(None);
                    confirming.set(false);
                }>
                    {move || gpus.get().into_iter().map(|(i, title)| view! {
                        <option value=i.to_string() prop:selected=move || index() == i>{title}</option>
                    }).collect_view()}
                </select>
                <label for="sharing-mode">"Sharing"</label>
                <select id="sharing-mode" data-testid="sharing-mode" prop:value=mode_value on:change=move |ev| mode.set(Some(event_target_value(&ev)))>
                    <option value="time-slicing">"Time-slicing: each share is a promise"</option>
                    <option value="mps">"MPS: the driver holds each engine to its memory share"</option>
                    {move || menu().map(|_| view! { <option value="mig">"MIG: cut into instances with walls, each held whole"</option> })}
                </select>
                <Show when=mig>
                    <label for="sharing-instances">{move || format!("Instances, from the {} menu: {}", menu().map_or("", |m| m.gpu), menu().map(|m| m.profiles.iter().map(|p| p.name).collect::<Vec<_>>().join(", ")).unwrap_or_default())}</label>
                    <input id="sharing-instances" type="text" data-testid="sharing-instances" prop:value=instances_value on:input=move |ev| instances.set(Some(event_target_value(&ev))) />
                    <p class="muted">"A GPU is cut, or joined back whole, only while nothing runs on it or its instances."</p>
                </Show>
                {move || layout().map(|laid| match laid {
                    Ok(layout) => view! {
                        <ul data-testid="sharing-layout">{layout.instances.iter().map(|p| view! { <li>{p.to_string()}</li> }).collect_view()}</ul>
                    }.into_any(),
                    Err(why) => view! { <p class="error" role="alert" data-testid="sharing-layout-error">{why}</p> }.into_any(),
                })}
                <Show when=mps>
                    <label for="sharing-compute">"Compute share of each engine, % (empty: no limit)"</label>
                    <input id="sharing-compute" type="number" min="1" max="100" data-testid="sharing-compute" prop:value=compute_value on:input=move |ev| compute.set(Some(event_target_value(&ev))) />
                </Show>
                {move || compute_percent().err().map(|e| view! { <p class="error" role="alert">{e}</p> })}
                <div class="actions">
                    <button type="button" data-testid="sharing-apply" disabled=move || compute_percent().is_err() || layout().is_some_and(|l| l.is_err()) on:click=move |_| confirming.set(true)>"Apply"</button>
                </div>
                {move || confirming.get().then(|| view! {
                    <Confirm
                        title=if untrack(mig) {
                            format!("Cut GPU {} into these MIG instances?", untrack(index))
                        } else if untrack(now).mode == Sharing::Mig {
                            format!("Join GPU {} back whole?", untrack(index))
                        } else {
                            format!("Share GPU {} this way?", untrack(index))
                        }
                        restarts=untrack(restarts)
                        confirm="Apply"
                        pending=set.pending()
                        on_confirm=apply
                        on_cancel=move || confirming.set(false)
                    />
                })}
                {move || set.value().get().map(|answer| match answer {
                    Ok(change) => view! { <p role="status" data-testid="sharing-done">{change.line()}</p> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert" data-testid="sharing-error">{e.to_string()}</p> }.into_any(),
                })}
            </section>
        </Show>
    }
}

#[component]
fn Machine(machine: MachineDetail) -> impl IntoView {
    let gpus = machine.gpus_in_order();
    let count = gpus.len();
    // `?gpu=3` (a tile's link) opens that GPU's detail.
    let query = use_query_map();
    let opened = move || query.with(|q| q.get("gpu").and_then(|g| g.parse::<u32>().ok()));
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
            <GpuGrid gpus=gpus.clone() />
            {gpus.into_iter().map(|gpu| {
                let id = format!("gpu-{}", gpu.index);
                let index = gpu.index;
                let open = move || shown_open(count, opened(), index);
                view! {
                    <details class="gpu-detail" id=id open=open>
                        <summary>{format!("{}: figures, sharers and the last hour", gpu.title())}</summary>
                        <GpuCard gpu />
                    </details>
                }
            }).collect_view()}
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
                                    <td data-testid="worker-state">
                                        {w.status.map(|s| s.label()).unwrap_or("—")}
                                        {w.message.clone().map(|m| view! { <span class="muted" data-testid="worker-message">{format!(" — {m}")}</span> })}
                                    </td>
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

/// A machine with this many GPUs or fewer shows each one's detail open: a page of them is still short.
const OPEN_UP_TO: usize = 2;

/// Whether GPU `index`'s detail opens: on a machine of few GPUs, or where a tile asked for it.
fn shown_open(count: usize, opened: Option<u32>, index: u32) -> bool {
    count <= OPEN_UP_TO || opened == Some(index)
}

/// Every GPU of the machine at a glance, a tile each (its memory bar, what is taken of what it offers, and
/// what is wrong with it), each a link that opens its detail: eight GPUs fit a screen.
#[component]
fn GpuGrid(gpus: Vec<GpuDetail>) -> impl IntoView {
    view! {
        <ul class="gpu-grid" data-testid="gpu-grid">
            {gpus.into_iter().map(|gpu| {
                let href = format!("?gpu={0}#gpu-{0}", gpu.index);
                let taken = match &gpu.usage {
                    // An unhealthy GPU offers nothing: no work is placed on it, whatever its memory.
                    GpuUse::Free if !gpu.healthy => "unhealthy: takes no work".to_owned(),
                    GpuUse::Free => format!("free · offers {}", gpu.offered()),
                    GpuUse::Whole(by) => format!("whole: {by}"),
                    GpuUse::Shared => format!("{} of {} taken", gpu.taken(), gpu.offered()),
                };
                let sharers = gpu.summary.clone();
                let trouble = gpu.problem.is_some() || !gpu.healthy || !gpu.over_share.is_empty();
                view! {
                    <li class="gpu-tile" class:bad=trouble data-testid="gpu-tile" data-index=gpu.index>
                        <a href=href>{gpu.title()}</a>
                        <MemoryBar gpu=gpu.clone() />
                        <span data-testid="gpu-tile-taken">{taken}</span>
                        {sharers.map(|s| view! { <span class="muted">{s}</span> })}
                        {trouble.then(|| view! { <span class="tag bad">"needs a look"</span> })}
                    </li>
                }
            }).collect_view()}
        </ul>
    }
}

/// One GPU: its figures, its sharers and its memory bar.
#[component]
fn GpuCard(gpu: GpuDetail) -> impl IntoView {
    let heading = gpu.title();
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
            {(gpu.usage == GpuUse::Shared || gpu.sharing.mode != Sharing::TimeSlicing).then(|| view! { <p class="muted" data-testid="gpu-sharing">{gpu.sharing_line()}</p> })}
            {gpu.problem.clone().map(|why| view! { <p class="error" data-testid="gpu-problem">{format!("Unhealthy: {why}")}</p> })}
            {gpu.mig_line().map(|line| view! { <p class="muted" data-testid="gpu-mig">{line}</p> })}
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
