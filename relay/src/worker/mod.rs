//! One in-flight slot: claim (long-poll) → publish with confirms → ack the
//! confirmed, nack the rest → again. Never acks what the broker did not confirm.
//!
//! The settle calls of a batch run while the slot claims and publishes the next
//! one: the ack round trip is off the critical path, so one slot keeps the broker
//! busy instead of waiting on outboxd twice per batch. At most one batch per slot
//! is being settled at a time, so settling can never fall behind without bound.
//!
//! With ack-with-claim, a batch's acks ride on the slot's next claim, which
//! follows its confirms at once: one call per batch instead of two. Acks that
//! no claim picks up before the next batch is published (or before the slot
//! stops or backs off) go as an Ack call of their own, as do the acks of a
//! claim that failed: a repeated ack is harmless (`ALREADY_DONE`).
//!
//! With claim-ahead, a slot that got a full batch (a backlog) also claims its
//! next batch while the first one publishes, without waiting, so the claim round
//! trip is off the critical path too. The batch claimed ahead is not published
//! before the current one is confirmed: a slot still publishes one batch at a
//! time, in order, and a crash still redelivers at most two batches per slot
//! (one being settled, one being published), claim-ahead or not.

mod backoff;
mod lease;
mod server;
mod settle;
#[cfg(test)]
mod tests;

use std::{sync::Arc, time::Duration};

use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::Status;

use outboxd::pb;

use crate::{leases::Leases, publishers::Publisher};
use backoff::back_off;
use lease::{extended_while, proto_duration};
pub use server::ServerLink;
use server::is_transient;
use settle::Settlement;

/// What every slot of a relay process shares.
#[derive(Debug, Clone)]
pub struct Settings {
    pub outbox: String,
    pub worker_id: String,
    pub batch_size: u32,
    pub lease: Duration,
    pub wait: Duration,
    /// Claim the next batch while a full one publishes.
    pub claim_ahead: bool,
    /// Send a batch's acks with the next claim.
    pub ack_with_claim: bool,
}

/// A claim on its way, when it was sent (the lease runs from there), and the
/// acks it carries.
type Ahead = (
    Instant,
    Option<Settlement>,
    JoinHandle<Result<pb::ClaimBatchResponse, Status>>,
);

pub struct Worker<L, P> {
    leases: L,
    publisher: P,
    settings: Arc<Settings>,
    server: Arc<ServerLink>,
}

impl<L: Leases, P: Publisher> Worker<L, P> {
    pub fn new(leases: L, publisher: P, settings: Arc<Settings>, server: Arc<ServerLink>) -> Self {
        Self {
            leases,
            publisher,
            settings,
            server,
        }
    }

    /// Runs until `stop`; a batch already claimed is published and settled first.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut settling: Option<JoinHandle<()>> = None;
        let left = self.claim_loop(&stop, &mut settling).await;
        self.settle_later(&mut settling, left).await;
        if let Some(previous) = settling {
            let _ = previous.await;
        }
    }

    /// Claims and publishes until `stop`; returns the acks no claim carried.
    async fn claim_loop(
        &mut self,
        stop: &CancellationToken,
        settling: &mut Option<JoinHandle<()>>,
    ) -> Option<Settlement> {
        let mut failures = 0u32;
        let mut ahead: Option<Ahead> = None;
        // Whether the last publish reached the broker; claiming ahead while it
        // is unreachable would only cost the next batch an attempt.
        let mut broker_ok = true;
        // The last batch's acks, for the next claim to carry.
        let mut carry: Option<Settlement> = None;
        loop {
            let (claimed_at, carried, claim) = match ahead.take() {
                // Claimed already: published even after a stop, like any batch
                // in hand, rather than left to wait out its lease.
                Some((claimed_at, carried, handle)) => (
                    claimed_at,
                    carried,
                    handle
                        .await
                        .unwrap_or_else(|e| Err(Status::internal(e.to_string()))),
                ),
                None => {
                    if stop.is_cancelled() {
                        break;
                    }
                    if self.publisher.ready().await.is_err() {
                        // No claim soon: the acks go on their own.
                        self.settle_later(settling, carry.take()).await;
                        failures += 1;
                        if back_off(stop, failures).await {
                            break;
                        }
                        continue;
                    }
                    let claimed_at = Instant::now();
                    let carried = carry.take();
                    let req = self.claim_request(self.settings.wait, carried.as_ref());
                    tokio::select! {
                        () = stop.cancelled() => {
                            // Applied or not, they are sent again on their own.
                            carry = carried;
                            break;
                        }
                        claim = self.leases.claim(req) => (claimed_at, carried, claim),
                    }
                }
            };
            let batch = match claim {
                Ok(mut batch) => {
                    self.server.up();
                    failures = 0;
                    if let Some(acks) = carried {
                        let results = std::mem::take(&mut batch.ack_results);
                        self.carried(acks, &results, settling).await;
                    }
                    batch
                }
                Err(status) => {
                    // The acks it carried may or may not have been applied.
                    self.settle_later(settling, carried).await;
                    if is_transient(&status) {
                        self.server.down(&status);
                    } else {
                        tracing::error!(code = ?status.code(), message = status.message(), "claim refused; check the relay's configuration");
                    }
                    failures += 1;
                    if back_off(stop, failures).await {
                        break;
                    }
                    continue;
                }
            };
            if batch.messages.is_empty() {
                continue;
            }
            // A full batch means a backlog: claim the next one now, without
            // waiting, so it is in hand when this one is confirmed.
            if self.settings.claim_ahead
                && broker_ok
                && batch.messages.len() >= self.settings.batch_size as usize
                && !stop.is_cancelled()
            {
                let leases = self.leases.clone();
                let carried = carry.take();
                let req = self.claim_request(Duration::ZERO, carried.as_ref());
                ahead = Some((
                    Instant::now(),
                    carried,
                    tokio::spawn(async move { leases.claim(req).await }),
                ));
            }
            let (mut done, reached_broker) = self.relay(batch, claimed_at).await;
            broker_ok = reached_broker;
            let acks = if self.settings.ack_with_claim && self.server.takes_carried_acks() {
                done.take_acks()
            } else {
                None
            };
            // Acks no claim picked up while this batch published go now, on
            // their own, rather than wait behind a second batch.
            let stale = std::mem::replace(&mut carry, acks);
            self.settle_later(settling, stale).await;
            self.settle_later(settling, Some(done)).await;
        }
        carry
    }

    fn claim_request(&self, wait: Duration, acks: Option<&Settlement>) -> pb::ClaimBatchRequest {
        pb::ClaimBatchRequest {
            outbox: self.settings.outbox.clone(),
            worker_id: self.settings.worker_id.clone(),
            max_messages: self.settings.batch_size,
            lease_duration: Some(proto_duration(self.settings.lease)),
            wait: Some(proto_duration(wait)),
            // The channel's receive limit: outboxd never sends more.
            max_response_bytes: u32::try_from(outboxd::client::MAX_RESPONSE_BYTES)
                .unwrap_or(u32::MAX),
            acks: acks
                .map(|a| pb::LeaseAck {
                    lease_id: a.lease_id.clone(),
                    message_ids: a.acks.clone(),
                })
                .into_iter()
                .collect(),
        }
    }

    /// Publishes one claimed batch, extending its lease (which runs from
    /// `claimed_at`) while that runs long, and returns what to settle (ack
    /// what the broker confirmed, nack the rest) and whether every message
    /// reached the broker, confirmed or refused.
    async fn relay(
        &mut self,
        batch: pb::ClaimBatchResponse,
        claimed_at: Instant,
    ) -> (Settlement, bool) {
        let publish = self.publisher.publish(&batch.messages);
        let deliveries = extended_while(
            &self.leases,
            &self.settings,
            &batch.lease_id,
            claimed_at,
            publish,
        )
        .await;
        let give_up = Instant::now() + self.settings.lease * 2;
        Settlement::of(batch.lease_id, &batch.messages, deliveries, give_up)
    }
}
