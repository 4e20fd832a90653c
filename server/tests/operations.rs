//! Running Tessera for good, through the real binary as an operator would: its config file against flags
//! and environment variables, and a backup of the running server put back once it is stopped.

mod support;

use serde_json::json;
use std::path::Path;
use std::process::{Output, Stdio};
use support::Server;

/// `tessera ARGS` with `env`, the password line on standard input; none of the variables the tests set is
/// inherited from the test's own environment.
fn tessera(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"));
    for name in ["TESSERA_CONFIG", "TESSERA_DATA_DIR", "DATABASE_URL"] {
        command.env_remove(name);
    }
    let mut child = command
        .args(args)
        .envs(env.iter().copied())
        .env("RUST_LOG", "warn")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the tessera binary runs");
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), b"a long test password\n").unwrap();
    child.wait_with_output().unwrap()
}

fn said(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn the_config_file_sets_the_data_folder_and_a_variable_or_a_flag_wins_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    let config = at("tessera.toml");
    std::fs::write(
        &config,
        format!("# the data folder\ndata_dir = {:?}\n", at("from-file")),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    fn add(name: &str) -> [&str; 5] {
        ["user", "add", name, "--role", "admin"]
    }
    let out = tessera(&[&["--config", config][..], &add("ada")].concat(), &[]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(at("from-file/tessera.db").exists());
    let out = tessera(&add("bo"), &[("TESSERA_CONFIG", Path::new(config))]);
    assert!(out.status.success(), "{}", said(&out));
    let from_env = at("from-env");
    let out = tessera(
        &[&["--config", config][..], &add("cy")].concat(),
        &[("TESSERA_DATA_DIR", &from_env)],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert!(at("from-env/tessera.db").exists());
    let from_flag = at("from-flag");
    let out = tessera(
        &[
            &[
                "--config",
                config,
                "--data-dir",
                from_flag.to_str().unwrap(),
            ][..],
            &add("di"),
        ]
        .concat(),
        &[("TESSERA_DATA_DIR", &from_env)],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert!(at("from-flag/tessera.db").exists());
    std::fs::write(at("typo.toml"), "data_dri = \"/srv\"\n").unwrap();
    let out = tessera(
        &[
            &["--config", at("typo.toml").to_str().unwrap()][..],
            &add("ed"),
        ]
        .concat(),
        &[],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        said(&out),
        format!(
            "tessera: unknown key `data_dri` in {} (line 1); did you mean `data_dir`?\n",
            at("typo.toml").display()
        )
    );
}

/// A worker that waits for ever (no machine offers 500 GB), so that no engine starts.
async fn add_worker(server: &Server, name: &str) {
    let (status, body) = server
        .send(
            "POST",
            "/api/workers",
            json!({"name": name, "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 500}}}),
        )
        .await;
    assert_eq!(status, 201, "{body}");
}

async fn worker_names(server: &Server) -> Vec<String> {
    let (status, body) = server.get("/api/workers").await;
    assert_eq!(status, 200, "{body}");
    let mut names: Vec<String> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_of_the_running_server_holds_its_workers_and_is_restored_once_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = Server::start_with(&data, 0, &[]).await;
    for n in 0..5 {
        add_worker(&server, &format!("before-{n}")).await;
    }
    let data_dir = data.to_str().unwrap().to_owned();
    let copy = dir.path().join("backup.db");
    let copy_path = copy.to_str().unwrap().to_owned();
    // Writes go on while the copy is taken.
    let backup = tokio::task::spawn_blocking(move || {
        tessera(&["--data-dir", &data_dir, "backup", &copy_path], &[])
    });
    let mut during = 0;
    while !backup.is_finished() {
        add_worker(&server, &format!("during-{during}")).await;
        during += 1;
    }
    let out = backup.await.unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let data_dir = data.to_str().unwrap();
    let copy_path = copy.to_str().unwrap();
    let out = tessera(&["--data-dir", data_dir, "backup", copy_path], &[]);
    assert!(!out.status.success());
    assert!(said(&out).contains("already exists"), "{}", said(&out));
    add_worker(&server, "after").await;
    let out = tessera(&["--data-dir", data_dir, "restore", copy_path], &[]);
    assert!(!out.status.success(), "a restore under a running server");
    let refusal = said(&out);
    assert!(
        refusal.starts_with(&format!(
            "tessera restore: a Tessera server (pid {}) runs on the data folder {data_dir}",
            server.pid()
        )) && refusal.contains("stop it first"),
        "{refusal}"
    );
    let before_stop = worker_names(&server).await;
    assert!(before_stop.contains(&"after".to_owned()));
    server.stop().await;

    let out = tessera(&["--data-dir", data_dir, "restore", copy_path], &[]);
    assert!(out.status.success(), "{}", said(&out));
    let server = Server::start_with(&data, 0, &[]).await;
    let restored = worker_names(&server).await;
    for n in 0..5 {
        assert!(restored.contains(&format!("before-{n}")), "{restored:?}");
    }
    assert!(!restored.contains(&"after".to_owned()), "{restored:?}");
    // The copy is one moment: the workers added meanwhile are in it up to some point, none after.
    let kept = (0..during)
        .take_while(|n| restored.contains(&format!("during-{n}")))
        .count();
    assert_eq!(restored.len(), 5 + kept, "{restored:?}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tessera_doctor_passes_a_running_server_s_own_port_and_fails_one_another_program_holds() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let data = dir.path().display().to_string();
    let listen = format!("127.0.0.1:{}", server.port);
    let checked = tessera(&["--data-dir", &data, "--listen", &listen, "doctor"], &[]);
    let lines = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(checked.status.success(), "{lines}{}", said(&checked));
    assert!(
        lines.contains(&format!(
            "ok    --listen: {listen} is in use, by the Tessera that holds this data folder"
        )),
        "{lines}"
    );
    assert!(lines.contains("ok    database: intact, schema "), "{lines}");
    server.stop().await;
    // Stopped, its port is free; a port another program holds fails the check.
    let other = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held = other.local_addr().unwrap().to_string();
    let checked = tessera(&["--data-dir", &data, "--listen", &held, "doctor"], &[]);
    let lines = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert_eq!(checked.status.code(), Some(1), "{lines}");
    assert!(
        lines.contains(&format!("FAIL  --listen: {held} cannot be listened on")),
        "{lines}"
    );
    assert!(
        said(&checked).contains("tessera doctor: 1 check(s) failed"),
        "{}",
        said(&checked)
    );
}

/// Every file under `dir`, with its length and when it was last changed: but for SQLite's shared-memory
/// index (`-shm`), where any reader of a WAL database marks what it reads.
fn files(dir: &Path) -> Vec<(String, u64, Option<std::time::SystemTime>)> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let meta = e.metadata().unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            let changed = (!name.ends_with("-shm")).then(|| meta.modified().unwrap());
            (name, meta.len(), changed)
        })
        .collect();
    all.sort();
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tessera_doctor_writes_nothing_neither_a_data_folder_that_is_not_there_nor_a_lock_nor_the_database(
) {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("not-yet");
    let checked = tessera(
        &[
            "--data-dir",
            missing.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
            "doctor",
        ],
        &[],
    );
    let lines = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(
        lines.contains("ok    database: none yet in "),
        "{lines}{}",
        said(&checked)
    );
    assert!(
        !missing.exists(),
        "the doctor made the data folder: {lines}"
    );

    // A folder a server ran on and left (its write-ahead log folded back in or not, as the stop went).
    let server = Server::start(dir.path(), 100).await;
    server.stop().await;
    let before = files(dir.path());
    let data = dir.path().display().to_string();
    let checked = tessera(
        &["--data-dir", &data, "--listen", "127.0.0.1:0", "doctor"],
        &[],
    );
    let lines = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(
        lines.contains("ok    database: intact, schema "),
        "{lines}{}",
        said(&checked)
    );
    assert_eq!(files(dir.path()), before, "{lines}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tessera_check_finds_a_running_server_as_its_database_rebuilds_it_and_names_a_worker_changed_behind_its_back(
) {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    add_worker(&server, "w1").await;
    add_worker(&server, "w2").await;
    let data = dir.path().display().to_string();
    let listen = format!("127.0.0.1:{}", server.port);
    let check = |token: Option<&str>| {
        let env: Vec<(&str, &Path)> = token
            .map(|t| ("TESSERA_TOKEN", Path::new(t)))
            .into_iter()
            .collect();
        tessera(&["--data-dir", &data, "--listen", &listen, "check"], &env)
    };
    let without = check(None);
    assert_eq!(without.status.code(), Some(1));
    assert!(
        said(&without).contains("give an admin's API token in $TESSERA_TOKEN"),
        "{}",
        said(&without)
    );
    let checked = check(Some(&server.token));
    let lines = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(checked.status.success(), "{lines}{}", said(&checked));
    assert!(lines.contains("nothing differs"), "{lines}");

    // A row changed by something other than the server: what it keeps is no longer its database's.
    let db = sqlx::SqlitePool::connect(&format!("sqlite://{data}/tessera.db"))
        .await
        .unwrap();
    sqlx::query("UPDATE workers SET env = '{\"FROM\":\"outside\"}' WHERE name = 'w1'")
        .execute(&db)
        .await
        .unwrap();
    db.close().await;
    let checked = check(Some(&server.token));
    let lines = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert_eq!(checked.status.code(), Some(1), "{lines}");
    assert!(
        lines.contains("kept otherwise than the database has it: worker w1 (the first kept as"),
        "{lines}"
    );
    assert!(
        lines.contains("1 changed rows are noted and not taken up"),
        "{lines}"
    );
    assert!(
        said(&checked).contains("tessera check: "),
        "{}",
        said(&checked)
    );
    server.stop().await;
}

/// `curl` with the test's own certificate authority: (its exit status, the headers and body it printed).
fn curl(cert: &Path, url: &str) -> (bool, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-D", "-", "--max-time", "5", "--cacert"])
        .arg(cert)
        .arg(url)
        .output()
        .expect("curl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn served_with_a_certificate_the_console_and_the_gateway_answer_over_https_only_with_hsts_and_secure_cookies_and_tessera_check_trusts_that_certificate_alone(
) {
    let dir = tempfile::tempdir().unwrap();
    let at = |name: &str| dir.path().join(name);
    self_signed(&at("cert.pem"), &at("key.pem"));
    let data = at("data");
    let data_dir = data.to_str().unwrap();
    let added = tessera(
        &[
            "--data-dir",
            data_dir,
            "user",
            "add",
            "ops",
            "--role",
            "admin",
        ],
        &[],
    );
    assert!(added.status.success(), "{}", said(&added));
    let token = tessera(
        &[
            "--data-dir",
            data_dir,
            "token",
            "add",
            "ops",
            "--user",
            "ops",
        ],
        &[],
    );
    let token = String::from_utf8(token.stdout).unwrap().trim().to_owned();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let gateway = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut server = tokio::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(&data)
        .args(["--gateway-listen", &format!("127.0.0.1:{gateway}")])
        .arg("--tls-cert")
        .arg(at("cert.pem"))
        .arg("--tls-key")
        .arg(at("key.pem"))
        .env("RUST_LOG", "warn")
        .env("LEPTOS_OUTPUT_NAME", "tessera")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let health = format!("https://localhost:{port}/api/health");
    support::wait_until("the server answers over https", || async {
        curl(&at("cert.pem"), &health).0
    })
    .await;
    let (_, answer) = curl(&at("cert.pem"), &health);
    assert!(
        answer.starts_with("HTTP/2 200") || answer.starts_with("HTTP/1.1 200"),
        "{answer}"
    );
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("strict-transport-security: max-age=31536000"),
        "{answer}"
    );
    // The first visit's session cookie is for https alone.
    let (_, setup) = curl(&at("cert.pem"), &format!("https://localhost:{port}/setup"));
    let cookie = setup
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("no cookie: {setup}"));
    assert!(cookie.contains("Secure"), "{cookie}");
    // Plain http gets no answer.
    let (plain, _) = curl(
        &at("cert.pem"),
        &format!("http://127.0.0.1:{port}/api/health"),
    );
    assert!(!plain);
    // The gateway's own address serves https with the same certificate, and nothing in plain.
    let models = format!("https://localhost:{gateway}/v1/models");
    support::wait_until("the gateway answers over https", || async {
        curl(&at("cert.pem"), &models).0
    })
    .await;
    let (_, answer) = curl(&at("cert.pem"), &models);
    assert!(
        answer.starts_with("HTTP/1.1 401"),
        "no key, over https: {answer}"
    );
    let (plain, _) = curl(
        &at("cert.pem"),
        &format!("http://127.0.0.1:{gateway}/v1/models"),
    );
    assert!(!plain);
    // `tessera check` speaks https to the server with the server's own certificate, and trusts no other.
    let check = |cert: &str, key: &str| {
        let listen = format!("127.0.0.1:{port}");
        let (cert, key) = (at(cert), at(key));
        let args = [
            "--data-dir",
            data_dir,
            "--listen",
            &listen,
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "check",
        ];
        tessera(&args, &[("TESSERA_TOKEN", Path::new(&token))])
    };
    let checked = check("cert.pem", "key.pem");
    let lines = String::from_utf8_lossy(&checked.stdout).into_owned();
    assert!(checked.status.success(), "{lines}{}", said(&checked));
    assert!(lines.contains("nothing differs"), "{lines}");
    self_signed(&at("other.pem"), &at("other-key.pem"));
    let refused = check("other.pem", "other-key.pem");
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        said(&refused).contains(&format!(
            "does not answer: over https with {}",
            at("other.pem").display()
        )),
        "{}",
        said(&refused)
    );
    server.kill().await.unwrap();
}

/// A self-signed certificate for localhost and 127.0.0.1 at `cert`, its key at `key`, made now.
fn self_signed(cert: &Path, key: &Path) {
    let made = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .args([
            "-days",
            "1",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(cert)
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_in_the_audit_log_names_the_client_it_came_from_behind_a_trusted_proxy_too() {
    use http_body_util::{BodyExt, Full};
    let dir = tempfile::tempdir().unwrap();
    let server =
        Server::start_with(dir.path(), 100, &["--demo", "--trusted-proxy", "127.0.0.1"]).await;
    // Straight from this machine: 127.0.0.1 is a proxy, but one that forwarded for no one.
    add_worker(&server, "direct").await;
    // Through the proxy, for a client at 203.0.113.7 (the address a client claims first is not believed).
    let mut sender = support::connect(server.port).await.unwrap();
    let body = json!({"name": "proxied", "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 500}}});
    let request = hyper::Request::builder()
        .method("POST")
        .uri("/api/workers")
        .header(hyper::header::HOST, "127.0.0.1")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(
            hyper::header::AUTHORIZATION,
            format!("Bearer {}", server.token),
        )
        .header("x-forwarded-for", "198.51.100.1, 203.0.113.7")
        .body(Full::new(hyper::body::Bytes::from(body.to_string())))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status();
    let answer = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(status, 201, "{answer:?}");
    let (status, log) = server.get("/api/audit?action=worker").await;
    assert_eq!(status, 200, "{log}");
    let clients: Vec<(String, String)> = log
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["target"].as_str().unwrap().to_owned(),
                e["client"].as_str().unwrap_or("none").to_owned(),
            )
        })
        .collect();
    assert_eq!(
        clients,
        [
            ("proxied".to_owned(), "203.0.113.7".to_owned()),
            ("direct".to_owned(), "127.0.0.1".to_owned())
        ]
    );
    server.stop().await;
}
