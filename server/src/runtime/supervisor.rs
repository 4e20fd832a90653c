//! One engine's supervisor: starts it through its machine's executor (or adopts it after a server restart),
//! checks its health over HTTP, restarts it after a crash with exponential backoff up to a cap, and stops it
//! gracefully. The same for every executor.

use super::engines::{Begin, Control, Status};
use super::executor::{Running, StartFailure};
use super::free_readers::Turn;
use super::spec::EngineSpec;
use super::{EngineState, Shared};
use placement::Bytes;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::{sleep, timeout, Instant};

/// Registers `spec` and starts its supervisor (a remote engine is only shown); `None` once the server is
/// shutting down.
pub(super) fn launch(
    shared: &Arc<Shared>,
    spec: EngineSpec,
    begin: Begin,
    halted: impl Fn() -> bool,
) -> Option<watch::Receiver<Status>> {
    let (watcher, commands) = shared.register(&spec, &begin, halted)?;
    if let Some(rx) = commands {
        tokio::spawn(supervise(shared.clone(), spec, begin, rx));
    }
    Some(watcher)
}

/// Supervises `spec` until told to stop.
pub(super) async fn supervise(
    shared: Arc<Shared>,
    spec: EngineSpec,
    begin: Begin,
    mut control: mpsc::Receiver<Control>,
) {
    let settings = shared.settings.clone();
    let unit = spec.unit.clone();
    let mut failures: u32 = 0;
    // Starts in a row that took more than their share sizing by what was free.
    let mut oversized: u32 = 0;
    let mut adopted = match begin {
        Begin::Adopt(running) => Some(running),
        Begin::Start => None,
    };
    loop {
        // An SGLang engine's turn to read what is free on its GPUs, until its KV cache is allocated.
        let mut reading = None;
        // Adopted, an engine that can sleep is asked whether it does (Tessera may have restarted between
        // a sleep or a wake committed and carried out).
        let adopted_sleeper = adopted.is_some() && spec.recipe.sleep_api().is_some();
        let mut running = match adopted.take() {
            Some(running) => running,
            None => match start(&shared, &spec).await {
                Ok((running, turn)) => {
                    reading = turn;
                    running
                }
                Err(StartFailure::Closing) => {
                    shared.set(
                        &unit,
                        EngineState::Stopped,
                        None,
                        None,
                        Some("not started: the server is shutting down".to_owned()),
                    );
                    return;
                }
                Err(StartFailure::Refused(message)) => {
                    // A recipe that cannot start will not start on a retry either.
                    shared.set(&unit, EngineState::Failed, None, None, Some(message));
                    wait_for_stop(&mut control).await;
                    shared.set(&unit, EngineState::Stopped, None, None, None);
                    return;
                }
                Err(StartFailure::Unavailable(message)) => {
                    match back_off(&shared, &spec, &mut failures, message, &mut control).await {
                        Next::Retry => continue,
                        Next::End => return,
                    }
                }
            },
        };
        let (host, port) = running.address();
        // Its key, as it was started with it (an adopted one's, from where it runs: its job's record).
        let key = running.api_key();
        shared.set_api_key(&unit, key.clone());
        let started = Instant::now();
        let mut healthy_once = false;
        let mut failed_checks: u32 = 0;
        // A starting engine is probed soon and then less often, up to the health interval, so that one
        // that loads in a moment (an on-demand model's request waits on it) is seen ready in a moment.
        let mut next_probe = tokio::time::Instant::now();
        let mut starting_wait = STARTING_PROBE;
        let mut waiting_for: Option<String> = None;
        // Asleep: it runs, holding only what it keeps, and takes no request until it is woken.
        let mut asleep = false;
        let mut broken = None;
        if adopted_sleeper {
            match take_up_asleep(
                &shared,
                &spec,
                running.as_ref(),
                (&host, port, key.as_deref()),
            )
            .await
            {
                Ok(taken_up) => {
                    asleep = taken_up;
                    healthy_once = taken_up;
                }
                Err(why) => broken = Some(why),
            }
        }
        // It loaded and answers, but took too much: no failure of its own, it starts again at once.
        let mut again = false;
        let why = loop {
            if let Some(why) = broken.take() {
                let stuck = running.stop().await;
                break with_stuck(why, stuck);
            }
            tokio::select! {
                message = control.recv() => match message {
                    None => return,
                    Some(Control::Stop) => {
                        drain(&shared, &unit, running.as_ref(), port).await;
                        let _freeing = freeing(&shared, &spec).await;
                        let stuck = running.stop().await;
                        running.forget().await;
                        shared.set(&unit, EngineState::Stopped, None, None, stuck);
                        return;
                    }
                    Some(Control::Sleep(reply)) => {
                        let slept = match (asleep, healthy_once) {
                            (true, _) => Ok(()),
                            (false, true) => put_to_sleep(&shared, &spec, running.as_ref(), (&host, port, key.as_deref())).await,
                            (false, false) => Err("it has not loaded yet".to_owned()),
                        };
                        asleep = asleep || slept.is_ok();
                        let _ = reply.send(slept);
                    }
                    Some(Control::Wake(reply)) => {
                        if !asleep {
                            let _ = reply.send(Ok(()));
                            continue;
                        }
                        let api = spec.recipe.sleep_api().unwrap_or(super::spec::SleepApi::Vllm);
                        match super::sleep::wake(api, (&host, port, key.as_deref()), settings.start_timeout).await {
                            Ok(took) => {
                                asleep = false;
                                shared.set_sleep(&unit, None, Some(took), None);
                                shared.set(&unit, EngineState::Healthy, running.pid(), Some(port), None);
                                let _ = reply.send(Ok(()));
                            }
                            Err(why) => {
                                // Its memory did not come back as it was: started again, a cold start.
                                let _ = reply.send(Err(why.clone()));
                                shared.set_sleep(&unit, None, None, None);
                                let stuck = running.stop().await;
                                break with_stuck(format!("its wake failed ({why}), so it starts again"), stuck);
                            }
                        }
                    }
                },
                how = running.exited() => {
                    let stuck = running.clean_up().await;
                    if asleep {
                        // Started again it would load its whole share, where the plan holds only what it kept
                        // asleep: it stays down until the fleet unloads it, and its next request starts it.
                        running.forget().await;
                        died_asleep(&shared, &unit, with_stuck(how, stuck), &mut control).await;
                        return;
                    }
                    break with_stuck(how, stuck);
                }
                () = tokio::time::sleep_until(next_probe) => {
                    let wait = if healthy_once {
                        settings.health_interval
                    } else {
                        let wait = starting_wait.min(settings.health_interval);
                        starting_wait = wait * 2;
                        wait
                    };
                    next_probe = tokio::time::Instant::now() + wait;
                    // Until it first serves, what answers at its address counts only once it runs as it
                    // should (a cluster's job RUNNING, not PENDING); why not is its message meanwhile.
                    let serving = if healthy_once { Ok(()) } else { running.serving().await };
                    if let Err(why) = &serving {
                        say_starting(&shared, &unit, running.pid(), port, why, &mut waiting_for);
                    }
                    // A loaded machine answers slowly: a probe may take longer than the interval.
                    if asleep {
                        // vLLM and SGLang answer their health check asleep: one that does not is gone.
                        if healthy(&host, port, key.as_deref(), settings.health_interval.max(PROBE_TIMEOUT)).await {
                            failed_checks = 0;
                        } else {
                            failed_checks += 1;
                            if failed_checks >= settings.restart_unhealthy_after {
                                let stuck = running.stop().await;
                                running.forget().await;
                                let why = with_stuck(format!("failed {failed_checks} health checks in a row"), stuck);
                                died_asleep(&shared, &unit, why, &mut control).await;
                                return;
                            }
                        }
                    } else if serving.is_ok() && healthy(&host, port, key.as_deref(), settings.health_interval.max(PROBE_TIMEOUT)).await {
                        failed_checks = 0;
                        if !healthy_once || shared.state(&unit) != Some(EngineState::Healthy) {
                            if reading.is_some() {
                                if let Some(why) = took_too_much(&shared, &spec, running.pid(), &mut oversized).await {
                                    // Its stop frees what it took: not while another beside it sizes itself.
                                    failures = 0;
                                    again = true;
                                    reading = None;
                                    let _freeing = freeing(&shared, &spec).await;
                                    let stuck = running.stop().await;
                                    break with_stuck(why, stuck);
                                }
                            }
                            if !healthy_once {
                                shared.readiness.ready(&unit, Instant::now());
                                // What it allocated, where its log says: printed as it loaded.
                                if let Some(reported) = reported_memory(&shared, &spec).await {
                                    shared.set_reported(&unit, reported);
                                }
                            }
                            healthy_once = true;
                            // Serving, it has allocated its KV cache: what its neighbours free is
                            // no longer its.
                            reading = None;
                            failures = 0;
                            shared.set(&unit, EngineState::Healthy, running.pid(), Some(port), None);
                        }
                    } else if !healthy_once {
                        // How far it has got, from its own log, where that is a file here.
                        if serving.is_ok() && matches!(spec.host, super::spec::Host::Local | super::spec::Host::Simulated) {
                            if let Some(progress) = load_progress(&shared, &spec).await {
                                say_starting(&shared, &unit, running.pid(), port, &progress, &mut waiting_for);
                            }
                        }
                        if started.elapsed() > settings.start_timeout {
                            let stuck = running.stop().await;
                            break with_stuck(format!("was not healthy within {:?} of its start", settings.start_timeout), stuck);
                        }
                    } else {
                        failed_checks += 1;
                        if failed_checks == settings.unhealthy_after {
                            shared.set(&unit, EngineState::Unhealthy, running.pid(), Some(port),
                                Some(format!("{failed_checks} health checks in a row failed")));
                        }
                        if failed_checks >= settings.restart_unhealthy_after {
                            drain(&shared, &unit, running.as_ref(), port).await;
                            let _freeing = freeing(&shared, &spec).await;
                            let stuck = running.stop().await;
                            break with_stuck(format!("failed {failed_checks} health checks in a row"), stuck);
                        }
                    }
                }
            }
        };
        running.forget().await;
        drop(reading);
        if again {
            // OVERSIZED_STARTS bounds these.
            shared.count_restart(&unit);
            shared.set(&unit, EngineState::Restarting, None, None, Some(why));
            continue;
        }
        match back_off(&shared, &spec, &mut failures, why, &mut control).await {
            Next::Retry => {}
            Next::End => return,
        }
    }
}

/// Before an engine is stopped: out of the gateway's rotation, its requests in flight given the drain grace.
/// A serving engine always drains; one whose health checks fail drains the requests it was given while it
/// served (it may still be answering them), and is stopped at once where it has none.
async fn drain(shared: &Shared, unit: &str, running: &dyn Running, port: u16) {
    let serving = match shared.state(unit) {
        Some(EngineState::Healthy) => true,
        Some(EngineState::Unhealthy) => shared.counter(unit).load(Ordering::SeqCst) > 0,
        _ => false,
    };
    if !serving {
        return;
    }
    let left = shared.drain(unit, running.pid(), port).await;
    if left > 0 {
        tracing::warn!(
            "engine {unit}: {left} requests still in flight after {:?}: stopping it",
            shared.settings.drain_grace
        );
    }
}

/// Puts a serving engine to sleep: out of the gateway's rotation and its requests in flight done (the
/// drain), then asleep by its recipe's endpoint, keeping what is measured then. One that cannot sleep
/// serves on, saying why.
async fn put_to_sleep(
    shared: &Shared,
    spec: &EngineSpec,
    running: &dyn Running,
    (host, port, key): (&str, u16, Option<&str>),
) -> Result<(), String> {
    let unit = &spec.unit;
    let Some(api) = spec.recipe.sleep_api() else {
        return Err("its command line asks for no sleep mode".to_owned());
    };
    drain(shared, unit, running, port).await;
    match super::sleep::fall_asleep(
        &shared.settings,
        spec,
        api,
        running.pid(),
        (host, port, key),
    )
    .await
    {
        Ok(slept) => {
            shared.set_sleep(unit, Some(slept), None, None);
            shared.set(unit, EngineState::Asleep, running.pid(), Some(port), None);
            Ok(())
        }
        Err(why) => {
            let why = format!("it could not be put to sleep: {why}");
            shared.set_sleep(unit, None, None, Some(why.clone()));
            shared.set(unit, EngineState::Healthy, running.pid(), Some(port), None);
            Err(why)
        }
    }
}

/// An adopted engine that can sleep, as it is: registered awake, it is found asleep where vLLM says so.
/// Asleep and wanted asleep, it is taken up asleep, what it keeps measured; asleep and wanted awake (a wake
/// committed before Tessera restarted), it is woken now, as the plan holds its whole share; one that does
/// not wake is started again (the error). Awake and wanted asleep, the conductor puts it to sleep in its
/// GPU's order. Says whether it is asleep.
async fn take_up_asleep(
    shared: &Shared,
    spec: &EngineSpec,
    running: &dyn Running,
    (host, port, key): (&str, u16, Option<&str>),
) -> Result<bool, String> {
    let Some(api) = spec.recipe.sleep_api() else {
        return Ok(false);
    };
    if super::sleep::is_sleeping(host, port, key).await != Some(true) {
        return Ok(false);
    }
    if !spec.asleep {
        return super::sleep::wake(api, (host, port, key), shared.settings.start_timeout)
            .await
            .map(|_| false)
            .map_err(|why| {
                format!("it was found asleep and did not wake ({why}), so it starts again")
            });
    }
    let slept = super::sleep::measure(&shared.settings, spec, running.pid()).await;
    shared.set_sleep(&spec.unit, Some(slept), None, None);
    shared.set(
        &spec.unit,
        EngineState::Asleep,
        running.pid(),
        Some(port),
        None,
    );
    shared.lock().mark_asleep(&spec.unit, true);
    Ok(true)
}

/// An engine that died asleep: failed, not started again, until it is stopped.
async fn died_asleep(
    shared: &Shared,
    unit: &str,
    why: String,
    control: &mut mpsc::Receiver<Control>,
) {
    shared.set_sleep(unit, None, None, None);
    shared.set(
        unit,
        EngineState::Failed,
        None,
        None,
        Some(format!("it died asleep: {why}")),
    );
    wait_for_stop(control).await;
    shared.set(unit, EngineState::Stopped, None, None, None);
}

/// What a supervisor does after a failure.
enum Next {
    Retry,
    End,
}

/// Counts a failure: after too many in a row the engine is left failed until it is stopped; otherwise it
/// waits out its backoff (a stop ends the wait).
async fn back_off(
    shared: &Shared,
    spec: &EngineSpec,
    failures: &mut u32,
    why: String,
    control: &mut mpsc::Receiver<Control>,
) -> Next {
    let settings = &shared.settings;
    let unit = &spec.unit;
    *failures += 1;
    if *failures > settings.max_restarts {
        shared.set(
            unit,
            EngineState::Failed,
            None,
            None,
            Some(format!(
                "{why}; it failed {failures} times in a row, so it is not restarted again"
            )),
        );
        wait_for_stop(control).await;
        shared.set(unit, EngineState::Stopped, None, None, None);
        return Next::End;
    }
    let delay = settings.backoff(*failures);
    shared.readiness.resumes_at(unit, Instant::now() + delay);
    shared.count_restart(unit);
    shared.set(
        unit,
        EngineState::Restarting,
        None,
        None,
        Some(format!(
            "{why}; restarting in {:.1} s (attempt {failures} of {})",
            delay.as_secs_f64(),
            settings.max_restarts
        )),
    );
    let wait = sleep(delay);
    tokio::pin!(wait);
    loop {
        tokio::select! {
            () = &mut wait => return Next::Retry,
            message = control.recv() => match message {
                // Not running, it can be neither put to sleep nor woken: it starts awake after its backoff.
                Some(Control::Sleep(reply) | Control::Wake(reply)) => {
                    let _ = reply.send(Err("its engine is not running".to_owned()));
                }
                None | Some(Control::Stop) => {
                    shared.set(unit, EngineState::Stopped, None, None, None);
                    return Next::End;
                }
            }
        }
    }
}

/// How far past its share an engine that sized itself by what was free may be before it starts again:
/// a tenth of it, and no less than 2 GB. SGLang's fraction bounds its weights and KV cache, not its
/// activations and CUDA graphs (a GB or two on top); what memory let go beside it hands it is a
/// neighbour's share or another program's, far more.
const PAST_SHARE_PERCENT: u64 = 10;
const PAST_SHARE_AT_LEAST: Bytes = Bytes(2 * placement::units::GB);

/// How many starts in a row may take too much before the engine serves on as it is (the GPU's readings
/// flag it as over its share): memory coming and going beside it on every start is not Tessera's to end.
const OVERSIZED_STARTS: u32 = 2;

/// Why an engine that sized itself by what was free on its GPUs as it loaded must start again: it holds
/// far more than its share on one of them, as the GPUs read now. Memory let go beside it as it loaded
/// (another program's, an engine outside Tessera's order) became its own, and a neighbour the plan holds
/// room for would find it taken. `None` where it took its share, cannot be read, or has taken too much
/// [`OVERSIZED_STARTS`] times in a row already.
async fn took_too_much(
    shared: &Shared,
    spec: &EngineSpec,
    pid: Option<u32>,
    oversized: &mut u32,
) -> Option<String> {
    let share = spec.share?;
    let held = super::sleep::held(&shared.settings, spec, pid).await?;
    let (gpu, most) = spec.gpus.iter().zip(held).max_by_key(|(_, b)| *b)?;
    let past = Bytes(share.get() / 100 * PAST_SHARE_PERCENT).max(PAST_SHARE_AT_LEAST);
    if most.get() <= share.get() + past.get() {
        *oversized = 0;
        return None;
    }
    *oversized += 1;
    let took = format!(
        "it took {} on GPU {gpu} of its {} share, sizing itself by what was free as memory was let go beside it",
        most.size_text(),
        share.size_text()
    );
    if *oversized > OVERSIZED_STARTS {
        // Its next start (after a crash, say) may try again.
        *oversized = 0;
        tracing::warn!(
            "{}: {took}, on {OVERSIZED_STARTS} starts in a row: it serves on as it is",
            spec.unit
        );
        return None;
    }
    Some(format!("{took}, so it starts again to take its share"))
}

/// Stopping `spec`'s engine frees its memory: its turn to, once no SGLang engine beside it loads by what
/// is free (`free_readers`); none where the server is shutting down, which waits on no load.
async fn freeing(shared: &Arc<Shared>, spec: &EngineSpec) -> Option<Turn> {
    if *shared
        .shutting_down
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
    {
        return None;
    }
    let within = shared.settings.start_timeout;
    Some(
        shared
            .free_readers
            .free(&spec.unit, gpu_refs(spec), within)
            .await,
    )
}

fn gpu_refs(spec: &EngineSpec) -> Vec<placement::GpuRef> {
    spec.gpus
        .iter()
        .map(|&index| placement::GpuRef::new(&spec.machine, index))
        .collect()
}

/// Whether the engine sizes itself by what is free on its GPUs as it loads, bounded by nothing else:
/// SGLang on a share without a `--max-total-tokens` of Tessera's (its model unread, or made up).
fn reads_free(spec: &EngineSpec, sizing: &super::spec::Sizing) -> bool {
    spec.recipe.engine == crate::catalog::Engine::Sglang
        && spec.share.is_some()
        && !sizing.args.iter().any(|a| a == "--max-total-tokens")
}

/// Starts the engine through its machine's executor, and says so; with its turn to read what is free,
/// where it sizes itself by that.
async fn start(
    shared: &Arc<Shared>,
    spec: &EngineSpec,
) -> Result<(Box<dyn Running>, Option<Turn>), StartFailure> {
    let executor = shared.executor(spec).ok_or_else(|| {
        StartFailure::Refused(format!("nothing can start engines on {}", spec.machine))
    })?;
    let port = executor.port(spec).await?;
    // An engine on a cluster's node listens on the node's loopback, on a port of its own, behind a guard
    // on the node's address and `port` that lets through only requests with its key, which only the
    // gateway and the health probe send.
    let guarded = matches!(spec.host, super::spec::Host::Cluster { .. });
    let mut engine_port = port;
    while guarded && engine_port == port {
        engine_port = executor.port(spec).await?;
    }
    let key = guarded.then(|| crate::random::random_hex(24));
    let sizing = super::sizing::size(spec, &*shared.files(&spec.host, &spec.machine))
        .await
        .map_err(|e| StartFailure::Refused(e.to_string()))?;
    // Before what is free is read: no neighbour is stopping, and none stops until it has loaded.
    let reading = match reads_free(spec, &sizing) {
        true => {
            let within = shared.settings.drain_grace + shared.settings.stop_timeout * 2;
            Some(
                shared
                    .free_readers
                    .read(&spec.unit, gpu_refs(spec), within)
                    .await,
            )
        }
        false => None,
    };
    // What the ledger leaves free, or more where the GPU reads more (a neighbour holds less than its
    // share); never less: memory held outside the plan (another program, maybe for a moment) is not
    // counted against the fraction, which once it is let go would take more than the share.
    let ledger = shared.free_at_start(spec);
    let free = measured_free(&shared.settings, spec)
        .await
        .map_or(ledger, |measured| measured.max(ledger));
    shared.readiness.starting(&spec.unit, Instant::now());
    let mut launch = spec
        .launch(
            engine_port,
            free,
            &shared.settings.demo_engine,
            key.as_deref(),
            &sizing,
        )
        .map_err(|e| StartFailure::Refused(e.to_string()))?;
    // On simulated GPUs (the demo fleet's, a cluster node's made-up ones), its demo engine allocates its
    // memory for real.
    if let (Some(dir), true) = (&shared.settings.sim_dir, spec.host.made_up()) {
        use crate::inventory::simulated::{SIM_DIR_VAR, SIM_GPUS_VAR};
        let gpus: Vec<String> = spec
            .gpus
            .iter()
            .map(|i| format!("{}:{i}", spec.machine))
            .collect();
        launch
            .env
            .insert(SIM_DIR_VAR.into(), dir.display().to_string());
        launch.env.insert(SIM_GPUS_VAR.into(), gpus.join(","));
    }
    shared.set(&spec.unit, EngineState::Starting, None, Some(port), None);
    let running = executor.start(spec, &mut launch, port).await?;
    shared.set_launch(&spec.unit, &launch);
    shared.set(
        &spec.unit,
        EngineState::Starting,
        running.pid(),
        Some(port),
        None,
    );
    Ok((running, reading))
}

/// What is free on `spec`'s GPUs now (the least of them) as they read, for an SGLang engine on GPUs that
/// can be read (this machine's, or simulated ones): SGLang takes its fraction of that, and a neighbour
/// that holds less than its share (llama.cpp sized to it) leaves more free than the ledger reckons, which
/// a fraction of the ledger's figure would let SGLang take.
async fn measured_free(settings: &super::Settings, spec: &EngineSpec) -> Option<Bytes> {
    use super::process::off_executor;
    use super::spec::Host;
    use crate::inventory::simulated::SimulatedGpus;
    if spec.recipe.engine != crate::catalog::Engine::Sglang {
        return None;
    }
    let (machine, gpus) = (spec.machine.clone(), spec.gpus.clone());
    let free: Vec<Bytes> = match &spec.host {
        Host::Simulated => {
            let sim = SimulatedGpus::open(settings.sim_dir.as_ref()?);
            off_executor(move || {
                gpus.iter()
                    .map(|i| {
                        let now = sim.read(&placement::GpuRef::new(&machine, *i)).ok()?;
                        Some(now.total.saturating_sub(now.used))
                    })
                    .collect::<Option<Vec<Bytes>>>()
            })
            .await?
        }
        Host::Local => {
            let reader = settings.gpus.clone()?;
            off_executor(move || {
                let now = reader.read(&crate::inventory::Ours::default()).ok()?;
                gpus.iter()
                    .map(|i| {
                        let gpu = now.machine.gpus.iter().position(|g| g.index == *i)?;
                        let used = now.live.get(gpu)?.used;
                        Some(now.machine.gpus[gpu].total.saturating_sub(used))
                    })
                    .collect::<Option<Vec<Bytes>>>()
            })
            .await?
        }
        _ => return None,
    };
    free.into_iter().min()
}

/// A starting engine's message is `said` now (why it waits, or how far its load has got), where it says
/// something else: each change is one state event.
fn say_starting(
    shared: &Shared,
    unit: &str,
    pid: Option<u32>,
    port: u16,
    said: &str,
    last: &mut Option<String>,
) {
    if last.as_deref() != Some(said) {
        shared.set(
            unit,
            EngineState::Starting,
            pid,
            Some(port),
            Some(said.to_owned()),
        );
        *last = Some(said.to_owned());
    }
}

/// How far `spec`'s engine has got with its load, from the last lines of its log.
async fn load_progress(shared: &Shared, spec: &EngineSpec) -> Option<String> {
    let lines = shared.executor(spec)?.logs(&spec.unit, 20).await.ok()?;
    super::progress::load_progress(&lines)
}

/// What `spec`'s engine said it allocated on each of its GPUs, from its log since it started.
async fn reported_memory(shared: &Shared, spec: &EngineSpec) -> Option<Vec<placement::Bytes>> {
    let lines = shared
        .executor(spec)?
        .logs(&spec.unit, REPORT_LINES)
        .await
        .ok()?;
    Some(super::progress::reported_memory(&lines)).filter(|r| !r.is_empty())
}

/// How many of an engine's last lines are read for its report once it serves: llama.cpp prints a few
/// hundred as it loads.
const REPORT_LINES: usize = 1000;

/// `why` an engine went down, with what of it is stuck.
fn with_stuck(why: String, stuck: Option<String>) -> String {
    match stuck {
        Some(stuck) => format!("{why} ({stuck})"),
        None => why,
    }
}

async fn wait_for_stop(control: &mut mpsc::Receiver<Control>) {
    loop {
        match control.recv().await {
            None | Some(Control::Stop) => return,
            Some(Control::Sleep(reply) | Control::Wake(reply)) => {
                let _ = reply.send(Err("its engine is not running".to_owned()));
            }
        }
    }
}

/// `GET /health` on the engine (with its key, where it has one) answers 2xx within `within`; and where
/// it has a key, whatever answers there takes it: an engine given another key (an earlier run of it, still
/// on its node's port) refuses `GET /v1/models` with 401 or 403, and is not this one. (An engine that
/// lists its models to anyone, as llama.cpp does, or serves no such route, cannot be told apart this way.)
async fn healthy(host: &str, port: u16, key: Option<&str>, within: Duration) -> bool {
    timeout(within, probe(host, port, key))
        .await
        .unwrap_or(false)
}

async fn probe(host: &str, port: u16, key: Option<&str>) -> bool {
    if !status(host, port, key, "/health")
        .await
        .is_some_and(|s| s.is_success())
    {
        return false;
    }
    key.is_none()
        || !matches!(
            status(host, port, key, "/v1/models").await,
            Some(hyper::StatusCode::UNAUTHORIZED | hyper::StatusCode::FORBIDDEN)
        )
}

/// The status `GET path` on the engine gets, with its key where it has one; none without an answer.
async fn status(host: &str, port: u16, key: Option<&str>, path: &str) -> Option<hyper::StatusCode> {
    use http_body_util::Empty;
    use hyper_util::rt::TokioIo;
    let stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    let mut request =
        hyper::Request::get(path).header(hyper::header::HOST, format!("{host}:{port}"));
    if let Some(key) = key {
        request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {key}"));
    }
    let request = request.body(Empty::<axum::body::Bytes>::new()).ok()?;
    Some(sender.send_request(request).await.ok()?.status())
}

/// The least time a health check is given to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// The first wait between health probes of a starting engine; it doubles up to the health interval.
const STARTING_PROBE: Duration = Duration::from_millis(50);

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::StatusCode;
    use axum::routing::get;

    /// An engine on a port of its own that answers its health check and lists its models with `models`.
    async fn engine(models: StatusCode) -> u16 {
        let app = axum::Router::new()
            .route("/health", get(|| async { StatusCode::OK }))
            .route("/v1/models", get(move || async move { models }));
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move { axum::serve(listener, app).await });
        port
    }

    #[tokio::test]
    async fn an_engine_given_a_key_is_healthy_only_where_what_answers_on_its_port_takes_that_key() {
        let within = Duration::from_secs(5);
        // Another engine (an earlier run, given another key) answers on the port: not this one.
        let other = engine(StatusCode::UNAUTHORIZED).await;
        assert!(!healthy("127.0.0.1", other, Some("k"), within).await);
        // Without a key there is nothing to tell them apart by.
        assert!(healthy("127.0.0.1", other, None, within).await);
        // This engine takes its key; one that lists its models to anyone, or has no such route, is
        // taken at its health check's word.
        for models in [StatusCode::OK, StatusCode::NOT_FOUND] {
            let port = engine(models).await;
            assert!(
                healthy("127.0.0.1", port, Some("k"), within).await,
                "{models}"
            );
        }
    }
}
