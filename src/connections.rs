//! The door: how many connections each listener holds open at once
//! (`--max-connections`), and the open-file limit that bounds them all.
//!
//! Every accepted connection is a file descriptor, and so is each of the
//! database pool's connections. With `ulimit -n 1024`, 1 100 idle connections
//! to the status page took them all, and every call that needed a new
//! database connection failed. So at start the soft file limit is raised to
//! the hard one, and each listener (the API, `--health-listen`, the status
//! page, the metrics endpoint) holds at most its share of what the pool and a
//! reserve leave. A connection over the cap is accepted and closed at once
//! (rather than left in the listen backlog, where its client would hang),
//! counted in `outbox_connections_refused_total{listener}` and logged at most
//! every [`WARN_EVERY`].

use std::{
    io,
    net::SocketAddr,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use futures::Stream;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{TcpListener, TcpStream},
    sync::{OwnedSemaphorePermit, Semaphore},
    time::Instant,
};

use crate::metrics::ServerMetrics;

/// File descriptors kept back from the listeners besides the pool's: the
/// listening sockets, standard streams, the runtime's own, the tokens and
/// TLS files while they are read, the start-up DDL connection, name lookups
/// and the OTLP exporters'.
pub const FILE_RESERVE: u64 = 64;

/// The fewest connections a listener takes by default, however low the file
/// limit: below it the status page and the probes could not work at all.
const MIN_DEFAULT: u64 = 8;

/// How often, at most, each listener logs that it refuses connections.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// How long accepting pauses after an error that is not one connection's
/// (out of file descriptors, mostly), rather than spinning on it.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// Raises the soft open-file limit to the hard one, so the process can use
/// what it is allowed without an operator's `ulimit`; returns the soft limit
/// in force afterwards (`None`: unlimited, or not a Unix system).
pub fn raise_file_limit() -> Option<u64> {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let before = getrlimit(Resource::Nofile);
        if before.current != before.maximum {
            let raised = Rlimit {
                current: before.maximum,
                maximum: before.maximum,
            };
            // macOS refuses an unlimited soft limit; the old one stays then.
            if let Err(error) = setrlimit(Resource::Nofile, raised) {
                tracing::debug!(%error, soft = ?before.current, hard = ?before.maximum, "could not raise the open-file limit");
            }
        }
        let now = getrlimit(Resource::Nofile);
        tracing::info!(
            soft = ?now.current,
            hard = ?now.maximum,
            was = ?before.current,
            "open-file limit"
        );
        now.current
    }
    #[cfg(not(unix))]
    None
}

/// The default of `--max-connections`: (the file limit − the pool −
/// [`FILE_RESERVE`]) ÷ the listeners served, so that every listener full
/// still leaves the pool its connections; at least [`MIN_DEFAULT`]. Without
/// a file limit, as if it were 1 048 576 (Linux's default ceiling).
pub fn default_max_connections(file_limit: Option<u64>, pool: u32, listeners: usize) -> usize {
    let files = file_limit.unwrap_or(1 << 20);
    let left = files.saturating_sub(u64::from(pool) + FILE_RESERVE);
    let share = (left / listeners.max(1) as u64).max(MIN_DEFAULT);
    usize::try_from(share).unwrap_or(usize::MAX)
}

/// Whether `max_connections` on each of `listeners`, with the pool and the
/// reserve, fits in the file limit (an explicit `--max-connections` may not).
pub fn fits(file_limit: Option<u64>, pool: u32, listeners: usize, max_connections: usize) -> bool {
    let Some(files) = file_limit else {
        return true;
    };
    let wanted = (max_connections as u64)
        .saturating_mul(listeners as u64)
        .saturating_add(u64::from(pool) + FILE_RESERVE);
    wanted <= files
}

/// A listener that holds at most `max` connections open at once. Each
/// connection it hands out carries a permit, given back when the connection
/// is dropped, however it ends (TLS handshake failed, client gone, server
/// closed it).
pub struct CappedListener {
    listener: TcpListener,
    name: &'static str,
    max: usize,
    permits: Arc<Semaphore>,
    metrics: ServerMetrics,
    /// When a refusal was last logged, and how many since.
    warned: Option<Instant>,
    unlogged: u64,
}

impl CappedListener {
    /// `name` labels the listener in logs and metrics (`api`, `health`,
    /// `status_page`, `metrics`).
    pub fn new(
        listener: TcpListener,
        name: &'static str,
        max: usize,
        metrics: &ServerMetrics,
    ) -> Self {
        let permits = Arc::new(Semaphore::new(max));
        metrics.watch_connections(name, max, Arc::clone(&permits));
        Self {
            listener,
            name,
            max,
            permits,
            metrics: metrics.clone(),
            warned: None,
            unlogged: 0,
        }
    }

    /// The next connection under the cap; those over it are closed on the
    /// way. Never fails: errors are logged and accepting goes on.
    pub async fn accept(&mut self) -> (Capped<TcpStream>, SocketAddr) {
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => match Arc::clone(&self.permits).try_acquire_owned() {
                    Ok(permit) => {
                        // Small RPCs and pages go out at once.
                        let _ = stream.set_nodelay(true);
                        return (
                            Capped {
                                io: stream,
                                _permit: permit,
                            },
                            peer,
                        );
                    }
                    Err(_) => {
                        drop(stream);
                        self.refused(peer);
                    }
                },
                Err(error) => self.accept_failed(error).await,
            }
        }
    }

    /// The connections, for `serve_with_incoming_shutdown` (which takes a
    /// stream of results; this one yields no errors).
    pub fn incoming(self) -> impl Stream<Item = io::Result<Capped<TcpStream>>> + Send + 'static {
        futures::stream::unfold(self, |mut listener| async move {
            let (stream, _) = listener.accept().await;
            Some((Ok(stream), listener))
        })
    }

    fn refused(&mut self, peer: SocketAddr) {
        self.metrics.connection_refused(self.name);
        self.unlogged += 1;
        let now = Instant::now();
        if self.warned.is_some_and(|at| now < at + WARN_EVERY) {
            return;
        }
        tracing::warn!(
            listener = self.name,
            max_connections = self.max,
            refused = self.unlogged,
            %peer,
            "connection cap reached: new connections are closed at once (--max-connections)"
        );
        self.warned = Some(now);
        self.unlogged = 0;
    }

    async fn accept_failed(&mut self, error: io::Error) {
        use io::ErrorKind::{ConnectionAborted, ConnectionReset, Interrupted, WouldBlock};
        // One connection's trouble: the next accept is unaffected.
        if matches!(
            error.kind(),
            ConnectionAborted | ConnectionReset | Interrupted | WouldBlock
        ) {
            tracing::debug!(listener = self.name, %error, "accepting a connection failed");
            return;
        }
        // Out of file descriptors or memory: pause rather than spin.
        tracing::warn!(listener = self.name, %error, "accepting connections failed");
        tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
    }
}

impl axum::serve::Listener for CappedListener {
    type Io = Capped<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        CappedListener::accept(self).await
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// A connection under a listener's cap: its permit goes back when it is dropped.
#[derive(Debug)]
pub struct Capped<IO> {
    io: IO,
    _permit: OwnedSemaphorePermit,
}

impl<IO> Capped<IO> {
    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Capped<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Capped<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// What tonic tells handlers of the connection is the TCP stream's (and,
/// under TLS, the certificates it came with), as without the cap.
impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Capped<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_leaves_the_pool_and_the_reserve_their_files() {
        // ulimit -n 1024, the pool's 20, three listeners.
        let each = default_max_connections(Some(1024), 20, 3);
        assert_eq!(each, (1024 - 20 - 64) / 3);
        assert!(fits(Some(1024), 20, 3, each));
        assert!(!fits(Some(1024), 20, 3, each + 1));
        // A tiny limit still lets each listener take a few.
        assert_eq!(
            default_max_connections(Some(64), 20, 4),
            MIN_DEFAULT as usize
        );
        assert_eq!(default_max_connections(None, 20, 2), ((1 << 20) - 84) / 2);
        assert!(fits(None, 20, 4, usize::MAX));
    }

    #[tokio::test]
    async fn a_connection_over_the_cap_is_closed_at_once_and_counted() {
        use tokio::io::AsyncReadExt as _;

        let registry = crate::metrics::Metrics::new("test").expect("metrics");
        let metrics = ServerMetrics::new(&registry);
        let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = tcp.local_addr().expect("address");
        let mut listener = CappedListener::new(tcp, "test", 2, &metrics);
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(TcpStream::connect(addr).await.expect("connect"));
        }
        let first = listener.accept().await;
        let _second = listener.accept().await;
        assert_eq!(listener.permits.available_permits(), 0);

        // The third is refused while two are held: it reads EOF.
        let next = tokio::spawn(async move { listener.accept().await.1 });
        let mut byte = [0u8; 1];
        let eof = tokio::time::timeout(Duration::from_secs(5), clients[2].read(&mut byte)).await;
        assert!(matches!(eof, Ok(Ok(0) | Err(_))), "{eof:?}");
        assert!(
            registry
                .render()
                .lines()
                .any(|l| l.starts_with("outbox_connections_refused_total{")
                    && l.contains("listener=\"test\"")
                    && l.ends_with(" 1")),
            "the refusal is counted:\n{}",
            registry.render()
        );

        // Once one goes, the next connection is taken.
        drop(first);
        let fourth = TcpStream::connect(addr).await.expect("connect");
        let taken = tokio::time::timeout(Duration::from_secs(5), next)
            .await
            .expect("a connection once a permit came back")
            .expect("the accept task");
        assert_eq!(taken, fourth.local_addr().expect("address"));
    }
}
