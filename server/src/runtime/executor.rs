//! Where an engine's process runs: the one seam between the supervisor (states, health checks, backoff,
//! ordered plan steps, reconcile), which is the same everywhere, and a place to run commands. This machine's
//! processes ([`super::local`]) and a Ray cluster's jobs ([`super::ray`]) sit behind it; a Kubernetes
//! executor would too (docs/src/design/runtime.md, "Where engines run").

use super::spec::{EngineSpec, Launch};
use async_trait::async_trait;
use std::io;

/// Which units a call is about.
pub(crate) type Units<'a> = dyn for<'u> Fn(&'u str) -> bool + Sync + 'a;

/// Starts engines somewhere and finds the ones a previous server left there.
#[async_trait]
pub(crate) trait Executor: Send + Sync {
    /// A port for `spec`'s engine to listen on where it will run.
    async fn port(&self, spec: &EngineSpec) -> Result<u16, StartFailure>;

    /// Starts `launch` for `spec`, recorded so that a server started after a crash adopts it. What the
    /// executor adds to it (an MPS client's variables) is written into `launch`, as the engine is shown.
    async fn start(
        &self,
        spec: &EngineSpec,
        launch: &mut Launch,
        port: u16,
    ) -> Result<Box<dyn Running>, StartFailure>;

    /// The engines of this installation that a previous server left running: each still recorded as what
    /// it was started for, or found by the installation's token with no record (started by a server that
    /// died before it could record it). Only those of the units `of` takes: the others, with their records,
    /// are left as they are.
    async fn leftovers(&self, of: &Units) -> io::Result<Vec<Leftover>>;

    /// The last `lines` lines of what `unit`'s engine wrote.
    async fn logs(&self, unit: &str, lines: usize) -> io::Result<Vec<String>>;
}

/// One engine as it runs: a process, a job.
#[async_trait]
pub(crate) trait Running: Send + Sync {
    /// Its PID where it is a process of this machine.
    fn pid(&self) -> Option<u32>;

    /// Where its HTTP server answers (`host`, port).
    fn address(&self) -> (String, u16);

    /// Whether it runs as it should for its health check to count, and if not, why not (a job its cluster
    /// still holds PENDING, with the cluster's own reason): something else answering at its address is
    /// not it. A process of this machine that has not exited runs.
    async fn serving(&self) -> Result<(), String> {
        Ok(())
    }

    /// The key it takes requests with, where it has one (an engine on a cluster's node).
    fn api_key(&self) -> Option<String> {
        None
    }

    /// Waits until it has exited by itself, and says how.
    async fn exited(&mut self) -> String;

    /// Stops it: gracefully, forcibly after the stop timeout, then waits (within the stop timeout) until
    /// nothing of it is left and its GPU memory is free where that can be read. Says what is stuck.
    async fn stop(&mut self) -> Option<String>;

    /// After it exited by itself: ends whatever it left behind, as [`Running::stop`] waits.
    async fn clean_up(&mut self) -> Option<String>;

    /// Forgets its record: it is stopped for good.
    async fn forget(&mut self);
}

/// An engine a previous server left running.
pub(crate) struct Leftover {
    /// The unit it was started for.
    pub unit: String,
    /// What it was started as ([`EngineSpec::fingerprint`]); `None` where it was never recorded.
    pub fingerprint: Option<String>,
    /// The engine, to adopt or stop.
    pub running: Box<dyn Running>,
}

/// Why a start did not get an engine.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StartFailure {
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Closing,
    /// It cannot start now; a later attempt may (a cluster that does not answer).
    #[error("{0}")]
    Unavailable(String),
    /// It cannot start, and would not on a retry.
    #[error("{0}")]
    Refused(String),
}
