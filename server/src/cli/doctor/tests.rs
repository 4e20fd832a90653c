//! The doctor with stand-ins for each failure: a driver, programs on a path of the test's own, a database,
//! a port, a Ray head.

use super::*;
use std::os::unix::fs::PermissionsExt;

/// A driver that says what the test says.
struct StandIn(Result<DriverFacts, String>);

impl Driver for StandIn {
    fn facts(&self) -> Result<DriverFacts, String> {
        self.0.clone()
    }
}

fn no_driver() -> StandIn {
    StandIn(Err("NVML could not be loaded".to_owned()))
}

fn config_of(dir: &Path, extra: &[&str]) -> Config {
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listen.local_addr().unwrap().to_string();
    drop(listen);
    let data = dir.join("data");
    let mut args = vec![
        "tessera".to_owned(),
        "--data-dir".to_owned(),
        data.display().to_string(),
        "--listen".to_owned(),
        address,
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    Config::load_from(args, &dir.join("no-config.toml")).unwrap()
}

/// A program `name` in `dir` that prints `says` (and fails where `status` is not 0).
fn program(dir: &Path, name: &str, says: &str) {
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\necho '{says}'\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// A database in `config`'s data folder with the catalog models `models` (name, engine).
async fn database(config: &Config, models: &[(&str, &str)]) -> sqlx::SqlitePool {
    let pool = crate::db::connect(None, &config.data_dir).await.unwrap();
    for (name, engine) in models {
        sqlx::query("INSERT INTO models (name, engine, default_share) VALUES (?, ?, 1000)")
            .bind(name)
            .bind(engine)
            .execute(&pool)
            .await
            .unwrap();
    }
    pool
}

async fn findings(config: &Config, driver: &dyn Driver, path: &Path) -> Vec<Finding> {
    Checkup {
        config,
        driver,
        path: Some(path.as_os_str().to_owned()),
    }
    .run()
    .await
}

fn line<'a>(findings: &'a [Finding], what: &str) -> &'a Finding {
    findings
        .iter()
        .find(|f| f.what == what)
        .unwrap_or_else(|| panic!("no {what} line in {findings:#?}"))
}

#[tokio::test]
async fn without_a_driver_it_warns_and_an_engine_program_a_model_needs_is_a_failure_that_names_the_model(
) {
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    program(&bin, "vllm", "0.11.0");
    let config = config_of(dir.path(), &["--here", "atlas"]);
    database(&config, &[("glm", "vllm"), ("speech", "llamacpp")]).await;
    let found = findings(&config, &no_driver(), &bin).await;
    assert_eq!(line(&found, "NVIDIA driver").mark, Mark::Warn);
    let vllm = line(&found, "vLLM");
    assert_eq!(vllm.mark, Mark::Ok);
    assert!(vllm.said.starts_with("0.11.0 ("), "{vllm}");
    let llama = line(&found, "llama.cpp");
    assert_eq!(llama.mark, Mark::Fail);
    assert_eq!(
        llama.said,
        "llama-server is not on PATH, and speech use it: install it here, or run those models where it is"
    );
    assert_eq!(line(&found, "SGLang").mark, Mark::Ok, "no model uses it");
    assert_eq!(line(&found, "database").mark, Mark::Ok);
    assert_eq!(line(&found, "--listen").mark, Mark::Ok);
}

#[tokio::test]
async fn a_gpu_whose_mig_mode_waits_for_a_reset_or_without_persistence_mode_is_a_warning_saying_what_to_run(
) {
    let dir = tempfile::tempdir().unwrap();
    let config = config_of(dir.path(), &[]);
    let gpu = |index, mig, persistence| GpuFacts {
        index,
        name: "NVIDIA H200".to_owned(),
        mig,
        persistence,
    };
    let driver = StandIn(Ok(DriverFacts {
        version: "570.86.15".to_owned(),
        gpus: vec![
            gpu(0, Some((false, true)), Some(true)),
            gpu(1, Some((false, false)), Some(false)),
            gpu(2, Some((true, true)), Some(true)),
        ],
    }));
    let found = findings(&config, &driver, dir.path()).await;
    assert_eq!(
        line(&found, "NVIDIA driver").to_string(),
        "ok    NVIDIA driver: 570.86.15, 3 GPU(s)"
    );
    assert_eq!(
        line(&found, "GPU 0").to_string(),
        "warn  GPU 0: NVIDIA H200, MIG mode turns on at the next GPU reset (`nvidia-smi -r -i 0`), persistence mode on"
    );
    assert_eq!(line(&found, "GPU 1").mark, Mark::Warn);
    assert!(line(&found, "GPU 1").said.contains("nvidia-smi -pm 1"));
    assert_eq!(
        line(&found, "GPU 2").to_string(),
        "ok    GPU 2: NVIDIA H200, MIG on, persistence mode on"
    );
}

#[tokio::test]
async fn a_damaged_database_or_one_from_a_newer_tessera_fails_and_says_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_of(dir.path(), &[]);
    let pool = database(&config, &[]).await;
    sqlx::query("INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) VALUES (999999, 'later', 1, x'00', 0)")
        .execute(&pool)
        .await
        .unwrap();
    pool.close().await;
    let found = findings(&config, &no_driver(), dir.path()).await;
    let database = line(&found, "database");
    assert_eq!(database.mark, Mark::Fail);
    assert!(
        database
            .said
            .starts_with("schema 999999 was written by a newer Tessera"),
        "{database}"
    );

    let damaged = tempfile::tempdir().unwrap();
    let broken = config_of(damaged.path(), &[]);
    std::fs::create_dir_all(&broken.data_dir).unwrap();
    std::fs::write(
        broken.data_dir.join(crate::db::FILE),
        b"SQLite format 3\0 and then nothing a database holds",
    )
    .unwrap();
    let found = findings(&broken, &no_driver(), damaged.path()).await;
    assert_eq!(line(&found, "database").mark, Mark::Fail, "{found:#?}");
}

#[tokio::test]
async fn a_port_another_program_holds_fails_and_mps_without_its_control_program_fails() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let config = config_of(
        dir.path(),
        &[
            "--gateway-listen",
            &address,
            "--mps-control",
            "/nonexistent/nvidia-cuda-mps-control",
        ],
    );
    let pool = database(&config, &[]).await;
    sqlx::query("INSERT INTO gpu_sharing (machine, gpu_index, mode) VALUES ('atlas', 0, 'mps')")
        .execute(&pool)
        .await
        .unwrap();
    let found = findings(&config, &no_driver(), dir.path()).await;
    let gateway = line(&found, "--gateway-listen");
    assert_eq!(gateway.mark, Mark::Fail);
    assert!(
        gateway
            .said
            .ends_with("stop what holds it, or pass another --gateway-listen"),
        "{gateway}"
    );
    let mps = line(&found, "MPS");
    assert_eq!(mps.mark, Mark::Fail);
    assert!(mps.said.contains("atlas:0 is shared under MPS"), "{mps}");
    drop(taken);
}

#[tokio::test]
async fn a_ray_head_on_another_version_than_this_machine_s_ray_fails_and_one_that_does_not_answer_too(
) {
    use axum::routing::get;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let head = format!("http://{}", listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/api/version",
        get(|| async {
            axum::Json(
                serde_json::json!({"version": "2", "ray_version": "2.60.0", "ray_commit": "abc"}),
            )
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    let dir = tempfile::tempdir().unwrap();
    let config = config_of(dir.path(), &["--ray", &head]);
    program(dir.path(), "ray", "ray, version 2.49.0");
    let found = findings(&config, &no_driver(), dir.path()).await;
    let ray = line(&found, "Ray");
    assert_eq!(ray.mark, Mark::Fail);
    assert!(
        ray.said
            .starts_with("the head runs Ray 2.60.0, this machine `ray, version 2.49.0"),
        "{ray}"
    );
    program(dir.path(), "ray", "ray, version 2.60.0");
    let found = findings(&config, &no_driver(), dir.path()).await;
    assert_eq!(line(&found, "Ray").mark, Mark::Ok);

    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let nobody = format!("http://{}", silent.local_addr().unwrap());
    drop(silent);
    let unanswered = config_of(dir.path(), &["--ray", &nobody]);
    let found = findings(&unanswered, &no_driver(), dir.path()).await;
    assert_eq!(line(&found, "Ray").mark, Mark::Fail);
}

#[test]
fn under_a_gigabyte_free_fails_under_ten_warns() {
    const GB: u64 = 1 << 30;
    let dir = Path::new("/var/lib/tessera");
    assert_eq!(disk(dir, Some(GB / 2)).mark, Mark::Fail);
    assert_eq!(disk(dir, Some(5 * GB)).mark, Mark::Warn);
    assert_eq!(
        disk(dir, Some(50 * GB)).to_string(),
        "ok    disk: 50.0 GB free for /var/lib/tessera"
    );
    assert_eq!(disk(dir, None).mark, Mark::Warn);
}
