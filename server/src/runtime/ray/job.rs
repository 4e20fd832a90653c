//! One engine's Ray job as the supervisor sees it ([`Running`]): its address, how it ended, its stop (Ray's
//! SIGTERM, then SIGKILL) and what is left to do once it is over.

use super::RayExecutor;
use crate::inventory::ray::{Job, RayClient};
use crate::runtime::executor::Running;
use crate::runtime::Settings;
use async_trait::async_trait;
use placement::sharing::MpsDaemon;
use tokio::time::{sleep, Instant};

/// One engine's job.
pub(super) struct RayJob {
    pub(super) executor: RayExecutor,
    pub(super) unit: String,
    pub(super) id: String,
    pub(super) address: String,
    pub(super) port: u16,
    /// The machine and the MPS daemon it is a client of, if it is one.
    pub(super) mps: Option<(String, MpsDaemon)>,
    /// Its job was seen to end.
    pub(super) over: bool,
    /// The key it takes requests with.
    pub(super) api_key: Option<String>,
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
pub(super) fn ending(job: &Job) -> String {
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

    fn api_key(&self) -> Option<String> {
        self.api_key.clone()
    }

    /// Its job is RUNNING: until then, whatever answers at its node's port is not it.
    async fn serving(&self) -> Result<(), String> {
        let job = self
            .client()
            .job(&self.id)
            .await
            .map_err(|e| e.to_string())?;
        if job.status == "RUNNING" {
            return Ok(());
        }
        let mut words = format!("its Ray job {} is {}", self.id, job.status);
        if let Some(message) = job.message.as_deref().filter(|m| !m.is_empty()) {
            words.push_str(&format!(": {}", message.lines().next().unwrap_or_default()));
        }
        Err(words)
    }

    async fn exited(&mut self) -> String {
        let job = self.ended().await;
        self.over = true;
        match job.driver_exit_code {
            Some(super::PORT_TAKEN) => format!(
                "port {} was taken on its node: it starts again on another",
                self.port
            ),
            Some(super::CANNOT_LISTEN) => format!(
                "its node cannot listen on {}:{} ({})",
                self.address,
                self.port,
                ending(&job)
            ),
            _ => ending(&job),
        }
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
