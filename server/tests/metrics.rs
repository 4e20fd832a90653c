//! `GET /metrics` of a server with running engines passes Prometheus's own check (`promtool check metrics`,
//! from Debian's prometheus package, which `scripts/setup` installs), and so do the alert rules the project
//! ships for it (`promtool check rules`, `promtool test rules`).

mod support;

use serde_json::json;
use std::io::Write;
use std::process::{Command, Stdio};
use support::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metrics_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), 100).await;
    let (status, _) = server
        .send(
            "POST",
            "/api/deployments",
            json!({"model": "glm-5.3", "gpus": ["atlas:0"], "share": 40}),
        )
        .await;
    assert_eq!(status, 201);
    server
        .send(
            "POST",
            "/api/workers",
            json!({"name": "listen", "requested_resources": {"gpu_requests": {"count": 1, "shared": true, "memory_gb": 2.2}}}),
        )
        .await;
    server.wait_healthy(2).await;
    // Enough requests through the gateway for a p99 alone.
    for _ in 0..25 {
        let (status, answer) = server
            .send(
                "POST",
                "/v1/chat/completions",
                json!({"model": "glm-5.3", "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(status, 200, "{answer}");
    }
    let (status, body) = server.get_bytes("/metrics").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("tessera_engine_healthy{"), "{text}");
    assert!(
        text.contains(r#"tessera_model_latency_p99_seconds{beside="alone",model="glm-5.3"}"#),
        "{text}"
    );
    assert!(
        text.contains(r#"tessera_model_slowed_by_neighbours{model="glm-5.3"} 0"#),
        "{text}"
    );
    for figure in [
        r#"tessera_engine_latency_seconds{engine="group~text-router~glm-5.3~atlas",measure="first_byte",model="glm-5.3",percentile="99"}"#,
        r#"tessera_engine_tokens_per_second{engine="group~text-router~glm-5.3~atlas",model="glm-5.3",percentile="50"}"#,
        r#"tessera_engine_queue_depth{engine="group~text-router~glm-5.3~atlas",model="glm-5.3",percentile="50"} 1"#,
        r#"tessera_engine_window_requests{engine="group~text-router~glm-5.3~atlas",model="glm-5.3"} 25"#,
        r#"tessera_engine_window_errors{engine="group~text-router~glm-5.3~atlas",model="glm-5.3"} 0"#,
    ] {
        assert!(text.contains(figure), "{figure} in {text}");
    }

    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool, from Debian's prometheus package: ./scripts/setup installs it");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success(),
        "promtool check metrics:\n{}{}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    server.stop().await;
}

/// Runs promtool with `args` in `deploy/prometheus`, and says what it printed when it fails.
fn promtool(args: &[&str]) {
    let rules = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/prometheus");
    let out = Command::new("promtool")
        .args(args)
        .current_dir(rules)
        .output()
        .expect("promtool, from Debian's prometheus package: ./scripts/setup installs it");
    assert!(
        out.status.success(),
        "promtool {}:\n{}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_interference_alert_rule_passes_promtools_check_and_fires_only_after_a_minute_flagged() {
    promtool(&["check", "rules", "tessera-alerts.yml"]);
    promtool(&["test", "rules", "tessera-alerts.test.yml"]);
}

/// Every `.rs` file under `dir`, as one text.
fn sources(dir: &std::path::Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            text.push_str(&sources(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            text.push_str(&std::fs::read_to_string(&path).unwrap());
        }
    }
    text
}

#[test]
fn every_metric_the_grafana_dashboard_draws_is_one_tessera_exports() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("../deploy/grafana/tessera.json")).unwrap(),
    )
    .expect("deploy/grafana/tessera.json is JSON");
    let exported = sources(&root.join("src"));
    let mut drawn = std::collections::BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("tessera_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                // A histogram's series are its name with a suffix.
                let family = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| name.strip_suffix(s))
                    .unwrap_or(&name)
                    .to_owned();
                drawn.insert(family);
            }
        }
    }
    assert!(drawn.len() >= 15, "{drawn:?}");
    let unknown: Vec<&String> = drawn
        .iter()
        .filter(|name| !exported.contains(&format!("\"{name}\"")))
        .collect();
    assert!(
        unknown.is_empty(),
        "the dashboard draws metrics Tessera does not export: {unknown:?}"
    );
}
