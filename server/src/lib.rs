//! Tessera's server: the fleet and its database, the REST API, and the console (rendered here, hydrated in
//! the browser) with its server functions.
//!
//! A library with a thin `main`, so that tests drive [`router`] without a socket.
#![forbid(unsafe_code)]

pub mod accounts;
pub mod api;
pub mod audit;
pub mod auth;
pub mod catalog;
pub mod cli;
pub mod config;
pub mod console;
pub mod db;
pub mod demo_engine;
pub mod error;
pub mod fleet;
pub mod gateway;
pub mod input;
pub mod inventory;
pub mod listeners;
pub mod metrics;
mod random;
pub mod redact;
pub mod runtime;
pub mod security;
pub mod site;
pub mod tls;

use app::{shell, App};
use axum::extract::DefaultBodyLimit;
use axum::extract::FromRef;
use axum::routing::post;
use axum::{Json, Router};
use config::Config;
use fleet::Fleet;
use leptos::config::LeptosOptions;
use leptos_axum::{generate_route_list, AxumRouteListing, LeptosRoutes};
use std::future::{Future, IntoFuture};
use std::sync::{Arc, LazyLock};
use std::time::Duration;
use tower_http::compression::CompressionLayer;

/// Why the server could not start or had to stop.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The console's build settings could not be read.
    #[error("could not read the console's settings (build it with cargo leptos): {0}")]
    LeptosConfig(#[from] leptos::config::errors::LeptosConfigError),
    /// https cannot be served with the certificate and key given.
    #[error("could not serve https (--tls-cert, --tls-key): {0}")]
    Tls(#[from] tls::TlsError),
    /// Only the demo fleet's GPUs and a cluster's made-up ones are simulated.
    #[error("--simulate-gpus simulates the demo fleet's GPUs or a Ray cluster's made-up ones: add --demo or --ray")]
    SimulationWithoutDemo,
    /// The simulated GPUs' folder could not be made.
    #[error("could not simulate the demo fleet's GPUs (--simulate-gpus): {0}")]
    Simulation(inventory::simulated::SimError),
    /// An address cannot be listened on, or a socket passed by the service manager cannot be used.
    #[error(transparent)]
    Listen(#[from] listeners::ListenError),
    /// Another server (or a restore) holds the data folder.
    #[error(transparent)]
    Locked(#[from] db::backup::LockError),
    /// The database (or its data folder) cannot be opened or migrated.
    #[error(transparent)]
    Open(#[from] db::OpenError),
    /// The runtime's records cannot be read.
    #[error("the database could not be opened or migrated: {0}; check DATABASE_URL or --data-dir")]
    Database(#[source] sqlx::Error),
    /// The inventory file is malformed.
    #[error("{0}")]
    InventoryFile(#[from] crate::inventory::file::InventoryFileError),
    /// The machines from all sources contradict each other.
    #[error("the inventory cannot be used: {0}")]
    Inventory(#[from] placement::InventoryError),
    /// `--here` names no machine that can be this one.
    #[error("{0}")]
    Here(String),
    /// The Ray cluster asked for is not usable.
    #[error("{0}; check --ray (TESSERA_RAY) and --ray-token")]
    Ray(#[from] crate::inventory::ray::RayError),
    /// The stored state could not be loaded.
    #[error("the stored workers could not be loaded: {0}")]
    Load(error::ApiError),
    /// The server's own binary cannot be found, to run the demo engine from.
    #[error("could not find this program's own path (to run the demo engine): {0}")]
    Exe(std::io::Error),
    /// Serving failed.
    #[error("the server stopped: {0}")]
    Serve(std::io::Error),
}

/// Everything a request handler may need, behind one `Arc`: every request clones the state (each
/// middleware and handler that takes it), and a clone of the parts themselves (the Leptos options, a
/// dozen strings) would cost more than the answer to a read.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

/// What [`AppState`] holds.
pub struct Shared {
    /// Where the built site lives and how the page loads it.
    pub leptos_options: LeptosOptions,
    /// The machines, their GPUs and the workers on them.
    pub fleet: Arc<Fleet>,
    /// The database, for what is not the fleet's: accounts, sessions, the audit log.
    pub pool: sqlx::SqlitePool,
    /// The HTTP requests served, for `/metrics`.
    pub http_metrics: Arc<metrics::HttpMetrics>,
    /// Failed sign-ins, per account and per address.
    pub throttle: Arc<auth::throttle::Throttle>,
    /// API tokens seen lately.
    pub tokens: Arc<accounts::TokenCache>,
    /// Served over https: session cookies are Secure, and answers carry HSTS.
    pub https: bool,
    /// Reverse proxies whose X-Forwarded-For names the client.
    pub trusted_proxies: Vec<std::net::IpAddr>,
    /// The OpenAI-compatible gateway's connections and rotations.
    pub gateway: Arc<gateway::Gateway>,
    /// Set once the server begins to stop: every answer then says `Connection: close`, so that the client's
    /// next request opens a connection, which the next server answers where the socket outlives this one.
    pub stopping: Arc<std::sync::atomic::AtomicBool>,
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What leptos_axum takes from the state.
impl FromRef<AppState> for LeptosOptions {
    fn from_ref(state: &AppState) -> LeptosOptions {
        state.leptos_options.clone()
    }
}

impl AppState {
    /// The state over `fleet`, served over plain http.
    pub fn new(
        leptos_options: LeptosOptions,
        fleet: Arc<Fleet>,
        pool: sqlx::SqlitePool,
    ) -> AppState {
        AppState::serving(
            leptos_options,
            fleet,
            pool,
            false,
            gateway::Gateway::default(),
            Vec::new(),
        )
    }

    /// The state over `fleet`; `https` when the console is reached over https; the `gateway` in front of
    /// the engines; `trusted_proxies` name the client in X-Forwarded-For.
    pub fn serving(
        leptos_options: LeptosOptions,
        fleet: Arc<Fleet>,
        pool: sqlx::SqlitePool,
        https: bool,
        gateway: gateway::Gateway,
        trusted_proxies: Vec<std::net::IpAddr>,
    ) -> AppState {
        AppState(Arc::new(Shared {
            leptos_options,
            fleet,
            pool,
            http_metrics: Arc::default(),
            throttle: Arc::default(),
            tokens: Arc::default(),
            https,
            trusted_proxies,
            gateway: Arc::new(gateway),
            stopping: Arc::default(),
        }))
    }
}

/// The console's routes, listed once per process. Listing runs the app with resource loads suppressed for
/// the whole process (leptos#4773): a page that began rendering on another thread meanwhile would wait
/// forever, as tests that each build a router did now and then.
fn route_list() -> Vec<AxumRouteListing> {
    static ROUTES: LazyLock<Vec<AxumRouteListing>> = LazyLock::new(|| generate_route_list(App));
    ROUTES.clone()
}

/// The whole HTTP surface: the REST API under `/api`, the console's pages and its server functions (under
/// `/rpc`), the sign-in forms; every request through the guard (`auth`), every answer with the security
/// headers.
pub fn router(state: AppState) -> Router {
    let routes = route_list();
    let options = state.leptos_options.clone();
    let services = app::services::Services {
        console: Arc::new(console::ConsoleService::new(
            state.fleet.clone(),
            state.pool.clone(),
            state.tokens.clone(),
        )),
    };
    let sessions = auth::session_layer(state.pool.clone(), state.https);
    Router::new()
        .route("/login", post(auth::sign_in))
        .route("/logout", post(auth::sign_out))
        .route("/setup", post(auth::set_up))
        .merge(api::routes())
        .leptos_routes_with_context(
            &state,
            routes,
            move || leptos::prelude::provide_context(services.clone()),
            move || shell(options.clone()),
        )
        .fallback(site_or_error)
        // One layer of layers: the router boxes each route once for it, where a layer apiece boxed the
        // route again at every step (and a request cloned every box on its way in).
        .layer(
            tower::ServiceBuilder::new()
                // The wizard's options and the repack's fleet are megabytes at a thousand machines, and
                // shrink thirty to seventy times (BENCHMARKS.md). Event streams are left alone (the
                // default predicate), the site's files come compressed already (`site`), and the gateway
                // is not under it.
                .layer(CompressionLayer::new())
                .layer(closing(&state))
                .layer(metrics::TrackLayer::new(state.http_metrics.clone()))
                .layer(security::HeadersLayer::new(state.https))
                .layer(DefaultBodyLimit::max(security::MAX_BODY_BYTES))
                .layer(auth::SessionsUnlessToken::new(sessions))
                .layer(auth::GuardLayer::new(state.clone())),
        )
        .merge(gateway_routes(&state))
        .with_state(state)
}

/// A file of the site (from inside the binary where it was built in, else from the site folder), or the
/// console's own not-found page.
async fn site_or_error(
    uri: axum::http::Uri,
    state: axum::extract::State<AppState>,
    request: axum::extract::Request,
) -> axum::response::Response {
    if let Some(answer) = site::serve(&uri, request.headers()) {
        return answer;
    }
    leptos_axum::file_and_error_handler::<AppState, _>(shell)(uri, state, request).await
}

/// The gateway's routes with their layers. The gateway checks its own keys and answers in OpenAI's shape;
/// it has no sessions, no CSRF, and no 30 s bound (an answer may take longer to generate).
fn gateway_routes(state: &AppState) -> Router<AppState> {
    gateway::routes().layer(
        tower::ServiceBuilder::new()
            .layer(closing(state))
            .layer(metrics::TrackLayer::new(state.http_metrics.clone()))
            .layer(security::HeadersLayer::new(state.https)),
    )
}

/// Says `Connection: close` on every answer once the server is stopping (`AppState::stopping`).
fn closing(
    state: &AppState,
) -> tower::util::MapResponseLayer<
    impl Fn(axum::response::Response) -> axum::response::Response + Clone,
> {
    let stopping = state.stopping.clone();
    tower::util::MapResponseLayer::new(move |mut answer: axum::response::Response| {
        if stopping.load(std::sync::atomic::Ordering::Relaxed) {
            answer.headers_mut().insert(
                axum::http::header::CONNECTION,
                axum::http::HeaderValue::from_static("close"),
            );
        }
        answer
    })
}

/// The gateway alone, for `--gateway-listen`.
pub fn gateway_router(state: AppState) -> Router {
    gateway_routes(&state).with_state(state)
}

/// `app` served on `listener` (at `addr`), over TLS where `tls` is given: new connections are taken until
/// `stop_taking`, and those taken are served until `stop`, then let finish what they are answering. The one
/// way both of the server's addresses (the console's and the gateway's own) are served, each connection's
/// address kept for the guard and the audit log.
fn serve_on(
    listener: tokio::net::TcpListener,
    addr: std::net::SocketAddr,
    tls: Option<&tokio_rustls::TlsAcceptor>,
    app: Router,
    stop_taking: impl Future<Output = ()> + Send + 'static,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>, ServerError> {
    let app = app.into_make_service_with_connect_info::<auth::Remote>();
    let bind = |source| listeners::ListenError::Bind { addr, source };
    let listener = listeners::Closing::new(listener, stop_taking).map_err(bind)?;
    Ok(match tls {
        Some(acceptor) => {
            let listener = tls::TlsListener::new(listener, acceptor.clone()).map_err(bind)?;
            Box::pin(
                axum::serve(listener, app)
                    .with_graceful_shutdown(stop)
                    .into_future(),
            )
        }
        None => Box::pin(
            axum::serve(listener, app)
                .with_graceful_shutdown(stop)
                .into_future(),
        ),
    })
}

/// `GET /api/health`: answers as soon as the server serves, for scripts and start-up checks; with a Ray
/// cluster, whether it answers (the server serves either way, what it last read of the cluster).
pub(crate) async fn health(
    axum::extract::State(state): axum::extract::State<AppState>,
) -> Json<serde_json::Value> {
    let mut health = serde_json::json!({ "status": "ok", "version": env!("CARGO_PKG_VERSION") });
    if let Some(cluster) = state.fleet.cluster_status() {
        health["ray_cluster"] = serde_json::json!({
            "up": cluster.up,
            "since": fleet::usage::rfc3339(cluster.since_ms).unwrap_or_default(),
        });
    }
    Json(health)
}

/// How the server was told to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// Ctrl-C in a terminal (SIGINT): a try-out ends, and its engines with it.
    Interrupted,
    /// SIGTERM, as a service manager stops or restarts a service (an upgrade too): the engines, the data
    /// plane, go on serving, and the next start adopts them.
    Terminated,
}

/// Starts the server and serves until SIGTERM or Ctrl-C, on the sockets a service manager passed
/// (`inherited`, systemd's `tessera.socket`) where they are the addresses asked for.
pub async fn run(
    config: Config,
    inherited: Result<listeners::Inherited, listeners::ListenError>,
) -> Result<(), ServerError> {
    let mut leptos_options = leptos::config::get_configuration(None)?.leptos_options;
    leptos_options.site_addr = config.listen;
    // First: a socket passed that no address claims is said before anything else is opened, and a
    // connection made while the server starts waits for it rather than being refused.
    let inherited = inherited?;
    let passed = inherited.any();
    let addresses: Vec<_> = std::iter::once(config.listen)
        .chain(config.gateway_listen)
        .collect();
    let mut listeners = inherited.claim(&addresses)?.into_iter();
    let console_listener = listeners.next().expect("the console's address is claimed");
    let gateway_listener = listeners.next();
    for listener in [Some(&console_listener), gateway_listener.as_ref()]
        .into_iter()
        .flatten()
        .filter(|l| passed && !l.inherited)
    {
        tracing::warn!(
            "{} was not passed by the service manager: connections to it are refused while Tessera restarts; add it to tessera.socket",
            listener.addr
        );
    }
    let ray = config
        .ray
        .as_deref()
        .map(|address| inventory::ray::RayClient::new(address, config.ray_token.clone()))
        .transpose()?;
    // Held for the server's life: a restore refuses to replace the database under it.
    let _lock = db::backup::DataLock::take(&config.data_dir)?;
    let pool = db::connect(config.database_url.as_deref(), &config.data_dir).await?;
    let Gathered {
        inventory,
        local: local_gpus,
        hosts,
        silent,
        cluster,
    } = gather_inventory(&config, ray.as_ref(), &pool).await?;
    let simulated = match &config.simulate_gpus {
        Some(_) if !config.demo && ray.is_none() => return Err(ServerError::SimulationWithoutDemo),
        Some(dir) => Some(simulate(dir, &inventory, &hosts).map_err(ServerError::Simulation)?),
        None => None,
    };
    let settings = engine_settings(&config, local_gpus.clone(), ray.clone())?;
    let runtime = Arc::new(
        runtime::Runtime::open(pool.clone(), settings)
            .await
            .map_err(ServerError::Database)?,
    );
    let fleet = Arc::new(
        Fleet::open(
            pool.clone(),
            inventory,
            local_gpus.clone(),
            runtime.clone(),
            hosts,
        )
        .await
        .map_err(ServerError::Load)?,
    );
    for machine in &silent {
        fleet.mark_reachable(machine, false);
    }
    if let Some(answer) = cluster {
        fleet.cluster_answered(answer);
    }
    if config.demo {
        let catalog = inventory::demo::demo_catalog();
        fleet
            .seed_catalog(&catalog)
            .await
            .map_err(ServerError::Load)?;
    }
    if let Some(gpus) = local_gpus {
        tokio::spawn(fleet.clone().recut_after_restart());
        tokio::spawn(fleet.clone().follow_local_gpus(gpus, LOCAL_GPU_REFRESH));
    }
    if let Some(client) = ray {
        let sim = config
            .simulate_gpus
            .as_deref()
            .map(inventory::simulated::SimulatedGpus::open);
        tokio::spawn(fleet.clone().follow_cluster(client, CLUSTER_REFRESH, sim));
    }
    if accounts::count(&pool).await.map_err(ServerError::Load)? == 0 {
        tracing::warn!(
            "no account yet: open http://{}/setup to make the first admin (or run `tessera user add NAME --role admin`)",
            config.listen
        );
    }
    tokio::spawn(forget_expired_sessions(pool.clone()));
    tokio::spawn(fleet::housekeeping::keep_tidy(
        pool.clone(),
        config.retention.retention(),
    ));
    tokio::spawn(fleet.clone().keep_writing_calls(CALLS_WRITE));
    tokio::spawn(fleet.clone().keep_unloading(KEEP_ALIVE_CHECK));
    fleet.latencies().configure(
        Duration::from_secs(config.latency_window_s),
        config.interference_threshold,
    );
    tokio::spawn(fleet.clone().keep_judging(INTERFERENCE_CHECK));
    match simulated {
        Some(sim) => {
            tokio::spawn(
                fleet
                    .clone()
                    .follow_simulated_gpus(sim, SIMULATED_GPU_REFRESH),
            );
        }
        None if config.demo => {
            tokio::spawn(fleet.clone().follow_demo_gpus(LOCAL_GPU_REFRESH));
        }
        None => {}
    }
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => Some(tls::acceptor(cert, key)?),
        (None, None) => None,
        _ => return Err(ServerError::Tls(tls::TlsError::Half)),
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let state = AppState::serving(
        leptos_options,
        fleet.clone(),
        pool,
        config.https || tls.is_some(),
        gateway::Gateway::new(
            Duration::from_secs(config.gateway_wait_s),
            config.gateway_routing,
        ),
        config.trusted_proxy.clone(),
    );
    tokio::spawn(gateway::scaling::keep_scaling(
        state.clone(),
        gateway::scaling::SAMPLE,
    ));
    // The engines a previous server left are registered before the first request is taken: a request
    // for a model they serve waits for their first health check, never finds the model without engines.
    runtime.taken_up().await;
    let (stop_begun, mut stopping) = tokio::sync::watch::channel(None::<Stop>);
    // Once a stop begins the sockets take no new connection (they wait for the next server where the
    // sockets outlive this one), and every answer says `Connection: close`, so that a client's connection
    // closes after an answer rather than idle under a request the client is sending. The connections left
    // idle are closed `CLOSE_LINGER` later.
    let begun = |mut stop: tokio::sync::watch::Receiver<Option<Stop>>| async move {
        let _ = stop.wait_for(Option::is_some).await;
    };
    let closed = move |stop: tokio::sync::watch::Receiver<Option<Stop>>| async move {
        begun(stop).await;
        tokio::time::sleep(CLOSE_LINGER).await;
    };
    if let Some(listener) = gateway_listener {
        let addr = listener.addr;
        tracing::info!("the gateway alone listening on {scheme}://{addr}/v1");
        // With the console's certificate where it serves https: a key sent to /v1 never crosses in plain.
        let serving = serve_on(
            listener.into_tokio()?,
            addr,
            tls.as_ref(),
            gateway_router(state.clone()),
            begun(stopping.clone()),
            closed(stopping.clone()),
        )?;
        tokio::spawn(async move {
            if let Err(e) = serving.await {
                tracing::error!("the gateway's own address stopped serving: {e}");
            }
        });
    }
    let signal = {
        let (runtime, stopping) = (runtime.clone(), state.stopping.clone());
        async move {
            let how = shutdown_signal().await;
            stopping.store(true, std::sync::atomic::Ordering::Relaxed);
            runtime.close_streams();
            stop_begun.send_replace(Some(how));
        }
    };
    tokio::spawn(signal);
    tracing::info!(
        "Tessera listening on {scheme}://{}{}",
        config.listen,
        if console_listener.inherited {
            " (a socket the service manager holds)"
        } else {
            ""
        }
    );
    let serving = serve_on(
        console_listener.into_tokio()?,
        config.listen,
        tls.as_ref(),
        router(state),
        begun(stopping.clone()),
        closed(stopping.clone()),
    )?;
    // The requests in flight when a stop begins get `REQUEST_GRACE` to finish; a stuck one does not hold
    // the stop. (Only the requests that take the guard's whole way have a timer of their own: on a
    // script's read it woke the other worker thread every time, an eighth of its rate, BENCHMARKS.md.)
    tokio::select! {
        served = serving => served.map_err(ServerError::Serve)?,
        () = async {
            let _ = stopping.wait_for(Option::is_some).await;
            tokio::time::sleep(CLOSE_LINGER + REQUEST_GRACE).await;
        } => tracing::warn!(
            "requests were still in flight {} s after the stop began: stopping without them",
            REQUEST_GRACE.as_secs()
        ),
    }
    fleet.write_calls().await;
    let how = *stopping.borrow();
    match how {
        Some(Stop::Interrupted) => {
            tracing::info!(
                "Ctrl-C: stopping the engines with the server (a service manager's SIGTERM leaves them running)"
            );
            runtime.shutdown().await;
        }
        Some(Stop::Terminated) | None => {
            let left = runtime.leave().await;
            tracing::info!(
                "{left} engines left running, adopted by the next start (`tessera stop --engines` stops them)"
            );
        }
    }
    Ok(())
}

/// How the engines of `config`'s data folder are run: on this machine (whose GPUs `gpus` reads, where NVML
/// can) and on the Ray cluster `ray`, as this installation's (the identity its database keeps for where it
/// is opened).
pub fn engine_settings(
    config: &Config,
    gpus: Option<Arc<dyn inventory::LocalGpus>>,
    ray: Option<inventory::ray::RayClient>,
) -> Result<runtime::Settings, ServerError> {
    let exe = std::env::current_exe().map_err(ServerError::Exe)?;
    let database = db::options(config.database_url.as_deref(), &config.data_dir)?;
    let database = database.get_filename();
    let home = (!database.as_os_str().is_empty() && database != std::path::Path::new(":memory:"))
        .then(|| runtime::instance::home(database));
    Ok(runtime::Settings {
        gpus,
        ray,
        data_dir: config.data_dir.clone(),
        sim_dir: config.simulate_gpus.clone(),
        identity: runtime::instance::Identity {
            home,
            same_installation: config.same_installation,
        },
        ..config
            .engines
            .settings(exe, config.data_dir.join("engines"))
    })
}

/// Deletes expired sessions every hour, for as long as the server runs.
async fn forget_expired_sessions(pool: sqlx::SqlitePool) {
    let sessions = auth::sessions::SqliteSessions::new(pool);
    let mut every = tokio::time::interval(Duration::from_secs(3600));
    loop {
        every.tick().await;
        if let Err(e) = sessions.delete_expired().await {
            tracing::warn!("expired sessions could not be deleted: {e}");
        }
    }
}

/// How often the gateway's figures are written (a stop writes them once more; a crash loses at most this).
const CALLS_WRITE: Duration = Duration::from_secs(10);

/// How often each model's latency is judged for interference.
const INTERFERENCE_CHECK: Duration = Duration::from_secs(1);

/// How often the keep-alives of loaded on-demand models are checked.
const KEEP_ALIVE_CHECK: Duration = Duration::from_secs(1);

/// How long the requests in flight may take to finish once a graceful stop begins.
const REQUEST_GRACE: Duration = Duration::from_secs(30);

/// How long the connections taken are served on once a stop begins, each answer saying `Connection: close`:
/// a busy client's connection closes after an answer, where closed idle it could meet the client's next
/// request on its way.
const CLOSE_LINGER: Duration = Duration::from_millis(500);

/// How often the Ray cluster's nodes are read again: a node's death shows within this of Ray noticing it
/// (Ray's own heartbeats take about 15 s).
const CLUSTER_REFRESH: Duration = Duration::from_secs(3);

/// How often this machine's GPUs are read again: what they offer moves as other programs come and go.
const LOCAL_GPU_REFRESH: Duration = Duration::from_secs(5);

/// How often the simulated GPUs are read: often, as the soak that runs on them is compressed in time.
const SIMULATED_GPU_REFRESH: Duration = Duration::from_secs(1);

/// The demo fleet's GPUs of `inventory`, simulated in `dir`, each with what is held outside it, and those
/// of the cluster's nodes whose GPUs are made up.
fn simulate(
    dir: &std::path::Path,
    inventory: &placement::Inventory,
    hosts: &runtime::Hosts,
) -> Result<inventory::simulated::SimulatedGpus, inventory::simulated::SimError> {
    let gpus: Vec<_> = inventory::demo::demo_fleet()
        .iter()
        .filter_map(|m| inventory.machine(&m.name))
        .flat_map(|m| {
            m.gpus.iter().map(|g| {
                (
                    placement::GpuRef::new(&m.name, g.index),
                    g.total,
                    g.held_outside,
                )
            })
        })
        .collect();
    let sim = inventory::simulated::SimulatedGpus::create(dir, &gpus)?;
    for node in hosts.cluster.values().filter(|m| m.demo) {
        for gpu in &node.gpus {
            sim.ensure(&placement::GpuRef::new(&node.name, gpu.index), gpu.memory)?;
        }
    }
    Ok(sim)
}

/// The machines from every source: this machine's GPUs (NVML), the inventory file, the Ray cluster and the
/// demo fleet, with the NVML reader to follow this machine by, and the cluster's machines shown unreachable
/// as the cluster does not answer. Without an NVIDIA driver NVML fails: that is said once, and the other
/// sources carry on; so does a cluster that does not answer.
struct Gathered {
    inventory: placement::Inventory,
    local: Option<Arc<dyn inventory::LocalGpus>>,
    hosts: runtime::Hosts,
    /// The cluster's machines, as kept, while it does not answer.
    silent: Vec<String>,
    /// Whether the cluster answered, where there is one: why not.
    cluster: Option<Result<(), String>>,
}

async fn gather_inventory(
    config: &Config,
    ray: Option<&inventory::ray::RayClient>,
    pool: &sqlx::SqlitePool,
) -> Result<Gathered, ServerError> {
    use inventory::LocalGpus;
    let mut machines = Vec::new();
    let mut local: Option<Arc<dyn LocalGpus>> = None;
    let mut hosts = runtime::Hosts::default();
    match inventory::nvml::NvmlGpus::init() {
        // Tessera's own engines are not known yet: the fleet reads this machine again once they are.
        Ok(nvml) => match nvml.read(&inventory::Ours::default()) {
            Ok(reading) => {
                hosts.local = Some(reading.machine.name.clone());
                machines.push(reading.machine);
                local = Some(Arc::new(nvml));
            }
            Err(e) => tracing::warn!("{e}"),
        },
        Err(e) => tracing::info!("{e}"),
    }
    if let Some(path) = &config.inventory {
        machines.extend(inventory::file::load_inventory(path)?);
    }
    let mut silent = Vec::new();
    let mut answered = None;
    if let Some(client) = ray {
        answered = Some(Ok(()));
        let cluster = match client.nodes().await {
            Ok(nodes) => {
                let cluster = inventory::ray::machines(&nodes);
                if cluster.is_empty() {
                    tracing::warn!(
                        "no node of the Ray cluster at {} carries the label {}: run `tessera ray-node` on each machine for its `ray start` line",
                        client.address(),
                        inventory::ray::MACHINE_LABEL
                    );
                }
                fleet::cluster::keep(pool, &cluster)
                    .await
                    .map_err(ServerError::Database)?;
                cluster
            }
            // Tessera starts all the same: the cluster's machines as it last listed them are unreachable
            // (no GPUs, so nothing runs or is placed there) until it answers.
            Err(e) => {
                let kept = fleet::cluster::kept(pool)
                    .await
                    .map_err(ServerError::Database)?;
                tracing::warn!(
                    "{e}: starting without it; {} of its machines shown unreachable until it answers",
                    kept.len()
                );
                silent = kept.iter().map(|m| m.name.clone()).collect();
                answered = Some(Err(e.to_string()));
                kept
            }
        };
        for node in cluster {
            // The cluster's own view of a machine wins over NVML's name for the same one.
            machines.retain(|m| m.name != node.name);
            if hosts.local.as_deref() == Some(node.name.as_str()) {
                local = None;
                hosts.local = None;
            }
            if silent.contains(&node.name) {
                machines.push(placement::Machine {
                    gpus: Vec::new(),
                    ..node.machine()
                });
            } else {
                machines.push(node.machine());
            }
            hosts.cluster.insert(node.name.clone(), node);
        }
    }
    if config.demo {
        let demo = inventory::demo::demo_fleet();
        hosts.simulated = demo.iter().map(|m| m.name.clone()).collect();
        machines.extend(demo);
    }
    if let Some(here) = &config.here {
        if let Some(local) = hosts
            .local
            .as_deref()
            .filter(|local| *local != here.as_str())
        {
            return Err(ServerError::Here(format!(
                "--here names {here}, but NVML reads this machine as {local}; leave --here out"
            )));
        }
        if !machines.iter().any(|m| &m.name == here) {
            return Err(ServerError::Here(format!(
                "--here names {here}, which is not a machine of the inventory file or the demo fleet"
            )));
        }
        hosts.local = Some(here.clone());
    }
    if machines.is_empty() {
        tracing::warn!("no machines: no NVIDIA driver, no --inventory file, no --ray cluster and no --demo; the console shows an empty fleet");
    }
    Ok(Gathered {
        inventory: placement::Inventory::new(machines)?,
        local,
        hosts,
        silent,
        cluster: answered,
    })
}

async fn shutdown_signal() -> Stop {
    let ctrl_c = async {
        tokio::signal::ctrl_c().await.expect("a Ctrl-C handler");
    };
    #[cfg(unix)]
    let terminate = async {
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler")
            .recv()
            .await;
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    let how = tokio::select! {
        () = ctrl_c => Stop::Interrupted,
        () = terminate => Stop::Terminated,
    };
    tracing::info!("shutting down ({how:?})");
    how
}

#[cfg(test)]
mod testing;
#[cfg(test)]
mod tests;
