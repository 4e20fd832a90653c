//! The latency of committing a plan change (`PUT /api/groups/{name}/plan`) through the whole router, on a
//! real SQLite file: 2,000 commits that alternate two members' shares, then the percentiles.

mod support;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use server::fleet::groups::Deploy;
use server::inventory::demo::{demo_catalog, demo_fleet};
use std::time::{Duration, Instant};
use support::Bench;
use tower::ServiceExt;

const COMMITS: usize = 2_000;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let bench = Bench::open(demo_fleet()).await?;
    let fleet = &bench.fleet;
    fleet
        .seed_catalog(&demo_catalog())
        .await
        .map_err(|e| e.to_string())?;
    let deploy = |model: &str, revision: Option<i64>| Deploy {
        model: model.to_owned(),
        gpus: vec!["atlas:0".to_owned()],
        shared: true,
        share: Some(30.0),
        shares: Default::default(),
        revision,
        args: Vec::new(),
        env: Default::default(),
    };
    fleet
        .deploy(deploy("glm-5.3", None), "bench")
        .await
        .map_err(|e| e.to_string())?;
    fleet
        .deploy(deploy("vision", Some(1)), "bench")
        .await
        .map_err(|e| e.to_string())?;
    let token = &bench.token;
    let app = bench.router();

    let mut latencies = Vec::with_capacity(COMMITS);
    for n in 0..COMMITS {
        let (glm, vision) = if n % 2 == 0 { (40, 20) } else { (30, 30) };
        let body = format!(
            r#"{{"revision": {}, "shares": {{"glm-5.3": {glm}, "vision": {vision}}}}}"#,
            n + 2
        );
        let request = Request::builder()
            .method(Method::PUT)
            .uri("/api/groups/text-router/plan")
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::AUTHORIZATION, format!("Bearer {token}"))
            .body(Body::from(body))?;
        let started = Instant::now();
        let response = app.clone().oneshot(request).await?;
        latencies.push(started.elapsed());
        assert_eq!(response.status(), StatusCode::OK, "commit {n}");
    }
    latencies.sort();
    let at = |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "{COMMITS} plan commits: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms(at(0.50)),
        ms(at(0.99)),
        ms(latencies[latencies.len() - 1])
    );
    Ok(())
}
