//! Stopping an engine: every process it started ends, and its GPU's memory is waited for before the next
//! engine there starts.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_ends_the_helpers_that_left_the_engines_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let runtime = Runtime::open(pool, settings(dir.path())).await.unwrap();
    let spec = command("daemon", 0, "sh -c 'setsid sleep 1000 & sleep 1000'");
    runtime.submit(Change::Apply(vec![spec]));
    let mut leader = 0;
    wait_until("a helper has left the engine's group", || {
        let Some(pid) = runtime.engine("daemon").and_then(|e| e.pid) else {
            return false;
        };
        leader = pid;
        process::instance_processes(&instance(dir.path()))
            .iter()
            .any(|f| f.engine == "daemon" && f.group != pid)
    })
    .await;
    assert!(runtime
        .running()
        .await
        .iter()
        .any(|(unit, pids)| unit == "daemon" && pids.len() >= 2 && pids.contains(&leader)));

    runtime.submit(Change::Apply(Vec::new()));
    wait_until("every process of the engine is gone", || {
        processes_of(dir.path(), "daemon").is_empty()
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grower_waits_for_a_stopped_engines_gpu_memory_and_memory_still_held_is_said() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let gpus = Arc::new(Gpus::default());
    let runtime = Runtime::open(
        pool,
        Settings {
            stop_timeout: Duration::from_millis(500),
            gpus: Some(gpus.clone()),
            ..settings(dir.path())
        },
    )
    .await
    .unwrap();
    let shrinking = command("shrinking", 0, "sleep 1000");
    runtime.submit(Change::Apply(vec![shrinking]));
    let mut pid = 0;
    wait_until("it runs", || {
        runtime
            .engine("shrinking")
            .and_then(|e| e.pid)
            .inspect(|p| pid = *p)
            .is_some()
    })
    .await;
    // The driver goes on listing it after it exits: its memory is not freed.
    gpus.holding.lock().unwrap().push(pid);
    let mut events = runtime.shared.events.subscribe();

    runtime.submit(Change::Apply(vec![command("growing", 0, "sleep 1000")]));
    let mut seen = Vec::new();
    while !seen
        .iter()
        .any(|e| matches!(e, Event::Engine { engine, .. } if engine == "growing"))
    {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("events")
            .unwrap();
        seen.push(event);
    }
    let stopped = seen
        .iter()
        .find_map(|e| match e {
            Event::Engine {
                engine,
                state: EngineState::Stopped,
                message,
                ..
            } if engine == "shrinking" => Some(message.clone()),
            _ => None,
        })
        .expect("the shrinking engine stopped before the growing one started");
    let message = stopped.unwrap_or_default();
    assert!(
        message.contains(&format!("PID {pid} still holds memory on GPU 0")),
        "{message}"
    );
    runtime.shutdown().await;
}
