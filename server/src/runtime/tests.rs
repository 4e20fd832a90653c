//! The runtime's own tests: pure rules, and engines as real processes (`sh`, `sleep`) on a real SQLite
//! file, driven through [`Runtime`] as the fleet drives it.

use super::conductor::is_member;
use super::*;
use crate::inventory::demo::Engine;
use crate::inventory::{InventoryError, LocalReading};
use spec::Recipe;
use std::path::Path;

/// How long anything here may take before it counts as never.
const PATIENCE: Duration = Duration::from_secs(30);

/// Polls `check` until it holds, or fails the test after [`PATIENCE`].
async fn wait_until(what: &str, mut check: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !check() {
        assert!(start.elapsed() < PATIENCE, "waited {PATIENCE:?} for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The instance token of the data folder `dir`: each test its own, as the tests run side by side and a
/// reconcile stops every process of its installation that it does not adopt.
fn instance(dir: &Path) -> String {
    dir.display().to_string()
}

/// A fresh data folder's database, with [`instance`] as its token.
async fn database(dir: &Path) -> SqlitePool {
    let pool = crate::db::connect(None, dir).await.unwrap();
    sqlx::query("INSERT INTO instance (id, token) VALUES (1, ?)")
        .bind(instance(dir))
        .execute(&pool)
        .await
        .unwrap();
    pool
}

/// Fast timings; starts are given long enough never to time out in a test.
fn settings(dir: &Path) -> Settings {
    Settings {
        health_interval: Duration::from_millis(50),
        stop_timeout: Duration::from_secs(3),
        backoff: Duration::from_millis(200),
        backoff_max: Duration::from_secs(1),
        max_restarts: 3,
        ..Settings::new(std::env::current_exe().unwrap(), dir.join("engines"))
    }
}

/// An engine on GPU `gpu` of this machine that runs `command` (which answers no health check).
fn command(unit: &str, gpu: u32, command: &str) -> EngineSpec {
    EngineSpec {
        unit: unit.to_owned(),
        machine: "here".to_owned(),
        host: Host::Local,
        gpus: vec![gpu],
        gpu_total: Bytes::gb(8),
        share: Some(Bytes::gb(1)),
        gpu_offered: Bytes::gb(8),
        recipe: Recipe {
            engine: Engine::Command,
            model_path: String::new(),
            command: Some(command.to_owned()),
            args: Vec::new(),
            env: BTreeMap::new(),
        },
        mps: None,
        mig: BTreeMap::new(),
    }
}

/// Starts `spec` as a server that has since crashed would have, and records it as that server did.
async fn left_running(pool: &SqlitePool, dir: &Path, spec: &EngineSpec, boot: &str) -> u32 {
    let launch = spec.command_line(1, Bytes::gb(8)).unwrap();
    let spawned = process::spawn(
        &launch,
        &dir.join("left.log"),
        &instance(dir),
        &Mutex::new(false),
    )
    .unwrap();
    let pid = spawned.pid;
    // Until sh has exec'd, /proc shows the parent's environment.
    wait_until("the engine runs", || process::carries(pid, &instance(dir))).await;
    sqlx::query("INSERT INTO engines (unit, fingerprint, pid, start_ticks, port, boot_id) VALUES (?, ?, ?, ?, 1, ?)")
        .bind(&spec.unit)
        .bind(spec.fingerprint())
        .bind(i64::from(pid))
        .bind(spawned.start_ticks as i64)
        .bind(boot)
        .execute(pool)
        .await
        .unwrap();
    // The server that started it is gone: the engine is nobody's child to wait on.
    std::mem::forget(spawned.child);
    pid
}

fn this_boot() -> String {
    process::boot_id().unwrap()
}

fn alive(pid: u32) -> bool {
    process::start_ticks(pid).is_some()
}

/// The processes that say they are `unit` of the installation in `dir`.
fn processes_of(dir: &Path, unit: &str) -> Vec<u32> {
    process::instance_processes(&instance(dir))
        .into_iter()
        .filter(|f| f.engine == unit)
        .map(|f| f.pid)
        .collect()
}

/// A GPU reader whose GPU 0 lists `holding` as its compute processes.
#[derive(Default)]
struct Gpus {
    holding: Mutex<Vec<u32>>,
}

impl LocalGpus for Gpus {
    fn read(&self, _ours: &crate::inventory::Ours) -> Result<LocalReading, InventoryError> {
        Err(InventoryError::Memory("not read by the runtime".to_owned()))
    }

    fn processes_on(&self, index: u32) -> Vec<u32> {
        if index == 0 {
            self.holding.lock().unwrap().clone()
        } else {
            Vec::new()
        }
    }
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

#[test]
fn the_backoff_doubles_up_to_its_cap() {
    let settings = Settings {
        backoff_max: Duration::from_secs(10),
        ..Settings::new(PathBuf::new(), PathBuf::new())
    };
    let waits: Vec<u64> = (1..=6).map(|n| settings.backoff(n).as_secs()).collect();
    assert_eq!(waits, [1, 2, 4, 8, 10, 10]);
}

#[test]
fn a_unit_is_a_member_of_its_group_on_any_machine() {
    assert!(is_member(
        "group:text-router/glm@atlas",
        Some("text-router"),
        "glm"
    ));
    assert!(is_member("group:other/glm@atlas", None, "glm"));
    assert!(!is_member(
        "group:other/glm@atlas",
        Some("text-router"),
        "glm"
    ));
    assert!(!is_member("glm", None, "glm"));
    assert_eq!(
        engine_id("group:text-router/glm@atlas"),
        "group~text-router~glm~atlas"
    );
}

#[test]
fn times_are_written_in_rfc_3339() {
    let t = now();
    assert!(
        time::OffsetDateTime::parse(&t, &time::format_description::well_known::Rfc3339).is_ok(),
        "{t}"
    );
    assert!(t.ends_with('Z'), "{t}");
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
    runtime
        .shared
        .launch_unit(on_node("job"), Begin::Start)
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

/// The stand-in for NVIDIA's `nvidia-cuda-mps-control` (`tests/support/mps-control`): it records each
/// daemon start and stop in the daemon's log directory.
fn mps_control() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/mps-control"
    ))
}

/// An executable shell script `name` in `dir`.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let program = dir.join(name);
    std::fs::write(&program, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(
        &program,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    program
}

/// An engine on GPU 0 as a client of its MPS server: it writes the CUDA variables it was given to
/// `{unit}.env`, then answers its health checks, so that the next engine on the GPU starts after it.
fn mps_engine(dir: &Path, unit: &str, gb: u64) -> EngineSpec {
    let out = dir.join(format!("{unit}.env"));
    let script = dir.join("engine.py");
    std::fs::write(
        &script,
        r#"import http.server, os, sys
with open(sys.argv[2], "w") as out:
    out.writelines(f"{k}={v}\n" for k, v in sorted(os.environ.items()) if k.startswith("CUDA_"))
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"#,
    )
    .unwrap();
    EngineSpec {
        share: Some(Bytes::gb(gb)),
        mps: Some(spec::MpsClient {
            index: 0,
            uuid: "GPU-0c4b".to_owned(),
            compute_percent: Some(50),
        }),
        ..command(
            unit,
            0,
            &format!("python3 {} {{port}} {}", script.display(), out.display()),
        )
    }
}

/// A runtime whose MPS daemons live under `dir`, and two engines for GPU 0 under MPS: a (2 GB), b (3 GB).
async fn mps_runtime(dir: &Path) -> (Runtime, EngineSpec, EngineSpec) {
    let runtime = Runtime::open(database(dir).await, mps_settings(dir))
        .await
        .unwrap();
    (runtime, mps_engine(dir, "a", 2), mps_engine(dir, "b", 3))
}

/// [`settings`] with MPS daemons under `dir`, started and stopped by [`mps_control`].
fn mps_settings(dir: &Path) -> Settings {
    Settings {
        data_dir: dir.to_path_buf(),
        mps_control: mps_control(),
        ..settings(dir)
    }
}

fn mps_calls(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("mps/here-0/log/calls")).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_on_an_mps_gpu_start_after_its_daemon_with_their_share_enforced_and_it_stops_after_the_last(
) {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, a, b) = mps_runtime(dir.path()).await;
    runtime.submit(Change::Apply(vec![a.clone(), b.clone()]));
    let env_of = |unit: &str| std::fs::read_to_string(dir.path().join(format!("{unit}.env")));
    wait_until("both engines run", || {
        env_of("a").is_ok() && env_of("b").is_ok()
    })
    .await;
    assert_eq!(
        mps_calls(dir.path()),
        "start GPU-0c4b\n",
        "one daemon, started once"
    );
    let pipe = dir.path().join("mps/here-0/pipe");
    assert_eq!(
        env_of("a").unwrap(),
        format!(
            "CUDA_DEVICE_ORDER=PCI_BUS_ID\nCUDA_MPS_ACTIVE_THREAD_PERCENTAGE=50\nCUDA_MPS_LOG_DIRECTORY={}\nCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M\nCUDA_MPS_PIPE_DIRECTORY={}\nCUDA_VISIBLE_DEVICES=0\n",
            dir.path().join("mps/here-0/log").display(),
            pipe.display()
        )
    );
    assert!(env_of("b")
        .unwrap()
        .contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3072M\n"));
    assert_eq!(
        runtime.engine("a").unwrap().env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        "0=2048M",
        "the engine's view shows the limit it runs under"
    );

    // One client left: the daemon stays; none: it stops.
    runtime.submit(Change::Apply(vec![b.clone()]));
    runtime.settled().await;
    assert_eq!(mps_calls(dir.path()), "start GPU-0c4b\n");
    runtime.submit(Change::Apply(Vec::new()));
    runtime.settled().await;
    wait_until("the daemon is stopped", || {
        mps_calls(dir.path()).ends_with("quit\n")
    })
    .await;
    assert_eq!(mps_calls(dir.path()), "start GPU-0c4b\nquit\n");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_mps_daemon_cannot_start_does_not_start_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    let settings = Settings {
        data_dir: dir.path().to_path_buf(),
        mps_control: dir.path().join("no-such-program"),
        max_restarts: 1,
        ..settings(dir.path())
    };
    let runtime = Runtime::open(pool, settings).await.unwrap();
    runtime.submit(Change::Apply(vec![mps_engine(dir.path(), "a", 2)]));
    wait_until("the engine is failed", || {
        runtime
            .engine("a")
            .is_some_and(|e| e.state == EngineState::Failed)
    })
    .await;
    let message = runtime.engine("a").unwrap().message.unwrap();
    assert!(
        message.contains("the MPS daemon of GPU GPU-0c4b could not start")
            && message.contains(
                "a is not started, as outside MPS its memory share would not be enforced"
            ),
        "{message}"
    );
    assert!(!dir.path().join("a.env").exists(), "the engine never ran");
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adopted_mps_client_keeps_the_daemon_it_was_started_under_until_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let pool = database(dir.path()).await;
    // A client that runs until stopped.
    let spec = EngineSpec {
        recipe: command("a", 0, "sleep 1000").recipe,
        ..mps_engine(dir.path(), "a", 2)
    };
    let pid = left_running(&pool, dir.path(), &spec, &this_boot()).await;
    // The previous server's daemon still runs.
    for sub in ["pipe", "log"] {
        std::fs::create_dir_all(dir.path().join("mps/here-0").join(sub)).unwrap();
    }
    std::fs::write(dir.path().join("mps/here-0/pipe/control"), "").unwrap();
    let settings = mps_settings(dir.path());
    let runtime = Runtime::open(pool, settings).await.unwrap();
    runtime.submit(Change::Reconcile(vec![spec]));
    runtime.settled().await;
    assert_eq!(runtime.engine("a").unwrap().pid, Some(pid), "adopted");
    assert_eq!(mps_calls(dir.path()), "", "its daemon is not started again");
    runtime.submit(Change::Apply(Vec::new()));
    runtime.settled().await;
    wait_until("the daemon is stopped", || {
        mps_calls(dir.path()) == "quit\n"
    })
    .await;
    runtime.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_that_died_is_started_again_for_the_next_client_not_taken_on_trust() {
    let dir = tempfile::tempdir().unwrap();
    let (runtime, a, b) = mps_runtime(dir.path()).await;
    runtime.submit(Change::Apply(vec![a.clone()]));
    let started = |unit: &str| dir.path().join(format!("{unit}.env")).exists();
    wait_until("a runs", || started("a")).await;
    // The daemon dies under its client.
    std::fs::remove_file(dir.path().join("mps/here-0/pipe/control")).unwrap();
    runtime.submit(Change::Apply(vec![a, b]));
    wait_until("b runs", || started("b")).await;
    assert_eq!(mps_calls(dir.path()), "start GPU-0c4b\nstart GPU-0c4b\n");
    runtime.shutdown().await;
}

/// An engine of `spec` as its job's entrypoint would run on its node: the entrypoint run by `sh`, with
/// the job's variables; what it printed, and whether it succeeded.
fn run_on_node(request: &crate::inventory::ray::JobRequest) -> (String, String, bool) {
    let out = std::process::Command::new("sh")
        .args(["-c", &request.entrypoint])
        .envs(&request.runtime_env.env_vars)
        .output()
        .unwrap();
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        out.status.success(),
    )
}

#[test]
fn a_job_on_a_node_s_mps_gpu_starts_its_daemon_where_none_answers_and_runs_as_its_client_or_not_at_all_and_a_job_stops_it_after(
) {
    let dir = tempfile::tempdir().unwrap();
    let settings = Settings {
        node_data_dir: dir.path().join("node"),
        mps_control: mps_control(),
        ..settings(dir.path())
    };
    let executor = |settings: Settings| {
        ray::RayExecutor::new(
            crate::inventory::ray::RayClient::new("http://127.0.0.1:9", None).unwrap(),
            settings,
            instance(dir.path()),
            Arc::new(Mutex::new(false)),
        )
    };
    let node = executor(settings.clone());
    let uuid = "GPU-a1b2c3d4-0000-4000-8000-000000000001";
    let spec = EngineSpec {
        machine: "majin".to_owned(),
        host: Host::Cluster {
            address: "127.0.0.1".to_owned(),
            uuids: BTreeMap::from([(0, uuid.to_owned())]),
            demo: false,
        },
        mps: Some(spec::MpsClient {
            index: 0,
            uuid: uuid.to_owned(),
            compute_percent: Some(40),
        }),
        ..command("emb", 0, "sh -c 'env | grep ^CUDA_ | sort'")
    };
    let submission_of = |node: &ray::RayExecutor, spec: &EngineSpec| {
        let mut launch = spec.command_line(8000, Bytes::gb(8)).unwrap();
        let (request, daemon) = node.submission(spec, &mut launch, 8000).unwrap();
        assert!(daemon.is_some());
        assert_eq!(
            launch.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], "0=1024M",
            "the engine's view shows the limit it runs under"
        );
        request
    };
    let submission = |node: &ray::RayExecutor| submission_of(node, &spec);
    let calls = || {
        std::fs::read_to_string(dir.path().join("node/mps/majin-0/log/calls")).unwrap_or_default()
    };
    let pipe = dir.path().join("node/mps/majin-0/pipe");
    let log = dir.path().join("node/mps/majin-0/log");

    let request = submission(&node);
    assert_eq!(request.entrypoint_resources.len(), 1, "{request:?}");
    let (printed, said, ran) = run_on_node(&request);
    assert!(ran, "{said}");
    assert_eq!(
        printed,
        format!(
            "CUDA_DEVICE_ORDER=PCI_BUS_ID\nCUDA_MPS_ACTIVE_THREAD_PERCENTAGE=40\nCUDA_MPS_LOG_DIRECTORY={}\nCUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M\nCUDA_MPS_PIPE_DIRECTORY={}\nCUDA_VISIBLE_DEVICES=0\n",
            log.display(),
            pipe.display()
        ),
        "the engine runs as its daemon's client, its share its limit"
    );
    assert_eq!(
        calls(),
        format!("start {uuid}\n"),
        "the daemon sees the GPU alone, and no client's limit"
    );
    let (_, said, ran) = run_on_node(&submission(&node));
    assert!(ran, "{said}");
    assert_eq!(
        calls(),
        format!("start {uuid}\n"),
        "a daemon that answers is kept"
    );

    // After the last client, a job on the node tells it to quit and sees it gone; where none answers,
    // there is none to stop.
    let daemon = placement::sharing::MpsDaemon::new(
        &dir.path().join("node").display().to_string(),
        "majin",
        0,
        uuid,
    );
    let quit = node.quit_request("majin", &daemon).unwrap();
    assert_eq!(
        quit.entrypoint_label_selector["tessera.machine"], "majin",
        "it runs on the daemon's node"
    );
    assert!(quit.entrypoint_resources.is_empty());
    let (_, said, ran) = run_on_node(&quit);
    assert!(ran, "{said}");
    assert_eq!(calls(), format!("start {uuid}\nquit\n"));
    let (_, said, ran) = run_on_node(&quit);
    assert!(ran, "{said}");
    assert_eq!(calls(), format!("start {uuid}\nquit\n"), "none to stop");
    // A quit that comes late (it waited for its node) while a client starts or runs leaves the daemon
    // be: the client holds the daemon's lock file for as long as it runs.
    let sleeper = EngineSpec {
        recipe: command("emb", 0, "sleep 30").recipe,
        ..spec.clone()
    };
    let request = submission_of(&node, &sleeper);
    let mut client = std::process::Command::new("sh")
        .args(["-c", &request.entrypoint])
        .envs(&request.runtime_env.env_vars)
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while calls().matches("start").count() < 2 {
        assert!(started.elapsed() < PATIENCE, "the client started no daemon");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (_, said, ran) = run_on_node(&quit);
    assert!(!ran);
    assert_eq!(
        said.trim_end(),
        format!("the MPS daemon of GPU {uuid} has clients: it is left running")
    );
    assert_eq!(
        calls(),
        format!("start {uuid}\nquit\nstart {uuid}\n"),
        "no quit sent"
    );
    client.kill().unwrap();
    client.wait().unwrap();
    let (_, said, ran) = run_on_node(&quit);
    assert!(ran, "{said}");
    assert_eq!(
        calls(),
        format!("start {uuid}\nquit\nstart {uuid}\nquit\n"),
        "its client gone, it is stopped"
    );
    let deaf = script(dir.path(), "deaf", "cat >/dev/null\n");
    let deaf = executor(Settings {
        mps_control: deaf,
        ..settings.clone()
    });
    let (_, said, ran) = run_on_node(&deaf.quit_request("majin", &daemon).unwrap());
    assert!(!ran);
    assert_eq!(
        said.trim_end(),
        format!("the MPS daemon of GPU {uuid} still answers after it was told to quit")
    );

    // With no daemon and no control program, the engine does not run outside MPS.
    let broken = executor(Settings {
        mps_control: dir.path().join("no-such-program"),
        ..settings
    });
    let (printed, said, ran) = run_on_node(&submission(&broken));
    assert!(!ran);
    assert_eq!(printed, "", "the engine did not start");
    assert!(
        said.contains("no-such-program"),
        "why the daemon did not start is in the job's log: {said}"
    );
    assert!(
        said.trim_end().ends_with(&format!(
            "the MPS daemon of GPU {uuid} could not start (it did not answer within 3s; its log is in {}): emb is not started, as outside MPS its memory share would not be enforced",
            log.display()
        )),
        "{said}"
    );

    // On a node whose GPUs are made up, no daemon: the demo engine stands in.
    let demo = EngineSpec {
        host: Host::Cluster {
            address: "127.0.0.1".to_owned(),
            uuids: BTreeMap::from([(0, uuid.to_owned())]),
            demo: true,
        },
        ..spec.clone()
    };
    let mut launch = demo.command_line(8000, Bytes::gb(8)).unwrap();
    let (request, daemon) = node.submission(&demo, &mut launch, 8000).unwrap();
    assert_eq!(daemon, None);
    assert!(request.entrypoint.starts_with("exec "), "{request:?}");
    assert!(!launch.env.contains_key("CUDA_MPS_PIPE_DIRECTORY"));
}

/// An engine on a cluster's node with real GPUs: `command` as its recipe.
fn on_real_node(unit: &str, command_line: &str) -> EngineSpec {
    EngineSpec {
        machine: "majin".to_owned(),
        host: Host::Cluster {
            address: "127.0.0.1".to_owned(),
            uuids: BTreeMap::from([(0, "GPU-a1b2c3d4-0000-4000-8000-000000000001".to_owned())]),
            demo: false,
        },
        ..command(unit, 0, command_line)
    }
}

#[test]
fn a_job_on_a_node_with_real_gpus_reports_its_engine_s_processes_as_they_change_and_stops_reporting_once_they_are_gone(
) {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let node = ray::RayExecutor::new(
        crate::inventory::ray::RayClient::new("http://127.0.0.1:9", None).unwrap(),
        settings(dir.path()),
        instance(dir.path()),
        Arc::new(Mutex::new(false)),
    );
    // An engine that starts a helper process after a while, as vLLM starts its EngineCore.
    let spec = on_real_node("emb", "sh -c 'sleep 3; sleep 1000 & wait'");
    let mut launch = spec.command_line(8000, Bytes::gb(8)).unwrap();
    let (request, _) = node.submission(&spec, &mut launch, 8000).unwrap();
    // As Ray runs an entrypoint: in a process group of its own, its output to the job's log.
    let mut job = std::process::Command::new("sh")
        .args(["-c", &request.entrypoint])
        .envs(&request.runtime_env.env_vars)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let engine = job.id();
    let (lines, log) = std::sync::mpsc::channel();
    let out = job.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines() {
            let _ = lines.send(line.unwrap());
        }
    });
    let next_report = || {
        let line = log.recv_timeout(Duration::from_secs(10)).unwrap();
        ray::reported_pids(&line).unwrap_or_else(|| panic!("not a report: {line}"))
    };
    let helpers = |pids: &[u32]| {
        pids.iter()
            .copied()
            .filter(|&pid| pid != engine)
            .collect::<Vec<_>>()
    };
    let cmdline =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();

    let first = next_report();
    assert!(
        first.contains(&engine),
        "{first:?} holds the engine {engine}"
    );
    // A report comes each time they change, until one holds the helper started since.
    let started = std::time::Instant::now();
    let last = loop {
        let report = next_report();
        assert!(report.contains(&engine), "{report:?}");
        let helpers = helpers(&report);
        if helpers.len() == 1 && cmdline(helpers[0]).starts_with("sleep\x001000") {
            break report;
        }
        assert!(started.elapsed() < PATIENCE, "{report:?}");
    };
    assert_eq!(
        last.len(),
        2,
        "the engine and its helper, not the reporter: {last:?}"
    );

    // Stopped as Ray stops a job: its process group told to end. The reporter ends after it.
    let killed = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{engine}")])
        .status()
        .unwrap();
    assert!(killed.success());
    job.wait().unwrap();
    assert_eq!(
        log.recv_timeout(Duration::from_secs(10)),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected),
        "nothing is reported once the engine is gone, and the reporter holds the log no longer"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_s_processes_on_its_node_are_read_from_the_end_of_its_job_s_log_once_and_again_only_once_its_gpus_run_other_processes(
) {
    use axum::extract::{Path as UrlPath, Query};
    use axum::http::StatusCode;
    use axum::routing::get;
    use std::sync::atomic::AtomicUsize;
    let dir = tempfile::tempdir().unwrap();
    let reads = Arc::new(AtomicUsize::new(0));
    let job = |unit: &str, machine: &str| {
        serde_json::json!({
            "submission_id": format!("{unit}_job"), "status": "RUNNING", "driver_node_id": machine,
            "metadata": {"tessera_instance": instance(dir.path()), "tessera_unit": unit,
                         "tessera_machine": machine, "tessera_port": "8000"},
        })
    };
    let jobs = serde_json::json!([job("emb", "majin"), job("rr", "atlas"), job("bad", "atlas")]);
    let listed = jobs.clone();
    // A report after a progress bar's `\r`, with no newline before it.
    let log = |id: &str| match id {
        "emb_job" => Some("tessera-pids: 11 \nloading 45%\rtessera-pids: 11 12 \nready\n"),
        "rr_job" => Some("tessera-pids: 21 \n"),
        _ => None,
    };
    let counted = reads.clone();
    let stand_in = axum::Router::new()
        .route("/api/jobs/", get(move || async move { axum::Json(jobs) }))
        .route(
            "/api/v0/logs/file",
            get(
                move |Query(query): Query<BTreeMap<String, String>>| async move {
                    counted.fetch_add(1, Ordering::SeqCst);
                    assert_eq!(query["lines"], "1000");
                    // Ray's state API needs the node as well as the job.
                    let node = match query["submission_id"].as_str() {
                        "emb_job" => "majin",
                        _ => "atlas",
                    };
                    assert_eq!(query["node_id"], node);
                    log(&query["submission_id"]).ok_or(StatusCode::INTERNAL_SERVER_ERROR)
                },
            ),
        )
        .route(
            "/api/jobs/{id}",
            get(move |UrlPath(id): UrlPath<String>| async move {
                let jobs = listed.as_array().unwrap();
                axum::Json(
                    jobs.iter()
                        .find(|j| j["submission_id"] == id)
                        .unwrap()
                        .clone(),
                )
            }),
        )
        .route(
            "/api/jobs/{id}/logs",
            get(move |UrlPath(id): UrlPath<String>| async move {
                axum::Json(serde_json::json!({"logs": log(&id)}))
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, stand_in).await });
    let reread = Duration::from_secs(1);
    let node = ray::RayExecutor::new(
        crate::inventory::ray::RayClient::new(&format!("http://{address}"), None).unwrap(),
        Settings {
            processes_reread: reread,
            ..settings(dir.path())
        },
        instance(dir.path()),
        Arc::new(Mutex::new(false)),
    );
    // The server finds its engines' jobs.
    assert_eq!(node.leftovers().await.unwrap().len(), 3);
    let units = |unit: &str| vec![unit.to_owned()];
    let emb = vec![("emb".to_owned(), vec![11, 12])];
    let read = || reads.load(Ordering::SeqCst);

    assert_eq!(
        node.processes(&units("emb"), &[12]).await,
        emb,
        "its last report"
    );
    assert_eq!(read(), 1);
    assert_eq!(
        node.processes(&units("rr"), &[21]).await,
        [("rr".to_owned(), vec![21])]
    );
    assert_eq!(read(), 2);
    assert_eq!(node.processes(&units("emb"), &[12]).await, emb);
    assert_eq!(
        read(),
        2,
        "another node's reading keeps what this one's jobs reported"
    );
    assert_eq!(node.processes(&units("emb"), &[12, 99]).await, emb);
    assert_eq!(
        read(),
        2,
        "another process runs, but the log was read a moment ago"
    );
    tokio::time::sleep(reread).await;
    assert_eq!(node.processes(&units("emb"), &[12, 99]).await, emb);
    assert_eq!(
        read(),
        3,
        "another process runs, the log read a while ago: read again"
    );
    tokio::time::sleep(reread).await;
    assert_eq!(node.processes(&units("emb"), &[99, 12]).await, emb);
    assert_eq!(
        read(),
        3,
        "the same processes as at the last read: not read again"
    );

    // A log that cannot be read reports nothing, and is not read again at every reading.
    let bad = vec![("bad".to_owned(), Vec::new())];
    assert_eq!(node.processes(&units("bad"), &[5]).await, bad);
    assert_eq!(node.processes(&units("bad"), &[5, 6]).await, bad);
    assert_eq!(read(), 4);

    assert_eq!(
        node.logs("emb", 10).await.unwrap(),
        vec!["loading 45%\r", "ready"],
        "its log view leaves the reports out"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_s_job_waits_for_its_earlier_job_on_the_same_machine_to_end_but_not_for_one_left_on_a_machine_it_moved_off(
) {
    use axum::extract::{Path as UrlPath, State};
    use axum::routing::{get, post};
    use executor::StartFailure;
    type Jobs = Arc<Mutex<Vec<serde_json::Value>>>;
    let dir = tempfile::tempdir().unwrap();
    let jobs: Jobs = Arc::default();
    let job = |id: &str, machine: &str, status: &str| {
        serde_json::json!({
            "submission_id": id, "status": status,
            "metadata": {"tessera_instance": instance(dir.path()), "tessera_unit": "emb",
                         "tessera_machine": machine},
        })
    };
    // A job waiting for a dead node, or one that ignores its stop, is not ended by a stop.
    let stand_in =
        axum::Router::new()
            .route(
                "/api/jobs/",
                get(|State(jobs): State<Jobs>| async move {
                    axum::Json(serde_json::Value::from(jobs.lock().unwrap().clone()))
                })
                .post(
                    |State(jobs): State<Jobs>,
                     axum::Json(mut job): axum::Json<serde_json::Value>| async move {
                        job["status"] = "PENDING".into();
                        jobs.lock().unwrap().push(job);
                        axum::Json(serde_json::json!({}))
                    },
                ),
            )
            .route(
                "/api/jobs/{id}/stop",
                post(
                    |State(jobs): State<Jobs>, UrlPath(id): UrlPath<String>| async move {
                        for job in jobs.lock().unwrap().iter_mut() {
                            if job["submission_id"] == id.as_str() && !id.ends_with("_stuck") {
                                job["status"] = "STOPPED".into();
                            }
                        }
                        axum::Json(serde_json::json!({"stopped": true}))
                    },
                ),
            )
            .with_state(jobs.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, stand_in).await });
    let node = ray::RayExecutor::new(
        crate::inventory::ray::RayClient::new(&format!("http://{address}"), None).unwrap(),
        Settings {
            stop_timeout: Duration::from_secs(1),
            ..settings(dir.path())
        },
        instance(dir.path()),
        Arc::new(Mutex::new(false)),
    );
    let spec = on_real_node("emb", "serve");
    let start = || async {
        let mut launch = spec.command_line(8000, Bytes::gb(8)).unwrap();
        node.start(&spec, &mut launch, 8000).await
    };
    let status = |id: &str| {
        jobs.lock()
            .unwrap()
            .iter()
            .find(|j| j["submission_id"] == id)
            .map(|j| j["status"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let submitted = || {
        jobs.lock()
            .unwrap()
            .iter()
            .filter(|j| j["metadata"]["tessera_machine"] == "majin" && j["entrypoint"].is_string())
            .count()
    };

    // Left on atlas, which it moved off: told to stop, not waited for.
    jobs.lock()
        .unwrap()
        .push(job("emb_on_atlas_stuck", "atlas", "PENDING"));
    assert!(start().await.is_ok());
    assert_eq!(submitted(), 1);
    // On majin, where it would run beside the next: waited for.
    let new = jobs.lock().unwrap().last().unwrap()["submission_id"].clone();
    assert_eq!(status(new.as_str().unwrap()), "PENDING");
    jobs.lock().unwrap().retain(|j| j["submission_id"] != new);
    jobs.lock()
        .unwrap()
        .push(job("emb_ending", "majin", "RUNNING"));
    assert!(start().await.is_ok());
    assert_eq!(status("emb_ending"), "STOPPED", "ended before the next");
    assert_eq!(submitted(), 1);
    jobs.lock()
        .unwrap()
        .push(job("emb_on_majin_stuck", "majin", "RUNNING"));
    let started = std::time::Instant::now();
    match start().await {
        Err(StartFailure::Unavailable(why)) => assert_eq!(
            why,
            "its earlier Ray job emb_on_majin_stuck has not ended yet (RUNNING): it starts once that has"
        ),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("started beside its earlier job"),
    }
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the stop timeout was given to it"
    );
    assert_eq!(submitted(), 1, "nothing more was submitted");
}
