//! What the benchmark examples share: a fleet on a fresh SQLite file, its machines all remote (what is
//! measured is the server, not engines starting), an operator's API token, the whole router, machines of
//! eight H100s, catalog models that run a command, and shared workers made as the API makes them.
// Each example compiles this module and uses a part of it.
#![allow(dead_code)]

use leptos::config::LeptosOptions;
use placement::{Bytes, Gpu, GpuRequests, Inventory, Machine, RequestedResources};
use server::accounts;
use server::fleet::Fleet;
use server::input::{NewToken, NewUser, NewWorker};
use server::runtime::{Hosts, Runtime, Settings};
use server::{db, router, AppState};
use std::error::Error;
use std::sync::Arc;

/// Who the benchmarks' writes are by: an admin, as the server's own setup is.
pub fn actor() -> app::auth::Caller {
    app::auth::Caller {
        name: "bench".to_owned(),
        role: app::auth::Role::Admin,
    }
}

/// A fleet to measure.
pub struct Bench {
    /// The fleet.
    pub fleet: Arc<Fleet>,
    /// The database.
    pub pool: sqlx::SqlitePool,
    /// An operator's API token, sent as a script would.
    pub token: String,
    /// Kept for as long as the bench runs: the database is in it.
    _dir: tempfile::TempDir,
}

impl Bench {
    /// `machines` on a fresh database, with an operator named `bench`.
    pub async fn open(machines: Vec<Machine>) -> Result<Bench, Box<dyn Error>> {
        let dir = tempfile::tempdir()?;
        let pool = db::connect(None, dir.path()).await?;
        let settings = Settings::new(std::env::current_exe()?, dir.path().join("engines"));
        let runtime = Arc::new(Runtime::open(pool.clone(), settings).await?);
        let fleet = Arc::new(
            Fleet::open(
                pool.clone(),
                Inventory::new(machines)?,
                None,
                runtime,
                Hosts::default(),
            )
            .await
            .map_err(|e| e.to_string())?,
        );
        let operator = NewUser::parse(
            "bench".to_owned(),
            app::auth::Role::Operator,
            "the benchmarks' password".to_owned(),
        )?;
        accounts::create_user(&pool, &operator, "bench")
            .await
            .map_err(|e| e.to_string())?;
        let bench = NewToken::parse("bench".to_owned(), Default::default())?;
        let token = accounts::create_token(&pool, "bench", &bench, "bench")
            .await
            .map_err(|e| e.to_string())?
            .secret;
        Ok(Bench {
            fleet,
            pool,
            token,
            _dir: dir,
        })
    }

    /// The whole router over the fleet.
    pub fn router(&self) -> axum::Router {
        router(AppState::new(
            LeptosOptions::builder().output_name("tessera").build(),
            self.fleet.clone(),
            self.pool.clone(),
        ))
    }
}

/// A machine named `name` of eight 80 GB H100s, nothing held outside Tessera.
pub fn h100s(name: &str) -> Machine {
    Machine {
        name: name.to_owned(),
        cpu_cores: 128,
        memory: Bytes::gb(1024),
        all_gpus_visible: false,
        gpus: (0..8)
            .map(|index| Gpu {
                index,
                uuid: format!("GPU-{name}-{index}"),
                model: "NVIDIA H100 80GB HBM3".into(),
                vendor: "nvidia".into(),
                total: Bytes::gb(80),
                held_outside: Bytes::ZERO,
                healthy: true,
                mig: None,
            })
            .collect(),
    }
}

impl Bench {
    /// Creates a shared worker `name` of `gb` on `gpu` (`machine:index`) alone, with `cpu_cores`, as the
    /// API would.
    pub async fn shared_worker(
        &self,
        name: String,
        gb: f64,
        gpu: String,
        cpu_cores: Option<f64>,
    ) -> Result<(), Box<dyn Error>> {
        let gpu_requests = GpuRequests {
            shared: true,
            memory_gb: Some(gb),
            ids: vec![gpu],
            ..Default::default()
        };
        let worker = NewWorker::parse(
            name,
            RequestedResources {
                cpu_cores,
                memory_bytes: None,
                gpu_requests: Some(gpu_requests),
            },
            None,
            Default::default(),
        )?;
        self.fleet
            .create_worker(worker, &actor())
            .await
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl Bench {
    /// `machines` machines of eight H100s ([`numbered_h100s`]), with `workers` shared workers of 1–12 GB
    /// (`w00000` on) placed through the fleet's own writes, round the GPUs in turn.
    pub async fn h100_fleet(machines: usize, workers: usize) -> Result<Bench, Box<dyn Error>> {
        let bench = Bench::open((0..machines).map(numbered_h100s).collect()).await?;
        for n in 0..workers {
            let gpu = n % (machines * 8);
            bench
                .shared_worker(
                    format!("w{n:05}"),
                    (1 + n % 12) as f64,
                    format!("m{:04}:{}", gpu / 8, gpu % 8),
                    None,
                )
                .await?;
        }
        Ok(bench)
    }
}

/// The `n`th machine of [`Bench::h100_fleet`]: `m0000` on, eight H100s.
pub fn numbered_h100s(n: usize) -> Machine {
    h100s(&format!("m{n:04}"))
}

/// Milliseconds at the `p`th percentile of `samples`.
pub fn pct(samples: &[f64], p: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((p / 100.0) * (sorted.len() - 1) as f64).round() as usize]
}

/// A catalog model named `name` (in `group`, if any) that runs a command, with a default share of 20 %.
pub fn command_model(
    name: &str,
    group: Option<String>,
) -> Result<server::input::NewModel, Box<dyn Error>> {
    Ok(server::input::NewModel::parse(
        server::catalog::CatalogModel {
            name: name.to_owned(),
            engine: server::catalog::Engine::Command,
            default_share: placement::BasisPoints::percent(20),
            group,
            model_path: String::new(),
            system: false,
            command: Some("engine --port {port}".into()),
            args: Vec::new(),
            env: Default::default(),
            secret_env: Vec::new(),
        },
    )?)
}
