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

/// The least a client may say it can receive (`max_response_bytes`): no
/// gRPC client's limit is lower, and below it hardly an event would fit.
pub const MIN_RESPONSE_BYTES: u32 = 64 * 1024;

/// What a response carries besides its events' measured sizes: the lease id,
/// its expiry, framing. Generous on purpose: a client refuses a response over
/// its limit whole, and the claim's attempts are spent all the same.
const RESPONSE_FRAME_BYTES: u64 = 4 * 1024;
/// Per event, on top of the 64 bytes the claim statement counts: its id,
/// timestamps, sequence and field tags.
const MESSAGE_FRAME_BYTES: u64 = 64;
/// Per id of a carried ack: its result in the same response.
const ACK_RESULT_BYTES: u64 = 256;

/// How many bytes of events one claim may hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimBudget {
    /// The batch's events together (one larger event may go alone).
    pub batch_bytes: u64,
    /// The largest event this client may be handed; a larger one (up to the
    /// server's `max_message_bytes`) is left for a client that can take it.
    pub event_bytes: u64,
}

impl Limits {
    /// The budget of a claim whose client receives at most
    /// `max_response_bytes` (0: the server's limits alone), asking for
    /// `max_messages` and carrying acks of `carried_ids` ids, whose results
    /// share the response.
    pub fn claim_budget(
        &self,
        max_response_bytes: u32,
        max_messages: u32,
        carried_ids: usize,
    ) -> ClaimBudget {
        let server = ClaimBudget {
            batch_bytes: self.max_claim_bytes,
            event_bytes: self.max_message_bytes,
        };
        if max_response_bytes == 0 {
            return server;
        }
        let carried = u64::try_from(carried_ids).unwrap_or(u64::MAX);
        let room = u64::from(max_response_bytes)
            .saturating_sub(RESPONSE_FRAME_BYTES)
            .saturating_sub(carried.saturating_mul(ACK_RESULT_BYTES));
        ClaimBudget {
            batch_bytes: server.batch_bytes.min(
                room.saturating_sub(u64::from(max_messages).saturating_mul(MESSAGE_FRAME_BYTES)),
            ),
            // The statement adds 64 to each event it counts in the batch.
            event_bytes: server
                .event_bytes
                .min(room.saturating_sub(MESSAGE_FRAME_BYTES + 64)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            max_batch: 1000,
            default_lease: Duration::from_secs(30),
            min_lease: Duration::from_secs(1),
            max_lease: Duration::from_secs(900),
            max_wait: Duration::from_secs(20),
            max_retry_after: MAX_RETRY_AFTER,
            max_claim_bytes: DEFAULT_MAX_CLAIM_BYTES,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        }
    }

    #[test]
    fn no_client_limit_leaves_the_servers() {
        let budget = limits().claim_budget(0, 100, 5);
        assert_eq!(budget.batch_bytes, DEFAULT_MAX_CLAIM_BYTES);
        assert_eq!(budget.event_bytes, DEFAULT_MAX_MESSAGE_BYTES);
    }

    #[test]
    fn a_stock_clients_four_mib_takes_no_event_it_would_refuse() {
        let four_mib = 4 * 1024 * 1024;
        let budget = limits().claim_budget(four_mib, 100, 0);
        assert_eq!(
            budget.batch_bytes, DEFAULT_MAX_CLAIM_BYTES,
            "3 MiB fits in 4"
        );
        assert!(budget.event_bytes < u64::from(four_mib) - 4096);
        assert!(budget.event_bytes > 4 * 1024 * 1024 - 8192);
        // Carried acks' results take room from the events.
        let carrying = limits().claim_budget(four_mib, 100, 1000);
        assert_eq!(carrying.event_bytes, budget.event_bytes - 1000 * 256);
        // A limit larger than the server's changes nothing.
        assert_eq!(
            limits().claim_budget(64 * 1024 * 1024, 1000, 0),
            limits().claim_budget(0, 1000, 0)
        );
        // A tiny one leaves no room rather than wrapping around.
        let tiny = limits().claim_budget(MIN_RESPONSE_BYTES, 1000, 16_000);
        assert_eq!((tiny.batch_bytes, tiny.event_bytes), (0, 0));
    }
}
