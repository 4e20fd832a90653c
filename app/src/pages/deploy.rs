//! The Deploy a model wizard (seed 003): Model and placement → Serving → GPU sharing. The GPU sharing step
//! states the group the model joins and opens the Shared GPU memory panel on the group's plan with the new
//! model in it; `placement` judges it in the browser on every keystroke. Beside it, the model's memory
//! estimate (read from its file by the server) can fill its share, and warns when the share is below it.
//! Deploy is unavailable while the plan is refused; when the deploy restarts other models a confirmation names each, and Deploy again
//! commits it on the server, which judges the plan again first.

use crate::components::confirm::Confirm;
use crate::components::estimate_panel::EstimatePanel;
use crate::components::serving_fields::ServingFields;
use crate::components::share_panel::SharedGpuMemoryPanel;
use crate::deploy_form::{
    groups_on_nodes, parse_args, parse_env, selectable, shared_deploy, shown_nodes, whole_gpus,
    Placement, SharedDeploy, NODES_SHOWN,
};
use crate::error::AppError;
use crate::share_form::{self, ShareRow};
use crate::views::{ChangeOutcome, DeployOptions, DeployRequest, NodeOption, Serving};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::use_navigate;
use placement::scale::Autoscale;
use placement::{judge, Verdict};

/// The catalog, the nodes and the groups, as committed now.
#[server(prefix = "/rpc", endpoint = "load_deploy_options", client = crate::csrf::CsrfClient)]
pub async fn load_deploy_options() -> Result<DeployOptions, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.deploy_options()).await
}

/// Deploys a model as the wizard describes it.
#[server(prefix = "/rpc", endpoint = "deploy_model", input = Json, client = crate::csrf::CsrfClient)]
pub async fn deploy_model(request: DeployRequest) -> Result<ChangeOutcome, AppError> {
    let actor = crate::auth::require(crate::auth::Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.deploy(actor, request)).await
}

/// The wizard's steps, in order.
const STEPS: [&str; 3] = ["Model and placement", "Serving", "GPU sharing"];

/// The page.
#[component]
pub fn DeployPage() -> impl IntoView {
    let options = Resource::new(|| (), |_| load_deploy_options());
    view! {
        <div class="page">
            <p class="crumbs"><A href="/models">"Models"</A> " / Deploy a model"</p>
            <h1>"Deploy a model"</h1>
            <Suspense fallback=|| view! { <p>"Loading the catalog…"</p> }>
                {move || options.get().map(|answer| match answer {
                    Ok(options) => view! { <Wizard options /> }.into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Suspense>
        </div>
    }
}

/// A short account of a node's GPUs for its checkbox.
fn node_text(node: &NodeOption) -> String {
    let free = node
        .gpus
        .iter()
        .filter(|g| g.healthy && g.is_free())
        .count();
    let shared = node.gpus.iter().filter(|g| !g.sharers.is_empty()).count();
    let models: Vec<String> = {
        let mut m: Vec<String> = node
            .gpus
            .iter()
            .map(|g| format!("{} ({})", g.model, g.total))
            .collect();
        m.dedup();
        m
    };
    format!(
        "{} × {} · {free} free, {shared} shared",
        node.gpus.len(),
        models.join(", ")
    )
}

#[component]
fn Wizard(options: DeployOptions) -> impl IntoView {
    let options = StoredValue::new(options);
    let step = RwSignal::new(0usize);
    // A step change moves the focus to the new step's heading: Enter pressed again does nothing until the
    // person chooses what to do there, so no run of Enter presses reaches a Deploy they have not looked at.
    let heading = NodeRef::<leptos::html::H2>::new();
    Effect::new(move |before: Option<usize>| {
        let now = step.get();
        if before.is_some_and(|before| before != now) {
            if let Some(heading) = heading.get_untracked() {
                let _ = heading.focus();
            }
        }
        now
    });
    let model = RwSignal::new(String::new());
    let nodes = RwSignal::new(Vec::<String>::new());
    let width = RwSignal::new(1u32);
    // With a sharing group running, the wizard starts with sharing on (seed 003).
    let sharing = RwSignal::new(options.with_value(|o| !o.groups.is_empty()));
    let args = RwSignal::new(String::new());
    let env = RwSignal::new(String::new());
    let rows = RwSignal::new(Vec::<ShareRow>::new());
    let fewest = RwSignal::new(String::new());
    let most = RwSignal::new(String::new());
    let confirming = RwSignal::new(None::<(Vec<String>, Vec<String>)>);
    let deploy = ServerAction::<DeployModel>::new();
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));

    let engine = Signal::derive(move || {
        let chosen = model.get();
        options.with_value(|o| {
            o.catalog
                .iter()
                .find(|m| m.name == chosen)
                .map(|m| m.engine.clone())
                .unwrap_or_default()
        })
    });
    let group = RwSignal::new(None::<String>);
    let placement = Memo::new(move |_| Placement {
        model: model.get(),
        nodes: nodes.get(),
        width: width.get(),
        group: group.get(),
    });
    let shared = Memo::new(move |_| options.with_value(|o| shared_deploy(o, &placement.get())));
    let whole = Memo::new(move |_| options.with_value(|o| whole_gpus(o, &placement.get())));
    let serving = Memo::new(move |_| {
        Ok::<Serving, String>(Serving {
            args: parse_args(&args.get())?,
            env: parse_env(&env.get())?,
        })
    });
    let placement_problem = move || {
        if sharing.get() {
            shared.get().err()
        } else {
            whole.get().err()
        }
    };
    // Replicas as typed, judged by the same rule the server applies: at most one on each GPU of the
    // group, and none for a model loaded on demand.
    let replicas = Memo::new(move |_| {
        let gpus = shared.with(|plan| plan.as_ref().map_or(1, |p| p.gpus.len() as u32));
        let demand = rows.with(|r| {
            let name = model.get();
            share_form::plan(r)
                .into_iter()
                .find(|m| m.name == name)
                .map(|m| m.demand)
                .unwrap_or_default()
        });
        // On one GPU the fields are not offered, and what was typed for more is not sent.
        if gpus <= 1 {
            return Ok(None);
        }
        Autoscale::typed(&fewest.get(), &most.get(), gpus)
            .and_then(|r| Autoscale::check_demand(r, demand).map(|()| r))
            .map_err(|e| e.to_string())
    });
    // The new model's replicas as typed count in the verdict: its most where they would run.
    let verdict: Memo<Verdict> = Memo::new(move |_| {
        shared.with(|plan| match plan {
            Ok(plan) => rows.with(|r| {
                let typed = replicas.get().ok().flatten();
                let name = model.get();
                let rows: Vec<ShareRow> = r
                    .iter()
                    .map(|row| ShareRow {
                        replicas: if row.name == name {
                            typed
                        } else {
                            row.replicas
                        },
                        ..row.clone()
                    })
                    .collect();
                share_form::verdict(&rows, &plan.gpus)
            }),
            Err(_) => judge(&[], &[]),
        })
    });
    let refused = move || {
        sharing.get()
            && (verdict.with(Verdict::is_refused)
                || !rows.with(|r| share_form::keep_alives_valid(r))
                || replicas.with(Result::is_err))
    };

    let navigate = use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(_)) = deploy.value().get() {
            let name = model.get_untracked();
            navigate(&format!("/models?deployed={name}"), Default::default());
        }
    });

    let next = move |_| {
        if step.get_untracked() == 0 {
            // The panel opens on the plan of the placement just chosen.
            if let Ok(plan) = shared.get_untracked() {
                rows.set(plan.rows());
            }
        }
        step.update(|s| *s += 1);
    };
    let back = move |_| {
        confirming.set(None);
        step.update(|s| *s = s.saturating_sub(1));
    };
    let request = move || -> Option<DeployRequest> {
        let serving = serving.get_untracked().ok()?;
        let model = model.get_untracked();
        if sharing.get_untracked() {
            let plan = shared.get_untracked().ok()?;
            let members = rows.with_untracked(|r| share_form::plan(r));
            Some(DeployRequest {
                share: members
                    .iter()
                    .find(|m| m.name == model)
                    .and_then(|m| m.share),
                shares: plan.changed_shares(&members),
                demand: members
                    .iter()
                    .find(|m| m.name == model)
                    .map(|m| m.demand)
                    .unwrap_or_default(),
                demands: plan.changed_demand(&members),
                gpus: plan.gpus.iter().map(|g| g.gpu.clone()).collect(),
                revision: plan.revision,
                shared: true,
                model,
                serving,
                replicas: replicas.get_untracked().ok().flatten(),
            })
        } else {
            Some(DeployRequest {
                gpus: whole.get_untracked().ok()?,
                share: None,
                shares: Vec::new(),
                demand: placement::Demand::Pinned,
                demands: Vec::new(),
                revision: None,
                shared: false,
                model,
                serving,
                replicas: None,
            })
        }
    };
    let send = move || {
        if let Some(request) = request() {
            deploy.dispatch(DeployModel { request });
        }
    };
    let ask = move |_| {
        let name = model.get_untracked();
        let asked = if sharing.get_untracked() {
            shared.get_untracked().ok().map(|plan: SharedDeploy| {
                rows.with_untracked(|r| {
                    let after = share_form::plan(r);
                    let gpu_total = plan.gpus.first().map(|g| g.total).unwrap_or_default();
                    (
                        plan.restarts(&after),
                        share_form::change_lines(&plan.before, &after, gpu_total),
                    )
                })
            })
        } else {
            None
        };
        match asked {
            // Others restart: name each of them first (seed 003), with what changes for each.
            Some((names, changes)) if names.iter().any(|n| *n != name) => {
                confirming.set(Some((names, changes)))
            }
            _ => send(),
        }
    };

    view! {
        <div class="wizard" data-hydrated=move || hydrated.get().to_string()>
            <ol class="steps" aria-label="Steps">
                {STEPS.iter().enumerate().map(|(i, name)| view! {
                    <li class:current=move || step.get() == i aria-current=move || (step.get() == i).then_some("step")>{*name}</li>
                }).collect_view()}
            </ol>
            <h2 data-testid="step" tabindex="-1" node_ref=heading>{move || STEPS[step.get()]}</h2>
            {move || match step.get() {
                0 => view! { <PlacementStep options model nodes width sharing group /> }.into_any(),
                1 => view! { <ServingFields args env engine=engine /> }.into_any(),
                _ => view! { <SharingStep model engine sharing shared rows verdict whole fewest most replicas /> }.into_any(),
            }}
            {move || (step.get() == 0).then(|| placement_problem().filter(|_| !model.get().is_empty() && !nodes.get().is_empty()).map(|p| view! {
                <p class="error" role="alert" data-testid="placement-problem">{p}</p>
            }))}
            {move || deploy.value().get().and_then(Result::err).map(|e| view! {
                <p class="error" role="alert" data-testid="deploy-error">{e.to_string()}</p>
            })}
            {move || match confirming.get() {
                Some((names, changes)) => view! {
                    <Confirm
                        title=format!("Deploy {}?", model.get_untracked())
                        restarts=names
                        changes
                        confirm="Deploy"
                        pending=deploy.pending()
                        on_confirm=send
                        on_cancel=move || confirming.set(None)
                    />
                }.into_any(),
                None => view! {
                    <div class="actions">
                        {move || (step.get() > 0).then(|| view! { <button type="button" class="secondary" on:click=back>"Back"</button> })}
                        {move || if step.get() < STEPS.len() - 1 {
                            let blocked = move || {
                                (step.get() == 0 && (model.get().is_empty() || placement_problem().is_some()))
                                    || (step.get() == 1 && serving.with(Result::is_err))
                            };
                            view! { <button type="button" class="primary" disabled=blocked on:click=next>"Next"</button> }.into_any()
                        } else {
                            let blocked = move || refused() || placement_problem().is_some() || deploy.pending().get();
                            view! { <button type="button" class="primary" disabled=blocked on:click=ask>"Deploy"</button> }.into_any()
                        }}
                    </div>
                }.into_any(),
            }}
        </div>
    }
}

/// Step one: the model, the nodes and the GPU width.
#[component]
fn PlacementStep(
    options: StoredValue<DeployOptions>,
    model: RwSignal<String>,
    nodes: RwSignal<Vec<String>>,
    width: RwSignal<u32>,
    sharing: RwSignal<bool>,
    group: RwSignal<Option<String>>,
) -> impl IntoView {
    let catalog = options.with_value(|o| o.catalog.clone());
    // Where the chosen nodes run several groups, the one to join is picked here.
    let groups = Memo::new(move |_| nodes.with(|n| options.with_value(|o| groups_on_nodes(o, n))));
    let many = options.with_value(|o| o.nodes.len() > NODES_SHOWN);
    let query = RwSignal::new(String::new());
    // The nodes listed, and how many match: a large fleet's list is searched.
    let shown = Memo::new(move |_| {
        let query = query.get();
        nodes.with(|chosen| {
            options.with_value(|o| {
                let (shown, matching) = shown_nodes(&o.nodes, &query, chosen);
                (shown.into_iter().cloned().collect::<Vec<_>>(), matching)
            })
        })
    });
    let total = options.with_value(|o| o.nodes.len());
    let widest = move || {
        options.with_value(|o| {
            o.nodes
                .iter()
                .filter(|n| nodes.with(|chosen| chosen.contains(&n.name)))
                .map(|n| n.gpus.len() as u32)
                .min()
                .unwrap_or(1)
                .max(1)
        })
    };
    view! {
        <label for="model">"Model"</label>
        <select id="model" on:change=move |ev| model.set(event_target_value(&ev)) prop:value=move || model.get()>
            <option value="" disabled=true selected=move || model.get().is_empty()>"Choose a model"</option>
            {catalog.into_iter().map(|m| {
                let label = if m.deployed { format!("{} (runs already)", m.name) } else { m.name.clone() };
                view! { <option value=m.name.clone() disabled=m.deployed>{label}</option> }
            }).collect_view()}
        </select>
        <fieldset class="nodes">
            <legend>"Nodes"</legend>
            <p class="muted">{move || if sharing.get() {
                "GPU sharing is on, so a node whose GPUs are all in use can be chosen too."
            } else {
                "Each chosen node needs as many free GPUs as the GPU width."
            }}</p>
            {many.then(|| view! {
                <label for="node-search">"Find a node"</label>
                <input id="node-search" type="search" placeholder="Part of its name" autocomplete="off"
                    prop:value=query on:input=move |ev| query.set(event_target_value(&ev)) />
                <p class="muted" data-testid="nodes-shown">{move || shown.with(|(_, matching)| match *matching {
                    0 => format!("No node's name holds {:?}.", query.get().trim()),
                    m if m > NODES_SHOWN => format!("The first {NODES_SHOWN} of {m} nodes that match, of {total}: type more of a name to find another."),
                    m => format!("{m} of {total} nodes."),
                })}</p>
            })}
            <ul class="choices">
                <For each=move || shown.get().0 key=|node| node.name.clone() let:node>{{
                    let id = format!("node-{}", node.name);
                    let name = node.name.clone();
                    let text = node_text(&node);
                    let name_checked = name.clone();
                    let label = node.name.clone();
                    view! {
                        <li>
                            <input
                                type="checkbox"
                                id=id.clone()
                                prop:checked=move || nodes.with(|n| n.contains(&name_checked))
                                disabled=move || !selectable(&node, sharing.get())
                                on:change=move |ev| {
                                    let on = event_target_checked(&ev);
                                    nodes.update(|n| {
                                        n.retain(|x| *x != name);
                                        if on {
                                            n.push(name.clone());
                                        }
                                    });
                                }
                            />
                            <label for=id>{label} <span class="muted">" · " {text}</span></label>
                        </li>
                    }
                }}</For>
            </ul>
        </fieldset>
        {move || {
            let listed = groups.get();
            (sharing.get() && !listed.is_empty()).then(|| view! {
                <fieldset class="groups" data-testid="group-pick">
                    <legend>"Sharing group"</legend>
                    <p class="muted">"The chosen nodes run several sharing groups: the model joins one, on its GPUs."</p>
                    <ul class="choices">
                        {listed.into_iter().map(|(name, line)| {
                            let id = format!("group-{name}");
                            let picked = name.clone();
                            let checked = name.clone();
                            view! {
                                <li>
                                    <input type="radio" name="group" id=id.clone()
                                        prop:checked=move || group.with(|g| g.as_deref() == Some(checked.as_str()))
                                        on:change=move |_| group.set(Some(picked.clone())) />
                                    <label for=id>{line}</label>
                                </li>
                            }
                        }).collect_view()}
                    </ul>
                </fieldset>
            })
        }}
        <label for="width">"GPU width"</label>
        <select id="width" on:change=move |ev| width.set(event_target_value(&ev).parse().unwrap_or(1))>
            {move || (1..=widest()).map(|w| view! {
                <option value=w.to_string() selected=move || width.get() == w>{w.to_string()}</option>
            }).collect_view()}
        </select>
    }
}

/// Step three: the toggle, the line naming the group, and the Shared GPU memory panel.
#[component]
fn SharingStep(
    model: RwSignal<String>,
    engine: Signal<String>,
    sharing: RwSignal<bool>,
    shared: Memo<Result<SharedDeploy, String>>,
    rows: RwSignal<Vec<ShareRow>>,
    verdict: Memo<Verdict>,
    whole: Memo<Result<Vec<placement::GpuRef>, String>>,
    fewest: RwSignal<String>,
    most: RwSignal<String>,
    replicas: Memo<Result<Option<Autoscale>, String>>,
) -> impl IntoView {
    view! {
        <div class="toggle">
            <input
                type="checkbox"
                role="switch"
                id="sharing"
                prop:checked=move || sharing.get()
                on:change=move |ev| {
                    let on = event_target_checked(&ev);
                    if on {
                        if let Ok(plan) = shared.get_untracked() {
                            rows.set(plan.rows());
                        }
                    }
                    sharing.set(on);
                }
            />
            <label for="sharing">"GPU sharing"</label>
        </div>
        {move || if sharing.get() {
            match shared.get() {
                Ok(plan) => {
                    let gpu_total = plan.gpus.first().map(|g| g.total).unwrap_or_default();
                    let on = plan.gpus.iter().map(|g| g.gpu.to_string()).collect::<Vec<_>>().join(", ");
                    let machine = plan.gpus.first().map(|g| g.gpu.machine.clone());
                    view! {
                        <p class="group-line" data-testid="group-line">{plan.choice.line()}</p>
                        <p class="muted">"On " {on} "."</p>
                        <SharedGpuMemoryPanel rows verdict gpu_total />
                        {(plan.gpus.len() > 1).then(|| view! { <ReplicasFields gpus=plan.gpus.len() fewest most replicas /> })}
                        <EstimatePanel model=model.get_untracked() engine=engine.get_untracked() machine gpu_total rows />
                    }.into_any()
                }
                Err(e) => view! { <p class="error" role="alert">{e}</p> }.into_any(),
            }
        } else {
            match whole.get() {
                Ok(gpus) => {
                    let list = gpus.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
                    view! { <p data-testid="whole-line">{format!("The model takes whole GPUs: {list}.")}</p> }.into_any()
                }
                Err(e) => view! { <p class="error" role="alert">{e}</p> }.into_any(),
            }
        }}
    }
}

/// The replicas of a model whose group has several GPUs: left empty, one engine on each machine across
/// its GPUs there; with a most, as many as its load asks for, each on a GPU of its own, between the fewest
/// and the most.
#[component]
fn ReplicasFields(
    gpus: usize,
    fewest: RwSignal<String>,
    most: RwSignal<String>,
    replicas: Memo<Result<Option<Autoscale>, String>>,
) -> impl IntoView {
    view! {
        <fieldset class="replicas" data-testid="replicas">
            <legend>"Replicas"</legend>
            <p class="muted">{format!(
                "Left empty, one engine on each machine of the group across its GPUs there; or type a most: as many replicas as its load asks for, each on one of the group's {gpus} GPUs, added after {} s above target and removed one at a time after {} s within what one fewer holds. A fewest of 0 runs none while idle: the first request starts one.",
                Autoscale::UP_S, Autoscale::DOWN_S
            )}</p>
            <label for="replicas-fewest">"Fewest"</label>
            <input id="replicas-fewest" type="text" inputmode="numeric" size="4" placeholder="1"
                prop:value=move || fewest.get() on:input=move |ev| fewest.set(event_target_value(&ev)) />
            <label for="replicas-most">"Most"</label>
            <input id="replicas-most" type="text" inputmode="numeric" size="4" placeholder="none"
                prop:value=move || most.get() on:input=move |ev| most.set(event_target_value(&ev)) />
            {move || replicas.get().err().map(|e| view! { <p class="field-error" role="alert" data-testid="replicas-error">{e}</p> })}
        </fieldset>
    }
}
