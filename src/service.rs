//! The use cases behind the API. Everything but ClaimBatch is one store call;
//! ClaimBatch adds the long poll: claim, and if nothing was claimable wait for a
//! notification, a poll tick, the deadline or shutdown, then claim again.

use std::{sync::Arc, time::Duration};

use rand::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{
    Error,
    lease::{AckRequest, ClaimRequest, ExtendRequest, NackRequest, StatsRequest},
    store::{ClaimedBatch, PgStore, Settled, Stats},
    wakeup::Wakeup,
};

#[derive(Debug, Clone)]
pub struct OutboxService {
    store: PgStore,
    wakeup: Arc<Wakeup>,
    poll_interval: Duration,
    /// Cancelled when shutdown starts: long polls return their empty batch at once.
    stopping: CancellationToken,
}

impl OutboxService {
    pub fn new(store: PgStore, wakeup: Arc<Wakeup>, poll_interval: Duration, stopping: CancellationToken) -> Self {
        Self {
            store,
            wakeup,
            poll_interval,
            stopping,
        }
    }

    pub async fn claim(&self, req: &ClaimRequest) -> Result<ClaimedBatch, Error> {
        let deadline = Instant::now() + req.wait;
        let outbox = req.outbox.as_str();
        let mut woken = false;
        loop {
            // Join the queue before claiming: an insert committed between an empty
            // claim and the registration would otherwise wait for the next poll.
            let mut registration =
                (!req.wait.is_zero()).then(|| self.wakeup.register(outbox, req.max_messages));
            let batch = self.store.claim(req).await?;
            if batch.messages.is_empty() && !batch.dead_lettered.is_empty() {
                // Every row this claim reached was past max attempts and is now
                // dead-lettered, which never comes back: look again at once
                // rather than answer "nothing to do" while later rows wait.
                continue;
            }
            if !batch.messages.is_empty() {
                if woken && batch.messages.len() == req.max_messages as usize {
                    // A full batch suggests more work than the notification said
                    // (counts collapse within a transaction): pass the baton on.
                    self.wakeup.notify(outbox, 1);
                }
                return Ok(batch);
            }
            let now = Instant::now();
            let Some(registration) = registration.as_mut().filter(|_| now < deadline) else {
                return Ok(batch);
            };
            if self.stopping.is_cancelled() {
                return Ok(batch);
            }
            // Jitter keeps a crowd of waiters from polling in lockstep.
            let tick = self.poll_interval.mul_f64(rand::rng().random_range(0.8..1.2));
            let nap = tick.min(deadline - now);
            woken = tokio::select! {
                () = self.stopping.cancelled() => return Ok(batch),
                () = registration.woken() => true,
                () = tokio::time::sleep(nap) => false,
            };
        }
    }

    pub async fn ack(&self, req: &AckRequest) -> Result<Settled, Error> {
        Ok(self.store.ack(req).await?)
    }

    pub async fn nack(&self, req: &NackRequest) -> Result<Settled, Error> {
        Ok(self.store.nack(req).await?)
    }

    pub async fn extend(&self, req: &ExtendRequest) -> Result<Settled, Error> {
        Ok(self.store.extend(req).await?)
    }

    pub async fn stats(&self, req: &StatsRequest) -> Result<Stats, Error> {
        Ok(self.store.stats(req.outbox.as_str()).await?)
    }
}
