//! The health check: SERVING only while the database answers and takes writes.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    server::{ADMIN_SERVICE_NAME, SERVICE_NAME},
    store::{DbState, Store},
};

/// Sets the overall status and that of each of outboxd's services.
pub async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health.set_service_status(SERVICE_NAME, status).await;
    health.set_service_status(ADMIN_SERVICE_NAME, status).await;
}

/// What the last check found; a change of it is logged once.
#[derive(Debug, PartialEq, Eq)]
enum Found {
    Serving,
    /// No answer, or an error: one state whatever the error, so a database
    /// that stays down does not log anew each time the error's words change.
    Unreachable,
    /// It answers but takes no writes (a standby in recovery, read-only).
    ReadOnly(String),
}

/// SERVING only while the database answers and takes writes: a standby in
/// recovery answers, yet fails every claim and ack. Stops at shutdown so
/// nothing flips the status back while draining.
pub async fn check_health(
    store: impl Store,
    health: HealthReporter,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut found = Found::Serving;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let ping = tokio::time::timeout(every.max(Duration::from_secs(1)), store.ping()).await;
        if shutdown.is_cancelled() {
            return;
        }
        let (now, error) = match ping {
            Ok(Ok(DbState::Writable)) => (Found::Serving, None),
            Ok(Ok(DbState::ReadOnly(reason))) => (Found::ReadOnly(reason), None),
            Ok(Err(err)) => (Found::Unreachable, Some(err.to_string())),
            Err(_) => (Found::Unreachable, Some("no answer in time".to_owned())),
        };
        if now == found {
            continue;
        }
        match &now {
            Found::Serving => tracing::info!("database answers and takes writes again: SERVING"),
            Found::Unreachable => tracing::warn!(
                error = error.as_deref().unwrap_or_default(),
                "database does not answer: NOT_SERVING"
            ),
            Found::ReadOnly(reason) => tracing::warn!(
                reason = %reason,
                "database takes no writes: NOT_SERVING until it does (a failover promotes a standby, or outboxd is pointed at the primary)"
            ),
        }
        let flips = (now == Found::Serving) != (found == Found::Serving);
        found = now;
        if flips {
            let status = if found == Found::Serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            set_health(&health, status).await;
        }
    }
}
