//! The fleet: the one owner of committed state (workers, the catalog, sharing groups and their plans) and of
//! the ledger, who holds which GPU.
//!
//! The ledger is what the inventory and the committed state give ([`ledger::Ledger::build`], the oracle that
//! [`Fleet::check`] holds it against). Every write goes one way ([`Fleet::write`]): in a task of its own, so
//! that a client that goes away cannot stop it half-way, it takes the lock, decides with `placement`,
//! writes its rows, then settles: by the rows it changed where it changed workers, groups and catalog
//! models alone ([`Fleet::settle_rows`], the ledger mended in place), else whole ([`Fleet::settle`], the
//! committed state read back and the ledger built from it); either way the over-commit policy, pending
//! work that now fits, who holds what for usage, and the commit; only then are the new state, the read
//! views and the runtime's orders installed, none of which can fail.

mod changes;
mod check;
mod committed;
pub mod deployments;
pub mod groups;
pub mod housekeeping;
mod ledger;
pub mod usage;

pub mod authority;
pub mod calls;
mod catalog;
pub(crate) mod cluster;
pub mod demand;
mod engines;
pub mod interference;
mod machines;
mod mig;
pub mod peaks;
pub mod readings;
pub mod repack;
pub mod replicas;
mod sharing;
mod workers;

pub use machines::{GpuView, MachineView, SharerView};
pub use workers::WorkerView;

use crate::error::ApiError;
use crate::inventory::LocalGpus;
use crate::runtime::{Change, Hosts, Runtime};
use committed::Committed;
use ledger::Ledger;
use placement::{GpuRef, Inventory};
use sqlx::SqlitePool;
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;
use tokio::sync::Mutex;

/// The fleet service.
pub struct Fleet {
    pool: SqlitePool,
    /// Runs what the committed state says should run.
    runtime: Arc<Runtime>,
    /// Which machines engines can be started for: the cluster's grow as it lists new ones.
    hosts: RwLock<Arc<Hosts>>,
    /// The write lock, over what was last committed and the ledger built from it.
    state: Mutex<State>,
    /// What reads are answered from, published after each committed write, so that a read waits on neither
    /// the write lock nor the database.
    views: RwLock<Arc<Views>>,
    /// The cluster's machines whose node is dead or gone, and since when (RFC 3339).
    unreachable: std::sync::RwLock<BTreeMap<String, String>>,
    /// What the gateway carried, counted for the usage report and `/metrics`.
    calls: calls::Calls,
    /// When on-demand models were last used, and which wait to load.
    activity: Arc<demand::Activity>,
    /// Each model's latency through the gateway, and the models slowed by their neighbours.
    latencies: interference::Latencies,
    /// The autoscaled models' load of late and their scale decisions.
    scaling: replicas::Scaling,
    /// The repack being carried out, or the last one.
    repack: std::sync::Mutex<Option<repack::Repacking>>,
    /// Whether the Ray cluster answers, where there is one (`--ray`).
    cluster_status: std::sync::RwLock<Option<cluster::ClusterStatus>>,
    /// What each engine was last measured to hold on each GPU, by machine, GPU index and holder: the
    /// memory the driver reports for its processes.
    measured: std::sync::RwLock<BTreeMap<(String, u32, String), placement::Bytes>>,
    /// Why each GPU the last reading of its machine found unhealthy is so, by machine and GPU index.
    problems: std::sync::RwLock<BTreeMap<(String, u32), String>>,
    /// This machine's GPUs being cut into MIG instances or joined back now.
    mig_busy: std::sync::Mutex<std::collections::BTreeSet<placement::GpuRef>>,
    /// Bumped when a cut or a join of this machine's GPUs begins or ends: a reading taken before is stale.
    local_generation: std::sync::atomic::AtomicU64,
}

/// What was last committed, and the ledger built from it.
struct State {
    committed: Arc<Committed>,
    ledger: Ledger,
    /// Since when (ms since the epoch) each GPU over-committed now has been so, write after write: the
    /// over-commit policy stops work there only once that has lasted (`--evict-after-s`).
    over_since: BTreeMap<GpuRef, u64>,
}

/// A write that mends the ledger in place, row by row: until [`Mend::done`], its drop builds the ledger
/// again from what is committed, so that a write that fails, or panics part-way (its task unwinds, and the
/// state's lock, Tokio's, is not poisoned), leaves the ledger as it was before the write, not half-mended.
struct Mend<'a> {
    state: &'a mut State,
    done: bool,
}

impl<'a> Mend<'a> {
    fn new(state: &'a mut State) -> Mend<'a> {
        Mend { state, done: false }
    }

    /// The write was committed: the ledger as mended is the committed state's.
    fn done(mut self) {
        self.done = true;
    }
}

impl Drop for Mend<'_> {
    fn drop(&mut self) {
        if !self.done {
            let inventory = self.state.ledger.inventory().clone();
            self.state.ledger = Ledger::build(inventory, &self.state.committed);
        }
    }
}

impl State {
    /// Whether the over-commit policy may stop work on `gpu` at `now_ms`: over-committed for `grace`
    /// (at once, where there is none).
    fn eviction_due(&self, gpu: &GpuRef, now_ms: u64, grace: Duration) -> bool {
        eviction_due(&self.over_since, gpu, now_ms, grace)
    }
}

/// [`State::eviction_due`], on what it keeps of each GPU over-committed.
fn eviction_due(
    over_since: &BTreeMap<GpuRef, u64>,
    gpu: &GpuRef,
    now_ms: u64,
    grace: Duration,
) -> bool {
    grace.is_zero()
        || over_since
            .get(gpu)
            .is_some_and(|since| now_ms.saturating_sub(*since) >= grace.as_millis() as u64)
}

/// The GPUs `ledger` finds over-committed, each since when it has been (from `before`, else `now_ms`).
fn overcommitted_since(
    ledger: &Ledger,
    before: &BTreeMap<GpuRef, u64>,
    now_ms: u64,
) -> BTreeMap<GpuRef, u64> {
    ledger
        .scheduler()
        .overcommitted()
        .into_iter()
        .map(|o| {
            let since = before.get(&o.gpu).copied().unwrap_or(now_ms);
            (o.gpu, since)
        })
        .collect()
}

/// The read side, as of the last committed write.
/// Persistent maps, so that the views after a write share all but what it touched with those before.
struct Views {
    /// Every worker by arrival order (oldest first).
    workers: imbl::OrdMap<i64, Arc<WorkerView>>,
    /// The workers placed on each machine, by arrival order.
    on_machine: imbl::OrdMap<String, imbl::OrdSet<i64>>,
    /// The workers placed on each machine of the inventory, as the JSON answer: the API's most read
    /// route is served as it was serialized at the last write.
    by_machine: imbl::OrdMap<String, axum::body::Bytes>,
    /// The same with secrets redacted, for everyone but admins.
    by_machine_redacted: imbl::OrdMap<String, axum::body::Bytes>,
    /// Each machine with its GPUs and who holds them.
    machines: Vec<Arc<MachineView>>,
    /// The committed state itself, for the reads that need more than the views above.
    committed: Arc<Committed>,
    /// Committed holders that hold nothing now (their GPU left the inventory), and why.
    unplaced: BTreeMap<String, String>,
}

/// A group's committed plan change for the runtime to carry out in order: the group, its new revision and
/// the steps `placement::transition` ordered.
pub(crate) type PlanOrder = Option<(String, i64, Vec<placement::Step>)>;

impl Fleet {
    /// Opens the fleet on `inventory`, with `local` (this machine's GPUs, through NVML) read once more now
    /// that the engines Tessera left running are known, so that their memory is never counted as held
    /// outside. The ledger is built from what was committed, pending work that fits is placed, and the
    /// runtime then reconciles the engines with it.
    pub async fn open(
        pool: SqlitePool,
        inventory: Inventory,
        local: Option<Arc<dyn LocalGpus>>,
        runtime: Arc<Runtime>,
        hosts: Hosts,
    ) -> Result<Fleet, ApiError> {
        let recorded = match local {
            Some(_) => runtime.recorded().await?,
            None => Vec::new(),
        };
        // What was committed, read once (40,000 workers take a good part of the open to read) inside
        // the write that settles it: nothing else writes before the fleet is open.
        let mut tx = crate::db::write(&pool).await?;
        let stored = Committed::load(&mut tx).await?;
        let mut inventory = inventory;
        if let Some(local) = local {
            let ledger = Ledger::build(inventory.clone(), &stored);
            let machine = hosts.local.as_deref().unwrap_or_default();
            let ours = engines::ours(&ledger, machine, &recorded);
            match read_local(&local, ours, &inventory).await {
                Ok(read) => inventory = read,
                // The first reading, before Tessera's engines were known, stands.
                Err(e) => tracing::warn!("this machine's GPUs could not be read again: {e}"),
            }
        }
        let inventory = mig::cut_made_up(inventory, &stored, &hosts);
        // What stood over-committed before the server stopped is not known to have lasted: nothing is
        // stopped for it until it has, from now.
        let (committed, ledger) =
            Fleet::settle_loaded(tx, stored, inventory, None, &|_| false).await?;
        let over_since = overcommitted_since(&ledger, &BTreeMap::new(), usage::now_ms());
        let state = State {
            committed: Arc::new(committed),
            ledger,
            over_since,
        };
        let desired = engines::desired(&state.committed, &state.ledger, &hosts);
        let fleet = Fleet {
            pool,
            runtime,
            hosts: RwLock::new(Arc::new(hosts)),
            views: RwLock::new(Arc::new(Views::of(&state.committed, &state.ledger))),
            unreachable: std::sync::RwLock::default(),
            calls: calls::Calls::default(),
            activity: Arc::new(demand::Activity::new()),
            latencies: interference::Latencies::default(),
            scaling: replicas::Scaling::default(),
            repack: std::sync::Mutex::default(),
            cluster_status: std::sync::RwLock::default(),
            measured: std::sync::RwLock::default(),
            problems: std::sync::RwLock::default(),
            mig_busy: std::sync::Mutex::default(),
            local_generation: std::sync::atomic::AtomicU64::default(),
            state: Mutex::new(state),
        };
        fleet.runtime.submit(Change::Reconcile(desired));
        Ok(fleet)
    }

    /// Which machines engines can be started for, now.
    fn hosts(&self) -> Arc<Hosts> {
        self.hosts
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// An operator's restart of engine `unit`, as what is committed wants it now: submitted under the lock
    /// writes commit under, so that it follows every change committed before it. An engine nothing
    /// committed runs any more (its model or worker removed, unloaded or moved, its stop under way) is not
    /// started again, beside the plan and in room the ledger no longer holds for it.
    pub async fn restart_engine(&self, unit: &str) -> Result<(), ApiError> {
        let state = self.state.lock().await;
        let holders = BTreeSet::from([unit.to_owned()]);
        let spec = engines::of_holders(&state.committed, &state.ledger, &self.hosts(), &holders)
            .pop()
            .ok_or_else(|| {
                ApiError::Conflict(format!(
                    "{unit} is being stopped: what ran it was removed, unloaded or moved, so it is not started again; GET /api/engines shows what runs"
                ))
            })?;
        self.runtime.submit(Change::Restart(Box::new(spec)));
        Ok(())
    }

    /// The models (and workers) with an engine now, and the on-demand models (which a request loads), by
    /// name: what the gateway answers for.
    pub fn served(&self) -> Vec<String> {
        self.serving(true)
    }

    /// [`Fleet::served`] without workers: the deployed models, which the Playground offers to chat with.
    pub fn served_models(&self) -> Vec<String> {
        self.serving(false)
    }

    fn serving(&self, workers: bool) -> Vec<String> {
        let committed = self.committed();
        // Those that may run no engine now: on demand, or with replicas (a min of 0).
        let on_demand = committed
            .groups
            .iter()
            .flat_map(|g| g.demand.keys().chain(g.autoscale.keys()).cloned());
        let mut names: Vec<String> = self
            .runtime
            .engines()
            .into_iter()
            .filter_map(|e| {
                if workers {
                    e.model.or(e.worker)
                } else {
                    e.model
                }
            })
            .chain(on_demand)
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// What the gateway carried.
    pub fn calls(&self) -> &calls::Calls {
        &self.calls
    }

    /// Writes the gateway's figures every `every`, for as long as the server runs (a stop writes them
    /// once more: [`Fleet::write_calls`]).
    pub async fn keep_writing_calls(self: Arc<Fleet>, every: std::time::Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.write_calls().await;
        }
    }

    /// Writes what the gateway counted since the last write.
    pub async fn write_calls(&self) {
        if let Err(e) = self.calls.write(&self.pool).await {
            tracing::warn!(
                "the gateway's figures could not be written (kept for the next try): {e}"
            );
        }
    }

    /// Runs a write to completion in a task of its own: a request that is dropped (its client went away,
    /// or it timed out) leaves the write to finish rather than cutting it between the commit and the
    /// ledger. The caller still gets the answer when it waits.
    pub(crate) async fn write<T, F, Fut>(self: &Arc<Self>, work: F) -> Result<T, ApiError>
    where
        F: FnOnce(Arc<Fleet>) -> Fut,
        Fut: Future<Output = Result<T, ApiError>> + Send + 'static,
        T: Send + 'static,
    {
        // The request's client goes with the write into its task, for the audit entries it writes.
        let client = crate::audit::client();
        tokio::spawn(crate::audit::for_client(client, work(self.clone())))
            .await
            .map_err(ApiError::internal)?
    }

    /// Ends a write whole: reads the committed state back inside `tx`, builds the ledger from it on
    /// `inventory`, lets the over-commit policy make room, places pending work that fits now, records who
    /// holds what for usage, and commits. Nothing in memory changes here: the caller installs what this
    /// returns. What a write that changed workers alone needs is less ([`Fleet::settle_workers`]).
    async fn settle(
        mut tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        inventory: Inventory,
        before: Option<&Committed>,
        eviction_due: &(dyn Fn(&GpuRef) -> bool + Sync),
    ) -> Result<(Committed, Ledger), ApiError> {
        let committed = Committed::load(&mut tx).await?;
        Fleet::settle_loaded(tx, committed, inventory, before, eviction_due).await
    }

    /// [`Fleet::settle`], where `committed` was read inside `tx` already.
    async fn settle_loaded(
        mut tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        mut committed: Committed,
        inventory: Inventory,
        before: Option<&Committed>,
        eviction_due: &(dyn Fn(&GpuRef) -> bool + Sync),
    ) -> Result<(Committed, Ledger), ApiError> {
        let mut ledger = Ledger::build(inventory.clone(), &committed);
        let refusals = ledger.sharing_refusals(&committed);
        if !refusals.is_empty() {
            // Refused where this write breaks a GPU's sharing; one broken before it (a GPU that came back
            // as another vendor's, or a server opening on such a state) is said, not a reason to refuse
            // every write after it.
            if let Some(before) = before {
                let was = Ledger::build(inventory, before).sharing_refusals(before);
                if let Some(new) = refusals.iter().find(|r| !was.contains(r)) {
                    return Err(ApiError::Conflict(new.to_string()));
                }
            }
            for refusal in &refusals {
                tracing::warn!("{refusal}");
            }
        }
        for evicted in ledger.relieve(&committed, eviction_due) {
            evict(&mut tx, &mut committed, &evicted).await?;
        }
        changes::place_pending(&mut ledger, &mut committed, &mut tx, None).await?;
        usage::record_holdings(&mut tx, &ledger, usage::now_ms()).await?;
        changes::forget(&mut tx).await?;
        tx.commit().await?;
        Ok((committed, ledger))
    }

    /// Makes the settled state the fleet's: swaps it in and publishes the read views. Cannot fail: the
    /// write is committed already.
    fn install(&self, state: &mut State, committed: Committed, ledger: Ledger) {
        state.committed = Arc::new(committed);
        state.ledger = ledger;
        let views = Views::of(&state.committed, &state.ledger);
        *self.views.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(views);
    }

    /// Settles a write (whole, or by the rows it changed where it changed workers, groups and catalog models
    /// alone on the same inventory: `inventory` is a new one, or none), installs what it settled, then gives the
    /// runtime its orders: `plan` first, then every engine as committed (those it changed, where it was
    /// settled by its rows).
    async fn finish(
        &self,
        state: &mut State,
        tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        inventory: Option<Inventory>,
        plan: PlanOrder,
    ) -> Result<(), ApiError> {
        self.finish_with(state, tx, inventory, None, plan).await
    }

    /// [`Fleet::finish`], where the ledger has taken a new reading of a machine (`read`).
    async fn finish_with(
        &self,
        state: &mut State,
        mut tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        inventory: Option<Inventory>,
        read: Option<&machines::Reading>,
        plan: PlanOrder,
    ) -> Result<(), ApiError> {
        let now = usage::now_ms();
        let grace = self.runtime.evict_after();
        let over_since = state.over_since.clone();
        let due = |gpu: &GpuRef| eviction_due(&over_since, gpu, now, grace);
        let changes = changes::Changes::read(&mut tx).await?;
        let hosts = self.hosts();
        let orders = match inventory {
            None if changes.by_rows() => {
                let mend = Mend::new(&mut *state);
                let settled =
                    match Fleet::settle_rows(&mut tx, &mut *mend.state, &changes, read, &due).await
                    {
                        Ok(settled) => tx.commit().await.map(|()| settled).map_err(ApiError::from),
                        Err(e) => Err(e),
                    };
                let (committed, touched) = settled?;
                // The ledger as mended and what is committed agree from here.
                mend.state.committed = Arc::new(committed);
                mend.done();
                let views = self
                    .views()
                    .patched(&state.committed, &state.ledger, &touched);
                *self.views.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(views);
                let mut desired = engines::worker_engines(
                    &state.committed,
                    &state.ledger,
                    &hosts,
                    &touched.units,
                );
                for group in &touched.groups {
                    desired.extend(engines::group_engines(
                        &state.committed,
                        &state.ledger,
                        &hosts,
                        group,
                    ));
                }
                let units = touched.units.into_iter().collect();
                Change::Update { units, desired }
            }
            inventory => {
                let inventory = inventory.unwrap_or_else(|| state.ledger.inventory().clone());
                let before = state.committed.clone();
                let (committed, ledger) = Fleet::settle(tx, inventory, Some(&before), &due).await?;
                self.install(state, committed, ledger);
                Change::Apply(engines::desired(&state.committed, &state.ledger, &hosts))
            }
        };
        state.over_since = overcommitted_since(&state.ledger, &state.over_since, now);
        if let Some((group, revision, steps)) = plan {
            let members = engines::group_engines(&state.committed, &state.ledger, &hosts, &group);
            self.runtime.submit(Change::Plan {
                group,
                revision,
                steps,
                members,
            });
        }
        self.runtime.submit(orders);
        Ok(())
    }

    fn views(&self) -> Arc<Views> {
        self.views
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The committed state as of the last write.
    pub(crate) fn committed(&self) -> Arc<Committed> {
        self.views().committed.clone()
    }

    /// Says `gpu`, where it is over-committed now, has been so for `long`; says whether it is.
    #[cfg(test)]
    pub(crate) async fn overcommitted_for(&self, gpu: &GpuRef, long: Duration) -> bool {
        let mut state = self.state.lock().await;
        let Some(since) = state.over_since.get_mut(gpu) else {
            return false;
        };
        *since = since.saturating_sub(long.as_millis() as u64);
        true
    }

    /// The inventory the ledger holds on now.
    #[cfg(test)]
    pub(crate) async fn committed_inventory(&self) -> Inventory {
        self.state.lock().await.ledger.inventory().clone()
    }

    /// Every engine the committed state runs, with its spec.
    #[cfg(test)]
    pub(crate) async fn desired(&self) -> Vec<crate::runtime::spec::EngineSpec> {
        let state = self.state.lock().await;
        engines::desired(&state.committed, &state.ledger, &self.hosts())
    }

    /// Checks that the runtime, once it has carried out every change, runs exactly the engines the
    /// committed state wants, each as it wants it: what the runtime was told write by write (each write's
    /// own engines, where only workers changed) adds up to the whole. For the tests.
    #[cfg(test)]
    pub(crate) async fn check_engines(&self) -> Result<(), String> {
        let state = self.state.lock().await;
        let desired: BTreeMap<String, String> =
            engines::desired(&state.committed, &state.ledger, &self.hosts())
                .into_iter()
                .map(|spec| (spec.unit.clone(), spec.fingerprint()))
                .collect();
        self.runtime.settled().await;
        let registered = self.runtime.registered();
        if registered == desired {
            Ok(())
        } else {
            Err(format!(
                "the runtime runs {registered:?}, where the committed state wants {desired:?}"
            ))
        }
    }

    /// [`Fleet::check`], as the tests ask it: an error naming what differs.
    #[cfg(test)]
    pub(crate) async fn check_ledger(&self) -> Result<(), String> {
        let differ = self.check().await.map_err(|e| e.to_string())?;
        if differ.is_empty() {
            Ok(())
        } else {
            Err(differ.join("; "))
        }
    }
}

/// Stops `evicted` (the over-commit policy's choice, or one kept aside whose GPU newer work took): it waits
/// again, in `tx` and in `committed`, and the audit log says why.
async fn evict(
    tx: &mut sqlx::SqliteConnection,
    committed: &mut Committed,
    evicted: &ledger::Eviction,
) -> Result<(), ApiError> {
    workers::unplace(&mut *tx, committed, &evicted.worker, &evicted.reason).await?;
    crate::audit::record(
        &mut *tx,
        crate::audit::Entry::new(crate::audit::TESSERA, "worker.evict", &evicted.worker)
            .after(serde_json::json!({ "reason": evicted.reason })),
    )
    .await?;
    Ok(())
}

/// `inventory` with this machine as `local` reads it now, counting `ours` as Tessera's own engines.
async fn read_local(
    local: &Arc<dyn LocalGpus>,
    ours: crate::inventory::Ours,
    inventory: &Inventory,
) -> Result<Inventory, String> {
    let local = local.clone();
    tokio::task::spawn_blocking(move || local.read(&ours))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()))
        .and_then(|r| inventory.with_machine(r.machine).map_err(|e| e.to_string()))
}

#[cfg(test)]
mod tests;

/// The answer for a model that runs nowhere.
fn not_deployed(model: &str) -> ApiError {
    ApiError::NotFound(format!(
        "{model} is not deployed; GET /api/groups and GET /api/workers list what runs"
    ))
}
