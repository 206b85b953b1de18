//! LISTEN/NOTIFY fan-out to long-polling claimers.
//!
//! The outbox trigger sends `schema.table N` when an insert of N rows commits.
//! One LISTEN connection receives it and wakes waiting ClaimBatch calls in arrival
//! order until their batch capacity covers N, never all of them: a thundering
//! herd of empty claims is what a busy queue can least afford. Notifications are
//! not durable, so waiters also poll; a reconnect wakes everyone once, because
//! notifications may have been lost while the connection was down.
//!
//! While inserts keep arriving, the trigger stays silent (see `watch`) and the
//! watcher wakes waiters here instead, from the table's sequence.

use std::{
    collections::{HashMap, VecDeque},
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use sqlx::postgres::PgListener;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::{outbox::TableRef, store::PgStore};

/// The channel the outbox trigger notifies.
pub const CHANNEL: &str = "outboxd";

#[derive(Debug)]
struct Waiter {
    id: u64,
    capacity: u64,
    wake: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
struct Queue(VecDeque<Waiter>);

/// One outbox's waiters, and the signal that rows arrived (for the watcher).
#[derive(Debug, Default)]
struct Outbox {
    queue: Mutex<Queue>,
    activity: tokio::sync::Notify,
}

impl Queue {
    /// Wakes waiters, oldest first, until their capacity covers `rows`. Waiters
    /// that already went away do not count.
    fn wake(&mut self, rows: u64) -> usize {
        let (mut covered, mut woken) = (0, 0);
        while covered < rows {
            let Some(waiter) = self.0.pop_front() else {
                break;
            };
            if waiter.wake.send(()).is_ok() {
                covered += waiter.capacity;
                woken += 1;
            }
        }
        woken
    }

    fn wake_all(&mut self) -> usize {
        self.0
            .drain(..)
            .filter_map(|w| w.wake.send(()).ok())
            .count()
    }
}

/// Waiting claimers, by outbox.
#[derive(Debug, Default)]
pub struct Wakeup {
    queues: HashMap<String, Outbox>,
    next_id: AtomicU64,
}

impl Wakeup {
    pub fn new(outboxes: impl IntoIterator<Item = String>) -> Arc<Self> {
        Arc::new(Self {
            queues: outboxes
                .into_iter()
                .map(|name| (name, Outbox::default()))
                .collect(),
            next_id: AtomicU64::new(0),
        })
    }

    /// Joins the queue of `outbox` as a claimer for up to `capacity` rows. Register
    /// before the claim that may come back empty, so a commit in between is not missed.
    pub fn register(self: &Arc<Self>, outbox: &str, capacity: u32) -> Registration {
        let (tx, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.with_queue(outbox, |q| {
            q.0.push_back(Waiter {
                id,
                capacity: u64::from(capacity.max(1)),
                wake: tx,
            })
        });
        Registration {
            wakeup: Arc::clone(self),
            outbox: outbox.to_owned(),
            id,
            woken: rx,
        }
    }

    /// `rows` became claimable in `outbox`: wake as many waiters as that feeds.
    pub fn notify(&self, outbox: &str, rows: u64) -> usize {
        self.with_queue(outbox, |q| q.wake(rows)).unwrap_or(0)
    }

    /// A notification arrived for `outbox`: wake waiters, and tell its watcher
    /// that inserts are coming in. It wakes even while the watcher probes: a
    /// probe may have counted that insert before it committed, and a second
    /// wake-up costs one empty claim where a missed one costs a poll interval.
    pub fn notified(&self, outbox: &str, rows: u64) -> usize {
        if let Some(o) = self.queues.get(outbox) {
            o.activity.notify_one();
        }
        self.notify(outbox, rows)
    }

    /// Resolves at the next notification for `outbox` (or at once if one came
    /// since the last call).
    pub async fn activity(&self, outbox: &str) {
        match self.queues.get(outbox) {
            Some(o) => o.activity.notified().await,
            None => std::future::pending().await,
        }
    }

    pub fn notify_all(&self) -> usize {
        self.queues
            .values()
            .map(|o| o.queue.lock().map(|mut q| q.wake_all()).unwrap_or(0))
            .sum()
    }

    /// Claimers currently waiting on `outbox`.
    pub fn waiting(&self, outbox: &str) -> usize {
        self.with_queue(outbox, |q| q.0.len()).unwrap_or(0)
    }

    fn with_queue<T>(&self, outbox: &str, f: impl FnOnce(&mut Queue) -> T) -> Option<T> {
        let queue = &self.queues.get(outbox)?.queue;
        // A poisoned lock only means a panic elsewhere mid-push; the queue is intact.
        let mut queue = queue.lock().unwrap_or_else(|p| p.into_inner());
        Some(f(&mut queue))
    }
}

/// A place in an outbox's wake-up queue; leaving it on drop.
#[derive(Debug)]
pub struct Registration {
    wakeup: Arc<Wakeup>,
    outbox: String,
    id: u64,
    woken: oneshot::Receiver<()>,
}

impl Registration {
    /// Resolves when a notification picks this waiter.
    pub async fn woken(&mut self) {
        // The sender lives in the queue until it wakes us or we drop out of it.
        let _ = (&mut self.woken).await;
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let id = self.id;
        self.wakeup
            .with_queue(&self.outbox, |q| q.0.retain(|w| w.id != id));
    }
}

/// A connection that LISTENs on the outbox channel.
pub async fn connect(store: &PgStore) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(store.pool()).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Parses a trigger payload: `schema.table rows`.
fn parse_payload(payload: &str) -> Option<(TableRef, u64)> {
    let (table, rows) = payload.rsplit_once(' ')?;
    let (schema, table) = table.split_once('.')?;
    Some((TableRef::new(schema, table).ok()?, rows.parse().ok()?))
}

/// Runs the LISTEN connection until `cancel`, routing notifications to waiters.
/// While it is down, claims still work: waiters fall back to polling.
/// `first` is the connection made before the server started serving, so no
/// claim can have waited before LISTEN was in place.
pub async fn listen(
    store: PgStore,
    wakeup: Arc<Wakeup>,
    first: PgListener,
    cancel: CancellationToken,
) {
    let mut down = false;
    let mut backoff = Duration::from_millis(100);
    let mut first = Some(first);
    while !cancel.is_cancelled() {
        let reconnect = first.is_none();
        let connected = match first.take() {
            Some(listener) => Ok(listener),
            None => connect(&store).await,
        };
        let mut listener = match connected {
            Ok(listener) => listener,
            Err(err) => {
                if !down {
                    tracing::warn!(error = %err, "notification listener cannot connect; polling only");
                    down = true;
                }
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        tracing::info!(channel = CHANNEL, "listening for outbox notifications");
        backoff = Duration::from_millis(100);
        if reconnect {
            // Notifications sent while no connection listened are gone: wake
            // every waiter once rather than leave them to the poll interval.
            wakeup.notify_all();
        }
        loop {
            let next = tokio::select! {
                () = cancel.cancelled() => return,
                next = listener.try_recv() => next,
            };
            match next {
                Ok(Some(notification)) => match parse_payload(notification.payload()) {
                    Some((table, rows)) => {
                        for outbox in store.outboxes_of(&table) {
                            wakeup.notified(&outbox, rows);
                        }
                    }
                    None => {
                        tracing::debug!(payload = notification.payload(), "ignoring notification")
                    }
                },
                Ok(None) => {
                    // sqlx reconnects on the next call; notifications in between are lost.
                    tracing::warn!("notification listener lost its connection; reconnecting");
                    wakeup.notify_all();
                }
                Err(err) => {
                    tracing::warn!(error = %err, "notification listener failed; polling only until it reconnects");
                    down = true;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_wakes_only_the_capacity_it_needs() {
        let wakeup = Wakeup::new(["default".to_owned()]);
        let mut regs: Vec<_> = (0..5).map(|_| wakeup.register("default", 10)).collect();
        assert_eq!(wakeup.notify("default", 1), 1);
        assert_eq!(wakeup.waiting("default"), 4);
        assert_eq!(wakeup.notify("default", 15), 2);
        assert_eq!(wakeup.waiting("default"), 2);
        // The oldest waiters went first.
        assert!(regs[0].woken.try_recv().is_ok());
        assert!(regs[1].woken.try_recv().is_ok());
        assert!(regs[2].woken.try_recv().is_ok());
        assert!(regs[3].woken.try_recv().is_err());
    }

    #[test]
    fn dropped_waiters_leave_the_queue_and_are_not_counted() {
        let wakeup = Wakeup::new(["default".to_owned()]);
        let gone = wakeup.register("default", 100);
        let mut stays = wakeup.register("default", 1);
        drop(gone);
        assert_eq!(wakeup.waiting("default"), 1);
        assert_eq!(wakeup.notify("default", 1), 1);
        assert!(stays.woken.try_recv().is_ok());
    }

    #[test]
    fn outboxes_are_separate_and_unknown_ones_ignored() {
        let wakeup = Wakeup::new(["a".to_owned(), "b".to_owned()]);
        let _a = wakeup.register("a", 1);
        assert_eq!(wakeup.notify("b", 10), 0);
        assert_eq!(wakeup.notify("nope", 10), 0);
        assert_eq!(wakeup.notify_all(), 1);
    }

    #[test]
    fn payloads_parse() {
        let (table, rows) = parse_payload("public.outbox 12").expect("valid");
        assert_eq!(table.to_string(), "public.outbox");
        assert_eq!(rows, 12);
        assert!(parse_payload("public.outbox").is_none());
        assert!(parse_payload("Bad.Table 1").is_none());
    }
}
