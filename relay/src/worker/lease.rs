//! Keeping a batch's lease alive while it publishes, and the lease durations
//! outboxd is sent.

use std::{future::Future, time::Duration};

use tokio::time::Instant;

use super::Settings;
use crate::leases::Leases;

/// Awaits `publish`, extending lease `lease_id` at each half lease counted
/// from `claimed_at`, so a slow broker does not lose the batch to expiry. A
/// batch claimed ahead may be past its half lease already: then it is
/// extended at once.
pub(super) async fn extended_while<L: Leases, T>(
    leases: &L,
    settings: &Settings,
    lease_id: &str,
    claimed_at: Instant,
    publish: impl Future<Output = T>,
) -> T {
    let half = settings.lease / 2;
    tokio::pin!(publish);
    let mut next = claimed_at + half;
    let mut held = true;
    loop {
        tokio::select! {
            done = &mut publish => break done,
            () = tokio::time::sleep_until(next), if held => {
                held = extend(leases, settings, lease_id).await;
                next += half;
            }
        }
    }
}

/// Extends the whole lease; false once outboxd says it holds nothing (lost
/// to expiry and claimed by another worker), when extending again is useless.
/// The publish goes on: its acks come back LEASE_LOST and are counted.
async fn extend<L: Leases>(leases: &L, settings: &Settings, lease_id: &str) -> bool {
    let req = outboxd::pb::ExtendLeaseRequest {
        outbox: settings.outbox.clone(),
        lease_id: lease_id.to_owned(),
        message_ids: Vec::new(),
        lease_duration: Some(proto_duration(settings.lease)),
    };
    match leases.extend(req).await {
        Ok(resp) => {
            tracing::debug!(
                lease_id,
                extended = resp.results.len(),
                "lease extended while publishing"
            );
            true
        }
        Err(status) if status.code() == tonic::Code::FailedPrecondition => {
            tracing::warn!(
                lease_id,
                reason = status.message(),
                "lease lost while publishing: another worker holds the batch now"
            );
            false
        }
        Err(status) => {
            tracing::warn!(lease_id, code = ?status.code(), "could not extend lease; publishing on");
            true
        }
    }
}

pub(super) fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}
