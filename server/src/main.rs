use clap::Parser;
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| EnvFilter::new("info,tower_http=info")),
        )
        .init();
    let config = server::config::Config::parse();
    if let Some(server::config::Command::DemoEngine { stands_in_for }) = config.command {
        return match server::demo_engine::run(stands_in_for).await {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tessera demo-engine: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    match server::run(config).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("tessera: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
