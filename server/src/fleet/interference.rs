//! Each model's latency through the gateway, and the alarm for a model slowed by its neighbours (seed 002).
//! The gateway records every answered request's time to first byte with the neighbours that were busy on its
//! GPUs as it was sent; a request that ran alone also joins the model's dedicated baseline. Every second the
//! fleet judges each model with `placement::interference` and, when a model's state changes, says so in the
//! audit log, the event stream and the log.

use super::Fleet;
use crate::runtime::Event;
use placement::interference::{engine_figures, judge, EngineFigures, Interference, Ratio, Sample};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// The most requests kept per model in the sliding window (a busy model keeps its last ones).
const WINDOW_MAX: usize = 10_000;
/// The most requests kept per model from when it ran alone: its dedicated baseline.
const ALONE_MAX: usize = 1_000;

/// The gateway's latency figures and the models flagged now.
pub struct Latencies {
    window_ms: AtomicU64,
    threshold: AtomicU32,
    models: Mutex<BTreeMap<String, Figures>>,
    flagged: Mutex<BTreeMap<String, Interference>>,
}

#[derive(Default)]
struct Figures {
    window: VecDeque<Sample>,
    alone_us: VecDeque<u64>,
}

impl Default for Latencies {
    fn default() -> Latencies {
        Latencies {
            window_ms: AtomicU64::new(60_000),
            threshold: AtomicU32::new(Ratio::SEED_THRESHOLD.0),
            models: Mutex::default(),
            flagged: Mutex::default(),
        }
    }
}

impl Latencies {
    /// Judges over the last `window`, flagging a model whose shared p99 passes `threshold` times its p99
    /// alone.
    pub fn configure(&self, window: Duration, threshold: Ratio) {
        self.window_ms
            .store(window.as_millis() as u64, Ordering::Relaxed);
        self.threshold.store(threshold.0, Ordering::Relaxed);
    }

    /// The threshold a model is flagged past.
    pub fn threshold(&self) -> Ratio {
        Ratio(self.threshold.load(Ordering::Relaxed))
    }

    /// A request of `model` that an engine answered (or failed).
    pub fn record(&self, model: &str, sample: Sample) {
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        // The name is copied at the model's first request alone.
        if !models.contains_key(model) {
            models.insert(model.to_owned(), Figures::default());
        }
        let figures = models.get_mut(model).expect("put there above");
        if !sample.failed && sample.busy_neighbours.is_empty() {
            if figures.alone_us.len() == ALONE_MAX {
                figures.alone_us.pop_front();
            }
            figures.alone_us.push_back(sample.latency_us);
        }
        if figures.window.len() == WINDOW_MAX {
            figures.window.pop_front();
        }
        figures.window.push_back(sample);
    }

    /// `f` of each model's requests in the window at `now_ms` and its latencies alone (requests older than
    /// the window are let go first).
    fn each<T>(&self, now_ms: u64, f: impl Fn(&[Sample], &[u64]) -> T) -> Vec<(String, T)> {
        let since = now_ms.saturating_sub(self.window_ms.load(Ordering::Relaxed));
        let mut models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        models
            .iter_mut()
            .map(|(model, figures)| {
                while figures.window.front().is_some_and(|s| s.at_ms < since) {
                    figures.window.pop_front();
                }
                let alone = figures.alone_us.make_contiguous();
                (model.clone(), f(figures.window.make_contiguous(), alone))
            })
            .collect()
    }

    /// Every model with figures, judged at `now_ms`.
    pub fn judge_all(&self, now_ms: u64) -> Vec<(String, Interference)> {
        let threshold = self.threshold();
        self.each(now_ms, |window, alone| judge(window, alone, threshold))
    }

    /// Each model's engines' figures over the window at `now_ms`.
    pub fn engines_all(&self, now_ms: u64) -> Vec<(String, Vec<EngineFigures>)> {
        self.each(now_ms, |window, _| engine_figures(window))
    }

    /// How long each engine's requests sent since `since_ms` took, in all, µs: how busy the gateway kept
    /// it.
    pub fn busy_us_since(&self, since_ms: u64) -> BTreeMap<String, u64> {
        let models = self.models.lock().unwrap_or_else(PoisonError::into_inner);
        let mut busy: BTreeMap<String, u64> = BTreeMap::new();
        for sample in models
            .values()
            .flat_map(|f| f.window.iter().rev().take_while(|s| s.at_ms >= since_ms))
        {
            *busy.entry(sample.engine.clone()).or_default() += sample.request_us;
        }
        busy
    }

    /// The models flagged now, each with what raised it.
    pub fn flagged(&self) -> BTreeMap<String, Interference> {
        self.flagged
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Fleet {
    /// The gateway's latency figures.
    pub fn latencies(&self) -> &Latencies {
        &self.latencies
    }

    /// Why `model` is flagged as slowed by its neighbours, if it is.
    pub fn slowed(&self, model: &str) -> Option<String> {
        self.latencies
            .flagged()
            .get(model)
            .and_then(Interference::line)
    }

    /// Judges every model now; flags those newly slowed and clears those no longer, saying so.
    pub async fn judge_interference(&self) {
        let judged = self.latencies.judge_all(super::usage::now_ms());
        let (mut raised, mut cleared) = (Vec::new(), Vec::new());
        {
            let mut flagged = self
                .latencies
                .flagged
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            // Every flagged model has figures (they are never forgotten), so each is judged here.
            for (model, now) in judged {
                match (now.slowed, flagged.get_mut(&model)) {
                    (true, None) => {
                        raised.push((model.clone(), now.clone()));
                        flagged.insert(model, now);
                    }
                    // The figures of a flagged model follow it; its hint stays what raised the alarm.
                    (true, Some(was)) => {
                        let hint = std::mem::take(&mut was.busy_neighbours);
                        *was = Interference {
                            busy_neighbours: hint,
                            ..now
                        };
                    }
                    (false, Some(_)) => cleared.extend(flagged.remove_entry(&model)),
                    (false, None) => {}
                }
            }
        }
        for (model, interference, slowed) in raised
            .into_iter()
            .map(|(m, i)| (m, i, true))
            .chain(cleared.into_iter().map(|(m, i)| (m, i, false)))
        {
            self.say_interference(&model, &interference, slowed).await;
        }
    }

    async fn say_interference(&self, model: &str, interference: &Interference, slowed: bool) {
        let ratio = interference.ratio.map(|r| r.to_string());
        if slowed {
            tracing::warn!(
                "{model} is slowed by its neighbours: {}",
                interference.line().unwrap_or_default()
            );
        } else {
            tracing::info!("{model} is no longer slowed by its neighbours");
        }
        let entry = crate::audit::Entry::new(
            crate::audit::TESSERA,
            if slowed {
                "model.interference"
            } else {
                "model.interference.clear"
            },
            model,
        )
        .after(serde_json::json!({
            "ratio": ratio,
            "threshold": self.latencies.threshold().to_string(),
            "shared_p99_ms": interference.shared_p99_us.map(|us| us as f64 / 1000.0),
            "alone_p99_ms": interference.alone_p99_us.map(|us| us as f64 / 1000.0),
            "busy_neighbours": interference.busy_neighbours,
        }));
        let written = async {
            let mut tx = crate::db::write(&self.pool).await?;
            crate::audit::record(&mut tx, entry).await?;
            tx.commit().await
        };
        if let Err(e) = written.await {
            tracing::warn!(
                "the interference of {model} could not be written to the audit log: {e}"
            );
        }
        self.runtime.publish(Event::Interference {
            at: crate::runtime::now(),
            model: model.to_owned(),
            slowed,
            ratio,
            busy_neighbours: interference.busy_neighbours.clone(),
        });
    }

    /// Judges interference every `every`, for as long as the server runs.
    pub async fn keep_judging(self: std::sync::Arc<Fleet>, every: Duration) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            self.judge_interference().await;
        }
    }
}
