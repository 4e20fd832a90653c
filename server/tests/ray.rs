//! The real binary over a real Ray cluster of three nodes (`scripts/ray-cluster`): atlas (the head, one
//! 24 GB GPU) and majin (two 24 GB GPUs), both with made-up GPUs (`tessera.demo=true`, so the demo engine
//! runs), and nimbus (one made-up 80 GB GPU labelled as real, where recipes run as they are), inside a
//! network namespace of their own. `scripts/test-ray` brings the cluster up once for the
//! suite, runs these tests inside the namespace, and takes it down; without a cluster they cannot run,
//! so `cargo test` leaves them out.

mod support;

use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{chaos, report, wait_until, Server};
use tokio::sync::RwLock;

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
    // The gateway reaches each engine on its node's address, in turn.
    let mut answered_by = Vec::new();
    for _ in 0..4 {
        let (status, answer) = server
            .send(
                "POST",
                "/v1/chat/completions",
                json!({"model": "glm", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(status, 200, "{answer}");
        let said = answer["choices"][0]["message"]["content"].as_str().unwrap();
        answered_by.push(if said.contains("@atlas") {
            "atlas"
        } else {
            "majin"
        });
    }
    answered_by.sort();
    assert_eq!(answered_by, ["atlas", "atlas", "majin", "majin"]);
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

/// What the cluster's soak counted.
#[derive(Debug, Default, serde::Serialize)]
struct SoakReport {
    seed: u64,
    actions: u64,
    actions_taken: u64,
    faults: Vec<String>,
    requests: u64,
    answered: u64,
    told_to_retry: u64,
    /// For a model the operator had removed (404).
    gone: u64,
    /// Tessera itself did not answer (killed, or starting).
    server_down: u64,
    /// Failed while a node or the cluster was down, or in the moments after: counted apart.
    during_outage: u64,
    lost: u64,
    lost_examples: Vec<String>,
    overfills: u64,
    overfill_examples: Vec<String>,
    converged_ms: Vec<u64>,
    /// How many models were deployed at each convergence.
    deployed: Vec<usize>,
    not_converged: Vec<String>,
    duplicate_jobs: Vec<String>,
    orphan_jobs: Vec<String>,
}

/// Whether every model deployed serves and nothing else runs ([`chaos::settled`]), each engine in one
/// RUNNING job and every RUNNING job an engine's: what disagrees.
async fn cluster_settled(current: &chaos::Current) -> Vec<String> {
    let (_, mut wrong) = chaos::settled(current).await;
    let (_, engines) = chaos::call(current, "GET", "/api/engines", Value::Null).await;
    let engines = engines.as_array().cloned().unwrap_or_default();
    let units: Vec<&str> = engines.iter().filter_map(|e| e["unit"].as_str()).collect();
    let jobs = running_jobs().await;
    for job in &jobs {
        let unit = job["metadata"]["tessera_unit"].as_str().unwrap_or_default();
        if !unit.is_empty() && !units.contains(&unit) {
            wrong.push(format!(
                "job {} runs {unit}, which is no engine",
                job["submission_id"]
            ));
        }
    }
    for unit in &units {
        let n = jobs
            .iter()
            .filter(|j| j["metadata"]["tessera_unit"] == *unit)
            .count();
        if n > 1 {
            wrong.push(format!("{unit} runs as {n} jobs"));
        }
    }
    wrong
}

/// Waits, within `bound`, for [`cluster_settled`]; how long it took, or what still disagrees.
async fn converge(current: &chaos::Current, bound: Duration) -> Result<u64, Vec<String>> {
    let began = Instant::now();
    loop {
        let wrong = cluster_settled(current).await;
        if wrong.is_empty() {
            return Ok(began.elapsed().as_millis() as u64);
        }
        if began.elapsed() > bound {
            return Err(wrong);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn soak_server(data: &std::path::Path, sim: &std::path::Path) -> Server {
    // At speed 20: loads of 1 to 2 s, 50 ms to the first token, 0.5 s holding memory after SIGTERM.
    let profile = json!({"speed": 20, "load_s": [20, 40], "first_token_s": 1, "exit_delay_s": 10});
    chaos::start(data, &["--ray", RAY], sim, &profile).await
}

/// The chaos soak on the cluster (the demo fleet's is tests/soak.rs): its made-up GPUs simulated, so that
/// an overfill is something the simulated driver refuses; clients calling the models through the gateway
/// all along; the operator's random changes; and the cluster's own faults: a node lost and back, and
/// Tessera killed and started while the head is down, then the cluster back. Seeded by `SOAK_SEED`; the
/// operator's spells last `SOAK_SECONDS` (8), and `SOAK_ROUNDS` (1) rounds of it all are run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_soak_on_the_cluster_through_a_lost_node_and_a_start_with_the_head_down_overfills_no_gpu_loses_no_request_and_converges(
) {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let rounds: u32 = std::env::var("SOAK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let quiet = Duration::from_secs(
        std::env::var("SOAK_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(8),
    );
    let dir = tempfile::tempdir().unwrap();
    let (data, sim_dir) = (dir.path().join("data"), dir.path().join("sim"));
    std::fs::create_dir_all(&data).unwrap();
    let current: chaos::Current = Arc::new(RwLock::new(Some(soak_server(&data, &sim_dir).await)));
    {
        let server = current.read().await;
        let server = server.as_ref().unwrap();
        add_engine(server, "glm", "vllm").await;
        add_engine(server, "vision", "sglang").await;
        add_engine(server, "rerank", "vllm").await;
        for (model, gpu, share) in [
            ("glm", "majin:0", 50),
            ("vision", "majin:1", 40),
            ("rerank", "atlas:0", 40),
        ] {
            let (status, body) = server
                .send(
                    "POST",
                    "/api/deployments",
                    json!({"model": model, "gpus": [gpu], "share": share}),
                )
                .await;
            assert_eq!(status, 201, "{body}");
        }
    }
    let report = Arc::new(Mutex::new(SoakReport {
        seed,
        ..SoakReport::default()
    }));
    let converged = converge(&current, Duration::from_secs(90)).await;
    report
        .lock()
        .unwrap()
        .converged_ms
        .extend(converged.clone().ok());
    assert!(converged.is_ok(), "the first deploys: {converged:?}");

    // Clients, one per model, until the end; a request that fails during an outage is counted apart.
    let done = Arc::new(AtomicBool::new(false));
    let outage = Arc::new(Mutex::new(None::<Instant>));
    let clients: Vec<_> = ["glm", "vision", "rerank"]
        .into_iter()
        .enumerate()
        .map(|(i, model)| {
            let (current, done, outage, report) = (
                current.clone(),
                done.clone(),
                outage.clone(),
                report.clone(),
            );
            tokio::spawn(async move {
                let mut rng = chaos::Rng::new(seed * 31 + i as u64);
                while !done.load(Ordering::SeqCst) {
                    let began = Instant::now();
                    let outcome = chaos::ask(&current, model, rng.below(2) == 0).await;
                    // Down now, or came back less than 5 s before this request began.
                    let in_outage = outage
                        .lock()
                        .unwrap()
                        .is_some_and(|ended| ended + Duration::from_secs(5) >= began);
                    {
                        let mut r = report.lock().unwrap();
                        r.requests += 1;
                        match outcome {
                            chaos::Outcome::Answered => r.answered += 1,
                            chaos::Outcome::ToldToRetry => r.told_to_retry += 1,
                            chaos::Outcome::Gone => r.gone += 1,
                            chaos::Outcome::Down => r.server_down += 1,
                            chaos::Outcome::Failed(_) if in_outage => r.during_outage += 1,
                            chaos::Outcome::Failed(why) => {
                                r.lost += 1;
                                if r.lost_examples.len() < 10 {
                                    r.lost_examples.push(why);
                                }
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    // An outage lasts from `down` until `up` and counts 5 s after (the far future while it lasts).
    let down = |outage: &Mutex<Option<Instant>>| {
        *outage.lock().unwrap() = Some(Instant::now() + Duration::from_secs(3600));
    };
    let up = |outage: &Mutex<Option<Instant>>| *outage.lock().unwrap() = Some(Instant::now());

    let mut rng = chaos::Rng::new(seed);
    let models = ["glm", "vision", "rerank"];
    let gpus = ["atlas:0", "majin:0", "majin:1"];
    let operator =
        |current: chaos::Current, report: Arc<Mutex<SoakReport>>, mut rng: chaos::Rng| async move {
            let until = Instant::now() + quiet;
            while Instant::now() < until {
                let (_, taken) = chaos::act(&current, &mut rng, &models, &gpus).await;
                {
                    let mut r = report.lock().unwrap();
                    r.actions += 1;
                    r.actions_taken += u64::from(taken);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            rng
        };
    let settle = |current: chaos::Current, report: Arc<Mutex<SoakReport>>, what: &'static str| async move {
        match converge(&current, Duration::from_secs(120)).await {
            Ok(ms) => {
                let (_, groups) = chaos::call(&current, "GET", "/api/groups", Value::Null).await;
                let deployed = groups
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|g| g["members"].as_array().map_or(0, Vec::len))
                    .sum();
                let mut r = report.lock().unwrap();
                r.converged_ms.push(ms);
                r.deployed.push(deployed);
            }
            Err(wrong) => report
                .lock()
                .unwrap()
                .not_converged
                .push(format!("after {what}: {wrong:?}")),
        }
    };

    // Rounds of: the operator at work, then a node lost while the operator goes on, and back; then
    // Tessera killed and started again while the head is down, and the cluster back.
    for _ in 0..rounds {
        rng = operator(current.clone(), report.clone(), rng).await;
        settle(current.clone(), report.clone(), "the operator's changes").await;
        report
            .lock()
            .unwrap()
            .faults
            .push("majin lost and back".to_owned());
        down(&outage);
        node("stop-node", "worker");
        let revive = Revive::Worker;
        // Ray takes about 15 s to call a node dead, and takes no node in its place until it has.
        support::wait_until_within("majin is unreachable", Duration::from_secs(60), || async {
            let (_, machine) =
                chaos::call(&current, "GET", "/api/machines/majin", Value::Null).await;
            machine["unreachable_since"].is_string()
        })
        .await;
        rng = operator(current.clone(), report.clone(), rng).await;
        drop(revive);
        up(&outage);
        settle(current.clone(), report.clone(), "majin came back").await;

        // Tessera killed, and started again while the head is down; then the cluster back.
        report
            .lock()
            .unwrap()
            .faults
            .push("kill -9 of Tessera, started with the head down".to_owned());
        down(&outage);
        current.write().await.take().unwrap().kill_9().await;
        node("stop-all", "");
        let back = Revive::All;
        let started = soak_server(&data, &sim_dir).await;
        let (status, majin) = started.get("/api/machines/majin").await;
        assert!(
            status == 200 && majin["unreachable_since"].is_string(),
            "Tessera starts, and shows the cluster's machines unreachable while the head is down: {majin}"
        );
        *current.write().await = Some(started);
        drop(back);
        up(&outage);
        settle(current.clone(), report.clone(), "the cluster came back").await;
    }
    let _ = operator(current.clone(), report.clone(), rng).await;
    settle(
        current.clone(),
        report.clone(),
        "the operator's last changes",
    )
    .await;

    done.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let refusals = server::inventory::simulated::SimulatedGpus::open(&sim_dir).refusals();
    let jobs = running_jobs().await;
    let (_, engines) = chaos::call(&current, "GET", "/api/engines", Value::Null).await;
    let mut r = std::mem::take(&mut *report.lock().unwrap());
    r.overfills = refusals.iter().filter(|x| x.overfill()).count() as u64;
    r.overfill_examples = refusals
        .iter()
        .filter(|x| x.overfill())
        .take(10)
        .map(|x| format!("{x:?}"))
        .collect();
    let units: Vec<&str> = engines
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["unit"].as_str())
        .collect();
    for job in &jobs {
        let unit = job["metadata"]["tessera_unit"].as_str().unwrap_or_default();
        if !units.contains(&unit) {
            r.orphan_jobs
                .push(format!("{} ({unit})", job["submission_id"]));
        }
        if jobs
            .iter()
            .filter(|j| j["metadata"]["tessera_unit"] == unit)
            .count()
            > 1
        {
            r.duplicate_jobs.push(unit.to_owned());
        }
    }
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(path, serde_json::to_string_pretty(&r).unwrap()).unwrap();
    }
    assert_eq!(r.overfills, 0, "the simulated driver refused memory Tessera's placement or restart order left no room for: {r:#?}");
    assert_eq!(r.lost, 0, "requests lost: {r:#?}");
    assert!(
        r.not_converged.is_empty(),
        "what should serve did not: {r:#?}"
    );
    assert!(
        r.orphan_jobs.is_empty() && r.duplicate_jobs.is_empty(),
        "{r:#?}"
    );
    assert!(r.answered > 0, "no request was answered: {r:#?}");
    current.write().await.take().unwrap().stop().await;
    clear_jobs().await;
}
