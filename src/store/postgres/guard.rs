//! The commit-order guard of an ordered outbox: up to which `seq` an ordered
//! claim may hand out fresh events.
//!
//! `seq` is drawn at insert time, not at commit time. While a transaction that
//! drew a low `seq` for aggregate A is still open, a later event of A may
//! already be committed and look like A's head; handing it out would put it
//! before its predecessor. An event is safe once every transaction that could
//! still commit a lower `seq` has ended.
//!
//! The guard learns that from probes, each one statement: the sequence's last
//! value `L` and the transaction ids of its snapshot. A value read at one probe
//! was drawn by a transaction that (a moment later, when its row is written)
//! holds an id below the `xmax` of any snapshot taken after that moment; once
//! the oldest running transaction (`xmin`) is past that `xmax`, all of them
//! have ended, and every `seq` up to `L` is either visible or never will be.
//! So a read is paired with the `xmax` of a probe at least [`GRACE`] later
//! (the moment between drawing a value and writing the row), and the pair
//! becomes safe when `xmin` passes its `xmax`. Unlike comparing each row's own
//! transaction id with `xmin`, this also holds when the later event's
//! transaction got its id first.
//!
//! A transaction that stays open (in any database of the server: snapshots
//! are cluster-wide) holds new ordered events back for as long; [`holdback`]
//! says how long, for the `outbox_commit_order_holdback_seconds` gauge. Events
//! handed out once, and expired leases, are not held. The guard starts from
//! nothing: after a restart, the first events wait for the transactions open
//! at that time.
//!
//! [`holdback`]: CommitOrderGuard::holdback

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;

/// How long after a sequence read a snapshot is trusted to include the id of
/// every transaction that drew a value up to it: a producer's INSERT draws
/// `seq` a moment before it writes the row and gets its transaction id.
/// An INSERT held longer in between (a slow BEFORE trigger, an ON CONFLICT
/// waiting for another transaction) is not covered.
pub(super) const GRACE: Duration = Duration::from_millis(2);

/// Bounds on the state kept between probes. Dropping a read or a waiting pair
/// only delays events (a later pair covers them), never lets one through early.
const MAX_READS: usize = 64;
const MAX_WAITING: usize = 256;

/// What one probe read.
#[derive(Debug, Clone, Copy)]
pub(super) struct Probe {
    /// The sequence's last value, read after the snapshot was taken.
    pub last_value: i64,
    /// The snapshot's oldest running transaction id (its `xmax` when none runs).
    pub xmin: i64,
    /// The snapshot's first transaction id not yet assigned.
    pub xmax: i64,
    /// When the probe was sent, before its snapshot was taken.
    pub sent: Instant,
    /// When its answer arrived, after the sequence was read.
    pub answered: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// Every `seq` up to this is safe once `xmin` passes `xmax`.
    upto: i64,
    xmax: i64,
    since: Instant,
}

#[derive(Debug, Default)]
pub(super) struct CommitOrderGuard {
    /// Every event at or below this `seq` is visible or never will be.
    safe: i64,
    /// Sequence values read, oldest first, with when they were read.
    reads: VecDeque<(i64, Instant)>,
    /// Pairs waiting for older transactions to end, oldest first.
    waiting: VecDeque<Waiting>,
}

impl CommitOrderGuard {
    /// Takes one probe in; returns the `seq` up to which fresh events may go.
    pub fn observe(&mut self, probe: Probe) -> i64 {
        while let Some(w) = self.waiting.front().copied() {
            if w.xmax > probe.xmin {
                break;
            }
            self.safe = self.safe.max(w.upto);
            self.waiting.pop_front();
        }
        // The newest read old enough to pair with this snapshot.
        let ripe = self
            .reads
            .iter()
            .rposition(|(_, at)| probe.sent.saturating_duration_since(*at) >= GRACE);
        if let Some(index) = ripe {
            let (upto, at) = self.reads[index];
            self.reads.drain(..=index);
            if upto > self.safe {
                if probe.xmax <= probe.xmin {
                    // Nothing was running when the snapshot was taken.
                    self.safe = upto;
                    self.waiting.retain(|w| w.upto > upto);
                } else {
                    self.wait(Waiting {
                        upto,
                        xmax: probe.xmax,
                        since: at,
                    });
                }
            }
        }
        if self.reads.len() == MAX_READS {
            self.reads.pop_front();
        }
        self.reads.push_back((probe.last_value, probe.answered));
        self.safe
    }

    fn wait(&mut self, pair: Waiting) {
        if let Some(last) = self.waiting.back_mut()
            && last.xmax >= pair.xmax
        {
            last.upto = last.upto.max(pair.upto);
            return;
        }
        if self.waiting.len() == MAX_WAITING {
            // Keep the oldest (what is due first) and the newest (what covers
            // the most); the one dropped is covered by the newest.
            let at = self.waiting.len() - 1;
            self.waiting.remove(at);
        }
        self.waiting.push_back(pair);
    }

    /// Whether the sequence has gone past what is known safe: events may be
    /// waiting for the guard (or only for a grace to pass).
    pub fn behind(&self) -> bool {
        self.reads.back().is_some_and(|(read, _)| *read > self.safe)
    }

    /// How long fresh events have been held back for open transactions: the
    /// age of the oldest sequence read that is not yet safe.
    pub fn holdback(&self, now: Instant) -> Duration {
        self.waiting
            .front()
            .map_or(Duration::ZERO, |w| now.saturating_duration_since(w.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(t0: Instant, ms: u64, last_value: i64, xmin: i64, xmax: i64) -> Probe {
        let at = t0 + Duration::from_millis(ms);
        Probe {
            last_value,
            xmin,
            xmax,
            sent: at,
            answered: at,
        }
    }

    #[test]
    fn a_read_is_safe_after_the_grace_when_nothing_runs() {
        let t0 = Instant::now();
        let mut guard = CommitOrderGuard::default();
        assert!(!guard.behind());
        assert_eq!(guard.observe(probe(t0, 0, 10, 100, 100)), 0, "too fresh");
        assert!(guard.behind());
        assert_eq!(
            guard.observe(probe(t0, 1, 12, 100, 100)),
            0,
            "still too fresh"
        );
        assert_eq!(guard.observe(probe(t0, 3, 15, 100, 100)), 12);
        assert_eq!(guard.observe(probe(t0, 6, 15, 100, 100)), 15);
        assert!(!guard.behind());
        assert_eq!(
            guard.holdback(t0 + Duration::from_millis(6)),
            Duration::ZERO
        );
    }

    #[test]
    fn an_open_transaction_holds_reads_until_it_ends() {
        let t0 = Instant::now();
        let mut guard = CommitOrderGuard::default();
        // Transaction 90 stays open: xmin 90 while the counter moves on.
        guard.observe(probe(t0, 0, 10, 90, 100));
        assert_eq!(guard.observe(probe(t0, 5, 20, 90, 105)), 0);
        assert_eq!(guard.observe(probe(t0, 10, 30, 90, 110)), 0);
        assert_eq!(
            guard.holdback(t0 + Duration::from_millis(10)),
            Duration::from_millis(10),
            "held since the first read"
        );
        // 90 ends, but 104 had its id before the snapshot the first read is
        // paired with (xmax 105), so it may hold a value up to 10: wait.
        assert_eq!(guard.observe(probe(t0, 15, 40, 104, 115)), 0);
        // 104 ends; 107 (after that snapshot) does not hold the first read back.
        assert_eq!(guard.observe(probe(t0, 20, 40, 107, 118)), 10);
        // Everything ends: every read old enough is safe at once.
        assert_eq!(guard.observe(probe(t0, 25, 40, 120, 120)), 40);
        assert_eq!(
            guard.holdback(t0 + Duration::from_millis(25)),
            Duration::ZERO
        );
    }

    #[test]
    fn the_safe_bound_never_goes_back_and_state_stays_bounded() {
        let t0 = Instant::now();
        let mut guard = CommitOrderGuard::default();
        let mut safe = 0;
        for i in 0..10_000u64 {
            // xmin stuck at 1: nothing ever becomes safe, state must not grow.
            let seen = guard.observe(probe(t0, i * 3, i as i64, 1, 2 + i as i64));
            assert!(seen >= safe);
            safe = seen;
        }
        assert_eq!(safe, 0);
        assert!(guard.reads.len() <= MAX_READS && guard.waiting.len() <= MAX_WAITING);
        // Once the horizon passes everything, the newest pair frees it all.
        let last = guard.observe(probe(t0, 40_000, 20_000, 1_000_000, 1_000_000));
        assert_eq!(last, 9_999);
    }
}
