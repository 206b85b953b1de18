//! Operators' requests and what they read: dead letters, blocked aggregates,
//! redrive and discard. Checked by `grpc` like the lease requests; the store
//! runs them as given.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{ClaimedMessage, MessageId, OutboxName};

/// Page size when a request leaves it unset.
pub const DEFAULT_PAGE_SIZE: u32 = 100;
/// The largest page a request may ask for.
pub const MAX_PAGE_SIZE: u32 = 1000;
/// The longest aggregate id a request may name (bytes).
pub const MAX_AGGREGATE_ID_BYTES: usize = 1024;

/// Where a page starts and how long it is. Pages run in `seq` order, so a
/// page's position is the last `seq` it returned: stable while rows come and
/// go, and cheap to seek to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageRequest {
    pub size: u32,
    /// Only items after this `seq`; `None` from the start.
    pub after: Option<i64>,
}

/// One page, and where the next one starts (`None` on the last page).
#[derive(Debug, Clone)]
pub struct Page<T> {
    pub items: Vec<T>,
    pub next: Option<i64>,
}

#[derive(Debug, Clone)]
pub struct DeadLettersRequest {
    pub outbox: OutboxName,
    pub aggregate_id: Option<String>,
    pub page: PageRequest,
}

#[derive(Debug, Clone)]
pub struct BlockedKeysRequest {
    pub outbox: OutboxName,
    pub page: PageRequest,
}

/// Which dead letters a Redrive selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RedriveSelector {
    Ids(Vec<MessageId>),
    Aggregate(String),
    All,
}

#[derive(Debug, Clone)]
pub struct RedriveRequest {
    pub outbox: OutboxName,
    pub selector: RedriveSelector,
}

#[derive(Debug, Clone)]
pub struct DiscardRequest {
    pub outbox: OutboxName,
    pub message_ids: Vec<MessageId>,
}

/// A dead-lettered event; its `attempt` is the deliveries it had.
#[derive(Debug, Clone)]
pub struct DeadLetter {
    pub message: ClaimedMessage,
    pub last_error: String,
    pub dead_lettered_at: DateTime<Utc>,
}

/// An aggregate held back behind its dead-lettered head.
#[derive(Debug, Clone)]
pub struct BlockedKey {
    pub aggregate_id: String,
    pub head: Uuid,
    pub blocked_since: DateTime<Utc>,
    /// Events of the aggregate waiting behind the head.
    pub held: u64,
    /// The head's `seq`: the page position.
    pub sequence: i64,
}

#[derive(Debug, Clone)]
pub struct InspectRequest {
    pub outbox: OutboxName,
    pub message_id: MessageId,
}

/// Where an event is in its life, as an operator asks about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MessageState {
    /// Waiting to be claimed (perhaps out a nack's backoff).
    Pending,
    /// Under a live lease.
    Leased,
    Published,
    DeadLettered,
    Discarded,
}

impl MessageState {
    /// The name the API and `outboxctl` show: stable, for scripts.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Leased => "leased",
            Self::Published => "published",
            Self::DeadLettered => "dead_lettered",
            Self::Discarded => "discarded",
        }
    }
}

/// One event with everything known about its state (`InspectMessage`);
/// `message.attempt` is the deliveries so far.
#[derive(Debug, Clone)]
pub struct InspectedMessage {
    pub message: ClaimedMessage,
    pub last_error: Option<String>,
    pub available_at: DateTime<Utc>,
    /// The live lease's expiry and holder; `None` when no live lease holds it.
    pub leased_until: Option<DateTime<Utc>>,
    pub leased_by: Option<String>,
    pub published_at: Option<DateTime<Utc>>,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    pub discarded_at: Option<DateTime<Utc>>,
}

impl InspectedMessage {
    pub fn state(&self) -> MessageState {
        if self.published_at.is_some() {
            MessageState::Published
        } else if self.discarded_at.is_some() {
            MessageState::Discarded
        } else if self.dead_lettered_at.is_some() {
            MessageState::DeadLettered
        } else if self.leased_until.is_some() {
            MessageState::Leased
        } else {
            MessageState::Pending
        }
    }
}
