//! The real `tessera` binary on a data folder of its own, with the demo fleet (whose machines run the demo
//! engine), driven over HTTP as an operator's script would.
// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

pub mod chaos;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use serde_json::Value;
use std::future::Future;
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A running server.
pub struct Server {
    pub port: u16,
    /// An admin's API token, which every request of these tests sends.
    pub token: String,
    child: tokio::process::Child,
    /// How it was started, to start it again so.
    launch: Launch,
}

/// How a server is started: its program, its arguments and environment, and the socket it listens on,
/// held here as systemd's `tessera.socket` holds it and passed as systemd passes it (`LISTEN_FDS`), so that
/// it outlives each server: a server started again takes the connections made while none ran.
#[derive(Clone)]
pub struct Launch {
    pub program: std::path::PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub socket: Arc<std::net::TcpListener>,
}

impl Launch {
    /// Runs the server, the socket passed as descriptor 3 to it alone, as systemd does.
    fn spawn(&self) -> tokio::process::Child {
        use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
        let fd = self.socket.as_raw_fd();
        let mut command = tokio::process::Command::new("sh");
        // systemd sets LISTEN_PID to the server's own PID: the shell's, which the server takes over.
        command
            .args(["-c", r#"LISTEN_PID=$$ LISTEN_FDS=1 exec "$0" "$@""#])
            .arg(&self.program)
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .kill_on_drop(true);
        // SAFETY: between fork and exec only dup2 and fcntl run, both async-signal-safe.
        unsafe {
            command.pre_exec(move || {
                let socket = BorrowedFd::borrow_raw(fd);
                if fd == 3 {
                    rustix::io::fcntl_setfd(socket, rustix::io::FdFlags::empty())?;
                } else {
                    let mut three = OwnedFd::from_raw_fd(3);
                    let duplicated = rustix::io::dup2(socket, &mut three);
                    std::mem::forget(three);
                    duplicated?;
                }
                Ok(())
            });
        }
        command.spawn().expect("the tessera binary starts")
    }
}

/// An admin for the data folder, made once with `tessera user add` and `tessera token add` (as a script
/// would), its token kept in the folder so that a server started again on the same data finds it.
fn admin_token(data: &Path) -> String {
    let kept = data.join("test-token");
    if let Ok(token) = std::fs::read_to_string(&kept) {
        return token;
    }
    let tessera = |args: &[&str], stdin: &str| {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("--data-dir")
            .arg(data)
            .args(args)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the tessera binary runs");
        std::io::Write::write_all(&mut child.stdin.take().unwrap(), stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "tessera {args:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    tessera(
        &["user", "add", "tester", "--role", "admin"],
        "a long test password\n",
    );
    let token = tessera(&["token", "add", "tests", "--user", "tester"], "")
        .trim()
        .to_owned();
    std::fs::write(&kept, &token).unwrap();
    token
}

/// How long anything in these tests may take before it counts as never.
pub const PATIENCE: Duration = Duration::from_secs(30);

impl Server {
    /// Starts the server on `data`, with fast supervisor timings; `demo_start_ms` is how long each demo
    /// engine takes to "load".
    pub async fn start(data: &Path, demo_start_ms: u64) -> Server {
        Server::start_with(data, demo_start_ms, &["--demo"]).await
    }

    /// Starts the server on `data` over the machines `sources` name (`--demo`, `--ray URL`).
    pub async fn start_with(data: &Path, demo_start_ms: u64, sources: &[&str]) -> Server {
        Server::start_with_env(data, demo_start_ms, sources, &[]).await
    }

    /// Starts the server on `data` with the arguments `args` (the machines first: `--demo`, `--ray URL`)
    /// and the environment variables `env` besides the tests' own.
    pub async fn start_with_env(
        data: &Path,
        demo_start_ms: u64,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Server {
        let launch = Server::launch(
            Path::new(env!("CARGO_BIN_EXE_tessera")),
            data,
            demo_start_ms,
            args,
            env,
        );
        Server::start_as(launch).await
    }

    /// How the server `program` is started on `data`: as [`Server::start_with_env`] says, on a socket of
    /// its own.
    pub fn launch(
        program: &Path,
        data: &Path,
        demo_start_ms: u64,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Launch {
        let socket = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = socket.local_addr().unwrap().port();
        let mut all: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        all.extend([
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            "--data-dir".to_owned(),
            data.display().to_string(),
        ]);
        // Fast supervisor timings, each but those `args` set.
        for [flag, value] in [
            ["--health-interval-ms", "50"],
            ["--stop-timeout-ms", "3000"],
            ["--restart-backoff-ms", "200"],
            ["--restart-backoff-max-ms", "1000"],
            ["--max-restarts", "3"],
        ] {
            if !args.contains(&flag) {
                all.extend([flag.to_owned(), value.to_owned()]);
            }
        }
        let mut all_env = vec![(
            "TESSERA_DEMO_START_MS".to_owned(),
            demo_start_ms.to_string(),
        )];
        all_env.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        all_env.extend([
            // The server's log: warnings, or what TEST_RUST_LOG asks for (to follow a failing test).
            (
                "RUST_LOG".to_owned(),
                std::env::var("TEST_RUST_LOG").unwrap_or_else(|_| "warn".to_owned()),
            ),
            // What cargo-leptos would set; the API needs no built site.
            ("LEPTOS_OUTPUT_NAME".to_owned(), "tessera".to_owned()),
        ]);
        Launch {
            program: program.to_path_buf(),
            args: all,
            env: all_env,
            socket: Arc::new(socket),
        }
    }

    /// Starts the server as `launch` says, and waits until it answers.
    pub async fn start_as(launch: Launch) -> Server {
        let port = launch.socket.local_addr().unwrap().port();
        let data = launch
            .args
            .iter()
            .skip_while(|a| *a != "--data-dir")
            .nth(1)
            .expect("a data folder");
        let token = admin_token(Path::new(data));
        let child = launch.spawn();
        let mut server = Server {
            port,
            token,
            child,
            launch,
        };
        server.wait_answers().await;
        server
    }

    /// Waits until the server answers: a request made before waits in the socket's queue meanwhile.
    async fn wait_answers(&mut self) {
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the server exited as it started: {status}");
            }
            let health = tokio::time::timeout(
                Duration::from_secs(1),
                request_bytes(self.port, Some(&self.token), "GET", "/api/health", None),
            );
            if matches!(health.await, Ok((200, _))) {
                return;
            }
            assert!(
                start.elapsed() < PATIENCE,
                "waited {PATIENCE:?} for the server to answer"
            );
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server runs")
    }

    /// How this server was started.
    pub fn launched(&self) -> &Launch {
        &self.launch
    }

    /// SIGKILL: the server dies without a word to its engines (its socket stays, with whoever holds it).
    pub async fn kill_9(mut self) {
        self.child.kill().await.expect("the server is killed");
    }

    /// Ctrl-C (SIGINT), as in a terminal: the server stops and takes its engines with it.
    pub async fn stop(mut self) {
        kill(self.pid(), "INT");
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("the server stops on Ctrl-C")
            .unwrap();
    }

    /// SIGTERM, as a service manager stops it: the server exits and leaves its engines running. Answers
    /// how it exited.
    pub async fn terminate(mut self) -> (Launch, std::process::ExitStatus) {
        kill(self.pid(), "TERM");
        let status = tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("the server stops on SIGTERM")
            .unwrap();
        (self.launch.clone(), status)
    }

    /// `systemctl restart`: SIGTERM, and once it has exited the same server started again on the same
    /// socket.
    pub async fn restart(self) -> Server {
        let (launch, status) = self.terminate().await;
        assert!(
            status.success(),
            "the server exits cleanly on SIGTERM: {status}"
        );
        Server::start_as(launch).await
    }

    /// A crash (SIGKILL, an OOM kill) and the service manager's restart on the same socket.
    pub async fn crash_and_restart(self) -> Server {
        let launch = self.launch.clone();
        self.kill_9().await;
        Server::start_as(launch).await
    }

    pub async fn get(&self, path: &str) -> (u16, Value) {
        let (status, bytes) = self.get_bytes(path).await;
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    pub async fn get_bytes(&self, path: &str) -> (u16, Bytes) {
        request_bytes(self.port, Some(&self.token), "GET", path, None).await
    }

    pub async fn send(&self, method: &str, path: &str, body: Value) -> (u16, Value) {
        let (status, bytes) =
            request_bytes(self.port, Some(&self.token), method, path, Some(body)).await;
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    /// A request answered with its status, its headers and its body as JSON.
    pub async fn send_full(
        &self,
        method: &str,
        path: &str,
        body: Value,
    ) -> (u16, hyper::HeaderMap, Value) {
        let (status, headers, bytes) =
            request_full(self.port, Some(&self.token), method, path, Some(body)).await;
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        (status, headers, body)
    }

    /// The engines, by model (or worker) name.
    pub async fn engines(&self) -> Vec<Value> {
        let (status, body) = self.get("/api/engines").await;
        assert_eq!(status, 200, "{body}");
        body.as_array().unwrap().clone()
    }

    pub async fn engine(&self, model: &str) -> Value {
        self.engine_if_any(model)
            .await
            .unwrap_or_else(|| panic!("no engine runs {model}"))
    }

    /// The engine of `model` once the runtime has taken up the change: what a wait polls.
    pub async fn engine_if_any(&self, model: &str) -> Option<Value> {
        self.engines()
            .await
            .into_iter()
            .find(|e| e["model"] == model || e["worker"] == model)
    }

    /// Waits until every engine is healthy and there are `count` of them.
    pub async fn wait_healthy(&self, count: usize) -> Vec<Value> {
        wait_until(&format!("{count} healthy engines"), || async {
            let engines = self.engines().await;
            engines.len() == count && engines.iter().all(|e| e["state"] == "healthy")
        })
        .await;
        self.engines().await
    }

    /// Follows `GET /api/events` from now on.
    pub async fn follow_events(&self) -> Events {
        let mut sender = connect(self.port).await.expect("the server listens");
        let request = hyper::Request::get("/api/events")
            .header(hyper::header::HOST, "127.0.0.1")
            .header(
                hyper::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .body(Full::new(Bytes::new()))
            .unwrap();
        let response = sender.send_request(request).await.unwrap();
        assert_eq!(response.status(), 200);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = seen.clone();
        tokio::spawn(async move {
            let _sender = sender;
            let mut body = response.into_body();
            let mut pending = String::new();
            while let Some(Ok(frame)) = body.frame().await {
                let Ok(data) = frame.into_data() else {
                    continue;
                };
                pending.push_str(&String::from_utf8_lossy(&data));
                while let Some(end) = pending.find("\n\n") {
                    let event: String = pending.drain(..end + 2).collect();
                    for line in event.lines() {
                        if let Some(json) = line.strip_prefix("data: ") {
                            into.lock()
                                .unwrap()
                                .push(serde_json::from_str(json).unwrap());
                        }
                    }
                }
            }
        });
        Events { seen }
    }
}

/// The events seen so far on one stream.
pub struct Events {
    seen: Arc<Mutex<Vec<Value>>>,
}

impl Events {
    pub fn all(&self) -> Vec<Value> {
        self.seen.lock().unwrap().clone()
    }
}

/// A request to anything on this machine (a demo engine, say), without credentials.
pub async fn request(port: u16, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let (status, bytes) = request_bytes(port, None, method, path, body).await;
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

/// An HTTP/1 connection to `port` on this machine, or `None` when nothing listens there.
pub async fn connect(port: u16) -> Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// A request answered with its status and raw body.
pub async fn request_bytes(
    port: u16,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Bytes) {
    let (status, _, body) = request_full(port, token, method, path, body).await;
    (status, body)
}

/// A request answered with its status, headers and raw body.
pub async fn request_full(
    port: u16,
    token: Option<&str>,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, hyper::HeaderMap, Bytes) {
    let Some(mut sender) = connect(port).await else {
        return (0, hyper::HeaderMap::new(), Bytes::new());
    };
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::CONTENT_TYPE, "application/json");
    if let Some(token) = token {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(
            body.map(|b| b.to_string()).unwrap_or_default(),
        )))
        .unwrap();
    let Ok(response) = sender.send_request(request).await else {
        return (0, hyper::HeaderMap::new(), Bytes::new());
    };
    let (parts, body) = response.into_parts();
    (
        parts.status.as_u16(),
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

/// Asks a demo engine how it was started.
pub async fn report(engine: &Value) -> Value {
    let port = engine["port"]
        .as_u64()
        .expect("a running engine has a port") as u16;
    let (status, body) = request(port, "GET", "/", None).await;
    assert_eq!(status, 200, "the demo engine on {port} reports");
    body
}

/// Polls `check` until it holds, or fails the test after [`PATIENCE`].
pub async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_within(what, PATIENCE, check).await;
}

/// Polls `check` until it holds, or fails the test after `patience`.
pub async fn wait_until_within<F, Fut>(what: &str, patience: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < patience, "waited {patience:?} for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends a signal with kill(1), as an operator would.
pub fn kill(pid: u32, signal: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill -{signal} {pid}");
}

/// The test's binary installed at `to` as dpkg writes a new version: in full beside it, then renamed over
/// it. Bytes appended after the ELF image (`version`) make it another file than one running from there.
pub fn install_binary(to: &Path, version: &str) {
    let mut bytes = std::fs::read(env!("CARGO_BIN_EXE_tessera")).unwrap();
    bytes.extend_from_slice(format!("\ntessera-test-build {version}\n").as_bytes());
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let new = to.with_extension("dpkg-new");
    std::fs::write(&new, bytes).unwrap();
    std::fs::set_permissions(&new, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&new, to).unwrap();
}

/// Every process on this machine that carries `instance` (this data folder's engines).
pub fn processes_of(instance: &str) -> Vec<u32> {
    let marker = format!("TESSERA_INSTANCE={instance}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .map(|env| env.split(|&b| b == 0).any(|v| v == marker.as_bytes()))
                .unwrap_or(false)
        })
        .filter(|pid| {
            // A zombie is gone in all but name.
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .map(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
                .unwrap_or(false)
        })
        .collect()
}

/// The parent of process `pid`, while it runs.
pub fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 2..].split(' ').nth(1)?.parse().ok()
}

/// The engine the process `pid` says it is (`TESSERA_ENGINE`): an engine's helpers inherit it.
pub fn engine_of(pid: u32) -> Option<String> {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    environ
        .split(|&b| b == 0)
        .find_map(|v| v.strip_prefix(b"TESSERA_ENGINE="))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The process `pid` in words, for a failure: the engine it says it is, its parent and its command.
pub fn describe(pid: u32) -> String {
    let engine = engine_of(pid).unwrap_or_default();
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|&b| b == 0)
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    format!(
        "PID {pid} of engine {engine:?}, parent {:?}: {command}",
        parent_of(pid)
    )
}

/// Whether the process `pid` runs (a zombie is gone in all but name).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(false)
}

/// Now, in RFC 3339 as the server's log and events write it: a test's own record lines up with theirs.
pub fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// An RFC 3339 time, comparable.
pub fn at(event: &Value) -> time::OffsetDateTime {
    time::OffsetDateTime::parse(
        event["at"].as_str().unwrap(),
        &time::format_description::well_known::Rfc3339,
    )
    .unwrap()
}

/// The group member `model`, as the API shows it.
pub async fn member(server: &Server, model: &str) -> Value {
    let (_, groups) = server.get("/api/groups").await;
    groups
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["members"].as_array().unwrap())
        .find(|m| m["name"] == model)
        .cloned()
        .unwrap_or_else(|| panic!("{model} in {groups}"))
}
