//! The serving settings of a model's engine, as the wizard's Serving step and the Serving configuration
//! form edit them: extra arguments (split as a shell would) and environment variables (one per line).

use crate::deploy_form::{args_example, parse_args, parse_env};
use leptos::prelude::*;

/// The two fields and what is wrong with them.
#[component]
pub fn ServingFields(
    /// The extra arguments, as typed.
    args: RwSignal<String>,
    /// The environment variables, as typed.
    env: RwSignal<String>,
    /// What runs the model (`vllm`, `sglang`, `llamacpp`, `command`): the example is in its flags.
    #[prop(into)]
    engine: Signal<String>,
) -> impl IntoView {
    let problem = move || {
        parse_args(&args.get())
            .err()
            .or_else(|| parse_env(&env.get()).err())
    };
    // The text area's first text, for the page as the server sends it.
    let opened = env.get_untracked();
    view! {
        <label for="args">"Extra arguments"</label>
        <input
            id="args"
            type="text"
            class="wide"
            autocomplete="off"
            placeholder=move || engine.with(|e| args_example(e))
            prop:value=move || args.get()
            on:input=move |ev| args.set(event_target_value(&ev))
        />
        <label for="env">"Environment variables"</label>
        <textarea
            id="env"
            rows="4"
            aria-describedby="env-help"
            prop:value=move || env.get()
            on:input=move |ev| env.set(event_target_value(&ev))
        >
            {opened}
        </textarea>
        <p id="env-help" class="muted">"One NAME=value per line."</p>
        {move || problem().map(|p| view! { <p class="field-error" role="alert">{p}</p> })}
    }
}
