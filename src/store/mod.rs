//! The storage seam. The service and the background tasks see an outbox's
//! storage only through these traits; PostgreSQL ([`postgres`]: sqlx, the
//! pool, sequence probes) is one implementation,
//! and a second one (a lease table that writes less, an embedded backend)
//! passes the same conformance suite (`tests/api/store_conformance.rs`).
//!
//! Each outbox is a handle, resolved from its name once: no statement looks
//! the name up again. Every call is one short unit of work, so no transaction
//! is ever held across a network call.

mod error;
pub mod postgres;
pub mod watchdog;

use std::future::Future;

pub use error::StoreError;
pub use postgres::{AdoptMode, ConnectError, ConnectSettings, PgOutbox, PgStore, connect};

use crate::{
    lease::{
        AckRequest, BlockedKey, ClaimRequest, ClaimedBatch, DeadLetter, ExtendRequest,
        InspectedMessage, MessageId, NackRequest, Page, PageRequest, RedriveSelector, Settled,
        Stats,
    },
    outbox::OutboxSpec,
};

/// A storage backend: the outboxes it serves and its health.
pub trait Store: Clone + Send + Sync + 'static {
    type Outbox: OutboxStore + Arrivals + AdminStore;

    /// One handle per configured outbox, in configuration order.
    fn outboxes(&self) -> Vec<Self::Outbox>;

    /// Answers when the backend does, saying whether it takes writes: the
    /// health check. A backend that answers but takes none (a standby in
    /// recovery) would fail every claim and ack.
    fn ping(&self) -> impl Future<Output = Result<DbState, StoreError>> + Send;
}

/// What one sweep found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sweep {
    /// The cursor it checked below.
    pub cursor: i64,
    /// The `seq` of each claimable row below the cursor without a lease,
    /// now handed out again.
    pub found: Vec<i64>,
    /// Lease rows removed because their outbox row no longer exists.
    pub orphans: u64,
}

/// What [`Store::ping`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DbState {
    Writable,
    /// It answers but takes no writes, for the reason given (in recovery,
    /// read-only by a setting).
    ReadOnly(String),
}

/// One outbox's rows: the lease operations, bound to the outbox's table and
/// policy. A request's `outbox` name was resolved to this handle already.
pub trait OutboxStore: Clone + Send + Sync + 'static {
    /// The outbox this handle serves: name, table, policy.
    fn spec(&self) -> &OutboxSpec;

    /// Leases up to `max_messages` claimable rows under a fresh lease, in
    /// sequence order; rows past max attempts are dead-lettered on the way.
    fn claim(
        &self,
        req: &ClaimRequest,
    ) -> impl Future<Output = Result<ClaimedBatch, StoreError>> + Send;

    /// Marks rows published iff they still carry the lease.
    fn ack(&self, req: &AckRequest) -> impl Future<Output = Result<Settled, StoreError>> + Send;

    /// Releases rows for a retry after a delay, or dead-letters them.
    fn nack(&self, req: &NackRequest) -> impl Future<Output = Result<Settled, StoreError>> + Send;

    /// Moves the expiry of rows still under the lease.
    fn extend(
        &self,
        req: &ExtendRequest,
    ) -> impl Future<Output = Result<Settled, StoreError>> + Send;

    /// GetStats' counts and ages.
    fn stats(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send;

    /// `stats` without counting retained history, for the metrics sampler,
    /// which may read every pending row and so is no RPC's statement.
    fn gauges(&self) -> impl Future<Output = Result<Stats, StoreError>> + Send;

    /// Deletes up to `limit` published rows older than the retention; returns
    /// how many went, so the caller goes on while batches come back full.
    fn purge_published(&self, limit: u32) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// The claim cursor's check (`--claim-sweep-interval`): hands out the
    /// claimable rows the cursor has passed (none, unless it is wrong) and
    /// removes lease rows whose outbox row is gone.
    fn sweep(&self) -> impl Future<Output = Result<Sweep, StoreError>> + Send;
}

/// Operators' access to one outbox: what is dead-lettered or blocked, and
/// getting it moving again. Apart from [`OutboxStore`] because it serves a
/// different caller (OutboxAdmin, authorised apart from relay workers).
pub trait AdminStore: Send + Sync + 'static {
    /// Dead letters (not discarded) in sequence order, only `aggregate_id`'s
    /// when given.
    fn dead_letters(
        &self,
        aggregate_id: Option<&str>,
        page: PageRequest,
    ) -> impl Future<Output = Result<Page<DeadLetter>, StoreError>> + Send;

    /// Aggregates held back behind a dead-lettered head, in the order of the
    /// heads' sequence; none unless the outbox is ordered with poison=block.
    fn blocked_keys(
        &self,
        page: PageRequest,
    ) -> impl Future<Output = Result<Page<BlockedKey>, StoreError>> + Send;

    /// Makes the selected dead letters deliverable again (attempts reset,
    /// sequence kept); returns how many were.
    fn redrive(
        &self,
        selector: &RedriveSelector,
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Gives the named dead letters up for good; returns how many were.
    fn discard(&self, ids: &[MessageId]) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// One event whatever its state; `None` when the outbox holds no such id
    /// (never written, or deleted by retention or an ack with zero retention).
    fn inspect(
        &self,
        id: MessageId,
    ) -> impl Future<Output = Result<Option<InspectedMessage>, StoreError>> + Send;
}

/// How an outbox's new rows are noticed: by probing, from outboxd's side, so
/// that producers pay nothing on insert (see `watch`).
pub trait Arrivals: Send + Sync + 'static {
    /// Whether [`Arrivals::sequence`] sees inserts; if not, waiting claimers
    /// only re-check at the poll interval.
    fn probeable(&self) -> bool;

    /// A position that moves with every insert, taken at insert time: it may
    /// count rows whose transaction has not committed yet, or never will.
    fn sequence(&self) -> impl Future<Output = Result<i64, StoreError>> + Send;
}
