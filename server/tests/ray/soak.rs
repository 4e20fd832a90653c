//! The chaos soak on the cluster, beside the Ray suite's other tests (`server/tests/ray.rs`).

use super::*;

/// What the cluster's soak counted.
#[derive(Debug, Default, serde::Serialize)]
struct SoakReport {
    seed: u64,
    actions: u64,
    actions_taken: u64,
    faults: Vec<String>,
    requests: u64,
    answered: u64,
    told_to_retry: u64,
    /// For a model the operator had removed (404).
    gone: u64,
    /// Tessera itself did not answer (killed, or starting).
    server_down: u64,
    /// Failed while a node or the cluster was down, or in the moments after: counted apart.
    during_outage: u64,
    lost: u64,
    lost_examples: Vec<String>,
    overfills: u64,
    overfill_examples: Vec<String>,
    converged_ms: Vec<u64>,
    /// How many models were deployed at each convergence.
    deployed: Vec<usize>,
    not_converged: Vec<String>,
    duplicate_jobs: Vec<String>,
    orphan_jobs: Vec<String>,
}

/// Whether every model deployed serves and nothing else runs ([`chaos::settled`]), each engine in one
/// RUNNING job and every RUNNING job an engine's: what disagrees.
async fn cluster_settled(current: &chaos::Current) -> Vec<String> {
    let (_, mut wrong) = chaos::settled(current).await;
    let (_, engines) = chaos::call(current, "GET", "/api/engines", Value::Null).await;
    let engines = engines.as_array().cloned().unwrap_or_default();
    let units: Vec<&str> = engines.iter().filter_map(|e| e["unit"].as_str()).collect();
    let jobs = running_jobs().await;
    for job in &jobs {
        let unit = job["metadata"]["tessera_unit"].as_str().unwrap_or_default();
        if !unit.is_empty() && !units.contains(&unit) {
            wrong.push(format!(
                "job {} runs {unit}, which is no engine",
                job["submission_id"]
            ));
        }
    }
    for unit in &units {
        let n = jobs
            .iter()
            .filter(|j| j["metadata"]["tessera_unit"] == *unit)
            .count();
        if n > 1 {
            wrong.push(format!("{unit} runs as {n} jobs"));
        }
    }
    wrong
}

/// Waits, within `bound`, for [`cluster_settled`]; how long it took, or what still disagrees.
async fn converge(current: &chaos::Current, bound: Duration) -> Result<u64, Vec<String>> {
    let began = Instant::now();
    loop {
        let wrong = cluster_settled(current).await;
        if wrong.is_empty() {
            return Ok(began.elapsed().as_millis() as u64);
        }
        if began.elapsed() > bound {
            return Err(wrong);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn soak_server(data: &std::path::Path, sim: &std::path::Path) -> Server {
    // At speed 20: loads of 1 to 2 s, 50 ms to the first token, 0.5 s holding memory after SIGTERM.
    let profile = json!({"speed": 20, "load_s": [20, 40], "first_token_s": 1, "exit_delay_s": 10});
    chaos::start(data, &["--ray", RAY], sim, &profile).await
}

/// The chaos soak on the cluster (the demo fleet's is tests/soak.rs): its made-up GPUs simulated, so that
/// an overfill is something the simulated driver refuses; clients calling the models through the gateway
/// all along; the operator's random changes; and the cluster's own faults: a node lost and back, and
/// Tessera killed and started while the head is down, then the cluster back. Seeded by `SOAK_SEED`; the
/// operator's spells last `SOAK_SECONDS` (8), and `SOAK_ROUNDS` (1) rounds of it all are run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the Ray cluster of scripts/test-ray"]
async fn a_soak_on_the_cluster_through_a_lost_node_and_a_start_with_the_head_down_overfills_no_gpu_loses_no_request_and_converges(
) {
    let _one = CLUSTER.lock().await;
    clear_jobs().await;
    let seed: u64 = std::env::var("SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let rounds: u32 = std::env::var("SOAK_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    let quiet = Duration::from_secs(
        std::env::var("SOAK_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(8),
    );
    let dir = tempfile::tempdir().unwrap();
    let (data, sim_dir) = (dir.path().join("data"), dir.path().join("sim"));
    std::fs::create_dir_all(&data).unwrap();
    let current: chaos::Current = chaos::current(soak_server(&data, &sim_dir).await);
    {
        let server = current.server.read().await;
        let server = server.as_ref().unwrap();
        add_engine(server, "glm", "vllm").await;
        add_engine(server, "vision", "sglang").await;
        add_engine(server, "rerank", "vllm").await;
        for (model, gpu, share) in [
            ("glm", "majin:0", 50),
            ("vision", "majin:1", 40),
            ("rerank", "atlas:0", 40),
        ] {
            let (status, body) = server
                .send(
                    "POST",
                    "/api/deployments",
                    json!({"model": model, "gpus": [gpu], "share": share}),
                )
                .await;
            assert_eq!(status, 201, "{body}");
        }
    }
    let report = Arc::new(Mutex::new(SoakReport {
        seed,
        ..SoakReport::default()
    }));
    let converged = converge(&current, Duration::from_secs(90)).await;
    report
        .lock()
        .unwrap()
        .converged_ms
        .extend(converged.clone().ok());
    assert!(converged.is_ok(), "the first deploys: {converged:?}");

    // Clients, one per model, until the end; a request that fails during an outage is counted apart.
    let done = Arc::new(AtomicBool::new(false));
    let outage = Arc::new(Mutex::new(None::<Instant>));
    let clients: Vec<_> = ["glm", "vision", "rerank"]
        .into_iter()
        .enumerate()
        .map(|(i, model)| {
            let (current, done, outage, report) = (
                current.clone(),
                done.clone(),
                outage.clone(),
                report.clone(),
            );
            tokio::spawn(async move {
                let mut rng = chaos::Rng::new(seed * 31 + i as u64);
                while !done.load(Ordering::SeqCst) {
                    let began = Instant::now();
                    let outcome = chaos::ask(&current, model, rng.below(2) == 0).await;
                    // Down now, or came back less than 5 s before this request began.
                    let in_outage = outage
                        .lock()
                        .unwrap()
                        .is_some_and(|ended| ended + Duration::from_secs(5) >= began);
                    {
                        let mut r = report.lock().unwrap();
                        r.requests += 1;
                        match outcome {
                            chaos::Outcome::Answered => r.answered += 1,
                            chaos::Outcome::ToldToRetry => r.told_to_retry += 1,
                            chaos::Outcome::Gone => r.gone += 1,
                            chaos::Outcome::Down => r.server_down += 1,
                            chaos::Outcome::Failed(_) if in_outage => r.during_outage += 1,
                            chaos::Outcome::Failed(why) => {
                                r.lost += 1;
                                if r.lost_examples.len() < 10 {
                                    r.lost_examples.push(why);
                                }
                            }
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            })
        })
        .collect();
    // An outage lasts from `down` until `up` and counts 5 s after (the far future while it lasts).
    let down = |outage: &Mutex<Option<Instant>>| {
        *outage.lock().unwrap() = Some(Instant::now() + Duration::from_secs(3600));
    };
    let up = |outage: &Mutex<Option<Instant>>| *outage.lock().unwrap() = Some(Instant::now());

    let mut rng = chaos::Rng::new(seed);
    let models = ["glm", "vision", "rerank"];
    let gpus = ["atlas:0", "majin:0", "majin:1"];
    let operator =
        |current: chaos::Current, report: Arc<Mutex<SoakReport>>, mut rng: chaos::Rng| async move {
            let until = Instant::now() + quiet;
            while Instant::now() < until {
                let (_, taken) = chaos::act(&current, &mut rng, &models, &gpus).await;
                {
                    let mut r = report.lock().unwrap();
                    r.actions += 1;
                    r.actions_taken += u64::from(taken);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            rng
        };
    let settle = |current: chaos::Current, report: Arc<Mutex<SoakReport>>, what: &'static str| async move {
        match converge(&current, Duration::from_secs(120)).await {
            Ok(ms) => {
                let (_, groups) = chaos::call(&current, "GET", "/api/groups", Value::Null).await;
                let deployed = groups
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|g| g["members"].as_array().map_or(0, Vec::len))
                    .sum();
                let mut r = report.lock().unwrap();
                r.converged_ms.push(ms);
                r.deployed.push(deployed);
            }
            Err(wrong) => report
                .lock()
                .unwrap()
                .not_converged
                .push(format!("after {what}: {wrong:?}")),
        }
    };

    // Rounds of: the operator at work, then a node lost while the operator goes on, and back; then
    // Tessera killed and started again while the head is down, and the cluster back.
    for _ in 0..rounds {
        rng = operator(current.clone(), report.clone(), rng).await;
        settle(current.clone(), report.clone(), "the operator's changes").await;
        report
            .lock()
            .unwrap()
            .faults
            .push("majin lost and back".to_owned());
        down(&outage);
        node("stop-node", "worker");
        let revive = Revive::Worker;
        // Ray takes about 15 s to call a node dead, and takes no node in its place until it has.
        support::wait_until_within("majin is unreachable", Duration::from_secs(60), || async {
            let (_, machine) =
                chaos::call(&current, "GET", "/api/machines/majin", Value::Null).await;
            machine["unreachable_since"].is_string()
        })
        .await;
        rng = operator(current.clone(), report.clone(), rng).await;
        drop(revive);
        up(&outage);
        settle(current.clone(), report.clone(), "majin came back").await;

        // Tessera killed, and started again while the head is down; then the cluster back.
        report
            .lock()
            .unwrap()
            .faults
            .push("kill -9 of Tessera, started with the head down".to_owned());
        down(&outage);
        let killed = current.server.write().await.take().unwrap();
        let launch = killed.launched().clone();
        killed.kill_9().await;
        node("stop-all", "");
        let back = Revive::All;
        let started = Server::start_as(launch).await;
        let (status, majin) = started.get("/api/machines/majin").await;
        assert!(
            status == 200 && majin["unreachable_since"].is_string(),
            "Tessera starts, and shows the cluster's machines unreachable while the head is down: {majin}"
        );
        *current.server.write().await = Some(started);
        drop(back);
        up(&outage);
        settle(current.clone(), report.clone(), "the cluster came back").await;
    }
    let _ = operator(current.clone(), report.clone(), rng).await;
    settle(
        current.clone(),
        report.clone(),
        "the operator's last changes",
    )
    .await;

    done.store(true, Ordering::SeqCst);
    for client in clients {
        client.await.unwrap();
    }
    let refusals = server::inventory::simulated::SimulatedGpus::open(&sim_dir).refusals();
    let jobs = running_jobs().await;
    let (_, engines) = chaos::call(&current, "GET", "/api/engines", Value::Null).await;
    let mut r = std::mem::take(&mut *report.lock().unwrap());
    r.overfills = refusals.iter().filter(|x| x.overfill()).count() as u64;
    r.overfill_examples = refusals
        .iter()
        .filter(|x| x.overfill())
        .take(10)
        .map(|x| format!("{x:?}"))
        .collect();
    let units: Vec<&str> = engines
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["unit"].as_str())
        .collect();
    for job in &jobs {
        let unit = job["metadata"]["tessera_unit"].as_str().unwrap_or_default();
        if !units.contains(&unit) {
            r.orphan_jobs
                .push(format!("{} ({unit})", job["submission_id"]));
        }
        if jobs
            .iter()
            .filter(|j| j["metadata"]["tessera_unit"] == unit)
            .count()
            > 1
        {
            r.duplicate_jobs.push(unit.to_owned());
        }
    }
    println!("{}", serde_json::to_string_pretty(&r).unwrap());
    if let Ok(path) = std::env::var("SOAK_REPORT") {
        std::fs::write(path, serde_json::to_string_pretty(&r).unwrap()).unwrap();
    }
    assert_eq!(r.overfills, 0, "the simulated driver refused memory Tessera's placement or restart order left no room for: {r:#?}");
    assert_eq!(r.lost, 0, "requests lost: {r:#?}");
    assert!(
        r.not_converged.is_empty(),
        "what should serve did not: {r:#?}"
    );
    assert!(
        r.orphan_jobs.is_empty() && r.duplicate_jobs.is_empty(),
        "{r:#?}"
    );
    assert!(r.answered > 0, "no request was answered: {r:#?}");
    current.server.write().await.take().unwrap().stop().await;
    clear_jobs().await;
}
