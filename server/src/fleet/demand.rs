//! On-demand members (seed 002's hybrid): a request through the gateway loads one, which is a fleet change
//! like any other (committed, held in the ledger, carried out by the runtime in the memory-safe order); the
//! least recently used idle on-demand models on its GPUs unload first when it would not fit; and after its
//! keep-alive with no request it unloads again. Whether a model is loaded is committed; when it was last
//! used, and whether a request waits for it, is kept here in memory.

use super::committed::Committed;
use super::groups::{Asleep, Group};
use super::ledger::{Ledger, Takes};
use super::{Fleet, State};
use crate::error::ApiError;
use crate::runtime::EngineState;
use crate::runtime::EngineView;
use placement::{
    eviction_order, make_host_room, tier, BasisPoints, Bytes, GpuRef, Hold, Loaded, Sleeper, Tier,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;

/// What the gateway tells the fleet about on-demand models, in memory.
pub struct Activity {
    /// When the fleet opened: the last use of a model loaded before, which no request has touched since.
    opened_ms: u64,
    uses: Mutex<BTreeMap<String, Use>>,
    /// One load attempt per model at a time: the request holding its turn tries, the others wait for it.
    turns: Mutex<BTreeMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Debug, Clone, Default)]
struct Use {
    last_used_ms: u64,
    /// Requests waiting for it to load.
    waiting: usize,
    /// Committed as loaded, for the request that asked at this instant, and not yet answered once.
    loading: Option<Instant>,
    /// The last cold start.
    cold_start: Option<ColdStart>,
    /// The loads tried for it (each a fleet write, committed or refused for want of room).
    load_attempts: u64,
    /// Its engine failed to load: when it was unloaded for that, and why.
    failed: Option<(Instant, String)>,
    /// The cold model it was asked to yield its room to: while that one waits, it takes no new request,
    /// so that once those in flight end it is idle and that one's load unloads it.
    yields_to: Option<String>,
    /// Committed awake, for the request that asked at this instant, and not yet answered once.
    waking: Option<Instant>,
    /// Its last wake, from the request that woke it to that request's engine.
    last_wake: Option<Duration>,
    /// Why its engine, asleep, could not be woken and a cold start took the wake's place.
    fell_back: Option<String>,
    /// How it was at its last sleep, as measured: what a sleep to make room counts on it keeping.
    last_asleep: Option<Asleep>,
}

/// A cold start: the load itself, and what the request that asked for it waited before the load began
/// (for room, and for the models that made way to stop).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColdStart {
    /// From its engine's start to its first answered health check.
    pub load: Duration,
    /// From the request to its engine's start.
    pub waited: Duration,
}

/// How an on-demand model is, for the Models tab.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Usage {
    /// When a request last began or ended for it (ms since the epoch), if one did since the server started.
    pub last_used_ms: Option<u64>,
    /// Its last cold start.
    pub cold_start: Option<ColdStart>,
    /// The loads tried for it since the server started.
    pub load_attempts: u64,
    /// Its last wake from sleep.
    pub last_wake: Option<Duration>,
    /// Why its last wake fell back to a cold start, when it did.
    pub fell_back: Option<String>,
}

/// A request waiting for an on-demand model: while one does, the model is busy and never unloads.
pub struct Waiting {
    activity: Arc<Activity>,
    model: String,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.activity.with(&self.model, |u| {
            u.waiting = u.waiting.saturating_sub(1);
        });
        self.activity.touch(&self.model);
    }
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity {
            opened_ms: super::usage::now_ms(),
            uses: Mutex::default(),
            turns: Mutex::default(),
        }
    }

    fn with<T>(&self, model: &str, f: impl FnOnce(&mut Use) -> T) -> T {
        let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        // Every request ends here: a model seen before costs no allocation.
        if let Some(found) = uses.get_mut(model) {
            return f(found);
        }
        f(uses.entry(model.to_owned()).or_default())
    }

    /// A request for `model` began or ended now.
    pub fn touch(&self, model: &str) {
        let now = super::usage::now_ms();
        self.with(model, |u| u.last_used_ms = now);
    }

    /// A request waits for `model` until the guard is dropped.
    pub fn wait(self: &Arc<Self>, model: &str) -> Waiting {
        self.with(model, |u| u.waiting += 1);
        self.touch(model);
        Waiting {
            activity: self.clone(),
            model: model.to_owned(),
        }
    }

    /// The turn to try loading `model`: whoever holds it tries, the others wait for what it brings.
    pub fn load_turn(&self, model: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut turns = self.turns.lock().unwrap_or_else(PoisonError::into_inner);
        turns.entry(model.to_owned()).or_default().clone()
    }

    /// Says `model` was last used at `ms`, as if no request came since.
    #[cfg(test)]
    pub(crate) fn used_at(&self, model: &str, ms: u64) {
        self.with(model, |u| u.last_used_ms = ms);
    }

    /// `model`'s engine served a request, its load (if this is its first since it was loaded) having
    /// been `load`: a fresh load is over, and its cold start is recorded.
    pub fn answered(&self, model: &str, load: Option<crate::runtime::Load>) {
        self.with(model, |u| {
            if let Some(asked) = u.waking.take() {
                u.last_wake = Some(asked.elapsed());
                return;
            }
            let Some(asked) = u.loading.take() else {
                return;
            };
            u.cold_start = Some(match load {
                Some(load) => ColdStart {
                    load: load.took,
                    waited: load
                        .ready_at
                        .saturating_duration_since(asked)
                        .saturating_sub(load.took),
                },
                None => ColdStart {
                    load: asked.elapsed(),
                    waited: Duration::ZERO,
                },
            });
        });
    }

    /// `model` was unloaded because its engine failed to load, saying `why`.
    fn failed(&self, model: &str, why: String) {
        self.with(model, |u| {
            u.loading = None;
            u.failed = Some((Instant::now(), why));
        });
    }

    /// Why `model` is refused without a load, and for how long yet: its engine failed to load under
    /// `cool_off` ago.
    pub fn refused(&self, model: &str, cool_off: Duration) -> Option<(String, Duration)> {
        let uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        let (at, why) = uses.get(model)?.failed.as_ref()?;
        let left = cool_off.checked_sub(at.elapsed())?;
        Some((why.clone(), left))
    }

    /// How `model` has been used.
    pub fn usage(&self, model: &str) -> Usage {
        let uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        let found = uses.get(model).cloned().unwrap_or_default();
        Usage {
            last_used_ms: (found.last_used_ms > 0).then_some(found.last_used_ms),
            cold_start: found.cold_start,
            load_attempts: found.load_attempts,
            last_wake: found.last_wake,
            fell_back: found.fell_back,
        }
    }

    fn last_used_ms(&self, model: &str) -> u64 {
        self.usage(model).last_used_ms.unwrap_or(self.opened_ms)
    }

    fn waiting(&self, model: &str) -> bool {
        let uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        uses.get(model).is_some_and(|u| u.waiting > 0)
    }

    /// Whether `model` yields its room: asked to by a cold model that still waits for it. A request for it
    /// then waits its turn, as one for a model not loaded does.
    pub fn yielding(&self, model: &str) -> bool {
        let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(to) = uses.get(model).and_then(|u| u.yields_to.clone()) else {
            return false;
        };
        if uses.get(&to).is_some_and(|u| u.waiting > 0) {
            return true;
        }
        // The cold model gave up waiting (or was served): the turn is over.
        if let Some(found) = uses.get_mut(model) {
            found.yields_to = None;
        }
        false
    }

    /// Whether `model` yields its room to `to`, which still waits for it: only `to`'s load may take it
    /// while its own requests wait (a yielding model is idle to that load alone).
    fn yields_to(&self, model: &str, to: &str) -> bool {
        self.yielding(model) && self.with(model, |u| u.yields_to.as_deref() == Some(to))
    }

    /// `model` was unloaded: whatever it yielded, it yields no more, and no wake of it is under way.
    fn unloaded(&self, model: &str) {
        self.with(model, |u| {
            u.yields_to = None;
            u.waking = None;
        });
    }

    /// `model` was loaded: its turn has come, so no model yields to it any more (those that yielded and
    /// were not the ones unloaded for it take requests again), and it yields to none.
    fn loaded(&self, model: &str) {
        let mut uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        for (name, u) in uses.iter_mut() {
            if name == model || u.yields_to.as_deref() == Some(model) {
                u.yields_to = None;
            }
        }
    }

    /// Whether `model` was committed awake for a request that has not been answered yet.
    fn waking(&self, model: &str) -> bool {
        self.with(model, |u| u.waking.is_some())
    }

    /// When the request that loaded `model` asked, while the load has not answered once.
    fn loading_since(&self, model: &str) -> Option<Instant> {
        let uses = self.uses.lock().unwrap_or_else(PoisonError::into_inner);
        uses.get(model)?.loading
    }
}

/// What a request for an on-demand model found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Load {
    /// It was loaded already.
    Loaded,
    /// This request loads it, unloading these (least recently used first) to make room.
    Loading {
        /// The on-demand models unloaded for it.
        unloaded: Vec<String>,
    },
    /// It was asleep: this request wakes it, unloading these to make room.
    Waking {
        /// The on-demand models unloaded for it.
        unloaded: Vec<String>,
    },
}

/// How many of the loaded on-demand models in `order`, unloaded from the first, make `committed` fit on
/// `gpus` as `state`'s ledger holds it: the fewest; `None` where even all of them do not.
fn fewest_to_unload(
    state: &State,
    committed: &Committed,
    gpus: &[GpuRef],
    order: &[&str],
) -> Option<usize> {
    (0..=order.len()).find(|&k| {
        let mut trial = committed.clone();
        for m in &order[..k] {
            set_loaded(&mut trial, m, false);
        }
        fits(&state.ledger, &state.committed, &trial, gpus)
    })
}

/// `model` loaded or not in `committed`, wherever its group is.
fn set_loaded(committed: &mut Committed, model: &str, loaded: bool) {
    edit_group(committed, model, |group| {
        if loaded {
            group.loaded.insert(model.to_owned());
        } else {
            group.loaded.remove(model);
        }
        // Loaded for a request, or unloaded: either way awake (a model not loaded sleeps no more).
        group.asleep.remove(model);
    });
}

/// `edit` done to the group of `model`, an on-demand member, in `committed`.
fn edit_group(committed: &mut Committed, model: &str, edit: impl FnOnce(&mut Group)) {
    let Some(group) = committed.on_demand_group(model) else {
        return;
    };
    let mut group = group.clone();
    edit(&mut group);
    committed.groups.put(Arc::new(group));
}

/// Whether `after` holds no GPU of `gpus` over what it offers, unless no more than `before` did already.
/// Whether `trial` (the committed state `before` with its groups on `gpus` changed) fits on `gpus` as
/// `ledger` (which holds `before`) would hold it: on each, no more than it offers, or no more than it
/// takes already. Only the groups on those GPUs differ, so only theirs are held again, on those GPUs.
pub(super) fn fits(
    ledger: &Ledger,
    before: &Committed,
    trial: &Committed,
    gpus: &[GpuRef],
) -> bool {
    let takes = |committed: &Committed| {
        let mut takes: BTreeMap<GpuRef, Takes> = BTreeMap::new();
        for group in committed
            .groups
            .iter()
            .filter(|g| g.gpus.iter().any(|gpu| gpus.contains(gpu)))
        {
            for (gpu, taken) in ledger.group_takes(group, gpus) {
                let sum = takes.entry(gpu).or_default();
                sum.all += taken.all;
                sum.engines += taken.engines;
            }
        }
        takes
    };
    let (was, will) = (takes(before), takes(trial));
    gpus.iter().all(|gpu| {
        let taken = ledger
            .scheduler()
            .hold(gpu)
            .map(Hold::taken)
            .unwrap_or_default();
        let (was, will) = (
            was.get(gpu).copied().unwrap_or_default(),
            will.get(gpu).copied().unwrap_or_default(),
        );
        // Saturating: a member the ledger keeps aside holds nothing there.
        let after = Bytes(
            taken
                .get()
                .saturating_sub(was.all.get())
                .saturating_add(will.all.get()),
        );
        let offered = ledger
            .inventory()
            .gpu(gpu)
            .map(|g| g.offered())
            .unwrap_or_default();
        // On a GPU over what it offers (a reading found less there), only a swap: engines that stop make
        // the room of those that start. The room the members take turns in is booked, not allocated, and
        // another program may be using it now.
        after <= offered || (after <= taken && will.engines <= was.engines)
    })
}

impl Fleet {
    /// The in-memory record of on-demand models' use.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }

    /// Whether `model` is an on-demand member, and if so whether it is loaded and awake now (one asleep
    /// takes a request only once a load wakes it).
    pub fn on_demand(&self, model: &str) -> Option<bool> {
        let committed = self.committed();
        Some(committed.on_demand_group(model)?.awake(model))
    }

    /// Every on-demand member, with how it has been used.
    pub fn on_demand_usage(&self) -> Vec<(String, Usage)> {
        self.committed()
            .groups
            .iter()
            .flat_map(|g| g.demand.keys())
            .map(|m| (m.clone(), self.activity.usage(m)))
            .collect()
    }

    /// How `model`, an on-demand member, is now: loaded or not (loading while loaded with no engine ready),
    /// when it was last used, its last cold start. `None` for a pinned model.
    pub fn on_demand_view(&self, model: &str) -> Option<app::views::OnDemand> {
        use app::views::{LoadState, OnDemand};
        let committed = self.committed();
        let group = committed.on_demand_group(model)?;
        let ready = self.runtime.engines_of(model).iter().any(|e| {
            e.model.as_deref() == Some(model) && e.state == crate::runtime::EngineState::Healthy
        });
        let asleep = group.asleep.get(model);
        let state = match (group.loaded.contains(model), ready) {
            (false, _) => LoadState::NotLoaded,
            _ if asleep.is_some() => LoadState::Asleep,
            (true, false) => LoadState::Loading,
            (true, true) => LoadState::Loaded,
        };
        let usage = self.activity.usage(model);
        Some(OnDemand {
            keep_alive_s: group.demand.get(model)?.secs(),
            state,
            last_used: usage.last_used_ms.and_then(super::usage::rfc3339),
            cold_start_ms: usage.cold_start.map(|c| c.load.as_millis() as u64),
            cold_wait_ms: usage.cold_start.map(|c| c.waited.as_millis() as u64),
            keep_asleep_s: super::engines::member_sleeps(&committed, group, model)
                .then(|| self.runtime.keep_asleep().as_secs()),
            asleep: asleep.map(|a| app::views::AsleepView {
                since: super::usage::rfc3339(a.since_ms).unwrap_or_default(),
                held_bytes: a.held_bytes.map(Bytes::get),
                host_bytes: a.host_bytes.map(Bytes::get),
            }),
            last_wake_ms: usage.last_wake.map(|d| d.as_millis() as u64),
            fell_back: usage.fell_back,
        })
    }

    /// Why every engine of `model` failed, when each has (and it has one).
    fn failed(&self, model: &str) -> Option<String> {
        failed_among(&self.runtime.engines_of(model), model)
    }

    /// Whether `model`, loaded for a request that asked at `asked`, is still being loaded for it: no
    /// engine of it (among `engines`) failed, and none has served for a whole `keep_alive` with no request
    /// come for it.
    fn still_loading(
        &self,
        engines: &[EngineView],
        model: &str,
        asked: Instant,
        keep_alive: Duration,
    ) -> bool {
        if failed_among(engines, model).is_some() {
            return false;
        }
        !engines
            .iter()
            .filter(|e| e.model.as_deref() == Some(model))
            .filter_map(|e| self.runtime.last_load(&e.unit))
            .any(|l| l.ready_at >= asked && l.ready_at.elapsed() >= keep_alive)
    }

    /// How long `model` has served since its engines were last ready, the shortest of them; `None` where
    /// none has loaded since the server started.
    fn served_for(&self, model: &str) -> Option<Duration> {
        self.runtime
            .engines_of(model)
            .iter()
            .filter(|e| e.model.as_deref() == Some(model))
            .filter_map(|e| self.runtime.last_load(&e.unit))
            .map(|l| l.ready_at.elapsed())
            .min()
    }

    /// The loaded on-demand models on any of `gpus`, as eviction sees them, for the load of `for_load`
    /// where there is one: a model that yields its room to it is idle to it once its requests in flight
    /// have ended, though its own requests wait.
    fn loaded_on(
        &self,
        committed: &Committed,
        gpus: &[GpuRef],
        for_load: Option<&str>,
    ) -> Vec<Loaded> {
        committed
            .groups
            .iter()
            .filter(|g| g.gpus.iter().any(|gpu| gpus.contains(gpu)))
            .flat_map(|g| {
                g.loaded.iter().filter_map(|m| {
                    let keep_alive = *g.demand.get(m)?;
                    let engines = self.runtime.engines_of(m);
                    let in_flight: usize = engines
                        .iter()
                        .filter(|e| e.model.as_deref() == Some(m))
                        .map(|e| self.runtime.requests_in_flight(&e.unit))
                        .sum();
                    // A fresh load keeps its place until it has answered once (or failed): a request
                    // that gave up waiting for it leaves it loading, not idle.
                    let loading = self.activity.loading_since(m).is_some_and(|asked| {
                        let keep_alive = Duration::from_millis(keep_alive.millis());
                        self.still_loading(&engines, m, asked, keep_alive)
                    });
                    // Requests waiting for a model that yields wait their turn: they keep it from
                    // the load it yields to, and from no other.
                    let yields = for_load.is_some_and(|to| self.activity.yields_to(m, to));
                    Some(Loaded {
                        name: m.clone(),
                        last_used_ms: self.activity.last_used_ms(m),
                        busy: in_flight > 0 || (self.activity.waiting(m) && !yields) || loading,
                        asleep: g.asleep.contains_key(m),
                        keep_alive,
                    })
                })
            })
            .collect()
    }

    /// Which of the loaded on-demand models on `gpus` unload, least recently used idle first, until
    /// `committed` with them unloaded fits, for the load of `loading` where it is one (never unloading it);
    /// `None` when it does not fit even with every idle one gone.
    pub(super) fn make_room(
        &self,
        state: &State,
        committed: &Committed,
        gpus: &[GpuRef],
        loading: Option<&str>,
    ) -> Option<Vec<String>> {
        let loaded = self.loaded_on(committed, gpus, loading);
        let order: Vec<&str> = eviction_order(&loaded)
            .into_iter()
            .filter(|m| Some(*m) != loading)
            .collect();
        let k = fewest_to_unload(state, committed, gpus, &order)?;
        Some(order[..k].iter().map(|m| (*m).to_owned()).collect())
    }

    /// How the loaded on-demand models on `gpus` make way for the load (or wake) of `loading`, in
    /// [`eviction_order`] (idle ones, the awake before sleepers, least recently used first), until `committed` fits: each put to sleep where it is awake, its engine
    /// can sleep, what it keeps asleep was measured at an earlier sleep, and its machines' memory for
    /// sleepers takes it; else unloaded (a sleeper is stopped). `None` when it does not fit even with
    /// every idle one gone.
    fn make_way(
        &self,
        state: &State,
        committed: &Committed,
        gpus: &[GpuRef],
        loading: &str,
    ) -> Option<Vec<(String, Way)>> {
        let loaded = self.loaded_on(committed, gpus, Some(loading));
        let order: Vec<&str> = eviction_order(&loaded)
            .into_iter()
            .filter(|m| *m != loading)
            .collect();
        let now = super::usage::now_ms();
        // What the models put to sleep before each keep of each machine's memory, added up.
        let mut added: BTreeMap<String, Bytes> = BTreeMap::new();
        let ways: Vec<Way> = order
            .iter()
            .map(|m| self.way_of(state, committed, m, now, &mut added))
            .collect();
        let k = (0..=order.len()).find(|&k| {
            let mut trial = committed.clone();
            for (m, way) in order[..k].iter().zip(&ways) {
                match way {
                    Way::Unload => set_loaded(&mut trial, m, false),
                    Way::Sleep(asleep) => put_asleep(&mut trial, m, *asleep),
                }
            }
            fits(&state.ledger, &state.committed, &trial, gpus)
        })?;
        Some(
            order[..k]
                .iter()
                .map(|m| (*m).to_owned())
                .zip(ways)
                .collect(),
        )
    }

    /// How idle `model` makes way: asleep, keeping what it kept at its last sleep, where it can and its
    /// machines' memory for sleepers takes it beside those already asleep and those put to sleep before it
    /// (`added`, which it adds to).
    fn way_of(
        &self,
        state: &State,
        committed: &Committed,
        model: &str,
        now: u64,
        added: &mut BTreeMap<String, Bytes>,
    ) -> Way {
        let Some(group) = committed.on_demand_group(model) else {
            return Way::Unload;
        };
        if group.asleep.contains_key(model)
            || !super::engines::member_sleeps(committed, group, model)
        {
            return Way::Unload;
        }
        let Some(last) = self.activity.with(model, |u| u.last_asleep) else {
            return Way::Unload;
        };
        let inventory = state.ledger.inventory();
        let wanted: Vec<(&str, Bytes)> = group
            .machines()
            .into_iter()
            .filter(|m| group.runs_on(model, m))
            .map(|machine| {
                let host = group.host_kept(inventory, model, machine, last.host_bytes);
                (machine, host)
            })
            .collect();
        let room = wanted.iter().all(|(machine, host)| {
            let budget = self.runtime.sleepers_host_budget(
                inventory
                    .machine(machine)
                    .map(|m| m.memory)
                    .unwrap_or_default(),
            );
            let before = added.get(*machine).copied().unwrap_or_default();
            host_taken(committed, inventory, machine) + before + *host <= budget
        });
        if !room {
            return Way::Unload;
        }
        for (machine, host) in wanted {
            *added.entry(machine.to_owned()).or_default() += host;
        }
        Way::Sleep(Asleep {
            since_ms: now,
            ..last
        })
    }

    /// Asks the loaded on-demand models that keep `model` (cold, with a request that has waited its turn)
    /// from loading, though they are busy, to yield their room: the fewest, least recently used first, that
    /// make room for it. Each then takes no new request (the gateway holds those as it holds a load's),
    /// finishes those in flight, and is idle, so that `model`'s next load unloads it; its own requests wait
    /// their turn the same way. Without turns, a model whose traffic never pauses kept its room for as long
    /// as the traffic lasted, and a cold one beside it never loaded. A model still loading for the request
    /// that asked for it is never asked: its load is not cut short; nor one that has served for less than
    /// `turn` since it loaded: each has its turn. Returns the models asked.
    pub async fn ask_to_yield(&self, model: &str, turn: Duration) -> Vec<String> {
        let state = self.state.lock().await;
        let committed = state.committed.clone();
        let Some(group) = committed.on_demand_group(model) else {
            return Vec::new();
        };
        if group.loaded.contains(model) {
            return Vec::new();
        }
        let mut wanted = (*committed).clone();
        set_loaded(&mut wanted, model, true);
        let mut loaded: Vec<Loaded> = self
            .loaded_on(&committed, &group.gpus, Some(model))
            .into_iter()
            .filter(|l| l.name != model && self.activity.loading_since(&l.name).is_none())
            .filter(|l| !l.busy || self.served_for(&l.name).is_none_or(|served| served >= turn))
            .collect();
        // Busy or not, least recently used first: the idle ones make way at the load itself.
        loaded.sort_by(|a, b| {
            (a.busy, a.last_used_ms, &a.name).cmp(&(b.busy, b.last_used_ms, &b.name))
        });
        let order: Vec<&str> = loaded.iter().map(|l| l.name.as_str()).collect();
        let Some(k) = fewest_to_unload(&state, &wanted, &group.gpus, &order) else {
            return Vec::new();
        };
        let asked: Vec<String> = loaded[..k]
            .iter()
            .filter(|l| l.busy)
            .map(|l| l.name.clone())
            .collect();
        for other in &asked {
            self.activity
                .with(other, |u| u.yields_to = Some(model.to_owned()));
            tracing::info!("{other} yields its room to {model}, which has waited its turn");
        }
        asked
    }

    /// Loads `model`, an on-demand member, as a request that asks now would.
    pub async fn load(self: &Arc<Self>, model: &str) -> Result<Load, ApiError> {
        self.load_for(model, Instant::now()).await
    }

    /// Loads `model`, an on-demand member, for a request through the gateway that asked at `asked`:
    /// committed as loaded (with the idle models that make way for it unloaded), then started by the
    /// runtime after what it replaces has stopped; it stays loaded, whoever asks, until it has answered once
    /// or failed. One asleep is woken the same way: it needs its whole share again, made room for by the
    /// same rule, and the runtime wakes it once what makes way has stopped. Refused (409) when its GPUs
    /// lack the room even with every idle on-demand model there unloaded.
    pub async fn load_for(self: &Arc<Self>, model: &str, asked: Instant) -> Result<Load, ApiError> {
        self.activity.with(model, |u| u.load_attempts += 1);
        // Asleep, its engine may have died: then unloaded first, and loaded cold below.
        if self.on_demand(model) == Some(false) {
            self.unload_failed(model).await?;
        }
        let model = model.to_owned();
        self.write(|fleet| async move {

            let mut state = fleet.state.lock().await;
            let committed = state.committed.clone();
            let Some(group) = committed.on_demand_group(&model) else {
                return Err(ApiError::NotFound(format!(
                    "{model} is not an on-demand model"
                )));
            };
            let waking = group.asleep.contains_key(&model);
            if group.loaded.contains(&model) && !waking {
                return Ok(Load::Loaded);
            }
            // A sleep the fleet's look has not measured yet is read now, before the wake undoes it: what
            // it kept is what a later sleep to make way counts on (`way_of`).
            let unmeasured = group.asleep.get(&model).filter(|a| a.held.is_none()).copied();
            let mut wanted = (*committed).clone();
            set_loaded(&mut wanted, &model, true);
            let way = fleet
                .make_way(&state, &wanted, &group.gpus, &model)
                .ok_or_else(|| {
                    ApiError::Conflict(format!(
                        "{model} cannot load: its GPUs lack the room even with every idle on-demand model there unloaded; try again when a request in flight or a load under way there ends"
                    ))
                })?;
            let mut tx = crate::db::write(&fleet.pool).await?;
            sqlx::query("UPDATE group_members SET loaded = 1, asleep = NULL WHERE model = ?")
                .bind(&model)
                .execute(&mut *tx)
                .await?;
            let mut unloaded = Vec::new();
            for (other, how) in &way {
                match how {
                    Way::Unload => {
                        sqlx::query(
                            "UPDATE group_members SET loaded = 0, asleep = NULL WHERE model = ?",
                        )
                        .bind(other)
                        .execute(&mut *tx)
                        .await?;
                        unloaded.push(other.clone());
                    }
                    Way::Sleep(asleep) => {
                        set_asleep(&mut tx, other, Some(asleep)).await?;
                        crate::audit::record(
                            &mut tx,
                            crate::audit::Entry::new(crate::audit::TESSERA, "model.sleep", other)
                                .after(serde_json::json!({
                                    "reason": format!("idle, it makes room for {model}")
                                })),
                        )
                        .await?;
                    }
                }
            }
            let action = if waking { "model.wake" } else { "model.load" };
            crate::audit::record(
                &mut tx,
                crate::audit::Entry::new(crate::audit::TESSERA, action, &model).after(
                    serde_json::json!({ "reason": "a request asked for it", "unloaded": unloaded }),
                ),
            )
            .await?;
            let kept = unmeasured.and_then(|asleep| {
                measured(&state.ledger, &fleet.runtime.engines_of(&model), &model, &asleep)
            });
            fleet.finish(&mut state, tx, None, None).await?;
            if kept.is_some() {
                fleet.activity.with(&model, |u| u.last_asleep = kept);
            }
            fleet.activity.with(&model, |u| {
                if waking {
                    u.waking = Some(asked);
                } else {
                    u.loading = Some(asked);
                }
                u.failed = None;
            });
            for other in &unloaded {
                fleet.activity.unloaded(other);
            }
            fleet.activity.loaded(&model);
            if waking {
                tracing::info!("waking {model} for a request; unloaded to make room: {unloaded:?}");
                return Ok(Load::Waking { unloaded });
            }
            tracing::info!("loading {model} for a request; unloaded to make room: {unloaded:?}");
            Ok(Load::Loading { unloaded })
        })
        .await
    }

    /// Carries out what the keep-alives say of the loaded on-demand models (placement's [`tier`]): each
    /// awake one idle past its keep-alive is put to sleep where its engine can sleep, else unloaded; each
    /// asleep past the runtime's `keep_asleep` is unloaded. Also unloads every one whose engines all failed
    /// to load (which would book its memory for nothing), died asleep, or could not be put to sleep; and
    /// holds each one asleep to what it was measured to keep, once its engines say.
    pub async fn unload_expired(self: &Arc<Self>) -> Result<Vec<String>, ApiError> {
        if self.committed().groups.iter().all(|g| g.loaded.is_empty()) {
            return Ok(Vec::new());
        }
        self.write(|fleet| async move {
            let mut state = fleet.state.lock().await;
            let committed = state.committed.clone();
            let gpus: BTreeSet<GpuRef> = committed
                .groups
                .iter()
                .filter(|g| !g.loaded.is_empty())
                .flat_map(|g| g.gpus.iter().cloned())
                .collect();
            let gpus: Vec<GpuRef> = gpus.into_iter().collect();
            let loaded = fleet.loaded_on(&committed, &gpus, None);
            let now = super::usage::now_ms();
            let keep_asleep = fleet.runtime.keep_asleep().as_millis() as u64;
            let mut settled = Settled::default();
            for l in &loaded {
                let Some(group) = committed.on_demand_group(&l.name) else {
                    continue;
                };
                let engines = fleet.runtime.engines_of(&l.name);
                let asleep = group.asleep.get(&l.name);
                let runs = engines
                    .iter()
                    .any(|e| e.model.as_deref() == Some(l.name.as_str()));
                if asleep.is_some() && !runs {
                    // Its engine was stopped asleep (a change that restarts it, or gone while Tessera
                    // was away): it is not started asleep again.
                    let why = "its engine stopped while it slept".to_owned();
                    settled
                        .unload
                        .push((l.name.clone(), Unloaded::DiedAsleep(why)));
                    continue;
                }
                if let Some(why) = failed_among(&engines, &l.name) {
                    settled.unload.push((
                        l.name.clone(),
                        match asleep {
                            Some(_) => Unloaded::DiedAsleep(why),
                            None => Unloaded::Failed(why),
                        },
                    ));
                    continue;
                }
                if let Some(why) = engines.iter().find_map(|e| e.sleep_failed.clone()) {
                    if asleep.is_some() {
                        settled
                            .unload
                            .push((l.name.clone(), Unloaded::CouldNotSleep(why)));
                        continue;
                    }
                }
                let sleeps = super::engines::member_sleeps(&committed, group, &l.name);
                match tier(l, sleeps, asleep.map(|a| a.since_ms), keep_asleep, now) {
                    Tier::Sleeps => settled.sleep.push(l.name.clone()),
                    Tier::Unloads => settled.unload.push((
                        l.name.clone(),
                        match asleep {
                            Some(_) => Unloaded::Asleep(keep_asleep / 1000),
                            None => Unloaded::Idle(l.keep_alive.secs()),
                        },
                    )),
                    Tier::Stays => {
                        // Held as measured once it sleeps; one put to sleep to make room counted on
                        // its last sleep's figures, and is held as measured this time.
                        if let Some(asleep) = asleep {
                            if let Some(kept) = measured(&state.ledger, &engines, &l.name, asleep) {
                                let more = asleep.held.is_some_and(|h| kept.held > Some(h));
                                if more
                                    && !fits_kept(&state, &committed, &l.name, kept, &group.gpus)
                                {
                                    // It keeps more than its last sleep did, where the room is taken.
                                    let why = "asleep it keeps more than it did, and its GPUs lack that room";
                                    settled
                                        .unload
                                        .push((l.name.clone(), Unloaded::CouldNotSleep(why.to_owned())));
                                } else if kept != *asleep {
                                    settled.measured.push((l.name.clone(), kept));
                                }
                            }
                        }
                    }
                }
            }
            fleet.keep_host_budget(&state, &committed, &loaded, &mut settled);
            let unloaded = settled.unload.iter().map(|(m, _)| m.clone()).collect();
            fleet.settle_demand(&mut state, settled).await?;
            Ok(unloaded)
        })
        .await
    }

    /// Where putting `settled.sleep` to sleep would keep more of a machine's memory than sleepers may
    /// (`--sleepers-host-memory-percent`): the least recently used sleepers there are stopped first (placement's
    /// [`make_host_room`]), or, where even that leaves too little, the model is unloaded rather than put to
    /// sleep. A sleeper counts for what its sleep was measured to free, else its share (the most it can
    /// be); one about to sleep counts for its share.
    fn keep_host_budget(
        &self,
        state: &State,
        committed: &Committed,
        loaded: &[Loaded],
        settled: &mut Settled,
    ) {
        let inventory = state.ledger.inventory();
        let last_used = |m: &str| {
            loaded
                .iter()
                .find(|l| l.name == m)
                .map_or(0, |l| l.last_used_ms)
        };
        let leaving: BTreeSet<String> = settled.unload.iter().map(|(m, _)| m.clone()).collect();
        let mut on_machine: BTreeMap<String, Vec<Sleeper>> = BTreeMap::new();
        for group in &committed.groups {
            for (model, asleep) in &group.asleep {
                if leaving.contains(model) {
                    continue;
                }
                let measured = settled
                    .measured
                    .iter()
                    .find(|(m, _)| m == model)
                    .and_then(|(_, a)| a.host_bytes);
                for machine in group.machines() {
                    if !group.runs_on(model, machine) {
                        continue;
                    }
                    let host =
                        group.host_kept(inventory, model, machine, measured.or(asleep.host_bytes));
                    on_machine
                        .entry(machine.to_owned())
                        .or_default()
                        .push(Sleeper {
                            name: model.clone(),
                            last_used_ms: last_used(model),
                            host,
                        });
                }
            }
        }
        for model in std::mem::take(&mut settled.sleep) {
            let Some(group) = committed.on_demand_group(&model) else {
                continue;
            };
            let machines: Vec<&str> = group
                .machines()
                .into_iter()
                .filter(|m| group.runs_on(&model, m))
                .collect();
            let mut stopped = Vec::new();
            let mut short = None;
            for machine in &machines {
                let budget = self.runtime.sleepers_host_budget(
                    inventory
                        .machine(machine)
                        .map(|m| m.memory)
                        .unwrap_or_default(),
                );
                let wanted = group.share_on(inventory, &model, machine);
                let sleepers = on_machine
                    .get(*machine)
                    .map(Vec::as_slice)
                    .unwrap_or_default();
                match make_host_room(sleepers, wanted, budget) {
                    Some(names) => {
                        stopped.extend(names.into_iter().map(|n| (n.to_owned(), machine, budget)))
                    }
                    None => short = Some((machine, budget)),
                }
            }
            if let Some((machine, budget)) = short {
                settled
                    .unload
                    .push((model, Unloaded::HostShort(machine.to_string(), budget)));
                continue;
            }
            for (name, machine, budget) in stopped {
                for sleepers in on_machine.values_mut() {
                    sleepers.retain(|s| s.name != name);
                }
                // Stopped, it is neither put to sleep nor held as measured in the same write.
                settled.sleep.retain(|m| *m != name);
                settled.measured.retain(|(m, _)| *m != name);
                if !settled.unload.iter().any(|(m, _)| *m == name) {
                    settled
                        .unload
                        .push((name, Unloaded::HostShort(machine.to_string(), budget)));
                }
            }
            for machine in &machines {
                on_machine
                    .entry(machine.to_string())
                    .or_default()
                    .push(Sleeper {
                        name: model.clone(),
                        last_used_ms: last_used(&model),
                        host: group.share_on(inventory, &model, machine),
                    });
            }
            settled.sleep.push(model);
        }
    }

    /// Unloads `model`, an on-demand member, if it is loaded and its engines all failed to load; says why
    /// they failed, when it did (the request is refused for the cool-off). One whose engine died asleep, or
    /// as it was woken, is unloaded saying so, with no cool-off: its next load is a cold start. That one
    /// is waited for until the runtime has let the dead engine go, so that the load that follows starts
    /// an engine anew and is not taken for a failed one.
    pub async fn unload_failed(self: &Arc<Self>, model: &str) -> Result<Option<String>, ApiError> {
        // Looked at on every poll of a waiting request: a write only where there is something to unload.
        if self.failed(model).is_none() {
            return Ok(None);
        }
        let name = model.to_owned();
        let unloaded = self
            .write(|fleet| async move {
                let mut state = fleet.state.lock().await;
                let Some(group) = state.committed.on_demand_group(&name).cloned() else {
                    return Ok(None);
                };
                let Some(why) = fleet.failed(&name).filter(|_| group.loaded.contains(&name)) else {
                    return Ok(None);
                };
                let unloaded = if group.asleep.contains_key(&name) || fleet.activity.waking(&name) {
                    Unloaded::DiedAsleep(why)
                } else {
                    Unloaded::Failed(why)
                };
                let refused = match &unloaded {
                    Unloaded::Failed(why) => Some(why.clone()),
                    _ => None,
                };
                fleet.unload(&mut state, vec![(name, unloaded)]).await?;
                Ok(Some(refused))
            })
            .await?;
        match unloaded {
            None => Ok(None),
            Some(Some(why)) => Ok(Some(why)),
            Some(None) => {
                let until = Instant::now() + self.runtime.stop_timeout();
                while self.failed(model).is_some() && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Ok(None)
            }
        }
    }

    /// Commits `models` as not loaded, each with why, in one write.
    async fn unload(
        &self,
        state: &mut State,
        models: Vec<(String, Unloaded)>,
    ) -> Result<Vec<String>, ApiError> {
        let names = models.iter().map(|(m, _)| m.clone()).collect();
        self.settle_demand(
            state,
            Settled {
                unload: models,
                ..Settled::default()
            },
        )
        .await?;
        Ok(names)
    }

    /// Commits what the keep-alives settled, in one write: models unloaded (each with why), put to sleep,
    /// and held asleep to what they were measured to keep.
    async fn settle_demand(&self, state: &mut State, settled: Settled) -> Result<(), ApiError> {
        if settled.is_empty() {
            return Ok(());
        }
        let mut tx = crate::db::write(&self.pool).await?;
        for (model, why) in &settled.unload {
            sqlx::query("UPDATE group_members SET loaded = 0, asleep = NULL WHERE model = ?")
                .bind(model)
                .execute(&mut *tx)
                .await?;
            crate::audit::record(
                &mut tx,
                crate::audit::Entry::new(crate::audit::TESSERA, "model.unload", model)
                    .after(serde_json::json!({ "reason": why.reason() })),
            )
            .await?;
        }
        let now = super::usage::now_ms();
        for model in &settled.sleep {
            let asleep = Asleep {
                since_ms: now,
                held: None,
                held_bytes: None,
                host_bytes: None,
            };
            set_asleep(&mut tx, model, Some(&asleep)).await?;
            let keep_alive = state
                .committed
                .on_demand_group(model)
                .and_then(|g| g.demand.get(model))
                .map(|k| k.secs())
                .unwrap_or_default();
            crate::audit::record(
                &mut tx,
                crate::audit::Entry::new(crate::audit::TESSERA, "model.sleep", model).after(
                    serde_json::json!({ "reason": format!("no request for its keep-alive of {keep_alive} s") }),
                ),
            )
            .await?;
        }
        for (model, asleep) in &settled.measured {
            set_asleep(&mut tx, model, Some(asleep)).await?;
        }
        self.finish(state, tx, None, None).await?;
        for (model, why) in &settled.unload {
            self.activity.unloaded(model);
            match why {
                Unloaded::Failed(why) => self.activity.failed(model, why.clone()),
                Unloaded::DiedAsleep(why) | Unloaded::CouldNotSleep(why) => {
                    self.activity
                        .with(model, |u| u.fell_back = Some(why.clone()));
                }
                Unloaded::Idle(_) | Unloaded::Asleep(_) | Unloaded::HostShort(..) => {}
            }
        }
        for (model, asleep) in &settled.measured {
            self.activity.with(model, |u| u.last_asleep = Some(*asleep));
            tracing::info!(
                "{model} asleep keeps {} of each GPU",
                asleep.held_bytes.unwrap_or_default()
            );
        }
        tracing::info!(
            "unloaded: {:?}; put to sleep: {:?}",
            settled.unload.iter().map(|(m, _)| m).collect::<Vec<_>>(),
            settled.sleep
        );
        Ok(())
    }

    /// Unloads on-demand models whose keep-alive ran out, looking every `every`, for as long as the server
    /// runs.
    pub async fn keep_unloading(self: Arc<Fleet>, every: Duration) {
        // Not before the engines a previous server left are registered: a sleeper adopted is asleep, not
        // gone.
        self.runtime.taken_up().await;
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if let Err(e) = self.unload_expired().await {
                tracing::warn!(
                    "idle on-demand models could not be unloaded (tried again shortly): {e}"
                );
            }
        }
    }
}

/// Why every engine of `model` among `engines` failed, when each has (and it has one).
fn failed_among(engines: &[EngineView], model: &str) -> Option<String> {
    let of: Vec<&EngineView> = engines
        .iter()
        .filter(|e| e.model.as_deref() == Some(model))
        .collect();
    let failed = !of.is_empty()
        && of
            .iter()
            .all(|e| e.state == crate::runtime::EngineState::Failed);
    failed.then(|| {
        of.iter()
            .find_map(|e| e.message.clone())
            .unwrap_or_else(|| "its engine failed".to_owned())
    })
}

/// Why an on-demand model is unloaded.
enum Unloaded {
    /// No request came for its keep-alive, in seconds.
    Idle(u32),
    /// Its engines all failed to load, for this reason.
    Failed(String),
    /// It stayed asleep this many seconds with no request.
    Asleep(u64),
    /// Its engine died asleep, for this reason: its next request starts it cold.
    DiedAsleep(String),
    /// Its engine could not be put to sleep, for this reason.
    CouldNotSleep(String),
    /// The memory models asleep may keep on this machine (this much) was taken.
    HostShort(String, Bytes),
}

impl Unloaded {
    fn reason(&self) -> String {
        match self {
            Unloaded::Idle(keep_alive) => {
                format!("no request for its keep-alive of {keep_alive} s")
            }
            Unloaded::Failed(why) => format!("its engine failed to load: {why}"),
            Unloaded::Asleep(s) => format!("asleep for {s} s with no request"),
            Unloaded::DiedAsleep(why) => {
                format!("its engine died asleep ({why}); its next request starts it cold")
            }
            Unloaded::CouldNotSleep(why) => why.clone(),
            Unloaded::HostShort(machine, budget) => format!(
                "the memory models asleep may keep on {machine} ({}) is taken; the least recently used stops first",
                budget.size_text()
            ),
        }
    }
}

/// How an idle on-demand model makes way for a load.
#[derive(Debug, Clone, Copy)]
enum Way {
    /// Unloaded: its engine stops.
    Unload,
    /// Put to sleep, keeping this.
    Sleep(Asleep),
}

/// Whether `committed` with `model` keeping `kept` asleep fits on `gpus` as `state`'s ledger holds them.
fn fits_kept(
    state: &State,
    committed: &Committed,
    model: &str,
    kept: Asleep,
    gpus: &[GpuRef],
) -> bool {
    let mut trial = committed.clone();
    put_asleep(&mut trial, model, kept);
    fits(&state.ledger, &state.committed, &trial, gpus)
}

/// `model` asleep as `asleep` says in `committed`, wherever its group is.
fn put_asleep(committed: &mut Committed, model: &str, asleep: Asleep) {
    edit_group(committed, model, |group| {
        group.asleep.insert(model.to_owned(), asleep);
    });
}

/// What the models asleep on `machine` keep of its memory: each what its sleep was measured to free,
/// else its share there.
fn host_taken(committed: &Committed, inventory: &placement::Inventory, machine: &str) -> Bytes {
    committed
        .groups
        .iter()
        .flat_map(|g| g.asleep.iter().map(move |(m, a)| (g, m, a)))
        .filter(|(g, m, _)| g.runs_on(m, machine))
        .map(|(g, m, a)| g.host_kept(inventory, m, machine, a.host_bytes))
        .sum()
}

/// What the keep-alives settled in one look.
#[derive(Default)]
struct Settled {
    unload: Vec<(String, Unloaded)>,
    sleep: Vec<String>,
    measured: Vec<(String, Asleep)>,
}

impl Settled {
    fn is_empty(&self) -> bool {
        self.unload.is_empty() && self.sleep.is_empty() && self.measured.is_empty()
    }
}

/// `model` asleep as `asleep` says, or awake where none.
async fn set_asleep(
    tx: &mut sqlx::Transaction<'static, sqlx::Sqlite>,
    model: &str,
    asleep: Option<&Asleep>,
) -> Result<(), ApiError> {
    let json = asleep
        .map(serde_json::to_string)
        .transpose()
        .map_err(ApiError::internal)?;
    sqlx::query("UPDATE group_members SET asleep = ? WHERE model = ? AND loaded = 1")
        .bind(json)
        .bind(model)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// `model`, put to sleep (`asleep`), as its engines (`engines`) were measured to keep once each slept:
/// the most any keeps, as a share of its GPU rounded up. None until every engine of it sleeps with a
/// measure (where none can be taken, a cluster's node, it goes on holding its whole share).
fn measured(
    ledger: &Ledger,
    engines: &[EngineView],
    model: &str,
    asleep: &Asleep,
) -> Option<Asleep> {
    let of: Vec<&EngineView> = engines
        .iter()
        .filter(|e| e.model.as_deref() == Some(model))
        .collect();
    if of.is_empty() || of.iter().any(|e| e.state != EngineState::Asleep) {
        return None;
    }
    let mut held = BasisPoints::ZERO;
    let mut held_bytes = Bytes::ZERO;
    let mut host_bytes = Some(Bytes::ZERO);
    for engine in of {
        host_bytes = host_bytes
            .zip(engine.freed_asleep_bytes)
            .map(|(most, freed)| most.max(Bytes(freed)));
        let bytes = Bytes(engine.held_asleep_bytes?);
        let total = engine
            .gpus
            .iter()
            .filter_map(|i| ledger.inventory().gpu(&GpuRef::new(&engine.machine, *i)))
            .map(|g| g.total)
            .min()?;
        held = held.max(BasisPoints::ratio_up(bytes, total));
        held_bytes = held_bytes.max(bytes);
    }
    Some(Asleep {
        held: Some(held),
        held_bytes: Some(held_bytes),
        host_bytes,
        ..*asleep
    })
}

#[cfg(test)]
mod tests;
