//! `tessera doctor`: checks this machine for what Tessera needs and says what to fix, one line each, with an
//! exit code (1 where anything fails; a warning alone does not). What it checks: NVML and the driver (its
//! version, the GPUs, each one's MIG mode and persistence mode), NVIDIA's MPS control program where a GPU
//! is shared under MPS, the engines' programs (vLLM, SGLang, llama.cpp's server) and their versions where
//! engines run here, the free disk of the data folder, the ports, the Ray head and its version against this
//! machine's Ray where `--ray` is given, and the database's integrity and schema version. It changes
//! nothing: the database is opened as it is, never migrated.

use crate::config::Config;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mark {
    /// As it should be.
    Ok,
    /// Works, but worth a look.
    Warn,
    /// Tessera cannot do its work here until it is fixed.
    Fail,
}

/// One line of the doctor's report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// How it came out.
    pub mark: Mark,
    /// What was checked.
    pub what: String,
    /// What was found, and what to do where something is wrong.
    pub said: String,
}

impl Finding {
    fn new(mark: Mark, what: &str, said: impl Into<String>) -> Finding {
        Finding {
            mark,
            what: what.to_owned(),
            said: said.into(),
        }
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mark = match self.mark {
            Mark::Ok => "ok  ",
            Mark::Warn => "warn",
            Mark::Fail => "FAIL",
        };
        write!(f, "{mark}  {}: {}", self.what, self.said)
    }
}

pub use crate::inventory::nvml::{DriverFacts, GpuFacts};

/// Reads the driver: NVML on a real machine, a stand-in in the tests.
pub trait Driver {
    /// The driver's facts, or why they cannot be read.
    fn facts(&self) -> Result<DriverFacts, String>;
}

/// The real driver, through NVML.
pub struct Nvml;

impl Driver for Nvml {
    fn facts(&self) -> Result<DriverFacts, String> {
        crate::inventory::nvml::driver_facts()
    }
}

/// Where the doctor looks: the server's configuration, the driver, the programs on `path` (`PATH`).
pub struct Checkup<'a> {
    /// The server's flags and config file, as `tessera` would start with them.
    pub config: &'a Config,
    /// The GPUs' driver.
    pub driver: &'a dyn Driver,
    /// Where programs are looked for.
    pub path: Option<OsString>,
}

/// `tessera doctor`: prints a line per check; an error (so exit status 1) where any failed.
pub async fn doctor(config: &Config) -> Result<(), String> {
    let checkup = Checkup {
        config,
        driver: &Nvml,
        path: std::env::var_os("PATH"),
    };
    let findings = checkup.run().await;
    for finding in &findings {
        println!("{finding}");
    }
    let failed = findings.iter().filter(|f| f.mark == Mark::Fail).count();
    match failed {
        0 => Ok(()),
        n => Err(format!(
            "{n} check(s) failed; fix what the lines marked FAIL say"
        )),
    }
}

impl Checkup<'_> {
    /// Every check, in order.
    pub async fn run(&self) -> Vec<Finding> {
        let mut findings = Vec::new();
        let facts = self.driver.facts();
        let gpus_here = facts.as_ref().is_ok_and(|f| !f.gpus.is_empty());
        findings.extend(driver(&facts));
        let db = self.database(&mut findings).await;
        findings.extend(self.mps(db.as_ref()).await);
        if gpus_here || self.config.here.is_some() {
            findings.extend(self.engines(db.as_ref()).await);
        } else {
            findings.push(Finding::new(
                Mark::Ok,
                "engines",
                "none run on this machine (no GPU here and no --here): their programs are not needed here",
            ));
        }
        findings.push(disk(
            &self.config.data_dir,
            free_bytes(&self.config.data_dir),
        ));
        findings.extend(self.ports());
        findings.extend(self.ray().await);
        findings
    }

    /// The database: its integrity and its schema against this binary's; opened as it is.
    async fn database(&self, findings: &mut Vec<Finding>) -> Option<sqlx::SqlitePool> {
        let config = self.config;
        if config.database_url.is_none() && !config.data_dir.join(crate::db::FILE).exists() {
            findings.push(Finding::new(
                Mark::Ok,
                "database",
                format!(
                    "none yet in {}: the first start makes it",
                    config.data_dir.display()
                ),
            ));
            return None;
        }
        let pool = match crate::db::open_read_only(config.database_url.as_deref(), &config.data_dir)
            .await
        {
            Ok(pool) => pool,
            Err(e) => {
                findings.push(Finding::new(Mark::Fail, "database", e.to_string()));
                return None;
            }
        };
        let integrity: Result<String, _> = sqlx::query_scalar("PRAGMA integrity_check")
            .fetch_one(&pool)
            .await;
        match integrity {
            Ok(ok) if ok == "ok" => {}
            Ok(problem) => {
                findings.push(Finding::new(Mark::Fail, "database", format!("its integrity check says: {problem}; restore the last backup (`tessera restore FILE`)")));
                return None;
            }
            Err(e) => {
                findings.push(Finding::new(
                    Mark::Fail,
                    "database",
                    format!(
                        "it cannot be read ({e}); restore the last backup (`tessera restore FILE`)"
                    ),
                ));
                return None;
            }
        }
        let stored: Option<i64> = sqlx::query_scalar("SELECT MAX(version) FROM _sqlx_migrations")
            .fetch_one(&pool)
            .await
            .unwrap_or(None);
        let known = crate::db::MIGRATOR
            .iter()
            .map(|m| m.version)
            .max()
            .unwrap_or(0);
        findings.push(schema(stored.unwrap_or(0), known));
        Some(pool)
    }

    /// NVIDIA's MPS control program, where a GPU is shared under MPS.
    async fn mps(&self, db: Option<&sqlx::SqlitePool>) -> Vec<Finding> {
        let Some(db) = db else { return Vec::new() };
        let gpus: Vec<(String, i64)> =
            sqlx::query_as("SELECT machine, gpu_index FROM gpu_sharing WHERE mode = 'mps'")
                .fetch_all(db)
                .await
                .unwrap_or_default();
        if gpus.is_empty() {
            return Vec::new();
        }
        let program = &self.config.engines.mps_control;
        let shared: Vec<String> = gpus.iter().map(|(m, i)| format!("{m}:{i}")).collect();
        vec![match self.find(program) {
            Some(found) => Finding::new(
                Mark::Ok,
                "MPS",
                format!("{} for {}", found.display(), shared.join(", ")),
            ),
            None => Finding::new(
                Mark::Fail,
                "MPS",
                format!(
                    "{} is not found, and {} is shared under MPS: install NVIDIA's CUDA MPS (it comes with the driver's CUDA packages) or set --mps-control",
                    program.display(),
                    shared.join(", ")
                ),
            ),
        }]
    }

    /// The engines' programs, with their versions; a missing one fails where a model of the catalog
    /// needs it.
    async fn engines(&self, db: Option<&sqlx::SqlitePool>) -> Vec<Finding> {
        let needed: Vec<(String, String)> = match db {
            Some(db) => sqlx::query_as("SELECT engine, name FROM models ORDER BY name")
                .fetch_all(db)
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let mut findings = Vec::new();
        for (engine, program, version_args) in [
            ("vllm", "vllm", &["--version"][..]),
            (
                "sglang",
                "python3",
                &["-c", "import sglang; print(sglang.__version__)"][..],
            ),
            ("llamacpp", "llama-server", &["--version"][..]),
        ] {
            let users: Vec<&str> = needed
                .iter()
                .filter(|(e, _)| e == engine)
                .map(|(_, name)| name.as_str())
                .collect();
            let what = match engine {
                "vllm" => "vLLM",
                "sglang" => "SGLang",
                _ => "llama.cpp",
            };
            let version = match self.find(Path::new(program)) {
                Some(found) => version_of(&found, version_args).await,
                None => Err(format!("{program} is not on PATH")),
            };
            findings.push(match (version, users.is_empty()) {
                (Ok(version), _) => Finding::new(Mark::Ok, what, version),
                (Err(why), true) => Finding::new(
                    Mark::Ok,
                    what,
                    format!("not installed ({why}); no model of the catalog uses it"),
                ),
                (Err(why), false) => Finding::new(
                    Mark::Fail,
                    what,
                    format!(
                        "{why}, and {} use it: install it here, or run those models where it is",
                        users.join(", ")
                    ),
                ),
            });
        }
        findings
    }

    /// The addresses the server listens on: free, or held by Tessera itself.
    fn ports(&self) -> Vec<Finding> {
        let running = crate::db::backup::DataLock::is_held(&self.config.data_dir);
        let addresses = std::iter::once(("--listen", self.config.listen))
            .chain(self.config.gateway_listen.map(|a| ("--gateway-listen", a)));
        addresses
            .map(|(flag, address)| match std::net::TcpListener::bind(address) {
                Ok(_) => Finding::new(Mark::Ok, flag, format!("{address} is free")),
                Err(_) if running => Finding::new(
                    Mark::Ok,
                    flag,
                    format!("{address} is in use, by the Tessera that holds this data folder"),
                ),
                Err(_) if held_by_socket_unit(address) => Finding::new(
                    Mark::Ok,
                    flag,
                    format!("{address} is held by tessera.socket, which passes it to the server"),
                ),
                Err(e) => Finding::new(
                    Mark::Fail,
                    flag,
                    format!("{address} cannot be listened on ({e}): stop what holds it, or pass another {flag}"),
                ),
            })
            .collect()
    }

    /// The Ray head: it answers, and runs the Ray this machine has.
    async fn ray(&self) -> Vec<Finding> {
        let Some(address) = &self.config.ray else {
            return Vec::new();
        };
        let client =
            match crate::inventory::ray::RayClient::new(address, self.config.ray_token.clone()) {
                Ok(client) => client,
                Err(e) => return vec![Finding::new(Mark::Fail, "Ray", e.to_string())],
            };
        let head = match client.version().await {
            Ok(version) => version,
            Err(e) => {
                return vec![Finding::new(
                    Mark::Fail,
                    "Ray",
                    format!("{e}: start the head (`ray start --head`) or fix --ray"),
                )]
            }
        };
        let here = match self.find(Path::new("ray")) {
            Some(ray) => version_of(&ray, &["--version"]).await.ok(),
            None => None,
        };
        vec![ray_versions(&head, here.as_deref())]
    }

    /// `program` as it would be run: a path as given, a name looked for on the path.
    fn find(&self, program: &Path) -> Option<PathBuf> {
        if program.components().count() > 1 {
            return is_program(program).then(|| program.to_path_buf());
        }
        std::env::split_paths(self.path.as_ref()?)
            .map(|dir| dir.join(program))
            .find(|candidate| is_program(candidate))
    }
}

/// The driver's line and one per GPU.
fn driver(facts: &Result<DriverFacts, String>) -> Vec<Finding> {
    let facts = match facts {
        Ok(facts) => facts,
        Err(why) => return vec![Finding::new(Mark::Warn, "NVIDIA driver", why.clone())],
    };
    let mut findings = vec![Finding::new(
        Mark::Ok,
        "NVIDIA driver",
        format!("{}, {} GPU(s)", facts.version, facts.gpus.len()),
    )];
    for gpu in &facts.gpus {
        let what = format!("GPU {}", gpu.index);
        let mig = match gpu.mig {
            Some((now, next)) if now != next => Some(format!(
                "MIG mode turns {} at the next GPU reset (`nvidia-smi -r -i {}`)",
                if next { "on" } else { "off" },
                gpu.index
            )),
            Some((true, _)) => Some("MIG on".to_owned()),
            Some((false, _)) => Some("MIG off".to_owned()),
            None => None,
        };
        let persistence = gpu.persistence.map(|on| {
            if on {
                "persistence mode on"
            } else {
                "persistence mode off"
            }
        });
        let said: Vec<String> = std::iter::once(gpu.name.clone())
            .chain(mig.clone())
            .chain(persistence.map(str::to_owned))
            .collect();
        let (mark, advice) = match (gpu.persistence, &gpu.mig) {
            (_, Some((now, next))) if now != next => (Mark::Warn, ""),
            (Some(false), _) => (
                Mark::Warn,
                ": each engine's start waits for the driver to load; turn it on with `nvidia-smi -pm 1` (or the nvidia-persistenced service)",
            ),
            _ => (Mark::Ok, ""),
        };
        findings.push(Finding::new(
            mark,
            &what,
            format!("{}{advice}", said.join(", ")),
        ));
    }
    findings
}

/// The database's schema `stored` against the newest this binary knows.
fn schema(stored: i64, known: i64) -> Finding {
    match stored.cmp(&known) {
        std::cmp::Ordering::Equal => Finding::new(Mark::Ok, "database", format!("intact, schema {stored}")),
        std::cmp::Ordering::Less => Finding::new(
            Mark::Ok,
            "database",
            format!("intact, schema {stored}: the next start upgrades it to {known} (take a backup first: `tessera backup FILE`)"),
        ),
        std::cmp::Ordering::Greater => Finding::new(
            Mark::Fail,
            "database",
            format!("schema {stored} was written by a newer Tessera than this one (which knows up to {known}): run that version, or restore a backup this one made"),
        ),
    }
}

/// What the data folder's disk has free, where it can be read.
fn free_bytes(dir: &Path) -> Option<u64> {
    let probe = std::iter::successors(Some(dir), |d| d.parent()).find(|d| d.exists())?;
    let stats = rustix::fs::statvfs(probe).ok()?;
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// Whether systemd's `tessera.socket` listens on `address` (it holds the socket while no server runs).
fn held_by_socket_unit(address: std::net::SocketAddr) -> bool {
    if !std::path::Path::new("/run/systemd/system").exists() {
        return false;
    }
    std::process::Command::new("systemctl")
        .args(["show", "tessera.socket", "--property=Listen", "--value"])
        .output()
        .is_ok_and(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|line| line.trim() == format!("{address} (Stream)"))
        })
}

/// The data folder's free disk: the database, the engines' logs and backups grow there.
fn disk(dir: &Path, free: Option<u64>) -> Finding {
    const GB: u64 = 1 << 30;
    let Some(free) = free else {
        return Finding::new(
            Mark::Warn,
            "disk",
            format!("the free space of {} cannot be read", dir.display()),
        );
    };
    let said = format!(
        "{:.1} GB free for {}",
        free as f64 / GB as f64,
        dir.display()
    );
    match free {
        f if f < GB => Finding::new(
            Mark::Fail,
            "disk",
            format!("{said}: SQLite needs room to write; free some, or move --data-dir"),
        ),
        f if f < 10 * GB => Finding::new(
            Mark::Warn,
            "disk",
            format!("{said}: the engines' logs and backups need more; free some"),
        ),
        _ => Finding::new(Mark::Ok, "disk", said),
    }
}

/// The head's Ray against this machine's, which `ray start` on it would run.
fn ray_versions(head: &str, here: Option<&str>) -> Finding {
    match here {
        None => Finding::new(
            Mark::Warn,
            "Ray",
            format!("the head runs Ray {head}; Ray is not installed here (`pip install 'ray[default]=={head}'` to make this machine a node)"),
        ),
        Some(here) if here.contains(head) => {
            Finding::new(Mark::Ok, "Ray", format!("the head runs Ray {head}, as this machine does"))
        }
        Some(here) => Finding::new(
            Mark::Fail,
            "Ray",
            format!("the head runs Ray {head}, this machine `{here}`: a node must run the head's version (`pip install 'ray[default]=={head}'`)"),
        ),
    }
}

fn is_program(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The first line `program args` prints (on either stream), within 30 s.
async fn version_of(program: &Path, args: &[&str]) -> Result<String, String> {
    let run = crate::runtime::process::command(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), run)
        .await
        .map_err(|_| {
            format!(
                "{} {} did not answer within 30 s",
                program.display(),
                args.join(" ")
            )
        })?
        .map_err(|e| format!("{}: {e}", program.display()))?;
    let text = [out.stdout, out.stderr]
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect::<Vec<_>>()
        .join("\n");
    let line = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    if !out.status.success() {
        return Err(format!(
            "{} {} failed ({}): {line}",
            program.display(),
            args.join(" "),
            out.status
        ));
    }
    Ok(format!("{} ({})", line, program.display()))
}

#[cfg(test)]
mod tests;
