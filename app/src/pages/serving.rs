//! The Serving configuration form of a running model: its nodes and GPU width as it is placed (selected even
//! on a node with no free GPU), and its engine's extra arguments and environment variables. Saving restarts
//! that model alone, after a confirmation.

use crate::components::confirm::Confirm;
use crate::components::serving_fields::ServingFields;
use crate::deploy_form::{args_text, env_text, parse_args, parse_env};
use crate::error::AppError;
use crate::views::{ChangeOutcome, Serving, ServingForm};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::components::A;
use leptos_router::hooks::{use_navigate, use_params_map};

/// The form of `model` as it runs now.
#[server(prefix = "/rpc", endpoint = "load_serving_form", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_serving_form(model: String) -> Result<ServingForm, AppError> {
    let caller = crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.serving_form(caller, model)).await
}

/// Changes `model`'s serving configuration, read at `revision`.
#[server(prefix = "/rpc", endpoint = "save_serving", input = Json, client = crate::csrf::CsrfClient)]
pub async fn save_serving(
    model: String,
    revision: i64,
    serving: Serving,
) -> Result<ChangeOutcome, AppError> {
    let actor = crate::auth::require(crate::auth::Role::Operator)?;
    let console = crate::services::console()?;
    crate::services::answer(console.change_serving(actor, model, revision, serving)).await
}

/// The page.
#[component]
pub fn ServingPage() -> impl IntoView {
    let params = use_params_map();
    let model = move || params.read().get("name").unwrap_or_default();
    let form = Resource::new(model, load_serving_form);
    view! {
        <div class="page">
            <p class="crumbs"><A href="/models">"Models"</A> " / " {model} " / Serving configuration"</p>
            <Suspense fallback=|| view! { <p>"Loading the configuration…"</p> }>
                {move || form.get().map(|answer| match answer {
                    Ok(form) => view! { <ServingEditor form /> }.into_any(),
                    Err(e) => view! { <h1>"Serving configuration"</h1><p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Suspense>
        </div>
    }
}

#[component]
fn ServingEditor(form: ServingForm) -> impl IntoView {
    let args = RwSignal::new(args_text(&form.serving.args));
    let env = RwSignal::new(env_text(&form.serving.env));
    let parsed = Memo::new(move |_| {
        let args = parse_args(&args.get())?;
        let env = parse_env(&env.get())?;
        Ok::<Serving, String>(Serving { args, env })
    });
    let original = form.serving.clone();
    let changed = move || parsed.with(|p| p.as_ref().is_ok_and(|s| *s != original));
    let confirming = RwSignal::new(false);
    let save = ServerAction::<SaveServing>::new();
    let navigate = use_navigate();
    Effect::new(move |_| {
        if let Some(Ok(outcome)) = save.value().get() {
            navigate(
                &format!("/models?restarts={}", outcome.restarts.join(",")),
                Default::default(),
            );
        }
    });
    let hydrated = RwSignal::new(false);
    Effect::new(move |_| hydrated.set(true));
    let model = form.model.clone();
    let revision = form.revision;
    let width = form
        .placed
        .iter()
        .filter(|g| form.placed.first().is_some_and(|f| f.machine == g.machine))
        .count();
    let nodes = form
        .nodes
        .iter()
        .map(|node| {
            let on: Vec<u32> = form
                .placed
                .iter()
                .filter(|g| g.machine == node.name)
                .map(|g| g.index)
                .collect();
            let id = format!("node-{}", node.name);
            let detail = if on.is_empty() {
                match node.gpus.len() {
                    1 => "1 GPU".to_owned(),
                    n => format!("{n} GPUs"),
                }
            } else {
                let list: Vec<String> = on.iter().map(ToString::to_string).collect();
                format!("runs on GPU {}", list.join(", "))
            };
            view! {
                <li>
                    <input type="checkbox" id=id.clone() checked=!on.is_empty() disabled=true />
                    <label for=id>{node.name.clone()} <span class="muted">" · " {detail}</span></label>
                </li>
            }
        })
        .collect_view();
    let group_note = form.group.clone().map(|g| {
        format!("{} shares the GPUs of {g}: to run it on other nodes or another width, remove it and deploy it again.", form.model)
    });
    view! {
        <div data-hydrated=move || hydrated.get().to_string()>
            <h1>"Serving configuration"</h1>
            <fieldset class="panel">
                <legend>"Placement"</legend>
                <p class="muted">{group_note}</p>
                <ul class="choices" aria-label="Nodes">{nodes}</ul>
                <label for="width">"GPU width"</label>
                <select id="width" disabled=true>
                    <option selected=true>{width.to_string()}</option>
                </select>
            </fieldset>
            <fieldset class="panel">
                <legend>"Serving"</legend>
                <ServingFields args env engine=form.engine.clone() />
            </fieldset>
            {move || save.value().get().and_then(Result::err).map(|e| view! { <p class="error" role="alert">{e.to_string()}</p> })}
            {move || if confirming.get() {
                let model = model.clone();
                view! {
                    <Confirm
                        title="Save the serving configuration?"
                        restarts=vec![model.clone()]
                        confirm="Save"
                        pending=save.pending()
                        on_confirm=move || {
                            if let Ok(serving) = parsed.get_untracked() {
                                save.dispatch(SaveServing { model: model.clone(), revision, serving });
                            }
                        }
                        on_cancel=move || confirming.set(false)
                    />
                }.into_any()
            } else {
                let changed = changed.clone();
                view! {
                    <div class="actions">
                        <button type="button" class="primary" disabled=move || !changed() on:click=move |_| confirming.set(true)>"Save"</button>
                        <A href="/models" attr:class="button secondary">"Cancel"</A>
                    </div>
                }.into_any()
            }}
        </div>
    }
}
