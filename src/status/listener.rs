//! Connections to the status page: plain TCP, or TLS with the API's
//! certificate (re-read like the API's) and its client-certificate rule.

use std::{io, net::SocketAddr, pin::Pin, time::Duration};

use axum::{extract::connect_info::Connected, serve::IncomingStream};
use futures::{Stream, StreamExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;

use crate::tls::{self, ServerTls};

/// Who is on the other end of a connection, as far as the connection says:
/// the subject CN of its verified client certificate, for `cn:` identities.
#[derive(Debug, Clone, Default)]
pub struct Peer {
    pub common_name: Option<String>,
}

impl Connected<IncomingStream<'_, TcpListener>> for Peer {
    fn connect_info(_: IncomingStream<'_, TcpListener>) -> Self {
        Self::default()
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Self {
        Self {
            common_name: tls::connection_common_name(stream.io()),
        }
    }
}

type Accepted = Pin<Box<dyn Stream<Item = io::Result<TlsStream<TcpStream>>> + Send>>;

/// The TCP listener's connections once their handshake completed, each
/// handshake in a task of its own as on the API port.
pub struct TlsListener {
    accepted: Accepted,
    local: io::Result<SocketAddr>,
}

impl TlsListener {
    pub fn new(listener: TcpListener, tls: &ServerTls) -> Self {
        let local = listener.local_addr();
        Self {
            accepted: Box::pin(tls::incoming(listener, tls.http_acceptor())),
            local,
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.accepted.next().await {
                Some(Ok(stream)) => {
                    // A connection that went away between handshake and now
                    // has no address; it is dropped like one that failed.
                    if let Ok(addr) = stream.get_ref().0.peer_addr() {
                        return (stream, addr);
                    }
                }
                Some(Err(error)) => {
                    // Out of file descriptors, mostly: wait rather than spin.
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
