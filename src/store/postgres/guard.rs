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
//! value `L`, and the ids of the transactions running in the database: the
//! oldest (`xmin`) and one past the newest (`xmax`). A value read at one probe
//! was drawn by a transaction that, a moment later (when it writes its row),
//! holds an id and so is among the running ones of any probe after that
//! moment, below that probe's `xmax`; once `xmin` is past that `xmax`, all of
//! them have ended, and every `seq` up to `L` is either visible or never will
//! be. So a read is paired with the `xmax` of a probe at least [`GRACE`]
//! later (the moment between drawing a value and writing the row), and the
//! pair becomes safe when `xmin` passes its `xmax`. Unlike comparing each
//! row's own transaction id with the oldest running one, this also holds when
//! the later event's transaction got its id first.
//!
//! One kind of transaction gets its id late: an `INSERT … ON CONFLICT` that
//! drew its `seq` and then waits for the transaction holding the same key
//! (the idempotent producer's retry). It has no id while it waits, so it is
//! in no snapshot's running set, and when it goes on its id is past every
//! pair's `xmax`. So a pair also waits for every transaction that began
//! before its read and still runs with an id or waits on a lock
//! (`oldest_start`, compared on the database's clock).
//!
//! `xmin` is taken over this database's transactions only (and its prepared
//! ones): a transaction elsewhere on the server cannot insert here. One that
//! stays open in this database holds new ordered events back for as long,
//! whatever it writes; [`holdback`]
//! says how long, for the `outbox_commit_order_holdback_seconds` gauge. Events
//! handed out once, and expired leases, are not held. The guard starts from
//! nothing: after a restart, the first events wait for the transactions open
//! at that time.
//!
//! The guard's state holds only for the life of the database it was read
//! from. A crash loses sequence values drawn by transactions whose WAL was
//! not yet flushed, a failover those not yet replicated: the sequence goes
//! back below what the guard called safe. Each probe reads the outbox's epoch
//! (an unlogged row that crash recovery empties), and the guard starts from
//! nothing whenever it changes ([`CommitOrderGuard::observe`]).
//!
//! [`holdback`]: CommitOrderGuard::holdback

use std::{collections::VecDeque, time::Duration};

use tokio::time::Instant;
use uuid::Uuid;

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
    /// The oldest transaction id running in the database (`xmax` when none runs).
    pub xmin: i64,
    /// One past the newest transaction id running in the database (the
    /// snapshot's xmax when none runs).
    pub xmax: i64,
    /// When the oldest transaction that may still insert began (database
    /// clock, microseconds): one with an id, or one waiting on a lock.
    pub oldest_start: Option<i64>,
    /// When the sequence was read (database clock, microseconds).
    pub read_at: i64,
    /// The outbox's epoch as the probe found (or stamped) it; `None` when
    /// another replica stamped it meanwhile.
    pub epoch: Option<Uuid>,
    /// When the probe was sent, before its snapshot was taken.
    pub sent: Instant,
    /// When its answer arrived, after the sequence was read.
    pub answered: Instant,
}

impl Probe {
    /// Whether a transaction that began at or before `read_at` may still
    /// insert.
    fn older_runs(&self, read_at: i64) -> bool {
        self.oldest_start.is_some_and(|start| start <= read_at)
    }
}

/// A sequence value read, with when (both clocks).
#[derive(Debug, Clone, Copy)]
struct Read {
    value: i64,
    at: Instant,
    db_at: i64,
}

#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// Every `seq` up to this is safe once `xmin` passes `xmax` and no
    /// transaction that began by `read_at` runs.
    upto: i64,
    xmax: i64,
    read_at: i64,
    since: Instant,
}

#[derive(Debug, Default)]
pub(super) struct CommitOrderGuard {
    /// The epoch the state below was read in.
    epoch: Option<Uuid>,
    /// Every event at or below this `seq` is visible or never will be.
    safe: i64,
    /// Sequence values read, oldest first.
    reads: VecDeque<Read>,
    /// Pairs waiting for older transactions to end, oldest first.
    waiting: VecDeque<Waiting>,
    /// How many times the epoch changed under a running guard.
    resets: u64,
}

impl CommitOrderGuard {
    /// Takes one probe in; returns the `seq` up to which fresh events may go.
    /// A probe from another epoch than the state's (a crash or failover in
    /// between, or the first stamp) starts the guard over first.
    pub fn observe(&mut self, probe: Probe) -> i64 {
        if probe.epoch != self.epoch {
            let started = self.epoch.is_some();
            *self = Self {
                epoch: probe.epoch,
                resets: self.resets + u64::from(started),
                ..Self::default()
            };
        }
        while let Some(w) = self.waiting.front().copied() {
            if w.xmax > probe.xmin || probe.older_runs(w.read_at) {
                break;
            }
            self.safe = self.safe.max(w.upto);
            self.waiting.pop_front();
        }
        // The newest read old enough to pair with this snapshot.
        let ripe = self
            .reads
            .iter()
            .rposition(|read| probe.sent.saturating_duration_since(read.at) >= GRACE);
        if let Some(index) = ripe {
            let read = self.reads[index];
            self.reads.drain(..=index);
            if read.value > self.safe {
                if probe.xmax <= probe.xmin && !probe.older_runs(read.db_at) {
                    // Nothing that could insert was running when the
                    // snapshot was taken.
                    self.safe = read.value;
                    self.waiting.retain(|w| w.upto > read.value);
                } else {
                    self.wait(Waiting {
                        upto: read.value,
                        xmax: probe.xmax,
                        read_at: read.db_at,
                        since: read.at,
                    });
                }
            }
        }
        if self.reads.len() == MAX_READS {
            self.reads.pop_front();
        }
        self.reads.push_back(Read {
            value: probe.last_value,
            at: probe.answered,
            db_at: probe.read_at,
        });
        self.safe
    }

    fn wait(&mut self, pair: Waiting) {
        if let Some(last) = self.waiting.back_mut()
            && last.xmax >= pair.xmax
            && last.read_at >= pair.read_at
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
        self.reads.back().is_some_and(|read| read.value > self.safe)
    }

    /// Every event at or below this `seq` is visible or never will be.
    pub fn safe(&self) -> i64 {
        self.safe
    }

    /// How many times a crash or failover made the guard start over.
    pub fn resets(&self) -> u64 {
        self.resets
    }

    /// The epoch the guard's state was read in.
    pub fn epoch(&self) -> Option<Uuid> {
        self.epoch
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

    const EPOCH: Uuid = Uuid::from_u128(1);

    fn probe(t0: Instant, ms: u64, last_value: i64, xmin: i64, xmax: i64) -> Probe {
        let at = t0 + Duration::from_millis(ms);
        Probe {
            last_value,
            xmin,
            xmax,
            oldest_start: None,
            read_at: db_clock(ms),
            epoch: Some(EPOCH),
            sent: at,
            answered: at,
        }
    }

    /// The database's clock at `ms` into a test, in microseconds.
    fn db_clock(ms: u64) -> i64 {
        1_000_000_000 + i64::try_from(ms).expect("small") * 1000
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

    /// The idempotent producer's retry: T2's `INSERT … ON CONFLICT` drew seq
    /// 2 and waits for T1 without an id; T3 committed seq 3. When T1 rolls
    /// back, T2 takes an id past every pair's xmax and inserts seq 2: seq 3
    /// must wait for T2 to end.
    #[test]
    fn an_insert_waiting_on_a_lock_without_an_id_holds_reads_back() {
        let t0 = Instant::now();
        let mut guard = CommitOrderGuard::default();
        let t2_began = Some(db_clock(0));
        // T1 (id 100) runs, T2 waits on it.
        let mut p = probe(t0, 1, 3, 100, 101);
        p.oldest_start = t2_began;
        guard.observe(p);
        let mut p = probe(t0, 5, 3, 100, 101);
        p.oldest_start = t2_began;
        assert_eq!(guard.observe(p), 0, "T1 still runs");
        // T1 rolled back; T2 waits no more and holds id 105, after every
        // snapshot paired so far: the ids alone would let seq 3 through.
        let mut p = probe(t0, 10, 3, 105, 106);
        p.oldest_start = t2_began;
        assert_eq!(guard.observe(p), 0, "T2 began before the read and runs");
        // T2 committed.
        assert_eq!(guard.observe(probe(t0, 15, 3, 106, 106)), 3);
    }

    #[test]
    fn a_transaction_that_began_after_the_read_does_not_hold_it() {
        let t0 = Instant::now();
        let mut guard = CommitOrderGuard::default();
        guard.observe(probe(t0, 0, 10, 100, 100));
        let mut p = probe(t0, 5, 12, 100, 100);
        // A lock waiter that began after the first read (at 0 ms).
        p.oldest_start = Some(db_clock(3));
        assert_eq!(guard.observe(p), 10);
    }

    /// After a crash the sequence restarts below what was safe; the guard
    /// must not carry its bound into the new epoch.
    #[test]
    fn a_new_epoch_starts_the_guard_over() {
        let t0 = Instant::now();
        let mut guard = CommitOrderGuard::default();
        guard.observe(probe(t0, 0, 401, 100, 100));
        assert_eq!(guard.observe(probe(t0, 5, 401, 100, 100)), 401);
        assert_eq!(guard.resets(), 0, "the first epoch is no reset");
        // Crash: the epoch row is gone and stamped anew; 397 is open.
        let mut p = probe(t0, 10, 398, 50, 51);
        p.epoch = Some(Uuid::from_u128(2));
        assert_eq!(guard.observe(p), 0, "nothing is safe in the new epoch yet");
        assert_eq!(guard.resets(), 1);
        assert_eq!(guard.epoch(), Some(Uuid::from_u128(2)));
        let mut p = probe(t0, 15, 398, 50, 52);
        p.epoch = Some(Uuid::from_u128(2));
        assert_eq!(guard.observe(p), 0, "397's transaction still runs");
        // A probe that found the epoch stamped by another replica meanwhile.
        let mut p = probe(t0, 20, 398, 60, 60);
        p.epoch = None;
        assert_eq!(guard.observe(p), 0);
        assert_eq!(guard.resets(), 2);
    }
}
