//! Usage (seed 000): every span in which a worker or a group's model held memory on a GPU, recorded as the
//! committed state changes, and NVML's readings of this machine's GPUs. The report splits GPU time, use and
//! energy among the sharers of each GPU by their share of its memory.
//!
//! Retention: readings older than a while (a week by default) are rolled up into runs (see
//! `migrations/0007_retention.sql`) from which the report gives the same figures over whole hours; usage
//! older than its retention is deleted ([`crate::db::tidy`]).

use crate::error::ApiError;
use crate::fleet::Fleet;
use crate::inventory::GpuLive;
use placement::holder;
use placement::usage::{
    Figures, GpuMillis, Grouping, Holder, Holding, Sample, UsageReport, HOUR_MS,
};
use placement::{Bytes, GpuRef, Hold, Scheduler};
use sqlx::{SqliteConnection, SqlitePool};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// `ms` since the epoch as RFC 3339, UTC.
pub fn rfc3339(ms: u64) -> Option<String> {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()?
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

/// One holder's memory on one GPU, now.
#[derive(Debug, PartialEq)]
struct Held {
    holder: String,
    machine: String,
    gpu: u32,
    held: Bytes,
    total: Bytes,
}

impl Held {
    /// What an open span of it is found by: holder, machine, GPU and bytes, as the table keeps them.
    fn key(&self) -> (&str, &str, i64, i64) {
        (
            self.holder.as_str(),
            self.machine.as_str(),
            i64::from(self.gpu),
            self.held.get() as i64,
        )
    }
}

/// What each holder holds on each GPU, as the scheduler says: its share, or a whole GPU's memory. The room
/// a group keeps for its on-demand members to take turns in is no one's use: an on-demand model's GPU time
/// counts only while it is loaded.
fn held_now(scheduler: &Scheduler) -> Vec<Held> {
    let mut out = Vec::new();
    for machine in scheduler.inventory().machines() {
        for gpu in &machine.gpus {
            held_on(scheduler, machine, gpu, &mut out);
        }
    }
    out
}

/// What `holders` hold now, each on each of its GPUs, as [`held_now`] says it.
fn held_by(scheduler: &Scheduler, holders: &BTreeSet<String>) -> Vec<Held> {
    let mut out = Vec::new();
    for holder in holders {
        let Some(assignment) = scheduler.workers().get(holder) else {
            continue;
        };
        let Some(machine) = scheduler.inventory().machine(&assignment.machine) else {
            continue;
        };
        for gpu in machine
            .gpus
            .iter()
            .filter(|g| assignment.gpus.contains(&g.index))
        {
            let mut on = Vec::new();
            held_on(scheduler, machine, gpu, &mut on);
            out.extend(on.into_iter().filter(|h| h.holder == *holder));
        }
    }
    out
}

/// What is held on `gpu` of `machine`, pushed onto `out`.
fn held_on(
    scheduler: &Scheduler,
    machine: &placement::Machine,
    gpu: &placement::Gpu,
    out: &mut Vec<Held>,
) {
    // A MIG instance is a part of its GPU: an hour of one is its memory's part of a GPU-hour.
    let total = match &gpu.mig {
        Some(placement::MigRole::Instance { parent, .. }) => machine
            .gpus
            .iter()
            .find(|g| g.index == *parent)
            .map_or(gpu.total, |g| g.total),
        _ => gpu.total,
    };
    let mut push = |holder: &str, held: Bytes| {
        out.push(Held {
            holder: holder.to_owned(),
            machine: machine.name.clone(),
            gpu: gpu.index,
            held,
            total,
        });
    };
    match scheduler.hold(&GpuRef::new(&machine.name, gpu.index)) {
        Some(Hold::Whole(worker)) => push(worker, gpu.total),
        Some(Hold::Shared(sharers)) => {
            for (holder, bytes) in sharers {
                if !holder::Holder::parse(holder).is_turns() {
                    push(holder, *bytes);
                }
            }
        }
        _ => {}
    }
}

/// An open span: its id, holder, machine, GPU index and bytes held.
type OpenSpan = (i64, String, String, i64, i64);

/// Brings the open spans in line with what is held now: a span whose holder let go, or now holds another
/// amount, ends at `now_ms`, and a new holding opens one. Called inside every write's own transaction.
pub(crate) async fn record_holdings(
    tx: &mut sqlx::SqliteConnection,
    ledger: &super::ledger::Ledger,
    now_ms: u64,
) -> Result<(), ApiError> {
    let open: Vec<OpenSpan> = sqlx::query_as(
        "SELECT id, holder, machine, gpu_index, held_bytes FROM holdings WHERE end_ms IS NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    reconcile_spans(tx, &open, &held_now(ledger.scheduler()), now_ms).await
}

/// [`record_holdings`] for `holders` alone, where a write changed what they hold and nothing else: their
/// open spans read by holder, not every one.
pub(crate) async fn record_holdings_of(
    tx: &mut sqlx::SqliteConnection,
    ledger: &super::ledger::Ledger,
    holders: &BTreeSet<String>,
    now_ms: u64,
) -> Result<(), ApiError> {
    let mut open: Vec<OpenSpan> = Vec::new();
    for holder in holders {
        open.extend(
            sqlx::query_as::<_, OpenSpan>(
                "SELECT id, holder, machine, gpu_index, held_bytes FROM holdings WHERE holder = ? AND end_ms IS NULL",
            )
            .bind(holder)
            .fetch_all(&mut *tx)
            .await?,
        );
    }
    reconcile_spans(tx, &open, &held_by(ledger.scheduler(), holders), now_ms).await
}

/// Where the open usage spans are not what `ledger` holds now, one each: a sentence for the spans open
/// for what is not held, and one for what is held with no span open.
pub(crate) async fn open_span_differences(
    tx: &mut sqlx::SqliteConnection,
    ledger: &super::ledger::Ledger,
) -> Result<Vec<String>, ApiError> {
    let open: Vec<OpenSpan> = sqlx::query_as(
        "SELECT id, holder, machine, gpu_index, held_bytes FROM holdings WHERE end_ms IS NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    let open: BTreeSet<(&str, &str, i64, i64)> = open
        .iter()
        .map(|(_, holder, machine, gpu, held)| (holder.as_str(), machine.as_str(), *gpu, *held))
        .collect();
    let now = held_now(ledger.scheduler());
    let held: BTreeSet<(&str, &str, i64, i64)> = now.iter().map(Held::key).collect();
    let said = |spans: Vec<&(&str, &str, i64, i64)>| -> String {
        spans
            .iter()
            .take(5)
            .map(|(holder, machine, gpu, bytes)| {
                format!("{holder} ({bytes} bytes of GPU {gpu} of {machine})")
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut differ = Vec::new();
    let stale: Vec<&(&str, &str, i64, i64)> = open.difference(&held).collect();
    if !stale.is_empty() {
        differ.push(format!(
            "{} usage spans are open for what is not held: {}",
            stale.len(),
            said(stale)
        ));
    }
    let missing: Vec<&(&str, &str, i64, i64)> = held.difference(&open).collect();
    if !missing.is_empty() {
        differ.push(format!(
            "{} holdings have no usage span open: {}",
            missing.len(),
            said(missing)
        ));
    }
    Ok(differ)
}

/// Ends each of the `open` spans that is not held `now`, and opens one for each holding that has none.
async fn reconcile_spans(
    tx: &mut sqlx::SqliteConnection,
    open: &[OpenSpan],
    now: &[Held],
    now_ms: u64,
) -> Result<(), ApiError> {
    // Matched by key, not searched pairwise: 40,000 holders each way would be 1.6 billion comparisons.
    let open_keys: std::collections::HashSet<(&str, &str, i64, i64)> = open
        .iter()
        .map(|(_, holder, machine, gpu, held)| (holder.as_str(), machine.as_str(), *gpu, *held))
        .collect();
    let now_keys: std::collections::HashSet<(&str, &str, i64, i64)> =
        now.iter().map(Held::key).collect();
    let ended: Vec<i64> = open
        .iter()
        .filter(|(_, holder, machine, gpu, held)| {
            !now_keys.contains(&(holder.as_str(), machine.as_str(), *gpu, *held))
        })
        .map(|o| o.0)
        .collect();
    let started: Vec<&Held> = now
        .iter()
        .filter(|h| !open_keys.contains(&h.key()))
        .collect();
    for id in ended {
        sqlx::query("UPDATE holdings SET end_ms = ? WHERE id = ?")
            .bind(now_ms as i64)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    for h in started {
        let holder = holder::Holder::parse(&h.holder);
        let (name, group) = (holder.name(), holder.group());
        sqlx::query("INSERT INTO holdings (holder, name, group_name, machine, gpu_index, held_bytes, gpu_total_bytes, start_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
            .bind(&h.holder)
            .bind(name)
            .bind(group)
            .bind(&h.machine)
            .bind(i64::from(h.gpu))
            .bind(h.held.get() as i64)
            .bind(h.total.get() as i64)
            .bind(now_ms as i64)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

impl Fleet {
    /// Keeps one reading of `machine`'s GPUs: for splitting their use and energy among sharers, for the
    /// machine page's charts, and as its engines' peaks against their shares (what [`Fleet::measure`]
    /// took from this reading), in one transaction.
    pub async fn record_samples(
        &self,
        machine: &placement::Machine,
        live: &[GpuLive],
        at_ms: u64,
    ) -> Result<(), ApiError> {
        let measured = self.measured_shares(&machine.name).await;
        let mut tx = crate::db::write(&self.pool).await?;
        super::peaks::write_peaks(&mut tx, &machine.name, measured, at_ms).await?;
        for gpu in live {
            let outside = machine
                .gpus
                .iter()
                .find(|g| g.index == gpu.index)
                .map(|g| g.held_outside.get() as i64);
            sqlx::query("INSERT OR IGNORE INTO gpu_samples (machine, gpu_index, at_ms, utilisation_percent, energy_mj, used_bytes, held_outside_bytes, temperature_c, power_mw) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
                .bind(&machine.name)
                .bind(i64::from(gpu.index))
                .bind(at_ms as i64)
                .bind(i64::from(gpu.utilisation_percent.min(100)))
                .bind(gpu.energy_mj.map(|mj| mj as i64))
                .bind(gpu.used.get() as i64)
                .bind(outside)
                .bind(gpu.temperature_c.map(i64::from))
                .bind(gpu.power_mw.map(i64::from))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The usage report of `[from_ms, to_ms)`, by `by`: from the raw readings where they are kept, and from
    /// the runs they were rolled up into before that ([`roll_up_samples`]), with the same figures over whole
    /// hours.
    pub async fn usage(
        &self,
        from_ms: u64,
        to_ms: u64,
        by: Grouping,
    ) -> Result<UsageReport, ApiError> {
        type Row = (
            String,
            Option<String>,
            String,
            i64,
            i64,
            i64,
            i64,
            Option<i64>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT name, group_name, machine, gpu_index, held_bytes, gpu_total_bytes, start_ms, end_ms FROM holdings \
             WHERE start_ms < ?1 AND (end_ms IS NULL OR end_ms > ?2) ORDER BY id",
        )
        .bind(to_ms as i64)
        .bind(from_ms as i64)
        .fetch_all(&self.pool)
        .await?;
        let open_until = now_ms().min(to_ms);
        let mut readings: BTreeMap<(String, i64), Vec<Reading>> = BTreeMap::new();
        let mut parts = Vec::with_capacity(rows.len());
        for (name, group, machine, gpu, held, total, start, end) in rows {
            let holding = Holding {
                start_ms: start as u64,
                end_ms: end.map_or(open_until, |e| e as u64),
                held: Bytes(held as u64),
                gpu_total: Bytes(total as u64),
            };
            let Some(holding) = holding.clip(from_ms, to_ms) else {
                continue;
            };
            let key = (machine.clone(), gpu);
            if !readings.contains_key(&key) {
                let read = self.readings(&machine, gpu, from_ms, to_ms).await?;
                readings.insert(key.clone(), read);
            }
            parts.push((
                Holder {
                    name,
                    group,
                    machine,
                },
                figures(&holding, &readings[&key]),
            ));
        }
        let mut report = UsageReport::tally(from_ms, to_ms, by, parts);
        report.requests = self.calls().report(&self.pool, from_ms, to_ms).await?;
        Ok(report)
    }

    /// One GPU's readings over `[from_ms, to_ms]`, raw or rolled up, with the last one before `from_ms`
    /// (whose successor covers the time across `from_ms`), oldest first.
    async fn readings(
        &self,
        machine: &str,
        gpu: i64,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<Reading>, ApiError> {
        // One snapshot for both reads: a roll-up committed between them would hide an hour or count it twice.
        let mut snapshot = self.pool.begin().await?;
        let runs: Vec<RunRow> = sqlx::query_as(
            "SELECT first_ms, first_utilisation_percent, first_energy_mj, last_ms, last_utilisation_percent, \
             last_energy_mj, samples, busy_ms, energy_mj FROM gpu_sample_runs WHERE machine = ?1 AND gpu_index = ?2 \
             AND first_ms >= COALESCE((SELECT MAX(first_ms) FROM gpu_sample_runs WHERE machine = ?1 AND gpu_index = ?2 AND first_ms <= ?3), 0) \
             AND first_ms <= ?4 ORDER BY first_ms",
        )
        .bind(machine)
        .bind(gpu)
        .bind(from_ms as i64)
        .bind(to_ms as i64)
        .fetch_all(&mut *snapshot)
        .await?;
        let raw: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
            "SELECT at_ms, utilisation_percent, energy_mj FROM gpu_samples WHERE machine = ?1 AND gpu_index = ?2 \
             AND at_ms >= COALESCE((SELECT MAX(at_ms) FROM gpu_samples WHERE machine = ?1 AND gpu_index = ?2 AND at_ms <= ?3), 0) \
             AND at_ms <= ?4 ORDER BY at_ms",
        )
        .bind(machine)
        .bind(gpu)
        .bind(from_ms as i64)
        .bind(to_ms as i64)
        .fetch_all(&mut *snapshot)
        .await?;
        let mut out: Vec<Reading> = runs
            .into_iter()
            .map(|row| Reading::Run(Run::from_row(row)))
            .chain(
                raw.into_iter()
                    .map(|(at, utilisation, energy)| Reading::Raw(sample(at, utilisation, energy))),
            )
            .collect();
        // Runs are older than every raw reading; sorting keeps the order whatever a clock did.
        out.sort_by_key(Reading::at_ms);
        Ok(out)
    }
}

fn sample(at_ms: i64, utilisation_percent: i64, energy_mj: Option<i64>) -> Sample {
    Sample {
        at_ms: at_ms as u64,
        utilisation_percent: utilisation_percent as u32,
        energy_mj: energy_mj.map(|e| e as u64),
    }
}

/// A row of `gpu_sample_runs` from `first_ms` on.
type RunRow = (
    i64,
    i64,
    Option<i64>,
    i64,
    i64,
    Option<i64>,
    i64,
    Option<i64>,
    Option<i64>,
);

/// A run of one GPU's readings rolled up: its first and last readings whole, and what the report takes
/// from the pairs of readings between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first: Sample,
    last: Sample,
    samples: u64,
    /// The utilisation-weighted milliseconds of the pairs inside it; `None` without a pair.
    busy_ms: Option<u64>,
    /// The energy counter's growth over the pairs inside it; `None` where no pair tells.
    energy_mj: Option<u64>,
}

impl Run {
    /// The run of `samples` (one GPU's, oldest first, at least one): each sum is what a holding covering
    /// the whole run takes from its pairs before its share is applied, rounded pair by pair as the report
    /// rounds.
    fn of(samples: &[Sample]) -> Run {
        let (first, last) = (samples[0], samples[samples.len() - 1]);
        let figures = whole(first.at_ms, last.at_ms).figures(samples);
        Run {
            first,
            last,
            samples: samples.len() as u64,
            busy_ms: figures.busy.map(|b| b.0),
            energy_mj: figures.energy_mj,
        }
    }

    fn from_row(row: RunRow) -> Run {
        let (first_ms, first_u, first_e, last_ms, last_u, last_e, samples, busy, energy) = row;
        Run {
            first: sample(first_ms, first_u, first_e),
            last: sample(last_ms, last_u, last_e),
            samples: samples as u64,
            busy_ms: busy.map(|b| b as u64),
            energy_mj: energy.map(|e| e as u64),
        }
    }

    /// What the pairs inside it give the time `[start_ms, end_ms)`: all of it where that covers the run,
    /// nothing where it misses it, and a part in proportion where it covers a part (a period that does not
    /// begin or end on a whole hour, older than the raw readings).
    fn within(&self, start_ms: u64, end_ms: u64) -> (Option<u64>, Option<u64>) {
        let span = self.last.at_ms.saturating_sub(self.first.at_ms);
        let overlap = self
            .last
            .at_ms
            .min(end_ms)
            .saturating_sub(self.first.at_ms.max(start_ms));
        if overlap == 0 {
            return (None, None);
        }
        let part = |v: u64| (u128::from(v) * u128::from(overlap) / u128::from(span)) as u64;
        (self.busy_ms.map(part), self.energy_mj.map(part))
    }
}

/// One GPU's reading as the report reads it: raw, or a rolled-up run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    Raw(Sample),
    Run(Run),
}

impl Reading {
    fn at_ms(&self) -> u64 {
        match self {
            Reading::Raw(s) => s.at_ms,
            Reading::Run(r) => r.first.at_ms,
        }
    }
}

/// A holding of the whole GPU over `[start_ms, end_ms)`: its figures are the GPU's own, before any share.
fn whole(start_ms: u64, end_ms: u64) -> Holding {
    Holding {
        start_ms,
        end_ms,
        held: Bytes(1),
        gpu_total: Bytes(1),
    }
}

/// `holding`'s figures from its GPU's `readings` (oldest first), as [`Holding::figures`] reads raw
/// readings: each pair of consecutive readings counts as placement says, a run's inside counts as its sums,
/// and the holding's share is taken once, of the whole.
fn figures(holding: &Holding, readings: &[Reading]) -> Figures {
    /// Utilisation-weighted milliseconds and energy, the GPU's own; `None` where nothing tells.
    type Sums = (Option<u64>, Option<u64>);
    fn add(a: Sums, b: Sums) -> Sums {
        fn either(a: Option<u64>, b: Option<u64>) -> Option<u64> {
            match (a, b) {
                (Some(a), Some(b)) => Some(a + b),
                (a, b) => a.or(b),
            }
        }
        (either(a.0, b.0), either(a.1, b.1))
    }
    let gpu = whole(holding.start_ms, holding.end_ms);
    let of_pairs = |chain: &[Sample]| -> Sums {
        let f = gpu.figures(chain);
        (f.busy.map(|b| b.0), f.energy_mj)
    };
    let mut sums: Sums = (None, None);
    // Readings whose consecutive pairs are real pairs of readings.
    let mut chain: Vec<Sample> = Vec::new();
    for reading in readings {
        match reading {
            Reading::Raw(s) => chain.push(*s),
            Reading::Run(run) if run.samples <= 1 => chain.push(run.first),
            Reading::Run(run) => {
                chain.push(run.first);
                sums = add(sums, of_pairs(&chain));
                chain.clear();
                sums = add(sums, run.within(holding.start_ms, holding.end_ms));
                chain.push(run.last);
            }
        }
    }
    let (busy, energy) = add(sums, of_pairs(&chain));
    Figures {
        gpu_time: holding.gpu_time(),
        busy: busy.map(|ms| GpuMillis(holding.part_of(ms))),
        energy_mj: energy.map(|mj| holding.part_of(mj)),
    }
}

/// Rolls up every raw reading older than the whole hour at or before `before_ms` into runs
/// ([`Run`]): one GPU's hour at a time, each in a transaction of its own that writes the runs and deletes
/// the readings together, with `pause` between them so that other writers get the lock. A roll-up cut
/// short (the server stopped) leaves each hour either raw or rolled up, never both, and the next one goes
/// on from there. How many readings were rolled up.
pub(crate) async fn roll_up_samples(
    pool: &SqlitePool,
    before_ms: u64,
    pause: Duration,
) -> Result<u64, sqlx::Error> {
    let before_ms = before_ms - before_ms % HOUR_MS;
    let mut rolled = 0;
    let mut after: (String, i64) = (String::new(), i64::MIN);
    while let Some((machine, gpu)) = sqlx::query_as::<_, (String, i64)>(
        "SELECT machine, gpu_index FROM gpu_samples WHERE (machine, gpu_index) > (?, ?) \
         ORDER BY machine, gpu_index LIMIT 1",
    )
    .bind(&after.0)
    .bind(after.1)
    .fetch_optional(pool)
    .await?
    {
        loop {
            let mut tx = crate::db::write(pool).await?;
            let Some(n) = roll_up_hour(&mut tx, &machine, gpu, before_ms).await? else {
                break;
            };
            tx.commit().await?;
            rolled += n;
            tokio::time::sleep(pause).await;
        }
        after = (machine, gpu);
    }
    Ok(rolled)
}

/// Rolls up the oldest hour of `machine`'s GPU `gpu`'s raw readings, if it ends by `before_ms` (a whole
/// hour): its readings become runs, cut wherever a holding on the GPU begins or ends, and are deleted.
/// How many readings; `None` when there is no such hour.
pub(crate) async fn roll_up_hour(
    tx: &mut SqliteConnection,
    machine: &str,
    gpu: i64,
    before_ms: u64,
) -> Result<Option<u64>, sqlx::Error> {
    let oldest: Option<i64> = sqlx::query_scalar(
        "SELECT MIN(at_ms) FROM gpu_samples WHERE machine = ? AND gpu_index = ?",
    )
    .bind(machine)
    .bind(gpu)
    .fetch_one(&mut *tx)
    .await?;
    let Some(oldest) = oldest.map(|ms| ms.max(0) as u64) else {
        return Ok(None);
    };
    let from = oldest - oldest % HOUR_MS;
    let to = from + HOUR_MS;
    if to > before_ms {
        return Ok(None);
    }
    let raw: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
        "SELECT at_ms, utilisation_percent, energy_mj FROM gpu_samples \
         WHERE machine = ? AND gpu_index = ? AND at_ms >= ? AND at_ms < ? ORDER BY at_ms",
    )
    .bind(machine)
    .bind(gpu)
    .bind(from as i64)
    .bind(to as i64)
    .fetch_all(&mut *tx)
    .await?;
    let cuts: Vec<i64> = sqlx::query_scalar(
        "SELECT start_ms FROM holdings WHERE machine = ?1 AND gpu_index = ?2 AND start_ms > ?3 AND start_ms < ?4 \
         UNION SELECT end_ms FROM holdings WHERE machine = ?1 AND gpu_index = ?2 AND end_ms > ?3 AND end_ms < ?4 \
         ORDER BY 1",
    )
    .bind(machine)
    .bind(gpu)
    .bind(from as i64)
    .bind(to as i64)
    .fetch_all(&mut *tx)
    .await?;
    // Runs already made over this hour (readings that came late, after it was rolled up): a reading
    // inside one cannot be told apart from the readings it replaced, and is dropped.
    let made: Vec<(i64, i64)> = sqlx::query_as(
        "SELECT first_ms, last_ms FROM gpu_sample_runs WHERE machine = ? AND gpu_index = ? AND first_ms < ? AND last_ms >= ?",
    )
    .bind(machine)
    .bind(gpu)
    .bind(to as i64)
    .bind(from as i64)
    .fetch_all(&mut *tx)
    .await?;
    let samples = raw
        .iter()
        .filter(|(at, _, _)| !made.iter().any(|(f, l)| f <= at && at <= l))
        .map(|&(at, utilisation, energy)| sample(at, utilisation, energy));
    let runs = runs_of(samples, cuts.into_iter().map(|c| c as u64));
    for run in runs {
        sqlx::query(
            "INSERT INTO gpu_sample_runs (machine, gpu_index, first_ms, first_utilisation_percent, first_energy_mj, \
             last_ms, last_utilisation_percent, last_energy_mj, samples, busy_ms, energy_mj) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(machine)
        .bind(gpu)
        .bind(run.first.at_ms as i64)
        .bind(i64::from(run.first.utilisation_percent))
        .bind(run.first.energy_mj.map(|e| e as i64))
        .bind(run.last.at_ms as i64)
        .bind(i64::from(run.last.utilisation_percent))
        .bind(run.last.energy_mj.map(|e| e as i64))
        .bind(run.samples as i64)
        .bind(run.busy_ms.map(|b| b as i64))
        .bind(run.energy_mj.map(|e| e as i64))
        .execute(&mut *tx)
        .await?;
    }
    sqlx::query(
        "DELETE FROM gpu_samples WHERE machine = ? AND gpu_index = ? AND at_ms >= ? AND at_ms < ?",
    )
    .bind(machine)
    .bind(gpu)
    .bind(from as i64)
    .bind(to as i64)
    .execute(&mut *tx)
    .await?;
    Ok(Some(raw.len() as u64))
}

/// `samples` (one GPU's, oldest first) as runs, cut at each of `cuts` (in order): a cut at `t` ends a run
/// before the first reading at or after `t`.
fn runs_of(
    samples: impl IntoIterator<Item = Sample>,
    cuts: impl IntoIterator<Item = u64>,
) -> Vec<Run> {
    let mut runs = Vec::new();
    let mut cuts = cuts.into_iter().peekable();
    let mut current: Vec<Sample> = Vec::new();
    for s in samples {
        let mut crossed = false;
        while cuts.next_if(|&c| c <= s.at_ms).is_some() {
            crossed = true;
        }
        if crossed && !current.is_empty() {
            runs.push(Run::of(&current));
            current.clear();
        }
        current.push(s);
    }
    if !current.is_empty() {
        runs.push(Run::of(&current));
    }
    runs
}

/// The most rows one retention transaction deletes.
const BATCH: i64 = 1000;

/// Deletes the usage older than `before_ms`: closed holdings that ended before it and runs of readings
/// that ended before it, [`BATCH`] rows of each per transaction, with `pause` between them. How many rows.
pub(crate) async fn forget_usage_before(
    pool: &SqlitePool,
    before_ms: u64,
    pause: Duration,
) -> Result<u64, sqlx::Error> {
    let mut forgotten = 0;
    loop {
        let mut tx = crate::db::write(pool).await?;
        let holdings = sqlx::query(
            "DELETE FROM holdings WHERE id IN \
             (SELECT id FROM holdings WHERE end_ms IS NOT NULL AND end_ms < ? ORDER BY end_ms LIMIT ?)",
        )
        .bind(before_ms as i64)
        .bind(BATCH)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let runs = sqlx::query(
            "DELETE FROM gpu_sample_runs WHERE (machine, gpu_index, first_ms) IN \
             (SELECT machine, gpu_index, first_ms FROM gpu_sample_runs WHERE last_ms < ? ORDER BY last_ms LIMIT ?)",
        )
        .bind(before_ms as i64)
        .bind(BATCH)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        let calls = super::calls::forget_before(&mut tx, before_ms, BATCH).await?;
        // A peak not read since is of a share no engine holds any more.
        let peaks = sqlx::query(
            "DELETE FROM share_peaks WHERE rowid IN \
             (SELECT rowid FROM share_peaks WHERE last_ms < ? ORDER BY last_ms LIMIT ?)",
        )
        .bind(before_ms as i64)
        .bind(BATCH)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        forgotten += holdings + runs + calls + peaks;
        if holdings + runs + calls + peaks == 0 {
            return Ok(forgotten);
        }
        tokio::time::sleep(pause).await;
    }
}

#[cfg(test)]
mod tests;
