//! The usage report's figures from hand-made histories, what the server records as work comes, changes and
//! goes, and the periods and groupings it refuses.

use super::{at, held, report, sample, T};
use crate::testing::{shared_worker, TestApp, MAJIN};
use axum::http::{Method, StatusCode};
use placement::usage::HOUR_MS;
use placement::Bytes;
use serde_json::Value;

/// Each row's name and GPU-hours.
fn hours(report: &Value) -> Vec<(String, f64)> {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["figures"]["gpu_ms"].as_u64().unwrap() as f64 / HOUR_MS as f64,
            )
        })
        .collect()
}

#[tokio::test]
async fn two_gb_of_an_eight_gb_gpu_for_an_hour_is_a_quarter_gpu_hour_with_a_quarter_of_its_use_and_energy(
) {
    let app = TestApp::new(MAJIN).await;
    held(&app, "listen", "majin", 0, 2, 8, (T, T + HOUR_MS)).await;
    // The GPU ran at 80 % and used 1 kWh over the hour, read every half hour.
    sample(&app, "majin", 0, T, 0, 10_000).await;
    sample(
        &app,
        "majin",
        0,
        T + HOUR_MS / 2,
        80,
        10_000 + 1_800_000_000,
    )
    .await;
    sample(&app, "majin", 0, T + HOUR_MS, 80, 10_000 + 3_600_000_000).await;
    let body = report(&app, T, T + HOUR_MS, "worker").await;
    assert_eq!(hours(&body), [("listen".to_owned(), 0.25)]);
    let figures = &body["rows"][0]["figures"];
    assert_eq!(figures["busy_gpu_ms"], HOUR_MS / 5);
    assert_eq!(figures["energy_mj"], 900_000_000u64);
    assert_eq!(body["by"], "worker");
    let (status, csv) = app
        .get(&format!(
            "/api/usage.csv?from={}&to={}&by=worker",
            at(T),
            at(T + HOUR_MS)
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        csv,
        Value::String(
            "worker,gpu_hours,busy_gpu_hours,energy_wh\nlisten,0.25,0.2,250\nTotal,0.25,0.2,250\n"
                .into()
        )
    );
}

#[tokio::test]
async fn a_share_change_half_way_through_an_hour_counts_each_half_at_its_share() {
    let app = TestApp::new(MAJIN).await;
    held(&app, "listen", "majin", 0, 2, 8, (T, T + HOUR_MS / 2)).await;
    held(
        &app,
        "listen",
        "majin",
        0,
        4,
        8,
        (T + HOUR_MS / 2, T + HOUR_MS),
    )
    .await;
    assert_eq!(
        hours(&report(&app, T, T + HOUR_MS, "worker").await),
        [("listen".to_owned(), 0.375)]
    );
    // A period that takes only the second half.
    assert_eq!(
        hours(&report(&app, T + HOUR_MS / 2, T + 2 * HOUR_MS, "worker").await),
        [("listen".to_owned(), 0.25)]
    );
}

#[tokio::test]
async fn a_worker_on_a_wsl2_pc_counts_on_both_gpus_it_takes_memory_on_and_a_whole_gpu_counts_as_one(
) {
    let app = TestApp::new(MAJIN).await;
    held(&app, "voice", "studio", 0, 3, 12, (T, T + HOUR_MS)).await;
    held(&app, "voice", "studio", 1, 3, 12, (T, T + HOUR_MS)).await;
    held(&app, "trainer", "atlas", 1, 96, 96, (T, T + HOUR_MS)).await;
    assert_eq!(
        hours(&report(&app, T, T + HOUR_MS, "worker").await),
        [("trainer".to_owned(), 1.0), ("voice".to_owned(), 0.5)]
    );
    let by_machine = report(&app, T, T + HOUR_MS, "machine").await;
    assert_eq!(
        hours(&by_machine),
        [("atlas".to_owned(), 1.0), ("studio".to_owned(), 0.5)]
    );
    assert_eq!(by_machine["total"]["figures"]["gpu_ms"], HOUR_MS * 3 / 2);
    // No readings: use and energy are unknown, not zero.
    assert_eq!(by_machine["total"]["figures"]["energy_mj"], Value::Null);
}

#[tokio::test]
async fn what_is_held_is_recorded_as_work_comes_changes_and_goes() {
    let app = TestApp::new(MAJIN).await;
    let (status, _) = app.post_worker(&shared_worker("listen", 2.0)).await;
    assert_eq!(status, StatusCode::CREATED);
    let spans = || async {
        sqlx::query_as::<_, (String, String, i64, i64, Option<i64>)>(
            "SELECT name, machine, gpu_index, held_bytes, end_ms FROM holdings ORDER BY id",
        )
        .fetch_all(&app.pool)
        .await
        .unwrap()
    };
    let open = spans().await;
    assert_eq!(open.len(), 1);
    assert_eq!(
        (open[0].0.as_str(), open[0].1.as_str(), open[0].2),
        ("listen", "majin", 0)
    );
    assert_eq!(open[0].3, Bytes::gb(2).get() as i64);
    assert_eq!(open[0].4, None);
    // A second write that leaves listen as it was opens nothing new for it.
    let (status, _) = app.post_worker(&shared_worker("voice", 1.0)).await;
    assert_eq!(status, StatusCode::CREATED);
    assert_eq!(spans().await.len(), 2);
    let (status, _) = app.call(Method::DELETE, "/api/workers/listen", None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let after = spans().await;
    assert!(after[0].4.is_some(), "listen's span ended with it");
    assert_eq!(after[1].4, None, "voice still holds its memory");
}

#[tokio::test]
async fn a_period_must_be_times_in_order_and_the_grouping_one_of_four() {
    let app = TestApp::new(MAJIN).await;
    let (status, body) = app.get("/api/usage?from=yesterday").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"],
        "from must be a time such as 2026-12-01T00:00:00Z, not \"yesterday\""
    );
    let (status, body) = app
        .get(&format!("/api/usage?from={}&to={}", at(T + 1), at(T)))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"], "from must be before to");
    let (status, body) = app.get("/api/usage?by=colour").await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"],
        "by must be machine, group, model or worker, not \"colour\""
    );
}
