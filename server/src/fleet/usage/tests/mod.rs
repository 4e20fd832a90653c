//! Usage from hand-made histories (exact figures), from what the server records as work comes and goes, and
//! the metrics read back against the API. One room per reader; here only the set-up they share: the clock,
//! spans and readings written straight to the database, and the report as the API answers it.

mod metrics;
mod page;
mod reports;
mod retention;

use crate::testing::TestApp;
use axum::http::StatusCode;
use placement::Bytes;
use serde_json::Value;

/// 2025-12-01T00:00:00Z.
const T: u64 = 1_764_547_200_000;

fn at(ms: u64) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
}

/// A span of `name` holding `held_gb` of a `total_gb` GPU.
async fn held(
    app: &TestApp,
    name: &str,
    machine: &str,
    gpu: u32,
    held_gb: u64,
    total_gb: u64,
    span: (u64, u64),
) {
    sqlx::query("INSERT INTO holdings (holder, name, machine, gpu_index, held_bytes, gpu_total_bytes, start_ms, end_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
        .bind(name)
        .bind(name)
        .bind(machine)
        .bind(i64::from(gpu))
        .bind(Bytes::gb(held_gb).get() as i64)
        .bind(Bytes::gb(total_gb).get() as i64)
        .bind(span.0 as i64)
        .bind(span.1 as i64)
        .execute(&app.pool)
        .await
        .unwrap();
}

async fn sample(
    app: &TestApp,
    machine: &str,
    gpu: u32,
    at_ms: u64,
    utilisation: u32,
    energy_mj: u64,
) {
    sqlx::query("INSERT INTO gpu_samples (machine, gpu_index, at_ms, utilisation_percent, energy_mj) VALUES (?, ?, ?, ?, ?)")
        .bind(machine)
        .bind(i64::from(gpu))
        .bind(at_ms as i64)
        .bind(i64::from(utilisation))
        .bind(energy_mj as i64)
        .execute(&app.pool)
        .await
        .unwrap();
}

async fn report(app: &TestApp, from: u64, to: u64, by: &str) -> Value {
    let (status, body) = app
        .get(&format!(
            "/api/usage?from={}&to={}&by={by}",
            at(from),
            at(to)
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body
}
