//! The Models tab's rows: each deployed model with its engines' states and, for one loaded on demand,
//! whether it is loaded. The engine states live here too, as the Models tab is where they are worded.

use placement::{BasisPoints, GpuRef};
use serde::{Deserialize, Serialize};

/// Where an engine is in its life, as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineState {
    /// Started, not yet answering its health check.
    Starting,
    /// Answering its health check: it can serve.
    Healthy,
    /// Running, but its health checks fail.
    Unhealthy,
    /// About to stop: out of the gateway's rotation, finishing its requests in flight (up to the drain
    /// grace) before it is stopped.
    Draining,
    /// Exited; waiting out its backoff before it starts again.
    Restarting,
    /// Running, asleep: its weights in host memory, out of the gateway's rotation until a request wakes
    /// it (an on-demand model past its keep-alive).
    Asleep,
    /// Not running, as wanted (or on a machine Tessera cannot start engines on).
    Stopped,
    /// Not running, against what was wanted: its start failed, or it failed too often in a row.
    Failed,
}

impl EngineState {
    /// The word the Models tab shows.
    pub fn label(self) -> &'static str {
        match self {
            EngineState::Starting => "Starting",
            EngineState::Healthy => "Serving",
            EngineState::Unhealthy => "Unhealthy",
            EngineState::Draining => "Draining",
            EngineState::Restarting => "Restarting",
            EngineState::Asleep => "Asleep",
            EngineState::Stopped => "Stopped",
            EngineState::Failed => "Failed",
        }
    }

    /// Its CSS class.
    pub fn css_class(self) -> &'static str {
        match self {
            EngineState::Starting => "starting",
            EngineState::Healthy => "serving",
            EngineState::Unhealthy => "unhealthy",
            EngineState::Draining => "draining",
            EngineState::Restarting => "restarting",
            EngineState::Asleep => "asleep",
            EngineState::Stopped => "stopped",
            EngineState::Failed => "failed",
        }
    }

    /// How much the state needs an operator's eye: the row shows its worst engine.
    pub fn concern(self) -> u8 {
        match self {
            EngineState::Healthy | EngineState::Asleep => 0,
            EngineState::Starting => 1,
            EngineState::Draining | EngineState::Restarting => 2,
            EngineState::Stopped => 3,
            EngineState::Unhealthy => 4,
            EngineState::Failed => 5,
        }
    }
}

/// One engine of a model: the model runs one per machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineLine {
    /// The machine it runs on.
    pub machine: String,
    /// Its state.
    pub status: EngineState,
    /// Why it is not as wanted.
    pub message: Option<String>,
    /// How many times it was started again since it was placed: after a crash, a failed health check.
    #[serde(default)]
    pub restarts: u32,
    /// How Tessera sized it to its share (llama.cpp's context), and why.
    #[serde(default)]
    pub sizing: Option<String>,
}

/// A row of the Models tab: a deployed model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRow {
    /// The catalog model.
    pub name: String,
    /// The sharing group it runs in; `None` for a model on whole GPUs.
    pub group: Option<String>,
    /// Its share of one GPU, in a group.
    pub share: Option<BasisPoints>,
    /// How many whole GPUs it takes on each node, outside any group.
    pub whole_gpus: Option<u32>,
    /// The nodes it runs on.
    pub nodes: Vec<String>,
    /// Its engines.
    pub engines: Vec<EngineLine>,
    /// A system member (the semantic router): its share is not editable and it is not removed here.
    pub system: bool,
    /// The revision a change must name: its group's, or its own outside a group.
    pub revision: i64,
    /// For a model loaded on demand: whether it is loaded, when it was last used, its last cold start.
    #[serde(default)]
    pub on_demand: Option<OnDemand>,
    /// For a model whose replicas follow its load: how many, where, and the last decisions.
    #[serde(default)]
    pub replicas: Option<Replicas>,
    /// Why it is flagged as slowed by its neighbours, if it is (seed 002's interference alarm).
    #[serde(default)]
    pub slowed: Option<String>,
    /// Whether the driver holds it to its share on every GPU of its group (MPS); otherwise the share is a
    /// promise its engine keeps by sizing itself.
    #[serde(default)]
    pub share_enforced: bool,
    /// Why it is flagged as using more GPU memory than its share, if it is (a promise broken).
    #[serde(default)]
    pub over_share: Option<String>,
    /// The most its engines were measured to hold of the share they hold now, on its fullest GPU.
    #[serde(default)]
    pub peak: Option<placement::rightsize::Peak>,
    /// Requests the gateway carried for it this clock hour.
    #[serde(default)]
    pub hour_requests: u64,
    /// Of those, the ones that failed (no engine ready, or an error status from the engine).
    #[serde(default)]
    pub hour_failed: u64,
}

/// A model's own page: its row of the Models tab, the other models it shares its GPUs with, its engine's
/// last log lines, and the steps of its group's last change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelPage {
    /// The model as the Models tab shows it: engines, share, restarts, errors, flags.
    pub row: ModelRow,
    /// The other members of its group: its neighbours on its GPUs.
    pub neighbours: Vec<String>,
    /// The last log lines of its engine most able to serve, secrets redacted for all but admins.
    pub logs: Vec<String>,
    /// Which engine those lines are from and how it is: `on atlas: Serving`.
    pub log_engine: Option<String>,
    /// Its group's last plan change, step by step, done or not.
    pub change: Option<super::PlanProgress>,
}

/// Whether an on-demand model is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LoadState {
    /// No engine: the next request loads it.
    NotLoaded,
    /// Loaded for a request; its engine is not ready yet.
    Loading,
    /// Its engine serves.
    Loaded,
    /// Its engine sleeps (its weights in host memory): the next request wakes it.
    Asleep,
}

impl LoadState {
    /// The word the Models tab shows.
    pub fn label(self) -> &'static str {
        match self {
            LoadState::NotLoaded => "not loaded",
            LoadState::Loading => "loading",
            LoadState::Loaded => "loaded",
            LoadState::Asleep => "asleep",
        }
    }
}

/// How an on-demand model is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OnDemand {
    /// How long it stays loaded with no request, seconds.
    pub keep_alive_s: u32,
    /// Loaded or not.
    pub state: LoadState,
    /// When a request last began or ended for it (RFC 3339), since the server started.
    pub last_used: Option<String>,
    /// Its last cold start: the load itself, from its engine's start to its first answered health check,
    /// in milliseconds.
    pub cold_start_ms: Option<u64>,
    /// What the request that loaded it waited before that load began (for room, and for the models that
    /// made way to stop), in milliseconds.
    #[serde(default)]
    pub cold_wait_ms: Option<u64>,
    /// Where its engine can sleep (vLLM's or SGLang's sleep mode): how long it stays asleep with no
    /// request before its engine is stopped, seconds. Past its keep-alive it is put to sleep, not stopped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_asleep_s: Option<u64>,
    /// Asleep: since when (RFC 3339), and what it keeps on each of its GPUs, in bytes, once measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asleep: Option<AsleepView>,
    /// Its last wake from sleep, from the request that woke it to its first answer, in milliseconds.
    #[serde(default)]
    pub last_wake_ms: Option<u64>,
    /// Why its last wake fell back to a cold start, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fell_back: Option<String>,
}

/// An on-demand model asleep.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsleepView {
    /// Since when, RFC 3339.
    pub since: String,
    /// What it keeps on each of its GPUs asleep, in bytes, measured once it slept; none until then (or
    /// where it cannot be measured: a cluster's node), when it is held its whole share.
    pub held_bytes: Option<u64>,
    /// What its sleep freed on its GPUs, in bytes: the most it keeps in its machine's memory (its
    /// weights), once measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_bytes: Option<u64>,
}

/// A scale decision carried out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScaleEvent {
    /// When, RFC 3339.
    pub at: String,
    /// Replicas before.
    pub from: u32,
    /// Replicas after.
    pub to: u32,
    /// Why, in words.
    pub why: String,
}

/// The replicas of a model whose number follows its load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replicas {
    /// The fewest.
    pub min: u32,
    /// The most.
    pub max: u32,
    /// Requests in flight per replica it aims for.
    pub target: u32,
    /// Placed now: serving or starting (a replica being removed drains uncounted).
    pub running: u32,
    /// What the last decision asked for.
    pub desired: u32,
    /// Asked for and not placed: no GPU of its group has the room.
    pub pending: u32,
    /// Why each is pending, per GPU.
    #[serde(skip_serializing_if = "Vec::is_empty", default)]
    pub pending_reasons: Vec<String>,
    /// The GPUs its replicas are on, one each.
    pub gpus: Vec<GpuRef>,
    /// The last decisions carried out, newest first.
    pub decisions: Vec<ScaleEvent>,
}

impl Replicas {
    /// The Models tab's line: `Replicas by load, 1 to 3 (target 1): 2 running; 1 waiting for room (GPU 0
    /// of twin: …); last 1 → 2 at …: why.`
    pub fn line(&self) -> String {
        let mut line = format!(
            "Replicas by load, {} to {} (target {}): {} running",
            self.min, self.max, self.target, self.running
        );
        if self.running == 0 && self.pending == 0 {
            line.push_str("; the next request starts one");
        }
        if self.pending > 0 {
            line.push_str(&format!(
                "; {} waiting for room ({})",
                self.pending,
                self.pending_reasons.join("; ")
            ));
        }
        if let Some(last) = self.decisions.first() {
            line.push_str(&format!(
                "; last {} → {} at {}: {}",
                last.from, last.to, last.at, last.why
            ));
        }
        line.push('.');
        line
    }
}

/// What came of saving a model's replicas on its page.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicasSaved {
    /// Its replicas now; none where it runs without them.
    pub replicas: Option<Replicas>,
    /// Whether its engines restart: it took replicas or gave them up.
    pub restarts: bool,
    /// Loaded on-demand members of its group that no longer fitted beside it, unloaded.
    pub unloaded: Vec<String>,
    /// Its group's plan, judged again, is over 90 % (it did not block).
    pub warning: Option<String>,
    /// Replicas of its group's members that do not fit now and wait for room.
    pub waits: Vec<String>,
}

impl ReplicasSaved {
    /// `Saved: 1 to 3; no engine restarted.`, or how its engines change.
    pub fn line(&self) -> String {
        let mut line = match (&self.replicas, self.restarts) {
            (Some(r), false) => format!("Saved: {} to {}; no engine restarted.", r.min, r.max),
            (Some(r), true) => format!(
                "Saved: {} to {}; its engines restart, one on each GPU a replica is placed on.",
                r.min, r.max
            ),
            (None, true) => {
                "Saved: no replicas; its engines restart, one on each machine of its group."
                    .to_owned()
            }
            (None, false) => "Saved: it runs without replicas, as it did.".to_owned(),
        };
        if !self.unloaded.is_empty() {
            line.push_str(&format!(
                " Unloaded to make room: {}.",
                self.unloaded.join(", ")
            ));
        }
        for said in self.warning.iter().chain(&self.waits) {
            line.push(' ');
            line.push_str(said);
        }
        line
    }
}

impl OnDemand {
    /// The Models tab's line: `On demand, unloaded after 300 s idle: loaded; last used …; last cold start
    /// 1.2 s.`
    pub fn line(&self) -> String {
        let mut line = match self.keep_asleep_s {
            Some(asleep) => format!(
                "On demand, asleep after {} s idle and unloaded after {asleep} s asleep: {}",
                self.keep_alive_s,
                self.state.label()
            ),
            None => format!(
                "On demand, unloaded after {} s idle: {}",
                self.keep_alive_s,
                self.state.label()
            ),
        };
        let seconds = |ms: u64| format!("{}.{} s", ms / 1000, ms % 1000 / 100);
        if let Some(asleep) = &self.asleep {
            line.push_str(&format!(" since {}", asleep.since));
            match asleep.held_bytes {
                Some(bytes) => line.push_str(&format!(
                    ", keeping {:.1} GB of each GPU",
                    bytes as f64 / 1e9
                )),
                None => line.push_str(", holding its share until what it keeps is measured"),
            }
            if let Some(bytes) = asleep.host_bytes {
                line.push_str(&format!(
                    " and up to {:.1} GB of its machine's memory",
                    bytes as f64 / 1e9
                ));
            }
        }
        if let Some(at) = &self.last_used {
            line.push_str(&format!("; last used {at}"));
        }
        if let Some(ms) = self.last_wake_ms {
            line.push_str(&format!("; last wake {}", seconds(ms)));
        }
        if let Some(why) = &self.fell_back {
            line.push_str(&format!("; its last wake fell back to a cold start: {why}"));
        }
        if let Some(ms) = self.cold_start_ms {
            line.push_str(&format!("; last cold start {}", seconds(ms)));
            if let Some(waited) = self.cold_wait_ms.filter(|&w| w >= 100) {
                line.push_str(&format!(", after {} waiting for its turn", seconds(waited)));
            }
        }
        line.push('.');
        line
    }
}

impl super::Page<ModelRow> {
    /// Page `page` (from 1; past the last is the last) of `rows` whose model, group or node holds
    /// `search` (any case), in their order.
    pub fn models(rows: Vec<ModelRow>, search: &str, page: usize) -> super::Page<ModelRow> {
        let found = |r: &ModelRow| {
            super::holds(&r.name, search)
                || r.group.as_deref().is_some_and(|g| super::holds(g, search))
                || r.nodes.iter().any(|n| super::holds(n, search))
        };
        super::Page::of(rows, found, page)
    }
}

impl ModelRow {
    /// Its engines' restarts after a failure, all together.
    pub fn restarts(&self) -> u32 {
        self.engines.iter().map(|e| e.restarts).sum()
    }

    /// The Errors column: `3 of 120 (2.5%)` this hour, `—` with no request.
    pub fn errors_text(&self) -> String {
        if self.hour_requests == 0 {
            return "—".to_owned();
        }
        format!(
            "{} of {} ({:.1}%)",
            self.hour_failed,
            self.hour_requests,
            self.hour_failed as f64 * 100.0 / self.hour_requests as f64
        )
    }

    /// The Memory column: the most its engines held on one GPU against the share they hold there
    /// (`11 of 9.6 GB`), `—` before a reading; whether that peak is past the share.
    pub fn memory_text(&self) -> (String, bool) {
        match &self.peak {
            Some(p) => (
                format!("{} of {}", p.peak.size_text(), p.share.size_text()),
                p.peak > p.share,
            ),
            None => ("—".to_owned(), false),
        }
    }

    /// The health chip: `2/2 healthy`.
    pub fn health(&self) -> String {
        let healthy = self
            .engines
            .iter()
            .filter(|e| e.status == EngineState::Healthy)
            .count();
        format!("{healthy}/{} healthy", self.engines.len())
    }

    /// What Tessera chose to fit each engine to its share (llama.cpp's context), once per choice, with the
    /// machine where the engines chose differently.
    pub fn sizing(&self) -> Vec<String> {
        let mut lines: Vec<(&str, &str)> = self
            .engines
            .iter()
            .filter_map(|e| Some((e.machine.as_str(), e.sizing.as_deref()?)))
            .collect();
        lines.sort_by_key(|&(machine, note)| (note, machine));
        lines.dedup_by_key(|&mut (_, note)| note);
        let one = lines.len() == 1;
        lines
            .into_iter()
            .map(|(machine, note)| {
                if one {
                    format!("Sized: {note}")
                } else {
                    format!("Sized on {machine}: {note}")
                }
            })
            .collect()
    }

    /// The state of its worst engine (`Serving` when every engine is healthy), with why.
    pub fn state(&self) -> (EngineState, Option<String>) {
        let idle = self
            .on_demand
            .as_ref()
            .filter(|o| o.state == LoadState::NotLoaded)
            .map(|_| "not loaded: the next request loads it".to_owned());
        self.engines
            .iter()
            .max_by_key(|e| e.status.concern())
            .map(|e| (e.status, e.message.clone()))
            .unwrap_or((EngineState::Stopped, idle))
    }

    /// The Share column: `40%` in a group, `2 whole GPUs` outside one.
    pub fn share_text(&self) -> String {
        match (self.share, self.whole_gpus) {
            (Some(share), _) => share.to_string(),
            (None, Some(1)) => "1 whole GPU".to_owned(),
            (None, Some(n)) => format!("{n} whole GPUs"),
            (None, None) => "—".to_owned(),
        }
    }
}

#[cfg(test)]
impl ModelRow {
    /// `name` at 40 % in text-router on atlas, an engine in each of `engines`' states: for tests.
    pub(crate) fn testing(name: &str, engines: &[EngineState]) -> ModelRow {
        ModelRow {
            name: name.into(),
            group: Some("text-router".into()),
            share: Some(BasisPoints::percent(40)),
            whole_gpus: None,
            nodes: vec!["atlas".into()],
            engines: engines
                .iter()
                .map(|s| EngineLine {
                    machine: "atlas".into(),
                    status: *s,
                    message: None,
                    restarts: 0,
                    sizing: None,
                })
                .collect(),
            system: false,
            revision: 1,
            on_demand: None,
            replicas: None,
            slowed: None,
            over_share: None,
            peak: None,
            share_enforced: false,
            hour_requests: 0,
            hour_failed: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::Page;

    fn row(engines: &[EngineState]) -> ModelRow {
        ModelRow::testing("glm-5.3", engines)
    }

    #[test]
    fn a_row_counts_its_engines_restarts_and_this_hour_s_failed_requests() {
        let mut r = row(&[EngineState::Healthy, EngineState::Restarting]);
        r.engines[0].restarts = 2;
        r.engines[1].restarts = 4;
        assert_eq!(r.restarts(), 6);
        assert_eq!(r.errors_text(), "—");
        r.hour_requests = 120;
        r.hour_failed = 3;
        assert_eq!(r.errors_text(), "3 of 120 (2.5%)");
    }

    #[test]
    fn the_models_tab_finds_a_model_by_its_name_group_or_node_and_pages_the_rest() {
        let rows: Vec<ModelRow> = (0..3750)
            .map(|i| ModelRow::testing(&format!("model-{i:04}"), &[EngineState::Healthy]))
            .collect();
        let first = Page::models(rows.clone(), "", 1);
        assert_eq!(
            (first.rows.len(), first.matching, first.pages),
            (50, 3750, 75)
        );
        let found = Page::models(rows.clone(), " MODEL-3749 ", 1);
        assert_eq!(
            (found.matching, found.rows[0].name.as_str()),
            (1, "model-3749")
        );
        let by_group = Page::models(rows.clone(), "text-router", 2);
        assert_eq!((by_group.matching, by_group.page), (3750, 2));
        let by_node = Page::models(rows.clone(), "ATLAS", 1);
        assert_eq!(by_node.matching, 3750);
        assert_eq!(Page::models(rows, "nowhere", 1).matching, 0);
    }

    #[test]
    fn the_memory_column_says_the_peak_against_the_share_and_whether_it_is_past_it() {
        let mut r = row(&[EngineState::Healthy]);
        assert_eq!(r.memory_text(), ("—".to_owned(), false));
        let peak = |gb: u64| placement::rightsize::Peak {
            peak: placement::Bytes::gb(gb),
            share: placement::Bytes::gb(10),
            gpu_total: placement::Bytes::gb(80),
            observed_ms: 60_000,
            fills_share: false,
        };
        r.peak = Some(peak(7));
        assert_eq!(r.memory_text(), ("7 GB of 10 GB".to_owned(), false));
        r.peak = Some(peak(11));
        assert_eq!(r.memory_text(), ("11 GB of 10 GB".to_owned(), true));
    }

    #[test]
    fn what_tessera_chose_to_fit_a_share_is_said_once_and_per_machine_only_where_machines_differ() {
        let mut r = row(&[
            EngineState::Healthy,
            EngineState::Healthy,
            EngineState::Healthy,
        ]);
        assert!(r.sizing().is_empty());
        for (e, machine) in r.engines.iter_mut().zip(["atlas", "majin", "vega"]) {
            e.machine = machine.into();
            e.sizing = Some("context 8192 × 1 slot".into());
        }
        assert_eq!(r.sizing(), ["Sized: context 8192 × 1 slot"]);
        r.engines[2].sizing = Some("context 4096 × 1 slot".into());
        assert_eq!(
            r.sizing(),
            [
                "Sized on vega: context 4096 × 1 slot",
                "Sized on atlas: context 8192 × 1 slot"
            ]
        );
    }

    #[test]
    fn an_on_demand_model_says_whether_it_is_loaded_when_it_was_used_and_its_last_cold_start() {
        let mut r = row(&[]);
        r.on_demand = Some(OnDemand {
            keep_alive_s: 300,
            state: LoadState::NotLoaded,
            last_used: None,
            cold_start_ms: None,
            cold_wait_ms: None,
            keep_asleep_s: None,
            asleep: None,
            last_wake_ms: None,
            fell_back: None,
        });
        assert_eq!(
            r.state(),
            (
                EngineState::Stopped,
                Some("not loaded: the next request loads it".to_owned())
            )
        );
        assert_eq!(
            r.on_demand.as_ref().unwrap().line(),
            "On demand, unloaded after 300 s idle: not loaded."
        );
        let loaded = OnDemand {
            keep_alive_s: 60,
            state: LoadState::Loaded,
            last_used: Some("2026-12-04T03:10:00Z".into()),
            cold_start_ms: Some(1_234),
            cold_wait_ms: Some(40),
            keep_asleep_s: None,
            asleep: None,
            last_wake_ms: None,
            fell_back: None,
        };
        assert_eq!(
            loaded.line(),
            "On demand, unloaded after 60 s idle: loaded; last used 2026-12-04T03:10:00Z; last cold start 1.2 s."
        );
        let after_a_wait = OnDemand {
            cold_start_ms: Some(300),
            cold_wait_ms: Some(2_900),
            ..loaded.clone()
        };
        assert_eq!(
            after_a_wait.line(),
            "On demand, unloaded after 60 s idle: loaded; last used 2026-12-04T03:10:00Z; last cold start 0.3 s, after 2.9 s waiting for its turn."
        );
        let asleep = OnDemand {
            keep_asleep_s: Some(3600),
            state: LoadState::Asleep,
            asleep: Some(AsleepView {
                since: "2026-12-04T03:11:00Z".into(),
                held_bytes: Some(1_200_000_000),
                host_bytes: Some(30_900_000_000),
            }),
            last_wake_ms: Some(420),
            ..loaded
        };
        assert_eq!(
            asleep.line(),
            "On demand, asleep after 60 s idle and unloaded after 3600 s asleep: asleep since 2026-12-04T03:11:00Z, keeping 1.2 GB of each GPU and up to 30.9 GB of its machine's memory; last used 2026-12-04T03:10:00Z; last wake 0.4 s; last cold start 1.2 s."
        );
    }

    #[test]
    fn the_health_chip_counts_healthy_engines() {
        let r = row(&[EngineState::Healthy, EngineState::Starting]);
        assert_eq!(r.health(), "1/2 healthy");
        assert_eq!(r.state().0, EngineState::Starting);
        assert_eq!(row(&[EngineState::Healthy; 2]).state().0.label(), "Serving");
        assert_eq!(
            row(&[EngineState::Restarting, EngineState::Failed])
                .state()
                .0,
            EngineState::Failed
        );
    }

    #[test]
    fn a_saved_replicas_line_says_whether_the_engines_restart_and_what_the_plan_warns() {
        let replicas = Replicas {
            min: 1,
            max: 2,
            target: 1,
            running: 1,
            desired: 1,
            pending: 0,
            pending_reasons: Vec::new(),
            gpus: Vec::new(),
            decisions: Vec::new(),
        };
        let saved = |replicas: Option<Replicas>, restarts: bool| ReplicasSaved {
            replicas,
            restarts,
            unloaded: Vec::new(),
            warning: None,
            waits: Vec::new(),
        };
        assert_eq!(
            saved(Some(replicas.clone()), false).line(),
            "Saved: 1 to 2; no engine restarted."
        );
        assert_eq!(
            saved(None, true).line(),
            "Saved: no replicas; its engines restart, one on each machine of its group."
        );
        let gave_up = ReplicasSaved {
            unloaded: vec!["vision".to_owned()],
            ..saved(None, true)
        };
        assert_eq!(
            gave_up.line(),
            "Saved: no replicas; its engines restart, one on each machine of its group. Unloaded to make room: vision."
        );
        let took = ReplicasSaved {
            waits: vec!["vision: 1 of its 2 replicas fits now; the other one waits for room: GPU 0 of west: 70 of 80 GB taken by shared work; it needs 16".to_owned()],
            ..saved(Some(replicas), true)
        };
        assert_eq!(
            took.line(),
            "Saved: 1 to 2; its engines restart, one on each GPU a replica is placed on. vision: 1 of its 2 replicas fits now; the other one waits for room: GPU 0 of west: 70 of 80 GB taken by shared work; it needs 16"
        );
    }
}
