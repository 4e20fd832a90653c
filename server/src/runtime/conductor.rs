//! Carries out the runtime's changes: in commit order on each GPU, side by side on different GPUs, so that
//! an engine that takes long to load (or never does) holds up only the changes on its own GPUs. A newer
//! change cancels the waits it makes moot; after a crash, the engines the previous server left are adopted
//! or stopped first.

use super::adoption::reconcile;
use super::engines::{Begin, Registration, Unit, Units};
use super::spec::EngineSpec;
use super::{Change, EngineState, Progress, Shared, StepProgress, StepStatus};
use placement::holder::Holder;
use placement::Step;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, PoisonError};
use tokio::sync::{mpsc, oneshot, watch};

/// What the runtime's handle asks of the conductor, in the order it asked.
pub(super) enum Order {
    Change(Change),
    /// Answer once the changes under way on these GPUs (`machine#index`; every GPU where `None`) have
    /// been carried out.
    Settled(Option<BTreeSet<Gpu>>, oneshot::Sender<()>),
    /// Answer once every change asked before has been taken up (an adoption has registered its engines),
    /// not carried out.
    TakenUp(oneshot::Sender<()>),
    /// Stop every engine.
    Shutdown(oneshot::Sender<()>),
    /// Cancel the changes under way and leave every engine as it is: the server exits, the engines go on.
    Leave(oneshot::Sender<()>),
}

/// A GPU as changes are ordered by: a machine's GPU, or an engine that holds none (a place of its own on
/// its machine, so that its changes keep their order too).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Gpu {
    machine: String,
    slot: Slot,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Slot {
    Index(u32),
    Engine(String),
}

impl Gpu {
    /// `machine`'s GPU `index`.
    pub(super) fn of(machine: &str, index: u32) -> Gpu {
        Gpu {
            machine: machine.to_owned(),
            slot: Slot::Index(index),
        }
    }
}

/// Set when a newer change makes a job moot, or the server shuts down.
pub(super) type Cancel = watch::Receiver<bool>;

/// The GPUs `spec` runs on.
fn gpus_of(spec: &EngineSpec) -> BTreeSet<Gpu> {
    if spec.gpus.is_empty() {
        return BTreeSet::from([Gpu {
            machine: spec.machine.clone(),
            slot: Slot::Engine(spec.unit.clone()),
        }]);
    }
    spec.gpus
        .iter()
        .map(|&g| Gpu::of(&spec.machine, g))
        .collect()
}

/// Part of a change, on some GPUs.
struct Job {
    /// The engines it may start: a newer change that wants one of them gone or different cancels it.
    starts: Vec<EngineSpec>,
    /// The engines it is to stop and not start again (a plan's members that leave): a change that cancels
    /// it stops them instead.
    stops: Vec<String>,
    cancel: watch::Sender<bool>,
}

/// What the jobs a newer change cancelled were to do besides what the change made moot: engines to start,
/// wake or put to sleep as they were wanted, and engines to stop.
struct Left {
    specs: Vec<EngineSpec>,
    stops: Vec<String>,
}

struct Conductor {
    shared: Arc<Shared>,
    /// For each GPU, the end of the last job queued there (its sender drops when it ends).
    tails: BTreeMap<Gpu, watch::Receiver<()>>,
    /// The jobs not ended yet.
    jobs: Vec<Job>,
}

/// Takes orders in commit order until the runtime is dropped.
pub(super) async fn conduct(shared: Arc<Shared>, mut orders: mpsc::UnboundedReceiver<Order>) {
    let mut conductor = Conductor {
        shared,
        tails: BTreeMap::new(),
        jobs: Vec::new(),
    };
    while let Some(order) = orders.recv().await {
        conductor.jobs.retain(|job| !job.cancel.is_closed());
        match order {
            Order::Change(change) => conductor.dispatch(change).await,
            Order::Settled(on, done) => {
                // A tail whose job has ended answers `has_changed` with an error.
                let tails: Vec<_> = match &on {
                    Some(on) => on
                        .iter()
                        .filter_map(|gpu| conductor.tails.get(gpu))
                        .collect(),
                    None => conductor.tails.values().collect(),
                };
                let tails: Vec<_> = tails
                    .into_iter()
                    .filter(|tail| tail.has_changed().is_ok())
                    .cloned()
                    .collect();
                if tails.is_empty() {
                    let _ = done.send(());
                    continue;
                }
                tokio::spawn(async move {
                    for mut tail in tails {
                        // Never sent to: ends when the job does.
                        let _ = tail.changed().await;
                    }
                    let _ = done.send(());
                });
            }
            Order::TakenUp(done) => {
                let _ = done.send(());
            }
            Order::Shutdown(done) => {
                conductor.cancel_all();
                let shared = &conductor.shared;
                shared.stop_units(&shared.unit_names()).await;
                let _ = done.send(());
            }
            Order::Leave(done) => {
                conductor.cancel_all();
                let _ = done.send(());
            }
        }
    }
}

impl Conductor {
    /// Cancels every change under way: the server is stopping.
    fn cancel_all(&self) {
        for job in &self.jobs {
            job.cancel.send_replace(true);
        }
    }

    async fn dispatch(&mut self, change: Change) {
        match change {
            Change::Reconcile(desired) => {
                reconcile(&self.shared, &desired).await;
                self.apply(desired);
            }
            Change::Apply(desired) => self.apply(desired),
            Change::Update { units, desired } => self.update(&units, desired),
            Change::Restart(spec) => {
                let spec = *spec;
                // The fleet sent it as committed, in commit order: a sleep or a wake of it still queued is
                // part of what it is wanted as, and that job, made moot, is cancelled.
                let unit = spec.unit.clone();
                let left = self.cancel(|s| s.unit == unit);
                let mut gpus = self.related(std::slice::from_ref(&unit), |u| u == unit);
                gpus.extend(gpus_of(&spec));
                let left = self.carry(left, &mut gpus);
                let mut starts = vec![spec.clone()];
                starts.extend(left.desired.iter().cloned());
                let stops = left.stops();
                self.queue(gpus, starts, stops, move |shared, mut cancel| async move {
                    left.free(&shared).await;
                    shared.stop_units(std::slice::from_ref(&unit)).await;
                    // A sleeper restarted is stopped, and starts cold at its next request.
                    if !spec.asleep {
                        let _ = shared.start_and_wait(spec, &mut cancel).await;
                    }
                    left.take(&shared, &mut cancel).await;
                });
            }
            Change::Plan {
                group,
                revision,
                steps,
                members,
            } => {
                let prefix = placement::holder::group_prefix(&group);
                let stopped: Vec<String> = steps
                    .iter()
                    .filter_map(|s| match s {
                        Step::Stop(m) => Some(m.clone()),
                        Step::Start(..) => None,
                    })
                    .collect();
                let touched = |unit: &str| {
                    unit.starts_with(&prefix) || stopped.iter().any(|m| is_member(unit, None, m))
                };
                // Those of them registered now, found by the group's prefix and the members' names. What
                // the stop steps stop is the engines of the members leaving that run now, wherever they
                // run (the router moving in leaves another group), not what runs under their names by the
                // time the steps are carried out: a newer change may have deployed one again elsewhere.
                let (touched_now, leaving): (Vec<String>, BTreeSet<String>) = {
                    let units = self.shared.lock();
                    let leaving: BTreeSet<String> = stopped
                        .iter()
                        .flat_map(|m| units.members_named(m))
                        .map(|(unit, _)| unit.to_owned())
                        .collect();
                    let touched_now = units
                        .with_prefix(&prefix)
                        .map(|(unit, _)| unit.to_owned())
                        .chain(leaving.iter().cloned())
                        .collect();
                    (touched_now, leaving)
                };
                // The rest of the group as it runs now that it no longer runs, and no step stops: stopped
                // before the steps (`carry_out`).
                let gone: Vec<String> = touched_now
                    .iter()
                    .filter(|u| !members.iter().any(|m| &m.unit == *u) && !leaving.contains(*u))
                    .filter(|u| !stopped.iter().any(|m| is_member(u, Some(&group), m)))
                    .cloned()
                    .collect();
                let mut left = self.cancel(|s| {
                    touched(&s.unit)
                        && !members
                            .iter()
                            .any(|m| m.unit == s.unit && as_running(m) == as_running(s))
                });
                // A member is as the plan has it, whatever a cancelled job wanted of it.
                left.specs
                    .retain(|s| !members.iter().any(|m| m.unit == s.unit));
                let mut gpus = self.related(&touched_now, touched);
                gpus.extend(members.iter().flat_map(gpus_of));
                let left = self.carry(left, &mut gpus);
                let mut starts = members.clone();
                starts.extend(left.desired.iter().cloned());
                // What runs of the group and is no member of it stops (the plan's last step).
                let mut stops: Vec<String> = touched_now
                    .into_iter()
                    .filter(|u| !members.iter().any(|m| &m.unit == u))
                    .collect();
                stops.extend(left.stops());
                self.queue(gpus, starts, stops, move |shared, mut cancel| async move {
                    left.free(&shared).await;
                    let plan = PlanChange {
                        group: &group,
                        revision,
                        steps: &steps,
                        members: &members,
                        leaving: &leaving,
                        gone: &gone,
                    };
                    carry_out(&shared, plan, &mut cancel).await;
                    left.take(&shared, &mut cancel).await;
                });
            }
        }
    }

    /// Carries out an [`super::Change::Apply`]: what runs and is no longer wanted at all stops at once, and
    /// one job per set of GPUs that an engine joins (a tensor-parallel engine holds several) is queued,
    /// which stops what still runs there and should not (an engine to start again otherwise: its stop and
    /// its start stay in order, a plan's steps too), then starts what is missing.
    fn apply(&mut self, desired: Vec<EngineSpec>) {
        // Each wanted engine by unit, with what it would be started as: looked up, never searched, so
        // that an apply costs what the fleet holds once and not once per engine (a fleet of 40,000).
        let wanted: HashMap<&str, String> = desired
            .iter()
            .map(|d| (d.unit.as_str(), d.fingerprint()))
            .collect();
        let wanted_as: HashMap<&str, String> = desired
            .iter()
            .map(|d| (d.unit.as_str(), as_running(d)))
            .collect();
        // A job that would put to sleep what is now to wake (or the other way) is moot too. What else it
        // was to do is wanted still, or not: `desired` is the whole of it, and the jobs below carry it out.
        let _ = self.cancel(|s| wanted_as.get(s.unit.as_str()) != Some(&as_running(s)));
        self.stop_now(
            self.shared
                .registered(|s| !wanted.contains_key(s.unit.as_str())),
        );
        // What runs now (its GPUs and what it was started as), and where queued jobs would start engines.
        let running: HashMap<String, (BTreeSet<Gpu>, String)> = self
            .shared
            .lock()
            .iter()
            .map(|(name, u)| (name.clone(), (gpus_of(&u.spec), as_running(&u.spec))))
            .collect();
        let mut queued: HashMap<&str, BTreeSet<Gpu>> = HashMap::new();
        for start in self.jobs.iter().flat_map(|j| &j.starts) {
            queued
                .entry(start.unit.as_str())
                .or_default()
                .extend(gpus_of(start));
        }
        // An engine joins the GPUs it is wanted on with those it runs or is about to start on (it may move),
        // so that its stop and its start fall in one job, in that order.
        let mut joins: Vec<BTreeSet<Gpu>> = desired
            .iter()
            .map(|d| {
                let mut gpus = gpus_of(d);
                if let Some((now, _)) = running.get(&d.unit) {
                    gpus.extend(now.iter().cloned());
                }
                if let Some(later) = queued.get(d.unit.as_str()) {
                    gpus.extend(later.iter().cloned());
                }
                gpus
            })
            .collect();
        joins.extend(running.values().map(|(gpus, _)| gpus.clone()));
        // Every GPU that has run anything: what runs there and is no longer wanted stops.
        joins.extend(self.tails.keys().map(|g| BTreeSet::from([g.clone()])));
        let parts = Parts::of(joins);
        // Only a part where something is to change gets a job: an engine wanted and not running as wanted,
        // one running that is wanted otherwise, or a job still under way there (what it does may need
        // undoing). The others, most of a large fleet at any write, cost nothing more.
        let mut busy = vec![false; parts.len()];
        let mut starts: Vec<Vec<EngineSpec>> = vec![Vec::new(); parts.len()];
        for d in &desired {
            let Some(part) = parts.part_of(&gpus_of(d)) else {
                continue;
            };
            if running.get(&d.unit).map(|(_, print)| print) != wanted_as.get(d.unit.as_str()) {
                busy[part] = true;
            }
            starts[part].push(d.clone());
        }
        for (name, (gpus, print)) in &running {
            if let Some(part) = parts.part_of(gpus) {
                if wanted_as.get(name.as_str()) != Some(print) {
                    busy[part] = true;
                }
            }
        }
        for gpu in self.tails.keys() {
            let gpu = BTreeSet::from([gpu.clone()]);
            if self.under_way(&gpu) {
                if let Some(part) = parts.part_of(&gpu) {
                    busy[part] = true;
                }
            }
        }
        for ((part, starts), busy) in parts.into_sets().into_iter().zip(starts).zip(busy) {
            if !busy {
                continue;
            }
            let within = Within::Gpus(part.clone());
            self.queue_apply(part, starts, within);
        }
    }

    /// Carries out a [`super::Change::Update`], as [`Conductor::apply`] does for `units` alone: what of them
    /// runs and is no longer wanted stops at once, and each wanted one not running as wanted (or with a
    /// job or a stop under way on its GPUs) gets a job of its own on the GPUs it is wanted on and those it
    /// runs or is about to start on, which stops it where it runs otherwise, then starts it. Every other
    /// engine is left as it is, so that a write costs the engines it changed.
    fn update(&mut self, units: &[String], mut desired: Vec<EngineSpec>) {
        let mut wanted: HashMap<String, String> = desired
            .iter()
            .map(|d| (d.unit.clone(), d.fingerprint()))
            .collect();
        let wanted_as: HashMap<&str, String> = desired
            .iter()
            .map(|d| (d.unit.as_str(), as_running(d)))
            .collect();
        let mut scope: HashSet<&str> = units.iter().map(String::as_str).collect();
        let left = self.cancel(|s| {
            scope.contains(s.unit.as_str())
                && wanted_as.get(s.unit.as_str()) != Some(&as_running(s))
        });
        // What the cancelled jobs were to do besides is done by this change's jobs, with its own: their
        // engines to stop are not wanted, so they stop at once below.
        for spec in left.specs {
            if !wanted.contains_key(&spec.unit) {
                wanted.insert(spec.unit.clone(), spec.fingerprint());
                desired.push(spec);
            }
        }
        let scope_left: Vec<String> = desired
            .iter()
            .map(|d| d.unit.clone())
            .chain(left.stops.into_iter().filter(|u| !wanted.contains_key(u)))
            .filter(|u| !scope.contains(u.as_str()))
            .collect();
        scope.extend(scope_left.iter().map(String::as_str));
        let (gone, running): (Vec<_>, Vec<_>) = self
            .shared
            .registered_of(scope.iter().copied())
            .into_iter()
            .partition(|(_, spec)| !wanted.contains_key(spec.unit.as_str()));
        self.stop_now(gone);
        // Each engine to start (again), with the GPUs it joins: those it is wanted on, runs on, or is
        // about to start on.
        let mut changed: Vec<(EngineSpec, BTreeSet<Gpu>)> = Vec::new();
        for spec in desired {
            let now = running.iter().find(|(_, s)| s.unit == spec.unit);
            let queued: Vec<BTreeSet<Gpu>> = self
                .jobs
                .iter()
                .flat_map(|j| &j.starts)
                .filter(|s| s.unit == spec.unit)
                .map(gpus_of)
                .collect();
            // Registered as wanted is not enough: a stop of it may be under way (a change before this one
            // unloaded it), and it is gone once that ends. Only with nothing under way on its GPUs is it
            // left as it is; else a job behind that work starts it, if it is gone by then.
            let as_wanted = now.is_some_and(|(_, s)| {
                Some(&s.fingerprint()) == wanted.get(&s.unit)
                    && s.asleep == spec.asleep
                    && !self.under_way(&gpus_of(s))
            });
            if as_wanted && queued.is_empty() {
                continue;
            }
            let mut gpus = gpus_of(&spec);
            gpus.extend(now.iter().flat_map(|(_, s)| gpus_of(s)));
            gpus.extend(queued.into_iter().flatten());
            changed.push((spec, gpus));
        }
        // Those that share a GPU go in one job, as an apply's do: each of them that runs otherwise stops
        // before any starts, so that a share that grows (or a GPU shared otherwise: every engine on it
        // restarts) never starts beside one still to shrink.
        let parts = Parts::of(changed.iter().map(|(_, gpus)| gpus.clone()).collect());
        let mut starts: Vec<Vec<EngineSpec>> = vec![Vec::new(); parts.len()];
        for (spec, gpus) in changed {
            if let Some(part) = parts.part_of(&gpus) {
                starts[part].push(spec);
            }
        }
        for (part, starts) in parts.into_sets().into_iter().zip(starts) {
            let within = Within::Units(starts.iter().map(|s| s.unit.clone()).collect());
            self.queue_apply(part, starts, within);
        }
    }

    /// Whether a job or a stop queued on one of `gpus` has not ended yet.
    fn under_way(&self, gpus: &BTreeSet<Gpu>) -> bool {
        // A tail whose job has ended answers `has_changed` with an error.
        gpus.iter()
            .filter_map(|gpu| self.tails.get(gpu))
            .any(|tail| tail.has_changed().is_ok())
    }

    /// Stops each of `removed` now, whatever is queued on its GPUs: a stop never needs memory, so it never
    /// waits behind a start still loading there (which may take its start timeout, times its retries). What
    /// is queued on those GPUs after this starts only once the stop is over as well, its memory free.
    fn stop_now(&mut self, removed: Vec<(Registration, EngineSpec)>) {
        for (registration, spec) in removed {
            tracing::debug!("{} is no longer wanted: it stops at once", spec.unit);
            let (ended, before) = self.last_on(gpus_of(&spec));
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let _ended = ended;
                shared.stop(registration).await;
                // The tail it leaves on its GPUs stands for what was queued there before it, too.
                for mut job in before {
                    let _ = job.changed().await;
                }
            });
        }
    }

    /// Queues a job that brings the engines `within` takes to `starts` ([`apply_to`]) on `gpus`.
    fn queue_apply(&mut self, gpus: BTreeSet<Gpu>, starts: Vec<EngineSpec>, within: Within) {
        let desired = Arc::new(starts.clone());
        self.queue(
            gpus,
            starts,
            Vec::new(),
            move |shared, mut cancel| async move {
                apply_to(&shared, &desired, &within, &mut cancel).await;
            },
        );
    }

    /// Cancels the jobs that may start an engine `moot` says a newer change no longer wants as it is, and
    /// returns the other engines those jobs were to start (or wake, or put to sleep): still wanted as they
    /// were, as the newer change is not about them, and perhaps stopped already to start again. The newer
    /// change's own job must carry them out, not one of their own before it: the room a wake of theirs was
    /// committed with may come from a sleep or a stop of the newer change (the sleep committed beside the
    /// wake being the one made moot), and only within one job does every stop and sleep come before any
    /// wake or start.
    fn cancel(&mut self, moot: impl Fn(&EngineSpec) -> bool) -> Left {
        let mut specs: BTreeMap<String, EngineSpec> = BTreeMap::new();
        let mut stops: BTreeSet<String> = BTreeSet::new();
        for job in &self.jobs {
            if !*job.cancel.borrow() && job.starts.iter().any(&moot) {
                job.cancel.send_replace(true);
                for start in job.starts.iter().filter(|s| !moot(s)) {
                    specs.insert(start.unit.clone(), start.clone());
                }
                stops.extend(job.stops.iter().cloned());
            }
        }
        Left {
            stops: stops
                .into_iter()
                .filter(|u| !specs.contains_key(u))
                .collect(),
            specs: specs.into_values().collect(),
        }
    }

    /// What cancelled jobs left (`left`), to be carried out by a job on `gpus`, which it joins with the
    /// GPUs those engines run on or were to start on.
    fn carry(&self, left: Left, gpus: &mut BTreeSet<Gpu>) -> Carried {
        let units: Vec<String> = left
            .specs
            .iter()
            .map(|s| s.unit.clone())
            .chain(left.stops)
            .collect();
        gpus.extend(self.related(&units, |unit| units.iter().any(|u| u == unit)));
        gpus.extend(left.specs.iter().flat_map(gpus_of));
        Carried {
            within: Within::Units(units.into_iter().collect()),
            desired: Arc::new(left.specs),
        }
    }

    /// The GPUs of the engines `running` names (those of them registered now), and of those `pick` takes
    /// as a queued job would start them: the units are looked up, not every engine walked.
    fn related(&self, running: &[String], pick: impl Fn(&str) -> bool) -> BTreeSet<Gpu> {
        let running: Vec<BTreeSet<Gpu>> = {
            let units = self.shared.lock();
            running
                .iter()
                .filter_map(|unit| units.get(unit))
                .map(|u| gpus_of(&u.spec))
                .collect()
        };
        let queued = self
            .jobs
            .iter()
            .flat_map(|j| &j.starts)
            .filter(|s| pick(&s.unit))
            .map(gpus_of);
        running.into_iter().chain(queued).flatten().collect()
    }

    /// Makes a new job the last on `gpus`: what is queued there after it waits until the sender it gets
    /// is dropped. Also the ends of the jobs that were last there before it.
    fn last_on(&mut self, gpus: BTreeSet<Gpu>) -> (watch::Sender<()>, Vec<watch::Receiver<()>>) {
        let (ended, tail) = watch::channel(());
        let before = gpus
            .into_iter()
            .filter_map(|gpu| self.tails.insert(gpu, tail.clone()))
            .collect();
        (ended, before)
    }

    /// Runs `work` once every job queued before it on `gpus` has ended (skipping it when cancelled by then).
    fn queue<F, Fut>(
        &mut self,
        gpus: BTreeSet<Gpu>,
        starts: Vec<EngineSpec>,
        stops: Vec<String>,
        work: F,
    ) where
        F: FnOnce(Arc<Shared>, Cancel) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        // What a job does, for following the order of changes (debug): written only when it is read, as a
        // write to a large fleet queues thousands of jobs.
        let what = tracing::enabled!(tracing::Level::DEBUG).then(|| {
            let starting: Vec<&str> = starts.iter().map(|s| s.unit.as_str()).collect();
            let on: Vec<String> = gpus
                .iter()
                .map(|g| format!("{}:{:?}", g.machine, g.slot))
                .collect();
            format!("starting {starting:?}, stopping {stops:?}, on {on:?}")
        });
        let log = move |how: &str| {
            if let Some(what) = &what {
                tracing::debug!("a job {what} {how}");
            }
        };
        log("is queued");
        let (ended, before) = self.last_on(gpus);
        let (cancel, cancelled) = watch::channel(false);
        self.jobs.push(Job {
            starts,
            stops,
            cancel,
        });
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let _ended = ended;
            // Waited out even when cancelled: the job after this one must not overtake the ones before.
            for mut job in before {
                let _ = job.changed().await;
            }
            if *cancelled.borrow() {
                log("was cancelled before it ran");
                return;
            }
            log("runs");
            work(shared, cancelled).await;
            log("has ended");
        });
    }
}

/// The connected parts of some sets of GPUs: sets that share a GPU are one part. Found with a union-find
/// over the GPUs, so that 40,000 engines on 10,000 GPUs take one pass, not one pass per part.
struct Parts {
    /// Each GPU's index in `parent`.
    index: HashMap<Gpu, usize>,
    /// The union-find forest over the GPUs.
    parent: Vec<usize>,
    /// Each root's part number.
    numbers: HashMap<usize, usize>,
    /// The GPUs of each part.
    sets: Vec<BTreeSet<Gpu>>,
}

impl Parts {
    fn of(joins: Vec<BTreeSet<Gpu>>) -> Parts {
        let mut index: HashMap<Gpu, usize> = HashMap::new();
        let mut parent: Vec<usize> = Vec::new();
        for join in &joins {
            let mut first = None;
            for gpu in join {
                let id = *index.entry(gpu.clone()).or_insert_with(|| {
                    parent.push(parent.len());
                    parent.len() - 1
                });
                match first {
                    None => first = Some(id),
                    Some(f) => {
                        let (a, b) = (root(&mut parent, f), root(&mut parent, id));
                        if a != b {
                            parent[b] = a;
                        }
                    }
                }
            }
        }
        let mut numbers: HashMap<usize, usize> = HashMap::new();
        let mut sets: Vec<BTreeSet<Gpu>> = Vec::new();
        let mut gpus: Vec<(&Gpu, usize)> = index.iter().map(|(g, &i)| (g, i)).collect();
        gpus.sort();
        for (gpu, id) in gpus {
            let r = root(&mut parent, id);
            let number = *numbers.entry(r).or_insert_with(|| {
                sets.push(BTreeSet::new());
                sets.len() - 1
            });
            sets[number].insert(gpu.clone());
        }
        Parts {
            index,
            parent,
            numbers,
            sets,
        }
    }

    fn len(&self) -> usize {
        self.sets.len()
    }

    /// The part `gpus` lie in (all of them lie in one: they were a join).
    fn part_of(&self, gpus: &BTreeSet<Gpu>) -> Option<usize> {
        let mut id = *self.index.get(gpus.first()?)?;
        while self.parent[id] != id {
            id = self.parent[id];
        }
        self.numbers.get(&id).copied()
    }

    fn into_sets(self) -> Vec<BTreeSet<Gpu>> {
        self.sets
    }
}

/// The root of `id`'s tree, the path to it halved on the way.
fn root(parent: &mut [usize], mut id: usize) -> usize {
    while parent[id] != id {
        parent[id] = parent[parent[id]];
        id = parent[id];
    }
    id
}

/// Why a start did not end healthy.
#[derive(Debug, thiserror::Error)]
pub(super) enum StartError {
    /// It failed (its state says why).
    #[error("{0}")]
    Failed(String),
    /// A newer change stops it or starts it otherwise: waiting for it is moot.
    #[error("a newer change made waiting for it moot")]
    Superseded,
    /// The server is shutting down.
    #[error("the server is shutting down")]
    Closing,
}

/// Stops what should not run as it does among the engines `within` takes, then starts what is missing
/// there, one at a time: an engine that sizes itself by the memory free at its start (SGLang) must not
/// start while another is still loading.
async fn apply_to(
    shared: &Arc<Shared>,
    desired: &[EngineSpec],
    within: &Within,
    cancel: &mut Cancel,
) {
    free(shared, desired, within).await;
    take(shared, desired, within, cancel).await;
}

/// Engines of cancelled jobs that a newer change's job carries out beside its own: their stops and sleeps
/// before its work, their wakes and starts after it.
struct Carried {
    within: Within,
    desired: Arc<Vec<EngineSpec>>,
}

impl Carried {
    /// The engines it is to stop (those of its units it does not want).
    fn stops(&self) -> Vec<String> {
        match &self.within {
            Within::Units(units) => units
                .iter()
                .filter(|u| !self.desired.iter().any(|s| &s.unit == *u))
                .cloned()
                .collect(),
            Within::Gpus(_) | Within::Group(_) => Vec::new(),
        }
    }

    async fn free(&self, shared: &Arc<Shared>) {
        free(shared, &self.desired, &self.within).await;
    }

    async fn take(&self, shared: &Arc<Shared>, cancel: &mut Cancel) {
        if !self.desired.is_empty() {
            take(shared, &self.desired, &self.within, cancel).await;
        }
    }
}

/// The half of [`apply_to`] that frees memory: what runs `within` and is not wanted as it runs stops, and
/// what is wanted asleep is put to sleep (or stopped, where it cannot be).
async fn free(shared: &Arc<Shared>, desired: &[EngineSpec], within: &Within) {
    let stale: Vec<String> = {
        let units = shared.lock();
        within
            .registered(&units)
            .filter(|(name, unit)| {
                desired
                    .iter()
                    .find(|s| &s.unit == name)
                    .is_none_or(|s| s.fingerprint() != unit.spec.fingerprint())
            })
            .map(|(name, _)| name.to_owned())
            .collect()
    };
    shared.stop_units(&stale).await;
    // Then the sleeps, side by side.
    let sleeps = turning(shared, desired, within, true);
    let slept = sleeps.iter().map(|s| shared.sleep_or_wake(&s.unit, true));
    let mut awake = Vec::new();
    for (spec, slept) in sleeps.iter().zip(futures::future::join_all(slept).await) {
        if let Err(why) = slept {
            tracing::warn!(
                "{} could not be put to sleep, so it stops: {why}",
                spec.unit
            );
            awake.push(spec.unit.clone());
        }
    }
    // The plan counts it as asleep: awake beside what starts next it would overfill its GPU.
    shared.stop_units(&awake).await;
}

/// Those of `desired` within that run, as they are wanted to, but `asleep` where they are awake or awake
/// where they are asleep.
fn turning<'a>(
    shared: &Shared,
    desired: &'a [EngineSpec],
    within: &Within,
    asleep: bool,
) -> Vec<&'a EngineSpec> {
    let units = shared.lock();
    desired
        .iter()
        .filter(|s| within.holds(s) && s.asleep == asleep)
        .filter(|s| {
            units.get(&s.unit).is_some_and(|u| {
                u.spec.asleep != s.asleep && u.spec.fingerprint() == s.fingerprint()
            })
        })
        .collect()
}

/// The half of [`apply_to`] that takes memory, once [`free`] has run: the wakes, then the starts.
async fn take(shared: &Arc<Shared>, desired: &[EngineSpec], within: &Within, cancel: &mut Cancel) {
    for spec in turning(shared, desired, within, false) {
        if let Err(why) = shared.sleep_or_wake(&spec.unit, false).await {
            tracing::warn!("{} could not be woken: {why}", spec.unit);
        }
    }
    // A sleeper is only ever an engine that fell asleep: one wanted asleep and not running as it (gone,
    // or to restart for a change) is not started, as it would load its whole share where the plan holds
    // only what it kept asleep. The fleet unloads its model; its next request starts it cold.
    for spec in desired.iter().filter(|s| within.holds(s) && !s.asleep) {
        if !shared.has(&spec.unit) {
            // A start that fails says so in its state and events; the others still start.
            match shared.start_and_wait(spec.clone(), cancel).await {
                Ok(()) | Err(StartError::Failed(_)) => {}
                Err(StartError::Superseded | StartError::Closing) => return,
            }
        }
    }
}

/// How an engine runs, for telling whether a change has anything to do for it: what it is, and whether it
/// sleeps.
fn as_running(spec: &EngineSpec) -> String {
    let print = spec.fingerprint();
    if spec.asleep {
        print + " asleep"
    } else {
        print
    }
}

/// What a job is about: the engines it may stop are those registered within it, found by look-up (a
/// machine's engines, a unit, a group's), not by a walk through every engine of the fleet, which at a
/// start is one walk for each of its GPUs.
pub(super) enum Within {
    /// Those on some of these GPUs.
    Gpus(BTreeSet<Gpu>),
    /// These units.
    Units(BTreeSet<String>),
    /// The units whose name begins with this group's prefix.
    Group(String),
}

impl Within {
    pub(super) fn holds(&self, spec: &EngineSpec) -> bool {
        match self {
            Within::Gpus(gpus) => !gpus_of(spec).is_disjoint(gpus),
            Within::Units(units) => units.contains(&spec.unit),
            Within::Group(prefix) => spec.unit.starts_with(prefix.as_str()),
        }
    }

    /// The engines registered within.
    pub(super) fn registered<'a>(
        &'a self,
        units: &'a Units,
    ) -> Box<dyn Iterator<Item = (&'a str, &'a Unit)> + 'a> {
        match self {
            Within::Gpus(gpus) => {
                let machines: BTreeSet<&str> = gpus.iter().map(|g| g.machine.as_str()).collect();
                Box::new(
                    machines
                        .into_iter()
                        .flat_map(|m| units.on_machine(m))
                        .filter(|(_, unit)| self.holds(&unit.spec)),
                )
            }
            Within::Units(names) => Box::new(
                names
                    .iter()
                    .filter_map(|name| units.get_key_value(name))
                    .map(|(n, u)| (n.as_str(), u)),
            ),
            Within::Group(prefix) => Box::new(units.with_prefix(prefix)),
        }
    }
}

/// A committed plan change, as [`carry_out`] carries it out.
struct PlanChange<'a> {
    group: &'a str,
    revision: i64,
    steps: &'a [Step],
    /// The engines the group runs once it is carried out.
    members: &'a [EngineSpec],
    /// The engines of the members it stops, as they ran when it was committed.
    leaving: &'a BTreeSet<String>,
    /// The other engines of the group that ran when it was committed, that it no longer runs and no step
    /// stops.
    gone: &'a [String],
}

/// A committed plan change of `group`: its steps in order, then whatever of the group is still not as
/// committed. Cancelled, it stops where it is: the newer change brings the group where it should be.
async fn carry_out(shared: &Arc<Shared>, plan: PlanChange<'_>, cancel: &mut Cancel) {
    let PlanChange {
        group,
        revision,
        steps,
        members,
        leaving,
        gone,
    } = plan;
    let mut progress = Progress {
        revision,
        steps: steps
            .iter()
            .map(|step| {
                let (action, member) = match step {
                    Step::Stop(m) => ("stop", m),
                    Step::Start(m, _) => ("start", m),
                };
                StepProgress {
                    action: action.to_owned(),
                    member: member.clone(),
                    status: StepStatus::Waiting,
                    message: None,
                }
            })
            .collect(),
    };
    shared.set_progress(group, &progress);
    // What ran of the group as it was committed and is none of its engines, nor a member the steps stop
    // (a replica the plan has wait for room, one a scale step removed), stops before anything starts:
    // the plan does not hold its memory. What a newer change started since is that change's.
    shared.stop_units(gone).await;
    for (i, step) in steps.iter().enumerate() {
        // A stop first lets its engine finish the requests it has in flight.
        let doing = matches!(step, Step::Stop(_)).then(|| "draining".to_owned());
        shared.step(group, &mut progress, i, StepStatus::Running, doing);
        let outcome = match step {
            // Wherever it ran as the plan was committed: the router moving in stops in the group it leaves.
            Step::Stop(member) => {
                let units: Vec<String> = shared
                    .lock()
                    .members_named(member)
                    .map(|(unit, _)| unit.to_owned())
                    .filter(|unit| leaving.contains(unit))
                    .collect();
                shared.stop_units(&units).await;
                Ok(())
            }
            Step::Start(member, _) => {
                let mut outcome = Ok(());
                for spec in members
                    .iter()
                    .filter(|s| is_member(&s.unit, Some(group), member) && !s.asleep)
                {
                    if shared.has(&spec.unit) {
                        continue;
                    }
                    match shared.start_and_wait(spec.clone(), cancel).await {
                        Ok(()) => {}
                        Err(StartError::Failed(why)) => {
                            outcome = Err(format!("{} on {}: {why}", member, spec.machine));
                        }
                        Err(halt) => {
                            let why = format!("{} on {}: {halt}", member, spec.machine);
                            shared.step(group, &mut progress, i, StepStatus::Failed, Some(why));
                            return;
                        }
                    }
                }
                outcome
            }
        };
        match outcome {
            Ok(()) => shared.step(group, &mut progress, i, StepStatus::Done, None),
            Err(why) => shared.step(group, &mut progress, i, StepStatus::Failed, Some(why)),
        }
    }
    let within = Within::Group(placement::holder::group_prefix(group));
    apply_to(shared, members, &within, cancel).await;
}

/// Whether `unit` is `member` of `group` (of any group when `None`) on some machine.
pub(super) fn is_member(unit: &str, group: Option<&str>, member: &str) -> bool {
    matches!(Holder::parse(unit), Holder::Member { group: g, member: m, .. }
        if m == member && group.is_none_or(|want| want == g))
}

/// Starting an engine in a change's order: after its neighbours have loaded, and no longer than the change
/// still wants it.
impl Shared {
    /// Starts `spec` and waits until it is healthy, or has failed, or `cancel` says the wait is moot.
    pub(super) async fn start_and_wait(
        self: &Arc<Self>,
        spec: EngineSpec,
        cancel: &mut Cancel,
    ) -> Result<(), StartError> {
        let unit = spec.unit.clone();
        let remote = self.executor(&spec).is_none();
        // An engine sizes itself by the memory free as it starts: not while another beside it still loads
        // (one that a cancelled change left loading, say).
        let mut waited_for = None;
        while let Some(beside) = self.loading_beside(&spec).filter(|_| !remote) {
            if waited_for.as_ref() != Some(&beside) {
                tracing::info!(
                    "{unit} waits for {beside}, still loading beside it, before it starts"
                );
                waited_for = Some(beside);
            }
            tokio::select! {
                () = tokio::time::sleep(self.settings.health_interval) => {}
                _ = cancel.wait_for(|cancelled| *cancelled) => return Err(self.halted()),
            }
        }
        // A newer change that no longer wants it cancels this job, then stops what it finds registered: a
        // start it made moot is either registered by then (and stopped) or sees the cancel as it registers.
        let mut watcher = super::supervisor::launch(self, spec, Begin::Start, || *cancel.borrow())
            .ok_or_else(|| self.halted())?;
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

    /// Another engine on one of `spec`'s GPUs that is still loading, if any.
    pub(super) fn loading_beside(&self, spec: &EngineSpec) -> Option<String> {
        self.lock()
            .values()
            .find(|u| {
                u.spec.unit != spec.unit
                    && u.spec.machine == spec.machine
                    && u.spec.gpus.iter().any(|g| spec.gpus.contains(g))
                    && u.status.borrow().state == EngineState::Starting
            })
            .map(|u| u.spec.unit.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The plain statement of the rule: merge every set into the parts it touches, one by one.
    fn merged(joins: &[BTreeSet<Gpu>]) -> BTreeSet<BTreeSet<Gpu>> {
        let mut parts: Vec<BTreeSet<Gpu>> = Vec::new();
        for join in joins {
            let (touching, apart): (Vec<_>, Vec<_>) =
                parts.into_iter().partition(|p| !p.is_disjoint(join));
            parts = apart;
            parts.push(touching.into_iter().flatten().chain(join.clone()).collect());
        }
        parts.into_iter().filter(|p| !p.is_empty()).collect()
    }

    fn joins() -> impl Strategy<Value = Vec<BTreeSet<Gpu>>> {
        prop::collection::vec(
            prop::collection::btree_set(
                (0u32..40).prop_map(|g| Gpu::of(&format!("m{}", g / 8), g % 8)),
                1..4,
            ),
            0..60,
        )
    }

    proptest! {
        #[test]
        fn gpus_that_engines_join_are_one_part_exactly_as_merging_set_by_set_makes_them(joins in joins()) {
            let parts = Parts::of(joins.clone());
            for join in &joins {
                let part = parts.part_of(join).unwrap();
                prop_assert!(join.is_subset(&parts.sets[part]));
            }
            let found: BTreeSet<BTreeSet<Gpu>> = parts.into_sets().into_iter().collect();
            prop_assert_eq!(found, merged(&joins));
        }
    }
}
