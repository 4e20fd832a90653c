//! The latency of committing a plan change (`PUT /api/groups/{name}/plan`) through the whole router, on a
//! real SQLite file: 2,000 commits that alternate two members' shares, then the percentiles. The reference,
//! measured in the same run on the same disk: a bare SQLite transaction (WAL, `synchronous=FULL`, as the
//! server's own database) making the same writes: the group's revision, its two members, the audit entry,
//! two usage spans ended and two opened.

mod support;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use placement::{BasisPoints, GpuChoice, GpuRef};
use server::input::{DeployCommand, ServingSettings, Sharing};
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
    let deploy = |model: &str, revision: Option<i64>| {
        Ok::<_, placement::GpuRefError>(DeployCommand {
            model: model.to_owned(),
            gpus: GpuChoice::new(vec![GpuRef::new("atlas", 0)])?,
            sharing: Sharing::Shared {
                share: Some(BasisPoints(3000)),
                shares: Default::default(),
                revision,
                demand: Default::default(),
                demands: Default::default(),
                replicas: None,
            },
            serving: ServingSettings::default(),
        })
    };
    fleet
        .deploy(deploy("glm-5.3", None)?, &support::actor())
        .await
        .map_err(|e| e.to_string())?;
    fleet
        .deploy(deploy("vision", Some(1))?, &support::actor())
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
    let commits = Percentiles::of(latencies);
    let bare = Percentiles::of(bare_transactions().await?);
    println!("{COMMITS} plan commits: {commits}");
    println!("{COMMITS} bare transactions with the same writes (the reference): {bare}");
    println!(
        "p99 of a plan commit is {:.1} times the reference's (target: at most 5)",
        commits.p99.as_secs_f64() / bare.p99.as_secs_f64()
    );
    Ok(())
}

/// The reference: the rows a plan commit writes, in one transaction of their own, on a fresh database
/// beside the server's.
async fn bare_transactions() -> Result<Vec<Duration>, Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let pool = server::db::connect(None, dir.path()).await?;
    for model in ["glm-5.3", "vision"] {
        sqlx::query("INSERT INTO models (name, engine, default_share) VALUES (?, 'vllm', 3000)")
            .bind(model)
            .execute(&pool)
            .await?;
    }
    sqlx::query("INSERT INTO groups (name, gpus) VALUES ('text-router', '[]')")
        .execute(&pool)
        .await?;
    let mut latencies = Vec::with_capacity(COMMITS);
    for n in 0..COMMITS {
        let started = Instant::now();
        let mut tx = server::db::write(&pool).await?;
        sqlx::query("UPDATE groups SET revision = revision + 1 WHERE name = 'text-router'")
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM group_members WHERE group_name = 'text-router'")
            .execute(&mut *tx)
            .await?;
        for (position, model) in ["glm-5.3", "vision"].into_iter().enumerate() {
            sqlx::query("INSERT INTO group_members (group_name, model, share, position, args, env) VALUES ('text-router', ?, ?, ?, '[]', '{}')")
                .bind(model)
                .bind(3000 + (n % 2) as i64 * 1000)
                .bind(position as i64)
                .execute(&mut *tx)
                .await?;
        }
        sqlx::query("INSERT INTO audit (actor, action, target, before, after, revision, restarts) VALUES ('bench', 'plan.change', 'text-router', '{}', '{}', ?, '[]')")
            .bind(n as i64)
            .execute(&mut *tx)
            .await?;
        sqlx::query("UPDATE holdings SET end_ms = ? WHERE end_ms IS NULL")
            .bind(n as i64)
            .execute(&mut *tx)
            .await?;
        for model in ["glm-5.3", "vision"] {
            sqlx::query("INSERT INTO holdings (holder, name, group_name, machine, gpu_index, held_bytes, gpu_total_bytes, start_ms) VALUES (?, ?, 'text-router', 'atlas', 0, 1, 1, ?)")
                .bind(format!("group:text-router/{model}@atlas"))
                .bind(model)
                .bind(n as i64)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        latencies.push(started.elapsed());
    }
    Ok(latencies)
}

/// p50, p99 and the longest of a run.
struct Percentiles {
    p50: Duration,
    p99: Duration,
    max: Duration,
}

impl Percentiles {
    fn of(mut latencies: Vec<Duration>) -> Percentiles {
        latencies.sort();
        let at =
            |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
        Percentiles {
            p50: at(0.50),
            p99: at(0.99),
            max: latencies[latencies.len() - 1],
        }
    }
}

impl std::fmt::Display for Percentiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        write!(
            f,
            "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
            ms(self.p50),
            ms(self.p99),
            ms(self.max)
        )
    }
}
