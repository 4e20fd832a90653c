//! Engines on a GPU shared under MPS: its daemon started before its first client and stopped after its
//! last, each client's share enforced, and an adopted client keeping its daemon.

use super::*;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_mps_daemons_of_two_gpus_start_side_by_side_not_one_after_the_other() {
    let dir = tempfile::tempdir().unwrap();
    // A control program whose daemon takes a second to start, writing down when each start begins and
    // ends in one file for both GPUs.
    let starts = dir.path().join("starts");
    let control = dir.path().join("slow-mps-control");
    std::fs::write(
        &control,
        format!(
            "#!/bin/sh\nif [ \"$1\" = -d ]; then\n  echo \"begin $CUDA_VISIBLE_DEVICES\" >> '{starts}'\n  sleep 1\n  touch \"$CUDA_MPS_PIPE_DIRECTORY/control\"\n  echo \"end $CUDA_VISIBLE_DEVICES\" >> '{starts}'\n  exit 0\nfi\n[ -e \"$CUDA_MPS_PIPE_DIRECTORY/control\" ] || exit 1\nread command\n[ \"$command\" = quit ] && rm \"$CUDA_MPS_PIPE_DIRECTORY/control\"\nexit 0\n",
            starts = starts.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o755)).unwrap();
    let runtime = Runtime::open(
        database(dir.path()).await,
        Settings {
            mps_control: control,
            ..mps_settings(dir.path())
        },
    )
    .await
    .unwrap();
    let on = |unit: &str, index: u32, uuid: &str| {
        let mut spec = mps_engine(dir.path(), unit, 2);
        spec.gpus = vec![index];
        spec.mps = Some(spec::MpsClient {
            index,
            uuid: uuid.to_owned(),
            compute_percent: None,
        });
        spec
    };
    runtime.submit(Change::Apply(vec![
        on("a", 0, "GPU-0c4b"),
        on("b", 1, "GPU-1d5c"),
    ]));
    wait_until("both daemons have started", || {
        std::fs::read_to_string(&starts).is_ok_and(|s| s.matches("end").count() == 2)
    })
    .await;
    let seen = std::fs::read_to_string(&starts).unwrap();
    let order: Vec<&str> = seen.lines().map(|l| l.split(' ').next().unwrap()).collect();
    assert_eq!(order, ["begin", "begin", "end", "end"], "{seen}");
    runtime.shutdown().await;
}
