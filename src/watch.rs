//! Wakes long-polling claimers by probing an outbox table's sequence, so that
//! nothing runs on the producers' insert path: their commit rate does not
//! depend on outboxd. (Any trigger on the table cost one-row producers about
//! 17 % of their commits/s in pgbench, even one that did not notify; notifying
//! transactions commit one at a time.) A probe is one read-only statement that
//! touches no table (`pg_sequence_last_value`).
//!
//! One watcher per outbox:
//!
//! - **nobody waits**: it does not probe at all; a claimer whose claim came
//!   back empty and that starts to wait
//!   wakes it, and it probes at once (never sooner than `probe_interval` after
//!   the last probe);
//! - **claimers wait**: it probes every `probe_interval` while the sequence
//!   moved within the last [`BUSY_FOR`], every [`QUIET_PROBE`] after that, and
//!   wakes waiters for as many rows as the sequence moved by.
//!
//! The sequence moves at insert time, so a probe can count an insert whose
//! transaction has not committed yet, or never will: the woken claim then comes
//! back empty and re-checks shortly (see `service`). A move seen while nobody
//! waited stays owed until someone does.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    service::Outbox,
    store::{Arrivals, OutboxStore, StoreError},
    wakeup::Waiters,
};

/// How long after its last move the sequence counts as busy, probed every
/// `probe_interval`.
const BUSY_FOR: Duration = Duration::from_secs(1);

/// Probe period while claimers wait on a quiet table: the wake-up latency of
/// the first insert after a quiet spell, traded against statements on an idle
/// database. 20 ms is far below any poll interval, and 50 trivial statements a
/// second per outbox, only while somebody long-polls; 2 ms would be 500.
/// Also the back-off after a database error.
const QUIET_PROBE: Duration = Duration::from_millis(20);

/// Watches `outbox` until `cancel`. A zero `probe_interval` runs no watcher:
/// waiting claimers then re-check every poll interval only.
pub async fn watch<S: OutboxStore + Arrivals>(
    outbox: Outbox<S>,
    probe_interval: Duration,
    cancel: CancellationToken,
) {
    watch_arrivals(
        &outbox.store,
        &outbox.waiters,
        outbox.name(),
        probe_interval,
        &cancel,
    )
    .await;
}

async fn watch_arrivals<S: Arrivals>(
    store: &S,
    waiters: &Waiters,
    outbox: &str,
    probe_interval: Duration,
    cancel: &CancellationToken,
) {
    if probe_interval.is_zero() {
        tracing::info!(
            outbox,
            "--probe-interval is 0: waiting claimers re-check every --poll-interval"
        );
        return;
    }
    if !store.probeable() {
        tracing::info!(
            outbox,
            "seq is not an identity column with an uncached sequence: waiting claimers re-check every --poll-interval"
        );
        return;
    }
    let mut watcher = Watcher {
        store,
        waiters,
        outbox,
        probe_interval,
        seen: None,
        woken: 0,
        moved_at: None,
        probed_at: None,
        failing: false,
    };
    watcher.run(cancel).await;
}

struct Watcher<'a, S> {
    store: &'a S,
    waiters: &'a Waiters,
    /// The outbox's name, for logs.
    outbox: &'a str,
    probe_interval: Duration,
    /// The last value probed; none before the first probe that answered.
    seen: Option<i64>,
    /// How far waiters were woken for; `seen` beyond it is owed to the next.
    woken: i64,
    /// When a probe last found the sequence moved.
    moved_at: Option<Instant>,
    /// When the last probe ran, answered or not: the next is timed from it.
    probed_at: Option<Instant>,
    /// Whether the last probe failed (only the first of a run is logged).
    failing: bool,
}

impl<S: Arrivals> Watcher<'_, S> {
    async fn run(&mut self, cancel: &CancellationToken) {
        loop {
            let gap = if self.probed_at.is_none() {
                // The first probe, at once: the point from which moves count.
                Duration::ZERO
            } else if self.waiters.waiting() == 0 {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = self.waiters.parked() => {}
                }
                self.least_gap()
            } else {
                self.period()
            };
            if let Some(at) = self.probed_at.map(|t| t + gap)
                && at > Instant::now()
            {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep_until(at) => {}
                }
            }
            let probed = self.store.sequence().await;
            let now = Instant::now();
            self.probed_at = Some(now);
            match probed {
                Ok(value) => {
                    self.failing = false;
                    self.observe(value, now);
                }
                Err(err) => self.report(&err),
            }
        }
    }

    /// Wakes waiters for what the sequence moved by since they were last woken.
    fn observe(&mut self, value: i64, now: Instant) {
        match self.seen {
            None => self.woken = value,
            Some(seen) if value > seen => self.moved_at = Some(now),
            // Reset (ALTER SEQUENCE ... RESTART): count from here.
            Some(seen) if value < seen => self.woken = value,
            Some(_) => {}
        }
        self.seen = Some(value);
        if value > self.woken && self.waiters.notify(value.abs_diff(self.woken)) > 0 {
            self.woken = value;
        }
    }

    /// The probe period while claimers wait.
    fn period(&self) -> Duration {
        let busy = self.moved_at.is_some_and(|at| at.elapsed() < BUSY_FOR);
        if busy && !self.failing {
            self.probe_interval
        } else {
            QUIET_PROBE.max(self.probe_interval)
        }
    }

    /// The least time between two probes, however often claimers register.
    fn least_gap(&self) -> Duration {
        if self.failing {
            QUIET_PROBE.max(self.probe_interval)
        } else {
            self.probe_interval
        }
    }

    /// Logs the first failure of a run of them, not one every 20 ms.
    fn report(&mut self, err: &StoreError) {
        if !std::mem::replace(&mut self.failing, true) {
            tracing::warn!(
                outbox = self.outbox,
                error = %err,
                "cannot probe the outbox sequence; waiting claimers re-check every --poll-interval until it answers"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{
        Arc,
        atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering},
    };

    use tokio::task::JoinHandle;

    use super::*;

    /// A sequence the test moves by hand, counting the probes it answers.
    #[derive(Debug, Default)]
    struct FakeSequence {
        value: AtomicI64,
        probes: AtomicUsize,
        failing: AtomicBool,
        unprobeable: bool,
    }

    impl FakeSequence {
        fn advance(&self, rows: i64) {
            self.value.fetch_add(rows, Ordering::SeqCst);
        }

        fn probes(&self) -> usize {
            self.probes.load(Ordering::SeqCst)
        }
    }

    impl Arrivals for Arc<FakeSequence> {
        fn probeable(&self) -> bool {
            !self.unprobeable
        }

        async fn sequence(&self) -> Result<i64, StoreError> {
            self.probes.fetch_add(1, Ordering::SeqCst);
            if self.failing.load(Ordering::SeqCst) {
                return Err(StoreError::Unavailable("connection refused".into()));
            }
            Ok(self.value.load(Ordering::SeqCst))
        }
    }

    const PROBE_INTERVAL: Duration = Duration::from_millis(2);

    struct Running {
        seq: Arc<FakeSequence>,
        waiters: Arc<Waiters>,
        cancel: CancellationToken,
        task: JoinHandle<()>,
    }

    impl Running {
        fn start(seq: FakeSequence, probe_interval: Duration) -> Self {
            let (seq, waiters, cancel) = (Arc::new(seq), Waiters::new(), CancellationToken::new());
            let task = tokio::spawn({
                let (seq, waiters, cancel) = (seq.clone(), waiters.clone(), cancel.clone());
                async move {
                    watch_arrivals(&seq, &waiters, "test", probe_interval, &cancel).await;
                }
            });
            Self {
                seq,
                waiters,
                cancel,
                task,
            }
        }

        /// Probes in the next `period`.
        async fn probes_during(&self, period: Duration) -> usize {
            let before = self.seq.probes();
            tokio::time::sleep(period).await;
            self.seq.probes() - before
        }

        async fn stop(self) {
            self.cancel.cancel();
            self.task.await.expect("the watcher stops when cancelled");
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// A claimer whose claim came back empty, waiting.
    fn parked(waiters: &Arc<Waiters>, capacity: u32) -> crate::wakeup::Registration {
        let registration = waiters.register(capacity);
        registration.park();
        registration
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_probed_while_nobody_waits() {
        let w = Running::start(FakeSequence::default(), PROBE_INTERVAL);
        tokio::time::sleep(ms(1)).await;
        assert_eq!(
            w.seq.probes(),
            1,
            "one probe at start, where moves count from"
        );
        w.seq.advance(5);
        assert_eq!(w.probes_during(Duration::from_secs(10)).await, 0);
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_claimer_that_starts_to_wait_is_probed_for_at_once_and_woken_for_rows_since_the_last_probe()
     {
        let w = Running::start(FakeSequence::default(), PROBE_INTERVAL);
        tokio::time::sleep(Duration::from_secs(1)).await;
        w.seq.advance(3);
        let mut claimer = parked(&w.waiters, 10);
        tokio::time::timeout(ms(1), claimer.woken())
            .await
            .expect("woken by the probe its wait set off");
        assert_eq!(w.seq.probes(), 2);
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_moving_sequence_is_probed_every_probe_interval_and_a_quiet_one_every_20_ms() {
        let w = Running::start(FakeSequence::default(), PROBE_INTERVAL);
        // Plenty of waiters of one row each, so that moves never empty the queue.
        let _claimers: Vec<_> = (0..1000).map(|_| parked(&w.waiters, 1)).collect();
        let mover = tokio::spawn({
            let seq = w.seq.clone();
            async move {
                for _ in 0..50 {
                    tokio::time::sleep(ms(10)).await;
                    seq.advance(1);
                }
            }
        });
        tokio::time::sleep(ms(100)).await;
        let busy = w.probes_during(ms(400)).await;
        assert!((195..=205).contains(&busy), "{busy} probes in 400 ms");
        mover.await.expect("mover");
        assert_eq!(w.waiters.waiting(), 950, "one waiter woken per row");

        // Still busy for a second after the last move, then quiet.
        tokio::time::sleep(ms(1100)).await;
        let quiet = w.probes_during(Duration::from_secs(1)).await;
        assert!(
            (49..=51).contains(&quiet),
            "{quiet} probes in a quiet second"
        );

        // The first move after the quiet spell is seen within 20 ms, and busy
        // probing resumes.
        w.seq.advance(1);
        tokio::time::sleep(ms(20)).await;
        assert_eq!(w.waiters.waiting(), 949);
        let busy = w.probes_during(ms(100)).await;
        assert!((49..=51).contains(&busy), "{busy} probes in 100 ms");
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_move_wakes_as_many_waiters_as_it_has_rows_for() {
        let w = Running::start(FakeSequence::default(), PROBE_INTERVAL);
        let _small: Vec<_> = (0..5).map(|_| parked(&w.waiters, 1)).collect();
        tokio::time::sleep(ms(50)).await;
        w.seq.advance(2);
        tokio::time::sleep(ms(25)).await;
        assert_eq!(w.waiters.waiting(), 3);
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_move_seen_while_nobody_waited_is_owed_to_the_next_claimer() {
        let w = Running::start(FakeSequence::default(), PROBE_INTERVAL);
        tokio::time::sleep(ms(10)).await;
        w.seq.advance(4);
        // A claimer that comes and goes before the probe it set off.
        drop(parked(&w.waiters, 10));
        tokio::time::sleep(ms(10)).await;
        assert_eq!(w.seq.probes(), 2, "the wait was probed for");

        let mut next = parked(&w.waiters, 10);
        tokio::time::timeout(ms(5), next.woken())
            .await
            .expect("the next claimer is woken for the rows owed");
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn database_errors_back_off_to_the_quiet_period_and_probing_recovers() {
        let w = Running::start(FakeSequence::default(), PROBE_INTERVAL);
        tokio::time::sleep(ms(1)).await;
        let mut claimer = parked(&w.waiters, 1);
        w.seq.advance(1);
        w.seq.failing.store(true, Ordering::SeqCst);
        let failed = w.probes_during(Duration::from_secs(1)).await;
        assert!(
            (49..=51).contains(&failed),
            "{failed} failed probes in a second"
        );

        w.seq.failing.store(false, Ordering::SeqCst);
        tokio::time::timeout(ms(25), claimer.woken())
            .await
            .expect("woken once the database answers again");
        w.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn no_watcher_runs_with_a_zero_probe_interval_or_an_unprobeable_sequence() {
        for (seq, interval) in [
            (FakeSequence::default(), Duration::ZERO),
            (
                FakeSequence {
                    unprobeable: true,
                    ..FakeSequence::default()
                },
                PROBE_INTERVAL,
            ),
        ] {
            let w = Running::start(seq, interval);
            let _claimer = parked(&w.waiters, 1);
            tokio::time::timeout(ms(1), w.task)
                .await
                .expect("the watcher returns at once")
                .expect("watcher");
            assert_eq!(w.seq.probes(), 0);
        }
    }
}
