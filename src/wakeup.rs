//! Wake-up queues for long-polling claimers, one per outbox, in process.
//!
//! The outbox's watcher (see `watch`) probes the table's sequence while
//! claimers wait, and reports each move of N rows here. A report wakes waiting
//! ClaimBatch calls in arrival order until their batch capacity covers N, never
//! all of them: a thundering herd of empty claims is what a busy queue can
//! least afford. Wake-ups are a shortcut, not a promise, so waiters also poll.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

use tokio::sync::{Notify, oneshot};

#[derive(Debug)]
struct Waiter {
    id: u64,
    capacity: u64,
    wake: oneshot::Sender<()>,
    /// Its claim came back empty and it now waits (see `Registration::park`).
    parked: bool,
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
}

/// One outbox's claimers in the wake-up queue, and the signal that one began
/// to wait (for the watcher, which probes only while someone waits).
#[derive(Debug, Default)]
pub struct Waiters {
    queue: Mutex<Queue>,
    parked: Notify,
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
                parked: false,
            })
        });
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

    /// Resolves once a claimer has begun to wait since the last call (at once
    /// if one did meanwhile: the signal keeps one permit, so none is missed).
    pub async fn parked(&self) {
        self.parked.notified().await
    }

    /// Claimers currently waiting (not those whose claim is still running).
    pub fn waiting(&self) -> usize {
        self.with_queue(|q| q.0.iter().filter(|w| w.parked).count())
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
    /// Its claim came back empty: it waits now, and the watcher should probe.
    /// Every claim registers before it looks, but only the ones that then wait
    /// count: in a drain, a probe per claim was a statement per batch.
    pub fn park(&self) {
        let id = self.id;
        self.waiters.with_queue(|q| {
            if let Some(waiter) = q.0.iter_mut().find(|w| w.id == id) {
                waiter.parked = true;
            }
        });
        self.waiters.parked.notify_one();
    }

    /// Resolves when a wake-up picks this waiter.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parked(waiters: &Arc<Waiters>, capacity: u32) -> Registration {
        let registration = waiters.register(capacity);
        registration.park();
        registration
    }

    #[test]
    fn a_wake_up_wakes_only_the_capacity_it_needs() {
        let waiters = Waiters::new();
        let mut regs: Vec<_> = (0..5).map(|_| parked(&waiters, 10)).collect();
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
        let gone = parked(&waiters, 100);
        let mut stays = parked(&waiters, 1);
        drop(gone);
        assert_eq!(waiters.waiting(), 1);
        assert_eq!(waiters.notify(1), 1);
        assert!(stays.woken.try_recv().is_ok());
    }

    #[tokio::test]
    async fn only_a_claimer_that_waits_counts_and_signals_the_watcher() {
        let waiters = Waiters::new();
        let mut claiming = waiters.register(1);
        assert_eq!(waiters.waiting(), 0, "its claim is still running");
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(10), waiters.parked())
                .await
                .is_err(),
            "registering alone does not signal"
        );
        assert_eq!(waiters.notify(1), 1, "but a wake-up reaches it");
        assert!(claiming.woken.try_recv().is_ok());
        let _waiting = parked(&waiters, 1);
        assert_eq!(waiters.waiting(), 1);
        tokio::time::timeout(std::time::Duration::from_secs(1), waiters.parked())
            .await
            .expect("the signal kept its permit");
    }
}
