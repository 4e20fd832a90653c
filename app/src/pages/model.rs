//! A model's own page (`/models/{name}`, from the Models tab): its engines with their state and restarts,
//! what it was measured to hold against its share, its errors this hour, the models it shares its GPUs
//! with and whether they slow it, its engine's last log lines, and the steps of its group's last change.

use crate::components::live::use_live;
use crate::error::AppError;
use crate::views::{ModelPage, PlanProgress, StepState};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::use_params_map;

/// One model's page.
#[server(prefix = "/rpc", endpoint = "load_model_page", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_model_page(name: String) -> Result<ModelPage, AppError> {
    let caller = crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.model_page(caller, name)).await
}

/// Sets `model`'s fewest and most replicas as typed (`most` empty: none), read at its group's `revision`.
#[server(prefix = "/rpc", endpoint = "save_replicas", input = Json, client = crate::csrf::CsrfClient)]
pub async fn save_replicas(
    model: String,
    revision: i64,
    fewest: String,
    most: String,
) -> Result<crate::views::ReplicasSaved, AppError> {
    let actor = crate::auth::require(crate::auth::Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.change_replicas(actor, model, revision, fewest, most)).await
}

/// The page.
#[component]
pub fn ModelOwnPage() -> impl IntoView {
    let live = use_live();
    let params = use_params_map();
    let name = move || params.read().get("name").unwrap_or_default();
    // Kept here, outside what a live refresh renders again, so that what is typed and the answer stay.
    let form = ReplicasForm {
        fewest: RwSignal::new(None),
        most: RwSignal::new(None),
        save: ServerAction::new(),
    };
    // Another model's page starts afresh.
    Effect::new(move |was: Option<String>| {
        let now = name();
        if was.is_some_and(|was| was != now) {
            form.fewest.set(None);
            form.most.set(None);
            form.save.value().set(None);
        }
        now
    });
    // Read again after a save of its replicas too, which is no event of the live stream.
    let page = Resource::new(
        move || (name(), live.track(), form.save.version().get()),
        |(name, _, _)| load_model_page(name),
    );
    view! {
        <div class="page">
            <p class="crumbs"><A href="/models">"Models"</A> " / " {name}</p>
            <Transition fallback=|| view! { <p>"Loading the model…"</p> }>
                {move || page.get().map(|answer| match answer {
                    Ok(page) => view! { <Model page form /> }.into_any(),
                    Err(e) => view! { <h1>"No such model"</h1><p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

/// The replicas form's fields as typed (`None`: as the model has them) and its save.
#[derive(Clone, Copy)]
struct ReplicasForm {
    fewest: RwSignal<Option<String>>,
    most: RwSignal<Option<String>>,
    save: ServerAction<SaveReplicas>,
}

#[component]
fn Model(page: ModelPage, form: ReplicasForm) -> impl IntoView {
    let row = page.row;
    let name = row.name.clone();
    let (state, why) = row.state();
    let placement = match (&row.group, row.share) {
        (Some(group), Some(_)) => format!(
            "{} of each GPU of {group}, on {}",
            row.share_text(),
            row.nodes.join(", ")
        ),
        _ => format!("{}, on {}", row.share_text(), row.nodes.join(", ")),
    };
    let memory = row
        .peak
        .map(|p| p.line())
        .unwrap_or_else(|| "Not measured yet: no reading of its engines' memory.".to_owned());
    let neighbours = if page.neighbours.is_empty() {
        "none: it has its GPUs to itself".to_owned()
    } else {
        page.neighbours.join(", ")
    };
    let slowed = row
        .slowed
        .clone()
        .unwrap_or_else(|| "Not slowed by its neighbours.".to_owned());
    let engines = row
        .engines
        .iter()
        .map(|e| {
            view! {
                <tr data-testid="model-engine">
                    <th scope="row">{e.machine.clone()}</th>
                    <td><span class=format!("state {}", e.status.css_class())>{e.status.label()}</span></td>
                    <td class="number">{e.restarts}</td>
                    <td>{e.message.clone().unwrap_or_default()}{e.sizing.clone().map(|s| format!(" {s}"))}</td>
                </tr>
            }
        })
        .collect_view();
    let sharing = format!("/models/{name}/sharing");
    let serving = format!("/models/{name}/serving");
    let in_group = row.group.is_some();
    view! {
        <h1>{name.clone()}</h1>
        <p class="lede" data-testid="model-placement">{placement}</p>
        <p>
            <span class=format!("state {}", state.css_class()) data-testid="model-state">{state.label()}</span>
            {why.map(|w| view! { " " <span class="why">{w}</span> })}
        </p>
        <p>
            {in_group.then(|| view! { <A href=sharing>"GPU sharing"</A> " · " })}
            <A href=serving>"Serving configuration"</A>
        </p>
        <section class="panel" aria-labelledby="model-figures">
            <h2 id="model-figures">"At a glance"</h2>
            <dl class="figures">
                <div><dt>"Health"</dt><dd data-testid="model-health">{row.health()}</dd></div>
                <div><dt>"Restarts"</dt><dd data-testid="model-restarts">{row.restarts()}</dd></div>
                <div><dt>"Errors this hour"</dt><dd data-testid="model-errors">{row.errors_text()}</dd></div>
            </dl>
            <p data-testid="model-memory">{format!("Memory: {memory}")}</p>
            <p data-testid="model-neighbours">{format!("Shares its GPUs with: {neighbours}.")}</p>
            <p data-testid="model-slowed" class:bad=row.slowed.is_some()>{slowed}</p>
        </section>
        <section class="panel" aria-labelledby="model-engines">
            <h2 id="model-engines">"Engines"</h2>
            <table class="list">
                <thead><tr>
                    <th scope="col">"Machine"</th><th scope="col">"State"</th>
                    <th scope="col" class="number">"Restarts"</th><th scope="col">"Why, and how it was sized"</th>
                </tr></thead>
                <tbody>{engines}</tbody>
            </table>
        </section>
        {match (row.replicas.clone(), in_group && !row.system && row.on_demand.is_none()) {
            (Some(replicas), _) => Some(view! { <ReplicasPanel model=name.clone() revision=row.revision replicas=Some(replicas) form /> }),
            (None, true) => Some(view! { <ReplicasPanel model=name.clone() revision=row.revision replicas=None form /> }),
            (None, false) => None,
        }}
        {page.change.map(|change| view! { <LastChange change /> })}
        <section class="panel" aria-labelledby="model-log">
            <h2 id="model-log">{format!("The engine's last {} log lines", crate::pages::playground::LOG_LINES)}</h2>
            {page.log_engine.map(|e| view! { <p class="muted" data-testid="model-log-engine">{format!("From its engine {e}.")}</p> })}
            {if page.logs.is_empty() {
                view! { <p class="empty">"No log lines yet."</p> }.into_any()
            } else {
                view! { <pre class="logs" tabindex="0" data-testid="model-logs">{page.logs.join("\n")}</pre> }.into_any()
            }}
        </section>
    }
}

/// The steps of the group's last change, done or not.
#[component]
fn LastChange(change: PlanProgress) -> impl IntoView {
    let under_way = change.is_underway();
    let heading = if under_way {
        change.heading()
    } else {
        format!(
            "Last change: revision {} of {}",
            change.revision, change.group
        )
    };
    view! {
        <section class="panel" aria-labelledby="model-change" data-testid="model-change">
            <h2 id="model-change">{heading}</h2>
            <ol>
                {change.steps.iter().map(|s| {
                    let class = match s.state {
                        StepState::Waiting => "waiting",
                        StepState::Running => "running",
                        StepState::Done => "done",
                        StepState::Failed => "failed",
                    };
                    view! { <li class=class>{s.text()}</li> }
                }).collect_view()}
            </ol>
        </section>
    }
}

/// A model whose replicas follow its load: how many, where, its last steps with why, and its fewest and
/// most, to change (no engine restarts); or a member of a group without replicas, which may take them
/// (its engines restart), as a model with them may give them up (most left empty).
#[component]
fn ReplicasPanel(
    model: String,
    revision: i64,
    replicas: Option<crate::views::Replicas>,
    form: ReplicasForm,
) -> impl IntoView {
    let line = match &replicas {
        Some(r) => r.line(),
        None => "None: an engine on each machine of its group. Type a most to have replicas that follow its load, each on a GPU of its own (its engines restart).".to_owned(),
    };
    let steps = replicas
        .iter()
        .flat_map(|r| &r.decisions)
        .map(|d| {
            let text = format!("{}: {} → {}, {}", d.at, d.from, d.to, d.why);
            view! { <li>{text}</li> }
        })
        .collect_view();
    let has_steps = replicas.as_ref().is_some_and(|r| !r.decisions.is_empty());
    let on = replicas.as_ref().map(|r| {
        if r.gpus.is_empty() {
            "On: none.".to_owned()
        } else {
            let gpus: Vec<String> = r.gpus.iter().map(ToString::to_string).collect();
            format!("On: {}.", gpus.join(", "))
        }
    });
    let ReplicasForm { fewest, most, save } = form;
    let (min, max) = match &replicas {
        Some(r) => (r.min.to_string(), r.max.to_string()),
        None => ("1".to_owned(), String::new()),
    };
    let fewest_text = {
        let min = min.clone();
        move || fewest.get().unwrap_or_else(|| min.clone())
    };
    let most_text = {
        let max = max.clone();
        move || most.get().unwrap_or_else(|| max.clone())
    };
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        save.dispatch(SaveReplicas {
            model: model.clone(),
            revision,
            fewest: fewest.get_untracked().unwrap_or_else(|| min.clone()),
            most: most.get_untracked().unwrap_or_else(|| max.clone()),
        });
    };
    view! {
        <section class="panel" aria-labelledby="model-replicas" data-testid="model-replicas">
            <h2 id="model-replicas">"Replicas"</h2>
            <p data-testid="model-replicas-line">{line}</p>
            {on.map(|on| view! { <p>{on}</p> })}
            {has_steps.then(|| view! { <ol class="muted" data-testid="model-scale-steps">{steps}</ol> })}
            <form class="replicas" data-testid="replicas-form" on:submit=submit>
                <label for="replicas-fewest">"Fewest"</label>
                <input id="replicas-fewest" type="text" inputmode="numeric" size="4"
                    prop:value=fewest_text on:input=move |ev| fewest.set(Some(event_target_value(&ev))) />
                <label for="replicas-most">"Most"</label>
                <input id="replicas-most" type="text" inputmode="numeric" size="4"
                    prop:value=most_text on:input=move |ev| most.set(Some(event_target_value(&ev))) />
                <button type="submit" disabled=move || save.pending().get()>"Save replicas"</button>
            </form>
            {move || save.value().get().map(|answer| match answer {
                Ok(saved) => view! { <p data-testid="replicas-saved">{saved.line()}</p> }.into_any(),
                Err(e) => view! { <p class="error" role="alert" data-testid="replicas-error">{e.to_string()}</p> }.into_any(),
            })}
        </section>
    }
}
