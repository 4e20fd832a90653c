//! Requests whose prompts begin alike go to the same engine of a model, so that the engine's prompt cache
//! (llama.cpp's slots, vLLM's and SGLang's prefix caches) holds what they share: a long system prompt is
//! read once per engine, not once per request. The prompt's first characters are hashed; the engines are
//! ranked for that hash by rendezvous hashing (each engine's score is a hash of the prefix's hash and the
//! engine's name), which moves only the prefixes of an engine that comes or goes. A ranked engine is
//! passed over once it has no free slot and is busier than the least busy engine allows, or once it has
//! answered a quarter more requests of late than the least busy (bounds on load, as consistent hashing
//! with bounded loads has): a request never waits on a full engine's cache while another is idle, one
//! popular prefix (or a few that hash alike) spreads out to their next choices instead of queueing on one
//! engine, and an engine with a slot free and no more than its part of the traffic keeps its prefixes (a
//! request sent elsewhere would read its whole prompt again, and push out another's there). A prefix moved
//! off an engine over the bound on requests of late stays where it went (its home), taking its requests of
//! late along, so that the engine it left sheds only as many prefixes as bring it back within the bound
//! and none of them returns to find its cache gone; a request sent past a full home for a free slot
//! leaves the prefix's home as it was.

use serde::Deserialize;
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

/// The leading characters of a prompt that choose its engine: within a system prompt or a few-shot
/// preamble, so that requests that share one go together whatever their users then ask.
pub(super) const PREFIX_CHARS: usize = 256;

/// How much busier than the model's least busy engine an engine may be and still take a request for its
/// prefixes: a quarter more requests in flight once its slots are full (and then never one more where the
/// least busy is idle), and a quarter more requests of late.
const LOAD_BOUND_PERCENT: usize = 125;

/// How long a request counts toward its engine's requests of late: each counts `e^(-age / τ)`, τ this many
/// ms.
const RECENT_TAU_MS: f64 = 60_000.0;

/// The requests of late an engine may have answered past a quarter more than the least busy of its
/// model's and still take its prefixes: at a trickle, no prefix moves.
const RECENT_SLACK: f64 = 8.0;

/// Each engine's requests of late, decaying: what keeps an engine's part of a model's traffic within a
/// quarter of the least busy's when a few prefixes hash alike onto it; and each prefix's engine, where it
/// went last, with its own requests of late.
#[derive(Debug, Default)]
pub(super) struct Recent {
    /// By unit: when it last took a request (ms), and its count then.
    by_unit: HashMap<String, (u64, f64)>,
    /// By prefix key: its engine, when it last took one of its requests (ms), and its count then.
    by_prefix: HashMap<u64, (String, u64, f64)>,
}

/// The most engines kept; past it, those whose count has decayed to nothing are forgotten.
const RECENT_KEPT: usize = 4096;

impl Recent {
    /// `unit`'s requests of late at `now_ms`.
    pub(super) fn of(&self, unit: &str, now_ms: u64) -> f64 {
        self.by_unit
            .get(unit)
            .map_or(0.0, |&(at, count)| decayed(count, at, now_ms))
    }

    /// Counts a request sent to `unit` at `now_ms`.
    pub(super) fn count(&mut self, unit: &str, now_ms: u64) {
        if self.by_unit.len() >= RECENT_KEPT && !self.by_unit.contains_key(unit) {
            self.by_unit
                .retain(|_, &mut (at, count)| decayed(count, at, now_ms) >= 0.01);
        }
        // The name is copied once, at the engine's first request.
        match self.by_unit.get_mut(unit) {
            Some(entry) => *entry = (now_ms, decayed(entry.1, entry.0, now_ms) + 1.0),
            None => {
                self.by_unit.insert(unit.to_owned(), (now_ms, 1.0));
            }
        }
    }
}

impl Recent {
    /// The engine `key`'s prefix went to last, at home.
    pub(super) fn placed(&self, key: u64) -> Option<&str> {
        self.by_prefix.get(&key).map(|(unit, _, _)| unit.as_str())
    }

    /// A request of `key` went to `unit`, its prefix's home now, at `now_ms`. A prefix that moves takes its
    /// requests of late along: the engine it left is that much less busy at once, and the one it joins
    /// that much busier, so that one engine over the bound sheds only as many prefixes as bring it back
    /// within it, not every one that comes while its own count decays.
    pub(super) fn settle(&mut self, key: u64, unit: &str, now_ms: u64) {
        if self.by_prefix.len() >= RECENT_KEPT && !self.by_prefix.contains_key(&key) {
            self.by_prefix
                .retain(|_, (_, at, count)| decayed(*count, *at, now_ms) >= 0.01);
        }
        let (count, left) = match self.by_prefix.get(&key) {
            Some((was, at, count)) => {
                let count = decayed(*count, *at, now_ms);
                (count, (was != unit).then(|| was.clone()))
            }
            None => (0.0, None),
        };
        if let Some(left) = left {
            if let Some(entry) = self.by_unit.get_mut(&left) {
                *entry = (now_ms, (decayed(entry.1, entry.0, now_ms) - count).max(0.0));
            }
            if let Some(entry) = self.by_unit.get_mut(unit) {
                *entry = (now_ms, decayed(entry.1, entry.0, now_ms) + count);
            }
        }
        self.by_prefix
            .insert(key, (unit.to_owned(), now_ms, count + 1.0));
    }
}

fn decayed(count: f64, at_ms: u64, now_ms: u64) -> f64 {
    count * (-(now_ms.saturating_sub(at_ms) as f64) / RECENT_TAU_MS).exp()
}

/// The requests in flight below which an engine of `slots` takes the prefixes it ranks first, where the
/// least busy of the model's engines has `least`: while it has a slot free, and past that while it has at
/// most a quarter more than the least busy (and never one more where the least busy is idle).
fn bound(least: usize, slots: usize) -> usize {
    (least + 1 + least * (LOAD_BOUND_PERCENT - 100) / 100).max(slots)
}

/// The parts of an OpenAI request that begin its prompt: chat messages, or a completion's prompt.
#[derive(Deserialize)]
struct Prompt<'a> {
    #[serde(default, borrow)]
    messages: Option<Vec<Message<'a>>>,
    #[serde(default, borrow)]
    prompt: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(default, borrow)]
    role: Option<&'a RawValue>,
    #[serde(default, borrow)]
    content: Option<&'a RawValue>,
}

/// The hash of the first [`PREFIX_CHARS`] characters of `body`'s prompt (its messages' roles and contents
/// as written, in order; or its `prompt`), `None` where it has none (an embedding, a transcription, a body
/// that is not JSON): such a request goes to the least busy engine.
pub(super) fn prefix_key(body: &[u8]) -> Option<u64> {
    let prompt: Prompt = serde_json::from_slice(body).ok()?;
    let mut text = String::new();
    match (&prompt.messages, prompt.prompt) {
        (Some(messages), _) if !messages.is_empty() => {
            // Enough bytes for the characters hashed, however wide: the rest of a long conversation
            // (or an image's base64) is not copied.
            let parts = messages.iter().flat_map(|m| [m.role, m.content]).flatten();
            for part in parts {
                text.push_str(part.get());
                if text.len() >= PREFIX_CHARS * 4 {
                    break;
                }
            }
        }
        (_, Some(prompt)) => text.push_str(prompt.get()),
        _ => return None,
    }
    let end = text
        .char_indices()
        .nth(PREFIX_CHARS)
        .map_or(text.len(), |(at, _)| at);
    let mut hasher = DefaultHasher::new();
    text[..end].hash(&mut hasher);
    Some(hasher.finish())
}

/// `engines` by rendezvous rank for `key`: each scored by a hash of the key and its name.
fn ranked(key: u64, engines: &[(&str, usize, f64)]) -> Vec<usize> {
    let score = |name: &str| {
        let mut hasher = DefaultHasher::new();
        (key, name).hash(&mut hasher);
        hasher.finish()
    };
    let mut ranked: Vec<usize> = (0..engines.len()).collect();
    ranked.sort_by_key(|&i| std::cmp::Reverse(score(engines[i].0)));
    ranked
}

/// The order in which a request for `key` tries `engines` (each its name, requests in flight now and
/// requests of late), each of `slots` slots, its prefix last at `placed`: its home first (where it went
/// last, or its first choice, within the bound on requests of late) while that has a slot free or is not
/// too busy, then the others within both bounds by rendezvous rank, then the rest by how busy they are;
/// and its home, to settle there.
pub(super) fn order(
    key: u64,
    engines: &[(&str, usize, f64)],
    slots: usize,
    placed: Option<&str>,
) -> (Vec<usize>, Option<usize>) {
    let least = engines.iter().map(|e| e.1).min().unwrap_or(0);
    let bound = bound(least, slots);
    let least_recent = engines.iter().map(|e| e.2).fold(f64::INFINITY, f64::min);
    let recent_bound = least_recent * LOAD_BOUND_PERCENT as f64 / 100.0 + RECENT_SLACK;
    let mut ranked = ranked(key, engines);
    // Its home: where it went last while that has answered no more than a quarter more than the least
    // busy of late, else the first by rank that has.
    let within = |i: usize| engines[i].2 <= recent_bound;
    let home = placed
        .and_then(|p| engines.iter().position(|e| e.0 == p))
        .filter(|&i| within(i))
        .or_else(|| ranked.iter().copied().find(|&i| within(i)));
    // Stable: among those over a bound, the least busy first, rank deciding between equals.
    ranked.sort_by_key(|&i| {
        let (_, busy, recent) = engines[i];
        if busy < bound && Some(i) == home {
            0
        } else if busy < bound && recent <= recent_bound {
            1
        } else {
            busy + 2
        }
    });
    (ranked, home)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    /// The order for a prefix not placed yet.
    fn first_order(key: u64, engines: &[(&str, usize, f64)], slots: usize) -> Vec<usize> {
        order(key, engines, slots, None).0
    }

    fn chat(system: &str, user: &str) -> Vec<u8> {
        json!({"model": "m", "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": user},
        ]})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn requests_that_share_a_long_system_prompt_have_one_key_and_other_prompts_another() {
        let manual = "You answer questions about the fleet manual. ".repeat(10);
        let a = prefix_key(&chat(&manual, "How do I drain a node?")).unwrap();
        let b = prefix_key(&chat(&manual, "What is MIG?")).unwrap();
        assert_eq!(a, b);
        let other = prefix_key(&chat("You translate into French.", "What is MIG?")).unwrap();
        assert_ne!(a, other);
        let completion = json!({"model": "m", "prompt": "Once upon a time"}).to_string();
        assert!(prefix_key(completion.as_bytes()).is_some());
    }

    #[test]
    fn a_request_without_a_prompt_has_no_key_and_goes_to_the_least_busy_engine() {
        let embedding = json!({"model": "m", "input": "a sentence"}).to_string();
        assert_eq!(prefix_key(embedding.as_bytes()), None);
        assert_eq!(prefix_key(b"not json"), None);
        assert_eq!(prefix_key(br#"{"model": "m", "messages": []}"#), None);
    }

    #[test]
    fn a_busy_engine_keeps_its_prefixes_until_it_is_a_quarter_busier_than_the_least_busy() {
        let key = (0..u64::MAX)
            .find(|&k| first_order(k, &[("a", 0, 0.0), ("b", 0, 0.0)], 1)[0] == 0)
            .unwrap();
        assert_eq!(
            first_order(key, &[("a", 1, 0.0), ("b", 0, 0.0)], 1)[0],
            1,
            "never past an idle engine"
        );
        assert_eq!(first_order(key, &[("a", 4, 0.0), ("b", 4, 0.0)], 1)[0], 0);
        assert_eq!(
            first_order(key, &[("a", 5, 0.0), ("b", 4, 0.0)], 1)[0],
            0,
            "5 < 4 + 1 + 1"
        );
        assert_eq!(first_order(key, &[("a", 6, 0.0), ("b", 4, 0.0)], 1)[0], 1);
    }

    #[test]
    fn an_engine_with_a_slot_free_keeps_its_prefixes_and_one_with_none_is_passed_over_for_an_idle_one(
    ) {
        let key = (0..u64::MAX)
            .find(|&k| first_order(k, &[("a", 0, 0.0), ("b", 0, 0.0)], 2)[0] == 0)
            .unwrap();
        assert_eq!(
            first_order(key, &[("a", 1, 0.0), ("b", 0, 0.0)], 2)[0],
            0,
            "a has a slot free"
        );
        assert_eq!(
            first_order(key, &[("a", 2, 0.0), ("b", 0, 0.0)], 2)[0],
            1,
            "a is full, b idle"
        );
        assert_eq!(first_order(key, &[("a", 7, 0.0), ("b", 6, 0.0)], 8)[0], 0);
        assert_eq!(
            first_order(key, &[("a", 8, 0.0), ("b", 6, 0.0)], 8)[0],
            1,
            "full, and past 6 + 1 + a quarter of 6"
        );
        assert_eq!(
            first_order(key, &[("a", 10, 0.0), ("b", 9, 0.0)], 8)[0],
            0,
            "10 < 9 + 1 + 2"
        );
    }

    #[test]
    fn a_prefix_whose_engine_answered_a_quarter_more_than_the_least_busy_of_late_goes_to_its_next_choice(
    ) {
        let key = (0..u64::MAX)
            .find(|&k| {
                first_order(k, &[("a", 0, 0.0), ("b", 0, 0.0), ("c", 0, 0.0)], 1)[..2] == [0, 1]
            })
            .unwrap();
        let late = |a: f64, b: f64, c: f64| {
            first_order(key, &[("a", 0, a), ("b", 0, b), ("c", 0, c)], 1)[0]
        };
        assert_eq!(late(50.0, 40.0, 40.0), 0, "50 <= 40 + a quarter + 8");
        assert_eq!(
            late(59.0, 40.0, 40.0),
            1,
            "past it: the next choice, not the least busy"
        );
        assert_eq!(late(9.0, 0.0, 0.0), 1, "at a trickle, 8 requests of slack");
        assert_eq!(late(8.0, 0.0, 0.0), 0);
    }

    #[test]
    fn a_prefix_moved_off_a_busy_engine_stays_on_its_new_one_and_takes_its_requests_of_late_along()
    {
        let engines = |recent: &Recent| {
            ["a", "b"]
                .iter()
                .map(|&u| (u, 0, recent.of(u, 0)))
                .collect::<Vec<_>>()
        };
        // Two prefixes whose first choice is a.
        let on_a: Vec<u64> = (0..u64::MAX)
            .filter(|&k| first_order(k, &[("a", 0, 0.0), ("b", 0, 0.0)], 1)[0] == 0)
            .take(2)
            .collect();
        let mut recent = Recent::default();
        for key in &on_a {
            for _ in 0..20 {
                recent.count("a", 0);
                recent.settle(*key, "a", 0);
            }
        }
        // a answered 40, b none: past 0 + a quarter + 8, the first prefix goes to b.
        let (tried, home) = order(on_a[0], &engines(&recent), 1, recent.placed(on_a[0]));
        assert_eq!((tried[0], home), (1, Some(1)));
        recent.count("b", 0);
        recent.settle(on_a[0], "b", 0);
        assert_eq!(recent.placed(on_a[0]), Some("b"));
        assert!(
            (recent.of("a", 0) - 20.0).abs() < 0.01,
            "{}",
            recent.of("a", 0)
        );
        assert!(
            (recent.of("b", 0) - 21.0).abs() < 0.01,
            "{}",
            recent.of("b", 0)
        );
        // a is within the bound again: the other prefix stays on a, and the moved one stays on b.
        let (tried, _) = order(on_a[1], &engines(&recent), 1, recent.placed(on_a[1]));
        assert_eq!(tried[0], 0);
        let (tried, _) = order(on_a[0], &engines(&recent), 1, recent.placed(on_a[0]));
        assert_eq!(tried[0], 1, "it does not go back to a");
    }

    #[test]
    fn an_engine_s_requests_of_late_decay_with_a_minute_s_time_constant() {
        let mut recent = Recent::default();
        for at in 0..10 {
            recent.count("a", at);
        }
        assert!((recent.of("a", 10) - 10.0).abs() < 0.01);
        let later = recent.of("a", 60_010);
        assert!((later - 10.0 / std::f64::consts::E).abs() < 0.01, "{later}");
        assert_eq!(recent.of("b", 10), 0.0);
    }

    #[test]
    fn an_engine_that_comes_or_goes_moves_only_its_own_prefixes() {
        let four = [("a", 0, 0.0), ("b", 0, 0.0), ("c", 0, 0.0), ("d", 0, 0.0)];
        let three = [("a", 0, 0.0), ("b", 0, 0.0), ("d", 0, 0.0)];
        for key in 0..2_000u64 {
            let before = four[first_order(key, &four, 1)[0]].0;
            let after = three[first_order(key, &three, 1)[0]].0;
            if before != "c" {
                assert_eq!(before, after, "key {key}");
            }
        }
    }

    proptest! {
        /// Whatever the loads, the engine chosen has a slot free or is within a quarter (and one request)
        /// of the least busy; with one slot, where the least busy is idle, it is idle too.
        #[test]
        fn the_engine_chosen_is_never_much_busier_than_the_least_busy(
            key in any::<u64>(),
            loads in proptest::collection::vec(0usize..40, 1..8),
            recent in proptest::collection::vec(0.0f64..200.0, 8),
            slots in 1usize..10,
        ) {
            let names: Vec<String> = (0..loads.len()).map(|i| format!("engine-{i}")).collect();
            let engines: Vec<(&str, usize, f64)> = names
                .iter()
                .zip(loads.iter().zip(&recent))
                .map(|(n, (&busy, &recent))| (n.as_str(), busy, recent))
                .collect();
            let order = first_order(key, &engines, slots);
            prop_assert_eq!(order.len(), loads.len());
            let least = *loads.iter().min().unwrap();
            let chosen = loads[order[0]];
            prop_assert!(
                chosen < slots || chosen * 4 <= least * 5,
                "{} chosen, {} the least, {} slots", chosen, least, slots
            );
        }

        /// With no load, every engine takes about its part of many prefixes.
        #[test]
        fn idle_engines_share_the_prefixes_evenly(engines in 2usize..6) {
            let names: Vec<String> = (0..engines).map(|i| format!("unit-{i}")).collect();
            let idle: Vec<(&str, usize, f64)> = names.iter().map(|n| (n.as_str(), 0, 0.0)).collect();
            let mut counts = vec![0usize; engines];
            for key in 0..6_000u64 {
                let mut h = DefaultHasher::new();
                key.hash(&mut h);
                counts[first_order(h.finish(), &idle, 1)[0]] += 1;
            }
            let fair = 6_000 / engines;
            for c in counts {
                prop_assert!(c * 10 > fair * 8 && c * 10 < fair * 12, "{c} of a fair {fair}");
            }
        }
    }
}
