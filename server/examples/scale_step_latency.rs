//! The latency of a scale step (issue 44) at fleet size: 2,000 autoscaled models (or as many as the first
//! argument says), each in a group of its own on one GPU of two machines (8 × 80 GB each) with replicas
//! between 1 and 2; then 1,000 scale steps of one of them, alternately up (its second replica placed by
//! best fit) and down, through the fleet's write path on a real SQLite file. The reference, measured in the
//! same run on the same disk: the same steps on a fleet where that model is the only one.

mod support;

use placement::scale::{Autoscale, Decision};
use placement::{GpuChoice, GpuRef};
use server::input::{DeployCommand, ServingSettings, Sharing};
use std::time::{Duration, Instant};
use support::Bench;

/// Autoscaled models where the first argument names no other count.
const MODELS: usize = 2_000;
/// Scale steps measured on each fleet.
const STEPS: usize = 1_000;
/// GPUs per machine: a pair of machines holds eight groups.
const GPUS: usize = 8;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let models: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => MODELS,
    };
    let alone = steps(1).await?;
    let at_size = steps(models).await?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    for (what, p) in [
        ("1 autoscaled model (the reference)", &alone),
        (&*format!("{models} autoscaled models"), &at_size),
    ] {
        println!(
            "{STEPS} scale steps, {what}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(p.0),
            ms(p.1),
            ms(p.2)
        );
    }
    println!(
        "p99 at {models} models is {:.2} times the reference's (target: at most 2, and at most 5 ms)",
        at_size.1.as_secs_f64() / alone.1.as_secs_f64()
    );
    Ok(())
}

/// p50, p99 and the slowest of [`STEPS`] scale steps of the first of `models` autoscaled models.
async fn steps(
    models: usize,
) -> Result<(Duration, Duration, Duration), Box<dyn std::error::Error>> {
    let pairs = models.div_ceil(GPUS);
    let machine = |pair: usize, side: usize| format!("node-{pair:04}-{side}");
    let bench = Bench::open(
        (0..pairs)
            .flat_map(|pair| [0, 1].map(|side| support::h100s(&machine(pair, side))))
            .collect(),
    )
    .await?;
    let fleet = &bench.fleet;
    for n in 0..models {
        let name = format!("model-{n:04}");
        fleet
            .add_model(support::command_model(&name, Some(name.clone()))?, "bench")
            .await
            .map_err(|e| e.to_string())?;
        let (pair, gpu) = (n / GPUS, (n % GPUS) as u32);
        fleet
            .deploy(
                DeployCommand {
                    model: name,
                    gpus: GpuChoice::new(vec![
                        GpuRef::new(machine(pair, 0), gpu),
                        GpuRef::new(machine(pair, 1), gpu),
                    ])?,
                    sharing: Sharing::Shared {
                        share: None,
                        shares: Default::default(),
                        revision: None,
                        demand: Default::default(),
                        demands: Default::default(),
                        replicas: Some(Autoscale::new(1, 2)?),
                    },
                    serving: ServingSettings::default(),
                },
                &support::actor(),
            )
            .await
            .map_err(|e| e.to_string())?;
    }
    let mut latencies = Vec::with_capacity(STEPS);
    for n in 0..STEPS {
        let (from, to) = if n % 2 == 0 { (1, 2) } else { (2, 1) };
        let decision = Decision {
            from,
            to,
            why: "the benchmark asked".to_owned(),
        };
        let started = Instant::now();
        let now = fleet
            .scale("model-0000", decision)
            .await
            .map_err(|e| e.to_string())?;
        latencies.push(started.elapsed());
        assert_eq!(now, to, "step {n}");
    }
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    Ok((at(0.50), at(0.99), latencies[latencies.len() - 1]))
}
