//! Engines as a Ray cluster's jobs: a job's entrypoint run as its node would run it, and the executor
//! against a stand-in for Ray's API.

use super::*;
use crate::runtime::executor::Executor;

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

/// An executor whose cluster never answers, for what is made and run without it: a job's request and its
/// entrypoint on a node.
fn offline_node(dir: &Path) -> ray::RayExecutor {
    ray::RayExecutor::new(
        crate::inventory::ray::RayClient::new("http://127.0.0.1:9", None).unwrap(),
        settings(dir),
        instance(dir),
        Arc::new(Mutex::new(false)),
    )
}

/// A port free on this host (the node, here) now.
fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .unwrap()
        .port()
}

/// The key node engines are given in these tests.
const KEY: &str = "a-key-of-twenty-four-hex";

/// `spec`'s engine as a node's is launched: with its key, on `engine_port` of the node's loopback.
fn node_launch(spec: &EngineSpec, engine_port: u16) -> spec::Launch {
    spec.launch(
        engine_port,
        Bytes::gb(8),
        Path::new("tessera"),
        Some(KEY),
        &spec::Sizing::default(),
    )
    .unwrap()
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
    use std::os::unix::process::CommandExt;
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
        let mut launch = node_launch(spec, free_port());
        let (request, daemon) = node.submission(spec, &mut launch, free_port()).unwrap();
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
    // As Ray runs an entrypoint: in a process group of its own, which a stopped job's is killed as.
    let mut client = std::process::Command::new("sh")
        .args(["-c", &request.entrypoint])
        .envs(&request.runtime_env.env_vars)
        .process_group(0)
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
    // The whole group: the shell may be waiting on a child (its `sleep 0.1` between looks at the
    // daemon) that holds the lock as it does, and outlives it for that long.
    let group = rustix::process::Pid::from_raw(client.id() as i32).unwrap();
    rustix::process::kill_process_group(group, rustix::process::Signal::KILL).unwrap();
    client.wait().unwrap();
    let started = std::time::Instant::now();
    let (said, ran) = loop {
        let (_, said, ran) = run_on_node(&quit);
        if ran || started.elapsed() > PATIENCE {
            break (said, ran);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
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
    let mut launch = node_launch(&demo, free_port());
    let (request, daemon) = node.submission(&demo, &mut launch, free_port()).unwrap();
    assert_eq!(daemon, None);
    assert!(
        request.entrypoint.lines().any(|l| l.starts_with("exec ")),
        "{request:?}"
    );
    assert!(!launch.env.contains_key("CUDA_MPS_PIPE_DIRECTORY"));
}

/// An engine on a cluster's node with real GPUs: `command` as its recipe.
/// Ray's list of nodes with majin's alive, with the GPU [`on_real_node`] engines are placed on.
fn majin_alive() -> serde_json::Value {
    serde_json::json!({"data": {"result": {"result": [{
        "node_id": "n1", "node_ip": "127.0.0.1", "state": "ALIVE",
        "labels": {"tessera.machine": "majin", "tessera.gpu-model": "NVIDIA-H200"},
        "resources_total": {"CPU": 16.0, "memory": 8e9,
                            "tessera_gpu_0_GPU-a1b2c3d4-0000-4000-8000-000000000001": 143771.0}
    }]}}})
}

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
    let node = offline_node(dir.path());
    // An engine that starts a helper process after a while, as vLLM starts its EngineCore.
    let spec = on_real_node("emb", "sh -c 'sleep 3; sleep 1000 & wait'");
    let mut launch = node_launch(&spec, free_port());
    let (request, _) = node.submission(&spec, &mut launch, free_port()).unwrap();
    // As Ray runs an entrypoint: in a process group of its own, its output to the job's log.
    let mut job = std::process::Command::new("sh")
        .args(["-c", &request.entrypoint])
        .envs(&request.runtime_env.env_vars)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // The job's own process is the guard of the engine's port, the engine its child.
    let guard = job.id();
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
    let cmdline =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();

    let first = next_report();
    assert!(first.contains(&guard), "{first:?} holds the guard {guard}");
    // A report comes each time they change, until one holds the helper started since.
    let started = std::time::Instant::now();
    let last = loop {
        let report = next_report();
        assert!(report.contains(&guard), "{report:?}");
        if report
            .iter()
            .any(|&pid| cmdline(pid).starts_with("sleep\x001000"))
        {
            break report;
        }
        assert!(started.elapsed() < PATIENCE, "{report:?}");
    };
    assert_eq!(
        last.len(),
        3,
        "the guard, the engine and its helper, not the reporter: {last:?}"
    );

    // Stopped as Ray stops a job: its process group told to end. The reporter ends after it.
    let killed = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{guard}")])
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
    assert_eq!(node.leftovers(&|_| true).await.unwrap().len(), 3);
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
            .route("/api/v0/nodes", get(|| async { axum::Json(majin_alive()) }))
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
        let mut launch = node_launch(&spec, 8001);
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

#[test]
fn an_engine_s_job_whose_port_is_taken_on_its_node_ends_at_once_saying_so_an_address_not_the_node_s_is_said_as_such_and_the_engine_runs_where_it_is_free(
) {
    let dir = tempfile::tempdir().unwrap();
    let node = offline_node(dir.path());
    let spec = on_real_node("emb", "echo the engine runs on {port}");
    // Something else listens on the port on the node (here, this host).
    let taken = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = taken.local_addr().unwrap().port();
    let engine_port = free_port();
    // The job's entrypoint for `spec`, run as its node runs it.
    let job = |spec: &EngineSpec, port: u16, engine_port: u16| {
        let mut launch = node_launch(spec, engine_port);
        let (request, _) = node.submission(spec, &mut launch, port).unwrap();
        std::process::Command::new("sh")
            .args(["-c", &request.entrypoint])
            .envs(&request.runtime_env.env_vars)
            .output()
            .unwrap()
    };
    // Taken where the guard listens, or where the engine would: the next try takes others.
    for (guard_port, engine_port) in [(port, engine_port), (engine_port, port)] {
        let out = job(&spec, guard_port, engine_port);
        assert_eq!(out.status.code().map(i64::from), Some(ray::PORT_TAKEN));
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(
            said.contains(&format!("port {port} is taken on this node")),
            "{said}"
        );
        assert!(!String::from_utf8_lossy(&out.stdout).contains("the engine runs"));
    }

    // An address that is not the node's (its node came back at another) is no port taken.
    let elsewhere = EngineSpec {
        host: Host::Cluster {
            address: "192.0.2.7".to_owned(),
            uuids: BTreeMap::from([(0, "GPU-a1b2c3d4-0000-4000-8000-000000000001".to_owned())]),
            demo: false,
        },
        ..spec.clone()
    };
    let out = job(&elsewhere, port, engine_port);
    assert_eq!(out.status.code().map(i64::from), Some(ray::CANNOT_LISTEN));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("this node cannot listen on 192.0.2.7:{port}: "))
            && !said.contains("taken"),
        "{said}"
    );

    // Once it is free, the engine runs, on its own port, and the job ends as it ends.
    drop(taken);
    let out = job(&spec, port, engine_port);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains(&format!("the engine runs on {engine_port}")),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The engine of the guard's test below: Python's
/// own HTTP server, on the port it is given.
const ECHO_ENGINE: &str = r#"import http.server, sys

class Echo(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.reply(200 if self.path == "/" else 404, b"")

    def do_POST(self):
        if self.headers.get("Transfer-Encoding") == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                body += self.rfile.read(size)
                self.rfile.readline()
                if size == 0:
                    break
        else:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply(200, b"got %d bytes" % len(body))

    def reply(self, status, body):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Echo).serve_forever()
"#;

/// One request written as is to `port`, and all that came back before the connection closed; none where
/// nothing listens there.
fn try_exchange(port: u16, request: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    Some(answer)
}

fn exchange(port: u16, request: &str) -> String {
    try_exchange(port, request).expect("the guard listens")
}

#[test]
fn an_engine_on_a_node_is_reached_only_through_its_guard_which_takes_only_requests_with_its_key_on_any_path(
) {
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let node = offline_node(dir.path());
    // An engine that answers on every path and reads each body whole, as engines do: GET / is 200, any
    // other GET 404, a POST says how many bytes its body had.
    let engine = dir.path().join("engine.py");
    std::fs::write(&engine, ECHO_ENGINE).unwrap();
    let spec = on_real_node("emb", &format!("python3 {} {{port}}", engine.display()));
    let (port, engine_port) = (free_port(), free_port());
    let mut launch = node_launch(&spec, engine_port);
    let (request, _) = node.submission(&spec, &mut launch, port).unwrap();
    let mut job = std::process::Command::new("sh")
        .args(["-c", &request.entrypoint])
        .envs(&request.runtime_env.env_vars)
        .current_dir(dir.path())
        .process_group(0)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let get = |path: &str, auth: &str| {
        exchange(
            port,
            &format!("GET {path} HTTP/1.1\r\nHost: node\r\n{auth}\r\n"),
        )
    };
    let keyed = format!("Authorization: Bearer {KEY}\r\n");
    let started = std::time::Instant::now();
    let home = format!("GET / HTTP/1.1\r\nHost: node\r\n{keyed}\r\n");
    while !try_exchange(port, &home).is_some_and(|a| a.starts_with("HTTP/1.0 200")) {
        assert!(started.elapsed() < PATIENCE, "the engine never answered");
        std::thread::sleep(Duration::from_millis(50));
    }

    // vLLM's --api-key guards /v1 alone: these paths answer anyone who reaches its port.
    for path in [
        "/invocations",
        "/pooling",
        "/score",
        "/rerank",
        "/classify",
        "/tokenize",
        "/v1/models",
        "/health",
        "/metrics",
        "/",
    ] {
        for auth in [
            String::new(),
            "Authorization: Bearer not-its-key\r\n".to_owned(),
            format!("Authorization: Basic {KEY}\r\n"),
            format!("{keyed}Authorization: Bearer other\r\n"),
        ] {
            let answer = get(path, &auth);
            assert!(
                answer.starts_with("HTTP/1.1 401 Unauthorized")
                    && answer.contains("send them to Tessera's gateway"),
                "{path} with {auth:?}: {answer}"
            );
        }
    }
    // With its key, any path reaches the engine, which answers as it answers.
    assert!(get("/nothing-here", &keyed).starts_with("HTTP/1.0 404"));
    assert!(get("/", &format!("authorization: bearer {KEY}\r\n")).starts_with("HTTP/1.0 200"));
    // A body is sent on whole, by its length or its chunks.
    let body = "{\"text\": \"hi\"}";
    let posted = exchange(
        port,
        &format!(
            "POST /score HTTP/1.1\r\nHost: node\r\n{keyed}Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(
        posted.starts_with("HTTP/1.0 200") && posted.ends_with("got 14 bytes"),
        "{posted}"
    );
    let chunked = exchange(
        port,
        &format!("POST /score HTTP/1.1\r\nHost: node\r\n{keyed}Transfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n0\r\n\r\n"),
    );
    assert!(
        chunked.starts_with("HTTP/1.0 200") && chunked.ends_with("got 4 bytes"),
        "{chunked}"
    );
    let ambiguous = exchange(
        port,
        &format!("POST /score HTTP/1.1\r\nHost: node\r\n{keyed}Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\nabcd"),
    );
    assert!(ambiguous.starts_with("HTTP/1.1 400"), "{ambiguous}");
    // One request a connection: a request written after a keyed one is never read.
    let smuggled = exchange(
        port,
        &format!("GET / HTTP/1.1\r\nHost: node\r\n{keyed}\r\nGET /invocations HTTP/1.1\r\nHost: node\r\n\r\n"),
    );
    assert_eq!(smuggled.matches("HTTP/1.").count(), 1, "{smuggled}");

    // Stopped as Ray stops a job: every process told to end; the job ends as its engine ends.
    let killed = std::process::Command::new("kill")
        .args(["-TERM", "--", &format!("-{}", job.id())])
        .status()
        .unwrap();
    assert!(killed.success());
    let status = job.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15), "{status:?}");
}
