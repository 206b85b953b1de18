//! What the database watchdog reads: who holds back the xmin horizon of the
//! database outboxd serves, and how each outbox table is kept (dead tuples,
//! vacuum). Plain values, so the task, the gauges and the admin RPC share them.

use std::time::Duration;

use chrono::{DateTime, Utc};

/// One sample of the database, read by the database clock at `read_at`.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseSample {
    pub read_at: DateTime<Utc>,
    /// This database's transactions holding a transaction id or a snapshot,
    /// oldest first (bounded; the sampling backend itself excluded).
    pub transactions: Vec<OpenTransaction>,
    /// Physical slots of the cluster and this database's logical ones.
    pub slots: Vec<ReplicationSlot>,
    /// This database's prepared transactions, oldest first (bounded).
    pub prepared: Vec<PreparedTransaction>,
    /// How many prepared transactions there are (`prepared` may be cut short).
    pub prepared_count: u64,
    /// One per outbox, in configuration order.
    pub tables: Vec<TableHealth>,
}

/// A transaction open in this database. Its query text is never read: it may
/// carry personal data, and the pid is enough to find and end it.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenTransaction {
    pub pid: i32,
    pub application_name: String,
    pub state: String,
    pub xact_start: DateTime<Utc>,
    pub age: Duration,
    /// How long it has been idle in transaction, when it is.
    pub idle_in_transaction: Option<Duration>,
    /// Holds a transaction id (it wrote): the kind the commit-order guard
    /// of an ordered outbox waits for.
    pub writer: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ReplicationSlot {
    pub name: String,
    /// `physical` or `logical`.
    pub slot_type: String,
    pub active: bool,
    /// The (32-bit) ids it holds, to tell a stuck slot from a moving one.
    pub xmin: Option<i64>,
    pub catalog_xmin: Option<i64>,
    /// `age(xmin)` in transactions, when the slot holds an xmin.
    pub xmin_age: Option<i64>,
    /// `age(catalog_xmin)` in transactions, when it holds a catalog xmin.
    pub catalog_xmin_age: Option<i64>,
    /// WAL kept for it: the current WAL position minus its `restart_lsn`.
    pub retained_wal_bytes: Option<i64>,
}

impl ReplicationSlot {
    /// Whether the slot holds back the xmin horizon (vacuum of the tables, or
    /// of the catalogue for a logical slot).
    pub fn holds_xmin(&self) -> bool {
        self.xmin_age.is_some() || self.catalog_xmin_age.is_some()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PreparedTransaction {
    pub gid: String,
    pub owner: String,
    pub prepared: DateTime<Utc>,
    pub age: Duration,
}

/// An outbox table's upkeep, from `pg_stat_user_tables` (updated by the
/// server asynchronously, so a little behind) and the relation sizes.
#[derive(Debug, Clone, PartialEq)]
pub struct TableHealth {
    pub outbox: String,
    pub dead_tuples: i64,
    pub live_tuples: i64,
    /// Since the later of its last autovacuum and last manual vacuum; `None`
    /// when it was never vacuumed (since its statistics were last reset).
    pub since_vacuum: Option<Duration>,
    /// Since the later of its last autoanalyze and last manual analyze.
    pub since_analyze: Option<Duration>,
    pub table_bytes: i64,
    pub index_bytes: i64,
}
