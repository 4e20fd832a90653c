//! A test harness: the whole router on a real SQLite file in a fresh folder, driven without a socket.

use crate::fleet::Fleet;
use crate::runtime::{Hosts, Runtime, Settings};
use crate::{db, router, AppState};
use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use leptos::config::LeptosOptions;
use serde_json::Value;
use std::sync::Arc;
use tower::ServiceExt;

/// Seed 000's majin: an 8 GB RTX 4060 whose desktop holds 1 GB, so it offers 7.
pub const MAJIN: &str = r#"
[[machine]]
name = "majin"
cpu_cores = 16
memory_gb = 64
[[machine.gpu]]
index = 0
model = "NVIDIA GeForce RTX 4060"
memory_gb = 8
held_outside_gb = 1
"#;

/// A node with two 24 GB GPUs.
const NODE: &str = r#"
[[machine]]
name = "node"
cpu_cores = 32
memory_gb = 256
[[machine.gpu]]
index = 0
model = "NVIDIA L4"
memory_gb = 24
[[machine.gpu]]
index = 1
model = "NVIDIA L4"
memory_gb = 24
"#;

/// atlas: two 96 GB GPUs.
pub const ATLAS: &str = r#"
[[machine]]
name = "atlas"
cpu_cores = 64
memory_gb = 512
[[machine.gpu]]
index = 0
model = "NVIDIA RTX PRO 6000"
memory_gb = 96
[[machine.gpu]]
index = 1
model = "NVIDIA RTX PRO 6000"
memory_gb = 96
"#;

/// hopper: two H100s, each 80 GB.
pub const HOPPER: &str = r#"
[[machine]]
name = "hopper"
cpu_cores = 64
memory_gb = 512
[[machine.gpu]]
index = 0
uuid = "GPU-0a1b"
model = "NVIDIA H100 80GB HBM3"
memory_gb = 80
[[machine.gpu]]
index = 1
uuid = "GPU-2c3d"
model = "NVIDIA H100 80GB HBM3"
memory_gb = 80
"#;

/// majin and the node: three GPUs on two machines.
pub fn majin_and_node() -> String {
    format!("{MAJIN}{NODE}")
}

/// majin and atlas, with the demo catalog: the fleet the sharing-group tests deploy onto.
pub async fn majin_and_atlas_with_catalog() -> TestApp {
    let app = TestApp::new(&format!("{MAJIN}{ATLAS}")).await;
    app.fleet
        .seed_catalog(&crate::inventory::demo::demo_catalog())
        .await
        .expect("the demo catalog");
    app
}

/// The same, with atlas this machine: its engines start here, and its GPUs can be set to MPS.
pub async fn atlas_here_with_catalog() -> TestApp {
    let app = TestApp::with_local(&format!("{MAJIN}{ATLAS}"), Some("atlas")).await;
    app.fleet
        .seed_catalog(&crate::inventory::demo::demo_catalog())
        .await
        .expect("the demo catalog");
    app
}

/// The test server's admin, as the fleet's writes take their caller.
pub fn admin() -> app::auth::Caller {
    app::auth::Caller {
        name: ADMIN.to_owned(),
        role: app::auth::Role::Admin,
    }
}

/// The server on a data folder of its own.
pub struct TestApp {
    /// The folder; kept so a restart finds the same database.
    pub dir: tempfile::TempDir,
    fleet_toml: String,
    /// The router with its state.
    pub router: Router,
    /// The fleet, for checks from the inside.
    pub fleet: Arc<Fleet>,
    /// The database.
    pub pool: sqlx::SqlitePool,
    /// An admin's API token, which [`TestApp::call`] sends.
    pub token: String,
    /// What it was started with: a restart starts the same.
    setup: Setup,
}

/// Where a test server's engines run, and how it reads this machine's GPUs.
#[derive(Clone)]
struct Setup {
    /// The machine of the inventory that is this one, if any.
    local: Option<String>,
    /// The machines of the inventory that are made up, as the demo fleet's are.
    made_up: Vec<String>,
    /// This machine's GPUs as its driver reads them, where a test gives a driver.
    gpus: Option<Arc<dyn crate::inventory::LocalGpus>>,
}

/// The admin every test server has; its password, for the tests that sign in.
pub const ADMIN: &str = "ada";
/// The admin's password.
pub const ADMIN_PASSWORD: &str = "correct horse battery";

impl TestApp {
    /// A server over the inventory in `fleet_toml`, on an empty database.
    pub async fn new(fleet_toml: &str) -> TestApp {
        TestApp::with_local(fleet_toml, None).await
    }

    /// A server over the inventory in `fleet_toml` whose machine `local` is this one: its engines are
    /// started here (a worker without a command fails to start, and nothing runs).
    pub async fn with_local(fleet_toml: &str, local: Option<&str>) -> TestApp {
        TestApp::open(fleet_toml, local, Vec::new(), None).await
    }

    /// A server over the inventory in `fleet_toml` whose machines are all made up, as the demo fleet's:
    /// demo engines stand in for what would run there, and their GPUs are cut in the inventory alone.
    pub async fn made_up(fleet_toml: &str) -> TestApp {
        let all = crate::inventory::file::parse_inventory(fleet_toml)
            .expect("a valid test inventory")
            .into_iter()
            .map(|m| m.name)
            .collect();
        TestApp::open(fleet_toml, None, all, None).await
    }

    /// A server over the inventory in `fleet_toml` whose machines `made_up` are made up (the others are
    /// remote).
    pub async fn with_made_up(fleet_toml: &str, made_up: &[&str]) -> TestApp {
        let made_up = made_up.iter().map(|&m| m.to_owned()).collect();
        TestApp::open(fleet_toml, None, made_up, None).await
    }

    /// A server on hopper as this machine, its GPUs read from [`StandInDriver`] (MIG mode on for `mig_on`
    /// at first) and changed by the stand-in `nvidia-smi` the test puts in its folder.
    pub async fn hopper_here(mig_on: &[u32]) -> TestApp {
        TestApp::open(HOPPER, Some("hopper"), Vec::new(), Some(mig_on)).await
    }

    /// A server over the inventory in `fleet_toml` on the data folder `dir`, as an earlier Tessera (or a
    /// test) left it.
    pub async fn over(dir: tempfile::TempDir, fleet_toml: &str) -> TestApp {
        TestApp::open_in(dir, fleet_toml, None, Vec::new(), None).await
    }

    async fn open(
        fleet_toml: &str,
        local: Option<&str>,
        made_up: Vec<String>,
        driver: Option<&[u32]>,
    ) -> TestApp {
        let dir = tempfile::tempdir().expect("a temporary folder");
        TestApp::open_in(dir, fleet_toml, local, made_up, driver).await
    }

    async fn open_in(
        dir: tempfile::TempDir,
        fleet_toml: &str,
        local: Option<&str>,
        made_up: Vec<String>,
        driver: Option<&[u32]>,
    ) -> TestApp {
        let gpus: Option<Arc<dyn crate::inventory::LocalGpus>> = driver.map(|mig_on| {
            Arc::new(StandInDriver {
                dir: dir.path().to_owned(),
                mig_on: mig_on.to_vec(),
            }) as Arc<dyn crate::inventory::LocalGpus>
        });
        let setup = Setup {
            local: local.map(str::to_owned),
            made_up,
            gpus,
        };
        let (router, fleet, pool) = start(dir.path(), fleet_toml, &setup).await;
        // One hash for every test server of the run: argon2 is slow by design.
        static HASH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let hash = HASH.get_or_init(|| {
            crate::accounts::hash_password(ADMIN_PASSWORD).expect("a password hash")
        });
        sqlx::query("INSERT INTO users (name, password_hash, role) VALUES (?, ?, 'admin')")
            .bind(ADMIN)
            .bind(hash)
            .execute(&pool)
            .await
            .expect("the test admin");
        let tests = crate::input::NewToken::parse("tests".to_owned(), Default::default())
            .expect("a token's name");
        let token = crate::accounts::create_token(&pool, ADMIN, &tests, "test")
            .await
            .expect("the test admin's token")
            .secret;
        TestApp {
            dir,
            fleet_toml: fleet_toml.to_owned(),
            router,
            fleet,
            pool,
            token,
            setup,
        }
    }

    /// Stops this server and starts another on the same data.
    pub async fn restart(self) -> TestApp {
        let toml = self.fleet_toml.clone();
        self.restart_with(&toml).await
    }

    /// Stops this server and starts another on the same data, over the inventory in `fleet_toml`.
    pub async fn restart_with(self, fleet_toml: &str) -> TestApp {
        let TestApp {
            dir,
            router,
            fleet,
            pool,
            token,
            setup,
            ..
        } = self;
        drop(router);
        // The old server's writes still under way end first, as they would with its process: two fleets
        // writing one database is only ever a test's doing. (A dropped request's write that committed
        // after the new fleet had read the database made the model test fail now and then.)
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while Arc::strong_count(&fleet) > 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the old fleet's writes did not end within 10 s"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
        drop((fleet, pool));
        let (router, fleet, pool) = start(dir.path(), fleet_toml, &setup).await;
        TestApp {
            dir,
            fleet_toml: fleet_toml.to_owned(),
            router,
            fleet,
            pool,
            token,
            setup,
        }
    }

    /// Sends a request as the admin; answers the status and the body as JSON (`Null` when empty).
    pub async fn call(&self, method: Method, uri: &str, body: Option<&str>) -> (StatusCode, Value) {
        self.call_with(Some(&self.token), method, uri, body).await
    }

    /// Sends a request with `token` (or none); answers the status and the body as JSON.
    pub async fn call_with(
        &self,
        token: Option<&str>,
        method: Method,
        uri: &str,
        body: Option<&str>,
    ) -> (StatusCode, Value) {
        let mut request = Request::builder().method(method).uri(uri);
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(token) = token {
            request = request.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let request = request
            .body(body.map_or_else(Body::empty, |b| Body::from(b.to_owned())))
            .expect("a request");
        let response = self.send(request).await;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a body")
            .to_bytes();
        let json = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()))
        };
        (status, json)
    }

    /// Sends a request as it is.
    pub async fn send(&self, request: Request<Body>) -> axum::response::Response {
        self.router
            .clone()
            .oneshot(request)
            .await
            .expect("an answer")
    }

    /// `POST /api/workers`.
    pub async fn post_worker(&self, body: &str) -> (StatusCode, Value) {
        self.call(Method::POST, "/api/workers", Some(body)).await
    }

    /// `GET uri`.
    pub async fn get(&self, uri: &str) -> (StatusCode, Value) {
        self.call(Method::GET, uri, None).await
    }

    /// `POST /api/deployments`.
    pub async fn deploy(&self, body: Value) -> (StatusCode, Value) {
        self.call(Method::POST, "/api/deployments", Some(&body.to_string()))
            .await
    }

    /// `PUT /api/groups/{group}/plan`.
    pub async fn put_plan(&self, group: &str, body: Value) -> (StatusCode, Value) {
        self.call(
            Method::PUT,
            &format!("/api/groups/{group}/plan"),
            Some(&body.to_string()),
        )
        .await
    }
}

/// The command line of an engine that answers its health check at once and, told to stop, takes `exit_s`
/// seconds to exit (as an engine freeing its memory does); `{port}` is left for the runtime to fill. Its
/// script is written into `dir`.
pub fn answering(dir: &std::path::Path, exit_s: f32) -> String {
    let script = dir.join("answer.py");
    std::fs::write(
        &script,
        r#"import http.server, signal, sys, time
class Ok(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
def leave(*_):
    time.sleep(float(sys.argv[2]))
    sys.exit(0)
signal.signal(signal.SIGTERM, leave)
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Ok).serve_forever()
"#,
    )
    .expect("the engine's script");
    format!("python3 {} {{port}} {exit_s}", script.display())
}

/// A shared worker asking for `gb` of one GPU.
pub fn shared_worker(name: &str, gb: f64) -> String {
    serde_json::json!({
        "name": name,
        "requested_resources": { "gpu_requests": { "count": 1, "shared": true, "memory_gb": gb } }
    })
    .to_string()
}

async fn start(
    dir: &std::path::Path,
    fleet_toml: &str,
    setup: &Setup,
) -> (Router, Arc<Fleet>, sqlx::SqlitePool) {
    let machines =
        crate::inventory::file::parse_inventory(fleet_toml).expect("a valid test inventory");
    let inventory = placement::Inventory::new(machines).expect("a consistent test inventory");
    let pool = db::connect(None, dir).await.expect("a database");
    // The test inventory's machines are remote, but for `local` and those made up: a remote machine's
    // engines are recorded, not started (the runtime's own tests start real ones).
    // `nvidia-smi` is whatever a test puts in its folder: never the machine's own.
    // The test binary stands in for the demo engine and exits at once: an engine that exits is left failed,
    // not restarted for half a minute of backoffs that every wait for the runtime to settle would sit out.
    let settings = Settings {
        nvidia_smi: dir.join("nvidia-smi"),
        gpus: setup.gpus.clone(),
        max_restarts: 0,
        ..Settings::new(
            std::env::current_exe().expect("the test binary"),
            dir.join("engines"),
        )
    };
    let runtime = Arc::new(
        Runtime::open(pool.clone(), settings)
            .await
            .expect("the runtime"),
    );
    let fleet = Arc::new(
        Fleet::open(
            pool.clone(),
            inventory,
            setup.gpus.clone(),
            runtime,
            Hosts {
                local: setup.local.clone(),
                simulated: setup.made_up.iter().cloned().collect(),
                ..Hosts::default()
            },
        )
        .await
        .expect("the fleet opens"),
    );
    let state = AppState::new(
        LeptosOptions::builder().output_name("tessera").build(),
        fleet.clone(),
        pool.clone(),
    );
    (router(state), fleet, pool)
}

/// A stand-in for `nvidia-smi` in `dir`: it writes each call's arguments to `dir/calls` (` FAILED` after
/// those it fails), says MIG mode is `mode`, and fails any call whose arguments contain `fail` (when given).
pub fn stand_in_nvidia_smi(dir: &std::path::Path, mode: &str, fail: Option<&str>) {
    use std::os::unix::fs::PermissionsExt;
    let calls = dir.join("calls");
    let log = calls.display();
    let fail = fail.map_or(String::new(), |f| {
        format!("case \"$*\" in *'{f}'*) echo \"$* FAILED\" >> '{log}'; echo 'Failed to create GPU instances: Insufficient Resources' >&2; exit 3;; esac\n")
    });
    let script = format!(
        "#!/bin/sh\n{fail}echo \"$*\" >> '{log}'\ncase \"$*\" in *--query-gpu*) echo {mode};; esac\n"
    );
    let path = dir.join("nvidia-smi");
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _ = std::fs::remove_file(calls);
}

/// What the stand-in `nvidia-smi` in `dir` was called with, one call a line.
pub fn nvidia_smi_calls(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// hopper's driver as the stand-in `nvidia-smi` in `dir` has left it: a GPU's MIG mode is what its last
/// `-mig` call set (`mig_on` before any), and its instances those its `-cgi` calls that did not fail made
/// since its last `-dgi`.
pub struct StandInDriver {
    /// Where the stand-in keeps its calls.
    pub dir: std::path::PathBuf,
    /// The GPUs whose MIG mode is on before any call.
    pub mig_on: Vec<u32>,
}

impl crate::inventory::LocalGpus for StandInDriver {
    fn read(
        &self,
        _: &crate::inventory::Ours,
    ) -> Result<crate::inventory::LocalReading, crate::inventory::InventoryError> {
        let mut machine = crate::inventory::file::parse_inventory(HOPPER)
            .expect("hopper")
            .remove(0);
        let calls = nvidia_smi_calls(&self.dir);
        let menu = &placement::mig::H100_80GB;
        let mut instances = Vec::new();
        for gpu in &mut machine.gpus {
            let index = gpu.index;
            let own: Vec<&String> = calls
                .iter()
                .filter(|c| c.contains(&format!("-i {index} ")) && !c.ends_with("FAILED"))
                .collect();
            let on = own
                .iter()
                .rev()
                .find_map(|c| {
                    c.strip_suffix("-mig 1")
                        .map(|_| true)
                        .or(c.strip_suffix("-mig 0").map(|_| false))
                })
                .unwrap_or(self.mig_on.contains(&index));
            if !on {
                continue;
            }
            gpu.mig = Some(placement::MigRole::Cut);
            gpu.held_outside = gpu.total;
            let since = own
                .iter()
                .rposition(|c| c.ends_with("-dgi"))
                .map_or(0, |p| p + 1);
            let made = own[since..].iter().filter_map(|c| {
                let id: u32 = c.split("-cgi ").nth(1)?.split(':').next()?.parse().ok()?;
                menu.profiles.iter().find(|p| p.id == id)
            });
            for (n, profile) in (0..).zip(made) {
                instances.push(placement::mig::instance(
                    gpu,
                    n,
                    profile,
                    format!("MIG-{index}-{n}"),
                ));
            }
        }
        machine.gpus.extend(instances);
        Ok(crate::inventory::LocalReading {
            machine,
            live: Vec::new(),
        })
    }
}
