//! An engine's answer on its way to the client: passed on frame by frame as it comes, counted in flight and
//! metered until its last byte, its `model` field renamed to the name the model was asked for, and, where
//! the engine stops before the end (it died, its connection broke), counted as failed and, when streamed,
//! ended with an error event the client can read rather than just stopping. Its own room because it is the
//! one place an answer's body is touched.

use super::metering::Meter;
use super::model_field::Rename;
use crate::runtime::InFlight;
use axum::body::{Body, Bytes};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::json;

/// What an answer carries with it to its end.
pub(super) struct Passing {
    /// The request's count in flight to its engine, given back when the answer ends (dropped with it).
    pub(super) _in_flight: InFlight,
    pub(super) meter: Meter,
    /// The model's name in the answer, where the answer is JSON or events.
    pub(super) rename: Option<Rename>,
    /// Whether the answer is a stream of server-sent events.
    pub(super) events: bool,
    /// The model asked for.
    pub(super) model: String,
}

/// The engine's answer, passed on as it comes.
pub(super) fn held_to_the_end(body: Incoming, passing: Passing) -> Body {
    // An event stream that has sent nothing, or whose last frame ended an event, can take an event as it is.
    let going = Some((body, passing, true));
    let frames = futures::stream::unfold(going, |going| async move {
        let (mut body, mut passing, at_event_end) = going?;
        match body.frame().await? {
            Ok(frame) => {
                let (frame, at_event_end) = match frame.into_data() {
                    Ok(data) => {
                        passing.meter.saw(&data);
                        let ends_event = match data.len() {
                            0 => at_event_end,
                            _ => data.ends_with(b"\n\n") || data.ends_with(b"\r\n\r\n"),
                        };
                        let data = match &mut passing.rename {
                            Some(rename) => rename.pass(data),
                            None => data,
                        };
                        // Renamed: the rest passes without a look.
                        if passing.rename.as_ref().is_some_and(|r| !r.reading()) {
                            passing.rename = None;
                        }
                        (Frame::data(data), ends_event)
                    }
                    // Trailers.
                    Err(frame) => (frame, at_event_end),
                };
                Some((Ok(frame), Some((body, passing, at_event_end))))
            }
            Err(cut) => {
                tracing::warn!(
                    "an engine of {} stopped before the end of its answer: {cut}",
                    passing.model
                );
                passing.meter.cut_short();
                if !passing.events {
                    // Nothing else can be ended well: the client's connection breaks as the engine's did.
                    return Some((Err(cut), None));
                }
                let event = cut_short_event(&passing.model, at_event_end);
                Some((Ok(Frame::data(event)), None))
            }
        }
    });
    Body::new(StreamBody::new(frames))
}

/// The event that ends a stream cut short, in OpenAI's error shape; after blank lines where the stream
/// stopped inside an event, so that it stands as one of its own.
fn cut_short_event(model: &str, at_event_end: bool) -> Bytes {
    let error = json!({"error": {
        "message": format!("the engine of {model} stopped before the end of its answer; ask again"),
        "type": "server_error",
        "code": "engine_cut_short",
        "param": null,
    }});
    let before = if at_event_end { "" } else { "\n\n" };
    Bytes::from(format!("{before}data: {error}\n\n"))
}
