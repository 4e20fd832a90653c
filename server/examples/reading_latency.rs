//! What a GPU reading costs at fleet size (issue 29): 1,250 machines of 8 × 80 GB GPUs with 0 (the
//! reference, in the same run) and 40,000 shared workers of 1–12 GB placed through the fleet's own writes.
//! Each sample is `Fleet::refresh_machine` with one machine's reading in which what one GPU offers changed
//! (what is held outside Tessera there grows or shrinks by a GB: nothing is over-committed by it), then
//! a reading in which a GPU went missing and came back (the machine's shape changed), then machines new to
//! the fleet (a Ray node that joins). Each of those holds the ledger anew and settles by its holders.
//!
//!     cargo run --release -p server --example reading_latency [SAMPLES]      (100 by default)

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use placement::{Bytes, Machine};
use std::time::Instant;
use support::{numbered_h100s, pct, Bench};
use tower::ServiceExt;

const MACHINES: usize = 1250;
const WORKERS: usize = 40_000;

/// The fleet with `workers` placed, and each reading's time: one GPU's offer changed, `samples` times,
/// then a GPU gone and back, a few times.
async fn measure(
    workers: usize,
    samples: usize,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>), Box<dyn std::error::Error>> {
    let bench = Bench::h100_fleet(MACHINES, workers).await?;
    let mut offer = Vec::new();
    for s in 0..samples {
        let mut read = numbered_h100s(MACHINES / 2);
        read.gpus[3].held_outside = Bytes::gb(1 + (s % 2) as u64);
        offer.push(timed_reading(&bench, read).await?);
    }
    // The last reading is the one the machine's page shows.
    let answer = bench
        .router()
        .oneshot(
            Request::get(format!("/api/machines/m{:04}", MACHINES / 2))
                .header("authorization", format!("Bearer {}", bench.token))
                .body(Body::empty())?,
        )
        .await?;
    assert_eq!(answer.status(), StatusCode::OK);
    let shown: serde_json::Value =
        serde_json::from_slice(&answer.into_body().collect().await?.to_bytes())?;
    let last = 1 + (samples - 1) % 2;
    assert_eq!(shown["gpus"][3]["held_outside_gb"], last as f64, "{shown}");
    let mut shape = Vec::new();
    for s in 0..6 {
        let mut read = numbered_h100s(MACHINES / 2);
        if s % 2 == 0 {
            read.gpus.pop();
        }
        shape.push(timed_reading(&bench, read).await?);
    }
    let mut joined = Vec::new();
    for n in 0..3 {
        joined.push(timed_reading(&bench, numbered_h100s(MACHINES + n)).await?);
    }
    Ok((offer, shape, joined))
}

/// Milliseconds the fleet took to take `read`.
async fn timed_reading(bench: &Bench, read: Machine) -> Result<f64, Box<dyn std::error::Error>> {
    let began = Instant::now();
    bench
        .fleet
        .refresh_machine(read)
        .await
        .map_err(|e| e.to_string())?;
    Ok(began.elapsed().as_secs_f64() * 1000.0)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let samples: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse())
        .transpose()?
        .unwrap_or(100);
    println!("{MACHINES} machines × 8 GPUs of 80 GB; {samples} readings of one GPU's offer");
    println!(
        "| workers placed | one GPU's offer changed, p50 / p99 | a GPU gone or back, p50 / most | a machine new to the fleet, p50 / most |"
    );
    println!("|---|---|---|---|");
    for workers in [0, WORKERS] {
        let (offer, shape, joined) = measure(workers, samples).await?;
        println!(
            "| {workers} | {:.2} / {:.2} ms | {:.0} / {:.0} ms | {:.0} / {:.0} ms |",
            pct(&offer, 50.0),
            pct(&offer, 99.0),
            pct(&shape, 50.0),
            pct(&shape, 100.0),
            pct(&joined, 50.0),
            pct(&joined, 100.0),
        );
    }
    Ok(())
}
