//! The demo engine (`tessera demo-engine`): a real HTTP process that stands in for an inference engine on
//! machines that do not exist (the demo fleet) and in the tests. It serves a health check, reports the
//! share and environment it was started with, and can be told to fail its health check or to crash.

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the demo engine was started as.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    /// Its PID.
    pub pid: u32,
    /// The engine it is (`TESSERA_ENGINE`).
    pub engine: String,
    /// The command line of the real engine it stands in for.
    pub stands_in_for: Vec<String>,
    /// The share it was given, GB (`TESSERA_GPU_MEMORY_GB`).
    pub gpu_memory_gb: String,
    /// `CUDA_VISIBLE_DEVICES`.
    pub cuda_visible_devices: String,
    /// Every `TESSERA_*` and `CUDA_*` variable it was given.
    pub env: BTreeMap<String, String>,
}

#[derive(Clone)]
struct Engine {
    report: Arc<Report>,
    failing: Arc<AtomicBool>,
}

/// Serves on `TESSERA_HOST` (127.0.0.1 unless set), port `TESSERA_PORT`, until SIGTERM. `TESSERA_DEMO_START_MS` (default 200) is how long it "loads"
/// before it listens, as a real engine loads its weights; with `TESSERA_DEMO_EXIT_AFTER_MS` it exits with
/// status 70 that long after it starts, as an engine that cannot load.
pub async fn run(stands_in_for: Vec<String>) -> Result<(), String> {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let port: u16 = var("TESSERA_PORT")
        .parse()
        .map_err(|_| "TESSERA_PORT must be set to the port to serve on".to_owned())?;
    let loading = var("TESSERA_DEMO_START_MS").parse().unwrap_or(200);
    let report = Report {
        pid: std::process::id(),
        engine: var("TESSERA_ENGINE"),
        stands_in_for,
        gpu_memory_gb: var("TESSERA_GPU_MEMORY_GB"),
        cuda_visible_devices: var("CUDA_VISIBLE_DEVICES"),
        env: std::env::vars()
            .filter(|(k, _)| k.starts_with("TESSERA_") || k.starts_with("CUDA_"))
            .collect(),
    };
    println!(
        "demo engine {} (PID {}): standing in for `{}` with {} GB on GPU {}",
        report.engine,
        report.pid,
        report.stands_in_for.join(" "),
        report.gpu_memory_gb,
        report.cuda_visible_devices
    );
    if let Ok(after) = var("TESSERA_DEMO_EXIT_AFTER_MS").parse::<u64>() {
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(after)).await;
            println!("exiting after {after} ms, as told");
            std::process::exit(70);
        });
    }
    tokio::time::sleep(Duration::from_millis(loading)).await;
    // On a cluster's node, its address (`TESSERA_HOST`): the server checks its health from elsewhere.
    let host = std::env::var("TESSERA_HOST").unwrap_or_else(|_| "127.0.0.1".to_owned());
    let listener = tokio::net::TcpListener::bind((host.as_str(), port))
        .await
        .map_err(|e| format!("could not listen on {host}:{port}: {e}"))?;
    println!("loaded; serving on {host}:{port}");
    let engine = Engine {
        report: Arc::new(report),
        failing: Arc::default(),
    };
    axum::serve(listener, app(engine))
        .with_graceful_shutdown(async {
            terminated().await;
            println!("SIGTERM: stopping");
        })
        .await
        .map_err(|e| e.to_string())
}

async fn terminated() {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut s) => {
            s.recv().await;
        }
        Err(_) => std::future::pending().await,
    }
}

fn app(engine: Engine) -> Router {
    Router::new()
        .route("/", get(report))
        .route("/health", get(health))
        .route("/fail-health", post(fail_health))
        .route("/crash", post(crash))
        .with_state(engine)
}

async fn report(State(engine): State<Engine>) -> Json<Report> {
    Json((*engine.report).clone())
}

async fn health(State(engine): State<Engine>) -> (StatusCode, &'static str) {
    if engine.failing.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "failing, as told")
    } else {
        (StatusCode::OK, "ok")
    }
}

/// From now on the health check fails.
async fn fail_health(State(engine): State<Engine>) -> StatusCode {
    println!("told to fail its health check");
    engine.failing.store(true, Ordering::Relaxed);
    StatusCode::NO_CONTENT
}

/// Exits with status 70 just after answering, as an engine that crashes.
async fn crash() -> StatusCode {
    println!("told to crash");
    tokio::spawn(async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        std::process::exit(70);
    });
    StatusCode::ACCEPTED
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use tower::ServiceExt;

    fn engine() -> Engine {
        Engine {
            report: Arc::new(Report {
                pid: 1,
                engine: "glm".into(),
                stands_in_for: vec!["vllm".into(), "serve".into()],
                gpu_memory_gb: "32".into(),
                cuda_visible_devices: "0".into(),
                env: BTreeMap::new(),
            }),
            failing: Arc::default(),
        }
    }

    async fn status(router: &Router, method: &str, uri: &str) -> StatusCode {
        router
            .clone()
            .oneshot(
                Request::builder()
                    .method(method)
                    .uri(uri)
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap()
            .status()
    }

    #[tokio::test]
    async fn it_is_healthy_until_told_to_fail() {
        let router = app(engine());
        assert_eq!(status(&router, "GET", "/health").await, StatusCode::OK);
        assert_eq!(status(&router, "GET", "/").await, StatusCode::OK);
        assert_eq!(
            status(&router, "POST", "/fail-health").await,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            status(&router, "GET", "/health").await,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
