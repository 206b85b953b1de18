//! The claim cursor of an unordered outbox: a `seq` below which every
//! pending row is leased, delayed, settled or dead-lettered, so a fresh claim
//! walks the pending index from there instead of from the lowest pending row
//! (`queries/claim.sql`). Without it a claim steps over every row other
//! workers hold, probing the lease table for each, and its cost grows with
//! the leases held.
//!
//! The cursor moves to the end of what a claim saw covered, but never past
//! the commit-order guard's safe `seq` (`guard.rs`): a producer transaction
//! that drew a lower `seq` and commits late must still find the walk below
//! its row. Nothing else can leave a row unleased below it: a nack keeps its
//! lease row as a delay row, a row not yet due gets one when first walked, a
//! redrive writes one, and a crash or failover (which empties the lease
//! table) changes the outbox's epoch, which the claim statement checks before
//! it uses the cursor.
//!
//! The cursor lives in this replica's memory only: what it says is a fact of
//! the database, so every replica may hold its own, and one that starts or
//! loses it begins from the start.

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

/// How often the guard is probed while a claim found more beyond the safe
/// `seq` than the cursor could take: often enough that the cursor trails new
/// commits by a few milliseconds, seldom enough to stay a small share of the
/// claims' statements.
const PROBE_HELD: Duration = Duration::from_millis(5);

/// How often the guard is probed otherwise, so its safe `seq` keeps up.
const PROBE_IDLE: Duration = Duration::from_secs(1);

/// What a claim statement reported about its walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Walk {
    /// Every pending row up to this `seq` from the cursor on is covered now
    /// (`i64::MAX`: the walk ran out of rows); `None` when it read no fresh row.
    pub walked_to: Option<i64>,
    /// Whether the epoch the cursor was passed with still held.
    pub epoch_held: bool,
}

#[derive(Debug, Default)]
pub(super) struct ClaimCursor {
    /// Every pending row at or below this is covered, in `epoch`.
    at: i64,
    /// The epoch `at` holds for; `None` until a probe read one.
    epoch: Option<Uuid>,
    /// The last claim could have moved the cursor past the safe `seq`.
    held: bool,
    last_probe: Option<Instant>,
}

impl ClaimCursor {
    /// Whether the next claim should probe the commit-order guard first.
    pub fn wants_probe(&self, now: Instant) -> bool {
        let every = if self.held { PROBE_HELD } else { PROBE_IDLE };
        self.epoch.is_none()
            || self
                .last_probe
                .is_none_or(|at| now.saturating_duration_since(at) >= every)
    }

    /// A probe read the outbox's `epoch`: in another epoch than the
    /// cursor's, the cursor starts over.
    pub fn probed(&mut self, epoch: Option<Uuid>, now: Instant) {
        if epoch != self.epoch {
            self.at = 0;
            self.epoch = epoch;
        }
        self.last_probe = Some(now);
    }

    /// The cursor and the epoch to pass to a claim (the nil epoch, which no
    /// epoch row holds, when none is known: the walk starts at the start).
    pub fn position(&self) -> (i64, Uuid) {
        (self.at, self.epoch.unwrap_or(Uuid::nil()))
    }

    /// Takes a claim's walk in; `safe` is the guard's safe `seq` in the
    /// cursor's epoch.
    pub fn walked(&mut self, walk: Walk, safe: i64) {
        if !walk.epoch_held {
            // A crash or failover since the last probe: start over, and
            // probe before the next claim.
            *self = Self::default();
            return;
        }
        if let Some(to) = walk.walked_to {
            self.at = self.at.max(to.min(safe));
            self.held = to > safe;
        }
    }

    /// This replica's cursor, for the `outbox_claim_cursor` gauge.
    pub fn at(&self) -> i64 {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EPOCH: Uuid = Uuid::from_u128(7);

    fn walk(walked_to: Option<i64>) -> Walk {
        Walk {
            walked_to,
            epoch_held: true,
        }
    }

    #[test]
    fn the_cursor_never_passes_the_safe_seq() {
        let now = Instant::now();
        let mut cursor = ClaimCursor::default();
        assert!(cursor.wants_probe(now), "no epoch yet");
        cursor.probed(Some(EPOCH), now);
        assert_eq!(cursor.position(), (0, EPOCH));
        cursor.walked(walk(Some(100)), 40);
        assert_eq!(cursor.at(), 40, "held at the safe seq");
        assert!(cursor.held);
        assert!(cursor.wants_probe(now + PROBE_HELD));
        cursor.walked(walk(Some(i64::MAX)), 90);
        assert_eq!(cursor.at(), 90, "the walk ran out: up to the safe seq");
        cursor.walked(walk(Some(95)), 200);
        assert_eq!(cursor.at(), 95);
        assert!(!cursor.held);
        assert!(!cursor.wants_probe(now + PROBE_HELD));
        assert!(cursor.wants_probe(now + PROBE_IDLE));
    }

    #[test]
    fn the_cursor_never_goes_back_and_a_walk_without_fresh_rows_moves_nothing() {
        let now = Instant::now();
        let mut cursor = ClaimCursor::default();
        cursor.probed(Some(EPOCH), now);
        cursor.walked(walk(Some(50)), 100);
        cursor.walked(walk(Some(30)), 100);
        assert_eq!(cursor.at(), 50);
        cursor.walked(walk(None), 100);
        assert_eq!(cursor.at(), 50);
    }

    #[test]
    fn a_lost_epoch_starts_the_cursor_over() {
        let now = Instant::now();
        let mut cursor = ClaimCursor::default();
        cursor.probed(Some(EPOCH), now);
        cursor.walked(walk(Some(50)), 100);
        // The claim found the epoch row gone (a crash since the probe).
        cursor.walked(
            Walk {
                walked_to: Some(80),
                epoch_held: false,
            },
            100,
        );
        assert_eq!(cursor.position(), (0, Uuid::nil()));
        assert!(cursor.wants_probe(now));
        // A probe in a new epoch also starts it over.
        cursor.probed(Some(EPOCH), now);
        cursor.walked(walk(Some(60)), 100);
        cursor.probed(Some(Uuid::from_u128(8)), now);
        assert_eq!(cursor.position(), (0, Uuid::from_u128(8)));
    }
}
