//! A TCP proxy between a process under test and a shared server (outboxd and
//! PostgreSQL, the relay and RabbitMQ), so a test can take the server away and
//! give it back without touching the server or its other clients.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use tokio::{
    io::copy_bidirectional,
    net::{TcpListener, TcpStream},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct State {
    cut: bool,
    /// Cancelled by `cut`: ends every connection forwarded so far.
    live: CancellationToken,
}

/// Forwards `127.0.0.1:<port>` to the upstream server until `cut`. Clones control the
/// same proxy; it stops when the last clone goes.
#[derive(Debug, Clone)]
pub struct Proxy {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State {
            cut: false,
            live: CancellationToken::new(),
        }));
        let accept = tokio::spawn(accept_loop(listener, upstream, Arc::clone(&state)));
        Self {
            inner: Arc::new(Inner {
                addr,
                state,
                accept,
            }),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// "Server down": closes every connection through this proxy and resets
    /// new ones.
    pub fn cut(&self) {
        let mut state = lock(&self.inner.state);
        state.cut = true;
        state.live.cancel();
        state.live = CancellationToken::new();
    }

    /// "Server back": new connections are forwarded again.
    pub fn restore(&self) {
        lock(&self.inner.state).cut = false;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.accept.abort();
        lock(&self.state).live.cancel();
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    // Only this module takes the lock and nothing in it panics while holding it.
    state
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, state: Arc<Mutex<State>>) {
    loop {
        let mut inbound = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors or similar: back off instead of spinning.
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        // Decided under the lock, so a connection accepted while `cut` runs is
        // either refused here or ended by the token `cut` cancels.
        let live = {
            let state = lock(&state);
            (!state.cut).then(|| state.live.clone())
        };
        let Some(live) = live else {
            // A reset, like a host that is gone.
            let _ = inbound.set_zero_linger();
            drop(inbound);
            continue;
        };
        tokio::spawn(async move {
            let Ok(mut outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            tokio::select! {
                () = live.cancelled() => {
                    let _ = inbound.set_zero_linger();
                    let _ = outbound.set_zero_linger();
                }
                _ = copy_bidirectional(&mut inbound, &mut outbound) => {}
            }
        });
    }
}
