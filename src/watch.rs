//! Wakes long-polling claimers from an outbox table's sequence while inserts
//! keep arriving, so that producers need not NOTIFY.
//!
//! PostgreSQL serializes the commits of notifying transactions: each holds a
//! database-wide lock from before its commit until after its WAL flush, so
//! one-event transactions commit one fsync at a time. Notifications are worth
//! that only when inserts are rare. So a watcher runs per outbox:
//!
//! - **idle**: it waits for a notification (or the poll tick finds the sequence
//!   moved). The trigger notifies; nothing is probed.
//! - **busy**: it marks the table quiet (the trigger then skips `pg_notify`),
//!   renews the mark while the sequence keeps moving, and probes the sequence
//!   every `probe_interval` while claimers wait, waking them for the rows it
//!   moved by (notifications then wake nobody, so no waiter is woken twice).
//!   After [`IDLE_AFTER`] without an insert it stops renewing; once the mark
//!   has run out it lets notifications wake waiters again and probes one last
//!   time: an insert that skipped NOTIFY under the mark moved the sequence
//!   before that probe.
//!
//! A probe can see an insert whose transaction has not committed yet; the woken
//! claim then comes back empty and re-checks shortly (see `service`).

use std::{sync::Arc, time::Duration};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{store::PgStore, wakeup::Wakeup};

/// How long one quiet mark lasts; renewed at half-life while busy.
const MARK: Duration = Duration::from_secs(1);
/// Without an insert for this long, the watcher lets the mark run out.
const IDLE_AFTER: Duration = Duration::from_secs(1);
/// Probe period while busy but nobody waits: enough to notice the table stays
/// busy, while claimers find rows without being woken.
const UNWATCHED_PROBE: Duration = Duration::from_millis(20);

#[derive(Debug, Clone, Copy)]
pub struct WatchSettings {
    /// Probe period while claimers wait; zero disables watching (the trigger
    /// then always notifies).
    pub probe_interval: Duration,
    /// The idle check for inserts that came without a notification.
    pub poll_interval: Duration,
}

/// Watches `outbox` until `cancel`. Database errors drop it back to idle, where
/// notifications and the claimers' own polling carry on.
pub async fn watch(
    store: PgStore,
    wakeup: Arc<Wakeup>,
    outbox: String,
    settings: WatchSettings,
    cancel: CancellationToken,
) {
    if settings.probe_interval.is_zero() {
        return;
    }
    let mut last = None;
    let mut failing = false;
    loop {
        let notified = tokio::select! {
            () = cancel.cancelled() => return,
            () = wakeup.activity(&outbox) => true,
            () = tokio::time::sleep(settings.poll_interval) => false,
        };
        let value = match store.sequence(&outbox).await {
            Ok(value) => value,
            Err(err) => {
                if !failing {
                    tracing::warn!(outbox, error = %err, "cannot probe the outbox sequence; relying on notifications");
                    failing = true;
                }
                continue;
            }
        };
        failing = false;
        let moved = last.map_or(0, |prev| value.saturating_sub(prev));
        let first = last.is_none();
        last = Some(value);
        if moved == 0 && !(notified && first) {
            // Nothing new: a tick, or a notification for rows already counted.
            continue;
        }
        if !notified {
            // Inserts that came without a notification (or whose one was lost).
            wakeup.notify(&outbox, moved.unsigned_abs());
        }
        let watch = Busy {
            store: &store,
            wakeup: &wakeup,
            outbox: &outbox,
            probe_interval: settings.probe_interval,
        };
        match watch.run(value, &cancel).await {
            Ok(Some(value)) => last = Some(value),
            Ok(None) => return,
            Err(err) => {
                tracing::warn!(outbox, error = %err, "outbox sequence probe failed; relying on notifications");
                last = None;
            }
        }
    }
}

struct Busy<'a> {
    store: &'a PgStore,
    wakeup: &'a Wakeup,
    outbox: &'a str,
    probe_interval: Duration,
}

impl Busy<'_> {
    /// Probes while inserts keep arriving; returns the last value seen, or
    /// `None` when cancelled.
    async fn run(
        &self,
        mut last: i64,
        cancel: &CancellationToken,
    ) -> Result<Option<i64>, crate::store::StoreError> {
        tracing::debug!(
            outbox = self.outbox,
            "inserts arriving: probing the sequence"
        );
        self.wakeup.set_watched(self.outbox, true);
        let result = self.probe(&mut last, cancel).await;
        self.wakeup.set_watched(self.outbox, false);
        if !result? {
            return Ok(None);
        }
        // Notifications wake waiters again from here on; what came in before,
        // under the mark, this last probe (after the mark ran out) sees.
        let value = self.store.sequence(self.outbox).await?;
        if value > last {
            self.wakeup
                .notify(self.outbox, (value - last).unsigned_abs());
        }
        tracing::debug!(outbox = self.outbox, "no inserts: back to notifications");
        Ok(Some(last.max(value)))
    }

    /// The busy loop: true once the table went quiet and the mark ran out,
    /// false when cancelled.
    async fn probe(
        &self,
        last: &mut i64,
        cancel: &CancellationToken,
    ) -> Result<bool, crate::store::StoreError> {
        let mut moved_at = Instant::now();
        // When the last mark runs out, by this clock; read after the mark was
        // written, so never earlier than the database's.
        let mut mark_ends: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let quiet = now.duration_since(moved_at) >= IDLE_AFTER;
            if quiet && mark_ends.is_none_or(|end| now >= end) {
                return Ok(true);
            }
            let renew = mark_ends.is_none_or(|end| end.saturating_duration_since(now) < MARK / 2);
            if !quiet && renew {
                self.store.mark_quiet(self.outbox, MARK).await?;
                mark_ends = Some(Instant::now() + MARK);
            }
            let nap = if self.wakeup.waiting(self.outbox) > 0 {
                self.probe_interval
            } else {
                UNWATCHED_PROBE.max(self.probe_interval)
            };
            tokio::select! {
                () = cancel.cancelled() => return Ok(false),
                () = tokio::time::sleep(nap) => {}
            }
            let value = self.store.sequence(self.outbox).await?;
            if value > *last {
                self.wakeup
                    .notify(self.outbox, (value - *last).unsigned_abs());
                moved_at = Instant::now();
            }
            *last = (*last).max(value);
        }
    }
}
