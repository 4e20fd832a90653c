//! The real binary over a stand-in for Ray's HTTP API, for what the Ray suite's nodes cannot show: their
//! dashboard agents read no GPUs (there are none), so their readings carry no processes. The stand-in
//! answers as Ray 2.60 does: one node, majin, with one real-labelled 140 GiB GPU whose agent reads a
//! process on it; the jobs Tessera submits, kept as running; each job's log with its reporter's line.

mod support;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};
use support::{wait_until, Server};

/// What the stand-in holds: the jobs submitted, and the node's GPU memory in use by its one process; and
/// how it behaves: its node dead, new jobs held PENDING with Ray's reason, something answering `/health`
/// at each new job's port (whether or not the job runs).
#[derive(Clone, Default)]
struct Cluster {
    jobs: Arc<Mutex<Vec<Value>>>,
    used_mib: Arc<Mutex<u64>>,
    dead: Arc<Mutex<bool>>,
    pending: Arc<Mutex<Option<String>>>,
    answer_health: Arc<Mutex<bool>>,
}

/// Answers on 127.0.0.1:`port` as an engine given `key` would: `GET /health` to anyone, a chat only with
/// the key.
fn answer_health(port: u16, key: Option<String>) {
    tokio::spawn(async move {
        let Ok(listener) = tokio::net::TcpListener::bind(("127.0.0.1", port)).await else {
            return;
        };
        let chat = move |headers: axum::http::HeaderMap| async move {
            let given = headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            if key.is_some() && given != key.map(|k| format!("Bearer {k}")) {
                return (
                    axum::http::StatusCode::UNAUTHORIZED,
                    Json(json!({"error": "no key"})),
                );
            }
            (
                axum::http::StatusCode::OK,
                Json(json!({"choices": [{"message": {"content": "hi"}}]})),
            )
        };
        let app = Router::new()
            .route("/health", get(|| async { "ok" }))
            .route("/v1/chat/completions", post(chat));
        let _ = axum::serve(listener, app).await;
    });
}

/// The PID the node's agent reads on the GPU, and that the engine's job reports as its own.
const ENGINE_PID: u32 = 4242;

fn stand_in(cluster: Cluster) -> Router {
    stand_in_for(cluster, "majin")
}

/// The stand-in, its one node labelled as `machine`.
fn stand_in_for(cluster: Cluster, machine: &'static str) -> Router {
    Router::new()
        .route(
            "/api/v0/nodes",
            get(move |State(c): State<Cluster>| async move {
                let state = if *c.dead.lock().unwrap() { "DEAD" } else { "ALIVE" };
                Json(json!({"data": {"result": {"result": [{
                    "node_id": "n1", "node_ip": "127.0.0.1", "state": state,
                    "labels": {"tessera.machine": machine, "tessera.gpu-model": "NVIDIA-H200"},
                    "resources_total": {"CPU": 16.0, "memory": 8e9, "tessera_gpu_0_GPU-aaaa": 143771.0}
                }]}}}))
            }),
        )
        .route(
            "/nodes/{id}",
            get(|State(c): State<Cluster>| async move {
                let used = *c.used_mib.lock().unwrap();
                Json(json!({"data": {"detail": {"gpus": [{
                    "index": 0, "name": "NVIDIA H200", "uuid": "GPU-aaaa", "utilizationGpu": 40,
                    "memoryUsed": used, "memoryTotal": 143771,
                    "processesPids": [{"pid": ENGINE_PID, "gpuMemoryUsage": used}]
                }]}}}))
            }),
        )
        .route(
            "/api/jobs/",
            get(|State(c): State<Cluster>| async move { Json(Value::from(c.jobs.lock().unwrap().clone())) })
                .post(|State(c): State<Cluster>, Json(mut job): Json<Value>| async move {
                    match c.pending.lock().unwrap().clone() {
                        Some(why) => {
                            job["status"] = json!("PENDING");
                            job["message"] = json!(why);
                        }
                        None => {
                            job["status"] = json!("RUNNING");
                            job["driver_node_id"] = json!("n1");
                        }
                    }
                    if *c.answer_health.lock().unwrap() {
                        let port = job["metadata"]["tessera_port"].as_str().and_then(|p| p.parse().ok());
                        let key = job["metadata"]["tessera_key"].as_str().map(str::to_owned);
                        answer_health(port.unwrap_or_default(), key);
                    }
                    let id = job["submission_id"].clone();
                    c.jobs.lock().unwrap().push(job);
                    Json(json!({"submission_id": id}))
                }),
        )
        .route(
            "/api/jobs/{id}",
            get(|State(c): State<Cluster>, Path(id): Path<String>| async move {
                let jobs = c.jobs.lock().unwrap();
                Json(jobs.iter().find(|j| j["submission_id"] == id).cloned().unwrap_or_default())
            })
            .delete(|| async { Json(json!(true)) }),
        )
        .route(
            "/api/jobs/{id}/stop",
            post(|State(c): State<Cluster>, Path(id): Path<String>| async move {
                for job in c.jobs.lock().unwrap().iter_mut() {
                    if job["submission_id"] == id {
                        job["status"] = json!("STOPPED");
                    }
                }
                Json(json!({"stopped": true}))
            }),
        )
        .route(
            "/api/v0/logs/file",
            get(|| async { format!("Running entrypoint\ntessera-pids: {ENGINE_PID} \nloading\n") }),
        )
        .with_state(cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_on_a_cluster_s_node_measured_past_its_share_by_the_node_s_own_reading_is_flagged_until_it_keeps_it(
) {
    let cluster = Cluster::default();
    *cluster.used_mib.lock().unwrap() = 20_480;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ray = format!("http://{}", listener.local_addr().unwrap());
    let app = stand_in(cluster.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), 200, &["--ray", &ray]).await;
    deploy_emb(&server, "majin:0").await;
    let entrypoint = || {
        let jobs = cluster.jobs.lock().unwrap();
        jobs.first()
            .map(|job| job["entrypoint"].as_str().unwrap_or_default().to_owned())
    };
    wait_until("its job is submitted", || async { entrypoint().is_some() }).await;
    assert!(
        entrypoint().unwrap().contains("tessera-pids"),
        "the job runs its reporter: {entrypoint:?}",
        entrypoint = entrypoint()
    );
    let sharer = || async {
        let (_, machine) = server.get("/api/machines/majin").await;
        machine["gpus"][0]["sharers"][0].clone()
    };

    // 25 % of the GPU's 143771 MiB is 35942 MiB (35.1 GB as the console counts, in GiB): 20 GB keeps it,
    // 40 GB does not.
    wait_until(
        "the node's reading is set against the engine's share",
        || async { sharer().await["measured_bytes"] == 20_480u64 << 20 },
    )
    .await;
    assert!(sharer().await["over_share"].is_null());
    *cluster.used_mib.lock().unwrap() = 40_960;
    wait_until("the engine is flagged", || async {
        sharer().await["over_share"].is_string()
    })
    .await;
    assert_eq!(
        sharer().await["over_share"],
        "emb uses 40 GB on GPU 0 of majin, 4.9 GB past its 35.1 GB share: its neighbours may run out of memory."
    );
    let (_, metrics) = server.get_bytes("/metrics").await;
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tessera_worker_over_share{")
                && l.contains("worker=\"emb\"")
                && l.ends_with(" 1")),
        "{metrics}"
    );
    *cluster.used_mib.lock().unwrap() = 30_720;
    wait_until("the flag goes once it keeps its share", || async {
        sharer().await["over_share"].is_null()
    })
    .await;
    // The node's readings are kept as its peak too: the most it held, past its share.
    let (status, peaks) = server.get("/api/models/emb/peaks").await;
    assert_eq!(status, 200, "{peaks}");
    assert_eq!(
        (
            &peaks[0]["machine"],
            &peaks[0]["peak_bytes"],
            &peaks[0]["verdict"]
        ),
        (&json!("majin"), &json!(40_960u64 << 20), &json!("past")),
        "{peaks}"
    );
    server.stop().await;
}

/// An address where nothing listens yet, and the Ray dashboard's address there.
fn silent_head() -> (std::net::SocketAddr, String) {
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    (address, format!("http://{address}"))
}

/// Serves `app` at `address` until the task is aborted.
async fn answer(address: std::net::SocketAddr, app: Router) -> tokio::task::JoinHandle<()> {
    let listener = tokio::net::TcpListener::bind(address).await.unwrap();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    })
}

/// Adds the command model `emb` and deploys it at 25 % on `gpu`.
async fn deploy_emb(server: &Server, gpu: &str) {
    let (status, body) = server
        .send(
            "POST",
            "/api/models",
            json!({"name": "emb", "engine": "command", "default_share_percent": 25, "model_path": "",
                   "command": "emb-server"}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
    let (status, body) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "emb", "gpus": [gpu], "share": 25}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

/// The jobs the stand-in runs now.
fn running(cluster: &Cluster) -> usize {
    let jobs = cluster.jobs.lock().unwrap();
    jobs.iter().filter(|job| job["status"] == "RUNNING").count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_ray_head_does_not_answer_starts_runs_its_own_engines_and_takes_up_the_cluster_s_machines_once_it_answers(
) {
    let (address, ray) = silent_head();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), 200, &["--demo", "--ray", &ray]).await;
    let (status, change) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "vision", "gpus": ["atlas:1"], "share": 25}),
        )
        .await;
    assert_eq!(status, 201, "{change}");
    server.wait_healthy(1).await;
    let (_, machines) = server.get("/api/machines").await;
    assert!(
        !machines
            .as_array()
            .unwrap()
            .iter()
            .any(|m| m["name"] == "vega"),
        "{machines}"
    );

    let cluster = Cluster::default();
    let _head = answer(address, stand_in_for(cluster.clone(), "vega")).await;
    wait_until("vega is taken up with its GPU", || async {
        let (status, vega) = server.get("/api/machines/vega").await;
        status == 200
            && vega["gpus"].as_array().unwrap().len() == 1
            && vega["unreachable_since"].is_null()
    })
    .await;
    deploy_emb(&server, "vega:0").await;
    wait_until("emb runs as a job on vega", || async {
        running(&cluster) == 1
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_s_machines_are_shown_unreachable_while_it_does_not_answer_at_a_start_what_waits_for_them_says_so_and_their_work_resumes_once_it_answers(
) {
    let (address, ray) = silent_head();
    let cluster = Cluster::default();
    let head = answer(address, stand_in(cluster.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), 200, &["--ray", &ray]).await;
    deploy_emb(&server, "majin:0").await;
    wait_until("emb runs as a job on majin", || async {
        running(&cluster) == 1
    })
    .await;
    server.stop().await;
    assert_eq!(running(&cluster), 0, "its job stopped with the server");
    head.abort();
    let _ = head.await;

    let server = Server::start_with(dir.path(), 200, &["--ray", &ray]).await;
    let (status, majin) = server.get("/api/machines/majin").await;
    assert_eq!(status, 200, "{majin}");
    assert!(majin["unreachable_since"].is_string(), "{majin}");
    assert_eq!(majin["gpus"], json!([]), "nothing is held or placed there");
    // What waits for it says why: the machine is unreachable, not missing.
    let unreachable = format!(
        "majin is unreachable since {}: its Ray node is dead or gone, or the cluster does not answer",
        majin["unreachable_since"].as_str().unwrap()
    );
    let (_, groups) = server.get("/api/groups").await;
    assert_eq!(
        groups[0]["members"][0]["not_held"],
        json!([unreachable]),
        "{groups}"
    );
    let pinned = json!({"name": "pinned", "requested_resources": {"gpu_requests": {"count": 1, "ids": ["majin:0"], "shared": true, "memory_gb": 1}}});
    let (status, worker) = server.send("POST", "/api/workers", pinned).await;
    assert_eq!(status, 201, "{worker}");
    assert_eq!(worker["pending_reasons"], json!([unreachable]), "{worker}");
    assert_eq!(
        server
            .send("DELETE", "/api/workers/pinned", json!(null))
            .await
            .0,
        204
    );

    let _head = answer(address, stand_in(cluster.clone())).await;
    wait_until("majin is reachable again with its GPU", || async {
        let (_, majin) = server.get("/api/machines/majin").await;
        majin["gpus"].as_array().unwrap().len() == 1 && majin["unreachable_since"].is_null()
    })
    .await;
    wait_until("emb runs as a job on majin again", || async {
        running(&cluster) == 1
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ray_cluster_that_does_not_answer_from_the_first_start_is_said_by_the_health_check_and_the_metrics_until_it_answers(
) {
    let (address, ray) = silent_head();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), 200, &["--ray", &ray]).await;
    let up = |metrics: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with("tessera_ray_cluster_up "))
            .map(str::to_owned)
    };
    let (status, health) = server.get("/api/health").await;
    assert_eq!(status, 200, "the server serves all the same");
    assert_eq!(health["status"], "ok");
    assert_eq!(health["ray_cluster"]["up"], false, "{health}");
    let down_since = health["ray_cluster"]["since"].as_str().unwrap().to_owned();
    let (_, metrics) = server.get_bytes("/metrics").await;
    assert_eq!(
        up(&String::from_utf8_lossy(&metrics)).as_deref(),
        Some("tessera_ray_cluster_up 0")
    );

    let _head = answer(address, stand_in(Cluster::default())).await;
    wait_until("the cluster is said to answer", || async {
        server.get("/api/health").await.1["ray_cluster"]["up"] == true
    })
    .await;
    let (_, health) = server.get("/api/health").await;
    assert_ne!(
        health["ray_cluster"]["since"],
        down_since.as_str(),
        "{health}"
    );
    let (_, metrics) = server.get_bytes("/metrics").await;
    assert_eq!(
        up(&String::from_utf8_lossy(&metrics)).as_deref(),
        Some("tessera_ray_cluster_up 1")
    );
    server.stop().await;
}

/// The stand-in served at a fresh address, and the server over it, with `emb` deployed on majin:0.
async fn over_stand_in(cluster: &Cluster, dir: &std::path::Path) -> Server {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ray = format!("http://{}", listener.local_addr().unwrap());
    let app = stand_in(cluster.clone());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let server = Server::start_with(dir, 200, &["--ray", &ray]).await;
    deploy_emb(&server, "majin:0").await;
    server
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_job_ray_holds_pending_is_not_healthy_whatever_answers_at_its_port_and_says_ray_s_reason(
) {
    let cluster = Cluster::default();
    *cluster.pending.lock().unwrap() = Some(
        "Job supervisor actor could not be scheduled: no node has the resources and labels asked for"
            .to_owned(),
    );
    *cluster.answer_health.lock().unwrap() = true;
    let dir = tempfile::tempdir().unwrap();
    let server = over_stand_in(&cluster, dir.path()).await;
    wait_until("the engine says why it waits", || async {
        server.engine_if_any("emb").await.is_some_and(|e| {
            e["message"].as_str().is_some_and(|m| {
                m.contains("is PENDING: Job supervisor actor could not be scheduled")
            })
        })
    })
    .await;
    // Something answers its health check at its port all along: it is not it.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(server.engine("emb").await["state"], "starting");
    // Ray runs the job: now its answer counts.
    for job in cluster.jobs.lock().unwrap().iter_mut() {
        job["status"] = json!("RUNNING");
    }
    wait_until("the engine is healthy", || async {
        server.engine("emb").await["state"] == "healthy"
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_under_way_when_its_node_dies_submits_no_job_for_the_dead_node() {
    let cluster = Cluster::default();
    let dir = tempfile::tempdir().unwrap();
    let server = over_stand_in(&cluster, dir.path()).await;
    wait_until("emb runs as a job on majin", || async {
        running(&cluster) == 1
    })
    .await;
    // The node dies, and with it the engine's job: its restart comes after a 0.2 s backoff, before the
    // server's next read of the cluster (every 3 s) shows the machine unreachable.
    *cluster.dead.lock().unwrap() = true;
    for job in cluster.jobs.lock().unwrap().iter_mut() {
        job["status"] = json!("FAILED");
        job["message"] = json!("the node died");
    }
    wait_until("the machine is shown unreachable", || async {
        server.get("/api/machines/majin").await.1["unreachable_since"].is_string()
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    assert_eq!(
        cluster.jobs.lock().unwrap().len(),
        1,
        "no job was submitted for the dead node"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_on_a_cluster_s_node_takes_only_requests_with_its_key_which_the_gateway_sends_and_no_one_is_shown(
) {
    let cluster = Cluster::default();
    *cluster.answer_health.lock().unwrap() = true;
    let dir = tempfile::tempdir().unwrap();
    let server = over_stand_in(&cluster, dir.path()).await;
    wait_until("the engine is healthy", || async {
        server
            .engine_if_any("emb")
            .await
            .is_some_and(|e| e["state"] == "healthy")
    })
    .await;
    let key = cluster.jobs.lock().unwrap()[0]["metadata"]["tessera_key"]
        .as_str()
        .expect("the job carries the engine's key")
        .to_owned();
    assert_eq!(key.len(), 48);
    let chat = json!({"model": "emb", "messages": [{"role": "user", "content": "hi"}]});
    let (status, answer) = server
        .send("POST", "/v1/chat/completions", chat.clone())
        .await;
    assert_eq!(status, 200, "through the gateway: {answer}");
    let port = server.engine("emb").await["port"].as_u64().unwrap() as u16;
    let (status, _) = support::request(port, "POST", "/v1/chat/completions", Some(chat)).await;
    assert_eq!(status, 401, "straight to the node's port, without the key");
    let (_, engines) = server.get_bytes("/api/engines").await;
    assert!(
        !String::from_utf8_lossy(&engines).contains(&key),
        "the key is shown to no one, admins included"
    );
    server.stop().await;
}
