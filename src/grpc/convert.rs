//! Proto <-> service conversions. Wire values are checked here against the
//! server's limits (parse, don't validate); results are shaped for the wire.

use std::time::Duration;

use chrono::{DateTime, Utc};
use tonic::metadata::MetadataMap;

use super::pb;
use crate::lease::{
    AckRequest, ClaimRequest, ClaimedBatch, ClaimedMessage, ExtendRequest, FieldViolation, Limits,
    MessageResult, NackRequest, Outcome, Settled, Stats, StatsRequest,
};

fn wire(d: Option<prost_types::Duration>) -> Option<(i64, i32)> {
    d.map(|d| (d.seconds, d.nanos))
}

pub fn claim(
    req: &pb::ClaimBatchRequest,
    limits: &Limits,
) -> Result<ClaimRequest, Vec<FieldViolation>> {
    let claim = ClaimRequest::parse(
        &req.outbox,
        &req.worker_id,
        req.max_messages,
        wire(req.lease_duration),
        wire(req.wait),
        limits,
    );
    let acks = AckRequest::parse_carried(
        &req.outbox,
        req.acks
            .iter()
            .map(|a| (a.lease_id.as_str(), a.message_ids.as_slice())),
        limits,
    );
    // Every bad field at once, the claim's first.
    match (claim, acks) {
        (Ok(claim), Ok(acks)) => Ok(ClaimRequest { acks, ..claim }),
        (claim, acks) => Err(claim
            .err()
            .into_iter()
            .chain(acks.err())
            .flatten()
            .collect()),
    }
}

pub fn ack(req: &pb::AckRequest, limits: &Limits) -> Result<AckRequest, Vec<FieldViolation>> {
    AckRequest::parse(&req.outbox, &req.lease_id, &req.message_ids, limits)
}

pub fn nack(req: &pb::NackRequest, limits: &Limits) -> Result<NackRequest, Vec<FieldViolation>> {
    NackRequest::parse(
        &req.outbox,
        &req.lease_id,
        &req.message_ids,
        &req.error,
        wire(req.retry_after),
        req.dead_letter,
        limits,
    )
}

pub fn extend(
    req: &pb::ExtendLeaseRequest,
    limits: &Limits,
) -> Result<ExtendRequest, Vec<FieldViolation>> {
    ExtendRequest::parse(
        &req.outbox,
        &req.lease_id,
        &req.message_ids,
        wire(req.lease_duration),
        limits,
    )
}

pub fn stats(req: &pb::GetStatsRequest) -> StatsRequest {
    StatsRequest::parse(&req.outbox)
}

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

/// The caller's deadline from `grpc-timeout` (`<digits><unit>`, unit one of
/// H M S m u n), so a long poll can end in time to deliver its answer.
pub fn client_deadline(metadata: &MetadataMap) -> Option<Duration> {
    let raw = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeout_header_parses() {
        let mut md = MetadataMap::new();
        assert_eq!(client_deadline(&md), None);
        md.insert("grpc-timeout", "1500m".parse().expect("ascii"));
        assert_eq!(client_deadline(&md), Some(Duration::from_millis(1500)));
        md.insert("grpc-timeout", "2S".parse().expect("ascii"));
        assert_eq!(client_deadline(&md), Some(Duration::from_secs(2)));
        md.insert("grpc-timeout", "x".parse().expect("ascii"));
        assert_eq!(client_deadline(&md), None);
    }
}
