//! outboxd's background tasks, and the supervisor that runs them.
//!
//! Each task runs until it is asked to stop. One that ends by itself or panics
//! is a fault (its work silently stops: no more gauges, no retention, no
//! wake-ups), so the supervisor logs it at ERROR with the task's name; one that
//! does not stop in time is named too.

pub mod gauges;
pub mod health;
pub mod retention;
pub mod sweep;
pub mod watchdog;

use std::{
    collections::BTreeMap,
    future::Future,
    panic::AssertUnwindSafe,
    sync::{Arc, Mutex},
    time::Duration,
};

use futures::FutureExt as _;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

/// Named background tasks that stop together.
#[derive(Debug, Default)]
pub struct Supervisor {
    tracker: TaskTracker,
    stop: CancellationToken,
    /// Tasks still running, by name (a name may run several times).
    running: Arc<Mutex<BTreeMap<String, usize>>>,
}

impl Supervisor {
    pub fn new() -> Self {
        Self::default()
    }

    /// The token every task gets: cancelled by [`Supervisor::stop`].
    pub fn stop_token(&self) -> CancellationToken {
        self.stop.clone()
    }

    /// Runs `task` until [`Supervisor::stop`]; the task watches
    /// [`Supervisor::stop_token`] itself.
    pub fn spawn(&self, name: impl Into<String>, task: impl Future<Output = ()> + Send + 'static) {
        self.spawn_until(name, self.stop.clone(), task);
    }

    /// Like [`Supervisor::spawn`] for a task that stops on its own token
    /// (earlier than the rest, say): ending once `until` is cancelled is
    /// expected, ending before is a fault.
    pub fn spawn_until(
        &self,
        name: impl Into<String>,
        until: CancellationToken,
        task: impl Future<Output = ()> + Send + 'static,
    ) {
        let name = name.into();
        *lock(&self.running).entry(name.clone()).or_default() += 1;
        let running = Arc::clone(&self.running);
        self.tracker.spawn(async move {
            let ended = AssertUnwindSafe(task).catch_unwind().await;
            match ended {
                Ok(()) if until.is_cancelled() => {}
                Ok(()) => tracing::error!(task = %name, "background task ended unasked"),
                Err(panic) => {
                    let what = panic
                        .downcast_ref::<&str>()
                        .map(|s| (*s).to_owned())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    tracing::error!(task = %name, panic = %what, "background task panicked");
                }
            }
            let mut running = lock(&running);
            if let Some(count) = running.get_mut(&name) {
                *count -= 1;
                if *count == 0 {
                    running.remove(&name);
                }
            }
        });
    }

    /// Asks every task to stop and waits up to `within`; tasks still running
    /// then are named in a warning and left to the runtime's shutdown.
    pub async fn stop(self, within: Duration) {
        self.stop.cancel();
        self.tracker.close();
        if tokio::time::timeout(within, self.tracker.wait())
            .await
            .is_err()
        {
            let left: Vec<String> = lock(&self.running).keys().cloned().collect();
            tracing::warn!(tasks = ?left, "background tasks did not stop in time");
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stop_ends_every_task_and_names_none_left() {
        let supervisor = Supervisor::new();
        for name in ["a", "b", "b"] {
            let stop = supervisor.stop_token();
            supervisor.spawn(name, async move { stop.cancelled().await });
        }
        assert_eq!(lock(&supervisor.running).get("b"), Some(&2));
        let running = Arc::clone(&supervisor.running);
        supervisor.stop(Duration::from_secs(5)).await;
        assert!(lock(&running).is_empty());
    }

    #[tokio::test]
    async fn a_task_that_ends_or_panics_unasked_leaves_the_running_set() {
        let supervisor = Supervisor::new();
        supervisor.spawn("quits", async {});
        supervisor.spawn("panics", async { panic!("boom") });
        let running = Arc::clone(&supervisor.running);
        supervisor.stop(Duration::from_secs(5)).await;
        assert!(lock(&running).is_empty());
    }

    #[tokio::test]
    async fn a_task_that_ignores_stop_is_still_running_after_the_bound() {
        let supervisor = Supervisor::new();
        supervisor.spawn("stuck", std::future::pending());
        let running = Arc::clone(&supervisor.running);
        supervisor.stop(Duration::from_millis(50)).await;
        assert_eq!(lock(&running).get("stuck"), Some(&1));
    }
}
