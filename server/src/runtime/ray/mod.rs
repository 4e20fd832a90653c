//! Engines as jobs of a Ray cluster: each engine one job, pinned to its machine's node by label, booking its
//! share of each GPU as that GPU's resource (so that Ray itself refuses to overbook one), and carrying in
//! its metadata what it was started for, so that a restarted server finds and adopts it. Ray never restarts
//! a job: the supervisor does, as it does a local process.
//!
//! On a GPU shared under MPS, a job first makes sure its GPU's daemon answers on the node (starting it if
//! not) and then becomes the engine, a client of it; after the GPU's last client, a job of its own pinned
//! to the node tells the daemon to quit.

use super::executor::{Executor, Leftover, Running, StartFailure};
use super::mps::MpsClients;
use super::spec::{EngineSpec, Host, Launch, MpsClient};
use super::Settings;
use crate::inventory::ray::{
    Job, JobRequest, RayClient, RayError, RuntimeEnv, GPU_RESOURCE, MACHINE_LABEL,
};
use async_trait::async_trait;
use placement::sharing::MpsDaemon;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// The metadata keys Tessera's jobs carry.
const META_INSTANCE: &str = "tessera_instance";
const META_UNIT: &str = "tessera_unit";
const META_FINGERPRINT: &str = "tessera_fingerprint";
const META_ADDRESS: &str = "tessera_address";
const META_PORT: &str = "tessera_port";
/// On an engine's job: the machine it runs on.
const META_MACHINE: &str = "tessera_machine";
/// On a job that tells a GPU's MPS daemon to quit (not an engine): the GPU's UUID.
const META_MPS_QUIT: &str = "tessera_mps_quit";

/// How long a job that tells a daemon to quit may take to be scheduled, beyond its own wait for the
/// daemon to go (the stop timeout).
const QUIT_SCHEDULING: Duration = Duration::from_secs(60);

const MIB: u64 = 1 << 20;

/// How a job's log line saying which processes its engine runs as begins.
const PIDS_MARK: &str = "tessera-pids:";

/// How many of a job's last lines are read for its last report: the reporter repeats it every 30 s.
const PIDS_TAIL: usize = 1000;

/// Run in the background by an engine's job on a node with real GPUs, before the engine takes the shell's
/// place: prints the processes of the job's process group (Ray starts each job in a session of its own)
/// whenever they change, and every 30 s, so that Tessera can tie the node's per-process GPU memory to the
/// engine from the end of its log. In a session of its own, so that it is none of them; it ends once the
/// group is empty (or with the engine, when Ray stops the job). A node without `pgrep` or `setsid`
/// reports nothing.
const PIDS_REPORTER: &str = r#"setsid sh -c 'last= n=0
while now=$(pgrep -g "$1" | tr "\n" " ") && [ -n "$now" ]; do
  if [ "$now" != "$last" ] || [ "$n" -ge 15 ]; then
    printf "tessera-pids: %s\n" "$now"
    last=$now n=0
  fi
  n=$((n + 1))
  sleep 2
done' tessera-pids "$$" </dev/null &"#;

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

/// The processes a job last reported, as read from its log.
#[derive(Clone)]
struct Report {
    pids: Vec<u32>,
    /// When its log was read (or failed to be).
    read: Instant,
    /// The processes its node's GPUs ran then.
    seen: Vec<u32>,
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
        }
    }

    /// The processes `units`' engines run as on their node, as each one's job last reported them at the
    /// end of its log (none where it reported nothing). A job's log is read once, and again (at most
    /// every `processes_reread`) once `seen`, the processes the node's GPUs run, differs from what they
    /// ran at its last read: a process its engine started since, or a PID given to another.
    pub(super) async fn processes(
        &self,
        units: &[String],
        seen: &[u32],
    ) -> Vec<(String, Vec<u32>)> {
        let mut seen = seen.to_vec();
        seen.sort_unstable();
        seen.dedup();
        let jobs: Vec<(&String, String)> = units
            .iter()
            .filter_map(|unit| Some((unit, self.newest(unit)?)))
            .collect();
        let newest: BTreeSet<String> = self
            .0
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(|runs| runs.last().cloned())
            .collect();
        let known: BTreeMap<String, Report> = {
            let mut reports = self.reports();
            reports.retain(|job, _| newest.contains(job));
            jobs.iter()
                .filter_map(|(_, id)| Some((id.clone(), reports.get(id)?.clone())))
                .collect()
        };
        let reread = self.0.settings.processes_reread;
        let mut processes = Vec::new();
        for (unit, id) in jobs {
            let last = known.get(&id);
            let pids = match last {
                Some(last) if last.seen == seen || last.read.elapsed() < reread => {
                    last.pids.clone()
                }
                _ => {
                    let reported = match self.read_report(&id).await {
                        Ok(reported) => reported,
                        Err(e) => {
                            tracing::debug!("the log of Ray job {id} could not be read: {e}");
                            None
                        }
                    };
                    // A tail without a report (or a failed read) keeps the last one.
                    let pids = reported
                        .or_else(|| last.map(|last| last.pids.clone()))
                        .unwrap_or_default();
                    self.reports().insert(
                        id,
                        Report {
                            pids: pids.clone(),
                            read: Instant::now(),
                            seen: seen.clone(),
                        },
                    );
                    pids
                }
            };
            processes.push((unit.clone(), pids));
        }
        processes
    }

    /// What job `id` last reported of its processes at the end of its log, if it has (it runs nowhere
    /// before it has started on its node).
    async fn read_report(&self, id: &str) -> Result<Option<Vec<u32>>, RayError> {
        let Some(node) = self.0.client.job(id).await?.driver_node_id else {
            return Ok(None);
        };
        let tail = self.0.client.log_tail(id, &node, PIDS_TAIL).await?;
        Ok(reported_pids(&tail))
    }

    /// Whether the server is shutting down: nothing starts from then on.
    fn closing(&self) -> bool {
        *self
            .0
            .closing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn reports(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Report>> {
        self.0
            .reports
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

    /// Ray's wait between a job's SIGTERM and its SIGKILL: the stop timeout in whole seconds.
    fn stop_grace(&self) -> Duration {
        Duration::from_secs_f64(self.0.settings.stop_timeout.as_secs_f64().ceil().max(1.0))
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, MpsClients> {
        self.0.mps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The gate of `daemon`'s GPU.
    fn gate(&self, daemon: &MpsDaemon) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.0.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates.entry(daemon.pipe_dir.clone()).or_default().clone()
    }

    /// The daemon, on `machine`'s node, of the GPU `client` runs on.
    fn mps_daemon(&self, machine: &str, client: &MpsClient) -> MpsDaemon {
        MpsDaemon::new(
            &self.0.settings.node_data_dir.display().to_string(),
            machine,
            client.index,
            &client.uuid,
        )
    }

    /// The words that run the node's MPS control program for `daemon`, with the daemon's variables and
    /// without a client's limits: those set on a daemon would become every client's default.
    fn control(&self, daemon: &MpsDaemon) -> Result<String, String> {
        let mut words = [
            "env",
            "-u",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
            "-u",
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        ]
        .map(str::to_owned)
        .to_vec();
        words.extend(daemon.env().into_iter().map(|(k, v)| format!("{k}={v}")));
        words.push(self.0.settings.mps_control.display().to_string());
        shlex::try_join(words.iter().map(String::as_str))
            .map_err(|e| format!("the MPS control program cannot be given to a shell: {e}"))
    }

    /// What a client's job runs before it becomes `command`: its GPU's daemon is asked whether it
    /// answers, and started where it does not (in a session of its own, so that it outlives this job),
    /// then waited for. Where it never answers, the engine does not start: outside MPS, CUDA would run
    /// it unlimited and say nothing. Two clients starting at once may both start it: the second start
    /// fails, and both find the first's daemon answering.
    fn mps_entrypoint(
        &self,
        daemon: &MpsDaemon,
        unit: &str,
        command: &str,
    ) -> Result<String, String> {
        let control = self.control(daemon)?;
        let why = format!(
            "the MPS daemon of GPU {} could not start (it did not answer within {:?}; its log is in {}): {unit} is not started, as outside MPS its memory share would not be enforced",
            daemon.uuid, self.0.settings.stop_timeout, daemon.log_dir
        );
        // The shared lock on the daemon's lock file is taken before it is asked and held by the engine
        // for its life (the descriptor outlives `exec`): a quit takes it exclusively, so it never stops
        // a daemon a client is starting under or runs under. The daemon itself must not hold it.
        Ok(format!(
            "mkdir -p {pipe} {log}
exec 9>>{lock}
flock -s 9
{answers}
if ! answers; then
  setsid -w {control} -d </dev/null >&2 9>&-
  {wait}
fi
exec {command}",
            answers = answers(&control),
            pipe = quote(&daemon.pipe_dir)?,
            log = quote(&daemon.log_dir)?,
            lock = quote(&lock_file(daemon))?,
            wait = self.wait_until("answers", &why)?,
        ))
    }

    /// A shell loop that waits, within the stop timeout, until `condition` holds, and else exits with
    /// `why`.
    fn wait_until(&self, condition: &str, why: &str) -> Result<String, String> {
        let tries = (self.0.settings.stop_timeout.as_millis() / 100).max(1);
        Ok(format!(
            "tries=0
until {condition}; do
  tries=$((tries + 1))
  if [ \"$tries\" -gt {tries} ]; then printf '%s\\n' {why} >&2; exit 1; fi
  sleep 0.1
done",
            why = quote(why)?,
        ))
    }

    /// The job that tells `daemon`, on `machine`'s node, to quit, pinned there: it waits until the
    /// daemon no longer answers (within the stop timeout), and fails if it still does. It quits only
    /// with the daemon's lock file to itself: a client starting or running holds it shared.
    pub(super) fn quit_request(
        &self,
        machine: &str,
        daemon: &MpsDaemon,
    ) -> Result<JobRequest, String> {
        let control = self.control(daemon)?;
        let why = format!(
            "the MPS daemon of GPU {} still answers after it was told to quit",
            daemon.uuid
        );
        let in_use = quote(&format!(
            "the MPS daemon of GPU {} has clients: it is left running",
            daemon.uuid
        ))?;
        Ok(JobRequest {
            submission_id: submission_id(&format!("mps_quit_{machine}")),
            // None answering is none to stop (it died, or the node restarted). One with clients is left
            // running: this quit may have waited for its node (a node that died comes back with its
            // queued jobs) while new clients came.
            entrypoint: format!(
                "{answers}
answers || exit 0
exec 9>>{lock}
flock -n -x 9 || {{ printf '%s\\n' {in_use} >&2; exit 1; }}
echo quit | {control} >&2
{wait}",
                answers = answers(&control),
                lock = quote(&lock_file(daemon))?,
                wait = self.wait_until("! answers", &why)?,
            ),
            runtime_env: RuntimeEnv::default(),
            metadata: BTreeMap::from([
                (META_INSTANCE.to_owned(), self.0.instance.clone()),
                (META_MPS_QUIT.to_owned(), daemon.uuid.clone()),
            ]),
            entrypoint_resources: BTreeMap::new(),
            entrypoint_label_selector: BTreeMap::from([(
                MACHINE_LABEL.to_owned(),
                machine.to_owned(),
            )]),
        })
    }

    /// Tells `daemon`, on `machine`'s node, to quit after its last client, and waits for that job. A job
    /// that did not run is stopped, not left queued to stop a daemon that later clients use.
    async fn quit(&self, machine: &str, daemon: &MpsDaemon) -> Result<(), String> {
        let request = self.quit_request(machine, daemon)?;
        let client = &self.0.client;
        if let Ok(jobs) = client.jobs().await {
            self.sweep_quits(&jobs).await;
        }
        let id = &request.submission_id;
        let submitted = client.submit(&request).await;
        let patience = QUIT_SCHEDULING + self.0.settings.stop_timeout;
        let deadline = Instant::now() + patience;
        let outcome = match submitted {
            Err(e) => Err(e.to_string()),
            Ok(()) => loop {
                match client.job(id).await {
                    Ok(job) if job.status == "SUCCEEDED" => break Ok(()),
                    Ok(job) if job.terminal() => break Err(format!("job {id}: {}", ending(&job))),
                    _ if Instant::now() >= deadline => {
                        break Err(format!("job {id} had not run after {patience:?}"))
                    }
                    _ => sleep(self.0.settings.health_interval).await,
                }
            },
        };
        if outcome.is_err() {
            // Even where the submission seemed to fail: Ray may have taken it before its answer was lost.
            if let Err(e) = client.stop(id).await {
                tracing::debug!("Ray job {id} not stopped: {e}");
            }
        }
        if let Err(e) = client.delete(id).await {
            // One stopped just now ends later: the next sweep deletes it.
            tracing::debug!("Ray job {id} not deleted: {e}");
        }
        outcome
    }

    /// Deletes this installation's quit jobs that have ended, which a stop left in Ray's list.
    async fn sweep_quits(&self, jobs: &[Job]) {
        for job in jobs {
            let ours = job.meta(META_INSTANCE) == Some(&self.0.instance);
            if let (true, true, Some(_), Some(id)) = (
                ours,
                job.terminal(),
                job.meta(META_MPS_QUIT),
                &job.submission_id,
            ) {
                if let Err(e) = self.0.client.delete(id).await {
                    tracing::debug!("Ray job {id} not deleted: {e}");
                }
            }
        }
    }

    /// `unit` is no client of `daemon` from now on; a daemon left without clients is told to quit, unless
    /// `unit`'s job may still run (its stop never saw it end): then it is left running under it.
    async fn leave_mps(&self, machine: &str, daemon: &MpsDaemon, unit: &str, ended: bool) {
        let gate = self.gate(daemon);
        let _gate = gate.lock().await;
        let Some(daemon) = self.clients().leave(unit) else {
            return;
        };
        if !ended {
            tracing::warn!(
                "{unit} may still run on {machine}: the MPS daemon of GPU {} is left running",
                daemon.uuid
            );
            return;
        }
        match self.quit(machine, &daemon).await {
            Ok(()) => tracing::info!(
                "MPS daemon of GPU {} on {machine} stopped after {unit}",
                daemon.uuid
            ),
            Err(why) => tracing::warn!(
                "MPS daemon of GPU {} on {machine} did not stop: {why}",
                daemon.uuid
            ),
        }
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
        let metadata = BTreeMap::from([
            (META_INSTANCE.to_owned(), self.0.instance.clone()),
            (META_UNIT.to_owned(), spec.unit.clone()),
            (META_FINGERPRINT.to_owned(), spec.fingerprint()),
            (META_ADDRESS.to_owned(), address.clone()),
            (META_PORT.to_owned(), port.to_string()),
            (META_MACHINE.to_owned(), spec.machine.clone()),
        ]);
        Ok(JobRequest {
            submission_id: submission_id(&spec.unit),
            // `exec`: the engine itself takes the shell's place, and Ray's stop signals reach it.
            entrypoint: match daemon {
                Some(daemon) => format!(
                    "{PIDS_REPORTER}\n{}",
                    self.mps_entrypoint(daemon, &spec.unit, &command)?
                ),
                None if spec.host.runs_daemons() => format!("{PIDS_REPORTER}\nexec {command}"),
                None => format!("exec {command}"),
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

/// The processes a job's log (or the end of it) last said its engine runs as, if it said. A report may
/// follow what the engine wrote without a newline (a progress bar's `\r`).
pub(super) fn reported_pids(logs: &str) -> Option<Vec<u32>> {
    logs.lines().rev().find_map(|line| {
        let (_, pids) = line.rsplit_once(PIDS_MARK)?;
        Some(
            pids.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
        )
    })
}

/// A log line as the log view shows it: without a report, and left out where it was one alone.
fn without_report(line: &str) -> Option<&str> {
    match line.split_once(PIDS_MARK) {
        None => Some(line),
        Some((before, _)) if before.trim().is_empty() => None,
        Some((before, _)) => Some(before),
    }
}

/// `word` quoted for a shell.
fn quote(word: &str) -> Result<String, String> {
    shlex::try_quote(word)
        .map(|w| w.into_owned())
        .map_err(|e| format!("{word} cannot be given to a shell: {e}"))
}

/// The file a daemon's clients lock shared while they start and run, and its quit locks alone.
fn lock_file(daemon: &MpsDaemon) -> String {
    format!("{}.lock", daemon.pipe_dir)
}

/// A shell function, `answers`, that succeeds while the daemon `control` speaks to answers.
fn answers(control: &str) -> String {
    format!("answers() {{ echo get_server_list | {control} >/dev/null 2>&1; }}")
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
        let address = spec.host.bind_address().to_owned();
        let mut job = self.running(&spec.unit, request.submission_id, address, port);
        job.mps = mps;
        Ok(Box::new(job))
    }

    async fn leftovers(&self) -> io::Result<Vec<Leftover>> {
        let jobs = self.0.client.jobs().await.map_err(io::Error::other)?;
        self.sweep_quits(&jobs).await;
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
            let address = job.meta(META_ADDRESS).unwrap_or_default().to_owned();
            let port = job
                .meta(META_PORT)
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let fingerprint = job.meta(META_FINGERPRINT).map(str::to_owned);
            let mut running = self.job(unit, id, address, port);
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

/// One engine's job.
struct RayJob {
    executor: RayExecutor,
    unit: String,
    id: String,
    address: String,
    port: u16,
    /// The machine and the MPS daemon it is a client of, if it is one.
    mps: Option<(String, MpsDaemon)>,
    /// Its job was seen to end.
    over: bool,
}

impl RayJob {
    fn client(&self) -> &RayClient {
        &self.executor.0.client
    }

    fn settings(&self) -> &Settings {
        &self.executor.0.settings
    }

    /// The job once it has ended; while the cluster does not answer, it is asked again.
    async fn ended(&self) -> Job {
        let mut said = false;
        loop {
            match self.client().job(&self.id).await {
                Ok(job) if job.terminal() => return job,
                Ok(_) => said = false,
                Err(e) if !said => {
                    tracing::warn!("engine {} (Ray job {}): {e}", self.unit, self.id);
                    said = true;
                }
                Err(_) => {}
            }
            sleep(self.settings().health_interval).await;
        }
    }
}

/// How a job ended, in words.
fn ending(job: &Job) -> String {
    let mut words = format!("its Ray job ended {}", job.status);
    if let Some(code) = job.driver_exit_code {
        words.push_str(&format!(" (exit status {code})"));
    }
    if let Some(message) = job.message.as_deref().filter(|m| !m.is_empty()) {
        words.push_str(&format!(": {}", message.lines().next().unwrap_or_default()));
    }
    words
}

#[async_trait]
impl Running for RayJob {
    fn pid(&self) -> Option<u32> {
        None
    }

    fn address(&self) -> (String, u16) {
        (self.address.clone(), self.port)
    }

    async fn exited(&mut self) -> String {
        let job = self.ended().await;
        self.over = true;
        ending(&job)
    }

    /// Ray sends SIGTERM to the job's process group and SIGKILL after the cluster's
    /// `RAY_JOB_STOP_WAIT_TIME_S`; the stop is over when the job is terminal.
    async fn stop(&mut self) -> Option<String> {
        let stop_timeout = self.settings().stop_timeout;
        let deadline = Instant::now() + stop_timeout;
        loop {
            match self.client().stop(&self.id).await {
                Ok(()) => break,
                Err(e) if Instant::now() >= deadline => {
                    return Some(format!("Ray job {} could not be stopped: {e}", self.id));
                }
                Err(_) => sleep(self.settings().health_interval).await,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.max(stop_timeout), self.ended()).await {
            Ok(_) => {
                self.over = true;
                None
            }
            Err(_) => Some(format!(
                "Ray job {} was not over {stop_timeout:?} after it was told to stop",
                self.id
            )),
        }
    }

    async fn clean_up(&mut self) -> Option<String> {
        // Ray ends what is left of the job's process group with the job.
        None
    }

    /// Ray keeps the ended job, with its log and times, until the unit's run after next begins. A
    /// client leaves its daemon, which quits after the last.
    async fn forget(&mut self) {
        if let Some((machine, daemon)) = self.mps.take() {
            self.executor
                .leave_mps(&machine, &daemon, &self.unit, self.over)
                .await;
        }
    }
}
