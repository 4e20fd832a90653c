//! The `model` field of an engine's answer, renamed on its way to the client to the name the model was asked
//! for: an engine may answer under its weights' path (llama.cpp's server does unless given an alias), and a
//! path on the server is not the client's to read. Its own room because it reads JSON as the bytes go by, a
//! small machine that is tested apart from the routing.
//!
//! It reads no more than it must: only JSON answers and event streams, only the top level of each object
//! (a value is skipped byte by byte, never parsed), and nothing after the field: the rest of a JSON answer,
//! and of an event's line, passes unread and uncopied.

use axum::body::Bytes;
use axum::http::{header, HeaderMap};

/// Renames the top-level `model` of a JSON answer, or of each `data:` event of a streamed one, frame by
/// frame.
pub(super) struct Rename {
    /// The new name, as a JSON string (quoted and escaped).
    name: Vec<u8>,
    kind: Kind,
}

enum Kind {
    /// One JSON object.
    Json(Object),
    /// Server-sent events, a JSON object in each `data:` line.
    Events(Line),
}

/// Where a line of an event stream is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Line {
    /// At its start, with so many bytes of `data:` matched.
    Start(usize),
    /// In a `data:` line's JSON.
    Data(Object),
    /// In the rest of a line, which passes unread up to its end.
    Rest,
}

/// Where the reading of one JSON object's top level is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Object {
    /// Before its `{`.
    Start,
    /// Where a key (or the object's end) comes next.
    BeforeKey,
    /// In a key: how much of `model` it has matched (`None` once it cannot be), and whether the last byte
    /// was a backslash.
    Key {
        matched: Option<usize>,
        escaped: bool,
    },
    /// After a key, before its `:`.
    AfterKey { model: bool },
    /// After the `:`, before the value.
    BeforeValue { model: bool },
    /// In another key's value: how deep in its arrays and objects, whether in a string, and whether the last
    /// byte was a backslash.
    Value {
        depth: usize,
        string: bool,
        escaped: bool,
    },
    /// After a value, before a `,` or the `}`.
    AfterValue,
    /// In the model's old name, which is dropped: the new one went out in its place.
    Model { escaped: bool },
    /// Renamed, or nothing to rename: the rest is not read.
    Done,
}

/// What becomes of the byte read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Keep,
    Drop,
    /// The new name goes out in its place (the opening quote of the old one).
    Name,
}

impl Object {
    fn step(self, b: u8) -> (Object, Act) {
        use Object::*;
        let white = b.is_ascii_whitespace();
        let next = match self {
            Start if white => Start,
            Start if b == b'{' => BeforeKey,
            BeforeKey if white => BeforeKey,
            BeforeKey if b == b'"' => Key {
                matched: Some(0),
                escaped: false,
            },
            Key { escaped: true, .. } => Key {
                matched: None,
                escaped: false,
            },
            Key { .. } if b == b'\\' => Key {
                matched: None,
                escaped: true,
            },
            Key { matched, .. } if b == b'"' => AfterKey {
                model: matched == Some(5),
            },
            Key { matched, .. } => Key {
                matched: matched
                    .filter(|&m| b"model".get(m) == Some(&b))
                    .map(|m| m + 1),
                escaped: false,
            },
            AfterKey { .. } if white => self,
            AfterKey { model } if b == b':' => BeforeValue { model },
            BeforeValue { .. } if white => self,
            BeforeValue { model: true } if b == b'"' => {
                return (Model { escaped: false }, Act::Name)
            }
            // A model that is not a string (`null`) is left as it is.
            BeforeValue { model: true } => Done,
            BeforeValue { model: false } => Value {
                depth: usize::from(b == b'{' || b == b'['),
                string: b == b'"',
                escaped: false,
            },
            Value {
                depth,
                string: true,
                escaped,
            } => match b {
                _ if escaped => Value {
                    depth,
                    string: true,
                    escaped: false,
                },
                b'\\' => Value {
                    depth,
                    string: true,
                    escaped: true,
                },
                b'"' if depth == 0 => AfterValue,
                b'"' => Value {
                    depth,
                    string: false,
                    escaped: false,
                },
                _ => self,
            },
            Value { depth, .. } => match b {
                b'"' => Value {
                    depth,
                    string: true,
                    escaped: false,
                },
                b'{' | b'[' => Value {
                    depth: depth + 1,
                    string: false,
                    escaped: false,
                },
                // A number, `true` or `null` ends where the object does.
                b'}' | b']' if depth == 0 => Done,
                b',' if depth == 0 => BeforeKey,
                b'}' | b']' if depth == 1 => AfterValue,
                b'}' | b']' => Value {
                    depth: depth - 1,
                    string: false,
                    escaped: false,
                },
                _ => self,
            },
            AfterValue if white => AfterValue,
            AfterValue if b == b',' => BeforeKey,
            Model { escaped } => {
                let next = match b {
                    b'"' if !escaped => Done,
                    b'\\' if !escaped => Model { escaped: true },
                    _ => Model { escaped: false },
                };
                return (next, Act::Drop);
            }
            // Not an object, its end, or not JSON: nothing more to read.
            _ => Done,
        };
        (next, Act::Keep)
    }
}

/// The top-level `model` string of a JSON request, read from its first bytes: the bytes before it are
/// skipped as values, not parsed, and those after it are not read. `None` where the body is not a JSON
/// object or has no string `model` there.
pub(super) fn named(body: &[u8]) -> Option<String> {
    let mut object = Object::Start;
    for (at, &b) in body.iter().enumerate() {
        let (next, act) = object.step(b);
        if act == Act::Name {
            // At the name's opening quote: serde reads the string, escapes and all, and stops at its end.
            let mut name = serde_json::Deserializer::from_slice(&body[at..]);
            return serde::Deserialize::deserialize(&mut name).ok();
        }
        if next == Object::Done {
            return None;
        }
        object = next;
    }
    None
}

impl Rename {
    /// For an answer with `headers`, renaming its model to `name`: `None` where it is neither JSON nor an
    /// event stream (audio, text, a compressed body), which passes untouched.
    pub(super) fn of_answer(headers: &HeaderMap, name: &str) -> Option<Rename> {
        let encoded = headers
            .get(header::CONTENT_ENCODING)
            .is_some_and(|e| e.as_bytes() != b"identity");
        let content_type = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
        let essence = content_type.split(';').next()?.trim();
        let kind = if essence.eq_ignore_ascii_case("application/json") {
            Kind::Json(Object::Start)
        } else if essence.eq_ignore_ascii_case("text/event-stream") {
            Kind::Events(Line::Start(0))
        } else {
            return None;
        };
        (!encoded).then(|| Rename {
            name: serde_json::to_vec(name).expect("a string is JSON"),
            kind,
        })
    }

    /// Whether it still reads what comes: `false` once a JSON answer's model is renamed (or it has none).
    pub(super) fn reading(&self) -> bool {
        !matches!(self.kind, Kind::Json(Object::Done))
    }

    /// The next frame of the answer, renamed where the model's name is in it; the frame itself (not a copy)
    /// where it is not.
    pub(super) fn pass(&mut self, frame: Bytes) -> Bytes {
        let mut out: Option<Vec<u8>> = None;
        // The frame's bytes from here on are not yet in `out`.
        let mut kept_from = 0;
        let mut at = 0;
        while at < frame.len() {
            let b = frame[at];
            let act = match &mut self.kind {
                Kind::Json(Object::Done) => break,
                Kind::Json(object) => {
                    let (next, act) = object.step(b);
                    *object = next;
                    act
                }
                Kind::Events(line) => {
                    let (next, act) = match *line {
                        Line::Rest => match frame[at..].iter().position(|&c| c == b'\n') {
                            Some(end) => {
                                at += end;
                                (Line::Start(0), Act::Keep)
                            }
                            None => break,
                        },
                        _ if b == b'\n' => (Line::Start(0), Act::Keep),
                        Line::Start(matched) if b"data:".get(matched) == Some(&b) => {
                            if matched + 1 == 5 {
                                (Line::Data(Object::Start), Act::Keep)
                            } else {
                                (Line::Start(matched + 1), Act::Keep)
                            }
                        }
                        Line::Start(_) => (Line::Rest, Act::Keep),
                        Line::Data(object) => match object.step(b) {
                            (Object::Done, act) => (Line::Rest, act),
                            (next, act) => (Line::Data(next), act),
                        },
                    };
                    *line = next;
                    act
                }
            };
            if act != Act::Keep {
                let out =
                    out.get_or_insert_with(|| Vec::with_capacity(frame.len() + self.name.len()));
                out.extend_from_slice(&frame[kept_from..at]);
                if act == Act::Name {
                    out.extend_from_slice(&self.name);
                }
                kept_from = at + 1;
            }
            at += 1;
        }
        match out {
            None => frame,
            Some(mut out) => {
                out.extend_from_slice(&frame[kept_from..]);
                Bytes::from(out)
            }
        }
    }
}
