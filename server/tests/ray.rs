//! The real binary over a real Ray cluster of three nodes (`scripts/ray-cluster`): atlas (the head, one
//! 24 GB GPU) and majin (two 24 GB GPUs), both with made-up GPUs (`tessera.demo=true`, so the demo engine
//! runs), and nimbus (one made-up 80 GB GPU labelled as real, where recipes run as they are), inside a
//! network namespace of their own. `scripts/test-ray` brings the cluster up once for the
//! suite, runs these tests inside the namespace, and takes it down; without a cluster they cannot run,
//! so `cargo test` leaves them out.

#[path = "ray/soak.rs"]
mod soak;
mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{chaos, wait_until, Server};

/// The cluster's dashboard, from inside its namespace.
const RAY: &str = "http://127.0.0.1:8265";

/// The tests share one cluster: one at a time.
static CLUSTER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn start(dir: &std::path::Path) -> Server {
    Server::start_with(dir, 200, &["--ray", RAY]).await
}

/// Ray's own word on its jobs.
async fn ray(method: &str, path: &str) -> Value {
    let (status, body) = support::request(8265, method, path, None).await;
    assert_eq!(status, 200, "{method} {path}: {body}");
    body
}

/// The jobs Ray runs now (each test begins with none).
async fn running_jobs() -> Vec<Value> {
    ray("GET", "/api/jobs/")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["status"] == "RUNNING" || j["status"] == "PENDING")
        .cloned()
        .collect()
}

/// Stops every job a test left, so that the next starts on an empty cluster.
async fn clear_jobs() {
    for job in ray("GET", "/api/jobs/").await.as_array().unwrap() {
        let id = job["submission_id"].as_str().unwrap_or_default();
        if job["status"] == "RUNNING" || job["status"] == "PENDING" {
            support::request(8265, "POST", &format!("/api/jobs/{id}/stop"), None).await;
        }
    }
}

async fn add_model(server: &Server) {
    add(server, "glm").await;
}

async fn add(server: &Server, name: &str) {
    add_engine(server, name, "vllm").await;
}

async fn add_engine(server: &Server, name: &str, engine: &str) {
    let (status, body) = server
        .send(
            "POST",
            "/api/models",
            json!({"name": name, "engine": engine, "default_share_percent": 25, "model_path": format!("org/{name}")}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

/// Adds model `name` as a command: nimbus runs recipes as they are, and the demo engine, run as a
/// command, stands in for a real one there.
async fn add_command(server: &Server, name: &str) {
    let (status, body) = server
        .send(
            "POST",
            "/api/models",
            json!({"name": name, "engine": "command", "default_share_percent": 25, "model_path": "",
                   "command": format!("{} demo-engine --", env!("CARGO_BIN_EXE_tessera"))}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

/// A server with glm deployed on half of majin's GPU 0, and its engine once healthy.
async fn glm_on_majin(dir: &std::path::Path) -> (Server, Value) {
    let server = start(dir).await;
    add_model(&server).await;
    let (status, deployed) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "glm", "gpus": ["majin:0"], "share": 50}),
        )
        .await;
    assert_eq!(status, 201, "{deployed}");
    let engine = server.wait_healthy(1).await.remove(0);
    (server, engine)
}

/// What the demo engine of `engine` says of itself, asked with its key: its node's guard lets through
/// nothing else. The key is in its job's metadata, for a server started again to adopt it.
async fn report(engine: &Value) -> Value {
    let port = engine["port"].as_u64().unwrap() as u16;
    let port_text = port.to_string();
    let jobs = running_jobs().await;
    let key = jobs
        .iter()
        .find(|j| {
            j["metadata"]["tessera_unit"] == engine["unit"]
                && j["metadata"]["tessera_port"] == port_text.as_str()
        })
        .and_then(|j| j["metadata"]["tessera_key"].as_str())
        .unwrap_or_else(|| panic!("a node's engine has a key: {jobs:?}"))
        .to_owned();
    let (status, body) = support::request_bytes(port, Some(&key), "GET", "/", None).await;
    assert_eq!(status, 200, "the demo engine on {port} reports");
    serde_json::from_slice(&body).unwrap()
}

/// A chat request for glm through the gateway: its status and answer.
async fn say_hi_to_glm(server: &Server) -> (u16, Value) {
    say_to_glm(server, "hi").await
}

/// Asks glm through the gateway with `prompt`.
async fn say_to_glm(server: &Server, prompt: &str) -> (u16, Value) {
    server
        .send(
            "POST",
            "/v1/chat/completions",
            json!({"model": "glm", "messages": [{"role": "user", "content": prompt}]}),
        )
        .await
}

/// The job of `unit` among `jobs`.
fn job_of<'a>(jobs: &'a [Value], unit: &str) -> &'a Value {
    jobs.iter()
        .find(|j| j["metadata"]["tessera_unit"] == unit)
        .unwrap_or_else(|| panic!("no job for {unit}: {jobs:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn the_machines_and_their_gpus_are_read_from_the_cluster() {
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let (status, machines) = server.get("/api/machines").await;
    assert_eq!(status, 200, "{machines}");
    let gpus = |name: &str| -> Vec<(u64, u64, String)> {
        machines
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no machine {name}: {machines}"))["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                let total_mib = g["total_bytes"].as_u64().unwrap() >> 20;
                let uuid = g["uuid"].as_str().unwrap().to_owned();
                (g["index"].as_u64().unwrap(), total_mib, uuid)
            })
            .collect()
    };
    let uuid = |n: u32| format!("GPU-a1b2c3d4-0000-4000-8000-00000000000{n}");
    let atlas = "GPU-3f6c1a52-8d1e-4b7a-9c2f-1e5d0a7b9c41".to_owned();
    assert_eq!(gpus("atlas"), vec![(0, 24576, atlas)]);
    assert_eq!(
        gpus("majin"),
        vec![(0, 24576, uuid(1)), (1, 24576, uuid(2))]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_model_on_two_machines_runs_as_a_job_on_each_node_with_its_share_booked_on_its_gpu() {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    add_model(&server).await;
    let (status, deployed) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "glm", "gpus": ["atlas:0", "majin:1"], "share": 25}),
        )
        .await;
    assert_eq!(status, 201, "{deployed}");
    let engines = server.wait_healthy(2).await;
    // The gateway reaches each engine on its node's address: prompts that begin differently are spread
    // over both (the same prompt would go to one, for its prompt cache), all sixteen answered.
    let mut answered_by = std::collections::BTreeSet::new();
    for i in 0..16 {
        let (status, answer) = say_to_glm(&server, &format!("{i}: hi")).await;
        assert_eq!(status, 200, "{answer}");
        let said = answer["choices"][0]["message"]["content"].as_str().unwrap();
        answered_by.insert(if said.contains("@atlas") {
            "atlas"
        } else {
            "majin"
        });
    }
    assert_eq!(answered_by, ["atlas", "majin"].into());
    let nodes = ray("GET", "/api/v0/nodes?limit=100&detail=true").await;
    let nodes = nodes["data"]["result"]["result"]
        .as_array()
        .unwrap()
        .clone();
    for engine in &engines {
        let machine = engine["machine"].as_str().unwrap();
        assert_eq!(engine["host"]["kind"], "cluster", "{engine}");
        let reported = report(engine).await;
        let uuid = engine["host"]["uuids"][engine["gpus"][0].to_string()]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            reported["cuda_visible_devices"],
            uuid.as_str(),
            "GPUs are named by UUID on a node"
        );
        assert_eq!(
            reported["env"].get("TESSERA_INSTANCE"),
            None,
            "a job is found by its metadata, never taken for a process of this machine's"
        );
        let jobs = running_jobs().await;
        let job = jobs
            .iter()
            .find(|j| j["metadata"]["tessera_unit"] == engine["unit"])
            .unwrap_or_else(|| panic!("no job for {}: {jobs:?}", engine["unit"]));
        let node = nodes
            .iter()
            .find(|n| n["node_id"] == job["driver_node_id"])
            .unwrap_or_else(|| panic!("the job's node is listed: {job}"));
        assert_eq!(
            node["labels"]["tessera.machine"], machine,
            "the job runs on its machine's node"
        );
        // Its output comes from the Jobs API into the same log view as a local engine's.
        let id = engine["id"].as_str().unwrap();
        let (status, logs) = server.get(&format!("/api/engines/{id}/logs")).await;
        assert_eq!(status, 200, "{logs}");
        assert!(
            logs["lines"]
                .as_array()
                .unwrap()
                .iter()
                .any(|l| l.as_str().unwrap().contains("demo engine")),
            "{logs}"
        );
        // The share is booked on the GPU's resource: Ray itself holds back a job that would overbook it.
        let gpu = engine["gpus"][0].as_u64().unwrap();
        let resource = format!("tessera_gpu_{gpu}_{uuid}");
        let left_mib = 24576 - 24576 / 4;
        let overbooking = format!("overbooking-{machine}");
        let body = json!({
            "submission_id": overbooking, "entrypoint": "sleep 600",
            "entrypoint_resources": {resource: left_mib + 1},
        });
        let (status, answer) = support::request(8265, "POST", "/api/jobs/", Some(body)).await;
        assert_eq!(status, 200, "{answer}");
        tokio::time::sleep(std::time::Duration::from_secs(3)).await;
        let held = ray("GET", &format!("/api/jobs/{overbooking}")).await;
        assert_eq!(held["status"], "PENDING", "{held}");
        support::request(8265, "POST", &format!("/api/jobs/{overbooking}/stop"), None).await;
    }
    server.stop().await;
    wait_until("the jobs end with the server", || async {
        ray("GET", "/api/jobs/")
            .await
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["status"] != "RUNNING" && j["status"] != "PENDING")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn an_engine_on_a_node_takes_no_request_without_its_key_on_any_path_and_the_gateway_s_pass() {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let (server, engine) = glm_on_majin(dir.path()).await;
    let port = engine["port"].as_u64().unwrap() as u16;
    // vLLM's own --api-key guards /v1 alone; these answer anyone who reaches its port.
    for path in [
        "/invocations",
        "/pooling",
        "/score",
        "/rerank",
        "/classify",
        "/tokenize",
        "/v1/chat/completions",
        "/health",
        "/metrics",
    ] {
        for key in [None, Some("not-its-key")] {
            let body = json!({"model": "glm", "messages": [{"role": "user", "content": "hi"}]});
            let (status, answer) =
                support::request_bytes(port, key, "POST", path, Some(body)).await;
            assert_eq!(
                status,
                401,
                "{path} with {key:?}: {}",
                String::from_utf8_lossy(&answer)
            );
        }
    }
    // Its key lets through, to the engine on the node's loopback on a port of its own.
    let reported = report(&engine).await;
    assert_eq!(reported["engine"], engine["unit"], "{reported}");
    let line: Vec<&str> = reported["stands_in_for"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    let after = |flag: &str| line[line.iter().position(|w| *w == flag).unwrap() + 1];
    assert_eq!(after("--host"), "127.0.0.1", "{line:?}");
    assert_ne!(after("--port"), port.to_string(), "{line:?}");
    // The gateway has the key.
    let (status, answer) = say_hi_to_glm(&server).await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn an_engine_killed_on_its_node_is_submitted_again_after_its_backoff() {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let (server, engine) = glm_on_majin(dir.path()).await;
    let first = report(&engine).await["pid"].as_u64().unwrap();
    support::kill(first as u32, "KILL");
    wait_until("the engine runs again in a new job", || async {
        let Some(now) = server.engine_if_any("glm").await else {
            return false;
        };
        now["state"] == "healthy"
            && now["restarts"] == 1
            && report(&now).await["pid"].as_u64() != Some(first)
    })
    .await;
    let message = server.engine("glm").await;
    assert_eq!(message["restarts"], 1, "{message}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn an_engine_s_next_job_is_submitted_only_once_every_earlier_job_of_it_has_ended() {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let (server, engine) = glm_on_majin(dir.path()).await;
    let metadata =
        job_of(&running_jobs().await, engine["unit"].as_str().unwrap())["metadata"].clone();
    // An earlier job of the same engine that has not ended: as one whose stop Ray only queued while its
    // node was dead, and which runs once the node returns.
    let (status, planted) = support::request(
        8265,
        "POST",
        "/api/jobs/",
        Some(json!({
            "entrypoint": "sleep 1000",
            "submission_id": "glm_earlier",
            "metadata": {
                "tessera_instance": metadata["tessera_instance"],
                "tessera_unit": metadata["tessera_unit"],
            },
        })),
    )
    .await;
    assert_eq!(status, 200, "{planted}");
    wait_until("the earlier job runs", || async {
        ray("GET", "/api/jobs/glm_earlier").await["status"] == "RUNNING"
    })
    .await;

    support::kill(
        report(&engine).await["pid"].as_u64().unwrap() as u32,
        "KILL",
    );
    wait_until("the engine runs again in a new job", || async {
        server
            .engine_if_any("glm")
            .await
            .is_some_and(|now| now["state"] == "healthy" && now["restarts"] == 1)
    })
    .await;
    let earlier = ray("GET", "/api/jobs/glm_earlier").await;
    assert_eq!(earlier["status"], "STOPPED", "{earlier}");
    let running = running_jobs().await;
    assert_eq!(running.len(), 1, "{running:?}");
    assert!(
        earlier["end_time"].as_u64().unwrap() <= running[0]["start_time"].as_u64().unwrap(),
        "the earlier job ended before the next began: {earlier} {running:?}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_server_killed_and_started_again_adopts_its_running_jobs_without_a_duplicate() {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    add_model(&server).await;
    let (status, deployed) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "glm", "gpus": ["atlas:0", "majin:0"], "share": 25}),
        )
        .await;
    assert_eq!(status, 201, "{deployed}");
    let engines = server.wait_healthy(2).await;
    let jobs_before: Vec<Value> = running_jobs().await;
    assert_eq!(jobs_before.len(), 2);

    server.kill_9().await;
    let server = start(dir.path()).await;
    let engines_after = server.wait_healthy(2).await;
    let jobs_after = running_jobs().await;
    let ids = |jobs: &[Value]| {
        let mut ids: Vec<String> = jobs
            .iter()
            .map(|j| j["submission_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(
        ids(&jobs_after),
        ids(&jobs_before),
        "the same two jobs, adopted"
    );
    for (before, after) in engines.iter().zip(&engines_after) {
        assert_eq!(report(before).await["pid"], report(after).await["pid"]);
        assert_eq!(after["restarts"], 0);
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_share_change_restarts_the_changed_members_and_a_shrinking_job_ends_before_a_growing_one_starts(
) {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    for name in ["glm", "emb", "tiny"] {
        add(&server, name).await;
    }
    let mut revision = 0;
    for (model, share) in [("glm", 50), ("emb", 30), ("tiny", 10)] {
        let (status, answer) = server
            .send(
                "POST",
                "/api/deployments",
                json!({"model": model, "gpus": ["majin:0"], "share": share, "revision": revision}),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
        revision = answer["revision"].as_i64().unwrap();
    }
    server.wait_healthy(3).await;
    let before = running_jobs().await;
    let group = "glm";

    // glm shrinks to 30 %, emb grows to 50 %: together with glm's old 50 % that would be 110 % of the GPU,
    // which Ray's booking would hold back, so emb's new job may start only once glm's old one has ended.
    let (status, change) = server
        .send(
            "PUT",
            &format!("/api/groups/{group}/plan"),
            json!({"revision": revision, "shares": {"glm": 30, "emb": 50, "tiny": 10}}),
        )
        .await;
    assert_eq!(status, 200, "{change}");
    wait_until("the plan change is carried out", || async {
        let (_, group) = server.get(&format!("/api/groups/{group}")).await;
        group["progress"]["revision"] == change["revision"]
            && group["progress"]["steps"]
                .as_array()
                .is_some_and(|steps| steps.iter().all(|s| s["status"] == "done"))
    })
    .await;
    server.wait_healthy(3).await;
    let after = running_jobs().await;
    let unit = |model: &str| format!("group:{group}/{model}@majin");
    let id = |jobs: &[Value], model: &str| job_of(jobs, &unit(model))["submission_id"].clone();
    assert_eq!(id(&before, "tiny"), id(&after, "tiny"), "tiny kept its job");
    assert_ne!(id(&before, "glm"), id(&after, "glm"));
    assert_ne!(id(&before, "emb"), id(&after, "emb"));
    let old_glm = ray(
        "GET",
        &format!("/api/jobs/{}", id(&before, "glm").as_str().unwrap()),
    )
    .await;
    let new_emb = job_of(&after, &unit("emb"));
    assert!(
        old_glm["end_time"].as_u64().unwrap() <= new_emb["start_time"].as_u64().unwrap(),
        "glm's old job ended before emb's new one started: {old_glm} {new_emb}"
    );
    assert_eq!(
        new_emb["runtime_env"]["env_vars"]["TESSERA_GPU_MEMORY_GB"],
        "12"
    );
    server.stop().await;
}

/// Starts the worker node again when dropped (or, made by [`Revive::all`], every node): the suite's
/// other tests need them, whatever became of this one.
enum Revive {
    Worker,
    All,
}

impl Drop for Revive {
    fn drop(&mut self) {
        match self {
            Revive::Worker => node("start-node", "worker"),
            Revive::All => node("start-all", ""),
        }
    }
}

/// Runs `scripts/ray-cluster ACTION NETNS NODE` on the suite's cluster (`scripts/test-ray` names it).
fn node(action: &str, which: &str) {
    let netns =
        std::env::var("TESSERA_RAY_NETNS").expect("scripts/test-ray sets TESSERA_RAY_NETNS");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/ray-cluster");
    let status = std::process::Command::new(script)
        .arg(action)
        .arg(&netns)
        .args(Some(which).filter(|w| !w.is_empty()))
        .status()
        .unwrap();
    assert!(status.success(), "ray-cluster {action} {which}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_machine_whose_node_dies_is_unreachable_its_work_waits_and_it_is_reconciled_when_it_returns(
) {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let (status, worker) = server
        .send(
            "POST",
            "/api/workers",
            json!({
                "name": "listen",
                "requested_resources": {"gpu_requests": {
                    "count": 1, "shared": true, "memory_gb": 2,
                    "ids": ["GPU-a1b2c3d4-0000-4000-8000-000000000001"]
                }}
            }),
        )
        .await;
    assert_eq!(status, 201, "{worker}");
    server.wait_healthy(1).await;
    assert_eq!(server.engine("listen").await["machine"], "majin");

    node("stop-node", "worker");
    let revive = Revive::Worker;
    // Ray takes about 15 s to call a node dead.
    support::wait_until_within(
        "majin is unreachable",
        std::time::Duration::from_secs(60),
        || async {
            let (_, machine) = server.get("/api/machines/majin").await;
            machine["unreachable_since"].is_string()
        },
    )
    .await;
    let (_, machine) = server.get("/api/machines/majin").await;
    assert_eq!(
        machine["gpus"],
        json!([]),
        "its GPUs are out of the inventory"
    );
    let (_, worker) = server.get("/api/workers/listen").await;
    assert!(
        worker["not_held"].is_string(),
        "the worker waits, with why: {worker}"
    );
    support::wait_until("its engine is not run", || async {
        server.engine_if_any("listen").await.is_none()
    })
    .await;

    drop(revive);
    support::wait_until_within(
        "majin is back",
        std::time::Duration::from_secs(60),
        || async {
            let (_, machine) = server.get("/api/machines/majin").await;
            machine["unreachable_since"].is_null()
                && machine["gpus"].as_array().is_some_and(|g| g.len() == 2)
        },
    )
    .await;
    server.wait_healthy(1).await;
    let (_, worker) = server.get("/api/workers/listen").await;
    assert!(worker["not_held"].is_null(), "{worker}");
    assert_eq!(running_jobs().await.len(), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn an_engine_s_job_on_a_node_with_real_gpus_reports_its_processes_in_its_log_which_its_log_view_leaves_out(
) {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    add_command(&server, "emb").await;
    let (status, answer) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "emb", "gpus": ["nimbus:0"], "share": 25}),
        )
        .await;
    assert_eq!(status, 201, "{answer}");
    let engine = server.wait_healthy(1).await.remove(0);
    let pid = report(&engine).await["pid"].as_u64().unwrap().to_string();
    let jobs = running_jobs().await;
    let id = job_of(&jobs, engine["unit"].as_str().unwrap())["submission_id"]
        .as_str()
        .unwrap();
    wait_until("the job reports the engine's process", || async {
        ray("GET", &format!("/api/jobs/{id}/logs")).await["logs"]
            .as_str()
            .unwrap()
            .lines()
            .any(|l| {
                l.strip_prefix("tessera-pids:")
                    .is_some_and(|pids| pids.split_whitespace().any(|p| p == pid))
            })
    })
    .await;
    // Tessera reads the report from the end of the log, through Ray's state API.
    let (status, tail) = support::request_bytes(
        8265,
        None,
        "GET",
        &format!(
            "/api/v0/logs/file?node_id={}&submission_id={id}&lines=1000",
            ray("GET", &format!("/api/jobs/{id}")).await["driver_node_id"]
                .as_str()
                .unwrap()
        ),
        None,
    )
    .await;
    let tail = String::from_utf8_lossy(&tail);
    assert_eq!(status, 200, "{tail}");
    assert!(
        tail.lines()
            .any(|l| l.starts_with("tessera-pids:") && l.contains(&pid)),
        "{tail}"
    );
    let (status, logs) = server
        .get(&format!(
            "/api/engines/{}/logs",
            engine["id"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 200, "{logs}");
    let lines = logs["lines"].as_array().unwrap();
    assert!(
        lines
            .iter()
            .any(|l| l.as_str().unwrap().contains("demo engine"))
            && !lines
                .iter()
                .any(|l| l.as_str().unwrap().starts_with("tessera-pids:")),
        "{logs}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_model_s_file_on_a_node_is_read_there_by_a_job_for_its_estimate_and_its_llama_cpp_engine_s_context(
) {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    // The nodes run on this host: the file is where each node would find its own copy.
    let model = dir.path().join("tiny.gguf");
    let mut bytes = placement::estimate::writer::llama(2, 64, 128, 4, 2, 300, 0).header();
    bytes.resize(bytes.len() + 200_000, 0xAB);
    std::fs::write(&model, &bytes).unwrap();
    let server = start(dir.path()).await;
    for (name, path) in [
        ("tiny", model.display().to_string()),
        ("gone", dir.path().join("gone.gguf").display().to_string()),
    ] {
        let (status, body) = server
            .send(
                "POST",
                "/api/models",
                json!({"name": name, "engine": "llamacpp", "default_share_percent": 25, "model_path": path}),
            )
            .await;
        assert_eq!(status, 201, "{body}");
    }
    let (status, here) = server.get("/api/models/tiny/estimate").await;
    assert_eq!(status, 200, "{here}");
    let (status, there) = server.get("/api/models/tiny/estimate?machine=nimbus").await;
    assert_eq!(status, 200, "{there}");
    assert_eq!(there, here);
    let (status, gone) = server.get("/api/models/gone/estimate?machine=nimbus").await;
    assert_eq!(status, 422, "{gone}");
    assert!(
        gone["error"]
            .as_str()
            .unwrap()
            .ends_with("gone.gguf does not exist on the Ray node nimbus"),
        "{gone}"
    );

    // Its engine on nimbus is started with the context its share holds, by the header read there. (No
    // llama-server runs on the test nodes: the job that would run it fails, and the command line stays.)
    let (status, body) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "tiny", "gpus": ["nimbus:0"], "share": 25}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let sized = Mutex::new(None);
    wait_until("the engine is sized", || async {
        let (_, engines) = server.get("/api/engines").await;
        let engine = engines
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["sizing"].is_string())
            .cloned();
        let found = engine.is_some();
        *sized.lock().unwrap() = engine;
        found
    })
    .await;
    let engine = sized.into_inner().unwrap().unwrap();
    let sizing = engine["sizing"].as_str().unwrap();
    assert!(
        sizing.starts_with("context 4096 (the model's own)"),
        "{engine}"
    );
    let command: Vec<&str> = engine["command"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(command.join(" ").contains(" -c 4096 -np 1"), "{command:?}");
    // The reading jobs were deleted once read.
    let jobs = ray("GET", "/api/jobs/").await;
    assert!(
        !jobs
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["metadata"]["tessera_files"].is_string()),
        "{jobs}"
    );
    server.stop().await;
    clear_jobs().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_node_s_gpu_under_mps_gets_its_daemon_before_its_first_client_and_a_job_that_stops_it_after_its_last(
) {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let dir = tempfile::tempdir().unwrap();
    // NVIDIA's control program's stand-in: nimbus's GPU is made up.
    let control = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/support/mps-control");
    let node_dir = dir.path().join("node");
    let uuid = "GPU-5e1d0c2b-7a3f-4e6d-8b9c-0a1b2c3d4e5f";
    let args = [
        "--ray",
        RAY,
        "--mps-control",
        control,
        "--node-data-dir",
        node_dir.to_str().unwrap(),
    ];
    let server = Server::start_with(dir.path(), 200, &args).await;
    for name in ["emb", "rerank"] {
        add_command(&server, name).await;
    }
    let (status, body) = server
        .send(
            "PUT",
            "/api/machines/nimbus/gpus/0/sharing",
            json!({"mode": "mps", "compute_percent": 40}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    let mut revision = 0;
    for (model, share) in [("emb", 25), ("rerank", 10)] {
        let (status, answer) = server
            .send(
                "POST",
                "/api/deployments",
                json!({"model": model, "gpus": ["nimbus:0"], "share": share, "revision": revision}),
            )
            .await;
        assert_eq!(status, 201, "{answer}");
        revision = answer["revision"].as_i64().unwrap();
    }
    server.wait_healthy(2).await;

    let log = node_dir.join("mps/nimbus-0/log");
    let calls = || std::fs::read_to_string(log.join("calls")).unwrap_or_default();
    assert_eq!(
        calls(),
        format!("start {uuid}\n"),
        "one daemon, started once"
    );
    let emb = report(&server.engine("emb").await).await;
    assert_eq!(
        emb["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=20389M",
        "its 25 % of the GPU's 81559 MiB is its limit: {emb}"
    );
    assert_eq!(emb["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "40");
    assert_eq!(emb["env"]["CUDA_VISIBLE_DEVICES"], "0");
    assert_eq!(
        emb["env"]["CUDA_MPS_PIPE_DIRECTORY"],
        node_dir.join("mps/nimbus-0/pipe").display().to_string()
    );

    // A server killed and started again adopts the clients, and their daemon with them.
    let jobs: Vec<Value> = running_jobs().await;
    server.kill_9().await;
    let server = Server::start_with(dir.path(), 200, &args).await;
    server.wait_healthy(2).await;
    assert_eq!(running_jobs().await, jobs, "the same jobs run on");

    // One client left: the daemon stays; none: a job on nimbus tells it to quit.
    let remove = |model: &'static str, revision: i64| {
        let server = &server;
        async move {
            let (status, removed) = server
                .send(
                    "DELETE",
                    &format!("/api/deployments/{model}?revision={revision}"),
                    json!({}),
                )
                .await;
            assert_eq!(status, 200, "{removed}");
            removed["revision"].as_i64().unwrap()
        }
    };
    let revision = remove("emb", revision).await;
    support::wait_until("emb is stopped", || async {
        server.engine_if_any("emb").await.is_none()
    })
    .await;
    assert_eq!(calls(), format!("start {uuid}\n"));
    remove("rerank", revision).await;
    support::wait_until("the daemon is told to quit", || async {
        calls().ends_with("quit\n")
    })
    .await;
    assert_eq!(calls(), format!("start {uuid}\nquit\n"));
    support::wait_until("the quit job is deleted once it succeeded", || async {
        ray("GET", "/api/jobs/")
            .await
            .as_array()
            .unwrap()
            .iter()
            .all(|job| job["metadata"]["tessera_mps_quit"].is_null())
    })
    .await;
    server.stop().await;
}
