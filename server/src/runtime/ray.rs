//! Engines as jobs of a Ray cluster: each engine one job, pinned to its machine's node by label, booking its
//! share of each GPU as that GPU's resource (so that Ray itself refuses to overbook one), and carrying in
//! its metadata what it was started for, so that a restarted server finds and adopts it. Ray never restarts
//! a job: the supervisor does, as it does a local process.

use super::executor::{Executor, Leftover, Running, StartFailure};
use super::spec::{EngineSpec, Host, Launch};
use super::Settings;
use crate::inventory::ray::{
    Job, JobRequest, RayClient, RayError, RuntimeEnv, GPU_RESOURCE, MACHINE_LABEL,
};
use async_trait::async_trait;
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::time::{sleep, Instant};

/// The metadata keys Tessera's jobs carry.
const META_INSTANCE: &str = "tessera_instance";
const META_UNIT: &str = "tessera_unit";
const META_FINGERPRINT: &str = "tessera_fingerprint";
const META_ADDRESS: &str = "tessera_address";
const META_PORT: &str = "tessera_port";

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

    fn job(&self, unit: &str, id: String, address: String, port: u16) -> Box<dyn Running> {
        self.note(unit, &id);
        self.running(unit, id, address, port)
    }

    fn running(&self, unit: &str, id: String, address: String, port: u16) -> Box<dyn Running> {
        Box::new(RayJob {
            executor: self.clone(),
            unit: unit.to_owned(),
            id,
            address,
            port,
        })
    }

    /// The job `spec`'s engine runs as, launched as `launch` on `port`.
    fn request(&self, spec: &EngineSpec, launch: &Launch, port: u16) -> Result<JobRequest, String> {
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
        let grace = self.0.settings.stop_timeout.as_secs_f64().ceil().max(1.0);
        env_vars.insert("RAY_JOB_STOP_WAIT_TIME_S".to_owned(), format!("{grace}"));
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
        ]);
        Ok(JobRequest {
            submission_id: submission_id(&spec.unit),
            // `exec`: the engine itself takes the shell's place, and Ray's stop signals reach it.
            entrypoint: format!("exec {command}"),
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
        let request = self
            .request(spec, launch, port)
            .map_err(StartFailure::Refused)?;
        if *self
            .0
            .closing
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            return Err(StartFailure::Closing);
        }
        self.0.client.submit(&request).await.map_err(unavailable)?;
        for old in self.note(&spec.unit, &request.submission_id) {
            if let Err(e) = self.0.client.delete(&old).await {
                tracing::debug!("Ray job {old} not deleted: {e}");
            }
        }
        let address = spec.host.bind_address().to_owned();
        Ok(self.running(&spec.unit, request.submission_id, address, port))
    }

    async fn leftovers(&self) -> io::Result<Vec<Leftover>> {
        let jobs = self.0.client.jobs().await.map_err(io::Error::other)?;
        Ok(jobs
            .into_iter()
            .filter(|job| !job.terminal() && job.meta(META_INSTANCE) == Some(&self.0.instance))
            .filter_map(|job| {
                let unit = job.meta(META_UNIT)?.to_owned();
                let id = job.submission_id.clone()?;
                let address = job.meta(META_ADDRESS).unwrap_or_default().to_owned();
                let port = job
                    .meta(META_PORT)
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(0);
                Some(Leftover {
                    fingerprint: job.meta(META_FINGERPRINT).map(str::to_owned),
                    running: self.job(&unit, id, address, port),
                    unit,
                })
            })
            .collect())
    }

    async fn logs(&self, unit: &str, lines: usize) -> io::Result<Vec<String>> {
        let Some(id) = self.newest(unit) else {
            return Ok(Vec::new());
        };
        let logs = self.0.client.logs(&id).await.map_err(io::Error::other)?;
        let all: Vec<&str> = logs.lines().collect();
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
        ending(&self.ended().await)
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
            Ok(_) => None,
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

    /// Ray keeps the ended job, with its log and times, until the unit's run after next begins.
    async fn forget(&mut self) {}
}
