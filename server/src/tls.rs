//! Serving https itself (`--tls-cert`, `--tls-key`): rustls with the ring provider, the certificate chain
//! and its key read from PEM files at start. The handshakes happen beside the accept loop, each within a
//! bound, so that a slow or silent client holds up no one else's; axum's own serve loop (its graceful stop,
//! the client's address) then runs on the finished streams unchanged.

use axum::serve::Listener;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client may take over its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// Why https cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read, or holds nothing of its kind.
    #[error("could not read {what} from {path}: {why}")]
    Pem {
        /// A certificate chain or a private key.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
    /// One of the two was given without the other.
    #[error("give both --tls-cert and --tls-key, or neither")]
    Half,
    /// rustls refused the pair (a key that is not the certificate's, say).
    #[error("the certificate and key cannot be served: {0}")]
    Config(#[from] tokio_rustls::rustls::Error),
}

/// The TLS side of the server: the certificate chain of `cert` with the key of `key`.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let pem = |what, path: &Path, why: String| TlsError::Pem {
        what,
        path: path.to_path_buf(),
        why,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| pem("a certificate chain", cert, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem("a certificate chain", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(pem(
            "a certificate chain",
            cert,
            "no certificate in it".to_owned(),
        ));
    }
    let key =
        PrivateKeyDer::from_pem_file(key).map_err(|e| pem("a private key", key, e.to_string()))?;
    // ring, not aws-lc-rs: it builds with a C compiler alone, where aws-lc-rs needs CMake and more. rustls
    // marks it deprecated for want of post-quantum key exchange, which browsers do not require.
    #[allow(deprecated)]
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    // HTTP/1.1 alone, as the plain listener serves (axum here is built without HTTP/2).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// A listener whose connections have finished their TLS handshake.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `tcp`, each connection's handshake with `acceptor` on its own task.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> std::io::Result<TlsListener> {
        let local = tcp.local_addr()?;
        let (done, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = match tcp.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of file descriptors, say: wait, as axum's own loop does.
                        tracing::warn!("could not accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let (acceptor, handed) = (acceptor.clone(), done.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = handed.send((tls, peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("a TLS handshake from {peer} failed: {e}"),
                        Err(_) => tracing::debug!("a TLS handshake from {peer} took too long"),
                    }
                });
                if done.is_closed() {
                    return;
                }
            }
        });
        Ok(TlsListener { local, ready })
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(connection) => connection,
            // The accept loop ends only with this listener: nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
