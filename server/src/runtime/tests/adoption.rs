//! Adoption after a crash: which engines a previous server recorded are still this installation's, and
//! adopted as committed.

use super::*;

fn alive(pid: u32) -> bool {
    process::start_ticks(pid).is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adoption_leaves_the_children_of_an_adopted_engine_alone() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    // As vLLM's EngineCore: a child in the engine's group, with its environment.
    let spec = command("adoptee", 0, "sh -c 'sleep 1000 & sleep 1000'");
    let pid = left_running(&pool, dir.path(), &spec, &this_boot()).await;
    wait_until("the engine's child runs", || {
        process::group_members(pid).len() >= 2
    })
    .await;
    let family = process::group_members(pid);

    let runtime = Runtime::open(pool, settings(dir.path())).await.unwrap();
    runtime.submit(Change::Reconcile(vec![spec]));
    runtime.settled().await;
    assert_eq!(runtime.engine("adoptee").unwrap().pid, Some(pid), "adopted");
    for member in &family {
        assert!(alive(*member), "{member} of {family:?} was stopped");
    }

    runtime.shutdown().await;
    assert!(process::group_members(pid).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_pid_that_is_now_another_process_is_left_alone_and_its_record_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    // The engine is gone, and its PID went to a process that is not Tessera's.
    let mut other = std::process::Command::new("sleep")
        .arg("1000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid = other.id();
    sqlx::query("INSERT INTO engines (unit, fingerprint, pid, start_ticks, port, boot_id) VALUES ('gone', 'x', ?, ?, 1, ?)")
        .bind(i64::from(pid))
        .bind(process::start_ticks(pid).unwrap() as i64)
        .bind(this_boot())
        .execute(&pool)
        .await
        .unwrap();

    let runtime = Runtime::open(pool.clone(), settings(dir.path()))
        .await
        .unwrap();
    assert!(runtime.recorded().await.unwrap().is_empty());
    runtime.submit(Change::Reconcile(Vec::new()));
    runtime.settled().await;
    assert!(alive(pid), "another process was stopped");
    let (rows,): (i64,) = sqlx::query_as("SELECT count(*) FROM engines")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);

    runtime.shutdown().await;
    other.kill().unwrap();
    other.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_recorded_in_another_boot_is_not_adopted() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let spec = command("rebooted", 0, "sleep 1000");
    let recorded = left_running(&pool, dir.path(), &spec, "another-boot").await;

    let runtime = Runtime::open(pool, settings(dir.path())).await.unwrap();
    assert!(runtime.recorded().await.unwrap().is_empty());
    runtime.submit(Change::Reconcile(vec![spec]));
    wait_until("the engine runs afresh", || {
        runtime
            .engine("rebooted")
            .and_then(|e| e.pid)
            .is_some_and(|pid| pid != recorded)
    })
    .await;
    // It carries this installation's token, so it is ours all the same: an orphan, stopped.
    wait_until("the recorded process is stopped", || !alive(recorded)).await;

    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_recorded_before_boot_ids_were_kept_is_adopted_after_an_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let spec = command("upgraded", 0, "sleep 1000");
    let recorded = left_running(&pool, dir.path(), &spec, "").await;

    let runtime = Runtime::open(pool, settings(dir.path())).await.unwrap();
    assert_eq!(runtime.recorded().await.unwrap().len(), 1);
    runtime.submit(Change::Reconcile(vec![spec]));
    runtime.settled().await;
    assert_eq!(
        runtime.engine("upgraded").unwrap().pid,
        Some(recorded),
        "adopted"
    );
    assert!(alive(recorded));

    runtime.shutdown().await;
}

/// A runtime on `pool` whose GPU 0 lists what `gpus` holds, as NVML would.
/// `gone` exits, but `next` does not start while the driver still lists it on the GPU; once the driver lets
/// its memory go, `next` runs.
async fn starts_only_once_freed(runtime: &Runtime, gpus: &Gpus, gone: u32, next: &str) {
    wait_until("the engine stopped has exited", || !alive(gone)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        runtime.engine(next).is_none(),
        "{next} started while the memory of the engine stopped was held"
    );
    gpus.holding.lock().unwrap().clear();
    wait_until("the next engine runs", || {
        runtime.engine(next).and_then(|e| e.pid).is_some()
    })
    .await;
}

async fn reading(pool: SqlitePool, dir: &Path, gpus: &Arc<Gpus>) -> Runtime {
    Runtime::open(
        pool,
        Settings {
            gpus: Some(gpus.clone()),
            ..settings(dir)
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_engine_s_stop_waits_for_its_gpu_memory_before_the_next_engine_there_starts() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let spec = command("adoptee", 0, "sleep 1000");
    let pid = left_running(&pool, dir.path(), &spec, &this_boot()).await;
    let gpus = Arc::new(Gpus::default());
    let runtime = reading(pool, dir.path(), &gpus).await;
    runtime.submit(Change::Reconcile(vec![spec]));
    runtime.settled().await;
    assert_eq!(runtime.engine("adoptee").unwrap().pid, Some(pid), "adopted");
    // The driver goes on listing it after it exits: its memory is not free yet.
    gpus.holding.lock().unwrap().push(pid);

    runtime.submit(Change::Apply(vec![command("next", 0, "sleep 1000")]));
    starts_only_once_freed(&runtime, &gpus, pid, "next").await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_engine_s_stop_waits_for_its_gpu_memory_before_its_replacement_starts() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let stray = left_running(
        &pool,
        dir.path(),
        &command("emb", 0, "sleep 1000"),
        &this_boot(),
    )
    .await;
    let gpus = Arc::new(Gpus::default());
    gpus.holding.lock().unwrap().push(stray);
    let runtime = reading(pool, dir.path(), &gpus).await;

    // Committed otherwise since: the engine left running is a stray.
    runtime.submit(Change::Reconcile(vec![command("emb", 0, "sleep 999")]));
    starts_only_once_freed(&runtime, &gpus, stray, "emb").await;
    runtime.shutdown().await;
}

/// A Ray dashboard address where nothing listens (yet).
fn silent_cluster() -> (u16, crate::inventory::ray::RayClient) {
    let port = std::net::TcpListener::bind(("127.0.0.1", 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client =
        crate::inventory::ray::RayClient::new(&format!("http://127.0.0.1:{port}"), None).unwrap();
    (port, client)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stray_found_here_is_stopped_and_replaced_alone_even_when_the_cluster_does_not_answer() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let stray = left_running(
        &pool,
        dir.path(),
        &command("emb", 0, "sleep 1000"),
        &this_boot(),
    )
    .await;
    let (_, cluster) = silent_cluster();
    let runtime = Runtime::open(
        pool,
        Settings {
            ray: Some(cluster),
            ..settings(dir.path())
        },
    )
    .await
    .unwrap();

    runtime.submit(Change::Reconcile(vec![command("emb", 0, "sleep 999")]));
    wait_until("the replacement runs", || {
        runtime
            .engine("emb")
            .and_then(|e| e.pid)
            .is_some_and(|pid| pid != stray)
    })
    .await;
    assert!(!alive(stray), "the stray runs beside its replacement");
    assert_eq!(processes_of(dir.path(), "emb").len(), 1);
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_jobs_a_cluster_silent_at_reconcile_was_left_running_are_stopped_once_it_answers() {
    use axum::extract::{Path as UrlPath, State};
    use axum::routing::{get, post};
    type Jobs = Arc<Mutex<Vec<serde_json::Value>>>;
    let dir = tempfile::tempdir().unwrap();
    let (port, cluster) = silent_cluster();
    let runtime = Runtime::open(
        database(dir.path()).await,
        Settings {
            ray: Some(cluster),
            ..settings(dir.path())
        },
    )
    .await
    .unwrap();
    runtime.submit(Change::Reconcile(Vec::new()));
    runtime.settled().await;

    // The cluster answers now, with a job the previous server left.
    let jobs: Jobs = Arc::new(Mutex::new(vec![serde_json::json!({
        "submission_id": "left_job", "status": "RUNNING",
        "metadata": {"tessera_instance": instance(dir.path()), "tessera_unit": "gone",
                     "tessera_machine": "majin", "tessera_port": "8000"},
    })]));
    let find = |jobs: &Jobs, id: &str| {
        jobs.lock()
            .unwrap()
            .iter()
            .find(|j| j["submission_id"] == id)
            .cloned()
            .unwrap_or_default()
    };
    let stand_in = axum::Router::new()
        .route(
            "/api/jobs/",
            get(|State(jobs): State<Jobs>| async move {
                axum::Json(serde_json::Value::from(jobs.lock().unwrap().clone()))
            }),
        )
        .route(
            "/api/jobs/{id}",
            get(
                move |State(jobs): State<Jobs>, UrlPath(id): UrlPath<String>| async move {
                    axum::Json(find(&jobs, &id))
                },
            ),
        )
        .route(
            "/api/jobs/{id}/stop",
            post(
                |State(jobs): State<Jobs>, UrlPath(id): UrlPath<String>| async move {
                    for job in jobs.lock().unwrap().iter_mut() {
                        if job["submission_id"] == id.as_str() {
                            job["status"] = "STOPPED".into();
                        }
                    }
                    axum::Json(serde_json::json!({"stopped": true}))
                },
            ),
        )
        .with_state(jobs.clone());
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    tokio::spawn(async move { axum::serve(listener, stand_in).await });
    wait_until("the job left running is stopped", || {
        find(&jobs, "left_job")["status"] == "STOPPED"
    })
    .await;
    runtime.shutdown().await;
}
