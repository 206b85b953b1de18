//! Signals: the first SIGTERM/SIGINT starts a graceful shutdown, a second one
//! exits at once (an operator who presses Ctrl-C twice means it).

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Returns a token cancelled at the first signal. Must be called inside a runtime.
pub fn on_signals() -> std::io::Result<CancellationToken> {
    let token = CancellationToken::new();
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let first = token.clone();
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        tracing::info!(
            signal = name,
            "shutting down; a second signal exits at once"
        );
        first.cancel();
        let code = tokio::select! {
            _ = term.recv() => 128 + 15,
            _ = int.recv() => 128 + 2,
        };
        tracing::warn!("second signal: exiting without draining");
        std::process::exit(code);
    });
    Ok(token)
}
