//! `tessera check` (issue 29): what the fleet keeps in memory, write after write, held against the whole
//! rebuild from what the database holds now: the committed state, the ledger, every read view, the open
//! usage spans, no change left noted, and no waiting worker that fits now. The model test runs it after every step; an operator runs it
//! with `tessera check` (`GET /api/check`). It holds the write lock only to copy what the fleet keeps and to
//! pin the database's snapshot (a read transaction, in WAL mode); it reads the database and rebuilds
//! after, while writes go on.

use super::committed::Committed;
use super::ledger::Ledger;
use super::{usage, Fleet, Views};
use crate::error::ApiError;
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::Arc;

/// How many of the items that differ a sentence names.
const NAMED: usize = 5;

impl Fleet {
    /// What differs between what the fleet keeps and the rebuild from the database, one sentence each;
    /// none where they agree.
    pub async fn check(&self) -> Result<Vec<String>, ApiError> {
        // The database as of the moment the lock is held: a read transaction's first read pins what it
        // sees, and writes committed after it are not in it.
        let (mut tx, left, kept, holds, unplaced, inventory, views) = {
            let state = self.state.lock().await;
            let mut tx = self.pool.begin().await?;
            let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM changes")
                .fetch_one(&mut *tx)
                .await?;
            (
                tx,
                left,
                state.committed.clone(),
                state.ledger.scheduler().workers().clone(),
                state.ledger.all_unplaced().clone(),
                state.ledger.inventory().clone(),
                self.views(),
            )
        };
        let stored = Committed::load(&mut tx).await?;
        let mut differ = Vec::new();
        differ.extend(compare(
            "worker",
            by(kept.workers.iter(), |w| &w.name),
            by(stored.workers.iter(), |w| &w.name),
        ));
        differ.extend(compare(
            "group",
            by(&kept.groups, |g| &g.name),
            by(&stored.groups, |g| &g.name),
        ));
        differ.extend(compare(
            "catalog model",
            by(kept.models.iter(), |m| &m.name),
            by(stored.models.iter(), |m| &m.name),
        ));
        differ.extend(compare(
            "GPU's sharing",
            kept.sharing
                .iter()
                .map(|(g, s)| (g.to_string(), s))
                .collect(),
            stored
                .sharing
                .iter()
                .map(|(g, s)| (g.to_string(), s))
                .collect(),
        ));
        differ.extend(compare(
            "GPU's MIG layout",
            kept.mig.iter().map(|(g, s)| (g.to_string(), s)).collect(),
            stored.mig.iter().map(|(g, s)| (g.to_string(), s)).collect(),
        ));
        let rebuilt = Ledger::build(inventory, &stored);
        differ.extend(compare(
            "holder's hold",
            holds.iter().collect(),
            rebuilt.scheduler().workers().iter().collect(),
        ));
        differ.extend(compare(
            "holder kept aside",
            unplaced.iter().collect(),
            rebuilt.all_unplaced().iter().collect(),
        ));
        differ.extend(waiting_that_fit(&stored, &rebuilt));
        let whole = Views::of(&Arc::new(stored), &rebuilt);
        differ.extend(compare(
            "worker's view",
            by(views.workers.values(), |w| &w.name),
            by(whole.workers.values(), |w| &w.name),
        ));
        differ.extend(compare(
            "machine's view",
            by(&views.machines, |m| &m.name),
            by(&whole.machines, |m| &m.name),
        ));
        differ.extend(compare(
            "machine's workers as the API answers them",
            views.by_machine.iter().collect(),
            whole.by_machine.iter().collect(),
        ));
        differ.extend(compare(
            "machine's workers as the API answers them, redacted",
            views.by_machine_redacted.iter().collect(),
            whole.by_machine_redacted.iter().collect(),
        ));
        if left != 0 {
            differ.push(format!(
                "{left} changed rows are noted and not taken up (table changes)"
            ));
        }
        differ.extend(usage::open_span_differences(&mut tx, &rebuilt).await?);
        // Ended now, where a dropped one is rolled back only when its connection is next used.
        tx.commit().await?;
        Ok(differ)
    }
}

/// The waiting workers that fit now on `ledger`, one sentence each: every write places what waits and
/// fits, so none should.
fn waiting_that_fit(committed: &Committed, ledger: &Ledger) -> Vec<String> {
    committed
        .workers
        .pending()
        .filter_map(|worker| {
            let request = placement::WorkerRequest::from_wire(&worker.request).ok()?;
            match ledger.scheduler().decide(&request) {
                placement::Decision::Place(assignment) => Some(format!(
                    "worker {} waits, though it fits now on {} (GPUs {:?})",
                    worker.name, assignment.machine, assignment.gpus
                )),
                placement::Decision::Wait(_) => None,
            }
        })
        .collect()
}

/// `items` by the name `name` gives each.
fn by<'a, T: 'a>(
    items: impl IntoIterator<Item = &'a T>,
    name: impl Fn(&'a T) -> &'a String,
) -> BTreeMap<String, &'a T> {
    items.into_iter().map(|i| (name(i).clone(), i)).collect()
}

/// What differs between `kept` and `stored`, items of `kind` by name: those kept alone, stored alone, and
/// kept otherwise than stored, each a sentence naming a few (the first with both versions).
fn compare<K: Ord + std::fmt::Display, V: PartialEq + Debug>(
    kind: &str,
    kept: BTreeMap<K, V>,
    stored: BTreeMap<K, V>,
) -> Vec<String> {
    let names = |keys: Vec<&K>| -> String {
        let mut shown: Vec<String> = keys.iter().take(NAMED).map(|k| k.to_string()).collect();
        if keys.len() > NAMED {
            shown.push(format!("and {} more", keys.len() - NAMED));
        }
        shown.join(", ")
    };
    let mut differ = Vec::new();
    let only_kept: Vec<&K> = kept.keys().filter(|k| !stored.contains_key(k)).collect();
    if !only_kept.is_empty() {
        differ.push(format!(
            "kept in memory, not in the database: {kind} {}",
            names(only_kept)
        ));
    }
    let only_stored: Vec<&K> = stored.keys().filter(|k| !kept.contains_key(k)).collect();
    if !only_stored.is_empty() {
        differ.push(format!(
            "in the database, not kept in memory: {kind} {}",
            names(only_stored)
        ));
    }
    let otherwise: Vec<&K> = kept
        .iter()
        .filter(|(k, v)| stored.get(k).is_some_and(|s| s != *v))
        .map(|(k, _)| k)
        .collect();
    if let Some(first) = otherwise.first() {
        differ.push(format!(
            "kept otherwise than the database has it: {kind} {} (the first kept as {:?}, where the database gives {:?})",
            names(otherwise.clone()),
            kept[first],
            stored[first]
        ));
    }
    differ
}
