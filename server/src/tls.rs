//! Serving https itself (`--tls-cert`, `--tls-key`): rustls with the ring provider, the certificate chain
//! and its key read from PEM files at start. The handshakes happen beside the accept loop, each within a
//! bound, so that a slow or silent client holds up no one else's; axum's own serve loop (its graceful stop,
//! the client's address) then runs on the finished streams unchanged.

use axum::serve::Listener;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{
    verify_tls12_signature, verify_tls13_signature, CryptoProvider, WebPkiSupportedAlgorithms,
};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, ServerConfig, SignatureScheme,
};
use tokio_rustls::server::TlsStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

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

/// The certificate chain in `cert`.
fn read_chain(cert: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = |why: String| TlsError::Pem {
        what: "a certificate chain",
        path: cert.to_path_buf(),
        why,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| pem(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| pem(e.to_string()))?;
    if chain.is_empty() {
        return Err(pem("no certificate in it".to_owned()));
    }
    Ok(chain)
}

/// ring, not aws-lc-rs: it builds with a C compiler alone, where aws-lc-rs needs CMake and more. rustls
/// marks it deprecated for want of post-quantum key exchange, which browsers do not require.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

/// The TLS side of the server: the certificate chain of `cert` with the key of `key`.
pub fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let chain = read_chain(cert)?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Pem {
        what: "a private key",
        path: key.to_path_buf(),
        why: e.to_string(),
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    // HTTP/1.1 alone, as the plain listener serves (axum here is built without HTTP/2).
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The client side of this server's own https, for its subcommands (`tessera check`): it trusts the one
/// certificate the server serves, the first of `cert`, and no other. They reach the server by the address
/// it listens on, which a certificate for a host name does not name; holding that certificate's key is
/// the proof that it is this server.
pub fn own_connector(cert: &Path) -> Result<TlsConnector, TlsError> {
    let served = read_chain(cert)?.swap_remove(0);
    let provider = provider();
    let verifier = Arc::new(Served {
        cert: served,
        algorithms: provider.signature_verification_algorithms,
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

/// Trusts one certificate, whatever name it is reached by; the handshake's signatures are checked against
/// it as ever.
#[derive(Debug)]
struct Served {
    cert: CertificateDer<'static>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Served {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, tokio_rustls::rustls::Error> {
        if end_entity.as_ref() == self.cert.as_ref() {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(tokio_rustls::rustls::Error::InvalidCertificate(
                CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, tokio_rustls::rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A listener whose connections have finished their TLS handshake.
pub struct TlsListener {
    local: SocketAddr,
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
}

impl TlsListener {
    /// Accepts on `tcp`, each connection's handshake with `acceptor` on its own task.
    pub fn new<L>(mut tcp: L, acceptor: TlsAcceptor) -> std::io::Result<TlsListener>
    where
        L: Listener<Io = TcpStream, Addr = SocketAddr>,
    {
        let local = tcp.local_addr()?;
        let (done, ready) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                // Errors (out of file descriptors, say) are waited out inside, as axum's own loop does.
                let (stream, peer) = tcp.accept().await;
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
