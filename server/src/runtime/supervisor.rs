//! One engine's supervisor: starts it (or adopts it after a server restart), checks its health over HTTP,
//! restarts it after a crash with exponential backoff up to a cap, and stops it gracefully (SIGTERM, then
//! SIGKILL after a timeout).

use super::process::{self, off_executor, SpawnError, Spawned, KILL, TERM};
use super::spec::{EngineSpec, Host};
use super::{EngineState, Shared};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{sleep, timeout, Instant};

/// What the runtime asks of a supervisor.
pub(super) enum Control {
    /// Stop the engine gracefully; the supervisor ends once it has exited.
    Stop,
}

/// How the supervisor begins.
pub(super) enum Begin {
    /// Start a new process.
    Start,
    /// Watch a process a previous server started, which still runs as the committed state wants.
    Adopt {
        pid: u32,
        start_ticks: u64,
        port: u16,
    },
}

/// A running engine: a child of this server, or one adopted from a previous server.
enum Proc {
    Child(Spawned),
    Adopted { pid: u32, start_ticks: u64 },
}

impl Proc {
    fn pid(&self) -> u32 {
        match self {
            Proc::Child(s) => s.pid,
            Proc::Adopted { pid, .. } => *pid,
        }
    }

    async fn leader_exited(&mut self, poll: Duration) -> String {
        match self {
            Proc::Child(s) => match s.child.wait().await {
                Ok(status) => format!("exited ({status})"),
                Err(e) => format!("could not be waited on: {e}"),
            },
            // Not our child: it cannot be waited on, only watched.
            Proc::Adopted { pid, start_ticks } => {
                while process::is_same(*pid, *start_ticks) {
                    sleep(poll).await;
                }
                "exited".to_owned()
            }
        }
    }

    /// SIGTERM to the engine, everything it started in its group and its helpers outside it, then SIGKILL
    /// after the stop timeout; see [`Proc::clean_up`].
    async fn stop(&mut self, shared: &Shared, spec: &EngineSpec) -> Option<String> {
        let settings = &shared.settings;
        let pgid = self.pid();
        let (group, escaped) = leftovers(shared, &spec.unit, pgid).await;
        process::signal(pgid, TERM);
        for &pid in &escaped {
            process::signal_one(pid, TERM);
        }
        let all_gone = async {
            self.leader_exited(settings.health_interval).await;
            gone(shared, &spec.unit, pgid).await;
        };
        if timeout(settings.stop_timeout, all_gone).await.is_err() {
            tracing::warn!(
                "engine {} did not stop within {:?}: killing it",
                spec.unit,
                settings.stop_timeout
            );
        }
        let seen = group.into_iter().chain(escaped).collect();
        self.clean_up(shared, spec, seen).await
    }

    /// Kills what is left of the engine (its group, and its helpers that left it: they may hold GPU memory
    /// the next start needs), then waits, within the stop timeout, for them to be gone and, where NVML can
    /// tell, for their GPU memory to be free. What is stuck is said, not waited for.
    async fn clean_up(
        &mut self,
        shared: &Shared,
        spec: &EngineSpec,
        mut seen: BTreeSet<u32>,
    ) -> Option<String> {
        let settings = &shared.settings;
        let pgid = self.pid();
        seen.insert(pgid);
        let (group, escaped) = leftovers(shared, &spec.unit, pgid).await;
        if !group.is_empty() {
            process::signal(pgid, KILL);
        }
        for &pid in &escaped {
            process::signal_one(pid, KILL);
        }
        seen.extend(group.into_iter().chain(escaped));
        let all_gone = async {
            self.leader_exited(settings.health_interval).await;
            gone(shared, &spec.unit, pgid).await;
        };
        if timeout(settings.stop_timeout, all_gone).await.is_err() {
            let (group, escaped) = leftovers(shared, &spec.unit, pgid).await;
            let left: Vec<String> = group.iter().chain(&escaped).map(u32::to_string).collect();
            return Some(format!(
                "PID {} outlived SIGKILL for {:?}",
                left.join(", "),
                settings.stop_timeout
            ));
        }
        memory_freed(shared, spec, &seen).await
    }
}

/// The live processes of the engine `unit` led by `pgid`: those of its process group, and those that carry
/// its name outside it (a helper that called `setsid`).
async fn leftovers(shared: &Shared, unit: &str, pgid: u32) -> (BTreeSet<u32>, BTreeSet<u32>) {
    let instance = shared.instance.clone();
    let unit = unit.to_owned();
    off_executor(move || {
        let group: BTreeSet<u32> = process::group_members(pgid).into_iter().collect();
        let escaped = process::instance_processes(&instance)
            .into_iter()
            .filter(|f| f.engine == unit && !group.contains(&f.pid))
            .map(|f| f.pid)
            .collect();
        (group, escaped)
    })
    .await
}

/// Waits until no process of the engine is left.
async fn gone(shared: &Shared, unit: &str, pgid: u32) {
    loop {
        let (group, escaped) = leftovers(shared, unit, pgid).await;
        if group.is_empty() && escaped.is_empty() {
            return;
        }
        sleep(shared.settings.health_interval).await;
    }
}

/// Waits, within the stop timeout, until none of `pids` holds memory on the engine's GPUs, where this
/// machine's GPUs can be read (the driver frees memory a moment after a process exits); says which still
/// does after that.
async fn memory_freed(shared: &Shared, spec: &EngineSpec, pids: &BTreeSet<u32>) -> Option<String> {
    let gpus = shared
        .settings
        .gpus
        .clone()
        .filter(|_| spec.host == Host::Local)?;
    let deadline = Instant::now() + shared.settings.stop_timeout;
    loop {
        let (reader, indices, pids) = (gpus.clone(), spec.gpus.clone(), pids.clone());
        let holding: Vec<(u32, u32)> = off_executor(move || {
            indices
                .into_iter()
                .flat_map(|i| {
                    reader
                        .processes_on(i)
                        .into_iter()
                        .filter(|pid| pids.contains(pid))
                        .map(move |pid| (pid, i))
                        .collect::<Vec<_>>()
                })
                .collect()
        })
        .await;
        // Free once none of them is listed.
        let &(pid, gpu) = holding.first()?;
        if Instant::now() >= deadline {
            return Some(format!(
                "PID {pid} still holds memory on GPU {gpu} {:?} after the engine stopped",
                shared.settings.stop_timeout
            ));
        }
        sleep(shared.settings.health_interval).await;
    }
}

/// Supervises `spec` until told to stop.
pub(super) async fn supervise(
    shared: Arc<Shared>,
    spec: EngineSpec,
    begin: Begin,
    mut control: mpsc::Receiver<Control>,
) {
    let settings = shared.settings.clone();
    let unit = spec.unit.clone();
    let mut failures: u32 = 0;
    let mut proc: Option<(Proc, u16)> = match begin {
        Begin::Adopt {
            pid,
            start_ticks,
            port,
        } => {
            shared.set(&unit, EngineState::Starting, Some(pid), Some(port), None);
            Some((Proc::Adopted { pid, start_ticks }, port))
        }
        Begin::Start => None,
    };
    loop {
        let (mut running, port) = match proc.take() {
            Some(p) => p,
            None => match start(&shared, &spec).await {
                Ok(p) => p,
                Err(StartFailure::Closing) => {
                    shared.set(
                        &unit,
                        EngineState::Stopped,
                        None,
                        None,
                        Some("not started: the server is shutting down".to_owned()),
                    );
                    return;
                }
                Err(StartFailure::Refused(message)) => {
                    // A recipe that cannot start will not start on a retry either.
                    shared.set(&unit, EngineState::Failed, None, None, Some(message));
                    wait_for_stop(&mut control).await;
                    shared.set(&unit, EngineState::Stopped, None, None, None);
                    return;
                }
            },
        };
        let started = Instant::now();
        let mut healthy_once = false;
        let mut failed_checks: u32 = 0;
        let mut tick = tokio::time::interval(settings.health_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let why = loop {
            tokio::select! {
                message = control.recv() => {
                    let Some(Control::Stop) = message else { return };
                    let stuck = running.stop(&shared, &spec).await;
                    shared.forget(&unit).await;
                    shared.set(&unit, EngineState::Stopped, None, None, stuck);
                    return;
                }
                how = running.leader_exited(settings.health_interval) => {
                    let stuck = running.clean_up(&shared, &spec, BTreeSet::new()).await;
                    break with_stuck(how, stuck);
                }
                _ = tick.tick() => {
                    // A loaded machine answers slowly: a probe may take longer than the interval.
                    if healthy(port, settings.health_interval.max(PROBE_TIMEOUT)).await {
                        failed_checks = 0;
                        if !healthy_once || shared.state(&unit) != Some(EngineState::Healthy) {
                            healthy_once = true;
                            failures = 0;
                            shared.set(&unit, EngineState::Healthy, Some(running.pid()), Some(port), None);
                        }
                    } else if !healthy_once {
                        if started.elapsed() > settings.start_timeout {
                            let stuck = running.stop(&shared, &spec).await;
                            break with_stuck(format!("was not healthy within {:?} of its start", settings.start_timeout), stuck);
                        }
                    } else {
                        failed_checks += 1;
                        if failed_checks == settings.unhealthy_after {
                            shared.set(&unit, EngineState::Unhealthy, Some(running.pid()), Some(port),
                                Some(format!("{failed_checks} health checks in a row failed")));
                        }
                        if failed_checks >= settings.restart_unhealthy_after {
                            let stuck = running.stop(&shared, &spec).await;
                            break with_stuck(format!("failed {failed_checks} health checks in a row"), stuck);
                        }
                    }
                }
            }
        };
        shared.forget(&unit).await;
        failures += 1;
        if failures > settings.max_restarts {
            shared.set(
                &unit,
                EngineState::Failed,
                None,
                None,
                Some(format!(
                    "{why}; it failed {failures} times in a row, so it is not restarted again"
                )),
            );
            wait_for_stop(&mut control).await;
            shared.set(&unit, EngineState::Stopped, None, None, None);
            return;
        }
        let delay = settings.backoff(failures);
        shared.count_restart(&unit);
        shared.set(
            &unit,
            EngineState::Restarting,
            None,
            None,
            Some(format!(
                "{why}; restarting in {:.1} s (attempt {failures} of {})",
                delay.as_secs_f64(),
                settings.max_restarts
            )),
        );
        tokio::select! {
            () = sleep(delay) => {}
            _ = control.recv() => {
                shared.set(&unit, EngineState::Stopped, None, None, None);
                return;
            }
        }
    }
}

/// Why a start did not get a process.
#[derive(Debug, thiserror::Error)]
enum StartFailure {
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Closing,
    /// It cannot start (and would not on a retry).
    #[error("{0}")]
    Refused(String),
}

/// Starts the engine, records it for adoption, and says so.
async fn start(shared: &Arc<Shared>, spec: &EngineSpec) -> Result<(Proc, u16), StartFailure> {
    let port = free_port().map_err(|e| StartFailure::Refused(format!("no free port: {e}")))?;
    let free = shared.free_at_start(spec);
    let launch = spec
        .launch(port, free, &shared.settings.demo_engine)
        .map_err(|e| StartFailure::Refused(e.to_string()))?;
    shared.set(&spec.unit, EngineState::Starting, None, Some(port), None);
    let spawned = {
        let (shared, launch) = (shared.clone(), launch.clone());
        let log = shared.log_path(&spec.unit);
        off_executor(move || process::spawn(&launch, &log, &shared.instance, &shared.shutting_down))
            .await
    }
    .map_err(|e| match e {
        SpawnError::Closing => StartFailure::Closing,
        SpawnError::Io(e) => {
            StartFailure::Refused(format!("could not start {}: {e}", launch.program))
        }
    })?;
    shared
        .remember(spec, spawned.pid, spawned.start_ticks, port)
        .await;
    shared.set_launch(&spec.unit, &launch);
    shared.set(
        &spec.unit,
        EngineState::Starting,
        Some(spawned.pid),
        Some(port),
        None,
    );
    Ok((Proc::Child(spawned), port))
}

/// `why` an engine went down, with what of it is stuck.
fn with_stuck(why: String, stuck: Option<String>) -> String {
    match stuck {
        Some(stuck) => format!("{why} ({stuck})"),
        None => why,
    }
}

async fn wait_for_stop(control: &mut mpsc::Receiver<Control>) {
    let _ = control.recv().await;
}

/// A port nothing listens on now, for the engine to take.
fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// `GET /health` on the engine answers 2xx within `within`.
async fn healthy(port: u16, within: Duration) -> bool {
    timeout(within, probe(port)).await.unwrap_or(false)
}

async fn probe(port: u16) -> bool {
    use http_body_util::Empty;
    use hyper_util::rt::TokioIo;
    let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let Ok((mut sender, connection)) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await
    else {
        return false;
    };
    tokio::spawn(connection);
    let request = hyper::Request::get("/health")
        .header(hyper::header::HOST, format!("127.0.0.1:{port}"))
        .body(Empty::<axum::body::Bytes>::new());
    match request {
        Ok(request) => sender
            .send_request(request)
            .await
            .is_ok_and(|r| r.status().is_success()),
        Err(_) => false,
    }
}

/// The least time a health check is given to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
