//! The server's settings: command-line flags, each with an environment variable.

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
    /// Address to listen on. Without it, LEPTOS_SITE_ADDR (as cargo-leptos sets it), then 127.0.0.1:3000.
    #[arg(long, env = "LEPTOS_SITE_ADDR", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// Add the built-in demo fleet (majin, a WSL2 PC, a node with two 96 GB GPUs, an 8 × H200 node).
    #[arg(long, env = "TESSERA_DEMO")]
    pub demo: bool,
    /// Machines the server cannot see, described in a TOML file (see the README).
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
}
