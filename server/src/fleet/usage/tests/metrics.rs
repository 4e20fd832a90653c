//! `/metrics` read back against the API: the GPUs' memory, the sharers, the workers' and engines' states.

use crate::testing::{majin_and_node, shared_worker, TestApp, MAJIN};
use axum::http::StatusCode;
use std::collections::BTreeMap;

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
        metrics["tessera_workers"][&labels(&[("state", "placed")])],
        2.0,
        "workers counted by state, no series of their own"
    );
    assert_eq!(
        metrics["tessera_workers"][&labels(&[("state", "pending")])],
        0.0
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
async fn each_engine_has_one_series_for_its_current_state_engines_are_counted_by_state_and_restarts_counted(
) {
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
    assert_eq!(
        metrics["tessera_engine_state"].len(),
        1,
        "one series, its current state"
    );
    assert_eq!(
        metrics["tessera_engines"][&labels(&[("state", "stopped")])],
        1.0
    );
    assert_eq!(
        metrics["tessera_engines"][&labels(&[("state", "healthy")])],
        0.0
    );
    let engine = labels(&[
        ("engine", "listen"),
        ("worker", "listen"),
        ("group", ""),
        ("Hostname", "majin"),
    ]);
    assert_eq!(metrics["tessera_engine_healthy"][&engine], 0.0);
    assert_eq!(metrics["tessera_engine_restarts_total"][&engine], 0.0);
}
