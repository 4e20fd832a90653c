//! `GET /metrics` of a server with running engines passes Prometheus's own check (`promtool check metrics`,
//! from Debian's prometheus package, which `scripts/setup` installs).

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
    let (status, body) = server.get_bytes("/metrics").await;
    assert_eq!(status, 200);
    let text = String::from_utf8(body.to_vec()).unwrap();
    assert!(text.contains("tessera_engine_healthy{"), "{text}");

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
