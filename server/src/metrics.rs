//! `GET /metrics` in Prometheus's text format: each GPU's memory and sharers, each worker's share, state and
//! restarts, engine health, and the HTTP requests served. Labels follow dcgm-exporter (`gpu`, `UUID`,
//! `Hostname`), so that dashboards built for it can join on them; its `modelName` is `model_name` here,
//! because `promtool check metrics` refuses camelCase label names.

use crate::runtime::EngineState;
use crate::AppState;
use axum::extract::{MatchedPath, Request, State};
use axum::http::{header, Method, Uri};
use axum::response::{IntoResponse, Response};
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts, Registry,
    TextEncoder,
};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

/// The HTTP figures, kept from one scrape to the next.
pub struct HttpMetrics {
    registry: Registry,
    requests: IntCounterVec,
    latency: HistogramVec,
}

impl Default for HttpMetrics {
    fn default() -> HttpMetrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new(
                "tessera_http_requests_total",
                "HTTP requests answered, by route and status.",
            ),
            &["method", "route", "status"],
        )
        .expect("a valid metric");
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "tessera_http_request_duration_seconds",
                "Time to answer an HTTP request.",
            )
            .buckets(vec![
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
            ]),
            &["method", "route"],
        )
        .expect("a valid metric");
        registry
            .register(Box::new(requests.clone()))
            .expect("registered once");
        registry
            .register(Box::new(latency.clone()))
            .expect("registered once");
        HttpMetrics {
            registry,
            requests,
            latency,
        }
    }
}

/// Counts and times every request by its route's pattern (not its path, so that names in paths do not
/// make a series each), and logs it: every answer at debug level (`RUST_LOG=server=debug`), a server error
/// at error level. A layer of its own rather than a middleware function: it runs on every request, and a
/// function boxes the rest of the stack and its own future each time; it logs instead of tower-http's
/// trace layer, whose span, body wrapper and classifier cost the read path a tenth of its rate.
#[derive(Clone)]
pub struct TrackLayer {
    metrics: Arc<HttpMetrics>,
}

impl TrackLayer {
    /// Counts into `metrics`.
    pub fn new(metrics: Arc<HttpMetrics>) -> TrackLayer {
        TrackLayer { metrics }
    }
}

impl<S> tower::Layer<S> for TrackLayer {
    type Service = Track<S>;

    fn layer(&self, inner: S) -> Track<S> {
        Track {
            inner,
            metrics: self.metrics.clone(),
        }
    }
}

/// The service of [`TrackLayer`].
#[derive(Clone)]
pub struct Track<S> {
    inner: S,
    metrics: Arc<HttpMetrics>,
}

impl<S> tower::Service<Request> for Track<S>
where
    S: tower::Service<Request, Response = Response>,
{
    type Response = Response;
    type Error = S::Error;
    type Future = Tracked<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request) -> Tracked<S::Future> {
        // Both are shared, not copied.
        let method = request.method().clone();
        let route = request.extensions().get::<MatchedPath>().cloned();
        let uri = tracing::enabled!(tracing::Level::ERROR).then(|| request.uri().clone());
        Tracked {
            inner: self.inner.call(request),
            metrics: self.metrics.clone(),
            method,
            route,
            uri,
            start: Instant::now(),
        }
    }
}

pin_project_lite::pin_project! {
    /// A request being answered, timed.
    pub struct Tracked<F> {
        #[pin]
        inner: F,
        metrics: Arc<HttpMetrics>,
        method: Method,
        route: Option<MatchedPath>,
        // Kept only where a log may want it.
        uri: Option<Uri>,
        start: Instant,
    }
}

impl<F, E> Future for Tracked<F>
where
    F: Future<Output = Result<Response, E>>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let answered = std::task::ready!(this.inner.poll(cx));
        if let Ok(response) = &answered {
            let route = this.route.as_ref().map_or("unmatched", MatchedPath::as_str);
            let method = this.method.as_str();
            this.metrics
                .requests
                .with_label_values(&[method, route, response.status().as_str()])
                .inc();
            let took = this.start.elapsed();
            this.metrics
                .latency
                .with_label_values(&[method, route])
                .observe(took.as_secs_f64());
            let status = response.status();
            let uri = this.uri.as_ref().map(Uri::path).unwrap_or_default();
            if status == axum::http::StatusCode::SERVICE_UNAVAILABLE {
                // Not ready yet, and told when to ask again (a model loading, an engine restarting):
                // expected while engines come and go, not a fault of the server's.
                tracing::warn!(%method, uri, %status, ?took, "answered 503: nothing ready to serve it yet");
            } else if status.is_server_error() {
                tracing::error!(%method, uri, %status, ?took, "answered with a server error");
            } else {
                tracing::debug!(%method, uri, %status, ?took, "answered");
            }
        }
        Poll::Ready(answered)
    }
}

/// `GET /metrics`.
pub async fn metrics(State(state): State<AppState>) -> Response {
    match render(&state).await {
        Ok(text) => ([(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)], text).into_response(),
        Err(e) => crate::error::ApiError::internal(e).into_response(),
    }
}

const STATES: [(EngineState, &str); 8] = [
    (EngineState::Starting, "starting"),
    (EngineState::Healthy, "healthy"),
    (EngineState::Draining, "draining"),
    (EngineState::Unhealthy, "unhealthy"),
    (EngineState::Restarting, "restarting"),
    (EngineState::Asleep, "asleep"),
    (EngineState::Stopped, "stopped"),
    (EngineState::Failed, "failed"),
];

/// The fleet as it is now, then the HTTP figures.
async fn render(state: &AppState) -> Result<String, prometheus::Error> {
    let fleet = &state.fleet;
    let registry = Registry::new();
    let gauge =
        |name: &str, help: &str, labels: &[&str]| -> Result<IntGaugeVec, prometheus::Error> {
            let g = IntGaugeVec::new(Opts::new(name, help), labels)?;
            registry.register(Box::new(g.clone()))?;
            Ok(g)
        };
    // dcgm-exporter's names, but `model_name` for its `modelName`: promtool refuses camelCase label names.
    let gpu_labels = ["gpu", "UUID", "model_name", "Hostname"];
    let total = gauge(
        "tessera_gpu_memory_total_bytes",
        "All of the GPU's memory.",
        &gpu_labels,
    )?;
    let offered = gauge(
        "tessera_gpu_memory_offered_bytes",
        "The GPU's memory offered to Tessera: its total less what is held outside.",
        &gpu_labels,
    )?;
    let outside = gauge(
        "tessera_gpu_memory_held_outside_bytes",
        "The GPU's memory held by programs Tessera does not run.",
        &gpu_labels,
    )?;
    let taken = gauge(
        "tessera_gpu_memory_taken_bytes",
        "The GPU's memory taken by Tessera's shared work.",
        &gpu_labels,
    )?;
    let sharers = gauge(
        "tessera_gpu_sharers",
        "Workers and models sharing the GPU.",
        &gpu_labels,
    )?;
    let share = gauge(
        "tessera_worker_share_bytes",
        "The GPU memory a worker (or a sharing group's model) holds on a GPU: its share, or the whole GPU.",
        &["worker", "group", "gpu", "UUID", "Hostname"],
    )?;
    let used = gauge(
        "tessera_worker_gpu_memory_used_bytes",
        "The GPU memory a worker's (or a sharing group's model's) engine was last measured to hold on a GPU, where the driver reports it per process.",
        &["worker", "group", "gpu", "UUID", "Hostname"],
    )?;
    let over = gauge(
        "tessera_worker_over_share",
        "1 for each sharer whose engine holds more GPU memory than its share (a promise broken on a time-sliced GPU); a sharer within its share has no series.",
        &["worker", "group", "gpu", "UUID", "Hostname"],
    )?;
    for machine in fleet.machines() {
        for gpu in &machine.gpus {
            let index = gpu.index.to_string();
            let labels = [
                index.as_str(),
                gpu.uuid.as_str(),
                gpu.model.as_str(),
                machine.name.as_str(),
            ];
            total.with_label_values(&labels).set(gpu.total_bytes as i64);
            offered
                .with_label_values(&labels)
                .set(gpu.offered_bytes as i64);
            outside
                .with_label_values(&labels)
                .set(gpu.held_outside_bytes as i64);
            taken.with_label_values(&labels).set(gpu.taken_bytes as i64);
            sharers
                .with_label_values(&labels)
                .set(gpu.sharers.len() as i64);
            for sharer in &gpu.sharers {
                share
                    .with_label_values(&[
                        sharer.worker.as_str(),
                        sharer.group.as_deref().unwrap_or(""),
                        index.as_str(),
                        gpu.uuid.as_str(),
                        machine.name.as_str(),
                    ])
                    .set(sharer.bytes as i64);
                let labels = [
                    sharer.worker.as_str(),
                    sharer.group.as_deref().unwrap_or(""),
                    index.as_str(),
                    gpu.uuid.as_str(),
                    machine.name.as_str(),
                ];
                if sharer.over_share.is_some() {
                    over.with_label_values(&labels).set(1);
                }
                if let Some(bytes) = sharer.measured_bytes {
                    used.with_label_values(&labels).set(bytes as i64);
                }
            }
            if let Some(worker) = &gpu.held_by {
                share
                    .with_label_values(&[
                        worker.as_str(),
                        "",
                        index.as_str(),
                        gpu.uuid.as_str(),
                        machine.name.as_str(),
                    ])
                    .set(gpu.total_bytes as i64);
            }
        }
    }
    // Counted by state, not a series per worker: a fleet of 40,000 workers is two series here.
    let workers = gauge(
        "tessera_workers",
        "Workers in each state: placed or pending.",
        &["state"],
    )?;
    for s in ["placed", "pending"] {
        workers.with_label_values(&[s]).set(0);
    }
    for worker in fleet.workers() {
        workers.with_label_values(&[worker.state.as_str()]).inc();
    }
    let engine_labels = ["engine", "worker", "group", "Hostname"];
    let engine_state = gauge(
        "tessera_engine_state",
        "1, labelled with the state each engine is in: starting, healthy, unhealthy, draining, restarting, stopped or failed (one series per engine, its current state).",
        &["engine", "worker", "group", "Hostname", "state"],
    )?;
    let healthy = gauge(
        "tessera_engine_healthy",
        "1 while the engine answers its health check.",
        &engine_labels,
    )?;
    let in_flight = gauge(
        "tessera_engine_requests_in_flight",
        "The gateway's requests to the engine now, sent and not yet answered to the end.",
        &engine_labels,
    )?;
    let waiting = gauge(
        "tessera_model_requests_waiting",
        "Requests the gateway holds for the model now, waiting for an engine of it to be ready (a load, a restart).",
        &["model"],
    )?;
    for (model, n) in state.gateway.waiting() {
        waiting.with_label_values(&[model.as_str()]).set(n as i64);
    }
    let autoscaled = fleet.autoscaled();
    if !autoscaled.is_empty() {
        let running = gauge(
            "tessera_model_replicas_running",
            "The replicas of an autoscaled model placed now (serving or starting; one being removed drains uncounted).",
            &["model"],
        )?;
        let desired = gauge(
            "tessera_model_replicas_desired",
            "The replicas its load last asked for; above running while some wait for room.",
            &["model"],
        )?;
        for model in autoscaled {
            if let Some(view) = fleet.replicas_view(&model.model) {
                let label = [model.model.as_str()];
                running
                    .with_label_values(&label)
                    .set(i64::from(view.running));
                desired
                    .with_label_values(&label)
                    .set(i64::from(view.desired));
            }
        }
    }
    let restarts = IntCounterVec::new(
        Opts::new(
            "tessera_engine_restarts_total",
            "Restarts after a crash or failed health checks since the server started.",
        ),
        &engine_labels,
    )?;
    registry.register(Box::new(restarts.clone()))?;
    if let Some(cluster) = fleet.cluster_status() {
        gauge(
            "tessera_ray_cluster_up",
            "1 where the Ray cluster (--ray) answered the last time it was asked, 0 where it did not.",
            &[],
        )?
        .with_label_values(&[] as &[&str])
        .set(i64::from(cluster.up));
    }
    let engines = gauge("tessera_engines", "Engines in each state.", &["state"])?;
    for (_, text) in STATES {
        engines.with_label_values(&[text]).set(0);
    }
    for engine in fleet.runtime().engines() {
        let name = engine
            .worker
            .as_deref()
            .or(engine.model.as_deref())
            .unwrap_or_default();
        let group = engine.group.as_deref().unwrap_or_default();
        let labels = [engine.id.as_str(), name, group, engine.machine.as_str()];
        if let Some((_, text)) = STATES.iter().find(|(s, _)| *s == engine.state) {
            let mut with_state = labels.to_vec();
            with_state.push(text);
            engine_state.with_label_values(&with_state).set(1);
            engines.with_label_values(&[text]).inc();
        }
        healthy
            .with_label_values(&labels)
            .set(i64::from(engine.state == EngineState::Healthy));
        in_flight
            .with_label_values(&labels)
            .set(fleet.runtime().requests_in_flight(&engine.unit) as i64);
        restarts
            .with_label_values(&labels)
            .inc_by(u64::from(engine.restarts));
    }
    on_demand_figures(&registry, fleet)?;
    latency_figures(&registry, fleet)?;
    let mut families = registry.gather();
    families.extend(state.http_metrics.registry.gather());
    families.extend(state.fleet.calls().registry().gather());
    let mut out = Vec::new();
    TextEncoder::new().encode(&families, &mut out)?;
    String::from_utf8(out).map_err(|e| prometheus::Error::Msg(e.to_string()))
}

/// Each on-demand model's loads tried, its last cold start (the load apart from the wait before it) and its
/// last wake from sleep.
fn on_demand_figures(
    registry: &Registry,
    fleet: &crate::fleet::Fleet,
) -> Result<(), prometheus::Error> {
    let attempts = IntCounterVec::new(
        Opts::new(
            "tessera_on_demand_load_attempts_total",
            "Loads tried for an on-demand model since the server started: each a fleet write, committed or refused for want of room.",
        ),
        &["model"],
    )?;
    let cold_start = GaugeVec::new(
        Opts::new(
            "tessera_on_demand_cold_start_seconds",
            "An on-demand model's last cold start: the load itself (load), and what the request that loaded it waited before the load began (wait).",
        ),
        &["model", "part"],
    )?;
    let wake = GaugeVec::new(
        Opts::new(
            "tessera_on_demand_wake_seconds",
            "An on-demand model's last wake from sleep, from the request that woke it to its engine taking it: beside its cold start, what sleeping instead of stopping saves.",
        ),
        &["model"],
    )?;
    registry.register(Box::new(attempts.clone()))?;
    registry.register(Box::new(cold_start.clone()))?;
    registry.register(Box::new(wake.clone()))?;
    for (model, usage) in fleet.on_demand_usage() {
        attempts
            .with_label_values(&[model.as_str()])
            .inc_by(usage.load_attempts);
        if let Some(took) = usage.last_wake {
            wake.with_label_values(&[model.as_str()])
                .set(took.as_secs_f64());
        }
        if let Some(cold) = usage.cold_start {
            for (part, took) in [("load", cold.load), ("wait", cold.waited)] {
                cold_start
                    .with_label_values(&[model.as_str(), part])
                    .set(took.as_secs_f64());
            }
        }
    }
    Ok(())
}

/// Each engine's latency, tokens per second, queue and errors through the gateway over the window; each
/// model's latency beside busy neighbours and alone, their ratio, and whether it is flagged as slowed by its
/// neighbours (the alert rule in `deploy/prometheus/` fires on it).
fn latency_figures(
    registry: &Registry,
    fleet: &crate::fleet::Fleet,
) -> Result<(), prometheus::Error> {
    let p99 = GaugeVec::new(
        Opts::new(
            "tessera_model_latency_p99_seconds",
            "A model's p99 time to first byte through the gateway: over the window beside busy neighbours (shared), or kept from when it ran alone (alone).",
        ),
        &["model", "beside"],
    )?;
    let p50 = GaugeVec::new(
        Opts::new(
            "tessera_model_latency_p50_seconds",
            "A model's p50 time to first byte through the gateway over the window, beside busy neighbours.",
        ),
        &["model"],
    )?;
    let ratio = GaugeVec::new(
        Opts::new(
            "tessera_model_interference_ratio",
            "A model's p99 beside busy neighbours over its p99 alone, when both rest on enough requests.",
        ),
        &["model"],
    )?;
    let slowed = IntGaugeVec::new(
        Opts::new(
            "tessera_model_slowed_by_neighbours",
            "1 while the model is flagged: its interference ratio passed the threshold.",
        ),
        &["model"],
    )?;
    let threshold = prometheus::Gauge::new(
        "tessera_interference_threshold_ratio",
        "The interference ratio a model is flagged past (--interference-threshold).",
    )?;
    let latency = GaugeVec::new(
        Opts::new(
            "tessera_engine_latency_seconds",
            "An engine's time to the first byte, or to the end, of its answers through the gateway over the window, at a percentile.",
        ),
        &["engine", "model", "measure", "percentile"],
    )?;
    let tokens = GaugeVec::new(
        Opts::new(
            "tessera_engine_tokens_per_second",
            "An engine's completion tokens per second of request through the gateway over the window, at a percentile.",
        ),
        &["engine", "model", "percentile"],
    )?;
    let queue = GaugeVec::new(
        Opts::new(
            "tessera_engine_queue_depth",
            "The gateway's requests in flight to an engine as each was sent, over the window, at a percentile.",
        ),
        &["engine", "model", "percentile"],
    )?;
    let requests = IntGaugeVec::new(
        Opts::new(
            "tessera_engine_window_requests",
            "Requests the gateway sent an engine over the window.",
        ),
        &["engine", "model"],
    )?;
    let errors = IntGaugeVec::new(
        Opts::new(
            "tessera_engine_window_errors",
            "Of those, the ones that failed (an error status, or no answer).",
        ),
        &["engine", "model"],
    )?;
    for family in [&p99, &p50, &ratio, &latency, &tokens, &queue] {
        registry.register(Box::new(family.clone()))?;
    }
    registry.register(Box::new(requests.clone()))?;
    registry.register(Box::new(errors.clone()))?;
    for (model, engines) in fleet.latencies().engines_all(crate::fleet::usage::now_ms()) {
        for figures in engines {
            let engine = crate::runtime::engine_id(&figures.engine);
            let at = |percentile: &'static str| [engine.as_str(), model.as_str(), percentile];
            let spreads = |spread: Option<placement::interference::Spread>| {
                spread
                    .into_iter()
                    .flat_map(|s| [("50", s.p50), ("99", s.p99)])
            };
            for (measure, spread) in [
                ("first_byte", figures.first_byte_us),
                ("request", figures.request_us),
            ] {
                for (p, us) in spreads(spread) {
                    latency
                        .with_label_values(&[engine.as_str(), model.as_str(), measure, p])
                        .set(us as f64 / 1e6);
                }
            }
            for (p, per_second) in spreads(figures.tokens_per_second) {
                tokens.with_label_values(&at(p)).set(per_second as f64);
            }
            for (p, depth) in spreads(figures.queue_depth) {
                queue.with_label_values(&at(p)).set(depth as f64);
            }
            requests
                .with_label_values(&[engine.as_str(), model.as_str()])
                .set(figures.requests as i64);
            errors
                .with_label_values(&[engine.as_str(), model.as_str()])
                .set(figures.errors as i64);
        }
    }
    registry.register(Box::new(slowed.clone()))?;
    registry.register(Box::new(threshold.clone()))?;
    threshold.set(fleet.latencies().threshold().as_f64());
    let flagged = fleet.latencies().flagged();
    let seconds = |us: u64| us as f64 / 1e6;
    for (model, judged) in fleet.latencies().judge_all(crate::fleet::usage::now_ms()) {
        if let Some(us) = judged.shared_p99_us {
            p99.with_label_values(&[model.as_str(), "shared"])
                .set(seconds(us));
        }
        if let Some(us) = judged.alone_p99_us {
            p99.with_label_values(&[model.as_str(), "alone"])
                .set(seconds(us));
        }
        if let Some(us) = judged.shared_p50_us {
            p50.with_label_values(&[model.as_str()]).set(seconds(us));
        }
        if let Some(r) = judged.ratio {
            ratio.with_label_values(&[model.as_str()]).set(r.as_f64());
        }
        slowed
            .with_label_values(&[model.as_str()])
            .set(i64::from(flagged.contains_key(&model)));
    }
    Ok(())
}
