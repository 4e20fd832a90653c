//! The order changes are carried out in: what starts after what on a GPU, and nothing starting once a
//! shutdown begins.

use super::*;
use crate::runtime::engines::Begin;

#[test]
fn nothing_is_spawned_once_the_server_is_shutting_down() {
    let dir = tempfile::tempdir().unwrap();
    let launch = command("late", 0, "sleep 1000")
        .command_line(1, Bytes::gb(8))
        .unwrap();
    let refused = process::spawn(
        &launch,
        &dir.path().join("late.log"),
        &instance(dir.path()),
        &Mutex::new(true),
    );
    assert!(matches!(refused, Err(process::SpawnError::Closing)));
    assert!(processes_of(dir.path(), "late").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_queued_when_shutdown_begins_never_spawns() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let runtime = Runtime::open(
        pool,
        Settings {
            start_timeout: Duration::from_secs(1),
            max_restarts: 0,
            ..settings(dir.path())
        },
    )
    .await
    .unwrap();
    let marker = dir.path().join("second-started");
    let first = command("first", 0, "sleep 1000");
    let second = command(
        "second",
        0,
        &format!("sh -c 'touch {}; sleep 1000'", marker.display()),
    );
    // The second waits for the first to load: same GPU.
    runtime.submit(Change::Apply(vec![first.clone(), second]));
    wait_until("the first is loading", || {
        runtime.engine("first").and_then(|e| e.pid).is_some()
    })
    .await;
    runtime.shutdown().await;
    // Past the first's start timeout, when the queue would have gone on to the second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !marker.exists(),
        "the second started after the shutdown began"
    );
    assert!(processes_of(dir.path(), "first").is_empty());
    assert!(processes_of(dir.path(), "second").is_empty());
    assert!(runtime.engines().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_backing_off_does_not_start_again_once_shutdown_begins() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let runtime = Runtime::open(
        pool,
        Settings {
            backoff: Duration::from_millis(500),
            ..settings(dir.path())
        },
    )
    .await
    .unwrap();
    let starts = dir.path().join("starts");
    let failing = command(
        "failing",
        0,
        &format!("sh -c 'echo start >> {}; exit 1'", starts.display()),
    );
    runtime.submit(Change::Apply(vec![failing]));
    wait_until("it backs off", || {
        runtime
            .engine("failing")
            .is_some_and(|e| e.state == EngineState::Restarting)
    })
    .await;
    runtime.shutdown().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    let started = std::fs::read_to_string(&starts).unwrap();
    assert_eq!(started.lines().count(), 1, "it started again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_does_not_start_beside_one_a_cancelled_change_left_loading() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let runtime = Runtime::open(pool, settings(dir.path())).await.unwrap();
    let mut events = runtime.shared.events.subscribe();
    let loading = command("loading", 0, "sleep 1000");
    runtime.submit(Change::Apply(vec![
        loading.clone(),
        command("dropped", 0, "sleep 1000"),
    ]));
    wait_until("the first engine is loading", || {
        runtime.engine("loading").and_then(|e| e.pid).is_some()
    })
    .await;
    // Cancels the first change's wait (it would start "dropped"), while "loading" still loads.
    let beside = command("beside", 0, "sleep 1000");
    runtime.submit(Change::Apply(vec![loading, beside.clone()]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    runtime.submit(Change::Apply(vec![beside]));

    let mut order = Vec::new();
    while !order.contains(&("beside".to_owned(), EngineState::Starting)) {
        let event = tokio::time::timeout(PATIENCE, events.recv())
            .await
            .expect("events")
            .unwrap();
        if let Event::Engine { engine, state, .. } = event {
            order.push((engine, state));
        }
    }
    assert!(
        order.contains(&("loading".to_owned(), EngineState::Stopped)),
        "beside started while loading still loaded: {order:?}"
    );
    assert!(!order.iter().any(|(engine, _)| engine == "dropped"));
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_that_makes_one_start_of_a_queued_change_moot_still_starts_that_change_s_other_engines(
) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    // One job starts both, in turn: "slow" never answers, so "other" waits behind it.
    let (slow, other) = (
        command("slow", 0, "sleep 1000"),
        command("other", 0, "sleep 1000"),
    );
    runtime.submit(Change::Update {
        units: vec!["slow".to_owned(), "other".to_owned()],
        desired: vec![slow, other],
    });
    wait_until("slow is loading", || {
        runtime.engine("slow").and_then(|e| e.pid).is_some()
    })
    .await;
    // slow is removed; the change says nothing of other, which is still wanted.
    runtime.submit(Change::Update {
        units: vec!["slow".to_owned()],
        desired: Vec::new(),
    });
    wait_until("other starts", || {
        runtime.engine("other").and_then(|e| e.pid).is_some()
    })
    .await;
    wait_until("slow is gone", || runtime.engine("slow").is_none()).await;
    runtime.shutdown().await;
}

#[tokio::test]
async fn an_engine_running_as_a_job_without_a_pid_here_counts_against_the_memory_free_at_a_start() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    let on_node = |unit: &str| EngineSpec {
        machine: "majin".to_owned(),
        host: Host::Cluster {
            address: "10.0.0.7".to_owned(),
            uuids: BTreeMap::from([(0, "GPU-aaaa".to_owned())]),
            demo: false,
        },
        ..command(unit, 0, "sleep 60")
    };
    // No cluster executor in this runtime: the job is only registered, and its state set as a job's is.
    crate::runtime::supervisor::launch(&runtime.shared, on_node("job"), Begin::Start, || false)
        .unwrap();
    runtime
        .shared
        .set("job", EngineState::Healthy, None, Some(8000), None);
    assert_eq!(
        runtime.shared.free_at_start(&on_node("next")),
        Bytes::gb(7),
        "the job's 1 GB of the 8 GB is taken"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_whose_change_was_cancelled_as_it_registered_is_not_registered_so_no_stop_at_once_can_miss_it(
) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    // The cancel is read under the lock registrations are read under: here it is already set when the
    // start registers, as when a newer change cancels between the job's last look and its registration.
    let (cancel, _) = tokio::sync::watch::channel(false);
    let late = crate::runtime::supervisor::launch(
        &runtime.shared,
        command("late", 0, "sleep 1000"),
        Begin::Start,
        || {
            cancel.send_replace(true);
            *cancel.borrow()
        },
    );
    assert!(late.is_none(), "not launched");
    assert!(runtime.engine("late").is_none(), "not registered");
    assert!(runtime.shared.registered_of(["late"]).is_empty());
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_for_some_gpus_to_settle_does_not_wait_for_an_engine_still_loading_on_another() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    // On GPU 1, an engine that loads for as long as its start timeout (15 minutes); on GPU 0, one that
    // answers at once.
    let loading = command("loading", 1, "sleep 1000");
    let quick = answering(dir.path(), "quick", 0, 0.0);
    runtime.submit(Change::Apply(vec![loading, quick]));
    let gpu0 = placement::GpuRef::new("here", 0);
    tokio::time::timeout(PATIENCE, runtime.settled_on(&[gpu0]))
        .await
        .expect("GPU 0 settles while GPU 1 still loads");
    assert_eq!(
        runtime.engine("quick").map(|e| e.state),
        Some(EngineState::Healthy)
    );
    assert_eq!(
        runtime.engine("loading").map(|e| e.state),
        Some(EngineState::Starting)
    );
    // The whole fleet has not settled.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), runtime.settled())
            .await
            .is_err()
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_a_plan_removes_is_stopped_even_when_a_newer_change_cancels_the_plan_before_it_runs(
) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    let unit = |member: &str| placement::holder::member("g", member, "here");
    // x runs and never answers a health check: its start, and every job queued behind it, waits.
    let leaving = command(&unit("x"), 0, "sleep 1000");
    runtime.submit(Change::Apply(vec![leaving.clone()]));
    wait_until("x is loading", || {
        runtime.engine(&unit("x")).and_then(|e| e.pid).is_some()
    })
    .await;
    // The plan: x leaves the group and y joins it, queued behind x's start.
    let joining = command(&unit("y"), 0, "sleep 1000");
    runtime.submit(Change::Plan {
        group: "g".to_owned(),
        revision: 2,
        steps: vec![
            placement::Step::Stop("x".to_owned()),
            placement::Step::Start(
                "y".to_owned(),
                placement::BasisPoints::from_percent(50.0).unwrap(),
            ),
        ],
        members: vec![joining],
    });
    // A newer change wants y otherwise: the plan's job is cancelled before it ran.
    let otherwise = command(&unit("y"), 0, "sleep 999");
    runtime.submit(Change::Update {
        units: vec![unit("y")],
        desired: vec![otherwise],
    });
    wait_until("x, which the plan removed, stops", || {
        runtime.engine(&unit("x")).is_none()
    })
    .await;
    wait_until("y starts as the newer change wants it", || {
        runtime.engine(&unit("y")).and_then(|e| e.pid).is_some()
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_wanted_again_while_it_is_still_stopping_starts_again_once_it_has_exited() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    let engine = answering(dir.path(), "od", 0, 1.0);
    let only = |desired: Vec<EngineSpec>| Change::Update {
        units: vec!["od".to_owned()],
        desired,
    };
    runtime.submit(only(vec![engine.clone()]));
    tokio::time::timeout(PATIENCE, runtime.settled())
        .await
        .expect("it starts");
    let first = runtime.engine("od").and_then(|e| e.pid).expect("it runs");
    // Unloaded, and asked for again while it still takes its second to exit: an on-demand model whose
    // next request comes as its keep-alive ends.
    runtime.submit(only(Vec::new()));
    runtime.submit(only(vec![engine]));
    wait_until("it runs again, as a new process", || {
        runtime
            .engine("od")
            .and_then(|e| e.pid)
            .is_some_and(|pid| pid != first)
    })
    .await;
    assert!(
        !processes_of(dir.path(), "od").contains(&first),
        "the first has exited"
    );
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_s_stop_of_a_member_stops_it_where_it_ran_as_the_plan_was_committed_not_where_a_newer_change_deployed_it_since(
) {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    let unit = |group: &str| placement::holder::member(group, "m", "here");
    let update = |unit: &str, desired: Vec<EngineSpec>| Change::Update {
        units: vec![unit.to_owned()],
        desired,
    };
    runtime.submit(update(
        &unit("a"),
        vec![answering(dir.path(), &unit("a"), 0, 0.0)],
    ));
    tokio::time::timeout(PATIENCE, runtime.settled())
        .await
        .expect("m runs in group a");
    // An engine that never answers holds up every change queued on GPU 0 behind its start.
    runtime.submit(update("loading", vec![command("loading", 0, "sleep 1000")]));
    wait_until("loading is loading", || {
        runtime.engine("loading").and_then(|e| e.pid).is_some()
    })
    .await;
    // m leaves group a, and its stop waits on GPU 0; meanwhile m is deployed again in group b, on GPU 1.
    runtime.submit(Change::Plan {
        group: "a".to_owned(),
        revision: 2,
        steps: vec![placement::Step::Stop("m".to_owned())],
        members: Vec::new(),
    });
    runtime.submit(update(
        &unit("b"),
        vec![answering(dir.path(), &unit("b"), 1, 0.0)],
    ));
    wait_until("m runs in group b", || {
        runtime
            .engine(&unit("b"))
            .is_some_and(|e| e.state == EngineState::Healthy)
    })
    .await;
    let in_b = runtime.engine(&unit("b")).and_then(|e| e.pid);
    // GPU 0 goes on: the plan's stop is carried out.
    runtime.submit(update("loading", Vec::new()));
    wait_until("m stops in group a", || {
        runtime.engine(&unit("a")).is_none()
    })
    .await;
    tokio::time::timeout(PATIENCE, runtime.settled())
        .await
        .expect("every change is carried out");
    assert_eq!(
        runtime.engine(&unit("b")).map(|e| (e.state, e.pid)),
        Some((EngineState::Healthy, in_b)),
        "m runs on in group b, where the newer change deployed it"
    );
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_replica_a_plan_no_longer_runs_stops_before_the_plan_starts_anything_on_its_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let runtime = Runtime::open(database(dir.path()).await, settings(dir.path()))
        .await
        .unwrap();
    // v's replica on GPU 0, an engine that takes a second to exit.
    let replica = placement::holder::replica("g", "v", &placement::GpuRef::new("here", 0));
    runtime.submit(Change::Update {
        units: vec![replica.clone()],
        desired: vec![answering(dir.path(), &replica, 0, 1.0)],
    });
    tokio::time::timeout(PATIENCE, runtime.settled())
        .await
        .expect("the replica runs");
    // A plan of g whose members no longer run it (it waits for room) and start p on GPU 0.
    let member = placement::holder::member("g", "p", "here");
    runtime.submit(Change::Plan {
        group: "g".to_owned(),
        revision: 2,
        steps: vec![placement::Step::Start(
            "p".to_owned(),
            placement::BasisPoints(5000),
        )],
        members: vec![answering(dir.path(), &member, 0, 0.0)],
    });
    wait_until("p starts", || runtime.engine(&member).is_some()).await;
    assert!(
        runtime.engine(&replica).is_none(),
        "the replica had stopped before p started beside it"
    );
    tokio::time::timeout(PATIENCE, runtime.settled())
        .await
        .expect("every change is carried out");
    runtime.shutdown().await;
}
