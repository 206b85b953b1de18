//! How long a slot waits before trying again.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use outboxd::backoff::BackoffPolicy;

/// Capped exponential backoff for reconnects and retried calls.
pub(super) const RETRY: BackoffPolicy = BackoffPolicy {
    base: Duration::from_millis(200),
    factor: 2.0,
    cap: Duration::from_secs(10),
    jitter: 0.2,
};

/// Released messages that never reached the broker come back this soon.
pub(super) const FAILED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Sleeps for the `failures`-th backoff delay unless stopped first; true when
/// stopped.
pub(super) async fn back_off(stop: &CancellationToken, failures: u32) -> bool {
    let delay = RETRY.delay(failures, &mut rand::rng());
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(delay) => false,
    }
}
