//! Wake-up fan-out to long-polling claimers, in process.
//!
//! The store's arrivals feed announces `N rows committed to table T` (see
//! `store::ArrivalFeed`). Each announcement wakes waiting ClaimBatch calls of
//! the outboxes on T in arrival order until their batch capacity covers N,
//! never all of them: a thundering herd of empty claims is what a busy queue
//! can least afford. Announcements are not durable, so waiters also poll; when
//! the feed says some may have been lost, everyone is woken once.
//!
//! While inserts keep arriving, producers stay silent (see `watch`) and the
//! watcher wakes waiters here instead, from the table's sequence.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use crate::{
    outbox::TableRef,
    store::{Arrival, ArrivalFeed},
};

#[derive(Debug)]
struct Waiter {
    id: u64,
    capacity: u64,
    wake: oneshot::Sender<()>,
}

#[derive(Debug, Default)]
struct Queue(VecDeque<Waiter>);

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

/// One outbox's waiting claimers, and the signal that rows arrived (for the
/// watcher).
#[derive(Debug, Default)]
pub struct Waiters {
    queue: Mutex<Queue>,
    activity: tokio::sync::Notify,
    registered: tokio::sync::Notify,
    next_id: AtomicU64,
}

impl Waiters {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Joins the queue as a claimer for up to `capacity` rows. Register before
    /// the claim that may come back empty, so a commit in between is not missed.
    pub fn register(self: &Arc<Self>, capacity: u32) -> Registration {
        let (tx, rx) = oneshot::channel();
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.with_queue(|q| {
            q.0.push_back(Waiter {
                id,
                capacity: u64::from(capacity.max(1)),
                wake: tx,
            })
        });
        self.registered.notify_one();
        Registration {
            waiters: Arc::clone(self),
            id,
            woken: rx,
        }
    }

    /// `rows` became claimable: wake as many waiters as that feeds.
    pub fn notify(&self, rows: u64) -> usize {
        self.with_queue(|q| q.wake(rows))
    }

    /// An announcement arrived: wake waiters, and tell the watcher that
    /// inserts are coming in. It wakes even while the watcher probes: a probe
    /// may have counted that insert before it committed, and a second wake-up
    /// costs one empty claim where a missed one costs a poll interval.
    pub fn notified(&self, rows: u64) -> usize {
        self.activity.notify_one();
        self.notify(rows)
    }

    /// Resolves at the next announcement (or at once if one came since the
    /// last call).
    pub async fn activity(&self) {
        self.activity.notified().await
    }

    /// Resolves once a claimer has registered since the last call (at once if
    /// one did meanwhile: the signal keeps one permit, so none is missed).
    pub async fn registered(&self) {
        self.registered.notified().await
    }

    /// Wakes every waiter.
    pub fn notify_all(&self) -> usize {
        self.with_queue(Queue::wake_all)
    }

    /// Claimers currently waiting.
    pub fn waiting(&self) -> usize {
        self.with_queue(|q| q.0.len())
    }

    fn with_queue<T>(&self, f: impl FnOnce(&mut Queue) -> T) -> T {
        // A poisoned lock only means a panic elsewhere mid-push; the queue is intact.
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut queue)
    }
}

/// A place in an outbox's wake-up queue; leaving it on drop.
#[derive(Debug)]
pub struct Registration {
    waiters: Arc<Waiters>,
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
        self.waiters.with_queue(|q| q.0.retain(|w| w.id != id));
    }
}

/// Routes the feed's announcements to the waiters of each outbox on a table.
#[derive(Debug, Clone, Default)]
pub struct Wakeup {
    tables: Vec<(TableRef, Arc<Waiters>)>,
}

impl Wakeup {
    pub fn new(outboxes: impl IntoIterator<Item = (TableRef, Arc<Waiters>)>) -> Self {
        Self {
            tables: outboxes.into_iter().collect(),
        }
    }

    /// `rows` committed to `table`: wake the waiters of the outboxes on it.
    pub fn arrived(&self, table: &TableRef, rows: u64) -> usize {
        self.tables
            .iter()
            .filter(|(t, _)| t == table)
            .map(|(_, waiters)| waiters.notified(rows))
            .sum()
    }

    /// Announcements may have been lost: wake every waiter once rather than
    /// leave them to the poll interval.
    pub fn notify_all(&self) -> usize {
        self.tables.iter().map(|(_, w)| w.notify_all()).sum()
    }
}

/// Routes the arrivals feed to waiters until `cancel`. While the feed is down,
/// claims still work: waiters fall back to polling.
pub async fn listen(mut feed: impl ArrivalFeed, wakeup: Wakeup, cancel: CancellationToken) {
    loop {
        let arrival = tokio::select! {
            () = cancel.cancelled() => return,
            arrival = feed.next() => arrival,
        };
        match arrival {
            Arrival::Inserted { table, rows } => {
                wakeup.arrived(&table, rows);
            }
            Arrival::Lost => {
                wakeup.notify_all();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_notification_wakes_only_the_capacity_it_needs() {
        let waiters = Waiters::new();
        let mut regs: Vec<_> = (0..5).map(|_| waiters.register(10)).collect();
        assert_eq!(waiters.notify(1), 1);
        assert_eq!(waiters.waiting(), 4);
        assert_eq!(waiters.notify(15), 2);
        assert_eq!(waiters.waiting(), 2);
        // The oldest waiters went first.
        assert!(regs[0].woken.try_recv().is_ok());
        assert!(regs[1].woken.try_recv().is_ok());
        assert!(regs[2].woken.try_recv().is_ok());
        assert!(regs[3].woken.try_recv().is_err());
    }

    #[test]
    fn dropped_waiters_leave_the_queue_and_are_not_counted() {
        let waiters = Waiters::new();
        let gone = waiters.register(100);
        let mut stays = waiters.register(1);
        drop(gone);
        assert_eq!(waiters.waiting(), 1);
        assert_eq!(waiters.notify(1), 1);
        assert!(stays.woken.try_recv().is_ok());
    }

    #[test]
    fn announcements_reach_the_outboxes_on_their_table_only() {
        let table = |name: &str| TableRef::new("public", name).expect("valid");
        let (a, b, a_too) = (Waiters::new(), Waiters::new(), Waiters::new());
        let wakeup = Wakeup::new([
            (table("a"), Arc::clone(&a)),
            (table("b"), Arc::clone(&b)),
            (table("a"), Arc::clone(&a_too)),
        ]);
        let (_a, _b, _a_too) = (a.register(1), b.register(1), a_too.register(1));
        assert_eq!(wakeup.arrived(&table("nope"), 10), 0);
        assert_eq!(wakeup.arrived(&table("a"), 10), 2, "both outboxes on a");
        assert_eq!(b.waiting(), 1);
        assert_eq!(wakeup.notify_all(), 1);
    }
}
