//! The only place with SQL. Each configured outbox gets its statements built once,
//! at start, with its table name quoted; every RPC is then one autocommit
//! statement, so no transaction is ever held across a network call.

mod adopt;
mod error;
mod postgres;
mod statements;

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use uuid::Uuid;

pub use adopt::AdoptMode;
pub use error::StoreError;
pub use postgres::PgStore;

use crate::lease::{LeaseId, MessageResult};

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
}

/// A lease that ran out before it was settled, found when its row was re-claimed.
#[derive(Debug, Clone)]
pub struct ExpiredLease {
    pub message_id: Uuid,
    pub lease_id: Uuid,
    pub worker_id: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
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
    pub expired_leases: Vec<ExpiredLease>,
}

/// The outcome of a settle call, one result per requested id in request order.
#[derive(Debug, Clone)]
pub struct Settled {
    pub results: Vec<MessageResult>,
    /// ExtendLease only: the new expiry, by the database clock.
    pub expires_at: Option<DateTime<Utc>>,
}

/// Counts of one outbox, by the database clock.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stats {
    pub pending: u64,
    pub in_flight: u64,
    pub dead_lettered: u64,
    pub oldest_pending_age: std::time::Duration,
    pub oldest_lease_age: std::time::Duration,
    pub published_retained: u64,
}
