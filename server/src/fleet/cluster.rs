//! Following the Ray cluster: its machines as it lists them, read again every few seconds, taken up when it
//! lists new ones, kept in the database so that a server started while the cluster does not answer still
//! shows them (unreachable), and marked unreachable while their node is dead or gone.

use super::engines;
use super::Fleet;
use crate::inventory::ray::{ClusterMachine, RayClient};
use crate::inventory::simulated::SimulatedGpus;
use crate::inventory::GpuLive;
use std::collections::BTreeSet;
use std::sync::{Arc, PoisonError};

/// Whether the Ray cluster answers, as it was last asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterStatus {
    /// It answered the last time it was asked.
    pub up: bool,
    /// Since when it has answered, or not, in milliseconds since the epoch.
    pub since_ms: u64,
    /// Why it does not answer.
    pub error: Option<String>,
}

impl Fleet {
    /// Reads the Ray cluster's nodes every `every` for as long as the server runs. A machine whose node
    /// died (or left) is unreachable from then on: its GPUs leave the inventory, so what it held holds
    /// nothing (with the reason), its engines are not run and nothing new is placed there. Once a node
    /// with its label is alive again, its GPUs come back: what it held is held again and its engines
    /// start. A machine the cluster lists for the first time (it did not answer when the server started,
    /// or the node joined since) is taken up as it is read. While the cluster itself does not answer, the
    /// last reading stands.
    ///
    /// With `sim`, the nodes whose GPUs are made up are read from their simulated GPUs, which their demo
    /// engines allocate from, as a node with NVML is read from its agent.
    pub async fn follow_cluster(
        self: Arc<Self>,
        client: RayClient,
        every: std::time::Duration,
        sim: Option<SimulatedGpus>,
    ) {
        let mut last_error = None;
        let mut following = Following::default();
        loop {
            tokio::time::sleep(every).await;
            let nodes = match client.nodes().await {
                Ok(nodes) => nodes,
                Err(e) => {
                    let e = e.to_string();
                    if last_error.as_ref() != Some(&e) {
                        tracing::warn!("{e}: its machines are shown as last read");
                        last_error = Some(e.clone());
                    }
                    self.cluster_answered(Err(e));
                    continue;
                }
            };
            last_error = None;
            self.cluster_answered(Ok(()));
            let seen = crate::inventory::ray::machines(&nodes);
            self.read_cluster(&seen, &mut following, |node| {
                self.read_node(&client, node, sim.as_ref())
            })
            .await;
        }
    }

    /// Notes whether the cluster answered, and why not: the Overview's alarm, `/api/health` and
    /// `tessera_ray_cluster_up`.
    pub fn cluster_answered(&self, answer: Result<(), String>) {
        let mut status = self
            .cluster_status
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let up = answer.is_ok();
        let since_ms = match status.as_ref() {
            Some(was) if was.up == up => was.since_ms,
            _ => super::usage::now_ms(),
        };
        *status = Some(ClusterStatus {
            up,
            since_ms,
            error: answer.err(),
        });
    }

    /// Whether the Ray cluster answers; `None` without one.
    pub fn cluster_status(&self) -> Option<ClusterStatus> {
        self.cluster_status
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes one reading of the cluster, which lists `seen`: kept in the database where it changed, its new
    /// nodes taken up, and each of its machines brought up to date, as `read` reads a live node's GPUs (a
    /// dead or gone node has none).
    pub(crate) async fn read_cluster<'a, F>(
        self: &Arc<Self>,
        seen: &'a [ClusterMachine],
        following: &mut Following,
        read: impl Fn(&'a ClusterMachine) -> F,
    ) where
        F: std::future::Future<Output = placement::Machine>,
    {
        if following.kept.as_deref() != Some(seen) {
            match keep(&self.pool, seen).await {
                Ok(()) => following.kept = Some(seen.to_vec()),
                Err(e) => tracing::warn!("the cluster's machines could not be kept: {e}"),
            }
        }
        let moved = self.take_up(seen, &mut following.ignored);
        if !moved.is_empty() {
            self.respecify(&moved).await;
        }
        let known = self.hosts().cluster.clone();
        for (name, known) in &known {
            let (machine, alive) = match seen.iter().find(|m| &m.name == name) {
                Some(now) if now.alive => (read(now).await, true),
                _ => {
                    // What its engines were measured to hold there is past.
                    self.measure(name, &[], &[], &[]);
                    (
                        placement::Machine {
                            gpus: Vec::new(),
                            ..known.machine()
                        },
                        false,
                    )
                }
            };
            if let Err(e) = self.refresh_machine(machine).await {
                tracing::warn!("the cluster's machine {name} could not be brought up to date: {e}");
            }
            // Said once the inventory shows it: whoever sees the machine unreachable sees its GPUs
            // gone, and whoever sees it reachable again sees them back.
            self.mark_reachable(name, alive);
        }
    }

    /// Takes up each machine of `seen` alive that engines cannot be started for yet, or whose node changed
    /// since (a node that came back has a new id, maybe a new address): engines start there from the next
    /// write on. A machine that is this one or the demo fleet's is left as it is (`ignored`, said once).
    /// Answers the machines known before whose node has another address now: their engines are to be
    /// specified anew.
    fn take_up(&self, seen: &[ClusterMachine], ignored: &mut BTreeSet<String>) -> Vec<String> {
        let hosts = self.hosts();
        let mut next = (*hosts).clone();
        let mut moved = Vec::new();
        for machine in seen
            .iter()
            .filter(|m| m.alive && hosts.cluster.get(&m.name) != Some(*m))
        {
            let elsewhere = hosts.local.as_deref() == Some(machine.name.as_str())
                || hosts.simulated.contains(&machine.name);
            if elsewhere && !hosts.cluster.contains_key(&machine.name) {
                if ignored.insert(machine.name.clone()) {
                    tracing::warn!(
                        "the Ray cluster lists {0}, which Tessera runs as this machine or the demo fleet's: start Tessera again to run its engines as the cluster's jobs",
                        machine.name
                    );
                }
                continue;
            }
            match hosts.cluster.get(&machine.name) {
                None => tracing::info!("{} joins as a machine of the Ray cluster", machine.name),
                Some(was) if was.address != machine.address => {
                    tracing::info!(
                        "{} is at {} now, where it was at {}: its engines start there",
                        machine.name,
                        machine.address,
                        was.address
                    );
                    moved.push(machine.name.clone());
                }
                Some(_) => {}
            }
            next.cluster.insert(machine.name.clone(), machine.clone());
        }
        if next.cluster != hosts.cluster {
            *self.hosts.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(next);
        }
        moved
    }

    /// Tells the runtime how the engines held on `machines` run now that their nodes are at another
    /// address: each one started for the old address (its node gone with it, or listening where Tessera no
    /// longer looks) is started again at the new one, as after a change of the machine's GPUs.
    async fn respecify(&self, machines: &[String]) {
        let state = self.state.lock().await;
        let hosts = self.hosts();
        let holders: BTreeSet<String> = machines
            .iter()
            .flat_map(|m| state.ledger.holders_on(m, &state.committed))
            .collect();
        let desired = engines::of_holders(&state.committed, &state.ledger, &hosts, &holders);
        self.runtime.submit(crate::runtime::Change::Update {
            units: holders.into_iter().collect(),
            desired,
        });
    }

    /// A live machine of the cluster, with what its node's own GPU readings say is held outside Tessera
    /// (memory in use less what Tessera's holders there stand for). A node without NVML reports no GPUs:
    /// nothing is held outside then, as far as Tessera can tell.
    async fn read_node(
        &self,
        client: &crate::inventory::ray::RayClient,
        node: &crate::inventory::ray::ClusterMachine,
        sim: Option<&SimulatedGpus>,
    ) -> placement::Machine {
        let mut machine = node.machine();
        let read = match sim.filter(|_| node.demo) {
            Some(sim) => simulated(sim, node),
            None => client
                .node_gpus(&node.node_id)
                .await
                .map_err(|e| e.to_string()),
        };
        let readings = match read {
            Ok(readings) => readings,
            Err(e) => {
                tracing::debug!("the GPUs of {} could not be read: {e}", node.name);
                // No figures: nothing is judged until the next reading.
                self.measure(&node.name, &[], &[], &[]);
                return machine;
            }
        };
        let ours = {
            let state = self.state.lock().await;
            engines::committed_on(&state.ledger, &node.name)
        };
        let mut live = Vec::new();
        for gpu in &mut machine.gpus {
            if let Some(reading) = readings.iter().find(|r| r.uuid == gpu.uuid) {
                gpu.held_outside = crate::inventory::held_outside(
                    reading.used,
                    &ours,
                    gpu.index,
                    &reading.processes,
                );
                // Kept for the machine page where the agent read how busy the GPU was (it gives no
                // temperature or power).
                live.extend(reading.utilisation_percent.map(|utilisation| GpuLive {
                    index: gpu.index,
                    utilisation_percent: utilisation,
                    power_mw: None,
                    temperature_c: None,
                    energy_mj: None,
                    used: reading.used,
                    processes: reading.processes.clone(),
                    problem: None,
                }));
            }
        }
        let seen: Vec<u32> = live
            .iter()
            .flat_map(|gpu| gpu.processes.iter().map(|&(pid, _)| pid))
            .collect();
        let running = match seen.is_empty() {
            true => Vec::new(),
            false => self.runtime.node_processes(&node.name, &seen).await,
        };
        let reported = self.runtime.reported_on(&node.name);
        self.measure(&node.name, &live, &running, &reported);
        if !live.is_empty() {
            let at = super::usage::now_ms();
            if let Err(e) = self.record_samples(&machine, &live, at).await {
                tracing::warn!("the GPU readings of {} could not be kept: {e}", node.name);
            }
        }
        machine
    }

    /// Marks `name` reachable or not (since now): the machine page says so.
    pub(crate) fn mark_reachable(&self, name: &str, reachable: bool) {
        let mut unreachable = self
            .unreachable
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if reachable {
            if unreachable.remove(name).is_some() {
                tracing::info!("{name} is reachable again in the Ray cluster");
            }
        } else if !unreachable.contains_key(name) {
            let since = crate::runtime::now();
            tracing::warn!("{name} is unreachable: its Ray node is dead or gone, or the cluster does not answer");
            unreachable.insert(name.to_owned(), since);
        }
    }
}

/// What following the cluster remembers from one reading to the next.
#[derive(Debug, Default)]
pub(crate) struct Following {
    /// The machines last kept in the database.
    kept: Option<Vec<ClusterMachine>>,
    /// The machines it lists that Tessera runs otherwise (said once).
    ignored: BTreeSet<String>,
}

/// A node's made-up GPUs as their simulation reads them: what each process holds (the node's own PIDs, as
/// its agent would report them), and as busy as a GPU is while any of them is answering a request.
fn simulated(
    sim: &SimulatedGpus,
    node: &ClusterMachine,
) -> Result<Vec<crate::inventory::ray::GpuReading>, String> {
    let unreadable = |e: crate::inventory::simulated::SimError| e.to_string();
    node.gpus
        .iter()
        .map(|gpu| {
            let at = placement::GpuRef::new(&node.name, gpu.index);
            sim.ensure(&at, gpu.memory).map_err(unreadable)?;
            let now = sim.read(&at).map_err(unreadable)?;
            Ok(crate::inventory::ray::GpuReading {
                uuid: gpu.uuid.clone(),
                used: now.used,
                utilisation_percent: Some(if now.answering > 0 { 100 } else { 0 }),
                processes: now.processes,
            })
        })
        .collect()
}

/// Keeps `machines` as the cluster's, in place of those kept before.
pub(crate) async fn keep(
    pool: &sqlx::SqlitePool,
    machines: &[ClusterMachine],
) -> Result<(), sqlx::Error> {
    let mut tx = crate::db::write(pool).await?;
    sqlx::query("DELETE FROM cluster_machines")
        .execute(&mut *tx)
        .await?;
    for machine in machines {
        // Plain data: it serializes.
        let json = serde_json::to_string(machine).unwrap_or_default();
        sqlx::query("INSERT INTO cluster_machines (name, machine) VALUES (?, ?)")
            .bind(&machine.name)
            .bind(json)
            .execute(&mut *tx)
            .await?;
    }
    tx.commit().await
}

/// The cluster's machines as kept when it last answered: what a server started while it does not answer
/// shows. One that cannot be read back (kept by another version) is left out.
pub(crate) async fn kept(pool: &sqlx::SqlitePool) -> Result<Vec<ClusterMachine>, sqlx::Error> {
    let rows: Vec<(String,)> = sqlx::query_as("SELECT machine FROM cluster_machines ORDER BY name")
        .fetch_all(pool)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(json,)| serde_json::from_str(&json).ok())
        .collect())
}
