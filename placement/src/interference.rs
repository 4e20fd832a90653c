//! Co-location interference (seed 002, "Monitoring Co-Located Models"): a model's p99 latency while it shares
//! its GPUs with busy neighbours, against its *dedicated* p99, measured while it was the only active sharer
//! there. When the ratio passes a threshold (1.5 in the seed) the model is slowed by its neighbours.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// A ratio of two latencies, in thousandths: 1500 is 1.5×.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Ratio(pub u32);

impl Ratio {
    /// Seed 002's threshold: 50 % slower than alone is too much interference.
    pub const SEED_THRESHOLD: Ratio = Ratio(1500);

    /// `part` over `whole`; `None` when `whole` is 0.
    pub fn of(part: u64, whole: u64) -> Option<Ratio> {
        (whole > 0).then(|| {
            Ratio((u128::from(part) * 1000 / u128::from(whole)).min(u32::MAX as u128) as u32)
        })
    }

    /// A threshold as typed (`1.5`), at least 1.0 and at most 100.
    pub fn parse(text: &str) -> Result<Ratio, RatioError> {
        let value: f64 = text.trim().parse().map_err(|_| RatioError)?;
        if !(1.0..=100.0).contains(&value) {
            return Err(RatioError);
        }
        Ok(Ratio((value * 1000.0).round() as u32))
    }

    /// As a plain number, for metrics.
    pub fn as_f64(self) -> f64 {
        f64::from(self.0) / 1000.0
    }
}

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hundredths = (self.0 + 5) / 10;
        write!(f, "{}.{:02}×", hundredths / 100, hundredths % 100)
    }
}

/// A threshold that is not a ratio of at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("an interference threshold is a ratio from 1 to 100, such as 1.5")]
pub struct RatioError;

/// One request through the gateway: the engine that answered, its time to first byte and to the end, the
/// tokens it reported, how many requests that engine had in flight, whether it failed, and the neighbours
/// that were busy on its GPUs when it was sent (none: it ran alone).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sample {
    /// When it was sent, ms since the epoch.
    pub at_ms: u64,
    /// The engine (its unit).
    pub engine: String,
    /// Its time to first byte (the first token of a streamed answer), µs.
    pub latency_us: u64,
    /// Its time to the answer's last byte, µs.
    pub request_us: u64,
    /// The completion tokens the engine reported.
    pub completion_tokens: u64,
    /// The engine's requests in flight as it was sent, this one included: its queue.
    pub queue_depth: u32,
    /// It failed (an error status from the engine).
    pub failed: bool,
    /// The other models with requests in flight on its GPUs as it was sent.
    pub busy_neighbours: Vec<String>,
}

/// p50 and p99 of one figure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spread {
    /// The median.
    pub p50: u64,
    /// The 99th percentile.
    pub p99: u64,
}

impl Spread {
    fn of(values: &[u64]) -> Option<Spread> {
        Some(Spread {
            p50: percentile(values, 500)?,
            p99: percentile(values, 990)?,
        })
    }
}

/// One engine's figures over the window.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineFigures {
    /// The engine (its unit).
    pub engine: String,
    /// Requests in the window.
    pub requests: usize,
    /// Of those, failed.
    pub errors: usize,
    /// Time to first byte of the answered ones, µs.
    pub first_byte_us: Option<Spread>,
    /// Time to the last byte of the answered ones, µs.
    pub request_us: Option<Spread>,
    /// Completion tokens per second of the answered ones that reported tokens.
    pub tokens_per_second: Option<Spread>,
    /// Requests in flight to it as each was sent.
    pub queue_depth: Option<Spread>,
}

/// Each engine's figures over `window` (one model's requests), by engine.
pub fn engine_figures(window: &[Sample]) -> Vec<EngineFigures> {
    let mut by_engine: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for sample in window {
        by_engine.entry(&sample.engine).or_default().push(sample);
    }
    by_engine
        .into_iter()
        .map(|(engine, samples)| {
            let answered: Vec<&&Sample> = samples.iter().filter(|s| !s.failed).collect();
            let of = |f: &dyn Fn(&Sample) -> Option<u64>| -> Option<Spread> {
                Spread::of(&answered.iter().filter_map(|s| f(s)).collect::<Vec<_>>())
            };
            EngineFigures {
                engine: engine.to_owned(),
                requests: samples.len(),
                errors: samples.len() - answered.len(),
                first_byte_us: of(&|s| Some(s.latency_us)),
                request_us: of(&|s| Some(s.request_us)),
                tokens_per_second: of(&|s| {
                    (s.completion_tokens > 0 && s.request_us > 0)
                        .then(|| s.completion_tokens * 1_000_000 / s.request_us)
                }),
                queue_depth: Spread::of(
                    &samples
                        .iter()
                        .map(|s| u64::from(s.queue_depth))
                        .collect::<Vec<_>>(),
                ),
            }
        })
        .collect()
}

/// The fewest requests a p99 is taken over, shared or alone: fewer say nothing.
pub const MIN_SAMPLES: usize = 20;

/// The value at or below which `per_mille` of `values` lie (nearest rank); `None` for no values.
pub fn percentile(values: &[u64], per_mille: u32) -> Option<u64> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = (sorted.len() as u64 * u64::from(per_mille))
        .div_ceil(1000)
        .max(1) as usize;
    sorted.get(rank - 1).copied()
}

/// What a model's latency says now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interference {
    /// p50 and p99 of its requests in the window that ran beside busy neighbours, µs.
    pub shared_p50_us: Option<u64>,
    /// The p99 of those.
    pub shared_p99_us: Option<u64>,
    /// How many such requests the window holds.
    pub shared_samples: usize,
    /// Its dedicated p99: of the requests kept from when it was the only active sharer, µs.
    pub alone_p99_us: Option<u64>,
    /// How many such requests are kept.
    pub alone_samples: usize,
    /// Shared p99 over dedicated p99, when both rest on enough requests.
    pub ratio: Option<Ratio>,
    /// The ratio passes the threshold.
    pub slowed: bool,
    /// The co-location hint: the neighbours busy during its shared requests, the most often busy first.
    pub busy_neighbours: Vec<String>,
}

impl Interference {
    /// The line the console shows for a slowed model: `p99 2.10× its p99 alone (84 ms against 40 ms); busy
    /// beside it: vision, speech.`
    pub fn line(&self) -> Option<String> {
        if !self.slowed {
            return None;
        }
        let (ratio, shared, alone) = (self.ratio?, self.shared_p99_us?, self.alone_p99_us?);
        Some(format!(
            "Slowed by its neighbours: p99 {ratio} its p99 alone ({} ms against {} ms); busy beside it: {}.",
            shared.div_ceil(1000),
            alone.div_ceil(1000),
            self.busy_neighbours.join(", ")
        ))
    }
}

/// Judges a model from `window` (its requests of the sliding window) and `alone_us` (the latencies kept from
/// when it ran alone): the ratio of the shared p99 to the dedicated p99, slowed when over `threshold`. Each
/// p99 needs [`MIN_SAMPLES`] requests; the window's requests that ran alone, or failed, count toward
/// neither.
pub fn judge(window: &[Sample], alone_us: &[u64], threshold: Ratio) -> Interference {
    let shared: Vec<&Sample> = window
        .iter()
        .filter(|s| !s.failed && !s.busy_neighbours.is_empty())
        .collect();
    let shared_us: Vec<u64> = shared.iter().map(|s| s.latency_us).collect();
    let enough = |n: usize| n >= MIN_SAMPLES;
    let shared_p99 = percentile(&shared_us, 990).filter(|_| enough(shared_us.len()));
    let alone_p99 = percentile(alone_us, 990).filter(|_| enough(alone_us.len()));
    let ratio = shared_p99
        .zip(alone_p99)
        .and_then(|(shared, alone)| Ratio::of(shared, alone));
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for sample in &shared {
        for name in &sample.busy_neighbours {
            *counts.entry(name).or_default() += 1;
        }
    }
    let mut busy: Vec<(&str, usize)> = counts.into_iter().collect();
    busy.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    Interference {
        shared_p50_us: percentile(&shared_us, 500),
        shared_p99_us: shared_p99,
        shared_samples: shared_us.len(),
        alone_p99_us: alone_p99,
        alone_samples: alone_us.len(),
        slowed: ratio.is_some_and(|r| r > threshold),
        ratio,
        busy_neighbours: busy.into_iter().map(|(n, _)| n.to_owned()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample(latency_ms: u64, busy: &[&str]) -> Sample {
        Sample {
            latency_us: latency_ms * 1000,
            busy_neighbours: busy.iter().map(|b| (*b).to_owned()).collect(),
            ..Sample::default()
        }
    }

    #[test]
    fn each_engine_has_its_latency_tokens_per_second_queue_and_errors_over_the_window() {
        let request =
            |engine: &str, first_ms: u64, whole_ms: u64, tokens: u64, depth: u32| Sample {
                engine: engine.into(),
                latency_us: first_ms * 1000,
                request_us: whole_ms * 1000,
                completion_tokens: tokens,
                queue_depth: depth,
                ..Sample::default()
            };
        let mut window: Vec<Sample> = (1..=10)
            .map(|i| request("glm@atlas", 10 * i, 100 * i, 20, i as u32))
            .collect();
        window.push(Sample {
            failed: true,
            ..request("glm@atlas", 1, 1, 0, 11)
        });
        window.push(request("glm@node", 5, 50, 0, 1));
        let figures = engine_figures(&window);
        assert_eq!(figures.len(), 2);
        let atlas = &figures[0];
        assert_eq!(
            (atlas.engine.as_str(), atlas.requests, atlas.errors),
            ("glm@atlas", 11, 1)
        );
        assert_eq!(
            atlas.first_byte_us,
            Some(Spread {
                p50: 50_000,
                p99: 100_000
            })
        );
        assert_eq!(
            atlas.request_us,
            Some(Spread {
                p50: 500_000,
                p99: 1_000_000
            })
        );
        // 20 tokens in 0.6 s at the median (33 a second), in 0.1 s at the fastest.
        assert_eq!(atlas.tokens_per_second, Some(Spread { p50: 33, p99: 200 }));
        assert_eq!(atlas.queue_depth, Some(Spread { p50: 6, p99: 11 }));
        assert_eq!(figures[1].tokens_per_second, None, "no tokens reported");
    }

    #[test]
    fn a_failed_request_is_not_timed_against_the_baseline() {
        let alone: Vec<u64> = vec![40_000; 50];
        let window: Vec<Sample> = (0..30)
            .map(|_| Sample {
                failed: true,
                ..sample(500, &["vision"])
            })
            .collect();
        assert_eq!(
            judge(&window, &alone, Ratio::SEED_THRESHOLD).shared_samples,
            0
        );
    }

    #[test]
    fn a_model_twice_as_slow_beside_busy_neighbours_is_flagged_with_who_was_busy() {
        let alone: Vec<u64> = (0..50).map(|i| (40 + i % 3) * 1000).collect();
        let mut window: Vec<Sample> = (0..30).map(|_| sample(84, &["vision"])).collect();
        window.extend((0..10).map(|_| sample(84, &["speech", "vision"])));
        window.extend((0..5).map(|_| sample(40, &[])));
        let judged = judge(&window, &alone, Ratio::SEED_THRESHOLD);
        assert!(judged.slowed);
        assert_eq!(judged.ratio, Some(Ratio(2000)));
        assert_eq!(judged.shared_samples, 40);
        assert_eq!(judged.busy_neighbours, ["vision", "speech"]);
        assert_eq!(
            judged.line().unwrap(),
            "Slowed by its neighbours: p99 2.00× its p99 alone (84 ms against 42 ms); busy beside it: vision, speech."
        );
    }

    #[test]
    fn under_the_threshold_or_on_too_few_requests_nothing_is_flagged() {
        let alone: Vec<u64> = vec![40_000; 50];
        let window: Vec<Sample> = (0..30).map(|_| sample(60, &["vision"])).collect();
        let judged = judge(&window, &alone, Ratio::SEED_THRESHOLD);
        assert_eq!(judged.ratio, Some(Ratio(1500)));
        assert!(!judged.slowed, "1.5× is the threshold, not past it");
        let few = judge(&window[..MIN_SAMPLES - 1], &alone, Ratio(1000));
        assert_eq!(few.ratio, None);
        assert!(!few.slowed);
        let no_baseline = judge(&window, &alone[..5], Ratio(1000));
        assert_eq!(no_baseline.ratio, None);
        assert_eq!(no_baseline.line(), None);
    }

    #[test]
    fn a_threshold_is_read_as_a_ratio_from_one() {
        assert_eq!(Ratio::parse("1.5"), Ok(Ratio(1500)));
        assert_eq!(Ratio::parse(" 2 "), Ok(Ratio(2000)));
        for bad in ["0.9", "fast", "-1", "101"] {
            assert_eq!(
                Ratio::parse(bad).unwrap_err().to_string(),
                "an interference threshold is a ratio from 1 to 100, such as 1.5"
            );
        }
        assert_eq!(Ratio(1234).to_string(), "1.23×");
        assert_eq!(Ratio::of(3, 0), None);
    }

    proptest! {
        /// Against the definition of the nearest rank: at least `p` of the values lie at or below it, and
        /// fewer than `p` lie strictly below it.
        #[test]
        fn the_percentile_is_the_nearest_rank(
            values in proptest::collection::vec(0u64..1000, 1..200),
            per_mille in 1u32..=1000,
        ) {
            let p = percentile(&values, per_mille).unwrap();
            let n = values.len() as u64;
            let at_or_below = values.iter().filter(|v| **v <= p).count() as u64;
            let below = values.iter().filter(|v| **v < p).count() as u64;
            prop_assert!(at_or_below * 1000 >= n * u64::from(per_mille));
            prop_assert!(below * 1000 < n * u64::from(per_mille));
        }
    }
}
