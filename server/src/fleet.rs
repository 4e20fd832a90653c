//! The fleet: the inventory, who holds which GPU, and the workers on record. The scheduler in memory is a
//! cache of the database: every change is decided under one lock and committed before it is answered, and
//! at start (or after a failed write) the scheduler is rebuilt from what was committed.

use crate::db::{self, WorkerRow};
use crate::error::ApiError;
use crate::inventory::demo::Engine;
use crate::inventory::LocalGpus;
use crate::runtime::spec::{EngineSpec, Recipe};
use crate::runtime::{Change, Hosts, Runtime};
use placement::{
    Assignment, Decision, Hold, Inventory, Machine, RequestedResources, Scheduler, WorkerRequest,
};
use serde::{Deserialize, Serialize};
use sqlx::SqlitePool;
use std::collections::BTreeMap;
use std::sync::{Arc, PoisonError, RwLock};
use tokio::sync::Mutex;

/// The longest worker name.
pub const MAX_NAME_LEN: usize = 63;

/// `POST /api/workers`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NewWorker {
    /// A unique name.
    pub name: String,
    /// What it needs (seed 000).
    pub requested_resources: RequestedResources,
    /// The command to run.
    #[serde(default)]
    pub command: Option<String>,
    /// Environment variables for it.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// A worker as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerView {
    /// Its name.
    pub name: String,
    /// `placed` or `pending`.
    pub state: String,
    /// Where it runs, when placed.
    pub machine: Option<String>,
    /// The GPU indices it holds on that machine.
    pub gpus: Vec<u32>,
    /// When shared, the GB it takes on each of those GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_shared_gb: Option<f64>,
    /// When pending, why: one sentence per GPU or machine.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub pending_reasons: Vec<String>,
    /// What it asked for.
    pub requested_resources: RequestedResources,
    /// Its command, if any.
    pub command: Option<String>,
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// The revision to name when changing or deleting it.
    pub revision: i64,
    /// The catalog model it runs, for a model deployed on whole GPUs.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub model: Option<String>,
}

/// A catalog model that a worker runs on whole GPUs, with the deployment's own extra arguments.
#[derive(Debug, Clone)]
pub(crate) struct ModelRun {
    /// The catalog model.
    pub model: String,
    /// Added to the model's arguments.
    pub args: Vec<String>,
}

/// The fleet service.
pub struct Fleet {
    pub(crate) pool: SqlitePool,
    /// Runs what the committed state says should run.
    pub(crate) runtime: Arc<Runtime>,
    /// Which machines engines can be started for.
    pub(crate) hosts: Hosts,
    /// Every write is decided and committed under this lock.
    pub(crate) scheduler: Mutex<Scheduler>,
    /// What reads are answered from, published after each committed write, so that a read waits on neither
    /// the write lock nor the database.
    views: RwLock<Arc<Views>>,
}

/// Every worker's view, as of the last committed write.
#[derive(Default)]
struct Views {
    /// Oldest first.
    workers: Vec<WorkerView>,
    /// The workers placed on each machine of the inventory, as the JSON answer: the API's most read
    /// route is served as it was serialized at the last write.
    by_machine: BTreeMap<String, axum::body::Bytes>,
}

impl Fleet {
    /// Opens the fleet on `inventory`, rebuilding who holds what from the database, then placing whatever
    /// pending work now fits (oldest first). The runtime then reconciles the engines with what was committed.
    pub async fn open(
        pool: SqlitePool,
        inventory: Inventory,
        runtime: Arc<Runtime>,
        hosts: Hosts,
    ) -> Result<Fleet, ApiError> {
        let fleet = Fleet {
            pool,
            runtime,
            hosts,
            scheduler: Mutex::new(Scheduler::new(inventory)),
            views: RwLock::default(),
        };
        {
            let mut scheduler = fleet.scheduler.lock().await;
            fleet.rebuild(&mut scheduler).await?;
            let mut tx = crate::db::write(&fleet.pool).await?;
            place_pending(&mut scheduler, &mut tx).await?;
            tx.commit().await?;
            fleet.publish(&scheduler).await?;
            let desired = fleet.desired(&scheduler).await?;
            fleet.runtime.submit(Change::Reconcile(desired));
        }
        Ok(fleet)
    }

    /// The runtime.
    pub fn runtime(&self) -> &Runtime {
        &self.runtime
    }

    /// Every engine the committed state wants running: each group member on each machine of its group, then
    /// each placed worker, oldest first.
    pub(crate) async fn desired(&self, scheduler: &Scheduler) -> Result<Vec<EngineSpec>, ApiError> {
        let mut specs =
            crate::groups::member_engines(&self.pool, scheduler, &self.hosts, None).await?;
        let catalog = self.models().await?;
        for row in db::workers(&self.pool).await? {
            let Some(assignment) = row.assignment.as_deref() else {
                continue;
            };
            let assignment: Assignment =
                serde_json::from_str(assignment).map_err(ApiError::internal)?;
            let gpus: Vec<&placement::Gpu> = assignment
                .gpus
                .iter()
                .filter_map(|i| {
                    scheduler
                        .inventory()
                        .gpu(&placement::GpuRef::new(&assignment.machine, *i))
                })
                .collect();
            let recipe = worker_recipe(&row, &catalog)?;
            specs.push(EngineSpec {
                unit: row.name,
                host: self.hosts.host(&assignment.machine),
                gpu_total: gpus.first().map(|g| g.total).unwrap_or_default(),
                gpu_offered: gpus.iter().map(|g| g.offered()).min().unwrap_or_default(),
                gpus: assignment.gpus,
                share: assignment.shared,
                recipe,
                machine: assignment.machine,
            });
        }
        Ok(specs)
    }

    /// Hands the committed state to the runtime. The write it follows is committed already: a failure here
    /// is logged, and the next write (or start) hands it over again.
    pub(crate) async fn sync_engines(&self, scheduler: &Scheduler) {
        match self.desired(scheduler).await {
            Ok(desired) => {
                self.runtime.submit(Change::Apply(desired));
            }
            Err(e) => tracing::error!(
                "the engines could not be brought in line with the committed state: {e}"
            ),
        }
    }

    /// Accepts a worker: placed at once if it fits, otherwise pending with its reasons.
    pub async fn create_worker(&self, new: NewWorker, actor: &str) -> Result<WorkerView, ApiError> {
        self.accept_worker(new, None, actor).await
    }

    /// Accepts a worker. One that runs a catalog model (`run`: a deployment on whole GPUs) is placed at
    /// once or refused with its reasons, never left pending.
    pub(crate) async fn accept_worker(
        &self,
        new: NewWorker,
        run: Option<ModelRun>,
        actor: &str,
    ) -> Result<WorkerView, ApiError> {
        check_name(&new.name)?;
        crate::groups::check_serving(&[], &new.env)?;
        if let Some(command) = &new.command {
            crate::groups::check_text("command", command)?;
        }
        let request = WorkerRequest::from_wire(&new.requested_resources)
            .map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        let request_json =
            serde_json::to_string(&new.requested_resources).map_err(ApiError::internal)?;
        let env_json = serde_json::to_string(&new.env).map_err(ApiError::internal)?;
        let mut scheduler = self.scheduler.lock().await;
        let (state, assignment, reasons) = match scheduler.decide(&request) {
            Decision::Place(a) => ("placed", Some(a), Vec::new()),
            Decision::Wait(r) if run.is_some() => {
                let reasons: Vec<String> = r.iter().map(ToString::to_string).collect();
                return Err(ApiError::Unprocessable(format!(
                    "{} does not fit there: {}",
                    new.name,
                    reasons.join("; ")
                )));
            }
            Decision::Wait(r) => (
                "pending",
                None,
                r.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ),
        };
        let args_json =
            serde_json::to_string(&run.as_ref().map(|r| r.args.clone()).unwrap_or_default())
                .map_err(ApiError::internal)?;
        let assignment_json = assignment
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(ApiError::internal)?;
        let mut tx = crate::db::write(&self.pool).await?;
        sqlx::query("INSERT INTO workers (name, request, command, env, state, assignment, pending_reasons, model, args) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
            .bind(&new.name)
            .bind(&request_json)
            .bind(&new.command)
            .bind(&env_json)
            .bind(state)
            .bind(&assignment_json)
            .bind(serde_json::to_string(&reasons).map_err(ApiError::internal)?)
            .bind(run.as_ref().map(|r| r.model.as_str()))
            .bind(&args_json)
            .execute(&mut *tx)
            .await
            .map_err(|e| ApiError::on_unique(e, || format!("a worker named {} exists; choose another name, or delete it first", new.name)))?;
        let (action, target) = match &run {
            Some(run) => ("deploy", run.model.as_str()),
            None => ("worker.create", new.name.as_str()),
        };
        let placed = serde_json::json!({
            "requested_resources": new.requested_resources,
            "state": state,
            "assignment": assignment,
            "pending_reasons": reasons,
        });
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, action, target)
                .after(placed)
                .revision(1)
                .restarts(run.iter().map(|r| r.model.clone()).collect()),
        )
        .await?;
        tx.commit().await?;
        if let Some(assignment) = assignment {
            if let Err(e) = scheduler.hold_for(&new.name, assignment) {
                // Decided under the same lock, so this cannot happen; if it does, trust the database.
                tracing::error!("scheduler refused its own decision for {}: {e}", new.name);
                self.rebuild(&mut scheduler).await?;
            }
        }
        self.publish(&scheduler).await?;
        self.sync_engines(&scheduler).await;
        self.worker(&new.name)
    }

    /// One worker.
    pub fn worker(&self, name: &str) -> Result<WorkerView, ApiError> {
        self.views()
            .workers
            .iter()
            .find(|w| w.name == name)
            .cloned()
            .ok_or_else(|| no_worker(name))
    }

    /// Every worker, oldest first.
    pub fn workers(&self) -> Vec<WorkerView> {
        self.views().workers.clone()
    }

    /// Ends a worker: its memory is free for the next, and pending work that now fits is placed, oldest first.
    /// With `revision`, refuses (409) when the worker changed since that revision.
    pub async fn delete_worker(
        &self,
        name: &str,
        revision: Option<i64>,
        actor: &str,
    ) -> Result<(), ApiError> {
        let mut scheduler = self.scheduler.lock().await;
        let mut tx = crate::db::write(&self.pool).await?;
        let row = db::worker(&mut *tx, name)
            .await?
            .ok_or_else(|| no_worker(name))?;
        if let Some(sent) = revision.filter(|r| *r != row.revision) {
            return Err(ApiError::Conflict(format!(
                "worker {name} is at revision {}, not {sent}; read it again and retry",
                row.revision
            )));
        }
        sqlx::query("DELETE FROM workers WHERE name = ?")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        let (action, target) = match &row.model {
            Some(model) => ("deployment.remove", model.clone()),
            None => ("worker.delete", name.to_owned()),
        };
        crate::audit::record(
            &mut tx,
            crate::audit::Entry::new(actor, action, &target)
                .before(serde_json::to_value(view(row.clone())?).map_err(ApiError::internal)?)
                .revision(row.revision),
        )
        .await?;
        let held = scheduler.release(name);
        let result = async {
            place_pending(&mut scheduler, &mut tx).await?;
            tx.commit().await?;
            Ok::<(), ApiError>(())
        }
        .await;
        if let Err(e) = result {
            // Nothing was committed: put the scheduler back as the database has it.
            drop(held);
            self.rebuild(&mut scheduler).await?;
            self.publish(&scheduler).await?;
            return Err(e);
        }
        self.publish(&scheduler).await?;
        self.sync_engines(&scheduler).await;
        Ok(())
    }

    /// Each machine with its GPUs, what they offer and who holds them.
    pub async fn machines(&self) -> Vec<MachineView> {
        let scheduler = self.scheduler.lock().await;
        scheduler
            .inventory()
            .machines()
            .iter()
            .map(|m| machine_view(&scheduler, m))
            .collect()
    }

    /// One machine.
    pub async fn machine(&self, name: &str) -> Result<MachineView, ApiError> {
        let scheduler = self.scheduler.lock().await;
        let machine = scheduler
            .inventory()
            .machine(name)
            .ok_or_else(|| no_machine(name))?;
        Ok(machine_view(&scheduler, machine))
    }

    /// The workers placed on one machine, as a JSON array.
    pub fn machine_workers(&self, name: &str) -> Result<axum::body::Bytes, ApiError> {
        self.views()
            .by_machine
            .get(name)
            .cloned()
            .ok_or_else(|| no_machine(name))
    }

    fn views(&self) -> Arc<Views> {
        self.views
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes reads answer what the database now says, and the usage record follow what is held.
    pub(crate) async fn publish(&self, scheduler: &Scheduler) -> Result<(), ApiError> {
        crate::usage::record_holdings(&self.pool, scheduler, crate::usage::now_ms()).await?;
        let workers = db::workers(&self.pool)
            .await?
            .into_iter()
            .map(view)
            .collect::<Result<Vec<_>, _>>()?;
        let mut by_machine: BTreeMap<String, Vec<WorkerView>> = scheduler
            .inventory()
            .machines()
            .iter()
            .map(|m| (m.name.clone(), Vec::new()))
            .collect();
        for worker in &workers {
            if let Some(list) = worker.machine.as_ref().and_then(|m| by_machine.get_mut(m)) {
                list.push(worker.clone());
            }
        }
        let by_machine = by_machine
            .into_iter()
            .map(|(m, list)| {
                Ok((
                    m,
                    serde_json::to_vec(&list)
                        .map_err(ApiError::internal)?
                        .into(),
                ))
            })
            .collect::<Result<_, ApiError>>()?;
        let views = Views {
            workers,
            by_machine,
        };
        *self.views.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(views);
        Ok(())
    }

    /// Takes a fresh reading of one machine (this machine's GPUs through NVML): what its GPUs offer may
    /// have changed. Work that no longer fits waits again, with its reason; pending work that fits now is
    /// placed, oldest first.
    pub async fn refresh_machine(&self, machine: Machine) -> Result<(), ApiError> {
        let mut scheduler = self.scheduler.lock().await;
        let mut machines = scheduler.inventory().machines().to_vec();
        if machines.contains(&machine) {
            return Ok(());
        }
        machines.retain(|m| m.name != machine.name);
        machines.push(machine);
        let inventory =
            Inventory::new(machines).map_err(|e| ApiError::Unprocessable(e.to_string()))?;
        self.rebuild_on(&mut scheduler, inventory).await?;
        let mut tx = crate::db::write(&self.pool).await?;
        place_pending(&mut scheduler, &mut tx).await?;
        tx.commit().await?;
        self.publish(&scheduler).await?;
        self.sync_engines(&scheduler).await;
        Ok(())
    }

    /// Reads this machine's GPUs every `every` for as long as the server runs. A failed reading is logged
    /// once until the next good one, and the last good reading stands meanwhile.
    pub async fn follow_local_gpus(
        self: std::sync::Arc<Self>,
        gpus: std::sync::Arc<dyn LocalGpus>,
        every: std::time::Duration,
    ) {
        let mut last_error = None;
        loop {
            tokio::time::sleep(every).await;
            let reader = gpus.clone();
            let ours = self.runtime.pids();
            let reading =
                tokio::task::spawn_blocking(move || reader.read(&ours).map_err(|e| e.to_string()))
                    .await;
            let outcome = match reading {
                Ok(Ok(reading)) => {
                    let at = crate::usage::now_ms();
                    match self
                        .record_samples(&reading.machine.name, &reading.live, at)
                        .await
                    {
                        Ok(()) => self.refresh_machine(reading.machine).await,
                        Err(e) => Err(e),
                    }
                    .map_err(|e| e.to_string())
                }
                Ok(Err(e)) => Err(e),
                Err(e) => Err(e.to_string()),
            };
            match outcome {
                Ok(()) => last_error = None,
                Err(e) if last_error.as_ref() != Some(&e) => {
                    tracing::warn!("this machine's GPUs could not be read again: {e}");
                    last_error = Some(e);
                }
                Err(_) => {}
            }
        }
    }

    /// Makes the scheduler hold exactly what the database says is placed. A placed worker that no longer
    /// fits (its GPU is gone from the inventory, say) becomes pending with the reason.
    pub(crate) async fn rebuild(&self, scheduler: &mut Scheduler) -> Result<(), ApiError> {
        let inventory = scheduler.inventory().clone();
        self.rebuild_on(scheduler, inventory).await
    }

    /// [`Fleet::rebuild`] over another inventory (a machine's GPUs changed).
    async fn rebuild_on(
        &self,
        scheduler: &mut Scheduler,
        inventory: Inventory,
    ) -> Result<(), ApiError> {
        *scheduler = Scheduler::new(inventory);
        // Committed share plans first: they were judged against every GPU they run on.
        crate::groups::hold_groups(&self.pool, scheduler).await?;
        for row in db::workers(&self.pool).await? {
            let Some(assignment) = row.assignment.as_deref() else {
                continue;
            };
            let assignment: Assignment =
                serde_json::from_str(assignment).map_err(ApiError::internal)?;
            if let Err(e) = scheduler.hold_for(&row.name, assignment) {
                tracing::warn!(
                    "worker {} no longer fits where it was placed ({e}); it waits again",
                    row.name
                );
                sqlx::query("UPDATE workers SET state = 'pending', assignment = NULL, pending_reasons = ?, revision = revision + 1 WHERE name = ?")
                    .bind(serde_json::to_string(&[e.to_string()]).map_err(ApiError::internal)?)
                    .bind(&row.name)
                    .execute(&self.pool)
                    .await?;
            }
        }
        Ok(())
    }
}

/// Places every pending worker that fits now, oldest first, and refreshes the reasons of the rest.
async fn place_pending(
    scheduler: &mut Scheduler,
    tx: &mut sqlx::SqliteConnection,
) -> Result<(), ApiError> {
    let pending: Vec<WorkerRow> = db::workers(&mut *tx)
        .await?
        .into_iter()
        .filter(|w| w.state == "pending")
        .collect();
    for row in pending {
        let wire: RequestedResources =
            serde_json::from_str(&row.request).map_err(ApiError::internal)?;
        let request = WorkerRequest::from_wire(&wire)
            .map_err(|e| ApiError::internal(format!("stored request of {}: {e}", row.name)))?;
        match scheduler.decide(&request) {
            Decision::Place(assignment) => {
                sqlx::query("UPDATE workers SET state = 'placed', assignment = ?, pending_reasons = '[]', revision = revision + 1 WHERE name = ?")
                    .bind(serde_json::to_string(&assignment).map_err(ApiError::internal)?)
                    .bind(&row.name)
                    .execute(&mut *tx)
                    .await?;
                scheduler
                    .hold_for(&row.name, assignment)
                    .map_err(ApiError::internal)?;
            }
            Decision::Wait(reasons) => {
                let reasons: Vec<String> = reasons.iter().map(ToString::to_string).collect();
                let reasons = serde_json::to_string(&reasons).map_err(ApiError::internal)?;
                // Most writes leave most pending workers' reasons as they were: write only a change.
                if reasons != row.pending_reasons {
                    sqlx::query("UPDATE workers SET pending_reasons = ? WHERE name = ?")
                        .bind(&reasons)
                        .bind(&row.name)
                        .execute(&mut *tx)
                        .await?;
                }
            }
        }
    }
    Ok(())
}

/// Names are what URLs, logs and process names carry: letters, digits, `.`, `-`, `_`, at most 63.
pub(crate) fn check_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if ok {
        Ok(())
    } else {
        Err(ApiError::Unprocessable(format!(
            "name {name:?}: use 1 to {MAX_NAME_LEN} letters, digits, '.', '-' or '_', starting with a letter or digit"
        )))
    }
}

fn no_worker(name: &str) -> ApiError {
    ApiError::NotFound(format!("there is no worker named {name}"))
}

fn no_machine(name: &str) -> ApiError {
    ApiError::NotFound(format!(
        "there is no machine named {name}; GET /api/machines lists them"
    ))
}

fn view(row: WorkerRow) -> Result<WorkerView, ApiError> {
    let assignment: Option<Assignment> = row
        .assignment
        .as_deref()
        .map(serde_json::from_str)
        .transpose()
        .map_err(ApiError::internal)?;
    Ok(WorkerView {
        gpus: assignment
            .as_ref()
            .map(|a| a.gpus.clone())
            .unwrap_or_default(),
        gpu_shared_gb: assignment
            .as_ref()
            .and_then(|a| a.shared)
            .map(placement::Bytes::as_gb_f64),
        machine: assignment.map(|a| a.machine),
        name: row.name,
        state: row.state,
        pending_reasons: serde_json::from_str(&row.pending_reasons).map_err(ApiError::internal)?,
        requested_resources: serde_json::from_str(&row.request).map_err(ApiError::internal)?,
        command: row.command,
        env: serde_json::from_str(&row.env).map_err(ApiError::internal)?,
        revision: row.revision,
        model: row.model,
    })
}

/// What a worker runs: its own command, or its catalog model's recipe with the deployment's additions.
fn worker_recipe(
    row: &db::WorkerRow,
    catalog: &[crate::inventory::demo::CatalogModel],
) -> Result<Recipe, ApiError> {
    let env: BTreeMap<String, String> =
        serde_json::from_str(&row.env).map_err(ApiError::internal)?;
    let Some(name) = &row.model else {
        return Ok(Recipe {
            engine: Engine::Command,
            model_path: String::new(),
            command: row.command.clone(),
            args: Vec::new(),
            env,
        });
    };
    let model = catalog.iter().find(|m| &m.name == name).ok_or_else(|| {
        ApiError::internal(format!(
            "worker {} runs {name}, which is not in the catalog",
            row.name
        ))
    })?;
    let mut args = model.args.clone();
    args.extend(serde_json::from_str::<Vec<String>>(&row.args).map_err(ApiError::internal)?);
    let mut recipe_env = model.env.clone();
    recipe_env.extend(env);
    Ok(Recipe {
        engine: model.engine,
        model_path: model.model_path.clone(),
        command: model.command.clone(),
        args,
        env: recipe_env,
    })
}

/// A machine as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineView {
    /// Its name.
    pub name: String,
    /// CPU cores, and those workers hold.
    pub cpu_cores: u32,
    /// CPU cores held by workers.
    pub cpu_cores_used: u32,
    /// Memory, GB.
    pub memory_gb: f64,
    /// Memory held by workers, GB.
    pub memory_gb_used: f64,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// Memory held by workers, bytes.
    pub memory_bytes_used: u64,
    /// A Windows PC under WSL2.
    pub all_gpus_visible: bool,
    /// Its GPUs.
    pub gpus: Vec<GpuView>,
}

/// A GPU as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    /// Index on its machine.
    pub index: u32,
    /// UUID.
    pub uuid: String,
    /// Model name.
    pub model: String,
    /// Vendor.
    pub vendor: String,
    /// Healthy or not.
    pub healthy: bool,
    /// All its memory, GB.
    pub total_gb: f64,
    /// All its memory, bytes.
    pub total_bytes: u64,
    /// What it offers Tessera, GB.
    pub offered_gb: f64,
    /// What it offers Tessera, bytes.
    pub offered_bytes: u64,
    /// Held outside Tessera, GB.
    pub held_outside_gb: f64,
    /// Held outside Tessera, bytes.
    pub held_outside_bytes: u64,
    /// `free`, `whole` or `shared`.
    pub mode: String,
    /// The worker holding it whole.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub held_by: Option<String>,
    /// Its sharers and the GB each takes.
    pub sharers: Vec<SharerView>,
    /// GB its sharers take.
    pub taken_gb: f64,
    /// Bytes its sharers take.
    pub taken_bytes: u64,
    /// The machine page's line: `shared: listen 2.2 GB, voice 4.2 GB — 6.4 GB taken`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
}

/// One sharer of a GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SharerView {
    /// The worker, or the model of a sharing group.
    pub worker: String,
    /// The sharing group, for a group's member.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// The GB it takes.
    pub gb: f64,
    /// The bytes it takes.
    pub bytes: u64,
}

fn machine_view(scheduler: &Scheduler, machine: &placement::Machine) -> MachineView {
    let (cpu_used, memory_used) = scheduler.machine_use(&machine.name).unwrap_or_default();
    MachineView {
        name: machine.name.clone(),
        cpu_cores: machine.cpu_cores,
        cpu_cores_used: cpu_used,
        memory_gb: machine.memory.as_gb_f64(),
        memory_gb_used: memory_used.as_gb_f64(),
        memory_bytes: machine.memory.get(),
        memory_bytes_used: memory_used.get(),
        all_gpus_visible: machine.all_gpus_visible,
        gpus: machine
            .gpus
            .iter()
            .map(|gpu| {
                let hold = scheduler
                    .hold(&placement::GpuRef::new(&machine.name, gpu.index))
                    .cloned()
                    .unwrap_or(Hold::Free);
                let (mode, held_by, sharers) = match &hold {
                    Hold::Free => ("free", None, BTreeMap::new()),
                    Hold::Whole(w) => ("whole", Some(w.clone()), BTreeMap::new()),
                    Hold::Shared(s) => ("shared", None, s.clone()),
                };
                let summary = (!sharers.is_empty()).then(|| {
                    let list: Vec<String> = sharers
                        .iter()
                        .map(|(w, b)| format!("{} {b}", crate::groups::sharer(w).0))
                        .collect();
                    format!("shared: {} — {} taken", list.join(", "), hold.taken())
                });
                GpuView {
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    model: gpu.model.clone(),
                    vendor: gpu.vendor.clone(),
                    healthy: gpu.healthy,
                    total_gb: gpu.total.as_gb_f64(),
                    total_bytes: gpu.total.get(),
                    offered_gb: gpu.offered().as_gb_f64(),
                    offered_bytes: gpu.offered().get(),
                    held_outside_gb: gpu.held_outside.as_gb_f64(),
                    held_outside_bytes: gpu.held_outside.get(),
                    mode: mode.to_owned(),
                    held_by,
                    sharers: sharers
                        .iter()
                        .map(|(w, b)| {
                            let (name, group) = crate::groups::sharer(w);
                            SharerView {
                                worker: name.to_owned(),
                                group: group.map(str::to_owned),
                                gb: b.as_gb_f64(),
                                bytes: b.get(),
                            }
                        })
                        .collect(),
                    taken_gb: hold.taken().as_gb_f64(),
                    taken_bytes: hold.taken().get(),
                    summary,
                }
            })
            .collect(),
    }
}
