//! The sockets the server listens on: bound here, or inherited from a service manager that holds them across
//! the server's restarts (systemd's `tessera.socket`, passed by its protocol: `LISTEN_FDS` sockets from
//! descriptor 3 on, for the process `LISTEN_PID`). An inherited socket outlives the server: while it
//! restarts or is upgraded, a new connection waits in the socket's queue for the next server instead of
//! being refused.

use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::pin::Pin;

/// Why the sockets could not be taken or used.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    /// A descriptor the service manager named is not a listening TCP socket.
    #[error("the service manager passed descriptor {index} of {count} (LISTEN_FDS), which is not a TCP socket Tessera can listen on: {source}; list only ListenStream= addresses in tessera.socket")]
    NotTcp {
        /// Its place among those passed.
        index: usize,
        /// How many were passed.
        count: usize,
        /// What the OS said.
        source: std::io::Error,
    },
    /// A passed socket that no address of the server's names would be listened on by nobody.
    #[error("the service manager passed a socket on {passed}, but Tessera listens on {wanted}: give tessera.socket's ListenStream= and the server's listen (and gateway_listen) the same addresses")]
    Unclaimed {
        /// The socket's own address.
        passed: SocketAddr,
        /// The addresses the server was told to listen on.
        wanted: String,
    },
    /// The address is taken or not ours.
    #[error("could not listen on {addr}: {source}; pass another --listen address")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: std::io::Error,
    },
}

/// The sockets a service manager passed, each until an address claims it.
#[derive(Debug, Default)]
pub struct Inherited {
    sockets: Vec<(SocketAddr, TcpListener)>,
}

impl Inherited {
    /// Takes the sockets passed by systemd's protocol (none where `LISTEN_FDS` is not set, or names another
    /// process in `LISTEN_PID`), each marked close-on-exec so that no engine inherits it, and clears the
    /// variables. Call it first, before any thread runs: it changes the environment.
    pub fn take() -> Result<Inherited, ListenError> {
        let mut passed = listenfd::ListenFd::from_env();
        let count = passed.len();
        let mut sockets = Vec::with_capacity(count);
        for index in 0..count {
            let not_tcp = |source| ListenError::NotTcp {
                index,
                count,
                source,
            };
            let socket = passed
                .take_tcp_listener(index)
                .map_err(not_tcp)?
                .ok_or_else(|| not_tcp(std::io::ErrorKind::NotFound.into()))?;
            let addr = socket.local_addr().map_err(not_tcp)?;
            sockets.push((addr, socket));
        }
        Ok(Inherited { sockets })
    }

    /// The sockets given, by their addresses (a test's stand-in for a service manager).
    pub fn of(sockets: Vec<TcpListener>) -> std::io::Result<Inherited> {
        let sockets = sockets
            .into_iter()
            .map(|s| Ok((s.local_addr()?, s)))
            .collect::<std::io::Result<_>>()?;
        Ok(Inherited { sockets })
    }

    /// Whether a service manager passed any socket.
    pub fn any(&self) -> bool {
        !self.sockets.is_empty()
    }

    /// Claims every address of `wanted` (the console's first): each the passed socket bound to it, else a
    /// socket bound now. Refused where a passed socket is left that no address claims: connections to it
    /// would wait forever.
    pub fn claim(mut self, wanted: &[SocketAddr]) -> Result<Vec<Listener>, ListenError> {
        let listeners = wanted
            .iter()
            .map(
                |&addr| match self.sockets.iter().position(|(a, _)| *a == addr) {
                    Some(at) => Ok(Listener {
                        addr,
                        socket: self.sockets.swap_remove(at).1,
                        inherited: true,
                    }),
                    None => TcpListener::bind(addr)
                        .map(|socket| Listener {
                            addr,
                            socket,
                            inherited: false,
                        })
                        .map_err(|source| ListenError::Bind { addr, source }),
                },
            )
            .collect::<Result<Vec<_>, _>>()?;
        if let Some((passed, _)) = self.sockets.first() {
            return Err(ListenError::Unclaimed {
                passed: *passed,
                wanted: wanted
                    .iter()
                    .map(SocketAddr::to_string)
                    .collect::<Vec<_>>()
                    .join(" and "),
            });
        }
        Ok(listeners)
    }
}

/// A socket the server listens on.
#[derive(Debug)]
pub struct Listener {
    /// Its address.
    pub addr: SocketAddr,
    socket: TcpListener,
    /// Passed by the service manager: it outlives this server.
    pub inherited: bool,
}

impl Listener {
    /// The socket, for tokio.
    pub fn into_tokio(self) -> Result<tokio::net::TcpListener, ListenError> {
        let addr = self.addr;
        let bind = |source| ListenError::Bind { addr, source };
        self.socket.set_nonblocking(true).map_err(bind)?;
        tokio::net::TcpListener::from_std(self.socket).map_err(bind)
    }
}

/// A listener that takes connections until `stop` is done, then lets go of its socket: from then on a new
/// connection waits in the socket's queue for the next server (where a service manager holds the socket)
/// rather than being taken here and closed unanswered as this server goes. The connections it took are
/// served on until the server closes them.
pub struct Closing<L> {
    /// Until the stop.
    inner: Option<L>,
    local: SocketAddr,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl<L: axum::serve::Listener<Addr = SocketAddr>> Closing<L> {
    /// `inner`, until `stop` is done.
    pub fn new(
        inner: L,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<Closing<L>> {
        Ok(Closing {
            local: inner.local_addr()?,
            inner: Some(inner),
            stop: Box::pin(stop),
        })
    }
}

impl<L: axum::serve::Listener<Addr = SocketAddr>> axum::serve::Listener for Closing<L> {
    type Io = L::Io;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (L::Io, SocketAddr) {
        if let Some(inner) = self.inner.as_mut() {
            // The stop first: once it is done no connection is taken, even one that waits already.
            tokio::select! {
                biased;
                () = self.stop.as_mut() => self.inner = None,
                accepted = inner.accept() => return accepted,
            }
        }
        std::future::pending().await
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").unwrap()
    }

    #[test]
    fn a_passed_socket_is_taken_by_the_address_it_is_bound_to_and_the_others_are_bound_anew() {
        let passed = bound();
        let addr = passed.local_addr().unwrap();
        let other = bound().local_addr().unwrap();
        let inherited = Inherited::of(vec![passed]).unwrap();
        // `other` was let go again: bound anew, it is free.
        let listeners = inherited.claim(&[other, addr]).unwrap();
        assert_eq!(
            listeners
                .iter()
                .map(|l| (l.addr, l.inherited))
                .collect::<Vec<_>>(),
            [(other, false), (addr, true)]
        );
    }

    #[test]
    fn a_passed_socket_no_address_claims_is_refused_naming_both_addresses() {
        let passed = bound();
        let addr = passed.local_addr().unwrap();
        let wanted: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let err = Inherited::of(vec![passed])
            .unwrap()
            .claim(&[wanted])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            format!("the service manager passed a socket on {addr}, but Tessera listens on 127.0.0.1:0: give tessera.socket's ListenStream= and the server's listen (and gateway_listen) the same addresses")
        );
    }

    #[test]
    fn an_address_taken_by_another_program_is_refused_with_the_flag_to_change() {
        let taken = bound();
        let addr = taken.local_addr().unwrap();
        let err = Inherited::default().claim(&[addr]).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("could not listen on {addr}: "))
                && err.ends_with("; pass another --listen address"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_closing_listener_takes_connections_until_its_stop_then_leaves_them_queued_for_the_next_server(
    ) {
        use axum::serve::Listener as _;
        let socket = bound();
        let addr = socket.local_addr().unwrap();
        // The service manager's copy, which outlives this server's.
        let held = socket.try_clone().unwrap();
        socket.set_nonblocking(true).unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut closing = Closing::new(
            tokio::net::TcpListener::from_std(socket).unwrap(),
            async move {
                let _ = stopped.await;
            },
        )
        .unwrap();
        let _first = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (_, from) = closing.accept().await;
        assert_eq!(from.ip(), addr.ip());
        stop.send(()).unwrap();
        let late = tokio::net::TcpStream::connect(addr).await.unwrap();
        let taken =
            tokio::time::timeout(std::time::Duration::from_millis(200), closing.accept()).await;
        assert!(taken.is_err(), "a connection made after the stop was taken");
        // It waits in the socket's queue, for whoever holds the socket next.
        held.set_nonblocking(false).unwrap();
        let (_, peer) = held.accept().unwrap();
        assert_eq!(peer, late.local_addr().unwrap());
    }
}
