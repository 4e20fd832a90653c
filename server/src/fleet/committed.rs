//! The committed state, read from the database in one go: workers, sharing groups with their members'
//! shares and serving configuration, and the model catalog. The ledger and every engine Tessera runs are
//! derived from it; it is read back inside each write's own transaction, so what the fleet holds in memory
//! is exactly what that transaction committed.

use super::groups::{Group, Serving};
use crate::catalog::CatalogModel;
use crate::db::{self, WorkerRow};
use crate::error::ApiError;
use placement::sharing::{GpuSharing, Sharing};
use placement::{Assignment, BasisPoints, GpuRef, KeepAlive, RequestedResources, Share};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

mod by_name;
pub(crate) use by_name::{Groups, Models};

/// Everything committed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Committed {
    /// Every worker (seed 000's, and models on whole GPUs), oldest first.
    pub(crate) workers: Workers,
    /// Every sharing group, by name; each behind an `Arc`, as the workers are.
    pub(crate) groups: Groups,
    /// The model catalog, by name.
    pub(crate) models: Models,
    /// How each GPU is shared where it is not time-sliced.
    pub(crate) sharing: BTreeMap<GpuRef, GpuSharing>,
    /// The profiles each GPU cut into MIG instances was cut into, in order of placement.
    pub(crate) mig: BTreeMap<GpuRef, Vec<String>>,
}

/// A worker as committed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Worker {
    /// Its arrival order.
    pub seq: i64,
    /// Its name.
    pub name: String,
    /// What it asked for, as accepted.
    pub request: RequestedResources,
    /// Its command, if any.
    pub command: Option<String>,
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// Where it was placed; none while it waits.
    pub assignment: Option<Assignment>,
    /// Why it waits.
    pub pending_reasons: Vec<String>,
    /// Bumped at every change.
    pub revision: i64,
    /// The catalog model it runs, for a model deployed on whole GPUs.
    pub model: Option<String>,
    /// That deployment's extra arguments.
    pub args: Vec<String>,
}

impl Committed {
    /// Reads the whole committed state.
    pub(crate) async fn load(conn: &mut sqlx::SqliteConnection) -> Result<Committed, ApiError> {
        let mut workers = Workers::default();
        for row in db::workers(&mut *conn).await? {
            workers.put(Worker::from_row(row)?);
        }
        let (sharing, mig) = load_sharing(&mut *conn).await?;
        Ok(Committed {
            workers,
            groups: load_groups(&mut *conn)
                .await?
                .into_iter()
                .map(Arc::new)
                .collect(),
            models: load_models(&mut *conn).await?.into_iter().collect(),
            sharing,
            mig,
        })
    }

    /// How `gpu` is shared.
    pub(crate) fn sharing(&self, gpu: &GpuRef) -> GpuSharing {
        self.sharing.get(gpu).copied().unwrap_or_default()
    }

    /// A worker by name.
    pub(crate) fn worker(&self, name: &str) -> Option<&Worker> {
        self.workers.get(name)
    }

    /// Applies what the database holds now of worker `name` (`row`; none where it was deleted).
    pub(crate) fn apply_worker(
        &mut self,
        name: &str,
        row: Option<WorkerRow>,
    ) -> Result<(), ApiError> {
        self.workers.remove(name);
        if let Some(row) = row {
            self.workers.put(Worker::from_row(row)?);
        }
        Ok(())
    }

    /// Applies how the database shares `gpu` now (`row`; none where it is time-sliced).
    pub(crate) fn apply_sharing(
        &mut self,
        gpu: &GpuRef,
        row: Option<(GpuSharing, Option<Vec<String>>)>,
    ) {
        self.sharing.remove(gpu);
        self.mig.remove(gpu);
        if let Some((sharing, profiles)) = row {
            self.sharing.insert(gpu.clone(), sharing);
            if let Some(profiles) = profiles {
                self.mig.insert(gpu.clone(), profiles);
            }
        }
    }

    /// Applies what the database holds now of catalog model `name` (none where it was removed).
    pub(crate) fn apply_model(&mut self, name: &str, model: Option<CatalogModel>) {
        self.models.remove(name);
        if let Some(model) = model {
            self.models.put(model);
        }
    }

    /// The group `model` is a member of.
    pub(crate) fn group_of(&self, model: &str) -> Option<&Group> {
        self.groups.of_member(model)
    }

    /// The group of `model`, when it is a member loaded on demand.
    pub(crate) fn on_demand_group(&self, model: &str) -> Option<&Group> {
        self.group_of(model)
            .filter(|g| g.demand.contains_key(model))
    }

    /// A group by name.
    pub(crate) fn group(&self, name: &str) -> Option<&Group> {
        self.groups.get(name)
    }

    /// Applies what the database holds now of group `name` (none where it was removed).
    pub(crate) fn apply_group(&mut self, name: &str, group: Option<Group>) {
        self.groups.remove(name);
        if let Some(group) = group {
            self.groups.put(Arc::new(group));
        }
    }

    /// The worker that runs `model` on whole GPUs.
    pub(crate) fn whole_deployment(&self, model: &str) -> Option<&Worker> {
        self.workers.running(model)
    }

    /// The catalog model `name`, refused when it runs already: a model runs in one group, or on whole
    /// GPUs once, never both.
    pub(crate) fn undeployed_model(&self, name: &str) -> Result<&CatalogModel, ApiError> {
        let model = self
            .model(name)
            .ok_or_else(|| super::groups::no_model(name))?;
        if let Some(worker) = self.whole_deployment(name) {
            return Err(ApiError::Conflict(format!(
                "{name} runs on whole GPUs of {} already",
                worker
                    .assignment
                    .as_ref()
                    .map_or("a machine", |a| a.machine.as_str())
            )));
        }
        if let Some(group) = self.group_of(name) {
            return Err(ApiError::Conflict(format!(
                "{name} runs in group {} already",
                group.name
            )));
        }
        Ok(model)
    }

    /// A catalog model by name.
    pub(crate) fn model(&self, name: &str) -> Option<&CatalogModel> {
        self.models.get(name)
    }

    /// The system members (the semantic router).
    pub(crate) fn system_models(&self) -> Vec<String> {
        self.models
            .iter()
            .filter(|m| m.system)
            .map(|m| m.name.clone())
            .collect()
    }
}

/// The workers, in arrival order, found by name, the pending ones apart: persistent maps, so that the
/// state after a write shares all but what the write changed with the state before it (a copy costs
/// nothing; a change, the log of the fleet's size).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Workers {
    by_seq: imbl::OrdMap<i64, Arc<Worker>>,
    seq_of: imbl::OrdMap<String, i64>,
    pending: imbl::OrdSet<i64>,
    /// (model, arrival order) of the workers that run a catalog model on whole GPUs.
    by_model: imbl::OrdSet<(String, i64)>,
}

impl Workers {
    /// Every worker, oldest first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &Arc<Worker>> {
        self.by_seq.values()
    }

    /// The workers that wait (none placed), oldest first.
    pub(crate) fn pending(&self) -> impl Iterator<Item = &Arc<Worker>> {
        self.pending.iter().filter_map(|seq| self.by_seq.get(seq))
    }

    /// A worker by name.
    pub(crate) fn get(&self, name: &str) -> Option<&Worker> {
        let seq = self.seq_of.get(name)?;
        self.by_seq.get(seq).map(Arc::as_ref)
    }

    /// The oldest worker that runs `model` on whole GPUs.
    pub(crate) fn running(&self, model: &str) -> Option<&Worker> {
        let (runs, seq) = self.by_model.range((model.to_owned(), i64::MIN)..).next()?;
        (runs == model)
            .then(|| self.by_seq.get(seq).map(Arc::as_ref))
            .flatten()
    }

    /// The arrival order of the worker `name`.
    pub(crate) fn seq_of(&self, name: &str) -> Option<i64> {
        self.seq_of.get(name).copied()
    }

    /// Puts `worker` in (in its arrival order), in the place of one of its name.
    pub(crate) fn put(&mut self, worker: Worker) {
        self.remove(&worker.name);
        self.seq_of.insert(worker.name.clone(), worker.seq);
        if worker.assignment.is_none() {
            self.pending.insert(worker.seq);
        }
        if let Some(model) = &worker.model {
            self.by_model.insert((model.clone(), worker.seq));
        }
        self.by_seq.insert(worker.seq, Arc::new(worker));
    }

    /// Takes the worker `name` out.
    pub(crate) fn remove(&mut self, name: &str) {
        if let Some(seq) = self.seq_of.remove(name) {
            if let Some(model) = self.by_seq.remove(&seq).and_then(|w| w.model.clone()) {
                self.by_model.remove(&(model, seq));
            }
            self.pending.remove(&seq);
        }
    }

    /// Changes the worker `name` with `change`, if there is one.
    pub(crate) fn change(&mut self, name: &str, change: impl FnOnce(&mut Worker)) {
        if let Some(worker) = self.get(name) {
            let mut worker = worker.clone();
            change(&mut worker);
            self.put(worker);
        }
    }
}

impl<'a> IntoIterator for &'a Workers {
    type Item = &'a Arc<Worker>;
    type IntoIter = imbl::ordmap::Values<'a, i64, Arc<Worker>, imbl::shared_ptr::DefaultSharedPtr>;
    fn into_iter(self) -> Self::IntoIter {
        self.by_seq.values()
    }
}

impl Worker {
    fn from_row(row: WorkerRow) -> Result<Worker, ApiError> {
        Ok(Worker {
            seq: row.seq,
            request: serde_json::from_str(&row.request).map_err(ApiError::internal)?,
            env: serde_json::from_str(&row.env).map_err(ApiError::internal)?,
            assignment: row
                .assignment
                .as_deref()
                .map(serde_json::from_str)
                .transpose()
                .map_err(ApiError::internal)?,
            pending_reasons: serde_json::from_str(&row.pending_reasons)
                .map_err(ApiError::internal)?,
            args: serde_json::from_str(&row.args).map_err(ApiError::internal)?,
            name: row.name,
            command: row.command,
            revision: row.revision,
            model: row.model,
        })
    }
}

async fn load_groups(conn: &mut sqlx::SqliteConnection) -> Result<Vec<Group>, ApiError> {
    let groups: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT name, gpus, revision FROM groups ORDER BY name")
            .fetch_all(&mut *conn)
            .await?;
    let members: Vec<Member> = sqlx::query_as(
        "SELECT group_name, model, share, args, env, on_demand, keep_alive_s, loaded, autoscale, placed, asleep FROM group_members ORDER BY group_name, position",
    )
    .fetch_all(&mut *conn)
    .await?;
    groups_of(groups, &members)
}

/// Group `name` as the database holds it now; none where there is no such group.
pub(crate) async fn load_group(
    conn: &mut sqlx::SqliteConnection,
    name: &str,
) -> Result<Option<Group>, ApiError> {
    let groups: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT name, gpus, revision FROM groups WHERE name = ?")
            .bind(name)
            .fetch_all(&mut *conn)
            .await?;
    let members: Vec<Member> = sqlx::query_as(
        "SELECT group_name, model, share, args, env, on_demand, keep_alive_s, loaded, autoscale, placed, asleep FROM group_members WHERE group_name = ? ORDER BY position",
    )
    .bind(name)
    .fetch_all(&mut *conn)
    .await?;
    Ok(groups_of(groups, &members)?.pop())
}

/// A row of `group_members`: group, model, share, args, env, on demand, keep-alive, loaded, autoscale (JSON),
/// the machines its replicas are placed on (JSON), asleep (JSON).
type Member = (
    String,
    String,
    i64,
    String,
    String,
    bool,
    i64,
    bool,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The groups of rows `groups`, each with its `members` (in their order).
fn groups_of(
    groups: Vec<(String, String, i64)>,
    members: &[Member],
) -> Result<Vec<Group>, ApiError> {
    // By group, once: 2,000 groups each searching every member would be millions of comparisons.
    let mut by_group: BTreeMap<&str, Vec<&Member>> = BTreeMap::new();
    for member in members {
        by_group.entry(member.0.as_str()).or_default().push(member);
    }
    groups
        .into_iter()
        .map(|(name, gpus, revision)| {
            let mine = by_group.get(name.as_str()).into_iter().flatten().copied();
            let gpus: Vec<GpuRef> = serde_json::from_str(&gpus).map_err(ApiError::internal)?;
            Ok(Group {
                revision,
                members: mine
                    .clone()
                    .map(|(_, m, share, ..)| Share::new(m, BasisPoints(*share as u32)))
                    .collect(),
                demand: mine
                    .clone()
                    .filter(|(.., on_demand, _, _, _, _, _)| *on_demand)
                    .map(|(_, m, _, _, _, _, keep_alive, ..)| {
                        let keep_alive = u32::try_from(*keep_alive)
                            .ok()
                            .and_then(|s| KeepAlive::from_secs(s).ok())
                            .ok_or_else(|| {
                                ApiError::internal(format!("{m}: keep-alive {keep_alive} s"))
                            })?;
                        Ok((m.clone(), keep_alive))
                    })
                    .collect::<Result<_, ApiError>>()?,
                loaded: mine
                    .clone()
                    .filter(|(.., on_demand, _, loaded, _, _, _)| *on_demand && *loaded)
                    .map(|(_, m, ..)| m.clone())
                    .collect(),
                autoscale: by_member(
                    mine.clone()
                        .map(|(_, m, .., autoscale, _, _)| (m, autoscale)),
                )?,
                placed: by_member::<Vec<String>>(
                    mine.clone().map(|(_, m, .., placed, _)| (m, placed)),
                )?
                .into_iter()
                .map(|(m, places)| (m, placed_of(&gpus, &places)))
                .collect(),
                asleep: by_member(mine.clone().map(|(_, m, .., asleep)| (m, asleep)))?,
                serving: mine
                    .map(|(_, m, _, args, env, ..)| {
                        Ok((
                            m.clone(),
                            Serving {
                                args: serde_json::from_str(args).map_err(ApiError::internal)?,
                                env: serde_json::from_str(env).map_err(ApiError::internal)?,
                            },
                        ))
                    })
                    .collect::<Result<_, ApiError>>()?,
                name,
                gpus,
            })
        })
        .collect()
}

/// A member's replicas' GPUs as stored (`machine:index`, each as [`GpuRef::id`]). A replica stored by a
/// Tessera that placed one on a machine (a name without an index) is taken to be on the first of the
/// group's GPUs there (and dropped where the group has none there: it held nothing).
fn placed_of(gpus: &[GpuRef], places: &[String]) -> BTreeSet<GpuRef> {
    places
        .iter()
        .filter_map(|place| match place.parse::<GpuRef>() {
            Ok(gpu) => Some(gpu),
            Err(_) => gpus.iter().find(|g| g.machine == *place).cloned(),
        })
        .collect()
}

/// A member's replicas' GPUs as stored: the `machine:index` of each.
pub(super) fn placed_json(placed: &BTreeSet<GpuRef>) -> Result<String, ApiError> {
    serde_json::to_string(&placed.iter().map(GpuRef::id).collect::<Vec<_>>())
        .map_err(ApiError::internal)
}

/// Each member's JSON column read, for the members whose column is not NULL.
fn by_member<'a, T: serde::de::DeserializeOwned>(
    columns: impl Iterator<Item = (&'a String, &'a Option<String>)>,
) -> Result<BTreeMap<String, T>, ApiError> {
    columns
        .filter_map(|(m, json)| Some((m, json.as_deref()?)))
        .map(|(m, json)| {
            Ok((
                m.clone(),
                serde_json::from_str(json).map_err(ApiError::internal)?,
            ))
        })
        .collect()
}

type MigLayouts = BTreeMap<GpuRef, Vec<String>>;

/// Writes how `gpu` is shared (time-slicing has no row), with the profiles it was cut into under MIG.
pub(super) async fn store_sharing(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    gpu: &GpuRef,
    sharing: GpuSharing,
    instances: Option<&[String]>,
) -> Result<(), ApiError> {
    let index = i64::from(gpu.index);
    if sharing.mode == Sharing::TimeSlicing {
        sqlx::query("DELETE FROM gpu_sharing WHERE machine = ? AND gpu_index = ?")
            .bind(&gpu.machine)
            .bind(index)
            .execute(&mut **tx)
            .await?;
    } else {
        sqlx::query(
            "INSERT OR REPLACE INTO gpu_sharing (machine, gpu_index, mode, compute_percent, mig_instances) VALUES (?, ?, ?, ?, ?)",
        )
        .bind(&gpu.machine)
        .bind(index)
        .bind(sharing.mode.as_str())
        .bind(sharing.compute_percent.map(i64::from))
        .bind(instances.map(|i| serde_json::json!(i).to_string()))
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

/// A row of `gpu_sharing`: machine, index, mode, compute share, MIG profiles (JSON).
type SharingRow = (String, i64, String, Option<i64>, Option<String>);

async fn load_sharing(
    conn: &mut sqlx::SqliteConnection,
) -> Result<(BTreeMap<GpuRef, GpuSharing>, MigLayouts), ApiError> {
    let rows: Vec<SharingRow> = sqlx::query_as(
        "SELECT machine, gpu_index, mode, compute_percent, mig_instances FROM gpu_sharing ORDER BY machine, gpu_index",
    )
    .fetch_all(&mut *conn)
    .await?;
    let mut sharing = BTreeMap::new();
    let mut mig = BTreeMap::new();
    for row in rows {
        let (gpu, set, profiles) = sharing_of(row)?;
        sharing.insert(gpu.clone(), set);
        if let Some(profiles) = profiles {
            mig.insert(gpu, profiles);
        }
    }
    Ok((sharing, mig))
}

/// How `gpu` is shared as the database holds it now (none: time-sliced), with the profiles of its MIG cut.
pub(super) async fn load_sharing_of(
    conn: &mut sqlx::SqliteConnection,
    gpu: &GpuRef,
) -> Result<Option<(GpuSharing, Option<Vec<String>>)>, ApiError> {
    let row: Option<SharingRow> = sqlx::query_as(
        "SELECT machine, gpu_index, mode, compute_percent, mig_instances FROM gpu_sharing WHERE machine = ? AND gpu_index = ?",
    )
    .bind(&gpu.machine)
    .bind(i64::from(gpu.index))
    .fetch_optional(&mut *conn)
    .await?;
    row.map(|row| sharing_of(row).map(|(_, set, profiles)| (set, profiles)))
        .transpose()
}

fn sharing_of(
    (machine, index, mode, compute, instances): SharingRow,
) -> Result<(GpuRef, GpuSharing, Option<Vec<String>>), ApiError> {
    let index = u32::try_from(index).map_err(ApiError::internal)?;
    let sharing = GpuSharing::parse(&mode, compute).map_err(ApiError::internal)?;
    let profiles = instances
        .map(|i| serde_json::from_str(&i).map_err(ApiError::internal))
        .transpose()?;
    Ok((GpuRef::new(machine, index), sharing, profiles))
}

async fn load_models(conn: &mut sqlx::SqliteConnection) -> Result<Vec<CatalogModel>, ApiError> {
    let rows: Vec<ModelRow> = sqlx::query_as(
        "SELECT name, engine, default_share, group_name, model_path, system, command, args, env, secret_env FROM models ORDER BY name",
    )
        .fetch_all(&mut *conn)
        .await?;
    rows.into_iter().map(model_of).collect()
}

/// Catalog model `name` as the database holds it now; none where there is no such model.
pub(crate) async fn load_model(
    conn: &mut sqlx::SqliteConnection,
    name: &str,
) -> Result<Option<CatalogModel>, ApiError> {
    let row: Option<ModelRow> = sqlx::query_as(
        "SELECT name, engine, default_share, group_name, model_path, system, command, args, env, secret_env FROM models WHERE name = ?",
    )
        .bind(name)
        .fetch_optional(&mut *conn)
        .await?;
    row.map(model_of).transpose()
}

/// A row of `models`: name, engine, default share, group, model path, system, command, args, env, secret
/// variables.
type ModelRow = (
    String,
    String,
    i64,
    Option<String>,
    String,
    bool,
    Option<String>,
    String,
    String,
    String,
);

fn model_of(
    (name, engine, share, group, model_path, system, command, args, env, secret_env): ModelRow,
) -> Result<CatalogModel, ApiError> {
    Ok(CatalogModel {
        engine: serde_json::from_value(serde_json::Value::String(engine))
            .map_err(ApiError::internal)?,
        name,
        default_share: BasisPoints(share as u32),
        group,
        model_path,
        system,
        command,
        args: serde_json::from_str(&args).map_err(ApiError::internal)?,
        env: serde_json::from_str(&env).map_err(ApiError::internal)?,
        secret_env: serde_json::from_str(&secret_env).map_err(ApiError::internal)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_stored_by_machine_is_read_as_on_the_first_of_the_group_s_gpus_there_and_one_by_gpu_as_that_gpu(
    ) {
        let gpus = [
            GpuRef::new("east", 2),
            GpuRef::new("east", 3),
            GpuRef::new("west", 0),
        ];
        let stored = ["east".to_owned(), "west:0".to_owned(), "gone".to_owned()];
        assert_eq!(
            placed_of(&gpus, &stored),
            BTreeSet::from([GpuRef::new("east", 2), GpuRef::new("west", 0)])
        );
        let written = placed_json(&placed_of(&gpus, &stored)).unwrap();
        assert_eq!(written, r#"["east:2","west:0"]"#);
        let again: Vec<String> = serde_json::from_str(&written).unwrap();
        assert_eq!(placed_of(&gpus, &again), placed_of(&gpus, &stored));
    }
}
