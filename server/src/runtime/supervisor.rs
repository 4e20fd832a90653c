//! One engine's supervisor: starts it (or adopts it after a server restart), checks its health over HTTP,
//! restarts it after a crash with exponential backoff up to a cap, and stops it gracefully (SIGTERM, then
//! SIGKILL after a timeout).

use super::process::{self, Spawned, KILL, TERM};
use super::spec::EngineSpec;
use super::{EngineState, Shared};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::time::{sleep, timeout, Instant};

/// What the runtime asks of a supervisor.
pub(super) enum Control {
    /// Stop the engine gracefully; answered once it has exited.
    Stop(oneshot::Sender<()>),
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

    /// Waits until it exits, and says how. What it started and left behind is killed: those processes may
    /// hold GPU memory the next start needs.
    async fn exited(&mut self, poll: Duration) -> String {
        let how = self.leader_exited(poll).await;
        let pgid = self.pid();
        if !process::group_members(pgid).is_empty() {
            process::signal(pgid, KILL);
            group_gone(pgid, poll).await;
        }
        how
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

    /// SIGTERM to the engine and everything it started, then SIGKILL after `grace`; returns once all of
    /// them have exited, which is when their GPU memory is free.
    async fn stop(&mut self, grace: Duration, poll: Duration) {
        let pgid = self.pid();
        process::signal(pgid, TERM);
        let all_gone = async {
            self.leader_exited(poll).await;
            group_gone(pgid, poll).await;
        };
        if timeout(grace, all_gone).await.is_err() {
            tracing::warn!("engine {pgid} did not stop within {grace:?}: killing it");
            process::signal(pgid, KILL);
            self.exited(poll).await;
        }
    }
}

/// Waits until no process of the group `pgid` is left.
async fn group_gone(pgid: u32, poll: Duration) {
    while !process::group_members(pgid).is_empty() {
        sleep(poll).await;
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
                Err(message) => {
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
                    let Some(Control::Stop(done)) = message else { return };
                    running.stop(settings.stop_timeout, settings.health_interval).await;
                    shared.forget(&unit).await;
                    shared.set(&unit, EngineState::Stopped, None, None, None);
                    let _ = done.send(());
                    return;
                }
                how = running.exited(settings.health_interval) => break how,
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
                            running.stop(settings.stop_timeout, settings.health_interval).await;
                            break format!("was not healthy within {:?} of its start", settings.start_timeout);
                        }
                    } else {
                        failed_checks += 1;
                        if failed_checks == settings.unhealthy_after {
                            shared.set(&unit, EngineState::Unhealthy, Some(running.pid()), Some(port),
                                Some(format!("{failed_checks} health checks in a row failed")));
                        }
                        if failed_checks >= settings.restart_unhealthy_after {
                            running.stop(settings.stop_timeout, settings.health_interval).await;
                            break format!("failed {failed_checks} health checks in a row");
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
            message = control.recv() => {
                shared.set(&unit, EngineState::Stopped, None, None, None);
                if let Some(Control::Stop(done)) = message {
                    let _ = done.send(());
                }
                return;
            }
        }
    }
}

/// Starts the engine, records it for adoption, and says so.
async fn start(shared: &Arc<Shared>, spec: &EngineSpec) -> Result<(Proc, u16), String> {
    let port = free_port().map_err(|e| format!("no free port: {e}"))?;
    let free = shared.free_at_start(spec);
    let launch = spec
        .launch(port, free, &shared.settings.demo_engine)
        .map_err(|e| e.to_string())?;
    shared.set(&spec.unit, EngineState::Starting, None, Some(port), None);
    let spawned = process::spawn(&launch, &shared.log_path(&spec.unit), &shared.instance)
        .map_err(|e| format!("could not start {}: {e}", launch.program))?;
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

async fn wait_for_stop(control: &mut mpsc::Receiver<Control>) {
    if let Some(Control::Stop(done)) = control.recv().await {
        let _ = done.send(());
    }
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
