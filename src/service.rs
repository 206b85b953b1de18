//! The use cases behind the API. Everything but ClaimBatch is one store call;
//! ClaimBatch applies the acks it carries beside its claim, and adds the long
//! poll: claim, and if nothing was claimable wait for a wake-up (see `watch`),
//! a poll tick, the deadline or shutdown, then claim again.
//! Here, too, each outcome is counted and each ended lease reported as a span.
//!
//! Each call first resolves the outbox it names (see [`Outboxes`]); generic
//! over the store, PostgreSQL's by default.

mod admin;
mod outbox;

use std::{sync::Arc, time::Duration};

use rand::Rng;
use tokio::{sync::Semaphore, time::Instant};
use tokio_util::sync::CancellationToken;

use crate::{
    Error,
    lease::{
        AckRequest, ClaimRequest, ClaimedBatch, ExtendRequest, MessageResult, NackRequest, Outcome,
        Settled, Stats, StatsRequest,
    },
    metrics::ServerMetrics,
    store::{OutboxStore, PgOutbox},
    telemetry::{LeaseOutcome, record_lease},
};

pub use admin::AdminService;
pub use outbox::{Outbox, Outboxes};

/// The first re-check after a wake-up that found nothing: about one commit.
const FIRST_RECHECK: Duration = Duration::from_millis(2);
/// Re-checks double up to this, then the poll interval takes over: a
/// transaction that has not committed by then is left to it.
const LAST_RECHECK: Duration = Duration::from_millis(256);

#[derive(Debug, Clone)]
pub struct OutboxService<S = PgOutbox> {
    outboxes: Outboxes<S>,
    poll_interval: Duration,
    /// Cancelled when shutdown starts: long polls return their empty batch at once.
    stopping: CancellationToken,
    metrics: ServerMetrics,
    /// One permit per long poll waiting, over all outboxes (`--max-waiting-claims`).
    waiting: Arc<Semaphore>,
    max_waiting: u32,
}

impl<S: OutboxStore> OutboxService<S> {
    pub fn new(
        outboxes: Outboxes<S>,
        poll_interval: Duration,
        stopping: CancellationToken,
        metrics: ServerMetrics,
        max_waiting: u32,
    ) -> Self {
        Self {
            outboxes,
            poll_interval,
            stopping,
            metrics,
            waiting: Arc::new(Semaphore::new(max_waiting as usize)),
            max_waiting,
        }
    }

    /// ClaimBatch: the acks it carries, one by one as Ack applies them, beside
    /// the claim with its long poll, so neither waits for the other (run one
    /// after the other, the ack's statement delayed every claim behind it).
    /// The two touch different rows; where a lease has expired and the claim
    /// takes its row back, row locks order them and the ack reports
    /// LEASE_LOST or the claim skips the published row, as with two calls.
    /// An ack that fails fails the call; rows the claim took meanwhile come
    /// back when their lease expires, as with any lost answer.
    pub async fn claim_with_acks(
        &self,
        req: &ClaimRequest,
    ) -> Result<(Vec<MessageResult>, ClaimedBatch), Error> {
        if req.acks.is_empty() {
            return Ok((Vec::new(), self.claim(req).await?));
        }
        if self
            .outboxes
            .get(req.outbox.as_str())?
            .store
            .spec()
            .ordering
            .is_ordered()
        {
            // On an ordered outbox an ack frees the next event of each acked
            // aggregate: claiming after the acks hands those out in this call.
            let mut acked = Vec::new();
            for ack in &req.acks {
                acked.extend(self.ack(ack).await?.results);
            }
            return Ok((acked, self.claim(req).await?));
        }
        let acks = async {
            let mut acked = Vec::new();
            for ack in &req.acks {
                acked.extend(self.ack(ack).await?.results);
            }
            Ok::<_, Error>(acked)
        };
        let (acked, batch) = tokio::join!(acks, self.claim(req));
        Ok((acked?, batch?))
    }

    pub async fn claim(&self, req: &ClaimRequest) -> Result<ClaimedBatch, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        let deadline = Instant::now() + req.wait;
        let mut woken = false;
        // After a woken claim found nothing: the insert that woke it may not have
        // committed yet (the sequence moves at insert time), so look again soon,
        // backing off towards the poll interval.
        let mut recheck: Option<Duration> = None;
        // Taken when the claim is about to wait for the first time, held
        // until it returns: a claim answered at once never counts.
        let mut waiting = None;
        loop {
            // Join the queue before claiming: an insert committed between an empty
            // claim and the registration would otherwise wait for the next poll.
            let mut registration =
                (!req.wait.is_zero()).then(|| outbox.waiters.register(req.max_messages));
            let batch = outbox.store.claim(req).await?;
            self.observe_claim(outbox.name(), req, &batch);
            if batch.messages.is_empty() && !batch.dead_lettered.is_empty() {
                // Every row this claim reached was past max attempts and is now
                // dead-lettered, which never comes back: look again at once
                // rather than answer "nothing to do" while later rows wait.
                continue;
            }
            if !batch.messages.is_empty() {
                if woken && batch.messages.len() == req.max_messages as usize {
                    // A full batch suggests more work than the wake-up said (it
                    // was for fewer rows than there are): pass the baton on.
                    outbox.waiters.notify(1);
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
            if waiting.is_none() {
                // Refused at once rather than queued: a client that backs off
                // costs less than one more connection held open. (Acks the
                // call carried are applied; re-sent, they are ALREADY_DONE.)
                let Ok(permit) = Arc::clone(&self.waiting).try_acquire_owned() else {
                    self.metrics.waiting_claim_refused(outbox.name());
                    return Err(Error::TooManyWaiting(self.max_waiting));
                };
                waiting = Some(permit);
            }
            // Jitter keeps a crowd of waiters from polling in lockstep.
            let tick = self
                .poll_interval
                .mul_f64(rand::rng().random_range(0.8..1.2));
            if woken || recheck.is_some() {
                recheck = Some(recheck.map_or(FIRST_RECHECK, |d| d * 2))
                    .filter(|d| *d <= LAST_RECHECK && *d < tick);
            }
            let nap = recheck.unwrap_or(tick).min(deadline - now);
            registration.park();
            woken = tokio::select! {
                () = self.stopping.cancelled() => return Ok(batch),
                () = registration.woken() => true,
                () = tokio::time::sleep(nap) => false,
            };
        }
    }

    pub async fn ack(&self, req: &AckRequest) -> Result<Settled, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        let settled = outbox.store.ack(req).await?;
        freed_next(outbox, &settled);
        let outbox = outbox.name();
        self.metrics.acked(outbox, count(&settled, Outcome::Ok));
        self.metrics
            .lease_lost(outbox, count(&settled, Outcome::LeaseLost));
        self.metrics.commit_to_ack(
            outbox,
            settled
                .ended
                .iter()
                .map(|lease| (lease.ended_at - lease.created_at).as_seconds_f64()),
        );
        for lease in &settled.ended {
            record_lease(outbox, lease, LeaseOutcome::Ok);
        }
        Ok(settled)
    }

    pub async fn nack(&self, req: &NackRequest) -> Result<Settled, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        let settled = outbox.store.nack(req).await?;
        freed_next(outbox, &settled);
        let outbox = outbox.name();
        self.metrics.nacked(outbox, count(&settled, Outcome::Ok));
        self.metrics
            .dead_lettered(outbox, count(&settled, Outcome::DeadLettered));
        self.metrics
            .lease_lost(outbox, count(&settled, Outcome::LeaseLost));
        for lease in &settled.ended {
            let outcome = if lease.dead_lettered {
                LeaseOutcome::DeadLettered
            } else {
                LeaseOutcome::Nacked
            };
            record_lease(outbox, lease, outcome);
        }
        Ok(settled)
    }

    pub async fn extend(&self, req: &ExtendRequest) -> Result<Settled, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        let settled = outbox.store.extend(req).await?;
        let outbox = outbox.name();
        self.metrics
            .lease_lost(outbox, count(&settled, Outcome::LeaseLost));
        // With ids, each lost one is LEASE_LOST in the results; without, an
        // empty success would hide that the whole batch is gone.
        if req.message_ids.is_empty() && settled.results.is_empty() {
            return Err(Error::LeaseHoldsNothing(req.lease_id.to_string()));
        }
        Ok(settled)
    }

    fn observe_claim(&self, outbox: &str, req: &ClaimRequest, batch: &ClaimedBatch) {
        self.metrics.claimed(outbox, batch.messages.len());
        if let Some((id, bytes)) = batch.too_large.first() {
            // Counted at every claim that passes one by; an operator sees the
            // rate, and the line names one event and the client's limit.
            self.metrics
                .too_large_for_client(outbox, batch.too_large.len());
            tracing::warn!(
                outbox,
                worker_id = req.worker_id.as_str(),
                message_id = %id,
                bytes,
                client_max_bytes = req.max_event_bytes,
                passed_over = batch.too_large.len(),
                "an event is larger than this client can receive (its max_response_bytes): left for a client with a higher limit; raise the worker's gRPC receive limit"
            );
        }
        self.metrics
            .dead_lettered(outbox, batch.dead_lettered.len());
        self.metrics
            .leases_expired(outbox, batch.expired_leases.len());
        for lease in &batch.expired_leases {
            record_lease(outbox, lease, LeaseOutcome::Expired);
        }
    }

    pub async fn stats(&self, req: &StatsRequest) -> Result<Stats, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        Ok(outbox.store.stats().await?)
    }
}

/// On an ordered outbox, settling a head makes its aggregate's next event
/// claimable without any insert to wake waiting claimers: wake them here.
/// (A head nacked with a backoff frees nothing yet; the poll finds it later.)
fn freed_next<S: OutboxStore>(outbox: &Outbox<S>, settled: &Settled) {
    if !outbox.store.spec().ordering.is_ordered() {
        return;
    }
    let freed = settled
        .results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Ok | Outcome::DeadLettered))
        .count();
    if freed > 0 {
        outbox.waiters.notify(freed as u64);
    }
}

fn count(settled: &Settled, outcome: Outcome) -> usize {
    settled
        .results
        .iter()
        .filter(|r| r.outcome == outcome)
        .count()
}
