//! The confirmation a change asks for before it restarts anything: it names each model that restarts.

use leptos::html;
use leptos::prelude::*;

/// The most restarts a confirmation names.
const NAMED: usize = 20;

/// A confirmation in place, focused when it opens so that the keyboard lands on it.
#[component]
pub fn Confirm(
    /// The question's heading, such as `Deploy vision?`.
    #[prop(into)]
    title: String,
    /// The models that restart.
    restarts: Vec<String>,
    /// What happens, when it is not a restart (a removal).
    #[prop(optional, into)]
    line: Option<String>,
    /// The confirming button's text (the action again: Deploy, Save).
    #[prop(into)]
    confirm: String,
    /// Whether the change is on its way to the server.
    #[prop(into)]
    pending: Signal<bool>,
    /// Runs on the confirming button.
    on_confirm: impl Fn() + 'static,
    /// Runs on Cancel.
    on_cancel: impl Fn() + 'static,
) -> impl IntoView {
    let button = NodeRef::<html::Button>::new();
    Effect::new(move |_| {
        if let Some(button) = button.get() {
            let _ = button.focus();
        }
    });
    // A fleet's repack may restart thousands: the first are named, the rest counted.
    let mut restarts = restarts;
    let more = restarts.len().saturating_sub(NAMED);
    let total = restarts.len();
    restarts.truncate(NAMED);
    let mut names = restarts.join(", ");
    if more > 0 {
        names.push_str(&format!(" and {more} more"));
    }
    let line = line.unwrap_or_else(|| match total {
        0 => "Nothing restarts.".to_owned(),
        1 => format!("This restarts {names}."),
        _ => format!("This restarts {total} models: {names}."),
    });
    view! {
        <div class="confirm" role="alertdialog" aria-labelledby="confirm-title" aria-describedby="confirm-line" data-testid="confirm">
            <h2 id="confirm-title">{title}</h2>
            <p id="confirm-line" data-testid="confirm-restarts">{line}</p>
            <ul class="restarts">
                {restarts.into_iter().map(|name| view! { <li>{name}</li> }).collect_view()}
            </ul>
            <div class="actions">
                <button type="button" class="primary" node_ref=button disabled=move || pending.get() on:click=move |_| on_confirm()>
                    {confirm}
                </button>
                <button type="button" class="secondary" on:click=move |_| on_cancel()>"Cancel"</button>
            </div>
        </div>
    }
}
