//! The confirmation a change asks for before it restarts anything: it names each model that restarts.

use leptos::html;
use leptos::prelude::*;

/// The most restarts a confirmation names.
const NAMED: usize = 20;

/// A confirmation in a modal dialog: nothing behind it takes a click or a key until it is answered, it
/// does not push the page about (a table's row stays a row), and Escape cancels it. The keyboard lands on
/// the confirming button, or on Cancel where the action destroys something.
#[component]
pub fn Confirm(
    /// The question's heading, such as `Deploy vision?`.
    #[prop(into)]
    title: String,
    /// The models that restart.
    restarts: Vec<String>,
    /// What the change does, a line each (`glm-5.3 40% → 55% (38.4 → 52.8 GB)`).
    #[prop(optional)]
    changes: Vec<String>,
    /// What happens, when it is not a restart (a removal).
    #[prop(optional, into)]
    line: Option<String>,
    /// The confirming button's text (the action again: Deploy, Save).
    #[prop(into)]
    confirm: String,
    /// The action removes something (Remove, Revoke): its button says so in red, and Cancel has the focus.
    #[prop(optional)]
    destructive: bool,
    /// Whether the change is on its way to the server.
    #[prop(into)]
    pending: Signal<bool>,
    /// Runs on the confirming button.
    on_confirm: impl Fn() + 'static,
    /// Runs on Cancel and on Escape.
    on_cancel: impl Fn() + 'static,
) -> impl IntoView {
    let dialog = NodeRef::<html::Dialog>::new();
    let confirm_button = NodeRef::<html::Button>::new();
    let cancel_button = NodeRef::<html::Button>::new();
    Effect::new(move |_| {
        if let Some(dialog) = dialog.get() {
            if !dialog.open() {
                let _ = dialog.show_modal();
            }
            let first = if destructive {
                cancel_button.get()
            } else {
                confirm_button.get()
            };
            if let Some(button) = first {
                let _ = button.focus();
            }
        }
    });
    let on_cancel = std::rc::Rc::new(on_cancel);
    let on_escape = {
        let on_cancel = on_cancel.clone();
        move |ev: leptos::ev::Event| {
            // The dialog stays until the page removes it, as it does on Cancel.
            ev.prevent_default();
            on_cancel();
        }
    };
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
        <dialog class="confirm" node_ref=dialog role="alertdialog" aria-labelledby="confirm-title" aria-describedby="confirm-line" data-testid="confirm" on:cancel=on_escape>
            <h2 id="confirm-title">{title}</h2>
            {(!changes.is_empty()).then(|| view! {
                <ul class="changes" data-testid="confirm-changes">
                    {changes.into_iter().map(|line| view! { <li>{line}</li> }).collect_view()}
                </ul>
            })}
            <p id="confirm-line" data-testid="confirm-restarts">{line}</p>
            <ul class="restarts">
                {restarts.into_iter().map(|name| view! { <li>{name}</li> }).collect_view()}
            </ul>
            <div class="actions">
                <button type="button" class="primary" class:danger=destructive node_ref=confirm_button disabled=move || pending.get() on:click=move |_| on_confirm()>
                    {confirm}
                </button>
                <button type="button" class="secondary" node_ref=cancel_button on:click=move |_| on_cancel()>"Cancel"</button>
            </div>
        </dialog>
    }
}
