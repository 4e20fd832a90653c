//! Pinned and on-demand models (seed 002's hybrid): a pinned model is always loaded; an on-demand one is
//! loaded when a request asks for it and unloaded after its keep-alive with no request. When one must load
//! and its GPUs lack the room, the least recently used idle on-demand models there make way first; a model
//! with requests in flight, or waiting for it, is never unloaded.

use crate::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// How long an on-demand model stays loaded with no request, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "u32", into = "u32")]
pub struct KeepAlive(u32);

impl KeepAlive {
    /// Five minutes, as most engines that unload on their own default to.
    pub const DEFAULT: KeepAlive = KeepAlive(300);
    /// The shortest: a model that unloads sooner would spend its life loading.
    pub const MIN_S: u32 = 10;
    /// The longest, a week: past that, pin the model.
    pub const MAX_S: u32 = 7 * 24 * 3600;

    /// A keep-alive of `seconds`, refused outside [`KeepAlive::MIN_S`]..=[`KeepAlive::MAX_S`].
    pub fn from_secs(seconds: u32) -> Result<KeepAlive, KeepAliveError> {
        if (KeepAlive::MIN_S..=KeepAlive::MAX_S).contains(&seconds) {
            Ok(KeepAlive(seconds))
        } else {
            Err(KeepAliveError(seconds))
        }
    }

    /// A keep-alive as typed in a form, in seconds.
    pub fn parse(text: &str) -> Result<KeepAlive, KeepAliveError> {
        text.trim()
            .parse::<u32>()
            .map_err(|_| KeepAliveError(u32::MAX))
            .and_then(KeepAlive::from_secs)
    }

    /// Its length in seconds.
    pub const fn secs(self) -> u32 {
        self.0
    }

    /// Its length in milliseconds.
    pub const fn millis(self) -> u64 {
        self.0 as u64 * 1000
    }
}

impl Default for KeepAlive {
    fn default() -> KeepAlive {
        KeepAlive::DEFAULT
    }
}

impl TryFrom<u32> for KeepAlive {
    type Error = KeepAliveError;
    fn try_from(seconds: u32) -> Result<KeepAlive, KeepAliveError> {
        KeepAlive::from_secs(seconds)
    }
}

impl From<KeepAlive> for u32 {
    fn from(k: KeepAlive) -> u32 {
        k.0
    }
}

impl fmt::Display for KeepAlive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} s", self.0)
    }
}

/// A keep-alive out of bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "a keep-alive is a whole number of seconds from {} to {} (a week)",
    KeepAlive::MIN_S,
    KeepAlive::MAX_S
)]
pub struct KeepAliveError(u32);

/// Whether a member of a group is always loaded or loaded when asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Demand {
    /// Always loaded (the default).
    #[default]
    Pinned,
    /// Loaded by a request, unloaded after `keep_alive` with none.
    OnDemand {
        /// How long it stays loaded with no request.
        keep_alive: KeepAlive,
    },
}

impl Demand {
    /// Whether it is loaded only when asked for.
    pub fn is_on_demand(self) -> bool {
        matches!(self, Demand::OnDemand { .. })
    }

    /// Its keep-alive, for an on-demand model.
    pub fn keep_alive(self) -> Option<KeepAlive> {
        match self {
            Demand::Pinned => None,
            Demand::OnDemand { keep_alive } => Some(keep_alive),
        }
    }
}

/// A loaded on-demand model, as eviction and the keep-alive see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    /// The model.
    pub name: String,
    /// When a request last began or ended for it (ms since the epoch); its load counts as a use.
    pub last_used_ms: u64,
    /// A request is in flight to it, or waits for it.
    pub busy: bool,
    /// Its engine sleeps.
    pub asleep: bool,
    /// How long it stays loaded with no request.
    pub keep_alive: KeepAlive,
}

/// The loaded on-demand models that may make way, in the order they do: idle ones only, the awake before
/// the asleep, each least recently used first, ties by name. A sleeper makes way last: stopped, it frees
/// only the little it keeps asleep, and its next request becomes a cold start; an awake one frees its
/// share (by its own sleep, where it can).
pub fn eviction_order(loaded: &[Loaded]) -> Vec<&str> {
    let mut idle: Vec<&Loaded> = loaded.iter().filter(|l| !l.busy).collect();
    idle.sort_by(|a, b| {
        (a.asleep, a.last_used_ms, &a.name).cmp(&(b.asleep, b.last_used_ms, &b.name))
    });
    idle.into_iter().map(|l| l.name.as_str()).collect()
}

/// What the keep-alives make of a loaded on-demand model now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// It stays as it is.
    Stays,
    /// Awake, idle past its keep-alive, and its engine can sleep: put to sleep.
    Sleeps,
    /// Idle past its keep-alive and its engine cannot sleep, or asleep past `keep_asleep`: unloaded.
    Unloads,
}

/// What becomes of `loaded` at `now_ms`: awake (`asleep_since_ms` none) and idle past its keep-alive, it
/// sleeps where its engine can (`sleeps`), else it unloads; asleep since `asleep_since_ms`, it unloads
/// once `keep_asleep_ms` have passed with no request waiting for it.
pub fn tier(
    loaded: &Loaded,
    sleeps: bool,
    asleep_since_ms: Option<u64>,
    keep_asleep_ms: u64,
    now_ms: u64,
) -> Tier {
    if loaded.busy {
        return Tier::Stays;
    }
    match asleep_since_ms {
        Some(since) if now_ms.saturating_sub(since) >= keep_asleep_ms => Tier::Unloads,
        Some(_) => Tier::Stays,
        None if now_ms.saturating_sub(loaded.last_used_ms) < loaded.keep_alive.millis() => {
            Tier::Stays
        }
        None if sleeps => Tier::Sleeps,
        None => Tier::Unloads,
    }
}

/// A model asleep on a machine, as the host memory budget for sleepers sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sleeper {
    /// The model.
    pub name: String,
    /// When a request last began or ended for it (ms since the epoch).
    pub last_used_ms: u64,
    /// What it keeps in the machine's memory asleep (its weights).
    pub host: Bytes,
}

/// Which of `sleepers` (on one machine) are stopped, least recently used first, so that one more keeping
/// `wanted` of the machine's memory asleep stays within `budget`: the fewest; `None` where even all of
/// them stopped leaves too little.
pub fn make_host_room(sleepers: &[Sleeper], wanted: Bytes, budget: Bytes) -> Option<Vec<&str>> {
    if wanted > budget {
        return None;
    }
    let mut order: Vec<&Sleeper> = sleepers.iter().collect();
    order.sort_by(|a, b| (a.last_used_ms, &a.name).cmp(&(b.last_used_ms, &b.name)));
    let mut used: Bytes = sleepers.iter().map(|s| s.host).sum();
    let mut stopped = Vec::new();
    for sleeper in order {
        if used + wanted <= budget {
            break;
        }
        used = used.saturating_sub(sleeper.host);
        stopped.push(sleeper.name.as_str());
    }
    (used + wanted <= budget).then_some(stopped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn loaded(name: &str, last_used_ms: u64, busy: bool) -> Loaded {
        Loaded {
            name: name.into(),
            last_used_ms,
            busy,
            asleep: false,
            keep_alive: KeepAlive::from_secs(60).unwrap(),
        }
    }

    #[test]
    fn a_sleeper_past_the_host_budget_stops_the_least_recently_used_sleepers_and_no_more() {
        let gb = Bytes::gb;
        let sleeper = |name: &str, last_used_ms, host| Sleeper {
            name: name.into(),
            last_used_ms,
            host: gb(host),
        };
        let asleep = [
            sleeper("vision", 2_000, 30),
            sleeper("glm", 1_000, 30),
            sleeper("speech", 3_000, 10),
        ];
        // 70 of 100 GB used: 30 more fit as they are; 50 once glm, the least recently used, stops.
        assert_eq!(make_host_room(&asleep, gb(30), gb(100)), Some(vec![]));
        assert_eq!(make_host_room(&asleep, gb(50), gb(100)), Some(vec!["glm"]));
        assert_eq!(
            make_host_room(&asleep, gb(95), gb(100)),
            Some(vec!["glm", "vision", "speech"])
        );
        assert_eq!(make_host_room(&asleep, gb(101), gb(100)), None);
    }

    #[test]
    fn an_idle_model_sleeps_past_its_keep_alive_where_it_can_and_unloads_past_the_second_one() {
        let idle = loaded("vision", 1_000, false);
        // Keep-alive 60 s, asleep for at most 600 s.
        let at = |now, sleeps, since| tier(&idle, sleeps, since, 600_000, now);
        assert_eq!(at(60_999, true, None), Tier::Stays);
        assert_eq!(at(61_000, true, None), Tier::Sleeps);
        assert_eq!(at(61_000, false, None), Tier::Unloads);
        assert_eq!(at(660_999, true, Some(61_000)), Tier::Stays);
        assert_eq!(at(661_000, true, Some(61_000)), Tier::Unloads);
        // A request waiting for it (a wake under way) keeps it as it is.
        let waited_for = loaded("vision", 1_000, true);
        assert_eq!(tier(&waited_for, true, Some(0), 0, 10_000_000), Tier::Stays);
        assert_eq!(tier(&waited_for, true, None, 0, 10_000_000), Tier::Stays);
    }

    #[test]
    fn the_least_recently_used_idle_model_makes_way_first_and_a_busy_one_never() {
        let models = [
            loaded("speech", 3_000, false),
            loaded("vision", 1_000, true),
            loaded("rerank", 2_000, false),
            loaded("embed", 2_000, false),
        ];
        assert_eq!(eviction_order(&models), ["embed", "rerank", "speech"]);
    }

    #[test]
    fn a_sleeper_makes_way_after_every_idle_awake_model_however_long_it_slept() {
        let asleep = |name, used| Loaded {
            asleep: true,
            ..loaded(name, used, false)
        };
        let models = [
            asleep("glm", 1_000),
            loaded("speech", 3_000, false),
            asleep("vision", 500),
            loaded("rerank", 2_000, false),
        ];
        assert_eq!(
            eviction_order(&models),
            ["rerank", "speech", "vision", "glm"]
        );
    }

    #[test]
    fn a_keep_alive_runs_out_only_for_an_idle_model_unused_that_long() {
        let models = [
            loaded("a", 0, false),
            loaded("b", 0, true),
            loaded("c", 30_000, false),
        ];
        let out = |now| -> Vec<&str> {
            models
                .iter()
                .filter(|l| tier(l, false, None, 0, now) == Tier::Unloads)
                .map(|l| l.name.as_str())
                .collect()
        };
        assert_eq!(out(59_999), Vec::<&str>::new());
        assert_eq!(out(60_000), ["a"]);
        assert_eq!(out(90_000), ["a", "c"]);
    }

    #[test]
    fn a_keep_alive_out_of_bounds_says_what_to_enter() {
        assert_eq!(KeepAlive::parse(" 120 ").unwrap().secs(), 120);
        for text in ["5", "-1", "soon", "604801"] {
            assert_eq!(
                KeepAlive::parse(text).unwrap_err().to_string(),
                "a keep-alive is a whole number of seconds from 10 to 604800 (a week)"
            );
        }
        assert!(serde_json::from_str::<KeepAlive>("3").is_err());
    }

    #[test]
    fn a_demand_reads_and_writes_as_the_api_sends_it() {
        let on = Demand::OnDemand {
            keep_alive: KeepAlive::from_secs(120).unwrap(),
        };
        let json = serde_json::to_value(on).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"mode": "on_demand", "keep_alive": 120})
        );
        assert_eq!(serde_json::from_value::<Demand>(json).unwrap(), on);
        assert_eq!(
            serde_json::from_value::<Demand>(serde_json::json!({"mode": "pinned"})).unwrap(),
            Demand::Pinned
        );
    }

    proptest! {
        /// Against the plain definition: the order is a permutation of the idle models, no sleeper before
        /// an awake one, and within each, each used no later than the next.
        #[test]
        fn eviction_takes_every_idle_model_oldest_first(
            models in proptest::collection::vec((0u64..50, any::<bool>(), any::<bool>()), 0..12)
        ) {
            let models: Vec<Loaded> = models
                .iter()
                .enumerate()
                .map(|(i, &(used, busy, asleep))| Loaded {
                    asleep,
                    ..loaded(&format!("m{i:02}"), used, busy)
                })
                .collect();
            let order = eviction_order(&models);
            let idle = models.iter().filter(|m| !m.busy).count();
            prop_assert_eq!(order.len(), idle);
            let used = |name: &str| models.iter().find(|m| m.name == name).unwrap();
            for name in &order {
                prop_assert!(!used(name).busy);
            }
            for pair in order.windows(2) {
                let (a, b) = (used(pair[0]), used(pair[1]));
                prop_assert!(
                    (a.asleep, a.last_used_ms, &a.name) < (b.asleep, b.last_used_ms, &b.name)
                );
            }
        }
    }
}
