//! A Tessera server for load tests: the demo fleet, 16 shared workers on the 8 × H200 node (two per GPU),
//! the whole router, and an axum hello-world route beside it to measure against in the same run.
//! `scripts/bench-api` starts it and drives both routes with wrk. It prints an API token to send.

mod support;

use axum::routing::get;
use server::fleet::authority::Sight;
use server::inventory::demo::demo_fleet;
use support::Bench;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3099".to_owned());
    let bench = Bench::open(demo_fleet()).await?;
    for n in 0..16u32 {
        bench
            .shared_worker(
                format!("worker-{n:02}"),
                f64::from(8 + n),
                format!("h200-node:{}", n % 8),
                Some(2.0),
            )
            .await?;
    }
    // The load generator sends the operator's API token, as a script would.
    println!("{}", bench.token);
    // The same answer as the workers route, served bare: what the body itself costs, apart from the layers.
    let body = bench
        .fleet
        .machine_workers("h200-node", Sight::Redacted)
        .map_err(|e| e.to_string())?;
    let app = bench
        .router()
        .route("/bench/hello", get(|| async { "Hello, World!" }))
        .route(
            "/bench/same-body",
            get(move || {
                let body = body.clone();
                async move {
                    (
                        [(axum::http::header::CONTENT_TYPE, "application/json")],
                        body,
                    )
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    eprintln!("bench server on http://{addr}");
    axum::serve(listener, app).await?;
    Ok(())
}
