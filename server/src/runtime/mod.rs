//! The runtime: every engine the committed state wants runs as a supervised process, and a committed plan
//! change restarts exactly the members it changes, in the order `placement` gives.
//!
//! Changes are carried out in the order they were committed on each GPU, and side by side on different GPUs
//! (see [`conductor`]). Each carries the desired state as of its commit, so nothing starts with a share that
//! was not committed.

mod adoption;
mod conductor;
mod engines;
mod executor;
mod free_readers;
pub mod instance;
mod local;
pub mod mig;
pub mod model_file;
mod mps;
pub(crate) mod process;
mod progress;
mod ray;
mod readiness;
mod settings;
pub mod sizing;
mod sleep;
pub mod spec;
mod supervisor;

/// Where an engine is in its life: the one enum the runtime, the REST API and the console's pages share.
pub use app::views::EngineState;
pub use readiness::Load;
pub use settings::{Hosts, Settings};

use crate::inventory::LocalGpus;
use conductor::Order;
use engines::{view, Shared};
use local::LocalExecutor;
use placement::holder::Holder;
use placement::Step;
use ray::RayExecutor;
use serde::{Deserialize, Serialize};
use spec::{EngineSpec, Host};
use sqlx::SqlitePool;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// What the event stream (`GET /api/events`) carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Event {
    /// An engine changed state.
    Engine {
        /// When, RFC 3339.
        at: String,
        /// The engine (its unit name).
        engine: String,
        /// Its new state.
        state: EngineState,
        /// Why, when it is not what was wanted.
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A step of a committed plan change began or ended.
    Step {
        /// When, RFC 3339.
        at: String,
        /// The group.
        group: String,
        /// The revision being carried out.
        revision: i64,
        /// The member.
        member: String,
        /// `stop` or `start`.
        action: String,
        /// `running`, `done` or `failed`.
        status: StepStatus,
        /// Why it failed.
        #[serde(skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
    /// A model became slowed by its neighbours, or is no longer.
    Interference {
        /// When, RFC 3339.
        at: String,
        /// The model.
        model: String,
        /// Slowed now (the alarm rose), or no longer (it cleared).
        slowed: bool,
        /// Its p99 beside busy neighbours over its p99 alone, when known: `2.10×`.
        #[serde(skip_serializing_if = "Option::is_none")]
        ratio: Option<String>,
        /// The neighbours busy during its slow requests, the most often busy first.
        busy_neighbours: Vec<String>,
    },
    /// Tessera added or removed a replica of a model (its audit entry is `model.scale`).
    Scale {
        /// When, RFC 3339.
        at: String,
        /// The model.
        model: String,
        /// Its replicas before.
        from: u32,
        /// And after.
        to: u32,
        /// Why, in the load's words: `6 requests in flight or waiting on 1 replica of target 1 for 6 s`.
        why: String,
    },
}

/// Where a step of a plan change is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    /// Not begun.
    Waiting,
    /// Under way.
    Running,
    /// Done.
    Done,
    /// A start that did not become healthy.
    Failed,
}

/// An engine as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineView {
    /// Its id in URLs: the unit with `:`, `/` and `@` written as `~`.
    pub id: String,
    /// The unit: a worker's name, or `group:{group}/{model}@{machine}`.
    pub unit: String,
    /// The worker it runs, if it runs one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<String>,
    /// The group and model it runs, if it runs a member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The model of the group member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The machine.
    pub machine: String,
    /// Its GPUs there.
    pub gpus: Vec<u32>,
    /// GB it may take on each.
    pub memory_gb: f64,
    /// `local`, `simulated` (the demo engine stands in) or `remote`.
    pub host: Host,
    /// Its state.
    pub state: EngineState,
    /// Since when, RFC 3339.
    pub since: String,
    /// Its PID, while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Its port, while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// Restarts after a failure since this server started.
    pub restarts: u32,
    /// Why it is not as wanted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// How Tessera sized it to its share (llama.cpp's context), and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sizing: Option<String>,
    /// What its own log said it allocated on its GPUs (llama.cpp's buffers), in bytes, once it served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reported_bytes: Option<u64>,
    /// Asleep, what it keeps on the most-used of its GPUs, in bytes, where that was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_asleep_bytes: Option<u64>,
    /// Asleep, what its sleep freed on its GPUs, all together, in bytes: the most it can keep in host
    /// memory (its weights), where that was measured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub freed_asleep_bytes: Option<u64>,
    /// How long its last wake from sleep took, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_wake_ms: Option<u64>,
    /// Why it could not be put to sleep, when it could not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sleep_failed: Option<String>,
    /// The command line it was started with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Tessera's variables in its environment (`TESSERA_*`, `CUDA_VISIBLE_DEVICES`, and an MPS client's
    /// `CUDA_MPS_*`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty", default)]
    pub env: BTreeMap<String, String>,
}

/// A plan change being carried out, step by step, for the console.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// The revision.
    pub revision: i64,
    /// The steps in order.
    pub steps: Vec<StepProgress>,
}

/// One step and where it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepProgress {
    /// `stop` or `start`.
    pub action: String,
    /// The member.
    pub member: String,
    /// Where it is.
    pub status: StepStatus,
    /// Why it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Something the runtime carries out, in commit order on each GPU it touches.
#[derive(Debug, Clone)]
pub enum Change {
    /// At start: adopt the engines a previous server left running as committed, stop every other engine of
    /// this installation, and start what is missing.
    Reconcile(Vec<EngineSpec>),
    /// An operator's restart of one engine (a failed one, say), as what is committed wants it now.
    Restart(Box<EngineSpec>),
    /// Make what runs match `desired`: stop what should not run (or runs as something else), then start
    /// what is missing.
    Apply(Vec<EngineSpec>),
    /// [`Change::Apply`] for `units` alone, what a write changed, each wanted as in `desired` (those
    /// missing there not at all): every other engine is as it was.
    Update {
        /// The engines looked at.
        units: Vec<String>,
        /// Those of them that should run, and how.
        desired: Vec<EngineSpec>,
    },
    /// A committed plan change: `steps` in order; then members that left stop and any member not yet
    /// running starts. Nothing outside the group (and the router moving in) is touched.
    Plan {
        /// The group.
        group: String,
        /// Its new revision.
        revision: i64,
        /// From `placement::transition`.
        steps: Vec<Step>,
        /// The group's engines as committed.
        members: Vec<EngineSpec>,
    },
}

/// An engine that serves now, as the gateway sends a request to it.
#[derive(Debug, Clone)]
pub struct Serving {
    /// Its unit.
    pub unit: String,
    /// Where it answers.
    pub host: String,
    pub port: u16,
    /// The key it takes requests with, where it has one.
    pub api_key: Option<String>,
}

/// A request in flight to an engine, counted until it is dropped (with the last of its answer).
pub struct InFlight(Arc<AtomicUsize>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The runtime.
pub struct Runtime {
    shared: Arc<Shared>,
    /// To the conductor, which carries out changes in commit order.
    orders: mpsc::UnboundedSender<Order>,
    /// Set when the server is stopping.
    closing: watch::Sender<bool>,
}

impl Runtime {
    /// The runtime over `pool`, with this installation's instance token (made on first use, and anew
    /// where the database was copied from elsewhere: [`instance`]).
    pub async fn open(pool: SqlitePool, settings: Settings) -> Result<Runtime, sqlx::Error> {
        let instance = instance::token(&pool, &settings.identity).await?;
        let shutting_down = Arc::new(Mutex::new(false));
        let cluster = settings.ray.clone().map(|client| {
            RayExecutor::new(
                client,
                settings.clone(),
                instance.clone(),
                shutting_down.clone(),
            )
        });
        let local = LocalExecutor::new(pool, settings.clone(), instance, shutting_down.clone());
        let shared = Arc::new(Shared {
            settings,
            local,
            cluster,
            shutting_down,
            units: Mutex::default(),
            events: broadcast::channel(1024).0,
            progress: Mutex::default(),
            in_flight: Mutex::default(),
            readiness: readiness::Readiness::default(),
            free_readers: Arc::default(),
        });
        let (orders, inbox) = mpsc::unbounded_channel();
        tokio::spawn(conductor::conduct(shared.clone(), inbox));
        Ok(Runtime {
            shared,
            orders,
            closing: watch::channel(false).0,
        })
    }

    /// Carries out `change` after every change submitted before it on the same GPUs, cancelling the waits
    /// of those it makes moot; returns at once.
    pub fn submit(&self, change: Change) {
        // The conductor ends only with the runtime, so a send cannot fail while `self` lives.
        let _ = self.orders.send(Order::Change(change));
    }

    /// `nvidia-smi` for this machine's GPUs, each call given [`mig::CALL_TIMEOUT`].
    pub fn nvidia_smi(&self) -> mig::NvidiaSmi {
        mig::NvidiaSmi {
            program: self.shared.settings.nvidia_smi.clone(),
            timeout: mig::CALL_TIMEOUT,
        }
    }

    /// Where the model files of `machine` (of `host`) are read: on its Ray node by a job there, else here.
    pub fn model_files(&self, host: &spec::Host, machine: &str) -> Box<dyn model_file::Files> {
        self.shared.files(host, machine)
    }

    /// This machine's GPUs, where NVML reads them.
    pub fn local_gpus(&self) -> Option<Arc<dyn LocalGpus>> {
        self.shared.settings.gpus.clone()
    }

    /// Every engine, by unit.
    pub fn engines(&self) -> Vec<EngineView> {
        let units = self
            .shared
            .units
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        units.values().map(view).collect()
    }

    /// The engines of `name`: a worker's, or those of a member's model in any group and on any machine;
    /// found by name, not among every engine.
    pub fn engines_of(&self, name: &str) -> Vec<EngineView> {
        self.shared
            .lock()
            .named(name)
            .map(|(_, unit)| view(unit))
            .collect()
    }

    /// Whether `name` has an engine, in any state.
    pub fn has_engines(&self, name: &str) -> bool {
        self.shared.lock().named(name).next().is_some()
    }

    /// The engines of `name` that serve now, each as a request is sent to it.
    pub fn serving(&self, name: &str) -> Vec<Serving> {
        self.shared
            .lock()
            .named(name)
            .filter_map(|(unit, u)| {
                let status = u.status.borrow();
                (status.state == EngineState::Healthy).then_some(())?;
                Some(Serving {
                    unit: unit.to_owned(),
                    host: u.spec.host.address().to_owned(),
                    port: status.port?,
                    api_key: status.api_key.clone(),
                })
            })
            .collect()
    }

    /// One engine by its id or unit.
    pub fn engine(&self, id: &str) -> Option<EngineView> {
        self.engines()
            .into_iter()
            .find(|e| e.id == id || e.unit == id)
    }

    /// Counts a request the gateway sends to `unit`'s engine, if that engine serves now. Counted first and
    /// checked after: an engine that begins to drain meanwhile either is seen draining here or sees the
    /// request counted, never neither.
    pub fn begin_request(&self, unit: &str) -> Option<InFlight> {
        let counter = self.shared.counter(unit);
        counter.fetch_add(1, Ordering::SeqCst);
        let in_flight = InFlight(counter);
        (self.shared.state(unit) == Some(EngineState::Healthy)).then_some(in_flight)
    }

    /// The models (or workers) with the gateway's requests in flight to an engine on one of the GPUs
    /// `unit`'s engine runs on, but its own model's: its busy neighbours, now.
    pub fn busy_beside(&self, unit: &str) -> Vec<String> {
        let units = self.shared.lock();
        let Some(me) = units.get(unit) else {
            return Vec::new();
        };
        let own = Holder::parse(unit).name();
        let in_flight = self
            .shared
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut busy: Vec<String> = units
            .on_machine(&me.spec.machine)
            .filter(|(_, u)| u.spec.gpus.iter().any(|g| me.spec.gpus.contains(g)))
            .filter(|(name, _)| {
                in_flight
                    .get(*name)
                    .is_some_and(|c| c.load(Ordering::SeqCst) > 0)
            })
            .map(|(name, _)| Holder::parse(name).name())
            .filter(|name| *name != own)
            .map(str::to_owned)
            .collect();
        busy.dedup();
        busy
    }

    /// Tells the event stream's followers of `event`.
    pub fn publish(&self, event: Event) {
        // No follower is no error.
        let _ = self.shared.events.send(event);
    }

    /// `unit`'s last load, if its engine has loaded since the server started.
    pub fn last_load(&self, unit: &str) -> Option<Load> {
        self.shared.readiness.last_load(unit)
    }

    /// How long until `unit`'s engine is expected to serve, where its state and its last load say.
    pub fn ready_in(&self, unit: &str) -> Option<std::time::Duration> {
        let state = self.shared.state(unit)?;
        self.shared
            .readiness
            .ready_in(unit, state, tokio::time::Instant::now())
    }

    /// How long until `unit`'s engine, which has just stopped answering, is expected to serve again: its
    /// first backoff and its last load, where it has loaded since the server started.
    pub fn restart_in(&self, unit: &str) -> Option<std::time::Duration> {
        let load = self.shared.readiness.last_load(unit)?;
        Some(self.shared.settings.backoff(1) + load.took)
    }

    /// How long a GPU must stay over-committed before the over-commit policy stops a shared worker there.
    pub fn evict_after(&self) -> std::time::Duration {
        self.shared.settings.evict_after
    }

    /// How long an engine is given to exit after SIGTERM.
    pub fn stop_timeout(&self) -> std::time::Duration {
        self.shared.settings.stop_timeout
    }

    /// How long an on-demand model stays asleep with no request before its engine is stopped.
    pub fn keep_asleep(&self) -> std::time::Duration {
        self.shared.settings.keep_asleep
    }

    /// What models asleep may keep of a machine with `memory`.
    pub fn sleepers_host_budget(&self, memory: placement::Bytes) -> placement::Bytes {
        placement::Bytes(memory.get() / 100 * u64::from(self.shared.settings.sleepers_host_percent))
    }

    /// How long a model whose engine failed to load is refused before a request loads it again: the
    /// longest wait before a restart.
    pub fn cool_off(&self) -> std::time::Duration {
        self.shared.settings.backoff_max
    }

    /// How many of the gateway's requests are in flight to `unit`'s engine.
    pub fn requests_in_flight(&self, unit: &str) -> usize {
        self.shared
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(unit)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// The last `lines` lines of an engine's output.
    pub async fn logs(&self, id: &str, lines: usize) -> Option<std::io::Result<Vec<String>>> {
        let engine = self.engine(id)?;
        let spec = self.shared.lock().get(&engine.unit)?.spec.clone();
        let executor = self.shared.executor(&spec)?;
        Some(executor.logs(&engine.unit, lines).await)
    }

    /// Every engine running on this machine now, with its PIDs and those of every process it started, in
    /// its process group or not: their GPU memory is Tessera's, not held outside it.
    pub async fn running(&self) -> Vec<(String, Vec<u32>)> {
        let engines: Vec<(String, u32)> = self
            .engines()
            .into_iter()
            .filter_map(|e| Some((e.unit, e.pid?)))
            .collect();
        self.shared.local.processes(engines).await
    }

    /// Every engine registered now, by unit, with what it was started as (its spec's fingerprint).
    #[cfg(test)]
    pub(crate) fn registered(&self) -> BTreeMap<String, String> {
        self.shared
            .lock()
            .iter()
            .map(|(unit, u)| (unit.clone(), u.spec.fingerprint()))
            .collect()
    }

    /// What the engines on `machine` said they allocated on each of their GPUs, by unit and GPU index: their
    /// own reports, where they gave one.
    pub fn reported_on(&self, machine: &str) -> Vec<(String, Vec<(u32, placement::Bytes)>)> {
        let units = self
            .shared
            .units
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        units
            .iter()
            .filter(|(_, u)| u.spec.machine == machine)
            .filter_map(|(unit, u)| {
                let reported = u.status.borrow().reported.clone();
                (!reported.is_empty()).then(|| {
                    let per_gpu = u.spec.gpus.iter().copied().zip(reported).collect();
                    (unit.clone(), per_gpu)
                })
            })
            .collect()
    }

    /// The engines on the cluster's `machine` with the processes each runs as on its node, as its job
    /// last reported them (`seen`: the processes the node's GPUs run now).
    pub async fn node_processes(&self, machine: &str, seen: &[u32]) -> Vec<(String, Vec<u32>)> {
        let Some(cluster) = &self.shared.cluster else {
            return Vec::new();
        };
        let units: Vec<String> = self
            .shared
            .lock()
            .iter()
            .filter(|(_, unit)| {
                unit.spec.machine == machine && matches!(unit.spec.host, Host::Cluster { .. })
            })
            .map(|(name, _)| name.clone())
            .collect();
        cluster.processes(&units, seen).await
    }

    /// The engines a previous server recorded that still run on this machine (in this boot, same PID and
    /// start time, with this installation's token), with their processes as in [`Runtime::running`]:
    /// known before they are adopted, so that the first reading of this machine's GPUs does not count
    /// their memory as held outside.
    pub async fn recorded(&self) -> Result<Vec<(String, Vec<u32>)>, sqlx::Error> {
        let recorded = self.shared.local.recorded().await?;
        Ok(self.shared.local.processes(recorded).await)
    }

    /// The events from now on, until the server closes (a client too slow to keep up misses some, and
    /// reads the state again).
    pub fn events(&self) -> impl futures::Stream<Item = Event> + Send + 'static {
        use futures::StreamExt;
        let mut closing = self.closing.subscribe();
        tokio_stream::wrappers::BroadcastStream::new(self.shared.events.subscribe())
            .filter_map(|event| std::future::ready(event.ok()))
            .take_until(async move {
                let _ = closing.wait_for(|closed| *closed).await;
            })
    }

    /// Ends every event stream, so that a graceful shutdown does not wait on them.
    pub fn close_streams(&self) {
        self.closing.send_replace(true);
    }

    /// The last plan change of `group` and where each step is.
    pub fn progress(&self, group: &str) -> Option<Progress> {
        self.shared
            .progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(group)
            .cloned()
    }

    /// Waits for the changes submitted so far to be carried out.
    pub async fn settled(&self) {
        self.settled_with(None).await;
    }

    /// Waits until every change submitted so far on `gpus` has been carried out (or cancelled); what
    /// other GPUs wait for (an unrelated engine loading for minutes) is not waited for.
    pub async fn settled_on(&self, gpus: &[placement::GpuRef]) {
        let gpus = gpus
            .iter()
            .map(|g| conductor::Gpu::of(&g.machine, g.index))
            .collect();
        self.settled_with(Some(gpus)).await;
    }

    async fn settled_with(&self, on: Option<std::collections::BTreeSet<conductor::Gpu>>) {
        self.ask(|done| Order::Settled(on, done)).await;
    }

    /// Waits until every change submitted so far has been taken up, not carried out: after the start's
    /// reconcile, the engines the previous server left are registered (adopted, or stopped).
    pub async fn taken_up(&self) {
        self.ask(Order::TakenUp).await;
    }

    /// Stops every engine (the server is shutting down): nothing starts from the moment this is called,
    /// whatever is queued or waiting out a backoff, and the changes under way are cancelled.
    pub async fn shutdown(&self) {
        self.close();
        self.ask(Order::Shutdown).await;
    }

    /// Stops every engine of this installation that runs with no server (`tessera stop --engines`, once the
    /// server has stopped and left them), on every executor; answers the units stopped, or why some could
    /// not be looked for (a Ray head that does not answer), having stopped the others.
    pub async fn stop_left(&self) -> Result<Vec<String>, String> {
        adoption::stop_left(&self.shared).await
    }

    /// Lets go of every engine, which goes on running (the server stops to restart or be upgraded; its
    /// next start adopts them): nothing starts or stops from the moment this is called, and the changes
    /// under way are cancelled, to be carried out by the next start's reconcile from what is committed.
    /// Answers how many engines are left running.
    pub async fn leave(&self) -> usize {
        self.close();
        self.ask(Order::Leave).await;
        self.engines()
            .iter()
            .filter(|e| e.state != EngineState::Stopped && e.pid.is_some())
            .count()
    }

    /// From now on no engine starts.
    fn close(&self) {
        *self
            .shared
            .shutting_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
    }

    /// Sends the conductor `order` and waits for its answer.
    async fn ask(&self, order: impl FnOnce(oneshot::Sender<()>) -> Order) {
        let (done, answered) = oneshot::channel();
        if self.orders.send(order(done)).is_ok() {
            let _ = answered.await;
        }
    }
}

/// A unit as a URL path segment and a file name: worker, group and model names cannot hold `~`.
pub fn engine_id(unit: &str) -> String {
    unit.replace([':', '/', '@'], "~")
}

/// Now, RFC 3339 in UTC.
pub(crate) fn now() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests;
