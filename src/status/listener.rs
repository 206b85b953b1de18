//! Connections to the status page: plain TCP, or TLS with the API's
//! certificate (re-read like the API's) and its client-certificate rule;
//! either under the listener's connection cap.

use std::{io, net::SocketAddr, pin::Pin, time::Duration};

use futures::{Stream, StreamExt as _};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::{
    connections::{Capped, CappedListener},
    tls::{self, ServerTls},
};

/// Who is on the other end of a connection, as far as the connection says:
/// the subject CN of its verified client certificate, for `cn:` identities.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub common_name: Option<String>,
}

impl Peer {
    /// A TLS connection's peer.
    pub fn of(stream: &TlsStream<Capped<TcpStream>>) -> Self {
        Self {
            common_name: tls::connection_common_name(stream),
        }
    }
}

type Accepted = Pin<Box<dyn Stream<Item = io::Result<TlsStream<Capped<TcpStream>>>> + Send>>;

/// The capped listener's connections once their handshake completed, each
/// handshake in a task of its own as on the API port.
pub struct TlsListener {
    accepted: Accepted,
    local: io::Result<SocketAddr>,
}

impl TlsListener {
    pub fn new(listener: CappedListener, tls: &ServerTls) -> Self {
        let local = axum::serve::Listener::local_addr(&listener);
        Self {
            accepted: Box::pin(tls::incoming(listener, tls.http_acceptor())),
            local,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<Capped<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.accepted.next().await {
                Some(Ok(stream)) => {
                    // A connection that went away between handshake and now
                    // has no address; it is dropped like one that failed.
                    if let Ok(addr) = stream.get_ref().0.get_ref().peer_addr() {
                        return (stream, addr);
                    }
                }
                Some(Err(error)) => {
                    // Not expected: the capped listener yields no errors.
                    tracing::warn!(%error, "status page: accepting a connection failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                // The stream ends only when the listener is dropped.
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.local
            .as_ref()
            .copied()
            .map_err(|e| io::Error::new(e.kind(), e.to_string()))
    }
}
