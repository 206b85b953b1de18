//! Accepting TLS connections: TCP accepted as without TLS (under the
//! listener's connection cap), then each handshake in a task of its own,
//! bounded in time and in number, so a slow or silent client holds up nobody
//! else.

use std::time::Duration;

use futures::{Stream, StreamExt as _};
use tokio::{net::TcpStream, task::JoinSet};
use tokio_rustls::{TlsAcceptor, server::TlsStream};

use crate::connections::{Capped, CappedListener};

/// How long a client has to complete the handshake after connecting.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Most handshakes in progress at once; further connections wait in the
/// listen backlog until one finishes.
const MAX_HANDSHAKES: usize = 1024;

/// The connections of `listener` that completed a TLS handshake, for
/// `serve_with_incoming_shutdown`. A failed or timed-out handshake is logged
/// at DEBUG and dropped (it is the client's problem, not the server's); a
/// connection in its handshake counts against the listener's cap. Dropping
/// the stream closes the listener and abandons handshakes.
pub fn incoming(
    listener: CappedListener,
    acceptor: TlsAcceptor,
) -> impl Stream<Item = Result<TlsStream<Capped<TcpStream>>, std::io::Error>> + Send + 'static {
    let tcp = Box::pin(listener.incoming());
    let state = (tcp, JoinSet::new(), acceptor);
    futures::stream::unfold(state, |(mut tcp, mut handshakes, acceptor)| async move {
        loop {
            tokio::select! {
                accepted = tcp.next(), if handshakes.len() < MAX_HANDSHAKES => match accepted {
                    Some(Ok(stream)) => {
                        handshakes.spawn(handshake(acceptor.clone(), stream));
                    }
                    Some(Err(err)) => return Some((Err(err), (tcp, handshakes, acceptor))),
                    None => return None,
                },
                Some(done) = handshakes.join_next() => {
                    if let Ok(Some(tls)) = done {
                        return Some((Ok(tls), (tcp, handshakes, acceptor)));
                    }
                }
            }
        }
    })
}

async fn handshake(
    acceptor: TlsAcceptor,
    stream: Capped<TcpStream>,
) -> Option<TlsStream<Capped<TcpStream>>> {
    let peer = stream.get_ref().peer_addr().ok();
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(error)) => {
            tracing::debug!(?peer, %error, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!(?peer, timeout = ?HANDSHAKE_TIMEOUT, "TLS handshake timed out");
            None
        }
    }
}
