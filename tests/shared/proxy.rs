//! A TCP proxy between a process under test and a server it uses (outboxd and
//! PostgreSQL, the relay and RabbitMQ), so a test can hurt that link alone,
//! touching neither the server nor its other clients:
//!
//! - [`Proxy::take_down`] / [`Proxy::bring_back`]: "server down" and "server
//!   back": every connection is reset, and new ones are too until it is back;
//! - [`Proxy::reset_connections`]: every connection so far is reset (a host
//!   that vanished and came back at once); new ones are forwarded;
//! - [`Proxy::stall`] / [`Proxy::resume`]: bytes stop flowing both ways and
//!   connections stay open (a partition), new ones included;
//! - [`Proxy::retarget`]: new connections go to another server (a failover
//!   moving the address clients use to the promoted standby).

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct State {
    /// Where new connections are forwarded.
    upstream: SocketAddr,
    /// Set by `take_down`: new connections are reset at once.
    down: bool,
    /// Cancelled by `take_down` and `reset_connections`: ends every
    /// connection forwarded so far.
    live: CancellationToken,
}

/// Forwards `127.0.0.1:<port>` to the upstream server. Clones control the same
/// proxy; it stops when the last clone goes.
#[derive(Debug, Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stalled: watch::Sender<bool>,
    refused: Arc<AtomicUsize>,
    accept: JoinHandle<()>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Only this module takes the lock and nothing in it panics while holding it.
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State {
            upstream,
            down: false,
            live: CancellationToken::new(),
        }));
        let (stalled, _) = watch::channel(false);
        let refused = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(accept_loop(
            listener,
            Arc::clone(&state),
            stalled.clone(),
            Arc::clone(&refused),
        ));
        Self {
            inner: Arc::new(Inner {
                addr,
                state,
                stalled,
                refused,
                accept,
            }),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// "Server down": resets every connection through this proxy, and every
    /// new one until [`Proxy::bring_back`].
    pub fn take_down(&self) {
        let mut state = lock(&self.inner.state);
        state.down = true;
        end_live(&mut state);
    }

    /// "Server back": new connections are forwarded again.
    pub fn bring_back(&self) {
        lock(&self.inner.state).down = false;
    }

    /// Forwards new connections to `upstream` from now on. Connections so far
    /// stay with the old server until it drops them, or [`Proxy::take_down`]
    /// or [`Proxy::reset_connections`] ends them.
    pub fn retarget(&self, upstream: SocketAddr) {
        lock(&self.inner.state).upstream = upstream;
    }

    /// Where new connections are forwarded.
    pub fn upstream(&self) -> SocketAddr {
        lock(&self.inner.state).upstream
    }

    /// Resets every connection forwarded so far; new ones are forwarded.
    pub fn reset_connections(&self) {
        end_live(&mut lock(&self.inner.state));
    }

    /// Stops forwarding bytes on every connection, new ones included, until
    /// [`Proxy::resume`].
    pub fn stall(&self) {
        self.inner.stalled.send_replace(true);
    }

    pub fn resume(&self) {
        self.inner.stalled.send_replace(false);
    }

    /// Connections reset on arrival while the proxy was down: each one is an
    /// attempt of the client to reach its server.
    pub fn refused(&self) -> usize {
        self.inner.refused.load(Ordering::SeqCst)
    }
}

fn end_live(state: &mut State) {
    state.live.cancel();
    state.live = CancellationToken::new();
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.accept.abort();
        lock(&self.state).live.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    state: Arc<Mutex<State>>,
    stalled: watch::Sender<bool>,
    refused: Arc<AtomicUsize>,
) {
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            // Out of file descriptors or similar: a back-off instead of spinning.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        // Decided under the lock, so a connection accepted while `take_down`
        // runs is either refused here or ended by the token it cancels.
        let live = {
            let state = lock(&state);
            (!state.down).then(|| (state.live.clone(), state.upstream))
        };
        let Some((live, upstream)) = live else {
            // A reset, like a host that is gone.
            let _ = inbound.set_zero_linger();
            drop(inbound);
            refused.fetch_add(1, Ordering::SeqCst);
            continue;
        };
        let stalled = stalled.subscribe();
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                () = live.cancelled() => {
                    // A reset instead of a close: the peers see a host that vanished.
                    let _ = inbound.set_zero_linger();
                    let _ = outbound.set_zero_linger();
                }
                () = forward(&mut inbound, &mut outbound, stalled) => {}
            }
        });
    }
}

/// Copies both ways until both directions have ended.
async fn forward(a: &mut TcpStream, b: &mut TcpStream, stalled: watch::Receiver<bool>) {
    let (a_read, a_write) = a.split();
    let (b_read, b_write) = b.split();
    tokio::join!(
        pipe(a_read, b_write, stalled.clone()),
        pipe(b_read, a_write, stalled)
    );
}

/// Copies `from` to `to`, holding each chunk while the proxy is stalled.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    mut stalled: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if stalled.wait_for(|s| !*s).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}
