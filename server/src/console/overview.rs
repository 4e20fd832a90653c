//! The Overview page: the fleet's GPUs and memory summed from the machine views, the models counted by
//! state from the Models tab's rows, the gateway's last clock hour, and every open alarm with the page
//! where it is dealt with.

use super::ConsoleService;
use crate::error::ApiError;
use crate::fleet::{MachineView, WorkerView};
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
            .is_some_and(|o| matches!(o.state, LoadState::NotLoaded | LoadState::Asleep));
        match row.state().0 {
            // Stopped where it should serve: as much a fault as a failure, never "loading".
            EngineState::Failed | EngineState::Unhealthy | EngineState::Stopped => failing += 1,
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
            if !gpu.healthy || gpu.problem.is_some() {
                let why = gpu.problem.as_deref().unwrap_or("its reading says so");
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

/// Restarts of one engine from which it is said to keep restarting.
const RESTARTS_ALARM: u32 = 3;

/// The share of the gateway's requests this hour that, failing, raises an alarm: a tenth, of at least
/// [`GATEWAY_ALARM_REQUESTS`].
const GATEWAY_ALARM_PERCENT: u64 = 10;

/// The fewest requests in an hour whose failures raise an alarm: one failure of three is no trend.
const GATEWAY_ALARM_REQUESTS: u64 = 20;

/// The alarm the gateway's hour raises where a tenth or more of its requests failed.
fn gateway_alarm(requests: u64, failed: u64) -> Option<Alarm> {
    (requests >= GATEWAY_ALARM_REQUESTS && failed * 100 >= requests * GATEWAY_ALARM_PERCENT).then(
        || Alarm {
            kind: AlarmKind::GatewayErrors,
            line: format!(
                "{failed} of the gateway's {requests} requests this hour failed ({} %).",
                failed * 100 / requests
            ),
            href: "/usage".to_owned(),
        },
    )
}

/// The alarms the models raise: engines that failed, keep restarting or are stopped where they should
/// serve, models slowed by their neighbours; each links to the model's own page.
fn model_alarms(rows: &[ModelRow]) -> Vec<Alarm> {
    let mut alarms = Vec::new();
    for row in rows {
        let href = format!("/models/{}", row.name);
        let not_loaded = row
            .on_demand
            .as_ref()
            .is_some_and(|o| matches!(o.state, LoadState::NotLoaded | LoadState::Asleep));
        for engine in &row.engines {
            let why = engine
                .message
                .as_deref()
                .map_or_else(|| ".".to_owned(), |m| format!(": {m}"));
            if engine.status == EngineState::Stopped && !not_loaded {
                alarms.push(Alarm {
                    kind: AlarmKind::Stopped,
                    line: format!(
                        "{}'s engine on {} is stopped{why}",
                        row.name, engine.machine
                    ),
                    href: href.clone(),
                });
            }
            if engine.status != EngineState::Failed && engine.restarts >= RESTARTS_ALARM {
                alarms.push(Alarm {
                    kind: AlarmKind::Restarting,
                    line: format!(
                        "{}'s engine on {} has been started again {} times{}",
                        row.name,
                        engine.machine,
                        engine.restarts,
                        engine
                            .message
                            .as_deref()
                            .map_or_else(|| ".".to_owned(), |m| format!("; now: {m}"))
                    ),
                    href: href.clone(),
                });
            }
            if engine.status == EngineState::Failed {
                alarms.push(Alarm {
                    kind: AlarmKind::Failed,
                    line: format!("{}'s engine on {} failed{why}", row.name, engine.machine),
                    href: href.clone(),
                });
            }
        }
        if let Some(line) = &row.slowed {
            alarms.push(Alarm {
                kind: AlarmKind::Slowed,
                line: line.clone(),
                href: href.clone(),
            });
        }
    }
    alarms
}

/// The alarms waiting workers raise: each with its first reason, linked to its model's page where it runs
/// one, else to the nodes, where the room it needs is seen.
fn waiting_alarms(pending: &[WorkerView]) -> Vec<Alarm> {
    pending
        .iter()
        .map(|w| {
            let why = match w.pending_reasons.as_slice() {
                [] => ".".to_owned(),
                [one] => format!(": {one}"),
                [first, rest @ ..] => format!(
                    ": {first} (and {} more {})",
                    rest.len(),
                    if rest.len() == 1 { "reason" } else { "reasons" }
                ),
            };
            Alarm {
                kind: AlarmKind::Waiting,
                line: format!("{} waits for room{why}", w.name),
                href: w
                    .model
                    .as_ref()
                    .map_or_else(|| "/nodes".to_owned(), |m| format!("/models/{m}")),
            }
        })
        .collect()
}

/// The alarms replicas that wait for room raise: one per model, with the first machine's reason, linked
/// to the model's page.
fn replica_alarms(rows: &[ModelRow]) -> Vec<Alarm> {
    rows.iter()
        .filter_map(|row| {
            let replicas = row.replicas.as_ref().filter(|r| r.pending > 0)?;
            let waits = match replicas.pending {
                1 => "1 replica waits".to_owned(),
                n => format!("{n} replicas wait"),
            };
            let why = replicas
                .pending_reasons
                .first()
                .map_or_else(|| ".".to_owned(), |r| format!(": {r}"));
            Some(Alarm {
                kind: AlarmKind::Waiting,
                line: format!("{}: {waits} for room{why}", row.name),
                href: format!("/models/{}", row.name),
            })
        })
        .collect()
}

/// Alarms of one kind shown one by one; past these, one line counts the rest: on a bad day a fleet of
/// thousands raises thousands, and the page must still load and be read.
const ALARMS_PER_KIND: usize = 5;

/// The page that lists every alarm of `kind` where they are folded into a count.
fn page_of(kind: AlarmKind) -> &'static str {
    match kind {
        AlarmKind::Failed
        | AlarmKind::Restarting
        | AlarmKind::Stopped
        | AlarmKind::OverShare
        | AlarmKind::Slowed => "/models",
        AlarmKind::GatewayErrors => "/usage",
        AlarmKind::ClusterDown
        | AlarmKind::Unreachable
        | AlarmKind::Overcommitted
        | AlarmKind::Waiting
        | AlarmKind::Unhealthy => "/nodes",
    }
}

/// `alarms`, sorted worst first, with each kind past [`ALARMS_PER_KIND`] folded into a line that counts
/// the rest.
fn folded(mut alarms: Vec<Alarm>) -> Vec<Alarm> {
    alarms.sort_by_key(|a| a.kind);
    let mut shown: Vec<Alarm> = Vec::new();
    for chunk in alarms.chunk_by(|a, b| a.kind == b.kind) {
        shown.extend(chunk.iter().take(ALARMS_PER_KIND).cloned());
        if chunk.len() > ALARMS_PER_KIND {
            let kind = chunk[0].kind;
            shown.push(Alarm {
                kind,
                line: format!(
                    "{} more alarms of this kind ({}).",
                    chunk.len() - ALARMS_PER_KIND,
                    kind.label()
                ),
                href: page_of(kind).to_owned(),
            });
        }
    }
    shown
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
        alarms.extend(waiting_alarms(&self.fleet.pending_workers()));
        alarms.extend(replica_alarms(&rows));
        let (requests, failed) = (
            calls.iter().map(|c| c.requests).sum(),
            calls.iter().map(|c| c.failed).sum(),
        );
        alarms.extend(gateway_alarm(requests, failed));
        let alarm_count = alarms.len() as u32;
        let alarms = folded(alarms);
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
            requests,
            failed_requests: failed,
            since: crate::fleet::usage::rfc3339(since).unwrap_or_default(),
            alarms,
            alarm_count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use app::views::EngineLine;
    use placement::BasisPoints;

    fn row(name: &str, status: EngineState, restarts: u32) -> ModelRow {
        ModelRow {
            name: name.into(),
            group: Some("text-router".into()),
            share: Some(BasisPoints::percent(40)),
            whole_gpus: None,
            nodes: vec!["atlas".into()],
            engines: vec![EngineLine {
                machine: "atlas".into(),
                status,
                message: Some("exited with status 1".into()),
                restarts,
                sizing: None,
            }],
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

    #[test]
    fn a_replica_that_waits_for_room_is_an_alarm_with_its_first_reason_linked_to_its_model() {
        let mut waiting = row("vision", EngineState::Healthy, 0);
        waiting.replicas = Some(app::views::Replicas {
            min: 1,
            max: 3,
            target: 1,
            running: 1,
            desired: 3,
            pending: 2,
            pending_reasons: vec!["GPU 0 of twin: 6 GB free, a replica needs 9.6 GB".into()],
            gpus: vec![placement::GpuRef::new("atlas", 0)],
            decisions: Vec::new(),
        });
        let mut placed = row("glm-5.3", EngineState::Healthy, 0);
        placed.replicas = waiting.replicas.clone().map(|r| app::views::Replicas {
            pending: 0,
            desired: 1,
            pending_reasons: Vec::new(),
            ..r
        });
        let alarms = replica_alarms(&[waiting, placed]);
        assert_eq!(alarms.len(), 1);
        assert_eq!(alarms[0].kind, AlarmKind::Waiting);
        assert_eq!(
            alarms[0].line,
            "vision: 2 replicas wait for room: GPU 0 of twin: 6 GB free, a replica needs 9.6 GB"
        );
        assert_eq!(alarms[0].href, "/models/vision");
    }

    #[test]
    fn an_engine_that_keeps_restarting_or_is_stopped_where_it_should_serve_raises_an_alarm_and_a_stopped_one_is_not_counted_loading(
    ) {
        let rows = [
            row("glm-5.3", EngineState::Restarting, 6),
            row("speech", EngineState::Stopped, 0),
            row("emb", EngineState::Healthy, 2),
        ];
        let alarms = model_alarms(&rows);
        let said: Vec<(AlarmKind, &str)> =
            alarms.iter().map(|a| (a.kind, a.line.as_str())).collect();
        assert_eq!(
            said,
            [
                (
                    AlarmKind::Restarting,
                    "glm-5.3's engine on atlas has been started again 6 times; now: exited with status 1"
                ),
                (
                    AlarmKind::Stopped,
                    "speech's engine on atlas is stopped: exited with status 1"
                ),
            ]
        );
        assert_eq!(model_states(&rows), (1, 1, 0, 1));
    }

    #[test]
    fn a_tenth_of_the_gateway_s_requests_failing_this_hour_raises_an_alarm_a_few_do_not() {
        let alarm = gateway_alarm(200, 70).unwrap();
        assert_eq!(alarm.kind, AlarmKind::GatewayErrors);
        assert_eq!(
            alarm.line,
            "70 of the gateway's 200 requests this hour failed (35 %)."
        );
        assert!(gateway_alarm(200, 19).is_none());
        assert!(gateway_alarm(10, 10).is_none(), "too few to say");
    }

    #[test]
    fn past_five_alarms_of_a_kind_one_line_counts_the_rest_and_links_to_where_they_are_all_listed()
    {
        let rows: Vec<ModelRow> = (0..300)
            .map(|n| row(&format!("model-{n:03}"), EngineState::Stopped, 0))
            .collect();
        let mut alarms = model_alarms(&rows);
        alarms.extend(gateway_alarm(200, 70));
        let shown = folded(alarms);
        let said: Vec<(AlarmKind, &str, &str)> = shown
            .iter()
            .map(|a| (a.kind, a.line.as_str(), a.href.as_str()))
            .collect();
        assert_eq!(said.len(), 7, "{said:?}");
        assert_eq!(
            said[0],
            (
                AlarmKind::Stopped,
                "model-000's engine on atlas is stopped: exited with status 1",
                "/models/model-000"
            )
        );
        assert_eq!(
            said[5],
            (
                AlarmKind::Stopped,
                "295 more alarms of this kind (Stopped).",
                "/models"
            )
        );
        assert_eq!(said[6].0, AlarmKind::GatewayErrors);
    }
}
