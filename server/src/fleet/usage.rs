//! Usage (seed 000): every span in which a worker or a group's model held memory on a GPU, recorded as the
//! committed state changes, and NVML's readings of this machine's GPUs. The report splits GPU time, use and
//! energy among the sharers of each GPU by their share of its memory.

use crate::error::ApiError;
use crate::fleet::Fleet;
use crate::inventory::GpuLive;
use placement::usage::{Grouping, Holder, Holding, Sample, UsageReport};
use placement::{Bytes, GpuRef, Hold, Scheduler};
use std::collections::BTreeMap;

/// Milliseconds since the epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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

/// What each holder holds on each GPU, as the scheduler says: its share, or a whole GPU's memory.
fn held_now(scheduler: &Scheduler) -> Vec<Held> {
    let mut out = Vec::new();
    for machine in scheduler.inventory().machines() {
        for gpu in &machine.gpus {
            let mut push = |holder: &str, held: Bytes| {
                out.push(Held {
                    holder: holder.to_owned(),
                    machine: machine.name.clone(),
                    gpu: gpu.index,
                    held,
                    total: gpu.total,
                });
            };
            match scheduler.hold(&GpuRef::new(&machine.name, gpu.index)) {
                Some(Hold::Whole(worker)) => push(worker, gpu.total),
                Some(Hold::Shared(sharers)) => {
                    for (holder, bytes) in sharers {
                        push(holder, *bytes);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Brings the open spans in line with what is held now: a span whose holder let go, or now holds another
/// amount, ends at `now_ms`, and a new holding opens one. Called inside every write's own transaction.
pub(crate) async fn record_holdings(
    tx: &mut sqlx::SqliteConnection,
    ledger: &super::ledger::Ledger,
    now_ms: u64,
) -> Result<(), ApiError> {
    let open: Vec<(i64, String, String, i64, i64)> = sqlx::query_as(
        "SELECT id, holder, machine, gpu_index, held_bytes FROM holdings WHERE end_ms IS NULL",
    )
    .fetch_all(&mut *tx)
    .await?;
    let now = held_now(ledger.scheduler());
    let same = |(_, holder, machine, gpu, held): &(i64, String, String, i64, i64), h: &Held| {
        *holder == h.holder
            && *machine == h.machine
            && *gpu == i64::from(h.gpu)
            && *held == h.held.get() as i64
    };
    let ended: Vec<i64> = open
        .iter()
        .filter(|o| !now.iter().any(|h| same(o, h)))
        .map(|o| o.0)
        .collect();
    let started: Vec<&Held> = now
        .iter()
        .filter(|h| !open.iter().any(|o| same(o, h)))
        .collect();
    for id in ended {
        sqlx::query("UPDATE holdings SET end_ms = ? WHERE id = ?")
            .bind(now_ms as i64)
            .bind(id)
            .execute(&mut *tx)
            .await?;
    }
    for h in started {
        let (name, group) = super::groups::sharer(&h.holder);
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
    /// Keeps one reading of `machine`'s GPUs, for splitting their use and energy among sharers.
    pub async fn record_samples(
        &self,
        machine: &str,
        live: &[GpuLive],
        at_ms: u64,
    ) -> Result<(), ApiError> {
        let mut tx = crate::db::write(&self.pool).await?;
        for gpu in live {
            sqlx::query("INSERT OR IGNORE INTO gpu_samples (machine, gpu_index, at_ms, utilisation_percent, energy_mj) VALUES (?, ?, ?, ?, ?)")
                .bind(machine)
                .bind(i64::from(gpu.index))
                .bind(at_ms as i64)
                .bind(i64::from(gpu.utilisation_percent.min(100)))
                .bind(gpu.energy_mj.map(|mj| mj as i64))
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The usage report of `[from_ms, to_ms)`, by `by`.
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
        let mut samples: BTreeMap<(String, i64), Vec<Sample>> = BTreeMap::new();
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
            if !samples.contains_key(&key) {
                let read = self.samples(&machine, gpu, from_ms, to_ms).await?;
                samples.insert(key.clone(), read);
            }
            parts.push((
                Holder {
                    name,
                    group,
                    machine,
                },
                holding.figures(&samples[&key]),
            ));
        }
        Ok(UsageReport::tally(from_ms, to_ms, by, parts))
    }

    /// One GPU's readings over `[from_ms, to_ms]`, with the last one before `from_ms` (whose successor covers
    /// the time across `from_ms`), oldest first.
    async fn samples(
        &self,
        machine: &str,
        gpu: i64,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<Sample>, ApiError> {
        let rows: Vec<(i64, i64, Option<i64>)> = sqlx::query_as(
            "SELECT at_ms, utilisation_percent, energy_mj FROM gpu_samples WHERE machine = ?1 AND gpu_index = ?2 \
             AND at_ms >= COALESCE((SELECT MAX(at_ms) FROM gpu_samples WHERE machine = ?1 AND gpu_index = ?2 AND at_ms <= ?3), 0) \
             AND at_ms <= ?4 ORDER BY at_ms",
        )
        .bind(machine)
        .bind(gpu)
        .bind(from_ms as i64)
        .bind(to_ms as i64)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(at, utilisation, energy)| Sample {
                at_ms: at as u64,
                utilisation_percent: utilisation as u32,
                energy_mj: energy.map(|e| e as u64),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
