//! What is under lease while a fault is on.

use std::{
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use sqlx::PgPool;
use tokio::{
    task::JoinHandle,
    time::{Instant, sleep},
};
use tokio_util::sync::CancellationToken;

use crate::{
    history::History,
    shared::wait::{millis, secs},
};

/// After a fault ends, how long the sampler keeps recording what is under
/// lease: calls that hung on the fault finish (or are given up) by then.
const AFTERMATH: Duration = Duration::from_millis(2500);

/// Records what is under a live lease while a fault is on and for a while
/// after it: those events may be claimed again, the others may not.
pub struct Sampler {
    until: Arc<Mutex<Option<Instant>>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    pool: PgPool,
    history: History,
}

/// Adds the rows under a live lease to the exposed ones. A sample the server
/// fails (it is down, crashed, failing over) finds nothing: what a server
/// that is gone has under lease is gone with its lease table.
async fn sample(pool: &PgPool, history: &History) {
    let leased: Result<Vec<String>, _> = sqlx::query_scalar(
        "SELECT o.id::text FROM outbox AS o JOIN outbox_leases AS l ON l.id = o.id
         WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL AND l.locked_until > now()",
    )
    .fetch_all(pool)
    .await;
    if let Ok(leased) = leased {
        history.expose(leased);
    }
}

fn until(m: &Mutex<Option<Instant>>) -> MutexGuard<'_, Option<Instant>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sampler {
    pub fn start(pool: &PgPool, history: &History) -> Self {
        let until_at = Arc::new(Mutex::new(None::<Instant>));
        let stop = CancellationToken::new();
        let task = {
            let (pool, history, until_at, stop) = (
                pool.clone(),
                history.clone(),
                Arc::clone(&until_at),
                stop.clone(),
            );
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    if until(&until_at).is_some_and(|t| Instant::now() < t) {
                        sample(&pool, &history).await;
                    }
                    // The sampling period.
                    sleep(millis(100)).await;
                }
            })
        };
        Self {
            until: until_at,
            stop,
            task,
            pool: pool.clone(),
            history: history.clone(),
        }
    }

    /// A fault begins: what is under lease now, and from now on, is exposed.
    pub async fn begin(&self, what: impl Into<String>) {
        self.history.fault(what);
        self.expose_from_now().await;
    }

    /// A fault that empties the lease table begins: as `begin`, and the
    /// checker lets the rows under lease now be leased again while those
    /// leases are still live in their workers' eyes.
    pub async fn begin_lease_loss(&self, what: impl Into<String>) {
        self.history.leases_lost(what);
        self.expose_from_now().await;
    }

    /// The server itself fails (a crash, a failover to a standby), which
    /// empties the lease table, as `begin_lease_loss`, and may undo outboxd's
    /// last writes, which commit without waiting for their WAL
    /// (`synchronous_commit = off`): the checker lets the rows settled just
    /// before now be claimed again (see `History::server_lost`).
    pub async fn begin_server_loss(&self, what: impl Into<String>) {
        self.history.server_lost(what);
        self.expose_from_now().await;
    }

    async fn expose_from_now(&self) {
        sample(&self.pool, &self.history).await;
        *until(&self.until) = Some(Instant::now() + secs(3600));
    }

    /// The fault is over: keep sampling through its aftermath.
    pub fn end(&self) {
        self.history.fault_over();
        *until(&self.until) = Some(Instant::now() + AFTERMATH);
    }

    pub async fn stop(self) {
        let left = until(&self.until).map(|t| t.saturating_duration_since(Instant::now()));
        // A window: the last fault's aftermath is sampled to its end.
        sleep(left.unwrap_or_default()).await;
        self.stop.cancel();
        self.task.await.expect("the sampler panicked");
    }
}
