//! The server's settings: command-line flags, each with an environment variable, and the config file
//! that may set any of them (`file`).

mod file;

pub use file::{LoadError, INSTALLED};

use clap::Parser;
use std::net::SocketAddr;
use std::path::PathBuf;

/// Tessera: a web console for sharing GPUs between models.
///
/// GPUs come from this machine (through NVML, when an NVIDIA driver is present), from an inventory file,
/// and from the demo fleet; state lives in SQLite in the data folder unless DATABASE_URL says otherwise.
#[derive(Debug, Clone, Parser)]
#[command(name = "tessera", version, about)]
pub struct Config {
    /// A TOML file that sets any flag below, its long name with _ for - as the key (docs/src/server.md);
    /// flags and environment variables win over it. Without it, /etc/tessera/tessera.toml where it exists.
    #[arg(long, env = "TESSERA_CONFIG", value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// Address to listen on. Without it, LEPTOS_SITE_ADDR (as cargo-leptos sets it), then 127.0.0.1:3000.
    #[arg(long, env = "LEPTOS_SITE_ADDR", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// A second address that serves the gateway (/v1) alone, for clients that should reach the models
    /// but not the console; the gateway is on --listen's address too. https with --tls-cert's certificate
    /// where one is given.
    #[arg(long, env = "TESSERA_GATEWAY_LISTEN", value_name = "ADDR")]
    pub gateway_listen: Option<SocketAddr>,
    /// Add the built-in demo fleet (majin, a WSL2 PC, a node with two 96 GB GPUs, an 8 × H200 node).
    #[arg(long, env = "TESSERA_DEMO")]
    pub demo: bool,
    /// With --demo: simulate the demo fleet's GPUs in this folder; with --ray, those of the cluster's nodes
    /// whose GPUs are made up (`tessera.demo=true`), which must see the folder at the same path (nodes run
    /// on this host, as in the tests). Its demo engines really allocate their memory there as they load (a
    /// profile in TESSERA_DEMO_PROFILE makes them load, slow down and fail like real ones), an allocation
    /// past a GPU's total kills the engine as CUDA's out-of-memory error does, and the readings come from
    /// what is held (the chaos soak runs on this).
    #[arg(long, env = "TESSERA_SIMULATE_GPUS", value_name = "DIR")]
    pub simulate_gpus: Option<PathBuf>,
    /// Machines the server cannot see, described in a TOML file (see docs/src/server.md).
    #[arg(long, env = "TESSERA_INVENTORY", value_name = "PATH")]
    pub inventory: Option<PathBuf>,
    /// Where the SQLite database lives.
    #[arg(
        long,
        env = "TESSERA_DATA_DIR",
        value_name = "DIR",
        default_value = "data"
    )]
    pub data_dir: PathBuf,
    /// A database other than the SQLite file in the data folder, such as sqlite:///var/lib/tessera.db.
    #[arg(long, env = "DATABASE_URL", value_name = "URL")]
    pub database_url: Option<String>,
    /// The machine (of the inventory file or the demo fleet) that is this one, where NVML cannot read it
    /// (no driver, a CPU-only rig): its engines run here as processes, their recipes as written.
    #[arg(long, env = "TESSERA_HERE", value_name = "MACHINE")]
    pub here: Option<String>,
    /// A Ray cluster's dashboard (http://HEAD:8265): each of its nodes that carries Tessera's labels (see
    /// `tessera ray-node`) is a machine, and its engines run there as Ray jobs.
    #[arg(long, env = "TESSERA_RAY", value_name = "URL")]
    pub ray: Option<String>,
    /// The cluster's token, where it runs with RAY_AUTH_MODE=token.
    #[arg(
        long,
        env = "TESSERA_RAY_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub ray_token: Option<String>,
    /// How long a request to the gateway (/v1) for a model whose engines are all starting or restarting
    /// waits for one to be ready, in seconds, before it is answered 503.
    #[arg(
        long,
        env = "TESSERA_GATEWAY_WAIT_S",
        default_value_t = 30,
        value_name = "S"
    )]
    pub gateway_wait_s: u64,
    /// How the gateway chooses among a model's engines (replicas): `prefix` sends requests whose prompts
    /// begin alike to the same engine, so that its prompt cache is used; `least-busy` ignores the prompt.
    #[arg(
        long,
        env = "TESSERA_GATEWAY_ROUTING",
        value_enum,
        default_value_t = crate::gateway::Routing::Prefix,
        value_name = "HOW"
    )]
    pub gateway_routing: crate::gateway::Routing,
    /// A model is flagged as slowed by its neighbours when its p99 beside busy neighbours passes this many
    /// times its p99 alone (seed 002's 1.5).
    #[arg(
        long,
        env = "TESSERA_INTERFERENCE_THRESHOLD",
        default_value = "1.5",
        value_name = "RATIO",
        value_parser = parse_ratio
    )]
    pub interference_threshold: placement::interference::Ratio,
    /// The sliding window a model's latency is judged over, in seconds.
    #[arg(
        long,
        env = "TESSERA_LATENCY_WINDOW_S",
        default_value_t = 60,
        value_name = "S",
        value_parser = clap::value_parser!(u64).range(1..=3600)
    )]
    pub latency_window_s: u64,
    /// The console is reached over https (directly or behind a proxy): session cookies are then Secure,
    /// and answers say so (HSTS).
    #[arg(long, env = "TESSERA_HTTPS")]
    pub https: bool,
    /// Serve https with this certificate chain (PEM); with --tls-key. Implies --https.
    #[arg(long, env = "TESSERA_TLS_CERT", value_name = "PEM")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, env = "TESSERA_TLS_KEY", value_name = "PEM")]
    pub tls_key: Option<PathBuf>,
    /// A reverse proxy (its address) whose X-Forwarded-For names the client: the sign-in throttle counts
    /// that client, not the proxy. Repeat it for each proxy.
    #[arg(
        long,
        env = "TESSERA_TRUSTED_PROXY",
        value_name = "IP",
        value_delimiter = ','
    )]
    pub trusted_proxy: Vec<std::net::IpAddr>,
    /// This machine and data folder replace those the database was last opened at (a data folder moved
    /// to a new disk or machine): keep its identity, and with it adopt the engines it left running.
    /// Without it, a database opened anywhere else is a new installation (a restored backup, a copy on a
    /// staging server), which neither adopts nor stops the engines of the one it was copied from.
    #[arg(long, env = "TESSERA_SAME_INSTALLATION")]
    pub same_installation: bool,
    /// How engines are supervised.
    #[command(flatten)]
    pub engines: EngineFlags,
    /// How long GPU readings, usage and the audit log are kept.
    #[command(flatten)]
    pub retention: RetentionFlags,
    /// Run something other than the server.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// What else the binary runs.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum Command {
    /// The demo engine: serves /health on $TESSERA_PORT and reports how it was started, standing in for
    /// the engine command line that follows `--`.
    DemoEngine {
        /// The real engine's command line.
        #[arg(last = true)]
        stands_in_for: Vec<String>,
    },
    /// Accounts, for scripts and CI: `tessera user add NAME --role operator` reads the password from
    /// standard input.
    User {
        #[command(subcommand)]
        action: UserCommand,
    },
    /// API tokens: `tessera token add ci --user NAME` prints a new token (shown once).
    Token {
        #[command(subcommand)]
        action: TokenCommand,
    },
    /// Copies the database, while the server runs, into FILE: one consistent snapshot, which
    /// `tessera restore` puts back.
    Backup {
        /// The copy to make; never overwritten.
        file: PathBuf,
    },
    /// Puts a backup in the place of the database: refused while the server runs on the data folder. The
    /// restored database keeps the identity of the one it replaces (a roll-back in place, a staging
    /// server's own), or is a new installation where there was none: never that of the server the backup
    /// was taken from, whose engines it must neither adopt nor stop, unless --same-installation says this
    /// server replaces that one.
    Restore {
        /// A backup made by `tessera backup`.
        file: PathBuf,
        /// This server replaces the one the backup was taken from: keep its identity and adopt the engines
        /// it left running.
        #[arg(long)]
        same_installation: bool,
    },
    /// With --engines: stops every engine this data folder's Tessera left running, here and on the Ray
    /// cluster's nodes, to take the machine down (a restart, an upgrade or a crash of Tessera leaves them
    /// serving). Refused while the server runs: stop it first (systemctl stop tessera.socket tessera).
    Stop {
        /// Stop the engines.
        #[arg(long)]
        engines: bool,
    },
    /// Asks the running server to hold what it keeps in memory against the whole rebuild from its database
    /// (the committed state, who holds which GPU, the read views, the open usage spans) and prints what
    /// differs; exits 1 where anything does. An admin's API token in $TESSERA_TOKEN.
    Check,
    /// Checks this machine for what Tessera needs (the NVIDIA driver and its GPUs, MPS, the engines'
    /// programs, disk, ports, the Ray head, the database) and says what to fix, one line each; exits 1
    /// where anything fails. Changes nothing.
    Doctor,
    /// Prints the `ray start` line that makes this machine one of Tessera's in a Ray cluster: its name,
    /// its GPUs' model as labels, and each GPU (read with NVML) as a resource worth its memory.
    RayNode {
        /// The head node's address, HOST:PORT (port 6379 by default); without it, the line starts a head.
        #[arg(long, value_name = "HOST:PORT")]
        head: Option<String>,
        /// The machine's name in Tessera (this machine's host name by default).
        #[arg(long)]
        name: Option<String>,
    },
}

/// `tessera user …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum UserCommand {
    /// Makes an account; its password is the first line of standard input.
    Add {
        /// Letters, digits, '.', '-', '_'.
        name: String,
        /// admin, operator or viewer.
        #[arg(long, value_parser = parse_role)]
        role: app::auth::Role,
    },
}

/// `tessera token …`.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum TokenCommand {
    /// Makes an API token acting for an account, and prints it.
    Add {
        /// What the token is for, such as ci.
        name: String,
        /// The account whose role it acts with.
        #[arg(long)]
        user: String,
        /// Only for the gateway (/v1), not the console or /api.
        #[arg(long)]
        inference: bool,
        /// With --inference: a model it may call (again for more); every model without.
        #[arg(long = "model", value_name = "MODEL", requires = "inference")]
        models: Vec<String>,
        /// When it stops working, RFC 3339 (2027-01-31T00:00:00Z); never without.
        #[arg(long, value_name = "TIME")]
        expires_at: Option<String>,
    },
}

fn parse_role(text: &str) -> Result<app::auth::Role, String> {
    app::auth::Role::parse(text)
        .ok_or_else(|| format!("{text:?} is not a role: use admin, operator or viewer"))
}

/// The supervisor's timings. The defaults suit engines that load real weights; the tests shorten them.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineFlags {
    /// How often each engine's health is checked, in milliseconds.
    #[arg(
        long,
        env = "TESSERA_HEALTH_INTERVAL_MS",
        default_value_t = 2000,
        value_name = "MS"
    )]
    pub health_interval_ms: u64,
    /// How long an engine may take to become healthy after it starts (loading weights), in seconds.
    #[arg(
        long,
        env = "TESSERA_START_TIMEOUT_S",
        default_value_t = 900,
        value_name = "S"
    )]
    pub start_timeout_s: u64,
    /// How long a stopping engine is given after SIGTERM before SIGKILL, in milliseconds.
    #[arg(
        long,
        env = "TESSERA_STOP_TIMEOUT_MS",
        default_value_t = 30_000,
        value_name = "MS"
    )]
    pub stop_timeout_ms: u64,
    /// The first wait before restarting a failed engine, in milliseconds; it doubles with each failure.
    #[arg(
        long,
        env = "TESSERA_RESTART_BACKOFF_MS",
        default_value_t = 1000,
        value_name = "MS"
    )]
    pub restart_backoff_ms: u64,
    /// The longest wait before a restart, in milliseconds.
    #[arg(
        long,
        env = "TESSERA_RESTART_BACKOFF_MAX_MS",
        default_value_t = 60_000,
        value_name = "MS"
    )]
    pub restart_backoff_max_ms: u64,
    /// Failures in a row after which an engine is left failed.
    #[arg(
        long,
        env = "TESSERA_MAX_RESTARTS",
        default_value_t = 5,
        value_name = "N"
    )]
    pub max_restarts: u32,
    /// How long a serving engine about to stop (a plan change, a removal, a serving change) may take to
    /// finish the gateway's requests in flight, in seconds; new requests go elsewhere or wait meanwhile.
    #[arg(
        long,
        env = "TESSERA_DRAIN_GRACE_S",
        default_value_t = 30,
        value_name = "S"
    )]
    pub drain_grace_s: u64,
    /// How long a GPU must stay over-committed (its sharers taking more than a reading leaves it, say
    /// while another program allocates there) before its newest shared worker is stopped, in seconds; it
    /// takes no new work from the first reading.
    #[arg(
        long,
        env = "TESSERA_EVICT_AFTER_S",
        default_value_t = 30,
        value_name = "S"
    )]
    pub evict_after_s: u64,
    /// How long an on-demand model put to sleep past its keep-alive (its engine can sleep) stays asleep
    /// with no request before its engine is stopped, in seconds.
    #[arg(
        long,
        env = "TESSERA_KEEP_ASLEEP_S",
        default_value_t = 3600,
        value_name = "S"
    )]
    pub keep_asleep_s: u64,
    /// The part of each machine's memory, in percent, that models asleep may keep there (level 1 keeps
    /// their weights in host memory); past it the least recently used sleepers are stopped.
    #[arg(
        long,
        env = "TESSERA_SLEEPERS_HOST_MEMORY_PERCENT",
        default_value_t = 25,
        value_name = "PERCENT",
        value_parser = clap::value_parser!(u8).range(1..=100)
    )]
    pub sleepers_host_memory_percent: u8,
    /// NVIDIA's MPS control program, run to start and stop the MPS daemon of each GPU shared under MPS.
    #[arg(
        long,
        env = "TESSERA_MPS_CONTROL",
        default_value = "nvidia-cuda-mps-control",
        value_name = "PROGRAM"
    )]
    pub mps_control: PathBuf,
    /// On each node of the Ray cluster, the folder under which each GPU's MPS daemon keeps its pipes and
    /// logs (`mps/`): the same for every client of a GPU, so a path of the node's own, not this server's.
    #[arg(
        long,
        env = "TESSERA_NODE_DATA_DIR",
        default_value = "/tmp/tessera",
        value_name = "DIR",
        value_parser = absolute_dir
    )]
    pub node_data_dir: PathBuf,
    /// NVIDIA's `nvidia-smi`, run to cut one of this machine's GPUs into MIG instances and to join them back.
    #[arg(
        long,
        env = "TESSERA_NVIDIA_SMI",
        default_value = "nvidia-smi",
        value_name = "PROGRAM"
    )]
    pub nvidia_smi: PathBuf,
}

/// A folder named the same from wherever it is used: each job on a node runs in a folder of its own.
fn absolute_dir(value: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(value);
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(format!(
            "{value} is a relative path: give an absolute one, the same on every node (such as /tmp/tessera)"
        ))
    }
}

impl EngineFlags {
    /// The runtime's settings, with the demo engine run from `exe` and logs kept in `log_dir`.
    pub fn settings(&self, exe: PathBuf, log_dir: PathBuf) -> crate::runtime::Settings {
        use std::time::Duration;
        crate::runtime::Settings {
            health_interval: Duration::from_millis(self.health_interval_ms.max(10)),
            start_timeout: Duration::from_secs(self.start_timeout_s),
            stop_timeout: Duration::from_millis(self.stop_timeout_ms),
            backoff: Duration::from_millis(self.restart_backoff_ms),
            backoff_max: Duration::from_millis(self.restart_backoff_max_ms),
            max_restarts: self.max_restarts,
            drain_grace: Duration::from_secs(self.drain_grace_s),
            evict_after: Duration::from_secs(self.evict_after_s),
            keep_asleep: Duration::from_secs(self.keep_asleep_s),
            sleepers_host_percent: self.sleepers_host_memory_percent,
            mps_control: self.mps_control.clone(),
            node_data_dir: self.node_data_dir.clone(),
            nvidia_smi: self.nvidia_smi.clone(),
            ..crate::runtime::Settings::new(exe, log_dir)
        }
    }
}

/// How long what grows with time is kept, in days; 0 keeps it for good (docs/src/operations.md, "Retention").
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionFlags {
    /// Days GPU readings (every 5 s per GPU) are kept raw; older ones are rolled up into runs within each
    /// hour, which keep the usage report's figures.
    #[arg(
        long,
        env = "TESSERA_KEEP_RAW_SAMPLES_DAYS",
        default_value_t = 7,
        value_name = "DAYS"
    )]
    pub keep_raw_samples_days: u32,
    /// Days usage (closed holdings, rolled-up readings) is kept after it ends; reports over older periods
    /// lose it.
    #[arg(
        long,
        env = "TESSERA_KEEP_USAGE_DAYS",
        default_value_t = 400,
        value_name = "DAYS"
    )]
    pub keep_usage_days: u32,
    /// Days audit entries are kept.
    #[arg(
        long,
        env = "TESSERA_KEEP_AUDIT_DAYS",
        default_value_t = 400,
        value_name = "DAYS"
    )]
    pub keep_audit_days: u32,
}

impl RetentionFlags {
    /// The database's housekeeping settings.
    pub fn retention(&self) -> crate::fleet::housekeeping::Retention {
        crate::fleet::housekeeping::Retention::days(
            self.keep_raw_samples_days,
            self.keep_usage_days,
            self.keep_audit_days,
        )
    }
}

/// `--interference-threshold`, read as `placement` reads a ratio.
fn parse_ratio(text: &str) -> Result<placement::interference::Ratio, String> {
    placement::interference::Ratio::parse(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_takes_an_address_and_refuses_anything_else() {
        let config = Config::try_parse_from(["tessera", "--listen", "127.0.0.1:8080"]).unwrap();
        assert_eq!(config.listen, "127.0.0.1:8080".parse().unwrap());
        let err = Config::try_parse_from(["tessera", "--listen", "localhost"]).unwrap_err();
        assert!(
            err.to_string()
                .contains("invalid value 'localhost' for '--listen <LISTEN>'"),
            "{err}"
        );
    }

    #[test]
    fn the_interference_threshold_is_seed_002s_unless_set_and_a_ratio_under_one_is_refused() {
        let config = Config::try_parse_from(["tessera"]).unwrap();
        assert_eq!(
            config.interference_threshold,
            placement::interference::Ratio::SEED_THRESHOLD
        );
        assert_eq!(config.latency_window_s, 60);
        let config = Config::try_parse_from(["tessera", "--interference-threshold", "2"]).unwrap();
        assert_eq!(config.interference_threshold.to_string(), "2.00×");
        let err = Config::try_parse_from(["tessera", "--interference-threshold", "0.8"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("an interference threshold is a ratio from 1 to 100, such as 1.5"),
            "{err}"
        );
    }

    #[test]
    fn a_node_s_data_folder_is_an_absolute_path_and_a_relative_one_is_refused() {
        let config = Config::try_parse_from(["tessera"]).unwrap();
        assert_eq!(config.engines.node_data_dir, PathBuf::from("/tmp/tessera"));
        let err = Config::try_parse_from(["tessera", "--node-data-dir", "mps"])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("mps is a relative path: give an absolute one, the same on every node (such as /tmp/tessera)"),
            "{err}"
        );
    }

    #[test]
    fn the_data_folder_defaults_to_data_and_the_demo_is_off() {
        let config = Config::try_parse_from(["tessera"]).unwrap();
        assert_eq!(config.data_dir, PathBuf::from("data"));
        assert!(!config.demo);
        assert_eq!(config.inventory, None);
        let config = Config::try_parse_from([
            "tessera",
            "--demo",
            "--inventory",
            "fleet.toml",
            "--data-dir",
            "/tmp/t",
        ])
        .unwrap();
        assert!(config.demo);
        assert_eq!(config.inventory, Some(PathBuf::from("fleet.toml")));
        assert_eq!(config.data_dir, PathBuf::from("/tmp/t"));
    }

    #[test]
    fn raw_readings_are_kept_a_week_usage_and_audit_400_days_and_zero_keeps_for_good() {
        let config = Config::try_parse_from(["tessera"]).unwrap();
        assert_eq!(
            config.retention.retention(),
            crate::fleet::housekeeping::Retention::default()
        );
        let config = Config::try_parse_from([
            "tessera",
            "--keep-raw-samples-days",
            "2",
            "--keep-audit-days",
            "0",
        ])
        .unwrap();
        let retention = config.retention.retention();
        assert_eq!(
            retention.raw_samples,
            Some(std::time::Duration::from_secs(2 * 24 * 3600))
        );
        assert_eq!(
            retention.usage,
            crate::fleet::housekeeping::Retention::default().usage
        );
        assert_eq!(retention.audit, None);
    }

    #[test]
    fn the_demo_engine_takes_the_command_line_it_stands_in_for_after_two_dashes() {
        let config = Config::try_parse_from([
            "tessera",
            "demo-engine",
            "--",
            "vllm",
            "serve",
            "--port",
            "1",
        ])
        .unwrap();
        match config.command {
            Some(Command::DemoEngine { stands_in_for }) => {
                assert_eq!(stands_in_for, ["vllm", "serve", "--port", "1"]);
            }
            other => panic!("not the demo engine: {other:?}"),
        }
    }

    #[test]
    fn an_account_is_made_with_a_role_and_a_bad_role_is_named() {
        let config =
            Config::try_parse_from(["tessera", "user", "add", "ada", "--role", "admin"]).unwrap();
        assert!(matches!(
            config.command,
            Some(Command::User { action: UserCommand::Add { ref name, role: app::auth::Role::Admin } }) if name == "ada"
        ));
        let err = Config::try_parse_from(["tessera", "user", "add", "ada", "--role", "root"])
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("\"root\" is not a role: use admin, operator or viewer"),
            "{err}"
        );
    }
}
