//! The server's time for the Nodes tab, the Overview and the Models tab with 100 machines (or as many as the first argument
//! says): each of 8 × 80 GB GPUs, each running a sharing group of three models. `GET /nodes`, `GET /` and
//! `GET /models` through the whole router (server-side rendering with its data, as a browser's first load
//! gets it), 300 times each (or as many as the second argument says) on a real SQLite file, then the
//! percentiles.

mod support;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use http_body_util::BodyExt;
use placement::Machine;
use placement::{GpuChoice, GpuRef};
use server::input::{DeployCommand, ServingSettings, Sharing};
use std::time::{Duration, Instant};
use support::Bench;
use tower::ServiceExt;

/// Machines where the first argument names none.
const MACHINES: usize = 100;
/// Renders of each page where the second argument names no other count.
const RENDERS: usize = 300;

fn machine(n: usize) -> Machine {
    support::h100s(&format!("node-{n:03}"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let machines: usize = match std::env::args().nth(1) {
        Some(n) => n.parse()?,
        None => MACHINES,
    };
    let renders: usize = match std::env::args().nth(2) {
        Some(n) => n.parse()?,
        None => RENDERS,
    };
    let bench = Bench::open((0..machines).map(machine).collect()).await?;
    let fleet = &bench.fleet;
    for n in 0..machines {
        for (i, member) in ["llm", "embedder", "speech"].iter().enumerate() {
            let name = format!("{member}-{n:03}");
            fleet
                .add_model(support::command_model(&name, None)?, "bench")
                .await
                .map_err(|e| e.to_string())?;
            fleet
                .deploy(
                    DeployCommand {
                        model: name,
                        gpus: GpuChoice::new(vec![
                            GpuRef::new(format!("node-{n:03}"), 0),
                            GpuRef::new(format!("node-{n:03}"), 1),
                        ])?,
                        sharing: Sharing::Shared {
                            share: None,
                            shares: Default::default(),
                            revision: (i > 0).then_some(i as i64),
                            demand: Default::default(),
                            demands: Default::default(),
                            replicas: None,
                        },
                        serving: ServingSettings::default(),
                    },
                    &support::actor(),
                )
                .await
                .map_err(|e| e.to_string())?;
        }
    }
    let token = &bench.token;
    let app = bench.router();

    for page in ["/nodes", "/", "/models"] {
        let mut latencies = Vec::with_capacity(renders);
        let mut size = 0;
        for _ in 0..renders {
            let started = Instant::now();
            let response = app
                .clone()
                .oneshot(
                    Request::get(page)
                        .header("authorization", format!("Bearer {token}"))
                        .body(Body::empty())?,
                )
                .await?;
            assert_eq!(response.status(), StatusCode::OK);
            let body = response.into_body().collect().await?.to_bytes();
            latencies.push(started.elapsed());
            size = body.len();
        }
        latencies.sort();
        let at =
            |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "GET {page}, {machines} machines, {renders} renders ({size} bytes): p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(at(0.50)),
            ms(at(0.99)),
            ms(latencies[latencies.len() - 1])
        );
    }
    Ok(())
}
