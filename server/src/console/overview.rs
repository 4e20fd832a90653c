//! The Overview page: the fleet's GPUs and memory summed from the machine views, the models counted by
//! state from the Models tab's rows, the gateway's last clock hour, and every open alarm with the page
//! where it is dealt with.

use super::ConsoleService;
use crate::error::ApiError;
use crate::fleet::MachineView;
use app::views::{Alarm, AlarmKind, EngineState, LoadState, ModelRow, Overview};
use placement::usage::HOUR_MS;
use placement::Bytes;

/// The GPU figures of `machines`: how many, and what their memory is doing.
#[derive(Debug, Default, PartialEq, Eq)]
struct Figures {
    gpus: u32,
    free_gpus: u32,
    total: Bytes,
    shared: Bytes,
    whole: Bytes,
    outside: Bytes,
    free: Bytes,
    stranded: Bytes,
}

/// Sums the machines' GPUs.
fn figures(machines: &[MachineView]) -> Figures {
    let mut f = Figures::default();
    for gpu in machines.iter().flat_map(|m| &m.gpus) {
        // A GPU cut into MIG instances counts once, here; its memory is its instances'.
        if matches!(gpu.mig, Some(placement::MigRole::Cut)) {
            f.gpus += 1;
            continue;
        }
        let total = Bytes(gpu.total_bytes);
        let offered = Bytes(gpu.offered_bytes);
        let taken = Bytes(gpu.taken_bytes);
        f.total += total;
        f.outside += Bytes(gpu.held_outside_bytes);
        // An instance is a part of a GPU, not one more.
        if !matches!(gpu.mig, Some(placement::MigRole::Instance { .. })) {
            f.gpus += 1;
        }
        match &gpu.held_by {
            Some(_) => f.whole += total,
            None => {
                f.shared += taken;
                let free = offered.saturating_sub(taken);
                f.free += free;
                if taken == Bytes::ZERO {
                    f.free_gpus += 1;
                } else {
                    f.stranded += free;
                }
            }
        }
    }
    f
}

/// How many of `rows` serve, load, wait to be loaded, or fail.
fn model_states(rows: &[ModelRow]) -> (u32, u32, u32, u32) {
    let (mut serving, mut loading, mut idle, mut failing) = (0, 0, 0, 0);
    for row in rows {
        let not_loaded = row
            .on_demand
            .as_ref()
            .is_some_and(|o| o.state == LoadState::NotLoaded);
        match row.state().0 {
            EngineState::Failed | EngineState::Unhealthy => failing += 1,
            _ if not_loaded => idle += 1,
            EngineState::Healthy => serving += 1,
            _ => loading += 1,
        }
    }
    (serving, loading, idle, failing)
}

/// The alarm a Ray cluster that does not answer raises: nothing there changes until it does.
fn cluster_alarm(status: Option<crate::fleet::cluster::ClusterStatus>) -> Vec<Alarm> {
    let Some(status) = status.filter(|s| !s.up) else {
        return Vec::new();
    };
    let since = crate::fleet::usage::rfc3339(status.since_ms).unwrap_or_default();
    vec![Alarm {
        kind: AlarmKind::ClusterDown,
        line: format!(
            "The Ray cluster does not answer since {since}{}. Its machines are shown as last read, and \
             nothing starts or stops there until it answers.",
            status.error.map_or_else(String::new, |e| format!(": {e}"))
        ),
        href: "/nodes".to_owned(),
    }]
}

/// The alarms the machine views raise: unreachable machines, GPUs over-committed or unhealthy, engines
/// past their shares.
fn machine_alarms(machines: &[MachineView]) -> Vec<Alarm> {
    let mut alarms = Vec::new();
    for m in machines {
        let href = format!("/machines/{}", m.name);
        if let Some(since) = &m.unreachable_since {
            alarms.push(Alarm {
                kind: AlarmKind::Unreachable,
                line: format!("{} is unreachable since {since}.", m.name),
                href: href.clone(),
            });
        }
        for gpu in &m.gpus {
            let on = format!("GPU {} of {}", gpu.index, m.name);
            if let Some(why) = &gpu.overcommitted {
                alarms.push(Alarm {
                    kind: AlarmKind::Overcommitted,
                    line: format!("{on}: {why}"),
                    href: href.clone(),
                });
            }
            if let Some(why) = &gpu.problem {
                alarms.push(Alarm {
                    kind: AlarmKind::Unhealthy,
                    line: format!("{on} is unhealthy: {why}"),
                    href: href.clone(),
                });
            }
            for sharer in &gpu.sharers {
                if let Some(line) = &sharer.over_share {
                    alarms.push(Alarm {
                        kind: AlarmKind::OverShare,
                        line: line.clone(),
                        href: href.clone(),
                    });
                }
            }
        }
    }
    alarms
}

/// The alarms the models raise: engines that failed, models slowed by their neighbours.
fn model_alarms(rows: &[ModelRow]) -> Vec<Alarm> {
    let mut alarms = Vec::new();
    for row in rows {
        for engine in &row.engines {
            if engine.status == EngineState::Failed {
                alarms.push(Alarm {
                    kind: AlarmKind::Failed,
                    line: format!(
                        "{}'s engine on {} failed{}",
                        row.name,
                        engine.machine,
                        engine
                            .message
                            .as_deref()
                            .map_or_else(|| ".".to_owned(), |m| format!(": {m}"))
                    ),
                    href: "/models".to_owned(),
                });
            }
        }
        if let Some(line) = &row.slowed {
            alarms.push(Alarm {
                kind: AlarmKind::Slowed,
                line: line.clone(),
                href: "/models".to_owned(),
            });
        }
    }
    alarms
}

impl ConsoleService {
    pub(super) async fn overview_page(&self) -> Result<Overview, ApiError> {
        let machines = self.fleet.machines();
        let rows = self.model_rows();
        let f = figures(&machines);
        let (serving, loading, idle, failing) = model_states(&rows);
        let now = crate::fleet::usage::now_ms();
        let since = now - now % HOUR_MS;
        let calls = self
            .fleet
            .calls()
            .report(&self.pool, since, now + 1)
            .await?;
        let mut alarms = cluster_alarm(self.fleet.cluster_status());
        alarms.extend(machine_alarms(&machines));
        alarms.extend(model_alarms(&rows));
        alarms.sort_by_key(|a| a.kind);
        Ok(Overview {
            machines: machines.len() as u32,
            unreachable: machines
                .iter()
                .filter(|m| m.unreachable_since.is_some())
                .count() as u32,
            gpus: f.gpus,
            free_gpus: f.free_gpus,
            total: f.total,
            shared: f.shared,
            whole: f.whole,
            outside: f.outside,
            free: f.free,
            stranded: f.stranded,
            models: rows.len() as u32,
            serving,
            loading,
            idle,
            failing,
            requests: calls.iter().map(|c| c.requests).sum(),
            failed_requests: calls.iter().map(|c| c.failed).sum(),
            since: crate::fleet::usage::rfc3339(since).unwrap_or_default(),
            alarms,
        })
    }
}
