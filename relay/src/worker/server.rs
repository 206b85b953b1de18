//! outboxd as the slots see it: reachable or not, whether it applies the acks
//! a claim carries, and which of its refusals are worth retrying.

use std::sync::atomic::{AtomicBool, Ordering};

use tonic::{Code, Status};

/// outboxd's reachability as last reported, so each change is logged once, and
/// whether it applies the acks a claim carries.
#[derive(Debug)]
pub struct ServerLink {
    up: AtomicBool,
    ignores_carried_acks: AtomicBool,
}

impl Default for ServerLink {
    fn default() -> Self {
        // Assume up: the first failure is then a change worth a line.
        Self {
            up: AtomicBool::new(true),
            ignores_carried_acks: AtomicBool::new(false),
        }
    }
}

impl ServerLink {
    pub(super) fn up(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!("outboxd reachable again");
        }
    }

    pub(super) fn down(&self, status: &Status) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(code = ?status.code(), message = status.message(), "outboxd unavailable; retrying with backoff");
        }
    }

    /// A claim came back without results for the acks it carried: the server
    /// predates them and dropped the field unread.
    pub(super) fn ignored_carried_acks(&self) {
        if !self.ignores_carried_acks.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "outboxd ignores acks sent with a claim (an older server); acking with Ack calls"
            );
        }
    }

    pub(super) fn takes_carried_acks(&self) -> bool {
        !self.ignores_carried_acks.load(Ordering::Relaxed)
    }
}

/// Whether a failed call may succeed if made again (outboxd or the network
/// being briefly away), as opposed to a refusal that will repeat.
pub(super) fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Cancelled
            | Code::ResourceExhausted
            | Code::Aborted
    )
}
