//! The runtime: every engine the committed state wants runs as a supervised process, and a committed plan
//! change restarts exactly the members it changes, in the order `placement` gives.
//!
//! Changes are carried out in the order they were committed on each GPU, and side by side on different GPUs
//! (see [`conductor`]). Each carries the desired state as of its commit, so nothing starts with a share that
//! was not committed.

mod conductor;
mod executor;
mod local;
pub mod mig;
mod mps;
pub(crate) mod process;
mod ray;
pub mod spec;
mod supervisor;

use crate::inventory::LocalGpus;
use crate::units::Holder;
use conductor::{Cancel, StartError};
use executor::Executor;
use local::LocalExecutor;
use placement::{Bytes, Step};
use ray::RayExecutor;
use serde::{Deserialize, Serialize};
use spec::{EngineSpec, Host, Launch};
use sqlx::SqlitePool;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use supervisor::{Begin, Control};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

/// How engines are supervised.
#[derive(Clone)]
pub struct Settings {
    /// The program that runs the demo engine (`tessera demo-engine`): this server's own binary.
    pub demo_engine: PathBuf,
    /// Where each engine's output is kept.
    pub log_dir: PathBuf,
    /// The data folder, under which each GPU's MPS daemon keeps its pipes and logs (`mps/`).
    pub data_dir: PathBuf,
    /// NVIDIA's MPS control program, which starts and stops each GPU's MPS daemon (here and on the
    /// cluster's nodes).
    pub mps_control: PathBuf,
    /// NVIDIA's `nvidia-smi`, which cuts this machine's GPUs into MIG instances and joins them back.
    pub nvidia_smi: PathBuf,
    /// On each node of the Ray cluster, the folder its GPUs' MPS daemons keep their pipes and logs under.
    pub node_data_dir: PathBuf,
    /// How often each engine's health is checked.
    pub health_interval: Duration,
    /// How long a starting engine may take to answer its first health check (loading weights).
    pub start_timeout: Duration,
    /// How long a stopping engine is given after SIGTERM before SIGKILL.
    pub stop_timeout: Duration,
    /// The first wait before a restart; it doubles with each failure in a row.
    pub backoff: Duration,
    /// The longest wait before a restart.
    pub backoff_max: Duration,
    /// Failures in a row after which an engine is left failed.
    pub max_restarts: u32,
    /// Failed health checks in a row after which a running engine is unhealthy.
    pub unhealthy_after: u32,
    /// Failed health checks in a row after which it is restarted.
    pub restart_unhealthy_after: u32,
    /// How long a serving engine about to stop may take to finish its requests in flight.
    pub drain_grace: Duration,
    /// How often a node's engine's job log is read again for its processes while the node's GPUs run
    /// a process that no engine's last report accounts for (one may have started since).
    pub processes_reread: Duration,
    /// This machine's GPUs (NVML), where there are: a stopped engine's GPU memory is waited for there.
    pub gpus: Option<Arc<dyn LocalGpus>>,
    /// The Ray cluster whose machines' engines run as its jobs, where there is one.
    pub ray: Option<crate::inventory::ray::RayClient>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("demo_engine", &self.demo_engine)
            .field("log_dir", &self.log_dir)
            .field("health_interval", &self.health_interval)
            .field("start_timeout", &self.start_timeout)
            .field("stop_timeout", &self.stop_timeout)
            .field("backoff", &self.backoff)
            .field("backoff_max", &self.backoff_max)
            .field("max_restarts", &self.max_restarts)
            .field("unhealthy_after", &self.unhealthy_after)
            .field("restart_unhealthy_after", &self.restart_unhealthy_after)
            .field("drain_grace", &self.drain_grace)
            .field("processes_reread", &self.processes_reread)
            .field("gpus", &self.gpus.is_some())
            .field(
                "ray",
                &self
                    .ray
                    .as_ref()
                    .map(crate::inventory::ray::RayClient::address),
            )
            .finish()
    }
}

impl Settings {
    /// The defaults for engines that load real weights: health every 2 s, 15 minutes to load, 30 s to stop,
    /// restarts after 1, 2, 4 … up to 60 s, left failed after 5 failures in a row.
    pub fn new(demo_engine: PathBuf, log_dir: PathBuf) -> Settings {
        Settings {
            demo_engine,
            data_dir: log_dir.clone(),
            log_dir,
            mps_control: PathBuf::from("nvidia-cuda-mps-control"),
            nvidia_smi: PathBuf::from("nvidia-smi"),
            node_data_dir: PathBuf::from("/tmp/tessera"),
            health_interval: Duration::from_secs(2),
            start_timeout: Duration::from_secs(15 * 60),
            stop_timeout: Duration::from_secs(30),
            backoff: Duration::from_secs(1),
            backoff_max: Duration::from_secs(60),
            max_restarts: 5,
            unhealthy_after: 3,
            restart_unhealthy_after: 15,
            drain_grace: Duration::from_secs(30),
            processes_reread: Duration::from_secs(30),
            gpus: None,
            ray: None,
        }
    }

    /// The wait before restart number `failures` (1-based).
    pub fn backoff(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        self.backoff.saturating_mul(factor).min(self.backoff_max)
    }
}

/// Which machines engines can be started for: this one (through NVML) runs recipes, the demo fleet's run
/// the demo engine in their place, the Ray cluster's run jobs, and any other is remote.
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// This machine, when NVML found it.
    pub local: Option<String>,
    /// The demo fleet's machines.
    pub simulated: std::collections::BTreeSet<String>,
    /// The Ray cluster's machines.
    pub cluster: BTreeMap<String, crate::inventory::ray::ClusterMachine>,
}

impl Hosts {
    /// Where `machine` is.
    pub fn host(&self, machine: &str) -> Host {
        if let Some(node) = self.cluster.get(machine) {
            Host::Cluster {
                address: node.address.clone(),
                uuids: node
                    .gpus
                    .iter()
                    .map(|g| (g.index, g.uuid.clone()))
                    .collect(),
                demo: node.demo,
            }
        } else if self.local.as_deref() == Some(machine) {
            Host::Local
        } else if self.simulated.contains(machine) {
            Host::Simulated
        } else {
            Host::Remote
        }
    }
}

/// Where an engine is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    /// Started, not yet answering its health check.
    Starting,
    /// Answering its health check.
    Healthy,
    /// Running, but its health checks fail.
    Unhealthy,
    /// About to stop: out of the gateway's rotation, finishing its requests in flight (up to the drain
    /// grace) before it is stopped.
    Draining,
    /// Exited or killed; waiting out its backoff before it starts again.
    Restarting,
    /// Not running, as wanted (or on a machine Tessera cannot start engines on).
    Stopped,
    /// Not running, against what was wanted: its start failed, or it failed too often in a row.
    Failed,
}

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
    /// An operator's restart of one engine (a failed one, say), as it is specified now.
    Restart(String),
    /// Make what runs match `desired`: stop what should not run (or runs as something else), then start
    /// what is missing.
    Apply(Vec<EngineSpec>),
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

/// An engine the runtime knows of.
struct Unit {
    spec: EngineSpec,
    status: watch::Sender<Status>,
    control: Option<mpsc::Sender<Control>>,
}

#[derive(Debug, Clone)]
struct Status {
    state: EngineState,
    since: String,
    pid: Option<u32>,
    port: Option<u16>,
    restarts: u32,
    message: Option<String>,
    launch: Option<Launch>,
}

/// What the supervisors share with the runtime.
pub(crate) struct Shared {
    settings: Settings,
    /// This machine's processes: its own engines and the demo fleet's.
    local: LocalExecutor,
    /// The Ray cluster's jobs: its machines' engines.
    cluster: Option<RayExecutor>,
    /// Set once a graceful shutdown begins: from then on no engine starts. Taken before `units`.
    shutting_down: Arc<Mutex<bool>>,
    units: Mutex<BTreeMap<String, Unit>>,
    events: broadcast::Sender<Event>,
    progress: Mutex<BTreeMap<String, Progress>>,
    /// The gateway's requests in flight, by unit.
    in_flight: Mutex<BTreeMap<String, Arc<AtomicUsize>>>,
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

enum Order {
    Change(Change),
    Settled(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

impl Runtime {
    /// The runtime over `pool`, with this installation's instance token (made on first use).
    pub async fn open(pool: SqlitePool, settings: Settings) -> Result<Runtime, sqlx::Error> {
        let fresh = format!(
            "{:x}-{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos(),
            std::process::id()
        );
        sqlx::query("INSERT OR IGNORE INTO instance (id, token) VALUES (1, ?)")
            .bind(&fresh)
            .execute(&pool)
            .await?;
        let (instance,): (String,) = sqlx::query_as("SELECT token FROM instance WHERE id = 1")
            .fetch_one(&pool)
            .await?;
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
            .iter()
            .filter(|(_, u)| {
                u.spec.machine == me.spec.machine
                    && u.spec.gpus.iter().any(|g| me.spec.gpus.contains(g))
            })
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
        let (done, settled) = oneshot::channel();
        if self.orders.send(Order::Settled(done)).is_ok() {
            let _ = settled.await;
        }
    }

    /// Stops every engine (the server is shutting down): nothing starts from the moment this is called,
    /// whatever is queued or waiting out a backoff, and the changes under way are cancelled.
    pub async fn shutdown(&self) {
        *self
            .shared
            .shutting_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = true;
        let (done, stopped) = oneshot::channel();
        if self.orders.send(Order::Shutdown(done)).is_ok() {
            let _ = stopped.await;
        }
    }
}

fn view(unit: &Unit) -> EngineView {
    let status = unit.status.borrow();
    let spec = &unit.spec;
    let (worker, group, model) = match Holder::parse(&spec.unit) {
        Holder::Member { group, member, .. } => {
            (None, Some(group.to_owned()), Some(member.to_owned()))
        }
        Holder::Worker(worker) => (Some(worker.to_owned()), None, None),
    };
    EngineView {
        id: engine_id(&spec.unit),
        unit: spec.unit.clone(),
        worker,
        group,
        model,
        machine: spec.machine.clone(),
        gpus: spec.gpus.clone(),
        memory_gb: spec.memory().as_gb_f64(),
        host: spec.host.clone(),
        state: status.state,
        since: status.since.clone(),
        pid: status.pid,
        port: status.port,
        restarts: status.restarts,
        message: status.message.clone(),
        command: status.launch.as_ref().map(|l| {
            std::iter::once(l.program.clone())
                .chain(l.args.iter().cloned())
                .collect()
        }),
        env: status
            .launch
            .as_ref()
            .map(|l| {
                l.env
                    .iter()
                    .filter(|(k, _)| {
                        k.starts_with("TESSERA_")
                            || k.starts_with("CUDA_MPS_")
                            || k.as_str() == "CUDA_VISIBLE_DEVICES"
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
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

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Unit>> {
        self.units.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn unit_names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn has(&self, unit: &str) -> bool {
        self.lock().contains_key(unit)
    }

    /// Every executor there is.
    fn executors(&self) -> Vec<Arc<dyn Executor>> {
        let mut all: Vec<Arc<dyn Executor>> = vec![Arc::new(self.local.clone())];
        if let Some(cluster) = &self.cluster {
            all.push(Arc::new(cluster.clone()));
        }
        all
    }

    /// What starts `spec`'s engine, where anything can.
    fn executor(&self, spec: &EngineSpec) -> Option<Arc<dyn Executor>> {
        match spec.host {
            Host::Local | Host::Simulated => Some(Arc::new(self.local.clone())),
            Host::Cluster { .. } => self
                .cluster
                .clone()
                .map(|c| Arc::new(c) as Arc<dyn Executor>),
            Host::Remote => None,
        }
    }

    /// Registers `spec` and starts its supervisor; a remote engine is only shown. `None` once the server
    /// is shutting down: nothing new is registered then, so the shutdown stops every engine there is.
    fn launch_unit(
        self: &Arc<Self>,
        spec: EngineSpec,
        begin: Begin,
    ) -> Option<watch::Receiver<Status>> {
        let remote = self.executor(&spec).is_none();
        let (status, watcher) = watch::channel(Status {
            state: EngineState::Stopped,
            since: now(),
            pid: None,
            port: None,
            restarts: 0,
            message: remote.then(|| {
                format!(
                    "{} is not this machine, and Tessera has no agent there to start engines with",
                    spec.machine
                )
            }),
            launch: None,
        });
        let (control, commands) = if remote {
            (None, None)
        } else {
            let (tx, rx) = mpsc::channel(4);
            (Some(tx), Some(rx))
        };
        {
            let shutting_down = self
                .shutting_down
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if *shutting_down {
                return None;
            }
            // Registered before its supervisor runs, so that the supervisor's first state is not lost.
            self.lock().insert(
                spec.unit.clone(),
                Unit {
                    spec: spec.clone(),
                    status,
                    control,
                },
            );
        }
        // An adopted engine runs already: it says so before this returns, not once its supervisor runs.
        if let Begin::Adopt(running) = &begin {
            let (_, port) = running.address();
            self.set(
                &spec.unit,
                EngineState::Starting,
                running.pid(),
                Some(port),
                None,
            );
        }
        if let Some(rx) = commands {
            tokio::spawn(supervisor::supervise(self.clone(), spec, begin, rx));
        }
        Some(watcher)
    }

    /// Starts `spec` and waits until it is healthy, or has failed, or `cancel` says the wait is moot.
    async fn start_and_wait(
        self: &Arc<Self>,
        spec: EngineSpec,
        cancel: &mut Cancel,
    ) -> Result<(), StartError> {
        let unit = spec.unit.clone();
        let remote = self.executor(&spec).is_none();
        // An engine sizes itself by the memory free as it starts: not while another beside it still loads
        // (one that a cancelled change left loading, say).
        while !remote && self.loading_beside(&spec) {
            tokio::select! {
                () = tokio::time::sleep(self.settings.health_interval) => {}
                _ = cancel.wait_for(|cancelled| *cancelled) => return Err(self.halted()),
            }
        }
        let mut watcher = self
            .launch_unit(spec, Begin::Start)
            .ok_or(StartError::Closing)?;
        if remote {
            return Ok(());
        }
        let done = tokio::select! {
            done = watcher.wait_for(|s| matches!(s.state, EngineState::Healthy | EngineState::Failed)) => {
                done.map(|s| (s.state, s.message.clone()))
            }
            _ = cancel.wait_for(|cancelled| *cancelled) => return Err(self.halted()),
        };
        match done {
            Ok((EngineState::Healthy, _)) => Ok(()),
            Ok((_, message)) => Err(StartError::Failed(
                message.unwrap_or_else(|| "failed".to_owned()),
            )),
            Err(_) => Err(StartError::Failed(format!(
                "{unit} was stopped as it started"
            ))),
        }
    }

    /// Why a cancelled start ended.
    fn halted(&self) -> StartError {
        if *self
            .shutting_down
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
        {
            StartError::Closing
        } else {
            StartError::Superseded
        }
    }

    /// Whether another engine on one of `spec`'s GPUs is still loading.
    fn loading_beside(&self, spec: &EngineSpec) -> bool {
        self.lock().values().any(|u| {
            u.spec.unit != spec.unit
                && u.spec.machine == spec.machine
                && u.spec.gpus.iter().any(|g| spec.gpus.contains(g))
                && u.status.borrow().state == EngineState::Starting
        })
    }

    /// Stops one engine and waits until it has exited (also when another change stops it at the same time).
    async fn stop_unit(&self, unit: &str) {
        let control = self.lock().get(unit).and_then(|u| u.control.clone());
        if let Some(control) = control {
            let _ = control.send(Control::Stop).await;
            // Its supervisor ends once the engine is gone, dropping the other end.
            control.closed().await;
        }
    }

    fn drop_units(&self, units: &[String]) {
        let mut all = self.lock();
        for u in units {
            all.remove(u);
        }
    }

    /// The count of `unit`'s requests in flight.
    fn counter(&self, unit: &str) -> Arc<AtomicUsize> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(unit.to_owned())
            .or_default()
            .clone()
    }

    /// Takes a serving engine out of the rotation and waits, up to the drain grace, until its requests in
    /// flight are done. Says how many were left.
    async fn drain(&self, unit: &str, pid: Option<u32>, port: u16) -> usize {
        let counter = self.counter(unit);
        self.set(unit, EngineState::Draining, pid, Some(port), None);
        let deadline = tokio::time::Instant::now() + self.settings.drain_grace;
        loop {
            let left = counter.load(Ordering::SeqCst);
            if left == 0 || tokio::time::Instant::now() >= deadline {
                return left;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn state(&self, unit: &str) -> Option<EngineState> {
        self.lock().get(unit).map(|u| u.status.borrow().state)
    }

    /// Records a new state (with its PID and port while it runs) and says so on the event stream.
    fn set(
        &self,
        unit: &str,
        state: EngineState,
        pid: Option<u32>,
        port: Option<u16>,
        message: Option<String>,
    ) {
        let changed = {
            let units = self.lock();
            let Some(u) = units.get(unit) else { return };
            let mut changed = false;
            u.status.send_if_modified(|s| {
                changed = s.state != state || s.message != message;
                if changed {
                    s.since = now();
                }
                let keep_port = matches!(
                    state,
                    EngineState::Starting
                        | EngineState::Healthy
                        | EngineState::Unhealthy
                        | EngineState::Draining
                );
                s.state = state;
                s.pid = pid;
                s.port = if keep_port { port.or(s.port) } else { None };
                s.message = message.clone();
                true
            });
            changed
        };
        if changed {
            if let Some(m) = &message {
                tracing::info!("engine {unit}: {state:?}: {m}");
            }
            let _ = self.events.send(Event::Engine {
                at: now(),
                engine: unit.to_owned(),
                state,
                message,
            });
        }
    }

    fn set_launch(&self, unit: &str, launch: &Launch) {
        if let Some(u) = self.lock().get(unit) {
            u.status.send_modify(|s| s.launch = Some(launch.clone()));
        }
    }

    fn count_restart(&self, unit: &str) {
        if let Some(u) = self.lock().get(unit) {
            u.status.send_modify(|s| s.restarts += 1);
        }
    }

    /// The memory free on `spec`'s GPUs as it starts: what they offer less what the other running engines
    /// there take.
    fn free_at_start(&self, spec: &EngineSpec) -> Bytes {
        let units = self.lock();
        let taken: Bytes = units
            .values()
            .filter(|u| u.spec.unit != spec.unit && u.spec.machine == spec.machine)
            .filter(|u| u.spec.gpus.iter().any(|g| spec.gpus.contains(g)))
            // Running, as a process or a job (which has no PID here).
            .filter(|u| {
                matches!(
                    u.status.borrow().state,
                    EngineState::Starting
                        | EngineState::Healthy
                        | EngineState::Unhealthy
                        | EngineState::Draining
                )
            })
            .map(|u| u.spec.memory())
            .sum();
        spec.gpu_offered.saturating_sub(taken)
    }

    fn set_progress(&self, group: &str, progress: &Progress) {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(group.to_owned(), progress.clone());
    }

    fn step(
        &self,
        group: &str,
        progress: &mut Progress,
        i: usize,
        status: StepStatus,
        message: Option<String>,
    ) {
        let step = &mut progress.steps[i];
        step.status = status;
        step.message.clone_from(&message);
        let event = Event::Step {
            at: now(),
            group: group.to_owned(),
            revision: progress.revision,
            member: step.member.clone(),
            action: step.action.clone(),
            status,
            message,
        };
        self.set_progress(group, progress);
        let _ = self.events.send(event);
    }
}

#[cfg(test)]
mod tests;
