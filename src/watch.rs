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
//!   moved by. After [`IDLE_AFTER`] without an insert it stops renewing; once
//!   the mark has run out it probes one last time (an insert that skipped
//!   NOTIFY under the mark moved the sequence before that probe) and goes idle.
//!
//! A probe can see an insert whose transaction has not committed yet; the woken
//! claim then comes back empty and re-checks shortly (see `service`).

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    service::Outbox,
    store::{Arrivals, OutboxStore, StoreError},
    wakeup::Waiters,
};

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
pub async fn watch<S: OutboxStore + Arrivals>(
    outbox: Outbox<S>,
    settings: WatchSettings,
    cancel: CancellationToken,
) {
    if settings.probe_interval.is_zero() {
        return;
    }
    let name = outbox.name();
    if !outbox.store.probeable() {
        tracing::info!(
            outbox = name,
            "seq is not an identity column: waking claimers by notification only"
        );
        return;
    }
    let mut failing = false;
    let mut last = None;
    loop {
        let notified = tokio::select! {
            () = cancel.cancelled() => return,
            () = outbox.waiters.activity() => true,
            () = tokio::time::sleep(settings.poll_interval) => false,
        };
        let busy = Busy {
            store: &outbox.store,
            waiters: &outbox.waiters,
            outbox: name,
            probe_interval: settings.probe_interval,
        };
        match busy.idle_check(&mut last, notified).await {
            Ok(false) => continue,
            Ok(true) => {}
            Err(err) => {
                report(name, &err, &mut failing);
                continue;
            }
        }
        match busy.run(&mut last, &cancel).await {
            Ok(true) => failing = false,
            Ok(false) => return,
            Err(err) => {
                report(name, &err, &mut failing);
                last = None;
            }
        }
    }
}

/// Logs the first failure of a run of them: a role that may not write the
/// mark would otherwise log at every notification.
fn report(outbox: &str, err: &StoreError, failing: &mut bool) {
    if !std::mem::replace(failing, true) {
        tracing::warn!(outbox, error = %err, "cannot watch the outbox sequence; waking claimers by notification only");
    }
}

struct Busy<'a, S> {
    store: &'a S,
    waiters: &'a Waiters,
    /// The outbox's name, for logs.
    outbox: &'a str,
    probe_interval: Duration,
}

impl<S: Arrivals> Busy<'_, S> {
    /// Idle: whether inserts are arriving. A tick that finds the sequence moved
    /// wakes waiters for it (those inserts did not notify).
    async fn idle_check(&self, last: &mut Option<i64>, notified: bool) -> Result<bool, StoreError> {
        let value = self.store.sequence().await?;
        let moved = last.map_or(0, |prev| value.saturating_sub(prev));
        let first = last.is_none();
        *last = Some(value);
        if moved == 0 && !(notified && first) {
            // Nothing new: a tick, or a notification for rows already counted.
            return Ok(false);
        }
        if !notified {
            self.waiters.notify(moved.unsigned_abs());
        }
        Ok(true)
    }

    /// Busy: probes while inserts keep arriving. True once the table went quiet
    /// and the mark ran out (after a last probe), false when cancelled.
    async fn run(
        &self,
        last: &mut Option<i64>,
        cancel: &CancellationToken,
    ) -> Result<bool, StoreError> {
        tracing::debug!(
            outbox = self.outbox,
            "inserts arriving: probing the sequence"
        );
        let start = self.store.sequence().await?;
        // `seen` tracks activity; `woken` how far waiters were woken for. A
        // move seen while nobody waited stays owed until someone does, so a
        // row counted before it committed still gets a claimer.
        let (mut seen, mut woken) = (start, last.unwrap_or(start).min(start));
        let mut moved_at = Instant::now();
        // When the last mark runs out, by this clock; read after the mark was
        // written, so never earlier than the database's.
        let mut mark_ends: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let quiet = now.duration_since(moved_at) >= IDLE_AFTER;
            let expired = mark_ends.is_none_or(|end| now >= end);
            if !quiet && mark_ends.is_none_or(|end| end.saturating_duration_since(now) < MARK / 2) {
                self.store.mark_quiet(MARK).await?;
                mark_ends = Some(Instant::now() + MARK);
            }
            let nap = if quiet && expired {
                // The last probe: after the mark ran out, so it sees every
                // insert that skipped NOTIFY under it.
                Duration::ZERO
            } else if self.waiters.waiting() > 0 {
                self.probe_interval
            } else {
                UNWATCHED_PROBE.max(self.probe_interval)
            };
            tokio::select! {
                () = cancel.cancelled() => return Ok(false),
                () = tokio::time::sleep(nap) => {}
            }
            let value = self.store.sequence().await?;
            if value > seen {
                seen = value;
                moved_at = Instant::now();
            }
            if seen > woken && self.waiters.notify((seen - woken).unsigned_abs()) > 0 {
                woken = seen;
            }
            *last = Some(seen);
            if quiet && expired && value == seen && moved_at <= now {
                tracing::debug!(outbox = self.outbox, "no inserts: back to notifications");
                return Ok(true);
            }
        }
    }
}
