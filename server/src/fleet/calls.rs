//! What the gateway carried: requests, failures and the tokens the engines reported, per model and API
//! token. Counted in memory as requests end (the gateway's path never waits on the database), written to
//! `gateway_calls` by the hour every few seconds and before a report is read, and kept as Prometheus
//! counters since the server started for `/metrics`.

use placement::usage::{RequestRow, HOUR_MS};
use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use sqlx::SqlitePool;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

/// One request's figures, or the sum of some.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests.
    pub requests: u64,
    /// Of those, failed ones.
    pub failed: u64,
    /// Prompt tokens the engine reported.
    pub prompt_tokens: u64,
    /// Completion tokens the engine reported.
    pub completion_tokens: u64,
}

impl std::ops::AddAssign for Counts {
    fn add_assign(&mut self, other: Counts) {
        self.requests += other.requests;
        self.failed += other.failed;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
    }
}

/// Who a request came from: an API token, or an account in the console's playground.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Key {
    /// As the usage report names it: `ada/ci (tsr_1a2b3c…)`, or `ada (console)`.
    pub label: String,
    /// As `/metrics` labels it: the token's first characters (which the token list shows), or
    /// `console/ada`.
    pub short: String,
}

impl Key {
    /// An API token's: its account, its name and its first characters.
    pub fn token(user: &str, name: &str, prefix: &str) -> Key {
        Key {
            label: format!("{user}/{name} ({prefix}…)"),
            short: prefix.to_owned(),
        }
    }

    /// A signed-in account's, in the console.
    pub fn console(user: &str) -> Key {
        Key {
            label: format!("{user} (console)"),
            short: format!("console/{user}"),
        }
    }
}

/// The gateway's figures: those not yet written, and the counters since start.
pub struct Calls {
    /// By model, then key (its label).
    callers: Mutex<HashMap<String, HashMap<String, Caller>>>,
    registry: Registry,
    requests: IntCounterVec,
    failed: IntCounterVec,
    prompt_tokens: IntCounterVec,
    completion_tokens: IntCounterVec,
}

impl Default for Calls {
    fn default() -> Calls {
        let registry = Registry::new();
        let counter = |name: &str, help: &str| {
            let counter = IntCounterVec::new(Opts::new(name, help), &["model", "key"])
                .expect("a valid metric");
            registry
                .register(Box::new(counter.clone()))
                .expect("registered once");
            counter
        };
        Calls {
            callers: Mutex::default(),
            requests: counter(
                "tessera_gateway_requests_total",
                "Requests through the gateway, by model and API token (its first characters).",
            ),
            failed: counter(
                "tessera_gateway_failed_requests_total",
                "Requests through the gateway that failed: no engine ready, or an error status from the engine.",
            ),
            prompt_tokens: counter(
                "tessera_gateway_prompt_tokens_total",
                "Prompt tokens the engines reported in their answers' usage.",
            ),
            completion_tokens: counter(
                "tessera_gateway_completion_tokens_total",
                "Completion tokens the engines reported in their answers' usage.",
            ),
            registry,
        }
    }
}

/// One model's requests with one key: its counters since start, found once (a request adds to them
/// without looking its labels up), and what is not yet written, by hour (ms since the epoch).
struct Caller {
    requests: IntCounter,
    failed: IntCounter,
    prompt_tokens: IntCounter,
    completion_tokens: IntCounter,
    pending: BTreeMap<u64, Counts>,
}

impl Calls {
    /// Counts a request for `model` with `key` that ended at `at_ms`.
    pub fn record(&self, model: &str, key: &Key, counts: Counts, at_ms: u64) {
        let mut callers = self.callers();
        let caller = self.caller(&mut callers, model, key);
        caller.requests.inc_by(counts.requests);
        caller.failed.inc_by(counts.failed);
        caller.prompt_tokens.inc_by(counts.prompt_tokens);
        caller.completion_tokens.inc_by(counts.completion_tokens);
        *caller.pending.entry(at_ms - at_ms % HOUR_MS).or_default() += counts;
    }

    fn callers(&self) -> MutexGuard<'_, HashMap<String, HashMap<String, Caller>>> {
        self.callers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `model`'s figures with `key`: made (its names copied, its counters looked up) at its first request
    /// alone.
    fn caller<'a>(
        &self,
        callers: &'a mut HashMap<String, HashMap<String, Caller>>,
        model: &str,
        key: &Key,
    ) -> &'a mut Caller {
        if !callers
            .get(model)
            .is_some_and(|m| m.contains_key(&key.label))
        {
            let labels = [model, key.short.as_str()];
            let caller = Caller {
                requests: self.requests.with_label_values(&labels),
                failed: self.failed.with_label_values(&labels),
                prompt_tokens: self.prompt_tokens.with_label_values(&labels),
                completion_tokens: self.completion_tokens.with_label_values(&labels),
                pending: BTreeMap::new(),
            };
            callers
                .entry(model.to_owned())
                .or_default()
                .insert(key.label.clone(), caller);
        }
        callers
            .get_mut(model)
            .and_then(|m| m.get_mut(&key.label))
            .expect("made above")
    }

    /// The counters, for `/metrics`.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Writes what was counted since the last write, in one transaction; what fails to be written is
    /// kept for the next.
    pub async fn write(&self, pool: &SqlitePool) -> Result<(), sqlx::Error> {
        let taken: Vec<((u64, String, String), Counts)> = self
            .callers()
            .iter_mut()
            .flat_map(|(model, keys)| {
                keys.iter_mut().flat_map(move |(key, caller)| {
                    std::mem::take(&mut caller.pending)
                        .into_iter()
                        .map(move |(hour, counts)| ((hour, model.clone(), key.clone()), counts))
                })
            })
            .collect();
        if taken.is_empty() {
            return Ok(());
        }
        let written = async {
            let mut tx = crate::db::write(pool).await?;
            for ((hour, model, key), c) in &taken {
                sqlx::query(
                    "INSERT INTO gateway_calls \
                     (hour_ms, model, key, requests, failed, prompt_tokens, completion_tokens) \
                     VALUES (?, ?, ?, ?, ?, ?, ?) \
                     ON CONFLICT (hour_ms, model, key) DO UPDATE SET \
                     requests = requests + excluded.requests, failed = failed + excluded.failed, \
                     prompt_tokens = prompt_tokens + excluded.prompt_tokens, \
                     completion_tokens = completion_tokens + excluded.completion_tokens",
                )
                .bind(*hour as i64)
                .bind(model)
                .bind(key)
                .bind(c.requests as i64)
                .bind(c.failed as i64)
                .bind(c.prompt_tokens as i64)
                .bind(c.completion_tokens as i64)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await
        }
        .await;
        if written.is_err() {
            let mut callers = self.callers();
            for ((hour, model, key), counts) in taken {
                // Callers are never forgotten: each is there still.
                if let Some(caller) = callers.get_mut(&model).and_then(|m| m.get_mut(&key)) {
                    *caller.pending.entry(hour).or_default() += counts;
                }
            }
        }
        written
    }

    /// The rows of `[from_ms, to_ms)` by model and key, by the hour the requests were asked in, most
    /// requests first; what is counted but not yet written is written first.
    pub async fn report(
        &self,
        pool: &SqlitePool,
        from_ms: u64,
        to_ms: u64,
    ) -> Result<Vec<RequestRow>, sqlx::Error> {
        self.write(pool).await?;
        type Row = (String, String, i64, i64, i64, i64);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT model, key, SUM(requests), SUM(failed), SUM(prompt_tokens), SUM(completion_tokens) \
             FROM gateway_calls WHERE hour_ms >= ? AND hour_ms < ? \
             GROUP BY model, key ORDER BY SUM(requests) DESC, model, key",
        )
        .bind((from_ms - from_ms % HOUR_MS) as i64)
        .bind(to_ms as i64)
        .fetch_all(pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(
                |(model, key, requests, failed, prompt, completion)| RequestRow {
                    model,
                    key,
                    requests: requests as u64,
                    failed: failed as u64,
                    prompt_tokens: prompt as u64,
                    completion_tokens: completion as u64,
                },
            )
            .collect())
    }
}

/// Deletes, in one statement, the hours that ended before `before_ms`; returns how many rows went.
pub(crate) async fn forget_before(
    tx: &mut sqlx::SqliteConnection,
    before_ms: u64,
    batch: i64,
) -> Result<u64, sqlx::Error> {
    Ok(sqlx::query(
        "DELETE FROM gateway_calls WHERE (hour_ms, model, key) IN \
         (SELECT hour_ms, model, key FROM gateway_calls WHERE hour_ms + ? <= ? ORDER BY hour_ms LIMIT ?)",
    )
    .bind(HOUR_MS as i64)
    .bind(before_ms as i64)
    .bind(batch)
    .execute(tx)
    .await?
    .rows_affected())
}

#[cfg(test)]
mod tests;
