//! The real binary over a real Ray cluster of two nodes (`scripts/ray-cluster`): atlas (the head, one
//! 80 GB GPU) and majin (two 24 GB GPUs), both with made-up GPUs (`tessera.demo=true`, so the demo engine
//! runs), inside a network namespace of their own. `scripts/test-ray` brings the cluster up once for the
//! suite, runs these tests inside the namespace, and takes it down; without a cluster they cannot run,
//! so `cargo test` leaves them out.

mod support;

use serde_json::{json, Value};
use support::{report, wait_until, Server};

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

/// The jobs Ray runs now for the server whose instance token is `instance`.
async fn running_jobs(instance: &str) -> Vec<Value> {
    ray("GET", "/api/jobs/")
        .await
        .as_array()
        .unwrap()
        .iter()
        .filter(|j| j["metadata"]["tessera_instance"] == instance)
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
    let (status, body) = server
        .send(
            "POST",
            "/api/models",
            json!({"name": "glm", "engine": "vllm", "default_share_percent": 25, "model_path": "zai-org/GLM"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn the_machines_and_their_gpus_are_read_from_the_cluster() {
    let _one = CLUSTER.lock().await;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path()).await;
    let (status, machines) = server.get("/api/machines").await;
    assert_eq!(status, 200, "{machines}");
    let gpus = |name: &str| -> Vec<(u64, u64)> {
        machines
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == name)
            .unwrap_or_else(|| panic!("no machine {name}: {machines}"))["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| (g["index"].as_u64().unwrap(), g["total"].as_u64().unwrap() >> 20))
            .collect()
    };
    assert_eq!(gpus("atlas"), vec![(0, 81920)]);
    assert_eq!(gpus("majin"), vec![(0, 24576), (1, 24576)]);
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
    let nodes = ray("GET", "/api/v0/nodes?limit=100&detail=true").await;
    let nodes = nodes["data"]["result"]["result"].as_array().unwrap().clone();
    for engine in &engines {
        let machine = engine["machine"].as_str().unwrap();
        assert_eq!(engine["host"]["kind"], "cluster", "{engine}");
        let reported = report(engine).await;
        let uuid = engine["host"]["uuids"][engine["gpus"][0].to_string()]
            .as_str()
            .unwrap()
            .to_owned();
        assert_eq!(reported["cuda_visible_devices"], uuid.as_str(), "GPUs are named by UUID on a node");
        let instance = reported["env"]["TESSERA_INSTANCE"].as_str().unwrap();
        let jobs = running_jobs(instance).await;
        let job = jobs
            .iter()
            .find(|j| j["metadata"]["tessera_unit"] == engine["unit"])
            .unwrap_or_else(|| panic!("no job for {}: {jobs:?}", engine["unit"]));
        let node = nodes
            .iter()
            .find(|n| n["node_id"] == job["driver_node_id"])
            .unwrap_or_else(|| panic!("the job's node is listed: {job}"));
        assert_eq!(node["labels"]["tessera.machine"], machine, "the job runs on its machine's node");
        let gpu = engine["gpus"][0].as_u64().unwrap();
        let total_mib = if machine == "atlas" { 81920 } else { 24576 };
        let resource = format!("tessera_gpu_{gpu}_{uuid}");
        assert_eq!(
            job["entrypoint_resources"][&resource].as_f64(),
            Some((total_mib / 4) as f64),
            "a quarter of the GPU is booked in Ray: {job}"
        );
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
    let server = start(dir.path()).await;
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
    let first = report(&engine).await["pid"].as_u64().unwrap();
    support::kill(first as u32, "KILL");
    wait_until("the engine runs again in a new job", || async {
        let Some(now) = server.engine_if_any(&engine["unit"].as_str().unwrap().to_owned()).await
        else {
            return false;
        };
        now["state"] == "healthy"
            && now["restarts"] == 1
            && report(&now).await["pid"].as_u64() != Some(first)
    })
    .await;
    let message = server.engine(engine["unit"].as_str().unwrap()).await;
    assert_eq!(message["restarts"], 1, "{message}");
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
    let instance = report(&engines[0]).await["env"]["TESSERA_INSTANCE"]
        .as_str()
        .unwrap()
        .to_owned();
    let jobs_before: Vec<Value> = running_jobs(&instance).await;
    assert_eq!(jobs_before.len(), 2);

    server.kill_9().await;
    let server = start(dir.path()).await;
    let engines_after = server.wait_healthy(2).await;
    let jobs_after = running_jobs(&instance).await;
    let ids = |jobs: &[Value]| {
        let mut ids: Vec<String> = jobs
            .iter()
            .map(|j| j["submission_id"].as_str().unwrap().to_owned())
            .collect();
        ids.sort();
        ids
    };
    assert_eq!(ids(&jobs_after), ids(&jobs_before), "the same two jobs, adopted");
    for (before, after) in engines.iter().zip(&engines_after) {
        assert_eq!(report(before).await["pid"], report(after).await["pid"]);
        assert_eq!(after["restarts"], 0);
    }
    server.stop().await;
}
