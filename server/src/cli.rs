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

/// `tessera restore FILE`: the backup in the place of the database, the server stopped; the installation's
/// that of the database replaced, or with `same_installation` the backup's.
pub async fn restore(config: &Config, from: &Path, same_installation: bool) -> Result<(), String> {
    use crate::db::backup::Installation;
    let installation = if same_installation {
        Installation::Backed
    } else {
        Installation::Here
    };
    let restored = crate::db::backup::restore(
        from,
        config.database_url.as_deref(),
        &config.data_dir,
        installation,
    )
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

/// `tessera stop --engines`: stops every engine the data folder's Tessera left running, on this machine and
/// on the Ray cluster's nodes; refused while a server holds the data folder (its supervisors would start
/// them again).
pub async fn stop(config: &Config, engines: bool) -> Result<(), String> {
    use crate::inventory::LocalGpus;
    if !engines {
        return Err("say what to stop: --engines stops every engine this data folder's Tessera left running (systemctl stop tessera.socket tessera stops the server alone)".to_owned());
    }
    let _lock = crate::db::backup::DataLock::take(&config.data_dir).map_err(|e| e.to_string())?;
    let pool = crate::db::connect(config.database_url.as_deref(), &config.data_dir)
        .await
        .map_err(|e| e.to_string())?;
    let ray = config
        .ray
        .as_deref()
        .map(|address| crate::inventory::ray::RayClient::new(address, config.ray_token.clone()))
        .transpose()
        .map_err(|e| e.to_string())?;
    // Where NVML reads this machine's GPUs, each stop waits until its engine's memory there is free.
    let gpus = crate::inventory::nvml::NvmlGpus::init()
        .ok()
        .map(|nvml| std::sync::Arc::new(nvml) as std::sync::Arc<dyn LocalGpus>);
    let settings = crate::engine_settings(config, gpus, ray).map_err(|e| e.to_string())?;
    let runtime = crate::runtime::Runtime::open(pool, settings)
        .await
        .map_err(|e| e.to_string())?;
    let stopped = runtime.stop_left().await.map_err(|why| {
        format!("the engines could not all be looked for ({why}); those that could are stopped: run it again once the Ray head answers")
    })?;
    match stopped.as_slice() {
        [] => println!("no engine of this data folder's Tessera runs"),
        units => println!("stopped {} engines: {}", units.len(), units.join(", ")),
    }
    Ok(())
}

/// The variable `tessera check` takes an admin's API token from.
pub const TOKEN_VAR: &str = "TESSERA_TOKEN";

/// `tessera check`: asks the running server (on `--listen`, over https where it serves with
/// `--tls-cert`, trusting that certificate alone) to hold what it keeps in memory against the whole
/// rebuild from its database, and prints what differs; an error where anything does. The token is an
/// admin's, from $TESSERA_TOKEN.
pub async fn check(config: &Config) -> Result<(), String> {
    let token = std::env::var(TOKEN_VAR).map_err(|_| {
        format!("give an admin's API token in ${TOKEN_VAR} (tessera token add NAME --user ADMIN)")
    })?;
    let unreachable = |e: String| format!("the server on {} does not answer: {e}", config.listen);
    let stream = tokio::net::TcpStream::connect(config.listen)
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let request = hyper::Request::get("/api/check")
        .header(hyper::header::HOST, config.listen.to_string())
        .header(hyper::header::AUTHORIZATION, format!("Bearer {token}"))
        .body(http_body_util::Empty::<axum::body::Bytes>::new())
        .map_err(|e| e.to_string())?;
    let (status, body) = match &config.tls_cert {
        Some(cert) => {
            let connector = crate::tls::own_connector(cert).map_err(|e| e.to_string())?;
            let name =
                tokio_rustls::rustls::pki_types::ServerName::IpAddress(config.listen.ip().into());
            let stream = connector
                .connect(name, stream)
                .await
                .map_err(|e| unreachable(format!("over https with {}: {e}", cert.display())))?;
            ask(stream, request).await
        }
        None => ask(stream, request).await,
    }
    .map_err(unreachable)?;
    let answer: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    if !status.is_success() {
        return Err(format!(
            "the server answered {status}: {}",
            answer["error"].as_str().unwrap_or("no reason given")
        ));
    }
    let differences: Vec<&str> = answer["differences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|d| d.as_str())
        .collect();
    if differences.is_empty() {
        println!("what the server keeps in memory is what its database rebuilds: nothing differs");
        return Ok(());
    }
    for difference in &differences {
        println!("{difference}");
    }
    Err(format!(
        "{} differences between what the server keeps and its database",
        differences.len()
    ))
}

/// `request` sent over `stream`: the status and the body.
async fn ask(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    request: hyper::Request<http_body_util::Empty<axum::body::Bytes>>,
) -> Result<(hyper::StatusCode, axum::body::Bytes), String> {
    use http_body_util::BodyExt;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, body))
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
