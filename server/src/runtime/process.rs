//! The operating system's side of an engine: starting it in a process group of its own with its output in
//! a log file, telling it apart from a reused PID, signalling it, and finding this installation's engines.
//! Linux: identity comes from `/proc`.

use super::spec::Launch;
use rustix::process::{kill_process, kill_process_group, Pid, Signal};
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};

/// The environment variable that marks an engine as this installation's (its value is the instance token
/// stored in the database), so that engines left by a crashed server are found again.
pub const INSTANCE_VAR: &str = "TESSERA_INSTANCE";

/// What of the server's own environment an engine (or an MPS daemon) inherits: what a program needs to find
/// its libraries, caches, locale and proxy, and what engines read as their own settings. Nothing else, so
/// that none of Tessera's own settings and secrets (`TESSERA_RAY_TOKEN`, `DATABASE_URL`) reaches a
/// process that runs whatever a recipe says.
const INHERITED: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "LANGUAGE",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
];
/// Prefixes of inherited names: the locale, CUDA and the driver, the engines' and their libraries' own
/// settings, and the demo engine's (`TESSERA_DEMO_*`, which stands in for an engine's).
const INHERITED_PREFIXES: &[&str] = &[
    "LC_",
    "XDG_",
    "PYTHON",
    "CUDA_",
    "NVIDIA_",
    "NCCL_",
    "HF_",
    "HUGGING_FACE_",
    "TRANSFORMERS_",
    "TORCH",
    "TRITON_",
    "VLLM_",
    "SGLANG_",
    "LLAMA_",
    "GGML_",
    "OPENBLAS_",
    "TESSERA_DEMO_",
];

/// The part of `env` (the server's environment) that an engine inherits.
pub fn inherited(
    env: impl IntoIterator<Item = (String, String)>,
) -> impl Iterator<Item = (String, String)> {
    env.into_iter().filter(|(name, _)| {
        INHERITED.contains(&name.as_str()) || INHERITED_PREFIXES.iter().any(|p| name.starts_with(p))
    })
}

/// A command for `program` that inherits only [`inherited`] of the server's environment.
pub fn command(program: impl AsRef<std::ffi::OsStr>) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(program);
    command.env_clear().envs(inherited(std::env::vars()));
    command
}

/// A started engine.
pub struct Spawned {
    /// The child, to wait on.
    pub child: tokio::process::Child,
    /// Its PID, also its process group.
    pub pid: u32,
    /// Its start time: with the PID, who it is.
    pub start_ticks: u64,
}

/// Starts `launch` with its output appended to a fresh `log` (the previous one is kept as `.prev`), in a
/// process group of its own: a Ctrl-C on the server's terminal does not reach it, and a stop reaches every
/// process it started. Refused once `closing` is set (the server is shutting down). Blocking: run it off the
/// executor.
pub fn spawn(
    launch: &Launch,
    log: &Path,
    instance: &str,
    closing: &Mutex<bool>,
) -> Result<Spawned, SpawnError> {
    if log.exists() {
        // Best effort: the last run's output is worth keeping, but not worth failing a start for.
        let _ = fs::rename(log, log.with_extension("log.prev"));
    }
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir)?;
    }
    let out = File::create(log)?;
    let err = out.try_clone()?;
    let mut command = command(&launch.program);
    command
        .args(&launch.args)
        .envs(&launch.env)
        .env(INSTANCE_VAR, instance)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    // Checked and started under one lock: once the shutdown has set `closing`, nothing starts.
    let closed = closing.lock().unwrap_or_else(PoisonError::into_inner);
    if *closed {
        return Err(SpawnError::Closing);
    }
    let child = command.spawn()?;
    drop(closed);
    let pid = child
        .id()
        .ok_or_else(|| io::Error::other("the engine exited as it started"))?;
    // Our child keeps its PID until it is waited on, zombie or not: one that exited at once has started
    // all the same, and fails as any other engine that exits.
    let start_ticks = stat_ticks(pid)
        .map(|(_, ticks)| ticks)
        .ok_or_else(|| io::Error::other("the engine exited as it started"))?;
    Ok(Spawned {
        child,
        pid,
        start_ticks,
    })
}

/// Why an engine did not start.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// The server is shutting down: nothing new starts.
    #[error("the server is shutting down")]
    Closing,
    /// The operating system refused.
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// When the process `pid` started, in clock ticks since boot (field 22 of `/proc/PID/stat`), or `None` when
/// there is no such process or it is a zombie.
pub fn start_ticks(pid: u32) -> Option<u64> {
    let (zombie, ticks) = stat_ticks(pid)?;
    (!zombie).then_some(ticks)
}

/// Whether `pid` is a zombie, and when it started.
fn stat_ticks(pid: u32) -> Option<(bool, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name (field 2) is in parentheses and may hold spaces: count from the last `)`.
    let rest = &stat[stat.rfind(')')? + 2..];
    let mut fields = rest.split(' ');
    let zombie = fields.next()? == "Z";
    // `rest` starts at field 3; field 22 is 19 further on.
    Some((zombie, fields.nth(18)?.parse().ok()?))
}

/// The live processes of the process group `pgid`: an engine and whatever it started (vLLM's workers hold
/// GPU memory too), zombies left out.
pub fn group_members(pgid: u32) -> Vec<u32> {
    all_groups()
        .into_iter()
        .filter(|&(_, group)| group == pgid)
        .map(|(pid, _)| pid)
        .collect()
}

/// Every live process on the machine with its process group.
pub fn all_groups() -> Vec<(u32, u32)> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, group_of(pid)?)))
        .collect()
}

/// Whether `pid` is still the process that started at `ticks`.
pub fn is_same(pid: u32, ticks: u64) -> bool {
    start_ticks(pid) == Some(ticks)
}

/// Sends `signal` to the engine's process group, or to the engine alone when the group is gone.
pub fn signal(pid: u32, signal: Signal) {
    let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) else {
        return;
    };
    if kill_process_group(pid, signal).is_err() {
        let _ = kill_process(pid, signal);
    }
}

/// SIGTERM.
pub const TERM: Signal = Signal::TERM;
/// SIGKILL.
pub const KILL: Signal = Signal::KILL;

/// A live process that carries this installation's instance token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its PID.
    pub pid: u32,
    /// Its process group.
    pub group: u32,
    /// The engine it says it is (`TESSERA_ENGINE`): an engine's helpers inherit it.
    pub engine: String,
}

/// Every live process that carries this installation's `instance` token: the engines and whatever they
/// started, in their groups or not (a helper that called `setsid` leaves the group, not the environment).
pub fn instance_processes(instance: &str) -> Vec<Found> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let engine = engine_of(pid, instance)?;
            let group = group_of(pid)?;
            Some(Found { pid, group, engine })
        })
        .collect()
}

/// Whether the process `pid` carries this installation's `instance` token: a recorded PID that does not is
/// some other process, which got the PID after the engine was gone.
pub fn carries(pid: u32, instance: &str) -> bool {
    engine_of(pid, instance).is_some()
}

/// The engine (`TESSERA_ENGINE`, empty when unset) that `pid` says it is, when it carries `instance`.
fn engine_of(pid: u32, instance: &str) -> Option<String> {
    // Other users' processes cannot be read, and are not ours anyway.
    let environ = fs::read(format!("/proc/{pid}/environ")).ok()?;
    let marker = format!("{INSTANCE_VAR}={instance}");
    let mut ours = false;
    let mut engine = String::new();
    for var in environ.split(|&b| b == 0) {
        let var = String::from_utf8_lossy(var);
        if var == marker {
            ours = true;
        } else if let Some(name) = var.strip_prefix("TESSERA_ENGINE=") {
            engine = name.to_owned();
        }
    }
    ours.then_some(engine)
}

/// The process group of the live process `pid`.
fn group_of(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 2..].split(' ');
    let state = fields.next()?;
    let group = fields.nth(1)?.parse().ok()?;
    (state != "Z").then_some(group)
}

/// This boot of the machine (`/proc/sys/kernel/random/boot_id`): PIDs and start times repeat after a
/// reboot, so a recorded engine is only trusted in the boot it was recorded in.
pub fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|id| id.trim().to_owned())
}

/// Sends `signal` to the process `pid` alone (one that left its engine's group).
pub fn signal_one(pid: u32, signal: Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        let _ = kill_process(pid, signal);
    }
}

/// Runs blocking work (reading `/proc` or a log, starting a process) on the blocking pool, so that it does
/// not hold up the executor's threads. A panic in `work` is raised here; work the pool cancelled (only as the
/// runtime shuts down, which drops this task too) never returns.
pub async fn off_executor<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match tokio::task::spawn_blocking(work).await {
        Ok(value) => value,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(_) => std::future::pending().await,
    }
}

/// The last `lines` lines of `log` (reading at most its last 64 KiB).
pub fn tail(log: &Path, lines: usize) -> io::Result<Vec<String>> {
    const WINDOW: u64 = 64 * 1024;
    let mut file = match File::open(log) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let len = file.metadata()?.len();
    let from = len.saturating_sub(WINDOW);
    file.seek(SeekFrom::Start(from))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)?;
    let text = String::from_utf8_lossy(&bytes);
    let mut all: Vec<&str> = text.lines().collect();
    if from > 0 && !all.is_empty() {
        // The first line was cut by the window.
        all.remove(0);
    }
    let skip = all.len().saturating_sub(lines);
    Ok(all[skip..].iter().map(|l| (*l).to_owned()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sleeper(seconds: &str) -> Launch {
        Launch {
            program: "sh".into(),
            args: vec![
                "-c".into(),
                format!("echo started; echo $TESSERA_ENGINE; sleep {seconds}"),
            ],
            env: BTreeMap::from([("TESSERA_ENGINE".into(), "unit-a".into())]),
            api_key: None,
            port: 0,
            sizing: None,
        }
    }

    #[tokio::test]
    async fn a_spawned_engine_is_known_by_pid_and_start_time_and_found_by_its_instance() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("a.log");
        let mut spawned = spawn(
            &sleeper("30"),
            &log,
            "instance-under-test",
            &Mutex::new(false),
        )
        .unwrap();
        assert!(is_same(spawned.pid, spawned.start_ticks));
        assert!(
            !is_same(spawned.pid, spawned.start_ticks + 1),
            "another start time is another process"
        );
        // Until sh has exec'd, /proc shows the parent's environment: wait for its first lines.
        while tail(&log, 10).unwrap().len() < 2 {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        let found = instance_processes("instance-under-test");
        assert!(
            found.contains(&Found {
                pid: spawned.pid,
                group: spawned.pid,
                engine: "unit-a".to_owned()
            }),
            "{found:?}"
        );
        assert!(carries(spawned.pid, "instance-under-test"));
        assert!(!carries(std::process::id(), "instance-under-test"));
        assert!(instance_processes("another-instance").is_empty());
        // sh may have started its sleep already, which joins sh's group.
        assert!(
            group_members(spawned.pid).contains(&spawned.pid),
            "sh leads a group of its own"
        );
        signal(spawned.pid, TERM);
        let status = spawned.child.wait().await.unwrap();
        assert!(!status.success());
        assert!(!is_same(spawned.pid, spawned.start_ticks));
        assert_eq!(tail(&log, 10).unwrap(), ["started", "unit-a"]);
    }

    #[test]
    fn tail_keeps_the_last_lines_and_a_missing_log_is_empty() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("b.log");
        assert!(tail(&log, 5).unwrap().is_empty());
        let text: String = (1..=300).map(|i| format!("line {i}\n")).collect();
        fs::write(&log, text).unwrap();
        assert_eq!(tail(&log, 2).unwrap(), ["line 299", "line 300"]);
    }

    #[test]
    fn the_start_time_is_read_past_a_name_with_spaces_and_parentheses() {
        assert!(start_ticks(std::process::id()).is_some());
        assert_eq!(start_ticks(u32::MAX), None);
    }

    #[test]
    fn an_engine_inherits_what_programs_need_of_the_server_s_environment_and_none_of_tessera_s_secrets(
    ) {
        let server = [
            ("PATH", "/usr/bin"),
            ("HOME", "/var/lib/tessera"),
            ("LC_ALL", "C.UTF-8"),
            ("CUDA_HOME", "/usr/local/cuda"),
            ("HF_HOME", "/models"),
            ("VLLM_LOGGING_LEVEL", "INFO"),
            ("TESSERA_DEMO_START_MS", "3000"),
            ("TESSERA_RAY_TOKEN", "run-code-on-every-node"),
            ("TESSERA_LISTEN", "0.0.0.0:3000"),
            ("DATABASE_URL", "sqlite:///var/lib/tessera/tessera.db"),
            ("AWS_SECRET_ACCESS_KEY", "x"),
        ]
        .map(|(k, v)| (k.to_owned(), v.to_owned()));
        let names: Vec<String> = inherited(server).map(|(k, _)| k).collect();
        assert_eq!(
            names,
            [
                "PATH",
                "HOME",
                "LC_ALL",
                "CUDA_HOME",
                "HF_HOME",
                "VLLM_LOGGING_LEVEL",
                "TESSERA_DEMO_START_MS"
            ]
        );
    }

    #[tokio::test]
    async fn a_spawned_engine_sees_only_the_inherited_part_of_the_server_s_environment() {
        // cargo gives the test process (here, the server) variables of its own; none is for engines.
        assert!(std::env::var_os("CARGO_MANIFEST_DIR").is_some());
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("env.log");
        let launch = Launch {
            program: "sh".into(),
            args: vec![
                "-c".into(),
                "echo cargo=$CARGO_MANIFEST_DIR path=${PATH:+set} engine=$TESSERA_ENGINE".into(),
            ],
            env: BTreeMap::from([("TESSERA_ENGINE".into(), "unit-a".into())]),
            api_key: None,
            port: 0,
            sizing: None,
        };
        let mut spawned = spawn(&launch, &log, "instance-env", &Mutex::new(false)).unwrap();
        spawned.child.wait().await.unwrap();
        let out = std::fs::read_to_string(&log).unwrap();
        assert_eq!(out.trim(), "cargo= path=set engine=unit-a");
    }
}
