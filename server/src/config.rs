//! The server's settings: command-line flags, each with an environment variable.

use clap::Parser;
use std::net::SocketAddr;

/// Tessera: a web console for sharing GPUs between models.
#[derive(Debug, Clone, Parser)]
#[command(name = "tessera", version, about)]
pub struct Config {
    /// Address to listen on. Without it, LEPTOS_SITE_ADDR (as cargo-leptos sets it), then 127.0.0.1:3000.
    #[arg(long, env = "LEPTOS_SITE_ADDR", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
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
}
