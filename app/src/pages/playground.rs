//! `/playground`: try a deployed model. Pick it, chat with the answer streaming in (through the gateway,
//! as the signed-in account: `POST /api/playground`), see the same request as `curl` against `/v1`, and
//! the engine's last log lines.

use crate::error::AppError;
use crate::views::Playground;
use leptos::prelude::*;
use leptos::server_fn::codec::Json;
use leptos_router::hooks::use_query_map;
use serde::{Deserialize, Serialize};

/// How many of the engine's log lines the page shows.
pub const LOG_LINES: usize = 20;

/// The models that can be tried, and the last log lines of `model`'s engine.
#[server(prefix = "/rpc", endpoint = "load_playground", input = Json, client = crate::csrf::CsrfClient)]
pub async fn load_playground(model: Option<String>) -> Result<Playground, AppError> {
    let caller = crate::auth::require(crate::auth::Role::Viewer)?;
    let console = crate::services::console()?;
    crate::services::answer(console.playground(caller, model)).await
}

/// One message of the conversation, as OpenAI's chat API takes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `user` or `assistant`.
    pub role: String,
    /// What was said.
    pub content: String,
}

/// A turn as the page shows it: what was said, and why it went unanswered where it did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Turn {
    /// The message.
    pub message: Message,
    /// Why no answer came: the turn stays in sight with its error, and is not sent again.
    pub failed: Option<String>,
}

/// The conversation a request carries: every turn but those that went unanswered, then `said` (blank:
/// nothing more).
pub fn conversation(turns: &[Turn], said: &str) -> Vec<Message> {
    let mut all: Vec<Message> = turns
        .iter()
        .filter(|t| t.failed.is_none())
        .map(|t| t.message.clone())
        .collect();
    if !said.trim().is_empty() {
        all.push(Message {
            role: "user".to_owned(),
            content: said.to_owned(),
        });
    }
    all
}

/// The chat request the page sends (streamed) and shows as `curl`.
pub fn chat_body(model: &str, messages: &[Message]) -> String {
    #[derive(Serialize)]
    struct Body<'a> {
        model: &'a str,
        messages: &'a [Message],
        stream: bool,
    }
    serde_json::to_string(&Body {
        model,
        messages,
        stream: true,
    })
    .unwrap_or_default()
}

/// The same request as a script sends it to the gateway with an API token.
pub fn as_curl(origin: &str, body: &str) -> String {
    format!(
        "curl -N {origin}/v1/chat/completions \\\n  -H \"Authorization: Bearer $TESSERA_TOKEN\" \\\n  -H \"Content-Type: application/json\" \\\n  -d '{}'",
        body.replace('\'', "'\\''")
    )
}

/// What an answer's events add to its text: the `delta.content` of each `data:` event of `events`
/// (complete events, the blank line between them included), until `data: [DONE]`.
pub fn streamed_text(events: &str) -> String {
    #[derive(Deserialize)]
    struct Delta {
        content: Option<String>,
    }
    #[derive(Deserialize)]
    struct Choice {
        delta: Option<Delta>,
    }
    #[derive(Deserialize)]
    struct Chunk {
        #[serde(default)]
        choices: Vec<Choice>,
    }
    events
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim)
        .take_while(|data| *data != "[DONE]")
        .filter_map(|data| serde_json::from_str::<Chunk>(data).ok())
        .flat_map(|chunk| chunk.choices)
        .filter_map(|choice| choice.delta?.content)
        .collect()
}

/// The message of an error answer: Tessera's or OpenAI's shape, else the status.
pub fn error_message(status: u16, body: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
    value["error"]["message"]
        .as_str()
        .or_else(|| value["error"].as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| format!("the gateway answered {status}"))
}

/// Sends the chat and calls `heard` with the answer's text as it grows.
#[cfg(feature = "hydrate")]
async fn stream_chat(body: String, mut heard: impl FnMut(String)) -> Result<(), String> {
    use futures::StreamExt;
    use leptos::server_fn::client::Client;
    use leptos::server_fn::request::browser::BrowserRequest;
    use leptos::server_fn::request::ClientReq;
    use leptos::server_fn::response::ClientRes;
    let request = <BrowserRequest as ClientReq<AppError>>::try_new_post(
        "/api/playground",
        "application/json",
        "text/event-stream",
        body,
    )
    .map_err(|e| e.to_string())?;
    let response = <crate::csrf::CsrfClient as Client<AppError, AppError, AppError>>::send(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = ClientRes::<AppError>::status(&response);
    if !(200..300).contains(&status) {
        let text = ClientRes::<AppError>::try_into_string(response)
            .await
            .unwrap_or_default();
        return Err(error_message(status, &text));
    }
    let mut chunks = ClientRes::<AppError>::try_into_stream(response).map_err(|e| e.to_string())?;
    let mut pending: Vec<u8> = Vec::new();
    let mut text = String::new();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| String::from_utf8_lossy(&e).into_owned())?;
        pending.extend_from_slice(&chunk);
        // Whole events only: a chunk may end inside one, or inside a character.
        if let Some(end) = pending.windows(2).rposition(|w| w == b"\n\n") {
            let events: Vec<u8> = pending.drain(..end + 2).collect();
            text.push_str(&streamed_text(&String::from_utf8_lossy(&events)));
            heard(text.clone());
        }
    }
    Ok(())
}

/// The page.
#[component]
pub fn PlaygroundPage() -> impl IntoView {
    let query = use_query_map();
    let chosen = RwSignal::new(query.with_untracked(|q| q.get("model")));
    let page = Resource::new(|| (), |_| load_playground(None));
    view! {
        <div class="page">
            <h1>"Playground"</h1>
            <p class="muted">"Try a deployed model through the gateway, as your account. Scripts send the same request to /v1 with an API token."</p>
            <Transition fallback=|| view! { <p>"Loading the models…"</p> }>
                {move || page.get().map(|answer| match answer {
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                    Ok(p) if p.models.is_empty() => view! {
                        <p class="empty" data-testid="no-models">"No model is deployed yet: deploy one first."</p>
                    }.into_any(),
                    Ok(p) => view! { <Chat models=p.models chosen /> }.into_any(),
                })}
            </Transition>
        </div>
    }
}

/// The model picker, the conversation, the request as curl and the engine's log lines.
#[component]
fn Chat(models: Vec<String>, chosen: RwSignal<Option<String>>) -> impl IntoView {
    let first = models.first().cloned();
    let model = move || chosen.get().or_else(|| first.clone());
    let refresh = RwSignal::new(0u32);
    let logs = Resource::new(
        {
            let model = model.clone();
            move || (model(), refresh.get())
        },
        |(model, _)| load_playground(model),
    );
    let turns = RwSignal::new(Vec::<Turn>::new());
    let draft = RwSignal::new(String::new());
    let answering = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let next = move || turns.with(|t| conversation(t, &draft.get()));
    // Where the browser reached the console is where a script reaches the gateway; the server cannot
    // tell (a proxy may be in front), so the page fills it in once it runs.
    let origin = RwSignal::new("http://TESSERA".to_owned());
    Effect::new(move |_| {
        if let Ok(here) = window().location().origin() {
            origin.set(here);
        }
    });
    let curl = {
        let model = model.clone();
        move || {
            as_curl(
                &origin.get(),
                &chat_body(&model().unwrap_or_default(), &next()),
            )
        }
    };
    let send = {
        let model = model.clone();
        move |ev: leptos::ev::SubmitEvent| {
            ev.prevent_default();
            let Some(model) = model() else { return };
            if draft.get_untracked().trim().is_empty() || busy.get_untracked() {
                return;
            }
            let asked = next();
            let body = chat_body(&model, &asked);
            turns.update(|t| {
                t.push(Turn {
                    message: asked.last().cloned().expect("a message was typed"),
                    failed: None,
                })
            });
            draft.set(String::new());
            answering.set(Some(String::new()));
            busy.set(true);
            #[cfg(feature = "hydrate")]
            leptos::task::spawn_local(async move {
                let result = stream_chat(body, move |text| answering.set(Some(text))).await;
                let answer = answering.get_untracked().unwrap_or_default();
                answering.set(None);
                turns.update(|t| match result {
                    Ok(()) => t.push(Turn {
                        message: Message {
                            role: "assistant".to_owned(),
                            content: answer,
                        },
                        failed: None,
                    }),
                    Err(e) => {
                        if let Some(asked) = t.last_mut() {
                            asked.failed = Some(e);
                        }
                    }
                });
                busy.set(false);
                // The engine's log lines, read again.
                refresh.update(|n| *n += 1);
            });
            #[cfg(not(feature = "hydrate"))]
            let _ = body;
        }
    };
    let current = model().unwrap_or_default();
    view! {
        <label for="playground-model">"Model"</label>
        <select id="playground-model" on:change=move |ev| {
            chosen.set(Some(event_target_value(&ev)));
            turns.set(Vec::new());
        }>
            {models.iter().map(|m| {
                let selected = *m == current;
                view! { <option value=m.clone() selected=selected>{m.clone()}</option> }
            }).collect_view()}
        </select>
        <section class="panel" aria-labelledby="chat-heading">
            <h2 id="chat-heading">"Chat"</h2>
            <ol class="chat" data-testid="chat" aria-live="polite">
                {move || turns.get().into_iter().map(|Turn { message: m, failed }| {
                    let unanswered = failed.is_some();
                    view! {
                        <li class=format!("said said-{}", m.role) class:unanswered=unanswered>
                            <span class="who">{m.role.clone()}</span>" "<span>{m.content}</span>
                            {failed.map(|e| view! {
                                <p class="error" role="alert" data-testid="chat-error">{format!("Not answered, and not sent again: {e}")}</p>
                            })}
                        </li>
                    }
                }).collect_view()}
                {move || answering.get().map(|text| view! {
                    <li class="said said-assistant" data-testid="answering"><span class="who">"assistant"</span>" "<span>{text}</span></li>
                })}
            </ol>
            <form on:submit=send>
                <label for="playground-message">"Message"</label>
                <textarea id="playground-message" rows="3" class="wide" prop:value=move || draft.get() on:input=move |ev| draft.set(event_target_value(&ev))></textarea>
                <div class="actions">
                    <button type="submit" class="primary" disabled=move || busy.get()>"Send"</button>
                    <button type="button" on:click=move |_| turns.set(Vec::new())>"Start over"</button>
                </div>
            </form>
        </section>
        <section class="panel" aria-labelledby="curl-heading">
            <h2 id="curl-heading">"The request as curl"</h2>
            <pre class="curl" data-testid="curl" tabindex="0">{curl}</pre>
        </section>
        <section class="panel" aria-labelledby="logs-heading">
            <h2 id="logs-heading">{format!("The engine's last {LOG_LINES} log lines")}</h2>
            <Transition fallback=|| view! { <p>"Reading the log…"</p> }>
                {move || logs.get().map(|answer| match answer {
                    Err(e) => view! { <p class="error" role="alert">{e.to_string()}</p> }.into_any(),
                    Ok(p) => view! {
                        {p.engine.map(|engine| view! { <p class="muted" data-testid="log-engine">{format!("From its engine {engine}.")}</p> })}
                        {if p.logs.is_empty() {
                            view! { <p class="empty">"No log lines yet."</p> }.into_any()
                        } else {
                            view! { <pre class="logs" data-testid="engine-logs" tabindex="0">{p.logs.join("\n")}</pre> }.into_any()
                        }}
                    }.into_any(),
                })}
            </Transition>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_of_an_answer_is_its_events_deltas_until_done() {
        let events = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"Hel\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"lo\"}}]}\n\n\
                      data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1}}\n\n\
                      data: [DONE]\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"after\"}}]}\n\n";
        assert_eq!(streamed_text(events), "Hello");
    }

    #[test]
    fn the_curl_line_is_the_chat_request_to_the_gateway_with_quotes_escaped() {
        let body = chat_body(
            "glm-5.3",
            &[Message {
                role: "user".to_owned(),
                content: "it's".to_owned(),
            }],
        );
        assert_eq!(
            body,
            r#"{"model":"glm-5.3","messages":[{"role":"user","content":"it's"}],"stream":true}"#
        );
        let curl = as_curl("http://127.0.0.1:3000", &body);
        assert!(curl.starts_with("curl -N http://127.0.0.1:3000/v1/chat/completions"));
        assert!(curl.contains(r#""content":"it'\''s""#), "{curl}");
    }

    #[test]
    fn a_turn_that_went_unanswered_is_not_sent_again() {
        let said = |role: &str, content: &str| Message {
            role: role.to_owned(),
            content: content.to_owned(),
        };
        let turns = [
            Turn {
                message: said("user", "hello"),
                failed: None,
            },
            Turn {
                message: said("assistant", "hi"),
                failed: None,
            },
            Turn {
                message: said("user", "are you there?"),
                failed: Some("no engine was ready".to_owned()),
            },
        ];
        assert_eq!(
            conversation(&turns, "again?"),
            [
                said("user", "hello"),
                said("assistant", "hi"),
                said("user", "again?")
            ]
        );
        assert_eq!(
            conversation(&turns, "  "),
            [said("user", "hello"), said("assistant", "hi")]
        );
    }

    #[test]
    fn an_error_answer_says_its_message_in_either_shape() {
        assert_eq!(
            error_message(
                404,
                r#"{"error": {"message": "no model named \"x\"", "code": "model_not_found"}}"#
            ),
            "no model named \"x\""
        );
        assert_eq!(
            error_message(403, r#"{"error": "vera is a viewer"}"#),
            "vera is a viewer"
        );
        assert_eq!(error_message(502, "<html>"), "the gateway answered 502");
    }
}
