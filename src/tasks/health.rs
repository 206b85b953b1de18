//! The health check: SERVING only while the database answers.

use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    server::{ADMIN_SERVICE_NAME, SERVICE_NAME},
    store::Store,
};

/// Sets the overall status and that of each of outboxd's services.
pub async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health.set_service_status(SERVICE_NAME, status).await;
    health.set_service_status(ADMIN_SERVICE_NAME, status).await;
}

/// SERVING only while the database answers; stops at shutdown so nothing flips
/// the status back while draining.
pub async fn check_health(
    store: impl Store,
    health: HealthReporter,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut serving = true;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let ok = matches!(
            tokio::time::timeout(every.max(Duration::from_secs(1)), store.ping()).await,
            Ok(Ok(()))
        );
        if shutdown.is_cancelled() {
            return;
        }
        if ok != serving {
            serving = ok;
            if ok {
                tracing::info!("database answers again: SERVING");
                set_health(&health, ServingStatus::Serving).await;
            } else {
                tracing::warn!("database does not answer: NOT_SERVING");
                set_health(&health, ServingStatus::NotServing).await;
            }
        }
    }
}
