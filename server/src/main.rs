use server::config::{Command, Config, LoadError};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
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
        Some(Command::Restore { file }) => server::cli::restore(&config, &file)
            .await
            .map_err(|e| format!("tessera restore: {e}")),
        Some(Command::Check) => server::cli::check(&config)
            .await
            .map_err(|e| format!("tessera check: {e}")),
        Some(Command::Doctor) => server::cli::doctor(&config)
            .await
            .map_err(|e| format!("tessera doctor: {e}")),
        Some(Command::RayNode { head, name }) => {
            server::cli::ray_node(head, name).map_err(|e| format!("tessera ray-node: {e}"))
        }
        None => server::run(config).await.map_err(|e| {
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
