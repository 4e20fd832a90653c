//! The commands that manage accounts and the database without the console, for scripts and CI: they work
//! on the same database as the server (which may be running, but for a restore).

pub mod doctor;

pub use doctor::doctor;

use crate::accounts;
use crate::config::{Config, TokenCommand, UserCommand};
use crate::input::{NewToken, NewUser};
use app::views::{TokenLimits, TokenScope};
use std::io::BufRead;
use std::path::Path;

/// Who the audit log says made a change from the command line.
const CLI: &str = "tessera-cli";

/// `tessera user add NAME --role ROLE`, the password read from standard input.
pub async fn user(config: &Config, action: UserCommand) -> Result<(), String> {
    let pool = crate::db::connect(config.database_url.as_deref(), &config.data_dir)
        .await
        .map_err(|e| e.to_string())?;
    match action {
        UserCommand::Add { name, role } => {
            let mut password = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut password)
                .map_err(|e| format!("could not read the password from standard input: {e}"))?;
            let password = password.trim_end_matches(['\r', '\n']).to_owned();
            let new = NewUser::parse(name, role, password).map_err(|e| e.to_string())?;
            let user = accounts::create_user(&pool, &new, CLI)
                .await
                .map_err(|e| e.to_string())?;
            println!("made {} ({})", user.name, user.role.as_str());
            Ok(())
        }
    }
}

/// `tessera token add NAME --user USER`: prints the token, which is not shown again.
pub async fn token(config: &Config, action: TokenCommand) -> Result<(), String> {
    let pool = crate::db::connect(config.database_url.as_deref(), &config.data_dir)
        .await
        .map_err(|e| e.to_string())?;
    match action {
        TokenCommand::Add {
            name,
            user,
            inference,
            models,
            expires_at,
        } => {
            let limits = TokenLimits {
                scope: if inference {
                    TokenScope::Inference
                } else {
                    TokenScope::Api
                },
                models: (!models.is_empty()).then_some(models),
                expires_at,
            };
            let token = NewToken::parse(name, limits).map_err(|e| e.to_string())?;
            let issued = accounts::create_token(&pool, &user, &token, CLI)
                .await
                .map_err(|e| e.to_string())?;
            println!("{}", issued.secret);
            Ok(())
        }
    }
}

/// `tessera backup FILE`: a consistent copy of the database, taken beside the running server.
pub async fn backup(config: &Config, to: &Path) -> Result<(), String> {
    let pool = crate::db::open_existing(config.database_url.as_deref(), &config.data_dir)
        .await
        .map_err(|e| e.to_string())?;
    crate::db::backup::backup(&pool, to)
        .await
        .map_err(|e| e.to_string())?;
    println!("backed up the database to {}", to.display());
    Ok(())
}

/// `tessera restore FILE`: the backup in the place of the database, the server stopped.
pub async fn restore(config: &Config, from: &Path) -> Result<(), String> {
    let restored =
        crate::db::backup::restore(from, config.database_url.as_deref(), &config.data_dir)
            .await
            .map_err(|e| e.to_string())?;
    println!(
        "restored {} into {} (schema {}{})",
        from.display(),
        restored.database.display(),
        restored.version,
        if restored.version < restored.latest {
            format!(
                "; the server migrates it to {} when it starts",
                restored.latest
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

/// `tessera ray-node`: prints the `ray start` line for this machine, from its GPUs as NVML reads them.
pub fn ray_node(head: Option<String>, name: Option<String>) -> Result<(), String> {
    use crate::inventory::LocalGpus;
    let nvml = crate::inventory::nvml::NvmlGpus::init().map_err(|e| e.to_string())?;
    let mut machine = nvml
        .read(&crate::inventory::Ours::default())
        .map_err(|e| e.to_string())?
        .machine;
    if let Some(name) = name {
        machine.name = name;
    }
    // A GPU cut into MIG instances takes no work itself: its instances are offered in its place.
    machine.gpus.retain(|gpu| {
        let cut = gpu.mig == Some(placement::MigRole::Cut);
        if cut {
            eprintln!(
                "GPU {} has MIG on: its instances are offered one by one in its place",
                gpu.index
            );
        }
        !cut
    });
    println!(
        "{}",
        crate::inventory::ray::start_line(&machine, head.as_deref())
    );
    Ok(())
}
