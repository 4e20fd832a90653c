//! Replicas that follow traffic: how many copies of a model its load asks for. A model deployed with
//! `replicas` runs between `min` and `max` of them; its load (requests in flight and waiting, as the gateway
//! counts them) is sampled, and a replica is added when the load has stayed above what the replicas hold at
//! the target concurrency for the short window, and one removed when it has stayed low enough for one fewer
//! for the long window (Knative's panic and stable windows, in spirit). Pure: the server samples and carries
//! out what this decides.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::fmt;

/// How many copies of a model may run, and how quickly their number follows its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Wire", into = "Wire")]
pub struct Autoscale {
    min: u32,
    max: u32,
    target: Option<u32>,
    up_s: u32,
    down_s: u32,
}

/// [`Autoscale`] as a script sends it: only `max` is required.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Wire {
    /// The fewest replicas (default 1); 0 runs none while idle, and the first request starts one.
    #[serde(default = "one")]
    pub min: u32,
    /// The most replicas.
    pub max: u32,
    /// Requests in flight per replica it aims for; the engine's own slots when none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<u32>,
    /// How long the load stays above target before a replica is added, seconds.
    #[serde(default = "up_default")]
    pub up_s: u32,
    /// How long the load stays low enough for one fewer before a replica is removed, seconds.
    #[serde(default = "down_default")]
    pub down_s: u32,
}

fn one() -> u32 {
    1
}

fn up_default() -> u32 {
    Autoscale::UP_S
}

fn down_default() -> u32 {
    Autoscale::DOWN_S
}

/// Why an [`Autoscale`] was refused, saying what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AutoscaleError {
    /// `max` is 0.
    #[error("replicas.max must be at least 1: a model with no replica at all would never serve")]
    NoMax,
    /// `min` is above `max`.
    #[error("replicas.min ({min}) is above replicas.max ({max}): make max at least min")]
    MinAboveMax {
        /// As sent.
        min: u32,
        /// As sent.
        max: u32,
    },
    /// `max` is above [`Autoscale::MOST`].
    #[error("replicas.max ({0}) is above {most}: a model runs at most {most} replicas", most = Autoscale::MOST)]
    TooMany(u32),
    /// `target` is 0 or past [`Autoscale::TARGET_MOST`].
    #[error("replicas.target ({0}) must be between 1 and {most} requests per replica", most = Autoscale::TARGET_MOST)]
    Target(u32),
    /// More replicas than GPUs to run them on.
    #[error("replicas.max ({max}) is more than the {gpus} GPU(s) of its group: each replica runs on a GPU of its own; choose more GPUs, or lower max")]
    MoreThanGpus {
        /// As sent.
        max: u32,
        /// The GPUs of its group.
        gpus: u32,
    },
    /// Replicas asked of an on-demand model.
    #[error("an on-demand model loads on every machine of its group when asked for: leave replicas out, or pin it (replicas with a min of 0 run none while idle and start one when asked for)")]
    OnDemand,
    /// A field typed in the wizard that is not a whole number.
    #[error("{0} replicas: type a whole number")]
    NotANumber(&'static str),
    /// A window outside its bounds.
    #[error("replicas.{name} ({given} s) must be between {least} and {most} seconds")]
    Window {
        /// `up_s` or `down_s`.
        name: &'static str,
        /// As sent.
        given: u32,
        /// Its bounds.
        least: u32,
        /// Its bounds.
        most: u32,
    },
}

impl TryFrom<Wire> for Autoscale {
    type Error = AutoscaleError;

    fn try_from(w: Wire) -> Result<Autoscale, AutoscaleError> {
        if w.max == 0 {
            return Err(AutoscaleError::NoMax);
        }
        if w.min > w.max {
            return Err(AutoscaleError::MinAboveMax {
                min: w.min,
                max: w.max,
            });
        }
        if w.max > Autoscale::MOST {
            return Err(AutoscaleError::TooMany(w.max));
        }
        if let Some(target) = w
            .target
            .filter(|t| !(1..=Autoscale::TARGET_MOST).contains(t))
        {
            return Err(AutoscaleError::Target(target));
        }
        let window = |name, given: u32| {
            if (Autoscale::WINDOW_LEAST..=Autoscale::WINDOW_MOST).contains(&given) {
                Ok(given)
            } else {
                Err(AutoscaleError::Window {
                    name,
                    given,
                    least: Autoscale::WINDOW_LEAST,
                    most: Autoscale::WINDOW_MOST,
                })
            }
        };
        Ok(Autoscale {
            min: w.min,
            max: w.max,
            target: w.target,
            up_s: window("up_s", w.up_s)?,
            down_s: window("down_s", w.down_s)?,
        })
    }
}

impl From<Autoscale> for Wire {
    fn from(a: Autoscale) -> Wire {
        Wire {
            min: a.min,
            max: a.max,
            target: a.target,
            up_s: a.up_s,
            down_s: a.down_s,
        }
    }
}

impl Autoscale {
    /// The most replicas a model may have.
    pub const MOST: u32 = 64;
    /// The most requests in flight a replica may aim for.
    pub const TARGET_MOST: u32 = 100_000;
    /// The default window before a replica is added: Knative's panic window (a tenth of its stable one).
    pub const UP_S: u32 = 6;
    /// The default window before a replica is removed: Knative's stable window.
    pub const DOWN_S: u32 = 60;
    /// The shortest window: a few of the load's samples (twice a second).
    pub const WINDOW_LEAST: u32 = 2;
    /// The longest window, an hour.
    pub const WINDOW_MOST: u32 = 3600;

    /// Between `min` and `max` replicas, with the default target and windows.
    pub fn new(min: u32, max: u32) -> Result<Autoscale, AutoscaleError> {
        Autoscale::try_from(Wire {
            min,
            max,
            target: None,
            up_s: Autoscale::UP_S,
            down_s: Autoscale::DOWN_S,
        })
    }

    /// The fewest replicas.
    pub fn min(self) -> u32 {
        self.min
    }

    /// The most replicas.
    pub fn max(self) -> u32 {
        self.max
    }

    /// The target concurrency per replica as set, if it was.
    pub fn target(self) -> Option<u32> {
        self.target
    }

    /// How long a model's load is kept to decide on: its longer window, seconds.
    pub fn keep_s(self) -> u32 {
        self.up_s.max(self.down_s)
    }

    /// The same, with windows of `up_s` and `down_s` seconds.
    pub fn with_windows(self, up_s: u32, down_s: u32) -> Result<Autoscale, AutoscaleError> {
        Autoscale::try_from(Wire {
            up_s,
            down_s,
            ..Wire::from(self)
        })
    }

    /// The same target and windows, between `min` and `max` replicas.
    pub fn with_bounds(self, min: u32, max: u32) -> Result<Autoscale, AutoscaleError> {
        Autoscale::try_from(Wire {
            min,
            max,
            ..Wire::from(self)
        })
    }

    /// The same, refused where `max` is more than the `gpus` of its group (a replica runs on one).
    pub fn within(self, gpus: u32) -> Result<Autoscale, AutoscaleError> {
        if self.max > gpus {
            return Err(AutoscaleError::MoreThanGpus {
                max: self.max,
                gpus,
            });
        }
        Ok(self)
    }

    /// Refused for a model loaded on demand (`demand`): its engines load and unload together.
    pub fn check_demand(
        replicas: Option<Autoscale>,
        demand: crate::Demand,
    ) -> Result<(), AutoscaleError> {
        match replicas {
            Some(_) if demand.is_on_demand() => Err(AutoscaleError::OnDemand),
            _ => Ok(()),
        }
    }

    /// Replicas as typed in the deploy wizard for a group of `gpus` GPUs: `max` left empty is none (one
    /// engine on each machine, as a member without replicas); `min` left empty is 1.
    pub fn typed(min: &str, max: &str, gpus: u32) -> Result<Option<Autoscale>, AutoscaleError> {
        let (min, max) = (min.trim(), max.trim());
        if max.is_empty() {
            return Ok(None);
        }
        let max = max
            .parse()
            .map_err(|_| AutoscaleError::NotANumber("Most"))?;
        let min = match min {
            "" => 1,
            min => min
                .parse()
                .map_err(|_| AutoscaleError::NotANumber("Fewest"))?,
        };
        Autoscale::new(min, max)?.within(gpus).map(Some)
    }
}

/// The load of a model at one instant: its requests in flight to its engines and waiting for one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Sample {
    at_ms: u64,
    load: u32,
}

/// A change in a model's number of replicas, and why, in words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    /// Replicas before.
    pub from: u32,
    /// Replicas wanted.
    pub to: u32,
    /// Why, in words ("4 requests in flight or waiting on 1 replica of target 1 for 6 s").
    pub why: String,
}

/// A load at least this many times what a model's replicas hold adds replicas at its first sample, as
/// Knative's panic mode does: a burst does not wait out the short window queueing on what runs.
pub const PANIC_TIMES: u32 = 2;

/// One model's recent load, and the decisions it asks for.
#[derive(Debug, Clone, Default)]
pub struct Scaler {
    samples: VecDeque<Sample>,
}

/// `n` request(s).
fn requests(n: u32) -> String {
    if n == 1 {
        "1 request".to_owned()
    } else {
        format!("{n} requests")
    }
}

/// `n` replica(s).
fn replicas(n: u32) -> String {
    if n == 1 {
        "1 replica".to_owned()
    } else {
        format!("{n} replicas")
    }
}

impl Scaler {
    /// The model's load was `load` at `at_ms`; samples older than `keep_s` are forgotten.
    pub fn observe(&mut self, at_ms: u64, load: u32, keep_s: u32) {
        self.samples.push_back(Sample { at_ms, load });
        let oldest = at_ms.saturating_sub(u64::from(keep_s) * 1000);
        // The newest sample at or before the cutoff stays: it is what says the longest window is whole,
        // whatever the milliseconds the samples were taken at.
        while self.samples.get(1).is_some_and(|s| s.at_ms <= oldest) {
            self.samples.pop_front();
        }
    }

    /// How long, at `now_ms`, the model has had no request in flight or waiting: since its last sample
    /// with a load (or its oldest kept); `None` while its newest has one, or before any sample.
    pub fn idle_for(&self, now_ms: u64) -> Option<u64> {
        if self.samples.back()?.load > 0 {
            return None;
        }
        let since = self
            .samples
            .iter()
            .rev()
            .find(|s| s.load > 0)
            .or(self.samples.front())
            .map_or(now_ms, |s| s.at_ms);
        Some(now_ms.saturating_sub(since))
    }

    /// The model's setting changed: its load of late is judged afresh.
    pub fn reset(&mut self) {
        self.samples.clear();
    }

    /// A step from `from` to `to` replicas was carried out. After a step up the load of fewer replicas
    /// says nothing of more (their queue drains), so the windows start again. After a step down they go
    /// on: the load the long window saw fitted in one fewer and did not depend on the replica removed, so
    /// the next sample removes another where it fits in one fewer again, rather than after a whole new
    /// window with replicas idle.
    pub fn carried_out(&mut self, from: u32, to: u32) {
        if to > from {
            self.reset();
        }
    }

    /// The samples of the last `window_s` before `now_ms`, if they cover it (the oldest kept is at least
    /// that old), else `None`: no decision on less than a whole window.
    fn window(&self, now_ms: u64, window_s: u32) -> Option<impl Iterator<Item = u32> + '_> {
        let start = now_ms.checked_sub(u64::from(window_s) * 1000)?;
        let first = self.samples.front()?;
        (first.at_ms <= start).then(|| {
            self.samples
                .iter()
                .filter(move |s| s.at_ms >= start)
                .map(|s| s.load)
        })
    }

    /// What `running` replicas (placed, serving or starting) of a model scaled by `scale`, each aiming at
    /// `target` requests, should become at `now_ms`: `None` to stay. Below `min` or above `max` it goes
    /// there at once; up, at once to as many as the newest load needs where it is [`PANIC_TIMES`] what
    /// `running` hold, else to as many as the window's lowest load needs once it stayed above what
    /// `running` hold for the short window; down, by one once the window's highest load stayed within what
    /// one fewer holds for the long window.
    pub fn decide(
        &self,
        scale: Autoscale,
        running: u32,
        target: u32,
        now_ms: u64,
    ) -> Option<Decision> {
        let target = target.clamp(1, Autoscale::TARGET_MOST);
        let wanted = |load: u32| load.div_ceil(target).clamp(scale.min, scale.max);
        if running < scale.min {
            return Some(Decision {
                from: running,
                to: scale.min,
                why: format!("fewer than its least, {}", replicas(scale.min)),
            });
        }
        if running > scale.max {
            return Some(Decision {
                from: running,
                to: scale.max,
                why: format!("more than its most, {}", replicas(scale.max)),
            });
        }
        if running < scale.max {
            let holds = running.saturating_mul(target);
            if let Some(newest) = self.samples.back().filter(|s| s.at_ms <= now_ms) {
                // With none running (a min of 0, idle), any request waiting is such a load.
                if newest.load > holds && newest.load >= holds.saturating_mul(PANIC_TIMES) {
                    let why = if running == 0 {
                        format!("{} waiting with no replica running", requests(newest.load))
                    } else {
                        format!(
                            "{} in flight or waiting on {} of target {target}: {PANIC_TIMES} times what they hold",
                            requests(newest.load),
                            replicas(running)
                        )
                    };
                    return Some(Decision {
                        from: running,
                        to: wanted(newest.load).max(running + 1),
                        why,
                    });
                }
            }
            if let Some(lowest) = self.window(now_ms, scale.up_s).and_then(Iterator::min) {
                if lowest > running.saturating_mul(target) {
                    return Some(Decision {
                        from: running,
                        to: wanted(lowest).max(running + 1),
                        why: format!(
                            "{lowest} requests in flight or waiting on {} of target {target} for {} s",
                            replicas(running),
                            scale.up_s
                        ),
                    });
                }
            }
        }
        if running > scale.min {
            if let Some(highest) = self.window(now_ms, scale.down_s).and_then(Iterator::max) {
                if highest <= (running - 1).saturating_mul(target) {
                    return Some(Decision {
                        from: running,
                        to: running - 1,
                        why: format!(
                            "at most {highest} requests in flight or waiting on {} of target {target} for {} s",
                            replicas(running),
                            scale.down_s
                        ),
                    });
                }
            }
        }
        None
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} → {}: {}", self.from, self.to, self.why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fed(loads: &[(u64, u32)], keep_s: u32) -> Scaler {
        let mut scaler = Scaler::default();
        for &(at_s, load) in loads {
            scaler.observe(at_s * 1000, load, keep_s);
        }
        scaler
    }

    #[test]
    fn a_load_above_target_for_the_short_window_adds_as_many_replicas_as_its_lowest_point_needs() {
        let scale = Autoscale::new(1, 4).unwrap();
        // On 2 replicas of target 2: above the 4 they hold, below the 8 that add at once.
        let loads: Vec<(u64, u32)> = (0..=6).map(|s| (s, 5 + (s as u32 % 3))).collect();
        let decision = fed(&loads, 60).decide(scale, 2, 2, 6_000).unwrap();
        assert_eq!((decision.from, decision.to), (2, 3));
        assert_eq!(
            decision.why,
            "5 requests in flight or waiting on 2 replicas of target 2 for 6 s"
        );
    }

    #[test]
    fn a_load_twice_what_the_replicas_hold_adds_as_many_as_it_needs_at_its_first_sample() {
        let scale = Autoscale::new(1, 4).unwrap();
        let loads = [(0, 0), (1, 0), (2, 9)];
        let decision = fed(&loads, 60).decide(scale, 1, 1, 2_000).unwrap();
        assert_eq!((decision.from, decision.to), (1, 4));
        assert_eq!(
            decision.why,
            "9 requests in flight or waiting on 1 replica of target 1: 2 times what they hold"
        );
        let just_below = [(0, 0), (1, 0), (2, 3)];
        assert_eq!(fed(&just_below, 60).decide(scale, 2, 1, 2_000), None);
    }

    #[test]
    fn samples_taken_at_any_millisecond_make_a_whole_window_once_they_span_it() {
        let scale = Autoscale::new(1, 4).unwrap().with_windows(6, 60).unwrap();
        let mut scaler = Scaler::default();
        // A second apart, each a few milliseconds late, as a busy server's ticks are.
        let mut now = 0;
        for s in 0..=61u64 {
            now = s * 1000 + (s * 7) % 13;
            scaler.observe(now, 1, scale.keep_s());
        }
        let decision = scaler
            .decide(scale, 3, 1, now)
            .expect("a whole long window");
        assert_eq!((decision.from, decision.to), (3, 2));
    }

    #[test]
    fn a_burst_shorter_than_the_short_window_and_below_twice_what_runs_adds_nothing() {
        let scale = Autoscale::new(1, 4).unwrap();
        let loads = [(0, 0), (1, 0), (2, 3), (3, 3), (4, 3), (5, 3), (6, 3)];
        assert_eq!(fed(&loads, 60).decide(scale, 1, 2, 6_000), None);
    }

    #[test]
    fn no_decision_is_taken_on_less_than_a_whole_window_of_samples() {
        let scale = Autoscale::new(1, 4).unwrap();
        let loads = [(3, 3), (4, 3), (5, 3), (6, 3)];
        assert_eq!(fed(&loads, 60).decide(scale, 1, 2, 6_000), None);
    }

    #[test]
    fn a_quiet_long_window_removes_one_replica_and_one_busy_moment_in_it_removes_none() {
        let scale = Autoscale::new(1, 4).unwrap();
        let quiet: Vec<(u64, u32)> = (0..=60).map(|s| (s, 1)).collect();
        let decision = fed(&quiet, 60).decide(scale, 3, 1, 60_000).unwrap();
        assert_eq!((decision.from, decision.to), (3, 2));
        assert_eq!(
            decision.why,
            "at most 1 requests in flight or waiting on 3 replicas of target 1 for 60 s"
        );
        let mut busy = quiet.clone();
        busy[30].1 = 3;
        assert_eq!(fed(&busy, 60).decide(scale, 3, 1, 60_000), None);
    }

    #[test]
    fn below_its_least_a_model_goes_to_it_at_once_and_never_below_it_or_past_its_most() {
        let scale = Autoscale::new(2, 3).unwrap();
        assert_eq!(Scaler::default().decide(scale, 1, 1, 0).unwrap().to, 2);
        assert_eq!(Scaler::default().decide(scale, 5, 1, 0).unwrap().to, 3);
        let idle: Vec<(u64, u32)> = (0..=60).map(|s| (s, 0)).collect();
        assert_eq!(fed(&idle, 60).decide(scale, 2, 1, 60_000), None);
        let flood: Vec<(u64, u32)> = (0..=60).map(|s| (s, 100)).collect();
        assert_eq!(fed(&flood, 60).decide(scale, 3, 1, 60_000), None);
    }

    #[test]
    fn with_a_min_of_0_an_idle_model_runs_none_its_first_waiting_request_starts_one_at_once_and_a_long_window_with_none_stops_the_last(
    ) {
        let scale = Autoscale::new(0, 2).unwrap().with_windows(2, 10).unwrap();
        let idle: Vec<(u64, u32)> = (0..=20).map(|s| (s, 0)).collect();
        assert_eq!(fed(&idle, 10).decide(scale, 0, 1, 20_000), None);
        let asked = fed(&[(0, 0), (1, 1)], 10)
            .decide(scale, 0, 1, 1_000)
            .unwrap();
        assert_eq!((asked.from, asked.to), (0, 1));
        assert_eq!(asked.why, "1 request waiting with no replica running");
        let three = fed(&[(0, 3)], 10).decide(scale, 0, 1, 0).unwrap();
        assert_eq!(three.to, 2, "as many as they need, up to its most");
        let quiet = fed(&idle, 10).decide(scale, 1, 1, 20_000).unwrap();
        assert_eq!((quiet.from, quiet.to), (1, 0));
        assert_eq!(
            quiet.why,
            "at most 0 requests in flight or waiting on 1 replica of target 1 for 10 s"
        );
    }

    #[test]
    fn after_a_step_down_the_long_window_goes_on_and_the_next_sample_removes_another_where_the_load_fits_and_after_a_step_up_the_windows_start_again(
    ) {
        let scale = Autoscale::new(1, 3).unwrap().with_windows(2, 10).unwrap();
        let quiet: Vec<(u64, u32)> = (0..=10).map(|s| (s, 1)).collect();
        let mut scaler = fed(&quiet, 10);
        let first = scaler.decide(scale, 3, 1, 10_000).unwrap();
        assert_eq!((first.from, first.to), (3, 2));
        scaler.carried_out(3, 2);
        scaler.observe(11_000, 1, 10);
        let second = scaler.decide(scale, 2, 1, 11_000).unwrap();
        assert_eq!(
            (second.from, second.to),
            (2, 1),
            "a load of 1 fits in one replica"
        );

        // A load of 2 fits in two, not in one: the step down to two stays, and no further.
        let mut busier = fed(&(0..=10).map(|s| (s, 2)).collect::<Vec<_>>(), 10);
        assert_eq!(busier.decide(scale, 3, 1, 10_000).unwrap().to, 2);
        busier.carried_out(3, 2);
        busier.observe(11_000, 2, 10);
        assert_eq!(busier.decide(scale, 2, 1, 11_000), None);

        let mut up = fed(&[(0, 5)], 10);
        assert_eq!(up.decide(scale, 1, 1, 0).unwrap().to, 3);
        up.carried_out(1, 3);
        up.observe(1_000, 0, 10);
        assert_eq!(
            up.decide(scale, 3, 1, 1_000),
            None,
            "no whole window since the step up"
        );
    }

    #[test]
    fn a_model_is_idle_since_its_last_sample_with_a_load_and_not_while_its_newest_has_one() {
        assert_eq!(Scaler::default().idle_for(5_000), None);
        assert_eq!(
            fed(&[(0, 2), (1, 0), (2, 0)], 60).idle_for(3_000),
            Some(3_000)
        );
        assert_eq!(
            fed(&[(0, 0), (1, 3), (2, 0), (3, 0)], 60).idle_for(4_000),
            Some(3_000)
        );
        assert_eq!(fed(&[(0, 0), (1, 1)], 60).idle_for(2_000), None);
    }

    #[test]
    fn replicas_are_refused_with_what_to_fix() {
        assert_eq!(Autoscale::new(0, 0), Err(AutoscaleError::NoMax));
        assert_eq!(Autoscale::new(0, 2).unwrap().min(), 0);
        assert_eq!(
            Autoscale::new(3, 2).unwrap_err().to_string(),
            "replicas.min (3) is above replicas.max (2): make max at least min"
        );
        assert!(Autoscale::new(1, 65).is_err());
        assert!(Autoscale::new(1, 2).unwrap().with_windows(1, 60).is_err());
        let parsed: Result<Autoscale, _> = serde_json::from_str(r#"{"max": 4}"#);
        assert_eq!(parsed.unwrap(), Autoscale::new(1, 4).unwrap());
        let unknown: Result<Autoscale, _> = serde_json::from_str(r#"{"max": 4, "maxi": 5}"#);
        assert!(unknown.is_err());
        assert_eq!(
            Autoscale::new(1, 3).unwrap().within(2).unwrap_err().to_string(),
            "replicas.max (3) is more than the 2 GPU(s) of its group: each replica runs on a GPU of its own; choose more GPUs, or lower max"
        );
    }

    #[test]
    fn replicas_typed_in_the_wizard_are_none_until_a_most_is_typed_and_the_fewest_is_one_unless_typed(
    ) {
        assert_eq!(Autoscale::typed("", "", 3), Ok(None));
        assert_eq!(
            Autoscale::typed("", "2", 3),
            Ok(Some(Autoscale::new(1, 2).unwrap()))
        );
        assert_eq!(
            Autoscale::typed(" 2 ", "3", 3),
            Ok(Some(Autoscale::new(2, 3).unwrap()))
        );
        assert_eq!(
            Autoscale::typed("", "two", 3).unwrap_err().to_string(),
            "Most replicas: type a whole number"
        );
        assert!(matches!(
            Autoscale::typed("1", "4", 3),
            Err(AutoscaleError::MoreThanGpus { max: 4, gpus: 3 })
        ));
    }

    #[test]
    fn an_on_demand_model_takes_no_replicas() {
        let on_demand = crate::Demand::OnDemand {
            keep_alive: crate::KeepAlive::DEFAULT,
        };
        let some = Some(Autoscale::new(1, 2).unwrap());
        assert_eq!(
            Autoscale::check_demand(some, on_demand),
            Err(AutoscaleError::OnDemand)
        );
        assert_eq!(Autoscale::check_demand(some, crate::Demand::Pinned), Ok(()));
        assert_eq!(Autoscale::check_demand(None, on_demand), Ok(()));
    }

    proptest! {
        /// Against the rule written out: a decision stays within min and max, adds only after a whole
        /// short window above what the replicas hold or at a load twice that, and removes only one, after
        /// a whole long window within what one fewer holds.
        #[test]
        fn a_decision_keeps_within_its_bounds_and_follows_only_a_whole_window(
            min in 0u32..4, extra in 0u32..5, running in 0u32..10, target in 1u32..4,
            loads in proptest::collection::vec(0u32..20, 0..90),
        ) {
            let scale = Autoscale::new(min, (min + extra).max(1)).unwrap().with_windows(5, 20).unwrap();
            let mut scaler = Scaler::default();
            let now = loads.len() as u64 * 1000;
            for (i, &load) in loads.iter().enumerate() {
                scaler.observe((i as u64 + 1) * 1000, load, 20);
            }
            // Samples at 1..=n s, decided at n s: a window of w s holds the last w + 1 samples, and is
            // whole where a sample is at least w s old.
            let n = loads.len();
            let within = |w: usize| (n > w).then(|| &loads[n - w - 1..]);
            match scaler.decide(scale, running, target, now) {
                None => {
                    prop_assert!(running >= scale.min() && running <= scale.max());
                    // And none was owed: a whole window above (or within one fewer) asks for a step.
                    if running < scale.max() {
                        if let Some(window) = within(5) {
                            prop_assert!(!window.iter().all(|&l| l > running * target));
                        }
                        prop_assert!(loads.last().is_none_or(|&l| l <= running * target || l < running * target * PANIC_TIMES));
                    }
                    if running > scale.min() {
                        if let Some(window) = within(20) {
                            prop_assert!(!window.iter().all(|&l| l <= (running - 1) * target));
                        }
                    }
                }
                Some(d) => {
                    prop_assert!(d.to >= scale.min() && d.to <= scale.max());
                    prop_assert_ne!(d.to, d.from);
                    if running >= scale.min() && running <= scale.max() {
                        if d.to > d.from {
                            let panic = loads.last().is_some_and(|&l| l > running * target && l >= running * target * PANIC_TIMES);
                            let window = within(5).is_some_and(|w| w.iter().all(|&l| l > running * target));
                            prop_assert!(panic || window);
                        } else {
                            prop_assert_eq!(d.to, d.from - 1);
                            let window = within(20).expect("a whole long window");
                            prop_assert!(window.iter().all(|&l| l <= (running - 1) * target));
                        }
                    }
                }
            }
        }
    }
}
