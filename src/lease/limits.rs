//! Server-side bounds on what clients may ask for. Each default is named once
//! here, for `Limits::default()` and for whoever else needs it (flags, docs).

use std::time::Duration;

/// Largest batch a claim may ask for, and most ids per settle call.
pub const DEFAULT_MAX_BATCH: u32 = 1000;

/// The lease of a claim that does not ask for one.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// Shortest lease a client may ask for.
pub const DEFAULT_MIN_LEASE: Duration = Duration::from_secs(1);

/// Longest lease a client may ask for.
pub const DEFAULT_MAX_LEASE: Duration = Duration::from_secs(15 * 60);

/// Longest long poll; longer waits are shortened to it.
pub const DEFAULT_MAX_WAIT: Duration = Duration::from_secs(20);

/// Longest `retry_after` a Nack may ask for.
pub const DEFAULT_MAX_RETRY_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

/// 3 MiB of events: with the response's framing, well under the 4 MiB that
/// gRPC clients accept by default.
pub const DEFAULT_MAX_CLAIM_BYTES: u64 = 3 * 1024 * 1024;

/// 8 MiB: clients must raise their receive limit to take events this large
/// (the reference relay and the Python worker do); larger events belong in
/// object storage, with a reference in the event.
pub const DEFAULT_MAX_MESSAGE_BYTES: u64 = 8 * 1024 * 1024;

/// Longer Nack errors are cut here: it is a diagnostic, not a payload.
pub const MAX_ERROR_CHARS: usize = 8 * 1024;

/// Leases a ClaimBatch may ack on its way: a worker has one or two batches
/// settling at a time, and one call's database work stays bounded.
pub const MAX_CARRIED_ACKS: usize = 16;

/// Server-side bounds on what clients may ask for.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Upper bound of `max_messages`, and of ids per settle call.
    pub max_batch: u32,
    pub default_lease: Duration,
    pub min_lease: Duration,
    pub max_lease: Duration,
    /// Long-poll waits beyond this are shortened to it, not refused.
    pub max_wait: Duration,
    pub max_retry_after: Duration,
    /// A claim's response stays within this many bytes of events: below the
    /// 4 MiB gRPC clients accept by default.
    pub max_claim_bytes: u64,
    /// An event larger than this is dead-lettered instead of handed out; one
    /// larger than `max_claim_bytes` (and not this) goes out alone.
    pub max_message_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_batch: DEFAULT_MAX_BATCH,
            default_lease: DEFAULT_LEASE,
            min_lease: DEFAULT_MIN_LEASE,
            max_lease: DEFAULT_MAX_LEASE,
            max_wait: DEFAULT_MAX_WAIT,
            max_retry_after: DEFAULT_MAX_RETRY_AFTER,
            max_claim_bytes: DEFAULT_MAX_CLAIM_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}
