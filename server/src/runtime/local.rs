//! Engines as processes of this machine: each in a process group of its own, recorded (PID, start time,
//! boot) in the database so that a server started after a crash adopts it, stopped with SIGTERM then
//! SIGKILL, and waited for until its processes and, where NVML can tell, its GPU memory are gone.

use super::executor::{Executor, Leftover, Running, StartFailure, Units};
use super::mps::{DaemonLocks, MpsClients};
use super::process::{self, off_executor, SpawnError, Spawned, KILL, TERM};
use super::spec::{EngineSpec, Host, Launch, MpsClient};
use super::{engine_id, Settings};
use async_trait::async_trait;
use placement::sharing::MpsDaemon;
use sqlx::SqlitePool;
use std::collections::BTreeSet;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use tokio::time::{sleep, timeout, Instant};

/// What this machine's engines share.
pub(crate) struct Local {
    pool: SqlitePool,
    settings: Settings,
    /// Carried by every engine (`TESSERA_INSTANCE`): this installation's engines, found after a crash.
    instance: String,
    /// This boot of the machine, recorded with each engine.
    boot: Option<String>,
    /// Set once a graceful shutdown begins: nothing starts from then on.
    closing: Arc<Mutex<bool>>,
    /// The MPS daemons of this machine's GPUs shared under MPS, with the engines that are their clients:
    /// each started before its first, stopped after its last.
    mps: Mutex<MpsClients>,
    /// One at a time per daemon: its start or stop and its clients' joins and leaves.
    daemons: DaemonLocks,
}

/// This machine's processes, as an [`Executor`].
#[derive(Clone)]
pub(crate) struct LocalExecutor(Arc<Local>);

impl LocalExecutor {
    pub(crate) fn new(
        pool: SqlitePool,
        settings: Settings,
        instance: String,
        closing: Arc<Mutex<bool>>,
    ) -> LocalExecutor {
        LocalExecutor(Arc::new(Local {
            pool,
            settings,
            instance,
            boot: process::boot_id(),
            closing,
            mps: Mutex::default(),
            daemons: DaemonLocks::default(),
        }))
    }

    fn mps_daemon(&self, machine: &str, client: &MpsClient) -> MpsDaemon {
        // Absolute: the daemon and its clients must name one directory wherever each runs from.
        let data_dir = std::path::absolute(&self.0.settings.data_dir)
            .unwrap_or_else(|_| self.0.settings.data_dir.clone());
        MpsDaemon::new(
            &data_dir.display().to_string(),
            machine,
            client.index,
            &client.uuid,
        )
    }

    /// Makes `unit` a client of `daemon`, starting the daemon first where none runs. Without it CUDA
    /// would run the engine outside MPS, unlimited, and say nothing: so where it cannot start, neither
    /// does the engine.
    async fn join_mps(&self, daemon: MpsDaemon, unit: &str) -> Result<(), String> {
        let _this_daemon = self.0.daemons.lock(&daemon.pipe_dir).await;
        // Asked each time, not taken on trust: a daemon may have died, or been stopped while this server
        // was down. One that answers (a previous server's too) is kept; else one is started.
        if self.mps_answers(&daemon).await.is_err() {
            for dir in [&daemon.pipe_dir, &daemon.log_dir] {
                std::fs::create_dir_all(dir).map_err(|e| format!("could not make {dir}: {e}"))?;
            }
            self.mps_start(&daemon).await.map_err(|why| {
                format!(
                    "the MPS daemon of GPU {} could not start ({why}): {unit} is not started, as outside MPS its memory share would not be enforced",
                    daemon.uuid
                )
            })?;
            tracing::info!("MPS daemon of GPU {} started for {unit}", daemon.uuid);
        }
        self.clients().join(daemon, unit);
        Ok(())
    }

    fn clients(&self) -> std::sync::MutexGuard<'_, MpsClients> {
        self.0.mps.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether `daemon` answers its control program.
    async fn mps_answers(&self, daemon: &MpsDaemon) -> Result<(), String> {
        self.mps_command(daemon, "get_server_list\n").await
    }

    /// `unit` is no client of any daemon from now on; a daemon left without clients is stopped.
    async fn leave_mps(&self, unit: &str) {
        let Some(pipe_dir) = self.clients().daemon_of(unit) else {
            return;
        };
        let _this_daemon = self.0.daemons.lock(&pipe_dir).await;
        let last = self.clients().leave(unit);
        if let Some(daemon) = last {
            match self.mps_command(&daemon, MpsDaemon::STOP).await {
                Ok(()) => tracing::info!("MPS daemon of GPU {} stopped after {unit}", daemon.uuid),
                Err(why) => tracing::warn!("MPS daemon of GPU {} did not stop: {why}", daemon.uuid),
            }
        }
    }

    /// Starts `daemon` in the background (`-d`), and waits, within the stop timeout, until it answers:
    /// a client that came first would run outside it.
    async fn mps_start(&self, daemon: &MpsDaemon) -> Result<(), String> {
        let [_, flag] = MpsDaemon::start_command();
        let mut command = super::process::command(&self.0.settings.mps_control);
        command
            .arg(flag)
            .envs(daemon.env())
            // The daemon keeps what it inherits: nothing of this server's.
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let status = timeout(self.0.settings.stop_timeout, command.status())
            .await
            .map_err(|_| "it did not return".to_owned())?
            .map_err(|e| format!("{}: {e}", self.0.settings.mps_control.display()))?;
        if !status.success() {
            return Err(format!(
                "{} -d {status}",
                self.0.settings.mps_control.display()
            ));
        }
        let deadline = Instant::now() + self.0.settings.stop_timeout;
        loop {
            match self.mps_answers(daemon).await {
                Ok(()) => return Ok(()),
                Err(why) if Instant::now() >= deadline => {
                    return Err(format!("started, but did not answer: {why}"))
                }
                Err(_) => sleep(self.0.settings.health_interval).await,
            }
        }
    }

    /// Sends `input` (such as `quit`) to `daemon` through its control program.
    async fn mps_command(&self, daemon: &MpsDaemon, input: &str) -> Result<(), String> {
        use tokio::io::AsyncWriteExt;
        let program = &self.0.settings.mps_control;
        let mut child = super::process::command(program)
            .envs(daemon.env())
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("{}: {e}", program.display()))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(input.as_bytes())
                .await
                .map_err(|e| format!("{}: {e}", program.display()))?;
        }
        let status = timeout(self.0.settings.stop_timeout, child.wait())
            .await
            .map_err(|_| format!("{} did not answer", program.display()))?
            .map_err(|e| format!("{}: {e}", program.display()))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!("{} {status}", program.display()))
        }
    }

    fn log_path(&self, unit: &str) -> PathBuf {
        self.0
            .settings
            .log_dir
            .join(format!("{}.log", engine_id(unit)))
    }

    /// The PIDs of each of `engines` (unit, leader) and of every process it started, in its process group
    /// or not: their GPU memory is Tessera's, not held outside it.
    pub(crate) async fn processes(&self, engines: Vec<(String, u32)>) -> Vec<(String, Vec<u32>)> {
        let instance = self.0.instance.clone();
        off_executor(move || {
            let groups = process::all_groups();
            let found = process::instance_processes(&instance);
            engines
                .into_iter()
                .map(|(unit, leader)| {
                    let mut pids: BTreeSet<u32> = groups
                        .iter()
                        .filter(|(_, group)| *group == leader)
                        .map(|(pid, _)| *pid)
                        .collect();
                    pids.insert(leader);
                    pids.extend(found.iter().filter(|f| f.engine == unit).map(|f| f.pid));
                    (unit, pids.into_iter().collect())
                })
                .collect()
        })
        .await
    }

    /// The recorded engines that still run as this installation's (unit, PID).
    pub(crate) async fn recorded(&self) -> Result<Vec<(String, u32)>, sqlx::Error> {
        Ok(self
            .records()
            .await?
            .into_iter()
            .filter(|r| r.ours)
            .map(|r| (r.unit, r.pid))
            .collect())
    }

    /// Records a started engine, so that a server started after a crash (in the same boot) can adopt it.
    async fn remember(&self, spec: &EngineSpec, pid: u32, start_ticks: u64, port: u16) {
        let result = sqlx::query("INSERT OR REPLACE INTO engines (unit, fingerprint, pid, start_ticks, port, boot_id) VALUES (?, ?, ?, ?, ?, ?)")
            .bind(&spec.unit)
            .bind(spec.fingerprint())
            .bind(i64::from(pid))
            .bind(start_ticks as i64)
            .bind(i64::from(port))
            .bind(self.0.boot.as_deref().unwrap_or_default())
            .execute(&self.0.pool)
            .await;
        if let Err(e) = result {
            // The engine runs regardless; after a crash it would be found by its instance token and stopped.
            tracing::warn!("could not record engine {} (PID {pid}): {e}", spec.unit);
        }
    }

    /// The recorded engines, each said to be ours or not.
    async fn records(&self) -> Result<Vec<Record>, sqlx::Error> {
        type Row = (String, String, i64, i64, i64, String);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT unit, fingerprint, pid, start_ticks, port, boot_id FROM engines",
        )
        .fetch_all(&self.0.pool)
        .await?;
        let boot = self.0.boot.clone();
        let instance = self.0.instance.clone();
        Ok(off_executor(move || {
            rows.into_iter()
                .map(|(unit, fingerprint, pid, ticks, port, row_boot)| {
                    let (pid, start_ticks, port) = (pid as u32, ticks as u64, port as u16);
                    // A row written before boot ids were kept has none: it rests on the other two
                    // checks, so that an upgrade does not restart every engine.
                    let same_boot =
                        row_boot.is_empty() || boot.as_deref() == Some(row_boot.as_str());
                    let ours = same_boot
                        && process::is_same(pid, start_ticks)
                        && process::carries(pid, &instance);
                    Record {
                        unit,
                        fingerprint,
                        pid,
                        start_ticks,
                        port,
                        ours,
                    }
                })
                .collect()
        })
        .await)
    }

    async fn forget(&self, unit: &str) {
        if let Err(e) = sqlx::query("DELETE FROM engines WHERE unit = ?")
            .bind(unit)
            .execute(&self.0.pool)
            .await
        {
            tracing::warn!("could not forget engine {unit}: {e}");
        }
    }

    fn process(&self, unit: &str, gpus: Vec<u32>, kind: Kind, port: u16) -> Box<dyn Running> {
        Box::new(Process {
            local: self.clone(),
            unit: unit.to_owned(),
            stuck: false,
            gpus,
            kind,
            port,
        })
    }
}

/// A row of the `engines` table, and whether it still names this installation's engine.
struct Record {
    unit: String,
    fingerprint: String,
    pid: u32,
    start_ticks: u64,
    port: u16,
    /// Recorded in this boot, and the process with that PID and start time carries this installation's
    /// token: anything else is some other process that has the PID by chance.
    ours: bool,
}

#[async_trait]
impl Executor for LocalExecutor {
    async fn port(&self, _spec: &EngineSpec) -> Result<u16, StartFailure> {
        free_port().map_err(|e| StartFailure::Refused(format!("no free port: {e}")))
    }

    async fn start(
        &self,
        spec: &EngineSpec,
        launch: &mut Launch,
        port: u16,
    ) -> Result<Box<dyn Running>, StartFailure> {
        if let (Host::Local, Some(client), Some(share)) = (&spec.host, &spec.mps, spec.share) {
            let daemon = self.mps_daemon(&spec.machine, client);
            launch
                .env
                .extend(daemon.client_env(share, client.compute_percent));
            self.join_mps(daemon, &spec.unit)
                .await
                .map_err(StartFailure::Refused)?;
        }
        let spawned = {
            let (local, launch) = (self.0.clone(), launch.clone());
            let log = self.log_path(&spec.unit);
            off_executor(move || process::spawn(&launch, &log, &local.instance, &local.closing))
                .await
        }
        .map_err(|e| match e {
            SpawnError::Closing => StartFailure::Closing,
            SpawnError::Io(e) => {
                StartFailure::Refused(format!("could not start {}: {e}", launch.program))
            }
        });
        let spawned = match spawned {
            Ok(spawned) => spawned,
            Err(failure) => {
                self.leave_mps(&spec.unit).await;
                return Err(failure);
            }
        };
        self.remember(spec, spawned.pid, spawned.start_ticks, port)
            .await;
        // Only this machine's own GPUs are read with NVML; a demo machine's indices name nothing here.
        let gpus = if spec.host == Host::Local {
            spec.gpus.clone()
        } else {
            Vec::new()
        };
        Ok(self.process(&spec.unit, gpus, Kind::Child(spawned), port))
    }

    async fn leftovers(&self, of: &Units) -> io::Result<Vec<Leftover>> {
        let records = self.records().await.map_err(io::Error::other)?;
        let mut leftovers = Vec::new();
        let mut groups = BTreeSet::new();
        let mut units = BTreeSet::new();
        for record in records {
            if !of(&record.unit) {
                continue;
            }
            if !record.ours {
                // Some other process has the PID now: nothing of ours to stop.
                self.forget(&record.unit).await;
                continue;
            }
            groups.insert(record.pid);
            units.insert(record.unit.clone());
            // Its daemon, left running with it, is its again.
            if let Some((machine, client)) = EngineSpec::mps_of(&record.fingerprint) {
                let daemon = self.mps_daemon(&machine, &client);
                self.clients().join(daemon, &record.unit);
            }
            let kind = Kind::Adopted {
                pid: record.pid,
                start_ticks: record.start_ticks,
            };
            // Adopted or stopped, its stop waits for its memory on the GPUs it was started on.
            let gpus = EngineSpec::local_gpus_of(&record.fingerprint);
            leftovers.push(Leftover {
                running: self.process(&record.unit, gpus, kind, record.port),
                unit: record.unit,
                fingerprint: Some(record.fingerprint),
            });
        }
        // Engines started by a server that died before it could record them. A recorded engine's own
        // processes (vLLM's EngineCore, SGLang's schedulers, helpers that left its group) carry the token
        // too: they go with it.
        let instance = self.0.instance.clone();
        let found = off_executor(move || process::instance_processes(&instance)).await;
        for f in found {
            if groups.contains(&f.group)
                || units.contains(&f.engine)
                || f.pid == std::process::id()
                || !of(&f.engine)
            {
                continue;
            }
            if let Some(start_ticks) = process::start_ticks(f.pid) {
                let kind = Kind::Adopted {
                    pid: f.pid,
                    start_ticks,
                };
                leftovers.push(Leftover {
                    running: self.process(&f.engine, Vec::new(), kind, 0),
                    unit: f.engine,
                    fingerprint: None,
                });
            }
        }
        Ok(leftovers)
    }

    async fn logs(&self, unit: &str, lines: usize) -> io::Result<Vec<String>> {
        let log = self.log_path(unit);
        off_executor(move || process::tail(&log, lines)).await
    }
}

/// A process of this machine: a child of this server, or one adopted from a previous server.
enum Kind {
    Child(Spawned),
    Adopted { pid: u32, start_ticks: u64 },
}

struct Process {
    local: LocalExecutor,
    unit: String,
    /// Something of it outlived its stop: it may still be its MPS daemon's client.
    stuck: bool,
    /// This machine's GPUs it runs on (none for a demo machine's engine).
    gpus: Vec<u32>,
    kind: Kind,
    port: u16,
}

impl Process {
    fn leader(&self) -> u32 {
        match &self.kind {
            Kind::Child(s) => s.pid,
            Kind::Adopted { pid, .. } => *pid,
        }
    }

    fn settings(&self) -> &Settings {
        &self.local.0.settings
    }

    async fn leader_exited(&mut self) -> String {
        let poll = self.settings().health_interval;
        match &mut self.kind {
            Kind::Child(s) => match s.child.wait().await {
                Ok(status) => format!("exited ({status})"),
                Err(e) => format!("could not be waited on: {e}"),
            },
            // Not our child: it cannot be waited on, only watched.
            Kind::Adopted { pid, start_ticks } => {
                while process::is_same(*pid, *start_ticks) {
                    sleep(poll).await;
                }
                "exited".to_owned()
            }
        }
    }

    /// The live processes of the engine: those of its process group, and those that carry its name
    /// outside it (a helper that called `setsid`).
    async fn leftovers(&self) -> (BTreeSet<u32>, BTreeSet<u32>) {
        let instance = self.local.0.instance.clone();
        let unit = self.unit.clone();
        let pgid = self.leader();
        off_executor(move || {
            let group: BTreeSet<u32> = process::group_members(pgid).into_iter().collect();
            let escaped = process::instance_processes(&instance)
                .into_iter()
                .filter(|f| f.engine == unit && !group.contains(&f.pid))
                .map(|f| f.pid)
                .collect();
            (group, escaped)
        })
        .await
    }

    /// Waits until no process of the engine is left.
    async fn gone(&mut self) {
        self.leader_exited().await;
        loop {
            let (group, escaped) = self.leftovers().await;
            if group.is_empty() && escaped.is_empty() {
                return;
            }
            sleep(self.settings().health_interval).await;
        }
    }

    /// Kills what is left of the engine (its group, and its helpers that left it: they may hold GPU memory
    /// the next start needs), then waits, within the stop timeout, for them to be gone and, where NVML can
    /// tell, for their GPU memory to be free. What is stuck is said, not waited for.
    async fn finish(&mut self, mut seen: BTreeSet<u32>) -> Option<String> {
        let stop_timeout = self.settings().stop_timeout;
        let pgid = self.leader();
        seen.insert(pgid);
        let (group, escaped) = self.leftovers().await;
        if !group.is_empty() {
            process::signal(pgid, KILL);
        }
        for &pid in &escaped {
            process::signal_one(pid, KILL);
        }
        seen.extend(group.into_iter().chain(escaped));
        if timeout(stop_timeout, self.gone()).await.is_err() {
            let (group, escaped) = self.leftovers().await;
            let left: Vec<String> = group.iter().chain(&escaped).map(u32::to_string).collect();
            return Some(format!(
                "PID {} outlived SIGKILL for {stop_timeout:?}",
                left.join(", "),
            ));
        }
        self.memory_freed(&seen).await
    }

    /// Waits, within the stop timeout, until none of `pids` holds memory on the engine's GPUs, where this
    /// machine's GPUs can be read (the driver frees memory a moment after a process exits); says which
    /// still does after that.
    async fn memory_freed(&self, pids: &BTreeSet<u32>) -> Option<String> {
        let settings = self.settings();
        let reader = settings.gpus.clone()?;
        let deadline = Instant::now() + settings.stop_timeout;
        loop {
            let (reader, indices, pids) = (reader.clone(), self.gpus.clone(), pids.clone());
            let holding: Vec<(u32, u32)> = off_executor(move || {
                indices
                    .into_iter()
                    .flat_map(|i| {
                        reader
                            .processes_on(i)
                            .into_iter()
                            .filter(|pid| pids.contains(pid))
                            .map(move |pid| (pid, i))
                            .collect::<Vec<_>>()
                    })
                    .collect()
            })
            .await;
            // Free once none of them is listed.
            let &(pid, gpu) = holding.first()?;
            if Instant::now() >= deadline {
                return Some(format!(
                    "PID {pid} still holds memory on GPU {gpu} {:?} after the engine stopped",
                    settings.stop_timeout
                ));
            }
            sleep(settings.health_interval).await;
        }
    }
}

#[async_trait]
impl Running for Process {
    fn pid(&self) -> Option<u32> {
        Some(self.leader())
    }

    fn address(&self) -> (String, u16) {
        ("127.0.0.1".to_owned(), self.port)
    }

    async fn exited(&mut self) -> String {
        self.leader_exited().await
    }

    /// SIGTERM to the engine, everything it started in its group and its helpers outside it, then SIGKILL
    /// after the stop timeout.
    async fn stop(&mut self) -> Option<String> {
        let stop_timeout = self.settings().stop_timeout;
        let pgid = self.leader();
        let (group, escaped) = self.leftovers().await;
        process::signal(pgid, TERM);
        for &pid in &escaped {
            process::signal_one(pid, TERM);
        }
        if timeout(stop_timeout, self.gone()).await.is_err() {
            tracing::warn!(
                "engine {} did not stop within {stop_timeout:?}: killing it",
                self.unit
            );
        }
        let stuck = self
            .finish(group.into_iter().chain(escaped).collect())
            .await;
        self.stuck |= stuck.is_some();
        stuck
    }

    async fn clean_up(&mut self) -> Option<String> {
        let stuck = self.finish(BTreeSet::new()).await;
        self.stuck |= stuck.is_some();
        stuck
    }

    async fn forget(&mut self) {
        self.local.forget(&self.unit).await;
        if self.stuck {
            // Its daemon stays up rather than quit under a client that may still run.
            tracing::warn!(
                "{} left processes behind: its MPS daemon, if it has one, is left running",
                self.unit
            );
        } else {
            self.local.leave_mps(&self.unit).await;
        }
    }
}

/// A port nothing listens on now, for the engine to take.
fn free_port() -> io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}
