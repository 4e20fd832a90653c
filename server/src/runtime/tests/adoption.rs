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
