//! Usage from hand-made histories (exact figures), from what the server records as work comes and goes, and
//! the metrics read back against the API.

use crate::testing::{majin_and_node, shared_worker, TestApp, MAJIN};
use axum::http::{Method, StatusCode};
use placement::usage::HOUR_MS;
use placement::Bytes;
use serde_json::Value;
use std::collections::BTreeMap;

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

/// `/metrics` as name → (labels → value).
fn parse_metrics(text: &str) -> BTreeMap<String, BTreeMap<BTreeMap<String, String>, f64>> {
    let mut out: BTreeMap<String, BTreeMap<BTreeMap<String, String>, f64>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split(',')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let (k, v) = l.split_once('=').unwrap();
                (k.to_owned(), v.trim_matches('"').to_owned())
            })
            .collect();
        out.entry(name.to_owned())
            .or_default()
            .insert(labels, value.parse().unwrap());
    }
    out
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn the_metrics_say_what_the_api_says() {
    let app = TestApp::new(&majin_and_node()).await;
    for (name, gb) in [("listen", 2.2), ("voice", 4.2)] {
        let (status, _) = app.post_worker(&shared_worker(name, gb)).await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (status, text) = app.get("/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let metrics = parse_metrics(text.as_str().expect("text"));
    let (_, machines) = app.get("/api/machines").await;
    let mut gpus = 0;
    for machine in machines.as_array().unwrap() {
        for gpu in machine["gpus"].as_array().unwrap() {
            gpus += 1;
            let index = gpu["index"].to_string();
            let key = labels(&[
                ("gpu", &index),
                ("UUID", gpu["uuid"].as_str().unwrap()),
                ("model_name", gpu["model"].as_str().unwrap()),
                ("Hostname", machine["name"].as_str().unwrap()),
            ]);
            for (metric, field) in [
                ("tessera_gpu_memory_total_bytes", "total_bytes"),
                ("tessera_gpu_memory_offered_bytes", "offered_bytes"),
                (
                    "tessera_gpu_memory_held_outside_bytes",
                    "held_outside_bytes",
                ),
                ("tessera_gpu_memory_taken_bytes", "taken_bytes"),
            ] {
                assert_eq!(
                    metrics[metric][&key],
                    gpu[field].as_u64().unwrap() as f64,
                    "{metric} {key:?}"
                );
            }
            assert_eq!(
                metrics["tessera_gpu_sharers"][&key],
                gpu["sharers"].as_array().unwrap().len() as f64
            );
            for sharer in gpu["sharers"].as_array().unwrap() {
                let key = labels(&[
                    ("worker", sharer["worker"].as_str().unwrap()),
                    ("group", ""),
                    ("gpu", &index),
                    ("UUID", gpu["uuid"].as_str().unwrap()),
                    ("Hostname", machine["name"].as_str().unwrap()),
                ]);
                assert_eq!(
                    metrics["tessera_worker_share_bytes"][&key],
                    sharer["bytes"].as_u64().unwrap() as f64
                );
            }
        }
    }
    assert_eq!(gpus, 3);
    assert_eq!(metrics["tessera_worker_share_bytes"].len(), 2);
    assert_eq!(
        metrics["tessera_worker_state"][&labels(&[("worker", "listen"), ("state", "placed")])],
        1.0
    );
    assert_eq!(
        metrics["tessera_http_requests_total"][&labels(&[
            ("method", "POST"),
            ("route", "/api/workers"),
            ("status", "201")
        ])],
        2.0
    );
    assert!(metrics.contains_key("tessera_http_request_duration_seconds_bucket"));
}

#[tokio::test]
async fn each_engine_has_one_state_set_and_its_restarts_counted() {
    let app = TestApp::new(MAJIN).await;
    let (status, _) = app.post_worker(&shared_worker("listen", 2.2)).await;
    assert_eq!(status, StatusCode::CREATED);
    app.fleet.runtime().settled().await;
    let (_, text) = app.get("/metrics").await;
    let metrics = parse_metrics(text.as_str().expect("text"));
    let states: Vec<(&str, f64)> = metrics["tessera_engine_state"]
        .iter()
        .map(|(labels, value)| (labels["state"].as_str(), *value))
        .filter(|(_, value)| *value == 1.0)
        .collect();
    // majin is not this machine: the engine is listed as stopped.
    assert_eq!(states, [("stopped", 1.0)]);
    assert_eq!(metrics["tessera_engine_state"].len(), 6);
    let engine = labels(&[
        ("engine", "listen"),
        ("worker", "listen"),
        ("group", ""),
        ("Hostname", "majin"),
    ]);
    assert_eq!(metrics["tessera_engine_healthy"][&engine], 0.0);
    assert_eq!(metrics["tessera_engine_restarts_total"][&engine], 0.0);
}

/// The cells of the Usage page's table, row by row, as the page renders them.
fn page_rows(html: &str) -> Vec<Vec<String>> {
    let table = &html[html
        .find(r#"data-testid="usage-table""#)
        .expect("the usage table")..];
    let table = &table[..table.find("</table>").unwrap()];
    let body = &table[table.find("<tbody>").unwrap()..];
    body.split("<tr>")
        .skip(1)
        .map(|row| {
            let parts: Vec<&str> = row.split(['<', '>']).collect();
            parts
                .windows(2)
                .filter(|w| w[0].starts_with("th") || w[0].starts_with("td"))
                .map(|w| w[1].replace('—', ""))
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn the_usage_page_shows_what_the_csv_says() {
    let app = TestApp::new(MAJIN).await;
    let now = crate::fleet::usage::now_ms();
    held(
        &app,
        "listen",
        "majin",
        0,
        2,
        8,
        (now - 3 * HOUR_MS, now - 2 * HOUR_MS),
    )
    .await;
    held(
        &app,
        "voice",
        "majin",
        0,
        4,
        8,
        (now - 2 * HOUR_MS, now - HOUR_MS),
    )
    .await;
    let (status, page) = app.get("/usage?period=24h&by=worker").await;
    assert_eq!(status, StatusCode::OK);
    let rows = page_rows(page.as_str().unwrap());
    let (_, csv) = app
        .get(&format!(
            "/api/usage.csv?from={}&to={}&by=worker",
            at(now - 24 * HOUR_MS),
            at(now)
        ))
        .await;
    let csv: Vec<Vec<String>> = csv
        .as_str()
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_owned).collect())
        .collect();
    assert_eq!(
        rows,
        [
            ["voice", "0.5", "", ""],
            ["listen", "0.25", "", ""],
            ["Total", "0.75", "", ""]
        ]
    );
    assert_eq!(rows, csv);
}
