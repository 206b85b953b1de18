//! A TCP proxy between outboxd and PostgreSQL that can cut its connections
//! (reset, like a host that vanished) and stall them (bytes stop flowing both
//! ways, connections stay open, like a partition), touching nothing else.

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{
        TcpListener, TcpStream,
        tcp::{OwnedReadHalf, OwnedWriteHalf},
    },
    sync::watch,
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

#[derive(Debug)]
struct State {
    /// Cancelled by `cut`: ends every connection forwarded so far.
    live: CancellationToken,
}

#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    stalled: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy on 127.0.0.1:0");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(Mutex::new(State {
            live: CancellationToken::new(),
        }));
        let (stalled, _) = watch::channel(false);
        let accept = tokio::spawn(accept_loop(
            listener,
            upstream,
            Arc::clone(&state),
            stalled.clone(),
        ));
        Self {
            addr,
            state,
            stalled,
            accept,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Resets every connection forwarded so far; new ones are forwarded.
    pub fn cut(&self) {
        let mut state = lock(&self.state);
        state.live.cancel();
        state.live = CancellationToken::new();
    }

    /// Stops forwarding bytes on every connection, new ones included, until `resume`.
    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        lock(&self.state).live.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    state: Arc<Mutex<State>>,
    stalled: watch::Sender<bool>,
) {
    loop {
        let Ok((inbound, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        let live = lock(&state).live.clone();
        let stalled = stalled.subscribe();
        tokio::spawn(async move {
            let Ok(outbound) = TcpStream::connect(upstream).await else {
                return;
            };
            // A cut resets instead of closing: the peer sees a host that vanished.
            let _ = inbound.set_zero_linger();
            let _ = outbound.set_zero_linger();
            let (in_read, in_write) = inbound.into_split();
            let (out_read, out_write) = outbound.into_split();
            let up = pipe(in_read, out_write, stalled.clone());
            let down = pipe(out_read, in_write, stalled);
            tokio::select! {
                () = live.cancelled() => {}
                _ = async { tokio::join!(up, down) } => {}
            }
        });
    }
}

/// Copies `from` to `to`, holding each chunk while the proxy is stalled.
async fn pipe(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut stalled: watch::Receiver<bool>) {
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
