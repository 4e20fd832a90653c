//! What changes on the server shows without a reload: the browser follows the runtime's event stream
//! (`GET /api/events`) and every page's reads depend on a counter that each event moves on.

use crate::components::account_menu::signed_in;
use leptos::prelude::*;

/// The counter the reads depend on; it moves when something changed on the server.
#[derive(Debug, Clone, Copy)]
pub struct Live(RwSignal<u64>);

impl Live {
    /// Reads the counter, so that the caller runs again when the server reports a change.
    pub fn track(self) -> u64 {
        self.0.get()
    }

    /// Moves the counter by hand: after a write of this page's own.
    pub fn bump(self) {
        self.0.update(|n| *n += 1);
    }
}

/// Provides [`Live`] to the app and, in the browser, opens the event stream once someone is signed in
/// (the sign-in page has nothing to follow, and the stream would refuse it).
pub fn provide_live() {
    let live = Live(RwSignal::new(0));
    provide_context(live);
    let following = StoredValue::new(false);
    // Effects run in the browser only: the server renders what it has.
    Effect::new(move |_| {
        if signed_in().is_some() && !following.get_value() {
            following.set_value(true);
            follow_events(live);
        }
    });
}

/// The app's [`Live`].
pub fn use_live() -> Live {
    expect_context::<Live>()
}

#[cfg(feature = "hydrate")]
fn follow_events(live: Live) {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;
    use wasm_bindgen::closure::Closure;
    use wasm_bindgen::JsCast;

    let Ok(source) = web_sys::EventSource::new("/api/events") else {
        return;
    };
    // A restart is a burst of events: read again once per burst, not once per event.
    let waiting = Rc::new(Cell::new(false));
    let soon = move || {
        if !waiting.replace(true) {
            let waiting = waiting.clone();
            set_timeout(
                move || {
                    waiting.set(false);
                    live.bump();
                },
                Duration::from_millis(150),
            );
        }
    };
    let on_message = Closure::<dyn FnMut(web_sys::MessageEvent)>::new({
        let soon = soon.clone();
        move |_| soon()
    });
    // After a reconnect, whatever happened meanwhile is read again.
    let on_open = Closure::<dyn FnMut(web_sys::Event)>::new(move |_| soon());
    source.set_onmessage(Some(on_message.as_ref().unchecked_ref()));
    source.set_onopen(Some(on_open.as_ref().unchecked_ref()));
    // The stream lives as long as the page; EventSource reconnects by itself.
    on_message.forget();
    on_open.forget();
    std::mem::forget(source);
}

#[cfg(not(feature = "hydrate"))]
fn follow_events(_live: Live) {}
