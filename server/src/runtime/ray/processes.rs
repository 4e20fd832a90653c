//! Which processes each engine's job runs as on its node: the job reports them at the end of its log (a
//! shell loop run beside the engine), the executor reads the last report back, and the log view leaves the
//! reports out. The node's per-process GPU memory is tied to engines through these.

use super::RayExecutor;
use crate::inventory::ray::RayError;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::PoisonError;
use tokio::time::Instant;

/// How a job's log line saying which processes its engine runs as begins.
const PIDS_MARK: &str = "tessera-pids:";

/// How many of a job's last lines are read for its last report: the reporter repeats it every 30 s.
const PIDS_TAIL: usize = 1000;

/// Run in the background by an engine's job on a node with real GPUs, before the engine takes the shell's
/// place: prints the processes of the job's process group (Ray starts each job in a session of its own)
/// whenever they change, and every 30 s, so that Tessera can tie the node's per-process GPU memory to the
/// engine from the end of its log. In a session of its own, so that it is none of them; it ends once the
/// group is empty (or with the engine, when Ray stops the job). A node without `pgrep` or `setsid`
/// reports nothing.
pub(super) const PIDS_REPORTER: &str = r#"setsid sh -c 'last= n=0
while now=$(pgrep -g "$1" | tr "\n" " ") && [ -n "$now" ]; do
  if [ "$now" != "$last" ] || [ "$n" -ge 15 ]; then
    printf "tessera-pids: %s\n" "$now"
    last=$now n=0
  fi
  n=$((n + 1))
  sleep 2
done' tessera-pids "$$" </dev/null &"#;

/// The processes a job last reported, as read from its log.
#[derive(Clone)]
pub(super) struct Report {
    pids: Vec<u32>,
    /// When its log was read (or failed to be).
    read: Instant,
    /// The processes its node's GPUs ran then.
    seen: Vec<u32>,
}

impl RayExecutor {
    /// The processes `units`' engines run as on their node, as each one's job last reported them at the
    /// end of its log (none where it reported nothing). A job's log is read once, and again (at most
    /// every `processes_reread`) once `seen`, the processes the node's GPUs run, differs from what they
    /// ran at its last read: a process its engine started since, or a PID given to another.
    pub(in crate::runtime) async fn processes(
        &self,
        units: &[String],
        seen: &[u32],
    ) -> Vec<(String, Vec<u32>)> {
        let mut seen = seen.to_vec();
        seen.sort_unstable();
        seen.dedup();
        let jobs: Vec<(&String, String)> = units
            .iter()
            .filter_map(|unit| Some((unit, self.newest(unit)?)))
            .collect();
        let newest: BTreeSet<String> = self
            .0
            .jobs
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .filter_map(|runs| runs.last().cloned())
            .collect();
        let known: BTreeMap<String, Report> = {
            let mut reports = self.reports();
            reports.retain(|job, _| newest.contains(job));
            jobs.iter()
                .filter_map(|(_, id)| Some((id.clone(), reports.get(id)?.clone())))
                .collect()
        };
        let reread = self.0.settings.processes_reread;
        let mut processes = Vec::new();
        for (unit, id) in jobs {
            let last = known.get(&id);
            let pids = match last {
                Some(last) if last.seen == seen || last.read.elapsed() < reread => {
                    last.pids.clone()
                }
                _ => {
                    let reported = match self.read_report(&id).await {
                        Ok(reported) => reported,
                        Err(e) => {
                            tracing::debug!("the log of Ray job {id} could not be read: {e}");
                            None
                        }
                    };
                    // A tail without a report (or a failed read) keeps the last one.
                    let pids = reported
                        .or_else(|| last.map(|last| last.pids.clone()))
                        .unwrap_or_default();
                    self.reports().insert(
                        id,
                        Report {
                            pids: pids.clone(),
                            read: Instant::now(),
                            seen: seen.clone(),
                        },
                    );
                    pids
                }
            };
            processes.push((unit.clone(), pids));
        }
        processes
    }

    /// What job `id` last reported of its processes at the end of its log, if it has (it runs nowhere
    /// before it has started on its node).
    async fn read_report(&self, id: &str) -> Result<Option<Vec<u32>>, RayError> {
        let Some(node) = self.0.client.job(id).await?.driver_node_id else {
            return Ok(None);
        };
        let tail = self.0.client.log_tail(id, &node, PIDS_TAIL).await?;
        Ok(reported_pids(&tail))
    }

    fn reports(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Report>> {
        self.0
            .reports
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The processes a job's log (or the end of it) last said its engine runs as, if it said. A report may
/// follow what the engine wrote without a newline (a progress bar's `\r`).
pub(in crate::runtime) fn reported_pids(logs: &str) -> Option<Vec<u32>> {
    logs.lines().rev().find_map(|line| {
        let (_, pids) = line.rsplit_once(PIDS_MARK)?;
        Some(
            pids.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect(),
        )
    })
}

/// A log line as the log view shows it: without a report, and left out where it was one alone.
pub(super) fn without_report(line: &str) -> Option<&str> {
    match line.split_once(PIDS_MARK) {
        None => Some(line),
        Some((before, _)) if before.trim().is_empty() => None,
        Some((before, _)) => Some(before),
    }
}
