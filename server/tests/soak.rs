//! The chaos soak: the demo fleet on simulated GPUs (`--simulate-gpus`), its demo engines loading, draining
//! and failing like real ones (a profile, time-compressed), clients calling models through the gateway all
//! along in bursts (each model has quiet stretches, where an on-demand one sleeps or unloads), an operator
//! changing the fleet at random (one model's replicas following the bursts), and faults: an engine crash, a hang, an outside
//! allocation spike on a GPU, and Tessera itself restarted (SIGTERM and a start), upgraded (SIGTERM and a
//! start of a new copy of its binary, renamed over the old as dpkg does) or killed (`kill -9` and a start), on
//! the same data and on the socket the soak holds as systemd's `tessera.socket` does. Counted throughout:
//! overfills (allocations the simulated driver refused where Tessera's engines alone left no room), requests
//! lost (a cut stream, a server error, a refusal without `Retry-After`, a connection refused; Tessera's own
//! restarts are no excuse: only a request in flight in Tessera when it was killed may be cut), and at the
//! end, the time until every model that should serve does, that what runs is what was committed, and that
//! no process of Tessera's is an orphan or a duplicate.
//!
//! Seeded and bounded: `SOAK_SEED` (without it, seed 1 and then an unseen one, each printed),
//! `SOAK_SECONDS` (40 for a seed given, 20 each otherwise), `SOAK_SPEED` (20, the profile's time
//! compression), `SOAK_REPORT` (a file for the figures as JSON). `scripts/soak` runs a long one. A seed
//! that fails is replayed by its number, and becomes a case of its own below.

mod support;

use serde_json::{json, Value};
use server::inventory::simulated::SimulatedGpus;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use support::chaos::{self, act, ask, call, settled, Current, Outcome, Rng};
use support::Server;

/// What the soak counted.
#[derive(Debug, Default, serde::Serialize)]
struct Report {
    seed: u64,
    seconds: u64,
    speed: f64,
    actions: BTreeMap<String, u64>,
    actions_refused: u64,
    faults: BTreeMap<String, u64>,
    /// Each fault as it was made: when, what and where.
    fault_log: Vec<String>,
    requests: u64,
    answered: u64,
    /// 503 with `Retry-After` within the bound: the client was told when to ask again.
    told_to_retry: u64,
    /// The model was removed between the list and the call.
    gone: u64,
    /// Cut or failed on an engine the soak itself crashed or hung.
    lost_on_faulted_engine: u64,
    /// In flight in Tessera when the soak killed it (`kill -9`): cut, as a crash cuts them.
    cut_by_kill: u64,
    lost: u64,
    lost_examples: Vec<String>,
    overfills: u64,
    /// Each overfill: the GPU, who asked, and what held it.
    overfill_examples: Vec<String>,
    refusals_outside: u64,
    /// On-demand models put to sleep past their keep-alive, and woken by a request.
    sleeps: u64,
    wakes: u64,
    /// Steps of the autoscaled model's replicas, up or down, each placed where it fits.
    scale_steps: u64,
    /// The autoscaled model's replicas at the end (`GET /api/models/{name}`), where it is deployed so.
    replicas_at_end: Value,
    /// After each burst of changes and faults, the time until every model that should serve did.
    converged_ms: Vec<u64>,
    converged_p50_ms: u64,
    converged_p99_ms: u64,
    /// A burst after which what should serve did not within the bound.
    not_converged: bool,
    /// Each simulated GPU's memory in use at the end, GB: the engines really allocated it.
    held_at_end_gb: BTreeMap<String, f64>,
    /// What runs disagrees with what was committed at the end.
    ledger_mismatches: Vec<String>,
    /// Where it did not converge: each engine then (its unit, GPUs, state and why), and each group's GPUs.
    engines_when_not_converged: Vec<String>,
    /// Each orphan: its PID, the engine it says it is, its parent, its command; and the engines listed then.
    orphans: Vec<String>,
    engines_when_orphaned: Vec<String>,
    duplicates: Vec<String>,
}

/// The clients calling the models all along.
const CLIENTS: u64 = 3;

/// The model deployed with replicas that follow its load.
const AUTOSCALED: &str = "embedder";

/// The models the operator deploys, changes and removes at random; the autoscaled one stays, changed only
/// by its load (and moved by a repack).
const MODELS: [&str; 4] = ["glm-5.3", "vision", "speech", "semantic-router"];
const GPUS: [&str; 5] = [
    "atlas:0",
    "atlas:1",
    "h200-node:0",
    "h200-node:1",
    "h200-node:2",
];

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How the soak starts `program` on `data`.
fn launch(program: &Path, data: &Path, sim: &Path, speed: f64) -> support::Launch {
    // At speed 20: loads of 1 to 3 s, 50 ms to the first token, 0.5 s holding memory after SIGTERM, and a
    // tenth of each share held by a helper process that outlives its engine until Tessera ends it.
    let profile = json!({"speed": speed, "load_s": [20, 60], "first_token_s": 1, "exit_delay_s": 10, "helper": 0.1});
    chaos::launch(
        program,
        data,
        &["--demo", "--evict-after-s", "3"],
        sim,
        &profile,
    )
}

/// When the soak killed Tessera: a request in flight then is cut, as a crash cuts it.
#[derive(Default)]
struct Kills(Mutex<Vec<Instant>>);

impl Kills {
    fn note(&self) {
        self.0.lock().unwrap().push(Instant::now());
    }

    /// Whether a kill fell while a request that began at `began` was under way.
    fn during(&self, began: Instant) -> bool {
        self.0.lock().unwrap().iter().any(|at| *at >= began)
    }
}

/// When the soak crashed or hung an engine of each model: a request on it then is counted apart.
#[derive(Default)]
struct Faulted(Mutex<Vec<(String, Instant)>>);

impl Faulted {
    fn note(&self, model: &str) {
        self.0
            .lock()
            .unwrap()
            .push((model.to_owned(), Instant::now()));
    }

    /// Whether `model`'s engine was faulted while a request that began at `began` was under way, or
    /// in the grace before (its restart).
    fn during(&self, model: &str, began: Instant) -> bool {
        self.0
            .lock()
            .unwrap()
            .iter()
            .any(|(m, at)| m == model && *at + Duration::from_secs(5) >= began)
    }
}

/// Clients calling the models served, until `done`.
/// Traffic comes in bursts: in each phase of this many seconds, a third of the models (drawn by the seed)
/// get no request, so that an on-demand one idles past its keep-alive (and sleeps or unloads), then is
/// woken or loaded by the next phase's burst.
const QUIET_PHASE_S: u64 = 15;

/// Whether `model` gets no request in `phase`: the same for every client of one soak.
fn quiet(model: &str, phase: u64, seed: u64) -> bool {
    let name = model.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    Rng::new(name ^ seed.wrapping_add(phase)).below(3) == 0
}

async fn client(
    current: Current,
    done: Arc<AtomicBool>,
    faulted: Arc<Faulted>,
    kills: Arc<Kills>,
    report: Arc<Mutex<Report>>,
    seed: u64,
    quiet_seed: u64,
) {
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    while !done.load(Ordering::SeqCst) {
        let phase = started.elapsed().as_secs() / QUIET_PHASE_S;
        let (_, served) = call(&current, "GET", "/v1/models", Value::Null).await;
        let models: Vec<String> = served["data"]
            .as_array()
            .map(|d| {
                d.iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_owned))
                    .filter(|m| m != "semantic-router")
                    .filter(|m| !quiet(m, phase, quiet_seed))
                    .collect()
            })
            .unwrap_or_default();
        if models.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        // The autoscaled model is the busy one while it is asked: two requests in three, streamed (each a
        // second or so), so that its bursts grow it and its quiet phases shrink it.
        let model = match models.iter().find(|m| *m == AUTOSCALED) {
            Some(busy) if rng.below(3) > 0 => busy.clone(),
            _ => rng.pick(&models).clone(),
        };
        let began = Instant::now();
        let stream = model == AUTOSCALED || rng.below(2) == 0;
        let outcome = ask(&current, &model, stream).await;
        let mut r = report.lock().unwrap();
        r.requests += 1;
        match outcome {
            Outcome::Answered => r.answered += 1,
            Outcome::ToldToRetry => r.told_to_retry += 1,
            Outcome::Gone => r.gone += 1,
            Outcome::Down | Outcome::Failed(_) if kills.during(began) => r.cut_by_kill += 1,
            Outcome::Failed(_) if faulted.during(&model, began) => r.lost_on_faulted_engine += 1,
            Outcome::Down => {
                r.lost += 1;
                if r.lost_examples.len() < 10 {
                    r.lost_examples.push(format!("{model}: no connection"));
                }
            }
            Outcome::Failed(why) => {
                r.lost += 1;
                if r.lost_examples.len() < 10 {
                    r.lost_examples.push(why);
                }
            }
        }
    }
}

/// One fault, on a serving engine or on the fleet.
async fn fault(
    current: &Current,
    rng: &mut Rng,
    faulted: &Faulted,
    sim: &SimulatedGpus,
    spikes: &mut Vec<tokio::process::Child>,
) -> Option<(&'static str, String)> {
    let (_, engines) = call(current, "GET", "/api/engines", Value::Null).await;
    let serving: Vec<Value> = engines
        .as_array()
        .map(|e| {
            e.iter()
                .filter(|e| e["state"] == "healthy")
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    match rng.below(3) {
        0 | 1 if !serving.is_empty() => {
            let engine = rng.pick(&serving);
            let port = engine["port"].as_u64()? as u16;
            let model = engine["model"].as_str().or(engine["worker"].as_str())?;
            faulted.note(model);
            let (what, path) = if rng.below(2) == 0 {
                ("engine crash", "/crash")
            } else {
                ("engine hang", "/fail-health")
            };
            support::request(port, "POST", path, None).await;
            Some((what, engine["unit"].as_str()?.to_owned()))
        }
        _ => {
            // Another program takes a third of a GPU for 2 s, whether or not it is full.
            let gpu: placement::GpuRef = rng.pick(&GPUS).parse().ok()?;
            let reading = sim.read(&gpu).ok()?;
            let spike = tokio::process::Command::new("sleep")
                .arg("2")
                .kill_on_drop(true)
                .spawn()
                .ok()?;
            let pid = spike.id()?;
            let third = placement::Bytes(reading.total.get() / 3);
            sim.allocate(&gpu, pid, third, true).ok()?;
            spikes.push(spike);
            Some(("outside allocation spike", gpu.to_string()))
        }
    }
}

async fn soak(seed: u64, seconds: u64) -> Report {
    let speed: f64 = env_or("SOAK_SPEED", 20.0);
    let dir = tempfile::tempdir().unwrap();
    let (data, sim_dir): (PathBuf, PathBuf) = (dir.path().join("data"), dir.path().join("sim"));
    std::fs::create_dir_all(&data).unwrap();
    // Installed as the package installs it, so that an upgrade can put another build in its place.
    let installed = dir.path().join("bin").join("tessera");
    support::install_binary(&installed, "0");
    let current: Current =
        chaos::current(Server::start_as(launch(&installed, &data, &sim_dir, speed)).await);
    let sim = SimulatedGpus::open(&sim_dir);
    let report = Arc::new(Mutex::new(Report {
        seed,
        seconds,
        speed,
        ..Report::default()
    }));
    // glm-5.3 on demand, sleeping past its keep-alive (its quiet stretches put it to sleep), vision pinned,
    // embedder autoscaled between one and three replicas on three GPUs, each answer taking a second or so
    // (the bursts grow it, the quiet stretches shrink it).
    let glm = json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40, "args": ["--enable-sleep-mode"],
                     "demand": {"mode": "on_demand", "keep_alive": 10}});
    let vision = json!({"model": "vision", "gpus": ["h200-node:0"], "share": 25});
    let embedder = json!({"model": AUTOSCALED, "gpus": ["h200-node:1", "h200-node:2", "h200-node:3"],
                          "share": 10, "replicas": {"min": 1, "max": 3, "up_s": 2, "down_s": 4},
                          "env": {"TESSERA_DEMO_TOKEN_MS": "150"}});
    for body in [glm, vision, embedder] {
        let (status, answer) = call(&current, "POST", "/api/deployments", body).await;
        assert_eq!(status, 201, "{answer}");
    }
    let done = Arc::new(AtomicBool::new(false));
    let kills = Arc::new(Kills::default());
    let faulted = Arc::new(Faulted::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            tokio::spawn(client(
                current.clone(),
                done.clone(),
                faulted.clone(),
                kills.clone(),
                report.clone(),
                seed * 31 + i,
                seed,
            ))
        })
        .collect();
    let mut rng = Rng::new(seed);
    let mut spikes = Vec::new();
    let mut upgrades = 0;
    let began = Instant::now();
    let mut wrong = Vec::new();
    // Bursts of changes and a fault, each followed by a wait until what should serve does.
    while began.elapsed() < Duration::from_secs(seconds) {
        let burst = Instant::now();
        while burst.elapsed() < Duration::from_secs(4) {
            tokio::time::sleep(Duration::from_millis(200 + rng.below(500))).await;
            let (action, taken) = act(&current, &mut rng, &MODELS, &GPUS).await;
            let mut r = report.lock().unwrap();
            *r.actions.entry(action.to_owned()).or_default() += 1;
            r.actions_refused += u64::from(!taken);
        }
        let what = if rng.below(5) == 0 {
            // Tessera itself goes and comes back on the same data and socket; its engines serve on.
            let server = current.server.write().await.take().unwrap();
            let (what, restarted) = match rng.below(3) {
                0 => {
                    kills.note();
                    ("kill -9 of Tessera", server.crash_and_restart().await)
                }
                1 => ("Tessera restarted", server.restart().await),
                _ => {
                    let (launch, status) = server.terminate().await;
                    assert!(
                        status.success(),
                        "Tessera exits cleanly on SIGTERM: {status}"
                    );
                    upgrades += 1;
                    support::install_binary(&installed, &upgrades.to_string());
                    ("Tessera upgraded", Server::start_as(launch).await)
                }
            };
            *current.server.write().await = Some(restarted);
            Some((what, String::new()))
        } else {
            fault(&current, &mut rng, &faulted, &sim, &mut spikes).await
        };
        if let Some((what, on)) = what {
            let mut r = report.lock().unwrap();
            *r.faults.entry(what.to_owned()).or_default() += 1;
            r.fault_log.push(format!("{}: {what} {on}", support::now()));
        }
        // The last change of the burst is made: every model that should serve does so within a bound.
        let last_change = Instant::now();
        let bound = Duration::from_secs(60);
        loop {
            let (ok, why) = settled(&current).await;
            if ok {
                let took = last_change.elapsed().as_millis() as u64;
                report.lock().unwrap().converged_ms.push(took);
                break;
            }
            if last_change.elapsed() > bound {
                wrong = why;
                let (_, engines) = call(&current, "GET", "/api/engines", Value::Null).await;
                let (_, groups) = call(&current, "GET", "/api/groups", Value::Null).await;
                let mut said = Vec::new();
                for e in engines.as_array().into_iter().flatten() {
                    said.push(format!(
                        "{} on {}: {} {}",
                        e["unit"], e["gpus"], e["state"], e["message"]
                    ));
                    // A failed engine's own last words say why it failed.
                    if e["state"] == "failed" {
                        let path = format!(
                            "/api/engines/{}/logs?lines=5",
                            e["id"].as_str().unwrap_or_default()
                        );
                        let (_, logs) = call(&current, "GET", &path, Value::Null).await;
                        said.push(format!("  its log ends: {}", logs["lines"]));
                    }
                }
                said.extend(groups.as_array().into_iter().flatten().map(|g| {
                    let members: Vec<String> = g["members"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|m| format!("{} {}%", m["name"], m["share_percent"]))
                        .collect();
                    format!("group {} on {}: {members:?}", g["name"], g["gpus"])
                }));
                // What holds each GPU's memory, process by process, as the simulated driver counts it.
                for gpu in GPUS.iter().copied().chain(["h200-node:3"]) {
                    if let Ok(reading) = sim.read(&gpu.parse().unwrap()) {
                        let held: Vec<String> = reading
                            .processes
                            .iter()
                            .map(|(pid, bytes)| {
                                format!(
                                    "{:.1} GB by {}",
                                    bytes.as_gb_f64(),
                                    support::describe(*pid)
                                )
                            })
                            .collect();
                        said.push(format!(
                            "{gpu} holds {:.1} GB: {held:?}",
                            reading.used.as_gb_f64()
                        ));
                    }
                }
                report.lock().unwrap().engines_when_not_converged = said;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if !wrong.is_empty() {
            break;
        }
    }
    done.store(true, Ordering::SeqCst);
    for c in clients {
        c.await.unwrap();
    }
    let mut report = Arc::into_inner(report).unwrap().into_inner().unwrap();
    report.not_converged = !wrong.is_empty();
    report.ledger_mismatches = wrong;
    let mut times = report.converged_ms.clone();
    times.sort_unstable();
    let at = |q: f64| {
        times
            .get(((times.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    report.converged_p50_ms = at(0.5).unwrap_or_default();
    report.converged_p99_ms = at(0.99).unwrap_or_default();
    for gpu in GPUS {
        if let Ok(reading) = sim.read(&gpu.parse().unwrap()) {
            report
                .held_at_end_gb
                .insert(gpu.to_owned(), reading.used.as_gb_f64());
        }
    }
    let refusals = sim.refusals();
    report.overfills = refusals.iter().filter(|r| r.overfill()).count() as u64;
    report.overfill_examples = refusals
        .iter()
        .filter(|r| r.overfill())
        .take(10)
        .map(|r| format!("{r:?}"))
        .collect();
    report.refusals_outside = refusals.len() as u64 - report.overfills;
    for (action, count) in [
        ("model.sleep", &mut report.sleeps),
        ("model.wake", &mut report.wakes),
        ("model.scale", &mut report.scale_steps),
    ] {
        let path = format!("/api/audit?action={action}&limit=500");
        let (_, entries) = call(&current, "GET", &path, Value::Null).await;
        *count = entries.as_array().map_or(0, |e| e.len() as u64);
    }
    let (_, autoscaled) = call(
        &current,
        "GET",
        &format!("/api/models/{AUTOSCALED}"),
        Value::Null,
    )
    .await;
    report.replicas_at_end = autoscaled["deployed"]["replicas"].clone();
    // No orphan, no duplicate: Tessera's processes are exactly its engines', one per engine.
    let (_, engines) = call(&current, "GET", "/api/engines", Value::Null).await;
    let engines = engines.as_array().cloned().unwrap_or_default();
    // One that serves answers: an on-demand model may be loading or unloading still as the clients stop.
    if let Some(any) = engines
        .iter()
        .find(|e| e["pid"].is_u64() && e["state"] == "healthy")
    {
        let reported = support::report(any).await;
        if let Some(instance) = reported["env"]["TESSERA_INSTANCE"].as_str() {
            let pids: BTreeSet<u32> = engines
                .iter()
                .filter_map(|e| e["pid"].as_u64().map(|p| p as u32))
                .collect();
            // Engines listed whose leader has exited: Tessera is stopping them (or restarting one that
            // crashed), and ends what they left behind before it forgets them.
            let ending: BTreeSet<&str> = engines
                .iter()
                .filter(|e| e["pid"].as_u64().is_some_and(|p| !support::alive(p as u32)))
                .filter_map(|e| e["unit"].as_str())
                .collect();
            // An engine's helper is its child while it runs; once its engine is gone (and no stop of it
            // is under way) it is an orphan.
            report.orphans = support::processes_of(instance)
                .into_iter()
                .filter(|p| !pids.contains(p))
                .filter(|p| support::parent_of(*p).is_none_or(|parent| !pids.contains(&parent)))
                .filter(|p| !support::engine_of(*p).is_some_and(|e| ending.contains(e.as_str())))
                .map(support::describe)
                .collect();
            if !report.orphans.is_empty() {
                report.engines_when_orphaned = engines
                    .iter()
                    .map(|e| {
                        format!(
                            "{} pid {} {} {}",
                            e["unit"], e["pid"], e["state"], e["message"]
                        )
                    })
                    .collect();
            }
        }
    }
    let mut units = BTreeSet::new();
    report.duplicates = engines
        .iter()
        .filter_map(|e| e["unit"].as_str())
        .filter(|u| !units.insert(u.to_owned()))
        .map(str::to_owned)
        .collect();
    current.server.write().await.take().unwrap().stop().await;
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
    }
    println!("{}", serde_json::to_string_pretty(&report).unwrap());
    report
}

fn assert_held(report: &Report) {
    assert_eq!(report.overfills, 0, "the simulated driver refused memory Tessera's placement or restart order left no room for: {report:#?}");
    assert_eq!(report.lost, 0, "requests lost: {report:#?}");
    let kills = report
        .faults
        .get("kill -9 of Tessera")
        .copied()
        .unwrap_or(0);
    assert!(
        report.cut_by_kill <= kills * CLIENTS,
        "at most the requests in flight in Tessera when it was killed are cut: {report:#?}"
    );
    assert!(
        !report.not_converged && !report.converged_ms.is_empty(),
        "what should serve did not within a minute of the last change: {report:#?}"
    );
    assert!(report.orphans.is_empty(), "orphan processes: {report:#?}");
    assert!(
        report.duplicates.is_empty(),
        "duplicate engines: {report:#?}"
    );
    assert!(report.answered > 0, "no request was answered: {report:#?}");
}

/// The demo fleet on simulated GPUs of a folder of its own (gone with the `TempDir`), its engines loading
/// in 1 to 3 s: the server and the GPUs.
async fn simulated() -> (tempfile::TempDir, Server, SimulatedGpus) {
    simulated_with(|_| {}).await
}

/// [`simulated`], its launch changed by `change` first.
async fn simulated_with(
    change: impl FnOnce(&mut support::Launch),
) -> (tempfile::TempDir, Server, SimulatedGpus) {
    let dir = tempfile::tempdir().unwrap();
    let (data, sim_dir) = (dir.path().join("data"), dir.path().join("sim"));
    std::fs::create_dir_all(&data).unwrap();
    let program = Path::new(env!("CARGO_BIN_EXE_tessera"));
    let mut launch = launch(program, &data, &sim_dir, 20.0);
    change(&mut launch);
    let server = Server::start_as(launch).await;
    (dir, server, SimulatedGpus::open(&sim_dir))
}

/// Deploys as `body` says; the answer.
async fn deploy(server: &Server, body: Value) -> Value {
    let (status, answer) = server.send("POST", "/api/deployments", body).await;
    assert_eq!(status, 201, "{answer}");
    answer
}

/// What `engine` holds on a GPU that reads `now` (its helper's part included), and its share.
fn held_and_share(now: &server::inventory::simulated::Reading, engine: &Value) -> (u64, u64) {
    let pid = engine["pid"].as_u64().unwrap() as u32;
    let held = now
        .processes
        .iter()
        .filter(|(p, _)| *p == pid || support::parent_of(*p) == Some(pid))
        .map(|(_, b)| b.get())
        .sum();
    let share = engine["env"]["TESSERA_GPU_MEMORY_BYTES"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    (held, share)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_bounded_chaos_soak_overfills_no_gpu_loses_no_request_converges_and_leaves_no_orphan() {
    // A seed given (`SOAK_SEED`, as scripts/soak gives it) runs alone, for `SOAK_SECONDS` (40). Otherwise
    // seed 1, then one no run has seen, 20 s each: each is printed as it begins, so that a failure is
    // replayed by its number.
    let (seeds, seconds) = match std::env::var("SOAK_SEED") {
        Ok(seed) => (
            vec![seed.parse().expect("SOAK_SEED is a number")],
            env_or("SOAK_SECONDS", 40),
        ),
        Err(_) => (vec![1, unseen_seed()], env_or("SOAK_SECONDS", 20)),
    };
    for seed in seeds {
        eprintln!(
            "chaos soak: seed {seed}, {seconds} s (replay: SOAK_SEED={seed} SOAK_SECONDS={seconds} \
             cargo test -p server --test soak -- a_bounded_chaos_soak)"
        );
        assert_held(&soak(seed, seconds).await);
    }
}

/// A seed no earlier run is likely to have had: the clock's nanoseconds.
fn unseen_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(2, |t| u64::from(t.subsec_nanos()) ^ t.as_secs())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_whose_gpu_another_program_filled_while_it_loaded_dies_of_cuda_s_out_of_memory_error_and_no_overfill_is_counted(
) {
    // Loads of 1 to 3 s: long enough for another program to fill the GPU under it.
    let (_dir, server, sim) = simulated().await;
    deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 40}),
    )
    .await;
    let gpu: placement::GpuRef = "atlas:1".parse().unwrap();
    let mut notebook = tokio::process::Command::new("sleep")
        .arg("30")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Once the engine has begun to load (vLLM would refuse to start on a GPU full already), the notebook
    // takes all that is free.
    support::wait_until("the engine loads", || async {
        sim.read(&gpu).unwrap().used.get() > 0
    })
    .await;
    // All but a gigabyte (less than the engine's next part), taken in one step: the engine goes on loading
    // meanwhile.
    sim.fill(&gpu, notebook.id().unwrap(), placement::Bytes::gb(1))
        .unwrap();
    support::wait_until("the engine dies of it", || async {
        let engine = server.engine_if_any("glm-5.3").await;
        let Some(id) = engine.and_then(|e| e["id"].as_str().map(str::to_owned)) else {
            return false;
        };
        let (_, logs) = server.get(&format!("/api/engines/{id}/logs")).await;
        logs.to_string()
            .contains("CUDA out of memory. Tried to allocate")
    })
    .await;
    let refusals = sim.refusals();
    assert!(!refusals.is_empty());
    assert!(refusals.iter().all(|r| !r.overfill()), "{refusals:?}");
    // The notebook ends: the engine's next start loads.
    notebook.kill().await.unwrap();
    notebook.wait().await.unwrap();
    support::wait_until("the engine serves", || async {
        server.engine("glm-5.3").await["state"] == "healthy"
    })
    .await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_on_a_simulated_gpu_answers_slower_while_its_neighbours_there_are_answering() {
    let (_dir, server, _) = simulated().await;
    let first = deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
    )
    .await;
    deploy(
        &server,
        json!({"model": "embedder", "gpus": ["atlas:0"], "share": 10, "revision": first["revision"]}),
    )
    .await;
    server.wait_healthy(2).await;
    let chat =
        |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    let beside = |headers: &hyper::HeaderMap| {
        headers["x-tessera-demo-neighbours"]
            .to_str()
            .unwrap()
            .to_owned()
    };
    let (status, headers, _) = server
        .send_full("POST", "/v1/chat/completions", chat("embedder"))
        .await;
    assert_eq!((status, beside(&headers)), (200, "0".to_owned()));
    // glm-5.3 answers for 2 s: the embedder, on the same GPU, answers beside it.
    let glm = server.engine("glm-5.3").await;
    let port = glm["port"].as_u64().unwrap() as u16;
    support::request(port, "POST", "/slow", Some(json!({"ms": 2000}))).await;
    let server = Arc::new(server);
    let busy = {
        let server = server.clone();
        tokio::spawn(async move {
            server
                .send("POST", "/v1/chat/completions", chat("glm-5.3"))
                .await
                .0
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, headers, _) = server
        .send_full("POST", "/v1/chat/completions", chat("embedder"))
        .await;
    assert_eq!((status, beside(&headers)), (200, "1".to_owned()));
    assert_eq!(busy.await.unwrap(), 200);
    Arc::into_inner(server).unwrap().stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_engine_started_beside_a_neighbour_still_loading_takes_its_share_and_no_more() {
    // Loads of 1 to 3 s: vision (SGLang) starts while glm-5.3 (vLLM) is still taking its memory.
    let (_dir, server, sim) = simulated().await;
    let first = deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 40}),
    )
    .await;
    let gpu: placement::GpuRef = "atlas:1".parse().unwrap();
    support::wait_until("glm-5.3 loads", || async {
        sim.read(&gpu).unwrap().used.get() > 0
    })
    .await;
    deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 55, "revision": first["revision"]}),
    )
    .await;
    server.wait_healthy(2).await;
    let refusals = sim.refusals();
    assert!(refusals.is_empty(), "{refusals:?}");
    let now = sim.read(&gpu).unwrap();
    for engine in server.engines().await {
        let (held, share) = held_and_share(&now, &engine);
        assert!(
            held <= share,
            "{engine} holds {held} of its {share}: {now:?}"
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_engine_loading_while_its_neighbour_is_removed_takes_its_share_and_no_more() {
    let (_dir, server, sim) = simulated().await;
    let first = deploy(
        &server,
        json!({"model": "glm-5.3", "gpus": ["atlas:1"], "share": 40}),
    )
    .await;
    server.wait_healthy(1).await;
    // vision (SGLang) loads for 5 s and reads what is free 1.5 s in, once its imports are done, as
    // SGLang does: glm-5.3, removed as it starts, would have freed its 40 % by then.
    let slow = json!({"speed": 20, "load_s": [100, 100]});
    let joined = deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 40, "revision": first["revision"],
               "env": {"TESSERA_DEMO_PROFILE": slow.to_string()}}),
    )
    .await;
    support::wait_until("vision starts", || async {
        server
            .engine_if_any("vision")
            .await
            .is_some_and(|e| e["state"] == "starting")
    })
    .await;
    let (status, removed) = server
        .send(
            "DELETE",
            &format!("/api/deployments/glm-5.3?revision={}", joined["revision"]),
            json!(null),
        )
        .await;
    assert_eq!(status, 200, "{removed}");
    let vision = server.wait_healthy(1).await.remove(0);
    assert_eq!(vision["model"], "vision", "{vision}");
    let now = sim.read(&"atlas:1".parse().unwrap()).unwrap();
    let (held, share) = held_and_share(&now, &vision);
    assert!(
        held <= share,
        "vision holds {held} of its {share}, glm-5.3's freed room with it: {now:?}"
    );
    server.stop().await;
}

/// Another program holds a third of `gpu`, and vision (SGLang, 40 %) is deployed there, loading for
/// `load_s` profile seconds (a twentieth of that in time): once vision's engine is launched, that program.
async fn vision_launched_beside_another_program(
    server: &Server,
    sim: &SimulatedGpus,
    gpu: &placement::GpuRef,
    load_s: u32,
) -> tokio::process::Child {
    let outside = tokio::process::Command::new("sleep")
        .arg("600")
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let third = placement::Bytes(sim.read(gpu).unwrap().total.get() / 3);
    sim.allocate(gpu, outside.id().unwrap(), third, true)
        .unwrap();
    let slow = json!({"speed": 20, "load_s": [load_s, load_s]});
    deploy(
        server,
        json!({"model": "vision", "gpus": [format!("{}:{}", gpu.machine, gpu.index)], "share": 40,
               "env": {"TESSERA_DEMO_PROFILE": slow.to_string()}}),
    )
    .await;
    support::wait_until("vision's engine is launched", || async {
        server
            .engine_if_any("vision")
            .await
            .is_some_and(|e| e["pid"].is_u64())
    })
    .await;
    outside
}

/// `engine` holds its share on `gpu`, and no more: within a megabyte, as SGLang's arithmetic on its
/// fraction rounds a byte or so either way.
fn takes_its_share(sim: &SimulatedGpus, gpu: &placement::GpuRef, engine: &Value) {
    let (held, share) = held_and_share(&sim.read(gpu).unwrap(), engine);
    assert!(
        held <= share + 1_000_000 && held * 100 >= share * 99,
        "it holds {held} of its {share}: {engine}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_engine_started_while_another_program_holds_memory_on_its_gpu_takes_its_share_and_no_more_once_that_program_lets_go(
) {
    let (_dir, server, sim) = simulated().await;
    let gpu: placement::GpuRef = "atlas:1".parse().unwrap();
    // Another program holds a third of the GPU as vision starts, and lets go once vision is launched,
    // before vision's imports are done and it reads what is free (a load of 3 s: 0.9 s of imports).
    let mut outside = vision_launched_beside_another_program(&server, &sim, &gpu, 60).await;
    outside.kill().await.unwrap();
    server.wait_healthy(1).await;
    takes_its_share(&sim, &gpu, &server.engine("vision").await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_engine_that_took_more_than_its_share_as_another_program_let_go_of_memory_while_it_loaded_starts_again_and_takes_its_share_even_where_no_failed_engine_is_restarted(
) {
    // `--max-restarts 0`: a start that took too much is no failure of the engine's.
    let (_dir, server, sim) = simulated_with(|launch| {
        let at = launch
            .args
            .iter()
            .position(|a| a == "--max-restarts")
            .unwrap();
        launch.args[at + 1] = "0".to_owned();
    })
    .await;
    let gpu: placement::GpuRef = "atlas:1".parse().unwrap();
    // Another program holds a third of the GPU as vision reads what is free (1.5 s into a load of 5 s),
    // and lets go before vision allocates its KV cache (4.5 s in): what it let go becomes vision's.
    let events = server.follow_events().await;
    let mut outside = vision_launched_beside_another_program(&server, &sim, &gpu, 100).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    outside.kill().await.unwrap();
    server.wait_healthy(1).await;
    let vision = server.engine("vision").await;
    assert_eq!(vision["restarts"], 1, "it started again once: {vision}");
    takes_its_share(&sim, &gpu, &vision);
    let said = Value::from(events.all()).to_string();
    assert!(
        said.contains("so it starts again to take its share"),
        "why it started again is said: {said}"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sglang_engine_beside_a_neighbour_that_holds_less_than_its_share_takes_its_share_and_no_more(
) {
    let (_dir, server, sim) = simulated().await;
    // speech (llama.cpp, sized to its share) holds 60 % of its 40 %: what the ledger reckons free on the
    // GPU is less than what is.
    let holds_less = json!({"speed": 20, "load_s": [20, 20], "holds": 0.6, "weights": 0.5});
    let first = deploy(
        &server,
        json!({"model": "speech", "gpus": ["atlas:1"], "share": 40,
               "env": {"TESSERA_DEMO_PROFILE": holds_less.to_string()}}),
    )
    .await;
    server.wait_healthy(1).await;
    deploy(
        &server,
        json!({"model": "vision", "gpus": ["atlas:1"], "share": 40, "revision": first["revision"]}),
    )
    .await;
    server.wait_healthy(2).await;
    // SGLang's fraction is of the memory free at its start as the GPU reads, not as the ledger reckons.
    let vision = server.engine("vision").await;
    takes_its_share(&sim, &"atlas:1".parse().unwrap(), &vision);
    server.stop().await;
}
