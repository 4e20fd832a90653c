//! What a write changed (issue 29). The database's triggers note each committed row a write inserts,
//! updates or deletes in `changes` (migration 0018); the write takes them in its own transaction. Where
//! only workers, sharing groups, catalog models and GPUs' sharing changed, on the inventory the ledger holds, just those
//! rows are read back and applied to the state before the write: the ledger mended in place, the usage
//! spans, the read views and the engines of what was touched alone, so that a write costs what it changes
//! and not the fleet; a GPU's sharing likewise, the engines on it touched. Anything else (a new inventory)
//! is settled whole, as [`Fleet::settle`] does. The whole rebuild stays the oracle: the model test checks after every step
//! that the state kept this way is the one rebuilt, and that the runtime runs what it wants.

use super::committed::{load_group, load_model, load_sharing_of, Committed};
use super::groups::Group;
use super::ledger::Ledger;
use super::machines::{machine_view, Reading};
use super::workers::{self, view};
use super::{usage, Fleet, State, Views};
use crate::error::ApiError;
use placement::holder::Holder;
use placement::GpuRef;
use std::collections::BTreeSet;
use std::sync::Arc;

/// The rows a write changed, as its triggers noted them.
#[derive(Debug, Default)]
pub(super) struct Changes {
    /// The workers, by name.
    pub(super) workers: BTreeSet<String>,
    /// The sharing groups (their plans, members and serving), by name.
    pub(super) groups: BTreeSet<String>,
    /// The catalog's models, by name.
    pub(super) models: BTreeSet<String>,
    /// The GPUs whose sharing changed.
    pub(super) sharing: BTreeSet<GpuRef>,
    /// Whether anything else changed.
    other: bool,
}

impl Changes {
    /// What the write in `tx` changed so far. Either way of settling it empties the table before the
    /// commit ([`forget`]), what the settling changed itself included.
    pub(super) async fn read(tx: &mut sqlx::SqliteConnection) -> Result<Changes, ApiError> {
        let rows: Vec<(String, String)> = sqlx::query_as("SELECT kind, key FROM changes")
            .fetch_all(&mut *tx)
            .await?;
        let mut changes = Changes::default();
        for (kind, key) in rows {
            match kind.as_str() {
                "worker" => {
                    changes.workers.insert(key);
                }
                "group" => {
                    changes.groups.insert(key);
                }
                "model" => {
                    changes.models.insert(key);
                }
                "sharing" => match key
                    .rsplit_once(':')
                    .and_then(|(m, i)| Some(GpuRef::new(m, i.parse().ok()?)))
                {
                    Some(gpu) => {
                        changes.sharing.insert(gpu);
                    }
                    None => changes.other = true,
                },
                _ => changes.other = true,
            }
        }
        Ok(changes)
    }

    /// Whether the write changed workers, groups, catalog models and GPUs' sharing alone, which are settled
    /// by their rows.
    pub(super) fn by_rows(&self) -> bool {
        !self.other
    }
}

/// Places the pending work that fits ([`workers::place_pending`]; asked of what `touched` names, where the
/// write is settled by its rows), lets each worker kept aside whose GPU newer work took wait again (asked of
/// the whole fleet) until none is, then says again why those still kept aside are: the same, whether a write
/// settles whole or by its rows. What it changes goes into `touched`, where given.
pub(super) async fn place_pending(
    ledger: &mut Ledger,
    committed: &mut Committed,
    tx: &mut sqlx::SqliteConnection,
    mut touched: Option<&mut Touched>,
) -> Result<(), ApiError> {
    loop {
        let since = touched.as_deref().map(|t| workers::Since {
            machines: &t.machines,
            workers: &t.holders,
        });
        let placed = workers::place_pending(ledger, committed, tx, since).await?;
        if let Some(touched) = touched.as_deref_mut() {
            for changed in &placed {
                touched.note(committed, changed);
            }
        }
        let taken = ledger.claims_taken(committed);
        if taken.is_empty() {
            break;
        }
        for lost in &taken {
            if let Some(touched) = touched.as_deref_mut() {
                touched.note(committed, &lost.worker);
            }
            ledger.forget(&lost.worker);
            super::evict(tx, committed, lost).await?;
        }
    }
    // The work placed since, or an eviction, changed what holds the GPUs of those still kept aside.
    let aside = ledger.hold_aside(committed);
    if let Some(touched) = touched {
        for changed in &aside {
            touched.note(committed, changed);
        }
    }
    Ok(())
}

/// Empties `changes` in `tx`, before it commits: what the settling itself changed (pending work placed,
/// workers stopped by the over-commit policy) is applied as it is done.
pub(super) async fn forget(tx: &mut sqlx::SqliteConnection) -> Result<(), ApiError> {
    sqlx::query("DELETE FROM changes").execute(&mut *tx).await?;
    Ok(())
}

/// What a write touched: the holders whose holds may have changed, the machines they held on before it
/// and hold on after, and the engines it may have changed.
#[derive(Debug, Default)]
pub(super) struct Touched {
    /// The workers by name, and the groups' members by holder (`placement::holder::member`).
    holders: BTreeSet<String>,
    machines: BTreeSet<String>,
    /// The engines looked at: the workers', and every member's of the groups changed on each of their
    /// machines, before the write and after it.
    pub(super) units: BTreeSet<String>,
    /// The groups changed, as they stand after the write.
    pub(super) groups: BTreeSet<String>,
}

impl Touched {
    /// Worker `name`, on the machine `committed` places it on, if any (held there or not: its view is
    /// that machine's either way).
    fn note(&mut self, committed: &Committed, name: &str) {
        self.holders.insert(name.to_owned());
        self.units.insert(name.to_owned());
        if let Some(assignment) = committed.worker(name).and_then(|w| w.assignment.as_ref()) {
            self.machines.insert(assignment.machine.clone());
        }
    }

    /// A holder of the ledger: a worker, or a group's member on a machine (and with it its group).
    fn note_holder(&mut self, committed: &Committed, holder: &str) {
        match Holder::parse(holder) {
            Holder::Worker(name) => self.note(committed, name),
            Holder::Member { group, .. } => {
                self.holders.insert(holder.to_owned());
                if let Some(group) = committed.group(group) {
                    self.note_group(group);
                    self.groups.insert(group.name.clone());
                }
            }
        }
    }

    /// Group `group`'s machines and the units of its members on each (a replica's on each of its GPUs).
    fn note_group(&mut self, group: &Group) {
        for gpu in &group.gpus {
            self.machines.insert(gpu.machine.clone());
            for member in &group.members {
                self.units.insert(group.unit_on(&member.member, gpu));
            }
        }
    }
}

impl Fleet {
    /// Settles a write that changed the rows of workers, groups and catalog models alone (`changes`), on
    /// the ledger's own inventory (`read`: a machine whose new reading it has taken in place): each row
    /// read back and applied to a copy of the committed state and, in place, to the ledger; then, as
    /// [`Fleet::settle`] does, the over-commit policy, pending work placed where it fits now, and usage
    /// spans (of the holders touched alone). On an error the ledger is left mended part-way: the caller
    /// builds it again from the state before the write.
    pub(super) async fn settle_rows(
        tx: &mut sqlx::SqliteConnection,
        state: &mut State,
        changes: &Changes,
        read: Option<&Reading>,
        due: &(dyn Fn(&GpuRef) -> bool + Sync),
    ) -> Result<(Committed, Touched), ApiError> {
        let was = state.ledger.sharing_refusals(&state.committed);
        let mut committed = Committed::clone(&state.committed);
        let ledger = &mut state.ledger;
        let mut touched = Touched::default();
        // A machine read again (its GPUs' new readings taken into the ledger already) shows what they offer;
        // one whose GPUs changed, also who holds there now and who no longer does.
        match read {
            Some(Reading::Offers(machine)) => {
                touched.machines.insert(machine.clone());
            }
            Some(Reading::Reshaped(machine, holders)) => {
                touched.machines.insert(machine.clone());
                for holder in holders {
                    touched.note_holder(&committed, holder);
                }
            }
            None => {}
        }
        for name in &changes.groups {
            if let Some(old) = committed.group(name) {
                touched.note_group(old);
                touched.holders.extend(ledger.forget_group(old));
            }
            let group = load_group(&mut *tx, name).await?;
            committed.apply_group(name, group);
            if let Some(new) = committed.group(name) {
                touched.note_group(new);
                touched.holders.extend(ledger.hold_group(new));
                touched.groups.insert(name.clone());
            }
        }
        for name in &changes.models {
            let model = load_model(&mut *tx, name).await?;
            committed.apply_model(name, model);
            // What runs it runs it as the catalog says now: its deployment on whole GPUs, or its group.
            if let Some(worker) = committed.whole_deployment(name).map(|w| w.name.clone()) {
                touched.note(&committed, &worker);
            }
            if let Some(group) = committed.group_of(name) {
                touched.note_group(group);
                touched.groups.insert(group.name.clone());
            }
        }
        for gpu in &changes.sharing {
            let row = load_sharing_of(&mut *tx, gpu).await?;
            committed.apply_sharing(gpu, row);
            ledger.set_sharing(gpu, committed.sharing(gpu).mode);
            // Its machine's page shows it; the engines on it run as it is shared (an MPS client or not).
            touched.machines.insert(gpu.machine.clone());
            for holder in ledger.holders_of(gpu) {
                touched.note_holder(&committed, &holder);
            }
        }
        for name in &changes.workers {
            touched.note(&committed, name);
            let row = crate::db::worker(&mut *tx, name).await?;
            committed.apply_worker(name, row)?;
            ledger.forget(name);
            if let Some(assignment) = committed.worker(name).and_then(|w| w.assignment.clone()) {
                ledger.hold_committed(name, assignment);
            }
            touched.note(&committed, name);
        }
        for held in ledger.hold_aside(&committed) {
            touched.note(&committed, &held);
        }
        let refusals = ledger.sharing_refusals(&committed);
        if let Some(new) = refusals.iter().find(|r| !was.contains(r)) {
            return Err(ApiError::Conflict(new.to_string()));
        }
        for evicted in ledger.relieve(&committed, due) {
            touched.note(&committed, &evicted.worker);
            super::evict(tx, &mut committed, &evicted).await?;
        }
        place_pending(ledger, &mut committed, tx, Some(&mut touched)).await?;
        usage::record_holdings_of(tx, ledger, &touched.holders, usage::now_ms()).await?;
        forget(tx).await?;
        Ok((committed, touched))
    }
}

impl Views {
    /// These views after a write that `touched` what it did: the views of the workers and machines it
    /// touched made again from `committed` and `ledger`, every other one kept (shared, not copied).
    pub(super) fn patched(
        &self,
        committed: &Arc<Committed>,
        ledger: &Ledger,
        touched: &Touched,
    ) -> Views {
        let mut views = Views {
            workers: self.workers.clone(),
            on_machine: self.on_machine.clone(),
            by_machine: self.by_machine.clone(),
            by_machine_redacted: self.by_machine_redacted.clone(),
            machines: self.machines.clone(),
            committed: committed.clone(),
            unplaced: ledger.all_unplaced().clone(),
        };
        // A machine new to the fleet (a Ray node that joined) gets its list before its workers go in it.
        for name in &touched.machines {
            if ledger.inventory().machine(name).is_some() && !views.on_machine.contains_key(name) {
                views.on_machine.insert(name.clone(), imbl::OrdSet::new());
            }
        }
        for name in &touched.holders {
            if let Some(seq) = self.committed.workers.seq_of(name) {
                if let Some(machine) = self.workers.get(&seq).and_then(|w| w.machine.clone()) {
                    if let Some(list) = views.on_machine.get_mut(&machine) {
                        list.remove(&seq);
                    }
                }
                views.workers.remove(&seq);
            }
            if let Some(worker) = committed.workers.get(name) {
                let view = Arc::new(view(worker, ledger));
                if let Some(list) = view
                    .machine
                    .as_ref()
                    .and_then(|m| views.on_machine.get_mut(m))
                {
                    list.insert(worker.seq);
                }
                views.workers.insert(worker.seq, view);
            }
        }
        let overcommitted = ledger.scheduler().overcommitted();
        for name in &touched.machines {
            let Some(machine) = ledger.inventory().machine(name) else {
                continue;
            };
            views.serialize_machine(name);
            let fresh = Arc::new(machine_view(committed, ledger, &overcommitted, machine));
            // The machines are the inventory's, in its order; a reading may add one, never take one away.
            match views.machines.iter_mut().find(|m| m.name == *name) {
                Some(slot) => *slot = fresh,
                None => {
                    let at = ledger
                        .inventory()
                        .machines()
                        .iter()
                        .position(|m| m.name == *name)
                        .unwrap_or(views.machines.len());
                    views.machines.insert(at.min(views.machines.len()), fresh);
                }
            }
        }
        views
    }
}
