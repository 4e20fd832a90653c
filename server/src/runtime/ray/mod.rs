//! Engines as jobs of a Ray cluster: each engine one job, pinned to its machine's node by label, booking its
//! share of each GPU as that GPU's resource (so that Ray itself refuses to overbook one), and carrying in
//! its metadata what it was started for, so that a restarted server finds and adopts it. Ray never restarts
//! a job: the supervisor does, as it does a local process.
//!
//! Here: the executor, its jobs' submission and adoption. Apart: `job`, one engine's job as it runs;
//! `daemons`, the MPS daemons those jobs start and quit; `processes`, what each job reports of its
//! processes in its log.

mod daemons;
mod files;
mod job;
mod processes;

use super::executor::{Executor, Leftover, Running, StartFailure, Units};
use super::mps::MpsClients;
use super::spec::{EngineSpec, Host, Launch};
use super::Settings;
use crate::inventory::ray::{
    Job, JobRequest, RayClient, RayError, RuntimeEnv, GPU_RESOURCE, MACHINE_LABEL,
};
use async_trait::async_trait;
use job::RayJob;
use placement::sharing::MpsDaemon;
use processes::{without_report, Report, PIDS_REPORTER};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::{sleep, Instant};

#[cfg(test)]
pub(super) use processes::reported_pids;

/// The metadata keys Tessera's jobs carry.
const META_INSTANCE: &str = "tessera_instance";
const META_UNIT: &str = "tessera_unit";
const META_FINGERPRINT: &str = "tessera_fingerprint";
const META_ADDRESS: &str = "tessera_address";
const META_PORT: &str = "tessera_port";
/// On an engine's job: the machine it runs on.
const META_MACHINE: &str = "tessera_machine";
/// On an engine's job: the key it takes requests with, so that a restarted server calls it again. Whoever
/// can read the cluster's jobs can run code on every node already.
const META_KEY: &str = "tessera_key";
/// On a job that tells a GPU's MPS daemon to quit (not an engine): the GPU's UUID.
const META_MPS_QUIT: &str = "tessera_mps_quit";

const MIB: u64 = 1 << 20;

/// How many of a unit's runs keep their job in Ray's list: the one running and the one before.
const KEPT_RUNS: usize = 2;

struct Inner {
    client: RayClient,
    settings: Settings,
    instance: String,
    closing: Arc<Mutex<bool>>,
    /// The jobs of each unit's last runs, the newest last: the newest is what its log view reads; the
    /// one before stays in Ray's list, with its log and times, until the run after it begins.
    jobs: Mutex<BTreeMap<String, Vec<String>>>,
    /// The MPS daemons of the nodes' GPUs shared under MPS, with the engines that are their clients.
    mps: Mutex<MpsClients>,
    /// One gate per daemon (by pipe directory), held while a client joins it and while it is told to
    /// quit: a client waits for its own GPU's daemon to be gone, not for another GPU's.
    gates: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// What each engine's job last reported of its processes, by job.
    reports: Mutex<BTreeMap<String, Report>>,
}

/// A Ray cluster's jobs, as an [`Executor`].
#[derive(Clone)]
pub(crate) struct RayExecutor(Arc<Inner>);

impl RayExecutor {
    pub(crate) fn new(
        client: RayClient,
        settings: Settings,
        instance: String,
        closing: Arc<Mutex<bool>>,
    ) -> RayExecutor {
        RayExecutor(Arc::new(Inner {
            client,
            settings,
            instance,
            closing,
            jobs: Mutex::default(),
            mps: Mutex::default(),
            gates: Mutex::default(),
            reports: Mutex::default(),
        }))
    }

    /// Notes `job` as `unit`'s newest, and says which of its older jobs to delete now.
    fn note(&self, unit: &str, job: &str) -> Vec<String> {
        let mut jobs = self.0.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        let runs = jobs.entry(unit.to_owned()).or_default();
        if runs.last().map(String::as_str) != Some(job) {
            runs.push(job.to_owned());
        }
        let older = runs.len().saturating_sub(KEPT_RUNS);
        runs.drain(..older).collect()
    }

    /// The job `unit` runs as now, or ran as last.
    fn newest(&self, unit: &str) -> Option<String> {
        let jobs = self.0.jobs.lock().unwrap_or_else(PoisonError::into_inner);
        jobs.get(unit)?.last().cloned()
    }

    fn job(&self, unit: &str, id: String, address: String, port: u16) -> RayJob {
        self.note(unit, &id);
        self.running(unit, id, address, port)
    }

    fn running(&self, unit: &str, id: String, address: String, port: u16) -> RayJob {
        RayJob {
            executor: self.clone(),
            unit: unit.to_owned(),
            id,
            address,
            port,
            mps: None,
            over: false,
            api_key: None,
        }
    }

    /// Whether the server is shutting down: nothing starts from then on.
    fn closing(&self) -> bool {
        *self
            .0
            .closing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends every earlier job of `spec`'s unit that has not ended before its next is submitted: Ray only
    /// queues the stop of a job still waiting for its node (one that died), and when the node returns,
    /// that job starts and runs until the stop reaches it. One on the same machine is waited for (within
    /// the stop timeout and Ray's SIGKILL after it), as it would run beside the next on the same GPU; one
    /// on another machine (the engine moved off a dead node) is told to stop, and not waited for.
    async fn end_earlier(&self, spec: &EngineSpec) -> Result<(), StartFailure> {
        let deadline = Instant::now() + self.stop_grace() + Duration::from_secs(2);
        let mut told = BTreeSet::new();
        loop {
            if self.closing() {
                return Err(StartFailure::Closing);
            }
            let jobs = self
                .0
                .client
                .jobs()
                .await
                .map_err(|e| StartFailure::Unavailable(e.to_string()))?;
            let earlier: Vec<&Job> = jobs
                .iter()
                .filter(|job| {
                    !job.terminal()
                        && job.meta(META_INSTANCE) == Some(&self.0.instance)
                        && job.meta(META_UNIT) == Some(&spec.unit)
                })
                .collect();
            for id in earlier
                .iter()
                .filter_map(|job| job.submission_id.as_deref())
            {
                if !told.contains(id) {
                    match self.0.client.stop(id).await {
                        Ok(()) => {
                            told.insert(id.to_owned());
                        }
                        Err(e) => tracing::debug!("Ray job {id} not stopped: {e}"),
                    }
                }
            }
            // A job from before machines were noted counts as on this one.
            let Some(here) = earlier
                .iter()
                .rfind(|job| job.meta(META_MACHINE).is_none_or(|m| m == spec.machine))
            else {
                return Ok(());
            };
            if Instant::now() >= deadline {
                return Err(StartFailure::Unavailable(format!(
                    "its earlier Ray job {} has not ended yet ({}): it starts once that has",
                    here.submission_id.as_deref().unwrap_or_default(),
                    here.status
                )));
            }
            sleep(self.0.settings.health_interval).await;
        }
    }

    /// Refuses, for now, a start on a machine whose node is not alive, or whose GPUs are not those the
    /// engine was placed on (a node replaced under the same label): Ray would keep its job PENDING until
    /// such a node appears, and run it then, whatever Tessera wants by that time. So a machine that becomes
    /// unreachable gets no new job at all, the start under way for it included.
    async fn node_ready(&self, spec: &EngineSpec) -> Result<(), StartFailure> {
        let Host::Cluster { uuids, .. } = &spec.host else {
            return Ok(());
        };
        let nodes = self
            .0
            .client
            .nodes()
            .await
            .map_err(|e| StartFailure::Unavailable(e.to_string()))?;
        let machines = crate::inventory::ray::machines(&nodes);
        let machine = &spec.machine;
        let Some(node) = machines.iter().find(|m| &m.name == machine) else {
            return Err(StartFailure::Unavailable(format!(
                "{machine} is unreachable: no Ray node is labelled {machine} now"
            )));
        };
        if !node.alive {
            return Err(StartFailure::Unavailable(format!(
                "{machine} is unreachable: its Ray node is dead"
            )));
        }
        for index in &spec.gpus {
            let now = node
                .gpus
                .iter()
                .find(|g| g.index == *index)
                .map(|g| &g.uuid);
            if now != uuids.get(index) {
                return Err(StartFailure::Unavailable(format!(
                    "the Ray node labelled {machine} has {} as GPU {index}, not {}, which this engine was placed on: it starts once Tessera has taken up the node as it is now",
                    now.map_or("no GPU", String::as_str),
                    uuids.get(index).map_or("?", String::as_str)
                )));
            }
        }
        Ok(())
    }

    /// Whether `spec`'s job says which processes it runs as: where its node's GPUs can be read per
    /// process (real ones, or made-up ones simulated, which its demo engine allocates from).
    fn reports_processes(&self, spec: &EngineSpec) -> bool {
        spec.host.runs_daemons() || (spec.host.made_up() && self.0.settings.sim_dir.is_some())
    }

    /// Ray's wait between a job's SIGTERM and its SIGKILL: the stop timeout in whole seconds.
    fn stop_grace(&self) -> Duration {
        Duration::from_secs_f64(self.0.settings.stop_timeout.as_secs_f64().ceil().max(1.0))
    }

    /// The job `spec`'s engine runs as, launched as `launch` on `port`, and the MPS daemon it is a client
    /// of where its GPU is shared under MPS: then `launch` gets the client's variables too.
    pub(super) fn submission(
        &self,
        spec: &EngineSpec,
        launch: &mut Launch,
        port: u16,
    ) -> Result<(JobRequest, Option<MpsDaemon>), String> {
        // Where a daemon really runs: a node with made-up GPUs has none, as on the demo fleet.
        let daemon = match (&spec.mps, spec.share) {
            (Some(client), Some(share)) if spec.host.runs_daemons() => {
                let daemon = self.mps_daemon(&spec.machine, client);
                launch
                    .env
                    .extend(daemon.client_env(share, client.compute_percent));
                Some(daemon)
            }
            _ => None,
        };
        Ok((self.request(spec, launch, port, daemon.as_ref())?, daemon))
    }

    /// The job `spec`'s engine runs as, launched as `launch` on `port`; as a client of `daemon` where
    /// its GPU is shared under MPS.
    fn request(
        &self,
        spec: &EngineSpec,
        launch: &Launch,
        port: u16,
        daemon: Option<&MpsDaemon>,
    ) -> Result<JobRequest, String> {
        let Host::Cluster { address, uuids, .. } = &spec.host else {
            return Err(format!(
                "{} is not a machine of the Ray cluster",
                spec.machine
            ));
        };
        let words =
            std::iter::once(launch.program.as_str()).chain(launch.args.iter().map(String::as_str));
        let command = shlex::try_join(words).map_err(|e| {
            format!(
                "the command of {} cannot be given to a shell: {e}",
                spec.unit
            )
        })?;
        if launch.api_key.is_none() {
            return Err(format!(
                "{} has no key: an engine on a node takes only requests that carry one",
                spec.unit
            ));
        }
        let command = guarded(address, port, launch.port, &command)?;
        // No `TESSERA_INSTANCE`: a job is found again by its metadata, and a node on this very machine
        // (a head beside the server) must not have its engines taken for this machine's processes.
        let mut env_vars = launch.env.clone();
        // Ray's wait between SIGTERM and SIGKILL, per job: the engine gets Tessera's stop timeout to drain,
        // not Ray's 3 s.
        env_vars.insert(
            "RAY_JOB_STOP_WAIT_TIME_S".to_owned(),
            self.stop_grace().as_secs().to_string(),
        );
        // Its share of each GPU, booked on that GPU's resource (whole MiB, rounded down: never more than
        // the ledger placed).
        let mib = (spec.memory().get() / MIB) as f64;
        let mut resources = BTreeMap::new();
        for index in &spec.gpus {
            let uuid = uuids
                .get(index)
                .ok_or_else(|| format!("{} has no GPU {index} in the cluster", spec.machine))?;
            resources.insert(format!("{GPU_RESOURCE}{index}_{uuid}"), mib);
        }
        let mut metadata = BTreeMap::from([
            (META_INSTANCE.to_owned(), self.0.instance.clone()),
            (META_UNIT.to_owned(), spec.unit.clone()),
            (META_FINGERPRINT.to_owned(), spec.fingerprint()),
            (META_ADDRESS.to_owned(), address.clone()),
            (META_PORT.to_owned(), port.to_string()),
            (META_MACHINE.to_owned(), spec.machine.clone()),
        ]);
        if let Some(key) = &launch.api_key {
            metadata.insert(META_KEY.to_owned(), key.clone());
        }
        Ok(JobRequest {
            submission_id: submission_id(&spec.unit),
            // `exec`: the guard takes the shell's place, and Ray's stop signals reach it and the engine.
            entrypoint: match daemon {
                Some(daemon) => format!(
                    "{}\n{PIDS_REPORTER}\n{}",
                    needs_python(),
                    self.mps_entrypoint(daemon, &spec.unit, &command)?
                ),
                None if self.reports_processes(spec) => {
                    format!("{}\n{PIDS_REPORTER}\nexec {command}", needs_python())
                }
                None => format!("{}\nexec {command}", needs_python()),
            },
            runtime_env: RuntimeEnv { env_vars },
            metadata,
            entrypoint_resources: resources,
            entrypoint_label_selector: BTreeMap::from([(
                MACHINE_LABEL.to_owned(),
                spec.machine.clone(),
            )]),
        })
    }
}

/// How a job ends whose port is taken on its node: EX_TEMPFAIL, "try again", before any engine ran.
pub(super) const PORT_TAKEN: i64 = 75;

/// How a job ends that cannot listen on its node's address for another reason than a port taken (the
/// address is not the node's, say, where its node came back at another): EX_OSERR, before any engine ran.
pub(super) const CANNOT_LISTEN: i64 = 71;

/// The guard an engine runs under on its node (guard.py): it listens on the node's address and lets
/// through to the engine, on the node's loopback, only requests that carry the engine's key.
const GUARD: &str = include_str!("guard.py");

/// What an engine's job runs: `command`, listening on `engine_port` of its node's loopback, under the
/// guard on `address`:`port`. The port Tessera chose is only free on Tessera's own host, so the guard binds
/// it on its node first, and ends at once where it cannot, saying why, rather than start an engine that
/// cannot be reached: where a port is taken the next try takes others; any other failure is said as it
/// is.
fn guarded(address: &str, port: u16, engine_port: u16, command: &str) -> Result<String, String> {
    let guard = shlex::try_join([
        "python3",
        "-c",
        GUARD,
        &PORT_TAKEN.to_string(),
        &CANNOT_LISTEN.to_string(),
        address,
        &port.to_string(),
        &engine_port.to_string(),
        "--",
    ])
    .map_err(|e| format!("the address {address} cannot be given to a shell: {e}"))?;
    Ok(format!("{guard} {command}"))
}

/// The first lines of an engine's job: Python is there wherever Ray runs, but said where it is not.
fn needs_python() -> String {
    format!(
        r#"command -v python3 >/dev/null 2>&1 || {{
  echo "tessera: this node has no python3 on its PATH, which runs the guard of the engine's port" >&2
  exit {CANNOT_LISTEN}
}}"#
    )
}
/// `word` quoted for a shell.
pub(super) fn quote(word: &str) -> Result<String, String> {
    shlex::try_quote(word)
        .map(|w| w.into_owned())
        .map_err(|e| format!("{word} cannot be given to a shell: {e}"))
}

/// A job id of Tessera's for `unit`: unique (Ray keeps ended jobs), and readable in Ray's own dashboard.
fn submission_id(unit: &str) -> String {
    let name: String = unit
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("tessera_{name}_{nanos:x}")
}

fn unavailable(e: RayError) -> StartFailure {
    match e {
        // The cluster refused what was sent (a label selector, a resource it does not know): a retry would
        // not do better.
        RayError::Status { status, .. } if (400..500).contains(&status) => {
            StartFailure::Refused(e.to_string())
        }
        e => StartFailure::Unavailable(e.to_string()),
    }
}

#[async_trait]
impl Executor for RayExecutor {
    async fn port(&self, _spec: &EngineSpec) -> Result<u16, StartFailure> {
        // Free here; on another host it is only likely to be free there. One that is taken fails its start
        // and the next try gets another.
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map_err(|e| StartFailure::Refused(format!("no free port: {e}")))?;
        Ok(listener.port())
    }

    async fn start(
        &self,
        spec: &EngineSpec,
        launch: &mut Launch,
        port: u16,
    ) -> Result<Box<dyn Running>, StartFailure> {
        let (request, daemon) = self
            .submission(spec, launch, port)
            .map_err(StartFailure::Refused)?;
        self.end_earlier(spec).await?;
        let mps = daemon.map(|daemon| (spec.machine.clone(), daemon));
        // A client waits for its daemon's quit, if one is under way (it then starts a new one), and is
        // one before it is submitted: a last client leaving meanwhile leaves the daemon up.
        let gate = mps.as_ref().map(|(_, daemon)| self.gate(daemon));
        let held = match &gate {
            Some(gate) => Some(gate.lock().await),
            None => None,
        };
        if self.closing() {
            return Err(StartFailure::Closing);
        }
        // Right before the submission: the wait for earlier jobs may have outlasted the node.
        self.node_ready(spec).await?;
        if let Some((_, daemon)) = &mps {
            self.clients().join(daemon.clone(), &spec.unit);
        }
        drop(held);
        if let Err(e) = self.0.client.submit(&request).await {
            if let Some((machine, daemon)) = &mps {
                // Refused, it never ran. Otherwise Ray may have taken it before its answer was lost: it
                // is stopped, and its daemon left running under it.
                let refused =
                    matches!(&e, RayError::Status { status, .. } if (400..500).contains(status));
                if !refused {
                    if let Err(e) = self.0.client.stop(&request.submission_id).await {
                        tracing::debug!("Ray job {} not stopped: {e}", request.submission_id);
                    }
                }
                self.leave_mps(machine, daemon, &spec.unit, refused).await;
            }
            return Err(unavailable(e));
        }
        for old in self.note(&spec.unit, &request.submission_id) {
            if let Err(e) = self.0.client.delete(&old).await {
                tracing::debug!("Ray job {old} not deleted: {e}");
            }
        }
        let address = spec.host.address().to_owned();
        let mut job = self.running(&spec.unit, request.submission_id, address, port);
        job.mps = mps;
        job.api_key = launch.api_key.clone();
        Ok(Box::new(job))
    }

    async fn leftovers(&self, of: &Units) -> io::Result<Vec<Leftover>> {
        let jobs = self.0.client.jobs().await.map_err(io::Error::other)?;
        self.sweep_errands(&jobs).await;
        let mut leftovers = Vec::new();
        for job in jobs
            .into_iter()
            .filter(|job| !job.terminal() && job.meta(META_INSTANCE) == Some(&self.0.instance))
        {
            // Engines only: a job without a unit is a daemon's quit, harmless once late (it quits
            // nothing a client holds), deleted once ended.
            let (Some(unit), Some(id)) = (job.meta(META_UNIT), job.submission_id.clone()) else {
                continue;
            };
            if !of(unit) {
                continue;
            }
            let address = job.meta(META_ADDRESS).unwrap_or_default().to_owned();
            let port = job
                .meta(META_PORT)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let fingerprint = job.meta(META_FINGERPRINT).map(str::to_owned);
            let mut running = self.job(unit, id, address, port);
            running.api_key = job.meta(META_KEY).map(str::to_owned);
            // Its daemon, left running with it, is its again.
            if let Some((machine, client)) = fingerprint.as_deref().and_then(EngineSpec::mps_of) {
                let daemon = self.mps_daemon(&machine, &client);
                self.clients().join(daemon.clone(), unit);
                running.mps = Some((machine, daemon));
            }
            leftovers.push(Leftover {
                fingerprint,
                running: Box::new(running),
                unit: unit.to_owned(),
            });
        }
        Ok(leftovers)
    }

    async fn logs(&self, unit: &str, lines: usize) -> io::Result<Vec<String>> {
        let Some(id) = self.newest(unit) else {
            return Ok(Vec::new());
        };
        let logs = self.0.client.logs(&id).await.map_err(io::Error::other)?;
        let all: Vec<&str> = logs.lines().filter_map(without_report).collect();
        Ok(all[all.len().saturating_sub(lines)..]
            .iter()
            .map(|l| (*l).to_owned())
            .collect())
    }
}
