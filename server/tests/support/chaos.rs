//! What the chaos soaks share (tests/soak.rs on the demo fleet, the cluster's in tests/ray.rs): a seeded
//! generator, the server under soak (replaced when a soak kills it), and a client's request through the
//! gateway with how it ended.

use super::Server;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use tokio::sync::RwLock;

/// Tessera on `data` with the fleet `fleet` gives (`--demo`, or `--ray` and its address) and more of its
/// own flags, its GPUs simulated in `sim`, its demo engines behaving as `profile` says, and the timings
/// the soaks compress: drains of 3 s, a gateway that waits 10 s, and room for many restarts.
pub async fn start(data: &Path, fleet: &[&str], sim: &Path, profile: &Value) -> Server {
    let program = Path::new(env!("CARGO_BIN_EXE_tessera"));
    Server::start_as(launch(program, data, fleet, sim, profile)).await
}

/// How [`start`] starts `program`.
pub fn launch(
    program: &Path,
    data: &Path,
    fleet: &[&str],
    sim: &Path,
    profile: &Value,
) -> super::Launch {
    let sim = sim.display().to_string();
    let mut args = fleet.to_vec();
    args.extend([
        "--simulate-gpus",
        &sim,
        "--drain-grace-s",
        "3",
        "--gateway-wait-s",
        "10",
        "--max-restarts",
        "50",
    ]);
    Server::launch(
        program,
        data,
        0,
        &args,
        &[("TESSERA_DEMO_PROFILE", &profile.to_string())],
    )
}

/// A small seeded generator (xorshift64*): the same seed replays the same choices.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// The server under soak, replaced when the soak restarts or kills it, and where it is reached: its socket,
/// held across its restarts as systemd's `tessera.socket` holds it, and an admin's token.
pub struct Soaked {
    /// The server now; none while the soak has stopped it.
    pub server: RwLock<Option<Server>>,
    port: u16,
    token: String,
}

/// The server under soak, shared by the soak's clients.
pub type Current = Arc<Soaked>;

/// `server` under soak.
pub fn current(server: Server) -> Current {
    Arc::new(Soaked {
        port: server.port,
        token: server.token.clone(),
        server: RwLock::new(Some(server)),
    })
}

/// The port and token of the server: a request made while it restarts waits for the next one.
pub async fn address(current: &Current) -> Option<(u16, String)> {
    Some((current.port, current.token.clone()))
}

pub async fn call(current: &Current, method: &str, path: &str, body: Value) -> (u16, Value) {
    let Some((port, token)) = address(current).await else {
        return (0, Value::Null);
    };
    let (status, _, bytes) =
        super::request_full(port, Some(&token), method, path, Some(body)).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// One client's request to `model`, streamed or not: how it ended.
pub enum Outcome {
    Answered,
    ToldToRetry,
    Gone,
    Failed(String),
    Down,
}

pub async fn ask(current: &Current, model: &str, stream: bool) -> Outcome {
    let Some((port, token)) = address(current).await else {
        return Outcome::Down;
    };
    let Some(mut sender) = super::connect(port).await else {
        return Outcome::Down;
    };
    let body = json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "how are you today"}]});
    let request = hyper::Request::post("/v1/chat/completions")
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let Ok(answer) = sender.send_request(request).await else {
        return Outcome::Down;
    };
    let status = answer.status().as_u16();
    let retry_after = answer
        .headers()
        .get(hyper::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    let body = match answer.into_body().collect().await {
        Ok(body) => String::from_utf8_lossy(&body.to_bytes()).into_owned(),
        Err(e) => return Outcome::Failed(format!("{model}: the answer was cut: {e}")),
    };
    match status {
        200 if !stream && body.contains("\"choices\"") => Outcome::Answered,
        200 if stream && body.trim_end().ends_with("data: [DONE]") => Outcome::Answered,
        200 => Outcome::Failed(format!("{model}: an answer cut short: …{}", tail(&body))),
        404 if body.contains("model_not_found") => Outcome::Gone,
        503 if retry_after.is_some_and(|s| (1..=120).contains(&s)) => Outcome::ToldToRetry,
        _ => Outcome::Failed(format!("{model}: {status} {}", tail(&body))),
    }
}

pub fn tail(text: &str) -> String {
    let cut = text.len().saturating_sub(160);
    text[text.floor_char_boundary(cut)..].to_owned()
}

/// A group as the soak changes it.
pub struct Group {
    name: String,
    revision: i64,
    members: Vec<String>,
    gpus: Vec<String>,
}

/// The group holding `model`, if it is deployed.
pub async fn group_of(current: &Current, model: &str) -> Option<Group> {
    let (_, groups) = call(current, "GET", "/api/groups", Value::Null).await;
    groups.as_array()?.iter().find_map(|g| {
        let names = |key: &str, field: Option<&str>| -> Vec<String> {
            g[key]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| field.map_or(v, |f| &v[f]).as_str().map(str::to_owned))
                .collect()
        };
        let members = names("members", Some("name"));
        members.iter().any(|m| m == model).then(|| Group {
            name: g["name"].as_str().unwrap_or_default().to_owned(),
            revision: g["revision"].as_i64().unwrap_or_default(),
            gpus: names("gpus", None),
            members,
        })
    })
}

/// The revision of the group on `gpu`, where there is one: a deploy there joins it.
pub async fn revision_on(current: &Current, gpu: &str) -> Option<i64> {
    let (_, groups) = call(current, "GET", "/api/groups", Value::Null).await;
    groups
        .as_array()?
        .iter()
        .find(|g| {
            g["gpus"]
                .as_array()
                .is_some_and(|gs| gs.iter().any(|x| x == gpu))
        })
        .and_then(|g| g["revision"].as_i64())
}

/// vLLM's sleep mode, which the demo engine serves whatever it stands in for.
const SLEEP_MODE: &str = "--enable-sleep-mode";

/// Whether `model`, deployed on demand, sleeps past its keep-alive rather than unloading: two of the
/// demo models do, the others do not.
fn sleeps(model: &str) -> bool {
    matches!(model, "glm-5.3" | "vision")
}

/// One of the operator's random changes to `models` on `gpus`; whether the server took it.
pub async fn act(
    current: &Current,
    rng: &mut Rng,
    models: &[&str],
    gpus: &[&str],
) -> (&'static str, bool) {
    let model = *rng.pick(models);
    let deployed = group_of(current, model).await;
    let taken = |status: u16| (200..300).contains(&status);
    let Some(group) = deployed else {
        let gpu = *rng.pick(gpus);
        let revision = revision_on(current, gpu).await;
        let share = 10 + rng.below(35);
        return if rng.below(3) == 0 {
            let mut body = json!({"model": model, "gpus": [gpu], "share": share, "revision": revision,
                              "demand": {"mode": "on_demand", "keep_alive": 10}});
            let sleeps = sleeps(model);
            if sleeps {
                body["args"] = json!([SLEEP_MODE]);
            }
            let status = call(current, "POST", "/api/deployments", body).await.0;
            let what = if sleeps {
                "deploy on demand, sleeping"
            } else {
                "deploy on demand"
            };
            (what, taken(status))
        } else {
            let body = json!({"model": model, "gpus": [gpu], "share": share, "revision": revision});
            let status = call(current, "POST", "/api/deployments", body).await.0;
            ("deploy", taken(status))
        };
    };
    let revision = group.revision;
    match rng.below(7) {
        0 => {
            let path = format!("/api/deployments/{model}?revision={revision}");
            let status = call(current, "DELETE", &path, Value::Null).await.0;
            ("remove", taken(status))
        }
        1 => {
            let status = call(current, "POST", "/api/repack", json!({})).await.0;
            ("repack", taken(status))
        }
        2 => {
            // Its answers' pace changes: it restarts alone.
            let pace = (10 + rng.below(40)).to_string();
            let mut body = json!({"revision": revision, "env": {"TESSERA_DEMO_TOKEN_MS": pace}});
            if sleeps(model) {
                body["args"] = json!([SLEEP_MODE]);
            }
            let path = format!("/api/deployments/{model}/serving");
            (
                "serving change",
                taken(call(current, "PUT", &path, body).await.0),
            )
        }
        3 => {
            // Its GPU switches between time-slicing and MPS: every sharer restarts.
            let Some((machine, index)) = group.gpus.first().and_then(|g| g.split_once(':')) else {
                return ("sharing switch", false);
            };
            let body = if rng.below(2) == 0 {
                json!({"mode": "mps", "compute_percent": 50})
            } else {
                json!({"mode": "time-slicing"})
            };
            let path = format!("/api/machines/{machine}/gpus/{index}/sharing");
            (
                "sharing switch",
                taken(call(current, "PUT", &path, body).await.0),
            )
        }
        _ => {
            let shares: BTreeMap<&String, u64> = group
                .members
                .iter()
                .map(|m| (m, 5 + rng.below(30)))
                .collect();
            let body = json!({"revision": revision, "shares": shares});
            let path = format!("/api/groups/{}/plan", group.name);
            (
                "plan change",
                taken(call(current, "PUT", &path, body).await.0),
            )
        }
    }
}

/// Whether every model deployed serves (an on-demand one not loaded counts), and what disagrees.
pub async fn settled(current: &Current) -> (bool, Vec<String>) {
    let (_, groups) = call(current, "GET", "/api/groups", Value::Null).await;
    let (_, engines) = call(current, "GET", "/api/engines", Value::Null).await;
    let (Some(groups), Some(engines)) = (groups.as_array(), engines.as_array()) else {
        return (false, vec!["the server does not answer".into()]);
    };
    let mut wrong = Vec::new();
    let mut wanted = BTreeSet::new();
    for group in groups {
        for member in group["members"].as_array().into_iter().flatten() {
            let name = member["name"].as_str().unwrap_or_default();
            let on_demand = &member["on_demand"];
            if on_demand.is_object() && on_demand["state"] == "not_loaded" {
                continue;
            }
            wanted.insert(name.to_owned());
            // Asleep, its engine runs and serves no request until one wakes it.
            if on_demand.is_object() && on_demand["state"] == "asleep" {
                continue;
            }
            let serving = engines
                .iter()
                .any(|e| e["model"] == name && e["state"] == "healthy");
            if !serving {
                let how: Vec<String> = engines
                    .iter()
                    .filter(|e| e["model"] == name)
                    .map(|e| format!("{} {}: {}", e["unit"], e["state"], e["message"]))
                    .collect();
                wrong.push(format!(
                    "{name} is deployed but has no healthy engine (its member: {member}; its group's GPUs: {}; its engines: {how:?})",
                    group["gpus"]
                ));
            }
        }
    }
    for engine in engines {
        let model = engine["model"].as_str().unwrap_or_default();
        if !wanted.contains(model) {
            wrong.push(format!(
                "{} runs, and no committed plan wants it",
                engine["unit"]
            ));
        }
    }
    (wrong.is_empty(), wrong)
}
