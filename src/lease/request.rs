//! Requests as the service understands them: already checked against the
//! server's [`Limits`](super::Limits), so the service and the store take them
//! as they are. `grpc` builds them from the wire, naming each bad field.

use std::time::Duration;

use super::{LeaseId, MAX_ERROR_CHARS, MessageId, OutboxName, WorkerId};

#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub outbox: OutboxName,
    pub worker_id: WorkerId,
    pub max_messages: u32,
    pub lease: Duration,
    pub wait: Duration,
    /// The batch's byte budget and the largest event this client may be
    /// handed (see [`Limits::claim_budget`](super::Limits::claim_budget)).
    pub max_bytes: u64,
    pub max_event_bytes: u64,
    /// The server's limit: a larger event is dead-lettered on sight.
    pub max_message_bytes: u64,
    /// Acks of earlier batches, applied before the claim.
    pub acks: Vec<AckRequest>,
}

#[derive(Debug, Clone)]
pub struct AckRequest {
    pub outbox: OutboxName,
    pub lease_id: LeaseId,
    pub message_ids: Vec<MessageId>,
}

#[derive(Debug, Clone)]
pub struct NackRequest {
    pub outbox: OutboxName,
    pub lease_id: LeaseId,
    pub message_ids: Vec<MessageId>,
    /// As [`clean_error`] leaves it.
    pub error: String,
    /// `None`: the outbox's backoff policy decides.
    pub retry_after: Option<Duration>,
    pub dead_letter: bool,
}

#[derive(Debug, Clone)]
pub struct ExtendRequest {
    pub outbox: OutboxName,
    pub lease_id: LeaseId,
    /// Empty: every message still held under the lease.
    pub message_ids: Vec<MessageId>,
    pub lease: Duration,
}

#[derive(Debug, Clone)]
pub struct StatsRequest {
    pub outbox: OutboxName,
}

/// A worker's Nack error as it is stored: without NUL (PostgreSQL text cannot
/// hold it, and a worker's string must never turn a Nack into a storage error),
/// cut at [`MAX_ERROR_CHARS`] with a `…`: it is a diagnostic, not a payload.
pub fn clean_error(raw: &str) -> String {
    let mut error: String = raw
        .chars()
        .filter(|c| *c != '\0')
        .take(MAX_ERROR_CHARS)
        .collect();
    if raw.chars().count() > MAX_ERROR_CHARS {
        error.push('…');
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_lose_nul_and_are_cut_with_a_mark() {
        assert_eq!(clean_error("bad\0 thing"), "bad thing");
        assert_eq!(clean_error(""), "");
        let exact = "x".repeat(MAX_ERROR_CHARS);
        assert_eq!(clean_error(&exact), exact);
        let long = clean_error(&"é".repeat(MAX_ERROR_CHARS + 1));
        assert_eq!(long.chars().count(), MAX_ERROR_CHARS + 1);
        assert!(long.ends_with("é…"));
    }
}
