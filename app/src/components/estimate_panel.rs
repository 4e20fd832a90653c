//! A model's memory estimate beside its share: the parts, the inputs it assumed (editable), a Suggest button
//! that fills the share from it, and a warning of its own when the share is below it. Its own room because
//! it reads the server (the model's file is there) while the share panel beside it judges in the browser.

use crate::deploy_form::estimate_query;
use crate::error::AppError;
use crate::share_form::ShareRow;
use crate::views::{EstimateAnswer, EstimateQuery};
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use placement::estimate::{Estimate, CACHE_TYPES};
use placement::rightsize::{below_estimate, share_for as suggested_share};
use placement::Bytes;

/// A catalog model's memory estimate from its file's header, or why it has none.
#[server(prefix = "/rpc", endpoint = "estimate_model", input = Json, client = crate::csrf::CsrfClient)]
pub async fn estimate_model(query: EstimateQuery) -> Result<EstimateAnswer, AppError> {
    crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.estimate(query)).await
}

fn part(bytes: Option<Bytes>) -> String {
    bytes.map_or_else(|| "not estimated".to_owned(), size)
}

/// A size as the panel shows it: in MB below one GB, where a small model's parts would all read "0 GB".
fn size(bytes: Bytes) -> String {
    bytes.size_text()
}

/// How an engine names what the estimate asks: llama.cpp's slots, vLLM's and SGLang's sequences. None for
/// a `command` recipe, whose server sizes itself: the estimate then takes the model's own figures.
fn words(engine: &str) -> Option<(&'static str, &'static str)> {
    match engine {
        "llamacpp" => Some(("slot", "slots")),
        "vllm" | "sglang" => Some(("sequence", "sequences")),
        _ => None,
    }
}

/// What the estimate assumed, in a line, in the engine's words.
fn assumed_line(e: &Estimate, engine: &str) -> String {
    let a = &e.assumed;
    let (one, many) = words(engine).unwrap_or(("sequence", "sequences"));
    let whose = if a.context_from_model {
        " (the model's own)"
    } else {
        ""
    };
    format!(
        "Assumed: {} tokens of context per {one}{whose}, {} {}, {}/{} cache.",
        a.context,
        a.slots,
        if a.slots == 1 { one } else { many },
        a.cache_type_k.name(),
        a.cache_type_v.name()
    )
}

/// What the ids of `model`'s panel end in: a page may hold one panel per member of a group.
fn id_part(model: &str) -> String {
    model
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The estimate of `model` on a GPU of `gpu_total`, beside its row of the share panel.
#[component]
pub fn EstimatePanel(
    /// The model being deployed.
    model: String,
    /// What runs it (`vllm`, `sglang`, `llamacpp`, `command`): the inputs it offers are the engine's.
    engine: String,
    /// The machine it would run on.
    machine: Option<String>,
    /// One GPU's memory.
    gpu_total: Bytes,
    /// The share panel's rows: Suggest fills the model's, the warning reads it.
    rows: RwSignal<Vec<ShareRow>>,
) -> impl IntoView {
    let model_name = model.clone();
    let context = RwSignal::new(String::new());
    let slots = RwSignal::new("1".to_owned());
    let cache = RwSignal::new("f16".to_owned());
    let query = {
        let model = model.clone();
        Memo::new(move |_| {
            estimate_query(
                &model,
                machine.clone(),
                &context.get(),
                &slots.get(),
                &cache.get(),
            )
        })
    };
    let estimate = Resource::new(
        move || query.get().ok(),
        |query| async move {
            match query {
                Some(query) => estimate_model(query).await.map(Some),
                None => Ok(None),
            }
        },
    );
    // The estimate goes into the model's row of the share panel: its segment marks it, and the row turns
    // amber while the share is below it.
    // Where no estimate can be made (no file Tessera can read), inputs that change nothing are not offered.
    // A signal set here rather than the resource read in the attribute: an attribute hydrates as the server
    // rendered it (before the estimate was read), and an effect runs after hydration, so the change shows.
    let estimable = RwSignal::new(true);
    {
        let model = model.clone();
        Effect::new(move |_| {
            let answer = estimate.get();
            estimable.set(!matches!(
                answer,
                Some(Ok(Some(EstimateAnswer::NotEstimated(_))))
            ));
            let needed = match answer {
                Some(Ok(Some(EstimateAnswer::Estimated(e)))) => Some(e.total()),
                _ => None,
            };
            let stale = rows.with_untracked(|r| {
                r.iter()
                    .any(|row| row.name == model && row.estimate != needed)
            });
            if stale {
                rows.update(|r| {
                    for row in r.iter_mut().filter(|row| row.name == model) {
                        row.estimate = needed;
                    }
                });
            }
        });
    }
    let share = {
        let model = model.clone();
        move || {
            rows.with(|r| {
                r.iter()
                    .find(|row| row.name == model)
                    .and_then(|row| row.member().share)
            })
        }
    };
    let suggest = move |needed: Bytes| {
        let model = model.clone();
        move |_| {
            if let Some(share) = suggested_share(needed, gpu_total) {
                rows.update(|r| {
                    if let Some(row) = r.iter_mut().find(|row| row.name == model) {
                        row.text = share.percent_text();
                    }
                });
            }
        }
    };

    let key = id_part(&model_name);
    let (heading, context_id, slots_id, cache_id) = (
        format!("memory-estimate-{key}"),
        format!("estimate-context-{key}"),
        format!("estimate-slots-{key}"),
        format!("estimate-cache-{key}"),
    );
    let title = format!("Memory estimate: {model_name}");
    // Only llama.cpp takes a cache type from here; vLLM and SGLang keep the cache in the model's own type,
    // and a command recipe's server takes none of these inputs.
    let (context_label, slots_label) = match words(&engine) {
        Some((one, many)) => (format!("Context per {one}"), format!("Parallel {many}")),
        None => (String::new(), String::new()),
    };
    let takes_inputs = words(&engine).is_some();
    let takes_cache_type = engine == "llamacpp";
    let engine_words = engine.clone();
    let labelled_by = heading.clone();
    let shown = move |answer: EstimateAnswer| match answer {
        EstimateAnswer::NotEstimated(reason) => view! {
            <p class="muted" data-testid="no-estimate">{format!("No estimate: {reason}.")}</p>
        }
        .into_any(),
        EstimateAnswer::Estimated(e) => {
            let needed = e.total();
            let share = share.clone();
            let warning = move || share().and_then(|s| below_estimate(s, gpu_total, needed));
            let too_big = suggested_share(needed, gpu_total).is_none();
            let gaps = e
                .gaps
                .iter()
                .map(|g| g.to_string())
                .chain(e.caveats.iter().map(|c| c.to_string()))
                .map(|line| view! { <li>{line}</li> })
                .collect_view();
            view! {
                <table class="estimate-parts" data-testid="estimate-parts">
                    <tbody>
                        <tr><th scope="row">"Weights"</th><td>{part(Some(e.weights.bytes))}</td></tr>
                        <tr><th scope="row">"KV cache"</th><td>{part(e.kv_cache.map(|k| k.bytes))}</td></tr>
                        {e.recurrent.map(|r| view! { <tr><th scope="row">"Recurrent state"</th><td>{part(Some(r.bytes))}</td></tr> })}
                        <tr><th scope="row">"Compute buffers"</th><td>{part(e.compute.map(|c| c.bytes))}</td></tr>
                        <tr><th scope="row">"Output buffer"</th><td>{part(e.output)}</td></tr>
                        <tr class="total"><th scope="row">"Estimate"</th><td data-testid="estimate-total">{size(needed)}</td></tr>
                    </tbody>
                </table>
                <p class="muted" data-testid="estimate-assumed">{assumed_line(&e, &engine_words)}</p>
                <ul class="muted">{gaps}</ul>
                <button type="button" class="secondary" data-testid="suggest" disabled=too_big on:click=suggest(needed)>"Suggest"</button>
                {too_big.then(|| view! { <p class="error">"One GPU cannot hold this estimate."</p> })}
                {move || warning().map(|w| view! { <p class="warn" role="alert" data-testid="estimate-warning">{w}</p> })}
            }
            .into_any()
        }
    };

    view! {
        <section class="panel" aria-labelledby=labelled_by data-testid="estimate-panel" data-model=model_name>
            <h2 id=heading>{title}</h2>
            {(!takes_inputs).then(|| view! {
                <p class="muted" data-testid="estimate-command">"A command recipe's server sizes itself: the estimate takes the model's own context, one sequence."</p>
            })}
            <div class="estimate-inputs" hidden=move || !takes_inputs || !estimable.get()>
                <label for=context_id.clone()>{context_label}</label>
                <input id=context_id type="text" inputmode="numeric" size="16" placeholder="the model's own"
                    prop:value=move || context.get() on:input=move |ev| context.set(event_target_value(&ev)) />
                <label for=slots_id.clone()>{slots_label}</label>
                <input id=slots_id type="text" inputmode="numeric" size="4"
                    prop:value=move || slots.get() on:input=move |ev| slots.set(event_target_value(&ev)) />
                {takes_cache_type.then(|| view! {
                    <label for=cache_id.clone()>"Cache type"</label>
                    <select id=cache_id.clone() on:change=move |ev| cache.set(event_target_value(&ev))>
                        {CACHE_TYPES.iter().map(|t| {
                            let name = t.name();
                            view! { <option value=name selected=move || cache.get() == name>{name}</option> }
                        }).collect_view()}
                    </select>
                })}
            </div>
            {move || query.get().err().map(|e| view! { <p class="field-error" role="alert">{e}</p> })}
            <Transition fallback=|| view! { <p class="muted">"Reading the model's header…"</p> }>
                {move || estimate.get().map(|answer| match answer {
                    Ok(Some(answer)) => shown(answer),
                    Ok(None) => ().into_any(),
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                })}
            </Transition>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_engine_is_asked_in_its_own_words_and_a_command_recipe_not_at_all() {
        assert_eq!(words("llamacpp"), Some(("slot", "slots")));
        assert_eq!(words("vllm"), Some(("sequence", "sequences")));
        assert_eq!(words("sglang"), Some(("sequence", "sequences")));
        assert_eq!(words("command"), None);
    }

    #[test]
    fn a_part_under_a_gb_is_shown_in_mb_rounded_up_and_a_larger_one_in_gb() {
        assert_eq!(size(Bytes(10_315_040)), "10 MB");
        assert_eq!(part(None), "not estimated");
    }
}
