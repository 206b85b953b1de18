//! Serving an axum router over HTTP/1.1 on a listener, with a bound on how
//! long a connection may take to send a request's header. `axum::serve` has
//! none (it gives hyper no timer, and hyper's header-read timeout needs one),
//! so an idle or trickling connection stayed open for as long as the client
//! liked, holding a file descriptor: enough of them and outboxd could not
//! open a database connection.

use std::time::Duration;

use axum::{Router, serve::Listener};
use hyper::server::conn::http1;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    server::graceful::GracefulShutdown,
    service::TowerToHyperService,
};
use tokio_util::sync::CancellationToken;

/// How long a connection has to send a request's header: from the moment it
/// is accepted, and again after each response while it is kept alive. A
/// browser or a scraper sends its header at once; a connection that sends
/// nothing for this long is closed.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `app(connection)` on each connection `listener` accepts until
/// `stop`; then stops accepting, lets requests in progress finish and closes
/// idle connections. `app` is called once per connection, with what the
/// listener says of it (for a request extension such as `ConnectInfo`).
pub async fn serve<L, F>(mut listener: L, mut app: F, stop: CancellationToken)
where
    L: Listener,
    F: FnMut(&L::Io, &L::Addr) -> Router,
{
    let graceful = GracefulShutdown::new();
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT);
    loop {
        let (io, addr) = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let service = TowerToHyperService::new(app(&io, &addr));
        let connection = graceful.watch(builder.serve_connection(TokioIo::new(io), service));
        tokio::spawn(async move {
            // A client that goes away or never sends a header is its own
            // business, not the server's.
            if let Err(error) = connection.await {
                tracing::debug!(%error, "HTTP connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
