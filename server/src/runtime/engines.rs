//! The engines the runtime knows of, in one table shared with their supervisors: registering and launching
//! one, starting one and waiting until it is healthy, draining and stopping one, and recording each state
//! change (with its event) and each plan step's progress.

use super::executor::{Executor, Running};
use super::local::LocalExecutor;
use super::model_file::{Files, ThisMachine};
use super::ray::RayExecutor;
use super::spec::{EngineSpec, Host, Launch};
use super::{engine_id, now, EngineState, EngineView, Event, Progress, Settings, StepStatus};
use placement::holder::Holder;
use placement::Bytes;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};

/// What the runtime asks of a supervisor.
pub(super) enum Control {
    /// Stop the engine gracefully; the supervisor ends once it has exited.
    Stop,
    /// Put it to sleep (drained first); says what came of it.
    Sleep(Reply),
    /// Wake it; says what came of it.
    Wake(Reply),
}

/// A sleep or a wake asked of an engine's supervisor: what came of it.
pub(super) type Reply = tokio::sync::oneshot::Sender<Result<(), String>>;

/// What an engine's sleep came to, as measured on its GPUs (none where they cannot be read).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Slept {
    /// What it keeps asleep on the most-used of its GPUs.
    pub(super) kept: Option<Bytes>,
    /// What the sleep freed on its GPUs, all together: the most it can have moved to host memory (its
    /// weights; the KV cache it drops is freed too).
    pub(super) freed: Option<Bytes>,
}

/// How the supervisor begins.
pub(super) enum Begin {
    /// Start a new engine.
    Start,
    /// Watch an engine a previous server started, which still runs as the committed state wants.
    Adopt(Box<dyn Running>),
}

/// A unit just registered: its states as they change, and (where it has a supervisor) what that supervisor
/// is told.
pub(super) type Registered = (watch::Receiver<Status>, Option<mpsc::Receiver<Control>>);

/// One registration of an engine, to stop and forget exactly it.
pub(super) struct Registration {
    unit: String,
    status: watch::Sender<Status>,
    control: Option<mpsc::Sender<Control>>,
}

/// An engine the runtime knows of.
pub(super) struct Unit {
    pub(super) spec: EngineSpec,
    pub(super) status: watch::Sender<Status>,
    pub(super) control: Option<mpsc::Sender<Control>>,
}

#[derive(Debug, Clone)]
pub(super) struct Status {
    pub(super) state: EngineState,
    pub(super) since: String,
    pub(super) pid: Option<u32>,
    pub(super) port: Option<u16>,
    pub(super) restarts: u32,
    pub(super) message: Option<String>,
    pub(super) launch: Option<Launch>,
    /// The key it takes requests with, where it has one.
    pub(super) api_key: Option<String>,
    /// What its own log said it allocated on each of its GPUs, in their order, once it served.
    pub(super) reported: Vec<Bytes>,
    /// Asleep, what it keeps on its GPUs and what its sleep freed there, as measured.
    pub(super) asleep: Option<Slept>,
    /// Its last wake: from the wake asked to the engine answering it.
    pub(super) last_wake: Option<Duration>,
    /// Why it could not be put to sleep, when it could not (it serves on, awake).
    pub(super) sleep_failed: Option<String>,
}

/// The engines the runtime knows of, by unit, with the units of each name (a worker's, or a member's model)
/// and of each machine beside them: a request through the gateway finds its model's engines, and an
/// engine's neighbours, without a walk through every engine of the fleet.
#[derive(Default)]
pub(super) struct Units {
    all: BTreeMap<String, Unit>,
    by_name: HashMap<String, BTreeSet<String>>,
    on_machine: HashMap<String, BTreeSet<String>>,
}

impl std::ops::Deref for Units {
    type Target = BTreeMap<String, Unit>;

    fn deref(&self) -> &Self::Target {
        &self.all
    }
}

impl Units {
    /// Registers `unit` under its name, in place of one registered under it before.
    pub(super) fn insert(&mut self, unit: Unit) {
        let name = unit.spec.unit.clone();
        self.remove(&name);
        let holder = Holder::parse(&name).name().to_owned();
        self.by_name.entry(holder).or_default().insert(name.clone());
        self.on_machine
            .entry(unit.spec.machine.clone())
            .or_default()
            .insert(name.clone());
        self.all.insert(name, unit);
    }

    /// Forgets the unit registered as `name`.
    pub(super) fn remove(&mut self, name: &str) {
        let Some(unit) = self.all.remove(name) else {
            return;
        };
        let forget = |index: &mut HashMap<String, BTreeSet<String>>, key: &str| {
            if let Some(units) = index.get_mut(key) {
                units.remove(name);
                if units.is_empty() {
                    index.remove(key);
                }
            }
        };
        forget(&mut self.by_name, Holder::parse(name).name());
        forget(&mut self.on_machine, &unit.spec.machine);
    }

    /// `name`'s engine is asleep now, or awake: as its registered spec says from here.
    pub(super) fn mark_asleep(&mut self, name: &str, asleep: bool) {
        if let Some(unit) = self.all.get_mut(name) {
            unit.spec.asleep = asleep;
        }
    }

    /// The engines of `name`: a worker's, or those of a member's model in any group and on any machine.
    pub(super) fn named<'a>(&'a self, name: &str) -> impl Iterator<Item = (&'a str, &'a Unit)> {
        self.of(&self.by_name, name)
    }

    /// The engines of group members named `member`, in any group and on any machine.
    pub(super) fn members_named<'a>(
        &'a self,
        member: &str,
    ) -> impl Iterator<Item = (&'a str, &'a Unit)> {
        self.named(member)
            .filter(|(unit, _)| matches!(Holder::parse(unit), Holder::Member { .. }))
    }

    /// The engines whose unit name begins with `prefix` (a group's: [`placement::holder::group_prefix`]).
    pub(super) fn with_prefix<'a>(
        &'a self,
        prefix: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a Unit)> {
        self.all
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(move |(name, _)| name.starts_with(prefix))
            .map(|(name, unit)| (name.as_str(), unit))
    }

    /// The engines on `machine`.
    pub(super) fn on_machine<'a>(
        &'a self,
        machine: &str,
    ) -> impl Iterator<Item = (&'a str, &'a Unit)> {
        self.of(&self.on_machine, machine)
    }

    fn of<'a>(
        &'a self,
        index: &'a HashMap<String, BTreeSet<String>>,
        key: &str,
    ) -> impl Iterator<Item = (&'a str, &'a Unit)> {
        index
            .get(key)
            .into_iter()
            .flatten()
            .filter_map(|name| self.all.get_key_value(name))
            .map(|(name, unit)| (name.as_str(), unit))
    }
}

/// `unit`'s registration as `name`, and its spec.
fn registration(name: &str, unit: &Unit) -> (Registration, EngineSpec) {
    let registration = Registration {
        unit: name.to_owned(),
        status: unit.status.clone(),
        control: unit.control.clone(),
    };
    (registration, unit.spec.clone())
}

/// What the supervisors share with the runtime.
pub(crate) struct Shared {
    pub(super) settings: Settings,
    /// This machine's processes: its own engines and the demo fleet's.
    pub(super) local: LocalExecutor,
    /// The Ray cluster's jobs: its machines' engines.
    pub(super) cluster: Option<RayExecutor>,
    /// Set once a graceful shutdown begins: from then on no engine starts. Taken before `units`.
    pub(super) shutting_down: Arc<Mutex<bool>>,
    pub(super) units: Mutex<Units>,
    pub(super) events: broadcast::Sender<Event>,
    pub(super) progress: Mutex<BTreeMap<String, Progress>>,
    /// The gateway's requests in flight, by unit.
    pub(super) in_flight: Mutex<BTreeMap<String, Arc<AtomicUsize>>>,
    /// How long each engine's last load took, and when one waiting out a backoff starts again.
    pub(super) readiness: super::readiness::Readiness,
    /// SGLang's loads and its neighbours' stops, kept apart on a GPU.
    pub(super) free_readers: Arc<super::free_readers::FreeReaders>,
}

pub(super) fn view(unit: &Unit) -> EngineView {
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
        sizing: status.launch.as_ref().and_then(|l| l.sizing.clone()),
        reported_bytes: (!status.reported.is_empty())
            .then(|| status.reported.iter().map(|b| b.get()).sum()),
        held_asleep_bytes: status.asleep.and_then(|a| a.kept).map(Bytes::get),
        freed_asleep_bytes: status.asleep.and_then(|a| a.freed).map(Bytes::get),
        last_wake_ms: status.last_wake.map(|d| d.as_millis() as u64),
        sleep_failed: status.sleep_failed.clone(),
        // Its key is Tessera's alone: shown to no one, admins included.
        command: status.launch.as_ref().map(|l| {
            std::iter::once(l.program.clone())
                .chain(l.args.iter().cloned())
                .map(|arg| match &status.api_key {
                    Some(key) if arg.contains(key.as_str()) => {
                        arg.replace(key.as_str(), crate::redact::REDACTED)
                    }
                    _ => arg,
                })
                .collect()
        }),
        env: status
            .launch
            .as_ref()
            .map(|l| {
                l.env
                    .iter()
                    .filter(|(k, _)| {
                        k.as_str() != super::spec::ENGINE_KEY_VAR && k.starts_with("TESSERA_")
                            || k.starts_with("CUDA_MPS_")
                            || k.as_str() == "CUDA_VISIBLE_DEVICES"
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default(),
    }
}

impl Shared {
    pub(super) fn lock(&self) -> std::sync::MutexGuard<'_, Units> {
        self.units.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn unit_names(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    pub(super) fn has(&self, unit: &str) -> bool {
        self.lock().contains_key(unit)
    }

    /// Every executor there is.
    pub(super) fn executors(&self) -> Vec<Arc<dyn Executor>> {
        let mut all: Vec<Arc<dyn Executor>> = vec![Arc::new(self.local.clone())];
        if let Some(cluster) = &self.cluster {
            all.push(Arc::new(cluster.clone()));
        }
        all
    }

    /// What starts `spec`'s engine, where anything can.
    pub(super) fn executor(&self, spec: &EngineSpec) -> Option<Arc<dyn Executor>> {
        match spec.host {
            Host::Local | Host::Simulated => Some(Arc::new(self.local.clone())),
            Host::Cluster { .. } => self
                .cluster
                .clone()
                .map(|c| Arc::new(c) as Arc<dyn Executor>),
            Host::Remote => None,
        }
    }

    /// Where the model files of `machine` (of `host`) are read: on its Ray node by jobs there, else on this
    /// machine (the demo fleet's machines are made up; its files are here).
    pub(super) fn files(&self, host: &Host, machine: &str) -> Box<dyn Files> {
        match (host, &self.cluster) {
            (Host::Cluster { .. }, Some(cluster)) => Box::new(cluster.files(machine)),
            _ => Box::new(ThisMachine),
        }
    }

    /// Registers `spec`, with where its supervisor (started by [`super::supervisor::launch`]) is told what
    /// to do; a remote engine is only shown, and has none. `None` once the server is shutting down: nothing
    /// new is registered then, so the shutdown stops every engine there is. `None` too where `halted` says
    /// the change that starts it was cancelled: asked under the lock a newer change reads what is
    /// registered under, after cancelling, so that a start either is seen and stopped by it or sees it.
    pub(super) fn register(
        &self,
        spec: &EngineSpec,
        begin: &Begin,
        halted: impl Fn() -> bool,
    ) -> Option<Registered> {
        let remote = self.executor(spec).is_none();
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
            api_key: None,
            reported: Vec::new(),
            asleep: None,
            last_wake: None,
            sleep_failed: None,
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
            let mut units = self.lock();
            if halted() {
                return None;
            }
            // Registered before its supervisor runs, so that the supervisor's first state is not lost.
            // One adopted is registered awake until it is found asleep: a sleep wanted of it is then
            // carried out in its GPU's order, before what starts beside it.
            let mut registered = spec.clone();
            registered.asleep &= !matches!(begin, Begin::Adopt(_));
            units.insert(Unit {
                spec: registered,
                status,
                control,
            });
        }
        // An adopted engine runs already: it says so before this returns, not once its supervisor runs.
        if let Begin::Adopt(running) = begin {
            let (_, port) = running.address();
            self.set(
                &spec.unit,
                EngineState::Starting,
                running.pid(),
                Some(port),
                None,
            );
        }
        Some((watcher, commands))
    }

    /// The engines registered now whose spec `pick` takes, each with its spec.
    pub(super) fn registered(
        &self,
        pick: impl Fn(&EngineSpec) -> bool,
    ) -> Vec<(Registration, EngineSpec)> {
        self.lock()
            .iter()
            .filter(|(_, unit)| pick(&unit.spec))
            .map(|(name, unit)| registration(name, unit))
            .collect()
    }

    /// Those of `units` registered now, each looked up: a few among many cost what they are.
    pub(super) fn registered_of<'a>(
        &self,
        units: impl IntoIterator<Item = &'a str>,
    ) -> Vec<(Registration, EngineSpec)> {
        let registered = self.lock();
        units
            .into_iter()
            .filter_map(|name| registered.get_key_value(name))
            .map(|(name, unit)| registration(name, unit))
            .collect()
    }

    /// Stops the engines of `units` registered now, side by side, and forgets each once it has exited.
    pub(super) async fn stop_units(&self, units: &[String]) {
        let registered = self.registered_of(units.iter().map(String::as_str));
        futures::future::join_all(registered.into_iter().map(|(r, _)| self.stop(r))).await;
    }

    /// Stops one registered engine and waits until it has exited (also when another change stops it at the
    /// same time), then forgets it: it, not one registered under its unit since, which a stop running
    /// beside a change's own may meet.
    pub(super) async fn stop(&self, registration: Registration) {
        if let Some(control) = &registration.control {
            let _ = control.send(Control::Stop).await;
            // Its supervisor ends once the engine is gone, dropping the other end.
            control.closed().await;
        }
        let mut all = self.lock();
        if all
            .get(&registration.unit)
            .is_some_and(|u| u.status.same_channel(&registration.status))
        {
            all.remove(&registration.unit);
        }
    }

    /// The count of `unit`'s requests in flight.
    pub(super) fn counter(&self, unit: &str) -> Arc<AtomicUsize> {
        self.in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(unit.to_owned())
            .or_default()
            .clone()
    }

    /// Takes a serving engine out of the rotation and waits, up to the drain grace, until its requests in
    /// flight are done. Says how many were left.
    pub(super) async fn drain(&self, unit: &str, pid: Option<u32>, port: u16) -> usize {
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

    pub(super) fn state(&self, unit: &str) -> Option<EngineState> {
        self.lock().get(unit).map(|u| u.status.borrow().state)
    }

    /// Records a new state (with its PID and port while it runs) and says so on the event stream.
    pub(super) fn set(
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
                        | EngineState::Asleep
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

    /// Its launch as it starts now: what an earlier run reported of its memory goes with the one before.
    pub(super) fn set_launch(&self, unit: &str, launch: &Launch) {
        if let Some(u) = self.lock().get(unit) {
            u.status.send_modify(|s| {
                s.launch = Some(launch.clone());
                s.reported.clear();
            });
        }
    }

    pub(super) fn set_reported(&self, unit: &str, reported: Vec<Bytes>) {
        if let Some(u) = self.lock().get(unit) {
            u.status.send_modify(|s| s.reported = reported);
        }
    }

    /// Asleep now, as `slept` measured it; or awake again, its wake having taken `woke`; or, with
    /// `failed`, still awake because it could not sleep.
    pub(super) fn set_sleep(
        &self,
        unit: &str,
        slept: Option<Slept>,
        woke: Option<Duration>,
        failed: Option<String>,
    ) {
        if let Some(u) = self.lock().get(unit) {
            u.status.send_modify(|s| {
                s.asleep = slept;
                s.last_wake = woke.or(s.last_wake);
                s.sleep_failed = failed;
            });
        }
    }

    pub(super) fn set_api_key(&self, unit: &str, key: Option<String>) {
        if let Some(u) = self.lock().get(unit) {
            u.status.send_modify(|s| s.api_key = key);
        }
    }

    pub(super) fn count_restart(&self, unit: &str) {
        if let Some(u) = self.lock().get(unit) {
            u.status.send_modify(|s| s.restarts += 1);
        }
    }

    /// The memory free on `spec`'s GPUs as it starts: what they offer less what the other running engines
    /// there take.
    pub(super) fn free_at_start(&self, spec: &EngineSpec) -> Bytes {
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
                        | EngineState::Asleep
                )
            })
            .map(|u| u.spec.memory())
            .sum();
        spec.gpu_offered.saturating_sub(taken)
    }

    pub(super) fn set_progress(&self, group: &str, progress: &Progress) {
        self.progress
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(group.to_owned(), progress.clone());
    }

    pub(super) fn step(
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
