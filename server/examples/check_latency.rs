//! What `tessera check` costs the writes beside it (issue 29): 1,250 machines of 8 × 80 GB GPUs with
//! 40,000 shared workers of 1–12 GB placed through the fleet's own writes. Each sample times
//! `Fleet::check` alone, then a worker's create alone, then a create sent 5 ms after a check began: how
//! long a write waits for a check.
//!
//!     cargo run --release -p server --example check_latency [SAMPLES]      (10 by default)

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{pct, Bench};

const MACHINES: usize = 1250;
const WORKERS: usize = 40_000;

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(10);
    let bench = Arc::new(Bench::h100_fleet(MACHINES, WORKERS).await?);
    let (mut checks, mut alone, mut beside) = (Vec::new(), Vec::new(), Vec::new());
    for s in 0..samples {
        let began = Instant::now();
        let differ = bench.fleet.check().await.map_err(|e| e.to_string())?;
        assert!(differ.is_empty(), "{differ:?}");
        checks.push(ms(began));

        let began = Instant::now();
        bench
            .shared_worker(format!("alone{s}"), 1.0, "m0000:0".into(), None)
            .await?;
        alone.push(ms(began));

        let checking = tokio::spawn({
            let bench = bench.clone();
            async move { bench.fleet.check().await.map_err(|e| e.to_string()) }
        });
        tokio::time::sleep(Duration::from_millis(5)).await;
        let began = Instant::now();
        bench
            .shared_worker(format!("beside{s}"), 1.0, "m0001:0".into(), None)
            .await?;
        beside.push(ms(began));
        let differ = checking.await??;
        assert!(differ.is_empty(), "{differ:?}");
    }
    println!("{MACHINES} machines × 8 GPUs of 80 GB, {WORKERS} shared workers; {samples} samples");
    println!("| a check, p50 / most | a create alone, p50 / most | a create 5 ms into a check, p50 / most |");
    println!("|---|---|---|");
    println!(
        "| {:.0} / {:.0} ms | {:.2} / {:.2} ms | {:.1} / {:.1} ms |",
        pct(&checks, 50.0),
        pct(&checks, 100.0),
        pct(&alone, 50.0),
        pct(&alone, 100.0),
        pct(&beside, 50.0),
        pct(&beside, 100.0),
    );
    Ok(())
}
