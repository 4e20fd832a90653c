//! The MPS daemons of the nodes' GPUs, run through the engines' jobs. On a GPU shared under MPS, a job
//! first makes sure its GPU's daemon answers on the node (starting it if not) and then becomes the engine,
//! a client of it; after the GPU's last client, a job of its own pinned to the node tells the daemon to
//! quit. Here: the shell those jobs run, and which engine is whose client.

use super::files::META_FILES;
use super::job::ending;
use super::{quote, submission_id, RayExecutor, META_INSTANCE, META_MPS_QUIT};
use crate::inventory::ray::{Job, JobRequest, RuntimeEnv, MACHINE_LABEL};
use crate::runtime::mps::MpsClients;
use crate::runtime::spec::MpsClient;
use placement::sharing::MpsDaemon;
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// How long a job that tells a daemon to quit may take to be scheduled, beyond its own wait for the
/// daemon to go (the stop timeout).
const QUIT_SCHEDULING: Duration = Duration::from_secs(60);

impl RayExecutor {
    pub(super) fn clients(&self) -> std::sync::MutexGuard<'_, MpsClients> {
        self.0.mps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The gate of `daemon`'s GPU.
    pub(super) fn gate(&self, daemon: &MpsDaemon) -> Arc<tokio::sync::Mutex<()>> {
        let mut gates = self.0.gates.lock().unwrap_or_else(PoisonError::into_inner);
        gates.entry(daemon.pipe_dir.clone()).or_default().clone()
    }

    /// The daemon, on `machine`'s node, of the GPU `client` runs on.
    pub(super) fn mps_daemon(&self, machine: &str, client: &MpsClient) -> MpsDaemon {
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
    pub(super) fn mps_entrypoint(
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
    pub(in crate::runtime) fn quit_request(
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
            self.sweep_errands(&jobs).await;
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

    /// Deletes this installation's errands that have ended (quit jobs, and the jobs that read model files),
    /// which a stop left in Ray's list.
    pub(super) async fn sweep_errands(&self, jobs: &[Job]) {
        for job in jobs {
            let ours = job.meta(META_INSTANCE) == Some(&self.0.instance);
            if let (true, true, Some(_), Some(id)) = (
                ours,
                job.terminal(),
                job.meta(META_MPS_QUIT).or(job.meta(META_FILES)),
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
    pub(super) async fn leave_mps(
        &self,
        machine: &str,
        daemon: &MpsDaemon,
        unit: &str,
        ended: bool,
    ) {
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
}

/// The file a daemon's clients lock shared while they start and run, and its quit locks alone.
fn lock_file(daemon: &MpsDaemon) -> String {
    format!("{}.lock", daemon.pipe_dir)
}

/// A shell function, `answers`, that succeeds while the daemon `control` speaks to answers.
fn answers(control: &str) -> String {
    format!("answers() {{ echo get_server_list | {control} >/dev/null 2>&1; }}")
}
