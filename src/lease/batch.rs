//! What the lease operations return: a claimed batch, settle results, the
//! leases that ended (for spans and metrics), an outbox's counts. The store
//! produces them; the service, the gRPC layer, metrics and telemetry read them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{LeaseId, MessageResult};

/// A message handed out under a lease.
#[derive(Debug, Clone)]
pub struct ClaimedMessage {
    pub id: Uuid,
    pub aggregate_id: String,
    pub event_type: String,
    /// The stored JSON text.
    pub payload: String,
    pub headers: BTreeMap<String, String>,
    pub created_at: DateTime<Utc>,
    /// 1 on first delivery.
    pub attempt: u32,
    pub sequence: i64,
    /// Times an operator redrove it out of the dead letters.
    pub redrives: u32,
}

/// A lease that ended — settled, or found expired when its row was re-claimed —
/// with what it takes to report it as a span: its times are the database's.
#[derive(Debug, Clone)]
pub struct EndedLease {
    pub message_id: Uuid,
    pub lease_id: Option<Uuid>,
    pub worker_id: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
    /// The settle time, or the expiry of a lease that ran out.
    pub ended_at: DateTime<Utc>,
    pub created_at: DateTime<Utc>,
    pub attempt: u32,
    /// The producer's trace context stored with the event.
    pub traceparent: Option<String>,
    pub tracestate: Option<String>,
    /// The row is dead-lettered now (by this nack, or by the re-claim).
    pub dead_lettered: bool,
}

/// What one claim did: the batch, and what it found on the way.
#[derive(Debug, Clone)]
pub struct ClaimedBatch {
    pub lease_id: LeaseId,
    /// `None` when nothing was claimed.
    pub expires_at: Option<DateTime<Utc>>,
    /// In sequence order.
    pub messages: Vec<ClaimedMessage>,
    /// Rows that had used up their attempts and were dead-lettered, not handed out.
    pub dead_lettered: Vec<Uuid>,
    pub expired_leases: Vec<EndedLease>,
    /// Events larger than this client can receive, left for another one:
    /// their ids and sizes in bytes.
    pub too_large: Vec<(Uuid, u64)>,
}

/// The outcome of a settle call, one result per requested id in request order.
#[derive(Debug, Clone)]
pub struct Settled {
    pub results: Vec<MessageResult>,
    /// ExtendLease only: the new expiry, by the database clock.
    pub expires_at: Option<DateTime<Utc>>,
    /// Ack and Nack: the leases this call ended, one per row it changed.
    pub ended: Vec<EndedLease>,
}

/// Counts of one outbox, by the database clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Stats {
    pub pending: u64,
    pub in_flight: u64,
    pub dead_lettered: u64,
    pub oldest_pending_age: std::time::Duration,
    pub oldest_lease_age: std::time::Duration,
    pub published_retained: u64,
    /// Aggregates held back behind a dead-lettered head (ordered outboxes
    /// under `poison=block`), and how long the longest-held one has waited.
    pub blocked_keys: u64,
    pub oldest_blocked_age: std::time::Duration,
    /// How long the commit-order guard of an ordered outbox has been holding
    /// new events back for transactions still open (zero when it is not).
    pub commit_order_holdback: std::time::Duration,
    /// This replica's claim cursor (unordered outboxes; 0 otherwise): every
    /// pending event at or below it is leased, delayed or settled.
    pub claim_cursor: i64,
    /// The error of the newest dead letter, else of the pending event retried
    /// last; GetStats only (the gauges' samples skip it).
    pub last_error: Option<String>,
}
