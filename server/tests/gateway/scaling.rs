//! Replicas that follow traffic, through the real binary: a model deployed with `replicas` on atlas:0 and
//! twin:0 (the demo engine, each answer taking about a second) starts on one of them; a burst of clients
//! adds the other, the end of it removes it again, draining it; where the other has no room the replica
//! waits with why while the first serves; and a model deployed without replicas takes them, and gives them
//! up, while clients ask it.

use super::answers::{chat, machine, on_atlas_and_twin_with};
use super::ask;
use crate::support::{self, wait_until_within, Server};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `model`'s replicas as `GET /api/groups` shows them.
async fn replicas(server: &Server, model: &str) -> Value {
    support::member(server, model).await["replicas"].clone()
}

/// Clients asking `model` one request after another each, until told to stop: each answer's status and
/// the machine that gave it.
struct Clients {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<(u16, String)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Clients {
    fn start(server: &Arc<Server>, model: &'static str, count: usize) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let tasks = (0..count)
            .map(|_| {
                let (server, stop, answers) = (server.clone(), stop.clone(), answers.clone());
                tokio::spawn(async move {
                    // Bounded: a client stops after 60 requests whatever happens.
                    for _ in 0..60 {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let answer = ask(&server, "/v1/chat/completions", chat(model, true)).await;
                        let by = answer
                            .headers
                            .get("x-tessera-engine")
                            .map(|_| machine(&answer))
                            .unwrap_or_else(|| answer.text());
                        answers.lock().unwrap().push((answer.status, by));
                    }
                })
            })
            .collect();
        Clients {
            stop,
            answers,
            tasks,
        }
    }

    /// The machines that answered so far.
    fn machines(&self) -> BTreeSet<String> {
        self.answers
            .lock()
            .unwrap()
            .iter()
            .map(|(_, m)| m.clone())
            .collect()
    }

    /// Stops them; every answer they got.
    async fn stop(self) -> Vec<(u16, String)> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        Arc::try_unwrap(self.answers).unwrap().into_inner().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_clients_grows_a_one_replica_model_onto_another_machine_and_once_it_ends_the_model_shrinks_back_to_its_least_draining_the_replica_with_no_request_failing(
) {
    let dir = tempfile::tempdir().unwrap();
    let scaled = json!({"replicas": {"min": 1, "max": 2, "up_s": 2, "down_s": 4}});
    let server = on_atlas_and_twin_with(dir.path(), &["chat"], scaled, 1, &[]).await;
    let first = replicas(&server, "chat").await;
    assert_eq!(
        (
            first["min"].clone(),
            first["max"].clone(),
            first["running"].clone()
        ),
        (json!(1), json!(2), json!(1)),
        "{first}"
    );
    assert_eq!(
        first["target"], 1,
        "the demo engine names no slots: {first}"
    );

    // Six clients at once on one replica of target 1: after the short window, a second replica.
    let burst = Clients::start(&server, "chat", 6);
    wait_until_within(
        "chat grows to 2 replicas",
        Duration::from_secs(30),
        || async { replicas(&server, "chat").await["running"] == 2 },
    )
    .await;
    wait_until_within("both replicas answer", Duration::from_secs(30), || async {
        burst.machines().len() == 2
    })
    .await;
    let grown = replicas(&server, "chat").await;
    let why = grown["decisions"][0]["why"].as_str().unwrap().to_owned();
    // Six on one replica of target 1: at its first sample (twice what it holds), or after the short window.
    assert!(
        why.contains("requests in flight or waiting on 1 replica of target 1"),
        "{grown}"
    );
    assert_eq!(
        grown["gpus"],
        json!([{"machine": "atlas", "index": 0}, {"machine": "twin", "index": 0}])
    );
    let answers = burst.stop().await;

    // One client goes on, one request at a time: the long window sees at most 1 on 2 replicas of target 1,
    // and one replica drains and stops while that client's requests go on.
    let trickle = Clients::start(&server, "chat", 1);
    wait_until_within(
        "chat shrinks to 1 replica",
        Duration::from_secs(40),
        || async { replicas(&server, "chat").await["running"] == 1 },
    )
    .await;
    wait_until_within(
        "the removed replica's engine stops",
        Duration::from_secs(30),
        || async {
            server
                .engines()
                .await
                .iter()
                .filter(|e| e["model"] == "chat")
                .count()
                == 1
        },
    )
    .await;
    let trickled = trickle.stop().await;
    let failed: Vec<_> = answers
        .iter()
        .chain(&trickled)
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(failed.is_empty(), "{failed:?}");
    let shrunk = replicas(&server, "chat").await;
    assert_eq!(shrunk["decisions"][0]["from"], 2, "{shrunk}");
    assert_eq!(shrunk["decisions"][0]["to"], 1, "{shrunk}");
    assert!(
        shrunk["decisions"][0]["why"]
            .as_str()
            .unwrap()
            .ends_with("on 2 replicas of target 1 for 4 s"),
        "{shrunk}"
    );

    // Each step is in the audit log, by Tessera, and the replica counts are in the metrics.
    let (_, audit) = server.get("/api/audit?action=model.scale").await;
    let steps: Vec<(Value, Value, Value)> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].clone(),
                e["after"]["from"].clone(),
                e["after"]["to"].clone(),
            )
        })
        .collect();
    // The newest two: the step down after the step up (the audit lists the newest first).
    assert_eq!(
        steps[..2],
        [
            (json!("tessera"), json!(2), json!(1)),
            (json!("tessera"), json!(1), json!(2))
        ],
        "{audit}"
    );
    let (_, metrics) = server.get_bytes("/metrics").await;
    let metrics = String::from_utf8(metrics.to_vec()).unwrap();
    assert!(
        metrics.contains("tessera_model_replicas_running{model=\"chat\"} 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("tessera_model_replicas_desired{model=\"chat\"} 1"),
        "{metrics}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_with_a_min_of_0_runs_no_engine_while_idle_its_first_request_starts_one_slow_to_load_and_is_answered_and_after_its_long_window_with_none_it_runs_none_again(
) {
    let dir = tempfile::tempdir().unwrap();
    // An engine that takes 2 s to load: the request waits for it, as for an on-demand model's.
    let scaled = json!({"replicas": {"min": 0, "max": 2, "up_s": 2, "down_s": 2},
                        "env": {"TESSERA_DEMO_TOKEN_MS": "150", "TESSERA_DEMO_START_MS": "2000"}});
    let server = on_atlas_and_twin_with(
        dir.path(),
        &["chat"],
        scaled,
        0,
        &[("TESSERA_GATEWAY_WAIT_S", "8")],
    )
    .await;
    let idle = replicas(&server, "chat").await;
    assert_eq!(
        (idle["min"].clone(), idle["running"].clone()),
        (json!(0), json!(0)),
        "{idle}"
    );
    assert!(server.engines().await.iter().all(|e| e["model"] != "chat"));
    let (_, models) = server.get("/v1/models").await;
    assert!(
        models["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["id"] == "chat"),
        "{models}"
    );

    let answer = ask(&server, "/v1/chat/completions", chat("chat", false)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let started = replicas(&server, "chat").await;
    assert_eq!(started["running"], 1, "{started}");
    assert_eq!(
        started["decisions"][0]["why"], "1 request waiting with no replica running",
        "{started}"
    );

    // No request for the long window: the last replica stops, and the model runs none again.
    wait_until_within(
        "chat runs no replica again",
        Duration::from_secs(30),
        || async {
            replicas(&server, "chat").await["running"] == 0
                && server.engines().await.iter().all(|e| e["model"] != "chat")
        },
    )
    .await;
    let stopped = replicas(&server, "chat").await;
    assert_eq!(
        (
            stopped["decisions"][0]["from"].clone(),
            stopped["decisions"][0]["to"].clone()
        ),
        (json!(1), json!(0)),
        "{stopped}"
    );
    // Where no GPU has the room, a request is answered 503 saying why, once the gateway's wait is out.
    for gpu in ["atlas:0", "twin:0"] {
        let filler = json!({"name": format!("filler-{}", &gpu[..4]), "requested_resources": {"gpu_requests": {
            "count": 1, "ids": [gpu], "shared": true, "memory_gb": 90}}});
        let (status, worker) = server.send("POST", "/api/workers", filler).await;
        assert_eq!(status, 201, "{worker}");
    }
    let refused = ask(&server, "/v1/chat/completions", chat("chat", false)).await;
    assert_eq!(refused.status, 503, "{}", refused.text());
    let why = refused.text();
    assert!(
        why.contains("chat has no replica running and none fits now (GPU 0 of ")
            && why.contains("a replica needs 9.6 GB"),
        "{why}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_finds_no_room_waits_with_why_while_the_model_serves_on_the_replica_it_has()
{
    let dir = tempfile::tempdir().unwrap();
    let scaled = json!({"replicas": {"min": 1, "max": 2, "up_s": 2}});
    let server = on_atlas_and_twin_with(dir.path(), &["chat"], scaled, 1, &[]).await;
    let first = replicas(&server, "chat").await;
    let placed = first["gpus"][0]["machine"].as_str().unwrap().to_owned();
    let other = if placed == "atlas" { "twin" } else { "atlas" };

    // Shared work takes the room the second replica would have had.
    let (_, gpus) = server.get("/api/nodes").await;
    let filler = json!({"name": "filler", "requested_resources": {"gpu_requests": {
        "count": 1, "ids": [format!("{other}:0")], "shared": true, "memory_gb": 90}}});
    let (status, worker) = server.send("POST", "/api/workers", filler).await;
    assert_eq!(status, 201, "{worker} {gpus}");

    let burst = Clients::start(&server, "chat", 4);
    wait_until_within(
        "a replica waits for room",
        Duration::from_secs(30),
        || async { replicas(&server, "chat").await["pending"] == 1 },
    )
    .await;
    let waiting = replicas(&server, "chat").await;
    assert_eq!(
        (waiting["running"].clone(), waiting["desired"].clone()),
        (json!(1), json!(2)),
        "{waiting}"
    );
    let reasons = waiting["pending_reasons"].to_string();
    assert!(
        reasons.contains(&format!("GPU 0 of {other}:"))
            && reasons.contains("a replica needs 9.6 GB"),
        "{waiting}"
    );
    let answers = burst.stop().await;
    assert!(
        answers
            .iter()
            .all(|(status, by)| *status == 200 && *by == format!("{placed}:0")),
        "{answers:?}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_replica_finishes_the_stream_it_has_and_stops_before_an_engine_placed_on_its_gpu_since_starts(
) {
    let dir = tempfile::tempdir().unwrap();
    let scaled = json!({"replicas": {"min": 1, "max": 2, "up_s": 2, "down_s": 2, "target": 2}});
    let server = on_atlas_and_twin_with(dir.path(), &["chat"], scaled, 1, &[]).await;
    let events = server.follow_events().await;
    let burst = Clients::start(&server, "chat", 6);
    wait_until_within(
        "chat serves on 2 replicas",
        Duration::from_secs(30),
        || async {
            let engines = server.engines().await;
            engines
                .iter()
                .filter(|e| e["model"] == "chat" && e["state"] == "healthy")
                .count()
                == 2
        },
    )
    .await;
    burst.stop().await;

    // Two long streams (about 7 s each), one on each replica: two in flight on 2 replicas of target 2
    // is within what one holds, so one replica goes while it still streams.
    let long = "a long question of many words for the demo engine to hear and say back ".repeat(4);
    let streams: Vec<_> = (0..2)
        .map(|_| {
            let (server, long) = (server.clone(), long.clone());
            tokio::spawn(async move {
                let body = json!({"model": "chat", "stream": true,
                                  "messages": [{"role": "user", "content": long}]});
                ask(&server, "/v1/chat/completions", body).await
            })
        })
        .collect();
    wait_until_within(
        "chat shrinks to 1 replica",
        Duration::from_secs(30),
        || async { replicas(&server, "chat").await["running"] == 1 },
    )
    .await;
    let stays = replicas(&server, "chat").await["gpus"][0]["machine"]
        .as_str()
        .unwrap()
        .to_owned();
    let gone = if stays == "atlas" { "twin" } else { "atlas" };
    // Shared work placed on the GPU the removed replica still drains on.
    let demo_engine = format!("{} demo-engine", env!("CARGO_BIN_EXE_tessera"));
    let next = json!({"name": "next", "command": demo_engine, "requested_resources": {
        "gpu_requests": {"count": 1, "ids": [format!("{gone}:0")], "shared": true, "memory_gb": 10}}});
    let (status, worker) = server.send("POST", "/api/workers", next).await;
    assert_eq!(status, 201, "{worker}");

    for stream in streams {
        let answer = stream.await.unwrap();
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(
            answer.text().ends_with("data: [DONE]\n\n"),
            "cut: {}",
            answer.text()
        );
    }
    wait_until_within("next serves", Duration::from_secs(30), || async {
        server
            .engine_if_any("next")
            .await
            .is_some_and(|e| e["state"] == "healthy")
    })
    .await;
    let seen = events.all();
    let at = |what: &dyn Fn(&Value) -> bool| seen.iter().position(what);
    let removed = format!("/chat@{gone}:0");
    let drained = at(&|e| {
        e["kind"] == "engine"
            && e["engine"].as_str().is_some_and(|u| u.ends_with(&removed))
            && e["state"] == "draining"
    });
    let stopped = at(&|e| {
        e["kind"] == "engine"
            && e["engine"].as_str().is_some_and(|u| u.ends_with(&removed))
            && e["state"] == "stopped"
    });
    let started =
        at(&|e| e["kind"] == "engine" && e["engine"] == "next" && e["state"] == "starting");
    assert!(
        drained.is_some() && drained < stopped && stopped < started,
        "draining at {drained:?}, stopped at {stopped:?}, next starting at {started:?}: {seen:#?}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}

/// The revision of the group `model` is a member of, as `GET /api/groups` shows it.
async fn group_revision(server: &Server, model: &str) -> i64 {
    let (_, groups) = server.get("/api/groups").await;
    groups
        .as_array()
        .unwrap()
        .iter()
        .find(|g| {
            g["members"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| m["name"] == model)
        })
        .and_then(|g| g["revision"].as_i64())
        .unwrap_or_else(|| panic!("{model} in {groups}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_takes_replicas_while_clients_ask_it_answers_them_all_from_its_replica_s_gpu_slow_to_load_and_once_it_gives_them_up_from_each_machine_again(
) {
    let dir = tempfile::tempdir().unwrap();
    // Engines that load for 3 s: what asks meanwhile waits for the new ones.
    let slow = json!({"env": {"TESSERA_DEMO_TOKEN_MS": "150", "TESSERA_DEMO_START_MS": "3000"}});
    let server = on_atlas_and_twin_with(dir.path(), &["chat"], slow, 2, &[]).await;
    let clients = Clients::start(&server, "chat", 2);
    let answered_by = |by: Vec<String>| {
        let clients = &clients;
        move || {
            let seen = clients.machines();
            std::future::ready(by.iter().all(|m| seen.contains(m)))
        }
    };
    wait_until_within(
        "both machines' engines answer",
        Duration::from_secs(30),
        answered_by(vec!["atlas".to_owned(), "twin".to_owned()]),
    )
    .await;

    let change = json!({"revision": group_revision(&server, "chat").await,
                        "replicas": {"min": 1, "max": 1}});
    let (status, answer) = server
        .send("PUT", "/api/deployments/chat/replicas", change)
        .await;
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["restarts"], true, "{answer}");
    let replica = format!(
        "{}:0",
        answer["replicas"]["gpus"][0]["machine"].as_str().unwrap()
    );
    wait_until_within(
        "its replica answers",
        Duration::from_secs(60),
        answered_by(vec![replica.clone()]),
    )
    .await;
    let engines = server.wait_healthy(1).await;
    assert!(
        engines[0]["unit"].as_str().unwrap().ends_with(&replica),
        "one engine, its replica's: {engines:?}"
    );

    let back = json!({"revision": group_revision(&server, "chat").await, "replicas": null});
    let (status, answer) = server
        .send("PUT", "/api/deployments/chat/replicas", back)
        .await;
    assert_eq!(status, 200, "{answer}");
    let before = clients.answers.lock().unwrap().len();
    server.wait_healthy(2).await;
    wait_until_within(
        "both machines' engines answer again",
        Duration::from_secs(60),
        || {
            let answers = clients.answers.lock().unwrap();
            let since: BTreeSet<&str> = answers[before..].iter().map(|(_, m)| m.as_str()).collect();
            std::future::ready(since.contains("atlas") && since.contains("twin"))
        },
    )
    .await;
    let answers = clients.stop().await;
    let failed: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    assert!(
        failed.is_empty(),
        "every request answered through both changes: {failed:?}"
    );
    Arc::into_inner(server).unwrap().stop().await;
}
