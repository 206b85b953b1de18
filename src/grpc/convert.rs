//! Service results shaped for the wire.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::pb;
use crate::lease::{ClaimedBatch, ClaimedMessage, MessageResult, Outcome, Settled, Stats};

pub fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

pub fn duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

/// The claimed batch, and the outcomes of the acks the claim carried.
pub fn claimed(batch: ClaimedBatch, acked: Vec<MessageResult>) -> pb::ClaimBatchResponse {
    let ack_results = acked.into_iter().map(result).collect();
    if batch.messages.is_empty() {
        return pb::ClaimBatchResponse {
            ack_results,
            ..Default::default()
        };
    }
    pb::ClaimBatchResponse {
        lease_id: batch.lease_id.to_string(),
        lease_expires_at: batch.expires_at.map(timestamp),
        messages: batch.messages.into_iter().map(message).collect(),
        ack_results,
    }
}

fn message(m: ClaimedMessage) -> pb::OutboxMessage {
    pb::OutboxMessage {
        id: m.id.to_string(),
        aggregate_id: m.aggregate_id,
        event_type: m.event_type,
        payload: m.payload.into_bytes(),
        headers: m.headers.into_iter().collect(),
        created_at: Some(timestamp(m.created_at)),
        attempt: m.attempt,
        sequence: m.sequence,
    }
}

pub fn results(settled: Settled) -> Vec<pb::MessageResult> {
    settled.results.into_iter().map(result).collect()
}

fn result(r: MessageResult) -> pb::MessageResult {
    let outcome = match r.outcome {
        Outcome::Ok => pb::Outcome::Ok,
        Outcome::AlreadyDone => pb::Outcome::AlreadyDone,
        Outcome::LeaseLost => pb::Outcome::LeaseLost,
        Outcome::NotFound => pb::Outcome::NotFound,
        Outcome::DeadLettered => pb::Outcome::DeadLettered,
    };
    pb::MessageResult {
        message_id: r.message_id.to_string(),
        outcome: outcome.into(),
        detail: r.detail,
    }
}

pub fn stats_response(s: Stats) -> pb::GetStatsResponse {
    pb::GetStatsResponse {
        pending: s.pending,
        in_flight: s.in_flight,
        dead_lettered: s.dead_lettered,
        oldest_pending_age: Some(duration(s.oldest_pending_age)),
        published_retained: s.published_retained,
    }
}
