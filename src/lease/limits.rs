//! Server-side bounds on what clients may ask for. Their defaults are the
//! flags' (`outboxd --help`), defined there once; the constants here are the
//! bounds without a flag, and the byte limits the flags take as defaults.

use std::time::Duration;

/// Longest `retry_after` a Nack may ask for.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);

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
