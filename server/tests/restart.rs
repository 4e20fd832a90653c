//! Always serving: the engines are the data plane and Tessera their control plane. A restart, an upgrade or a
//! crash of the real binary, done the way the package's service manager does it (SIGTERM and a start on
//! the socket it holds; a new binary renamed over the old one, as dpkg writes it; SIGKILL), under clients
//! that never retry: no engine stops, no request is refused, and what was asked while Tessera was away is
//! carried out once it is back.

mod support;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::{processes_of, report, wait_until, Server};

/// Engines that take 2 s to load: a restart of one would keep its model's requests waiting for seconds.
const LOAD_MS: u64 = 2000;

async fn deploy(server: &Server, body: Value) {
    let (status, answer) = server.send("POST", "/api/deployments", body).await;
    assert_eq!(status, 201, "{answer}");
}

/// glm-5.3 pinned at 40 % of atlas:0 with speech on demand (30 %) beside it, and vision pinned on
/// h200-node:0.
async fn fleet(server: &Server) {
    deploy(
        server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        server,
        json!({"model": "speech", "gpus": ["atlas:0"], "share": 30, "revision": 1,
               "demand": {"mode": "on_demand", "keep_alive": 600}}),
    )
    .await;
    deploy(
        server,
        json!({"model": "vision", "gpus": ["h200-node:0"], "share": 25}),
    )
    .await;
    server.wait_healthy(2).await;
}

/// Each engine's PID, by model.
async fn pids(server: &Server) -> Vec<(String, u64)> {
    let mut pids: Vec<(String, u64)> = server
        .engines()
        .await
        .iter()
        .map(|e| {
            (
                e["model"].as_str().unwrap().to_owned(),
                e["pid"].as_u64().unwrap(),
            )
        })
        .collect();
    pids.sort();
    pids
}

/// How the clients' requests ended.
#[derive(Debug, Default)]
struct Tally {
    answered: AtomicU64,
    /// The connection could not be made: what a client of a server that is down sees.
    refused: AtomicU64,
    /// Cut on the way, or answered with an error.
    failed: AtomicU64,
    examples: Mutex<Vec<String>>,
    /// When each request that failed or was refused began.
    began: Mutex<Vec<Instant>>,
}

impl Tally {
    fn fail(&self, counter: &AtomicU64, began: Instant, why: String) {
        counter.fetch_add(1, Ordering::SeqCst);
        self.began.lock().unwrap().push(began);
        let mut examples = self.examples.lock().unwrap();
        if examples.len() < 10 {
            examples.push(why);
        }
    }
}

/// A client that keeps its connections and never retries a request (hyper's own retry of a request
/// never sent is off too), as the openai client with `max_retries=0`.
fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(hyper_util::rt::TokioExecutor::new())
        .retry_canceled_requests(false)
        .build_http()
}

/// One chat request to `model` through the gateway, streamed or not, read to its end.
async fn chat(
    client: &Client<HttpConnector, Full<Bytes>>,
    server: (u16, &str),
    model: &str,
    stream: bool,
) -> Result<(), (bool, String)> {
    let (port, token) = server;
    let body = json!({"model": model, "stream": stream, "messages": [{"role": "user", "content": "hello there"}]});
    let request = hyper::Request::post(format!("http://127.0.0.1:{port}/v1/chat/completions"))
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let answer = client
        .request(request)
        .await
        .map_err(|e| (e.is_connect(), format!("{model}: {e:?}")))?;
    let status = answer.status();
    let body = answer
        .into_body()
        .collect()
        .await
        .map_err(|e| (false, format!("{model}: cut: {e}")))?
        .to_bytes();
    let text = String::from_utf8_lossy(&body);
    if status != 200 || (stream && !text.ends_with("data: [DONE]\n\n")) {
        return Err((false, format!("{model}: {status}: {text}")));
    }
    Ok(())
}

/// `count` clients calling the pinned models in turn, streamed and not, until `done`.
fn clients(
    count: usize,
    server: (u16, String),
    done: Arc<AtomicBool>,
    tally: Arc<Tally>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..count)
        .map(|i| {
            let (server, done, tally) = (server.clone(), done.clone(), tally.clone());
            tokio::spawn(async move {
                let client = client();
                let mut turn = i;
                while !done.load(Ordering::SeqCst) {
                    turn += 1;
                    let model = ["glm-5.3", "vision"][turn % 2];
                    let began = Instant::now();
                    match chat(&client, (server.0, &server.1), model, turn % 3 == 0).await {
                        Ok(()) => {
                            tally.answered.fetch_add(1, Ordering::SeqCst);
                        }
                        Err((true, why)) => tally.fail(&tally.refused, began, why),
                        Err((false, why)) => tally.fail(&tally.failed, began, why),
                    }
                }
            })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_and_an_upgrade_under_clients_that_never_retry_fail_no_request_stop_no_engine_and_carry_out_what_was_asked_meanwhile(
) {
    let dir = tempfile::tempdir().unwrap();
    let installed = dir.path().join("bin").join("tessera");
    support::install_binary(&installed, "1");
    let launch = Server::launch(
        &installed,
        &dir.path().join("data"),
        LOAD_MS,
        &["--demo"],
        &[],
    );
    let mut server = Server::start_as(launch).await;
    fleet(&server).await;
    let before = pids(&server).await;
    let instance = report(&server.engine("vision").await).await["env"]["TESSERA_INSTANCE"]
        .as_str()
        .unwrap()
        .to_owned();

    let done = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let running = clients(
        4,
        (server.port, server.token.clone()),
        done.clone(),
        tally.clone(),
    );
    let answered_by = |n: u64| {
        let tally = tally.clone();
        async move {
            wait_until("the clients' requests are answered", || async {
                tally.answered.load(Ordering::SeqCst) >= n
            })
            .await;
        }
    };
    answered_by(20).await;

    // `systemctl restart`, twice.
    for _ in 0..2 {
        server = server.restart().await;
        let now = tally.answered.load(Ordering::SeqCst);
        answered_by(now + 20).await;
        assert_eq!(pids(&server).await, before, "no engine was restarted");
    }

    // Stopped; while it is away a plan change and a request for the on-demand model are sent, and wait.
    let (launch, status) = server.terminate().await;
    assert!(status.success(), "{status}");
    for (model, pid) in &before {
        assert!(
            support::alive(*pid as u32),
            "{model}'s engine runs on without Tessera"
        );
    }
    let port = launch.socket.local_addr().unwrap().port();
    let token = {
        let data = dir.path().join("data");
        std::fs::read_to_string(data.join("test-token")).unwrap()
    };
    let asked = {
        let token = token.clone();
        tokio::spawn(async move {
            let plan = json!({"revision": 2, "shares": {"glm-5.3": 35, "speech": 30}});
            let changed = support::request_full(
                port,
                Some(&token),
                "PUT",
                "/api/groups/text-router/plan",
                Some(plan),
            );
            let speech = client();
            let loaded = chat(&speech, (port, &token), "speech", false);
            let ((status, _, body), loaded) = tokio::join!(changed, loaded);
            (status, String::from_utf8_lossy(&body).into_owned(), loaded)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    // An upgrade: the new version in the old one's place, then started as the service manager starts it.
    support::install_binary(&installed, "2");
    server = Server::start_as(launch).await;
    let (status, body, loaded) = asked.await.unwrap();
    assert_eq!(
        status, 200,
        "the plan change sent meanwhile is made: {body}"
    );
    assert_eq!(
        loaded,
        Ok(()),
        "the on-demand model asked for meanwhile loads and answers"
    );
    wait_until("glm-5.3 serves with its new share", || async {
        let engine = server.engine_if_any("glm-5.3").await;
        match engine {
            Some(e) if e["state"] == "healthy" => report(&e).await["gpu_memory_gb"] == "33.6",
            _ => false,
        }
    })
    .await;
    let now = tally.answered.load(Ordering::SeqCst);
    answered_by(now + 20).await;
    done.store(true, Ordering::SeqCst);
    for client in running {
        client.await.unwrap();
    }

    let after = pids(&server).await;
    let vision = |pids: &[(String, u64)]| pids.iter().find(|(m, _)| m == "vision").cloned();
    assert_eq!(
        vision(&after),
        vision(&before),
        "vision was never restarted"
    );
    assert!(after.iter().any(|(m, _)| m == "speech"), "{after:?}");
    let examples = tally.examples.lock().unwrap().clone();
    assert_eq!(
        (
            tally.refused.load(Ordering::SeqCst),
            tally.failed.load(Ordering::SeqCst)
        ),
        (0, 0),
        "no request refused or failed across two restarts and an upgrade: {examples:?}"
    );
    // Exactly the engines shown run: none left behind by a server that went.
    let mut running = processes_of(&instance);
    running.sort_unstable();
    let mut shown: Vec<u32> = after.iter().map(|(_, pid)| *pid as u32).collect();
    shown.sort_unstable();
    assert_eq!(running, shown);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_refuses_no_request_drops_only_those_the_dead_server_held_and_the_next_start_adopts_every_engine(
) {
    let dir = tempfile::tempdir().unwrap();
    let mut server = Server::start(dir.path(), LOAD_MS).await;
    fleet(&server).await;
    let before = pids(&server).await;
    let done = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    const CLIENTS: usize = 4;
    let running = clients(
        CLIENTS,
        (server.port, server.token.clone()),
        done.clone(),
        tally.clone(),
    );
    const CRASHES: usize = 2;
    // From each SIGKILL until the next server answers.
    let mut away = Vec::new();
    for _ in 0..CRASHES {
        let now = tally.answered.load(Ordering::SeqCst);
        wait_until("the clients' requests are answered", || async {
            tally.answered.load(Ordering::SeqCst) >= now + 20
        })
        .await;
        let killed = Instant::now();
        server = server.crash_and_restart().await;
        away.push((killed, Instant::now()));
        assert_eq!(
            pids(&server).await,
            before,
            "every engine adopted, none restarted"
        );
    }
    let now = tally.answered.load(Ordering::SeqCst);
    wait_until("the clients' requests are answered", || async {
        tally.answered.load(Ordering::SeqCst) >= now + 20
    })
    .await;
    done.store(true, Ordering::SeqCst);
    for client in running {
        client.await.unwrap();
    }
    let examples = tally.examples.lock().unwrap().clone();
    assert_eq!(
        tally.refused.load(Ordering::SeqCst),
        0,
        "none refused: {examples:?}"
    );
    // What a crash drops is what the dead server had: each client's request in flight, and a request sent
    // on the connection it kept open to that server before the client saw it close.
    let began = tally.began.lock().unwrap().clone();
    let mut since = None;
    for (_, back) in &away {
        let dropped = began
            .iter()
            .filter(|b| *b < back && since.is_none_or(|since| *b >= since))
            .count();
        since = Some(back);
        assert!(
            dropped <= 2 * CLIENTS,
            "{dropped} requests dropped by one crash of a server with {CLIENTS} clients: {examples:?}"
        );
    }
    let last_back = away.last().unwrap().1;
    assert!(
        began.iter().all(|b| *b < last_back),
        "no request begun once the server was back failed: {examples:?}"
    );
    server.stop().await;
}

/// Runs `tessera ARGS --data-dir DATA`: its exit status and what it printed.
fn tessera(data: &Path, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .arg("--data-dir")
        .arg(data)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigterm_leaves_the_engines_running_and_tessera_stop_engines_stops_them_once_the_server_has_stopped(
) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    let server = Server::start(data, 100).await;
    fleet(&server).await;
    let vision = server.engine("vision").await;
    let instance = report(&vision).await["env"]["TESSERA_INSTANCE"]
        .as_str()
        .unwrap()
        .to_owned();
    let before = pids(&server).await;

    let (ok, said) = tessera(data, &["stop", "--engines"]);
    assert!(
        !ok && said.contains("runs on the data folder"),
        "refused while the server runs: {said}"
    );
    let (ok, said) = tessera(data, &["stop"]);
    assert!(
        !ok && said.contains("say what to stop: --engines"),
        "{said}"
    );

    let (_, status) = server.terminate().await;
    assert!(status.success(), "{status}");
    let mut left: Vec<u64> = processes_of(&instance).into_iter().map(u64::from).collect();
    left.sort_unstable();
    let mut engines: Vec<u64> = before.iter().map(|(_, pid)| *pid).collect();
    engines.sort_unstable();
    assert_eq!(left, engines, "a SIGTERM leaves every engine running");

    let (ok, said) = tessera(data, &["stop", "--engines"]);
    assert!(ok, "{said}");
    assert!(said.starts_with("stopped 2 engines: "), "{said}");
    assert_eq!(
        processes_of(&instance),
        Vec::<u32>::new(),
        "and they are gone"
    );
    let (ok, said) = tessera(data, &["stop", "--engines"]);
    assert!(
        ok && said.contains("no engine of this data folder's Tessera runs"),
        "{said}"
    );

    // The next start runs what was committed again.
    let server = Server::start(data, 100).await;
    let after = server.wait_healthy(2).await;
    assert_eq!(after.len(), 2);
    server.stop().await;
    assert_eq!(
        processes_of(&instance),
        Vec::<u32>::new(),
        "Ctrl-C takes them with it"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_backup_and_a_copied_data_folder_are_new_installations_that_leave_the_live_server_s_engines_alone(
) {
    let dir = tempfile::tempdir().unwrap();
    let live_data = dir.path().join("live");
    std::fs::create_dir_all(&live_data).unwrap();
    let live = Server::start(&live_data, 100).await;
    fleet(&live).await;
    let live_pids = pids(&live).await;
    let backup = dir.path().join("backup.db");
    let (ok, said) = tessera(&live_data, &["backup", backup.to_str().unwrap()]);
    assert!(ok, "{said}");

    // A staging server on the backup, beside the live one: it starts engines of its own.
    let staging_data = dir.path().join("staging");
    std::fs::create_dir_all(&staging_data).unwrap();
    std::fs::copy(
        live_data.join("test-token"),
        staging_data.join("test-token"),
    )
    .unwrap();
    let (ok, said) = tessera(&staging_data, &["restore", backup.to_str().unwrap()]);
    assert!(ok, "{said}");
    let staging = Server::start(&staging_data, 100).await;
    let staging_engines = staging.wait_healthy(2).await;
    assert!(
        staging_engines.iter().all(|e| !live_pids
            .iter()
            .any(|(_, pid)| e["pid"].as_u64() == Some(*pid))),
        "the staging server runs engines of its own: {staging_engines:?}"
    );
    staging.stop().await;
    assert_eq!(
        pids(&live).await,
        live_pids,
        "the live server's engines run on"
    );
    for (model, pid) in &live_pids {
        assert!(
            support::alive(*pid as u32),
            "{model}'s engine was not stopped by the copy"
        );
    }

    // The live data folder copied while its server is away (its engines serving on): the copy is a new
    // installation too, and the live server, back, adopts its engines.
    let (launch, _) = live.terminate().await;
    let copy_data = dir.path().join("copy");
    std::fs::create_dir_all(&copy_data).unwrap();
    for file in [
        "tessera.db",
        "tessera.db-wal",
        "tessera.db-shm",
        "test-token",
    ] {
        if live_data.join(file).exists() {
            std::fs::copy(live_data.join(file), copy_data.join(file)).unwrap();
        }
    }
    let copy = Server::start(&copy_data, 100).await;
    copy.wait_healthy(2).await;
    copy.stop().await;
    let live = Server::start_as(launch).await;
    live.wait_healthy(2).await;
    assert_eq!(
        pids(&live).await,
        live_pids,
        "adopted by the live server, never touched by the copy"
    );

    // A machine that replaces the live one, told so: the backup's identity, and its engines adopted.
    let (_, status) = live.terminate().await;
    assert!(status.success());
    let replaced_data = dir.path().join("replaced");
    std::fs::create_dir_all(&replaced_data).unwrap();
    std::fs::copy(
        live_data.join("test-token"),
        replaced_data.join("test-token"),
    )
    .unwrap();
    let (ok, said) = tessera(
        &replaced_data,
        &["restore", "--same-installation", backup.to_str().unwrap()],
    );
    assert!(ok, "{said}");
    let replaced = Server::start(&replaced_data, 100).await;
    replaced.wait_healthy(2).await;
    assert_eq!(
        pids(&replaced).await,
        live_pids,
        "the replacement adopts the engines"
    );
    replaced.stop().await;
}
