use server::config::{Command, Config, LoadError};
use server::listeners::{Inherited, ListenError};
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    // Before any thread runs: the sockets a service manager passed are taken, and the variables that name
    // them cleared.
    let inherited = Inherited::take();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a Tokio runtime")
        .block_on(tessera(inherited))
}

async fn tessera(inherited: Result<Inherited, ListenError>) -> std::process::ExitCode {
    // On standard error: what a command prints (`ray-node`'s start line, a new token) stays clean.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .init();
    let config = match Config::load() {
        Ok(config) => config,
        Err(LoadError::Args(e)) => e.exit(),
        Err(e) => {
            eprintln!("tessera: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let outcome = match config.command.clone() {
        Some(Command::DemoEngine { stands_in_for }) => server::demo_engine::run(stands_in_for)
            .await
            .map_err(|e| format!("tessera demo-engine: {e}")),
        Some(Command::User { action }) => server::cli::user(&config, action)
            .await
            .map_err(|e| format!("tessera user: {e}")),
        Some(Command::Token { action }) => server::cli::token(&config, action)
            .await
            .map_err(|e| format!("tessera token: {e}")),
        Some(Command::Backup { file }) => server::cli::backup(&config, &file)
            .await
            .map_err(|e| format!("tessera backup: {e}")),
        Some(Command::Restore {
            file,
            same_installation,
        }) => server::cli::restore(&config, &file, same_installation)
            .await
            .map_err(|e| format!("tessera restore: {e}")),
        Some(Command::Stop { engines }) => server::cli::stop(&config, engines)
            .await
            .map_err(|e| format!("tessera stop: {e}")),
        Some(Command::Check) => server::cli::check(&config)
            .await
            .map_err(|e| format!("tessera check: {e}")),
        Some(Command::Doctor) => server::cli::doctor(&config)
            .await
            .map_err(|e| format!("tessera doctor: {e}")),
        Some(Command::RayNode { head, name }) => {
            server::cli::ray_node(head, name).map_err(|e| format!("tessera ray-node: {e}"))
        }
        None => server::run(config, inherited).await.map_err(|e| {
            tracing::error!("{e}");
            format!("tessera: {e}")
        }),
    };
    match outcome {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::FAILURE
        }
    }
}
