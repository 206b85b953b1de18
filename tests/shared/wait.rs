//! Waiting for a condition instead of sleeping: every wait names what it
//! waits for and fails the test loudly when it does not come.

use std::{future::Future, time::Duration};

use tokio::time::Instant;

/// How often [`wait_until`] looks again.
const POLL: Duration = Duration::from_millis(20);

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Awaits `fut`, failing the test if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

/// Polls `condition` every `every` until it holds (true) or `limit` has passed
/// (false): for callers that fail with a report of their own.
pub async fn holds_within(
    limit: Duration,
    every: Duration,
    mut condition: impl AsyncFnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `condition` every `every` until it holds, failing the test after `limit`.
pub async fn poll_until(
    limit: Duration,
    every: Duration,
    what: &str,
    condition: impl AsyncFnMut() -> bool,
) {
    assert!(
        holds_within(limit, every, condition).await,
        "timed out after {limit:?} waiting until {what}"
    );
}

/// Polls `condition` until it holds, failing the test after `limit`.
pub async fn wait_until(limit: Duration, what: &str, condition: impl AsyncFnMut() -> bool) {
    poll_until(limit, POLL, what, condition).await;
}
