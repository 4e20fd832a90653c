//! The runtime's own tests: pure rules, and engines as real processes (`sh`, `sleep`) on a real SQLite
//! file, driven through [`Runtime`] as the fleet drives it. Here the set-up they share; the tests by what
//! they test, one file each.

mod adoption;
mod cluster;
mod mps;
mod ordering;
mod rules;
mod stopping;

use super::spec::{EngineSpec, Host, Recipe};
use super::*;
use crate::catalog::Engine;
use crate::inventory::{InventoryError, LocalReading};
use placement::Bytes;
use std::path::{Path, PathBuf};
use std::time::Duration;

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
        asleep: false,
    }
}

/// An engine on GPU `gpu` of this machine that answers its health check at once and takes `exit_s` seconds
/// to exit once told to stop ([`crate::testing::answering`]).
fn answering(dir: &Path, unit: &str, gpu: u32, exit_s: f32) -> EngineSpec {
    command(unit, gpu, &crate::testing::answering(dir, exit_s))
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

/// The processes that say they are `unit` of the installation in `dir`.
fn processes_of(dir: &Path, unit: &str) -> Vec<u32> {
    process::instance_processes(&instance(dir))
        .into_iter()
        .filter(|f| f.engine == unit)
        .map(|f| f.pid)
        .collect()
}

/// The stand-in for NVIDIA's `nvidia-cuda-mps-control` (`tests/support/mps-control`): it records each
/// daemon start and stop in the daemon's log directory.
fn mps_control() -> PathBuf {
    PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/support/mps-control"
    ))
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
