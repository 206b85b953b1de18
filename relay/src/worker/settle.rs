//! Settling a published batch with outboxd: ack what the broker confirmed,
//! nack the rest with its reason, in the background while the slot goes on,
//! or carried on the slot's next claim.

use std::{collections::BTreeMap, sync::Arc, time::Duration};

use tokio::{task::JoinHandle, time::Instant};
use tonic::Status;

use outboxd::pb;

use super::{
    Settings, Worker,
    backoff::{FAILED_RETRY_AFTER, RETRY},
    lease::proto_duration,
    server::is_transient,
};
use crate::{
    leases::Leases,
    publishers::{Delivery, Publisher},
};

/// What is left to tell outboxd about one published batch.
#[derive(Debug)]
pub(super) struct Settlement {
    pub lease_id: String,
    /// Confirmed by the broker.
    pub acks: Vec<String>,
    /// (reason, retry_after) -> ids: one Nack per distinct reason.
    nacks: BTreeMap<(String, Option<Duration>), Vec<String>>,
    /// Past this the lease has long expired and another worker owns the
    /// messages: transient failures are retried until then only.
    give_up: Instant,
}

impl Settlement {
    /// What to settle for `messages` given their deliveries, in order, and
    /// whether every message reached the broker, confirmed or refused. Only
    /// what the broker confirmed is acked.
    pub fn of(
        lease_id: String,
        messages: &[pb::OutboxMessage],
        deliveries: Vec<Delivery>,
        give_up: Instant,
    ) -> (Settlement, bool) {
        let reached_broker = deliveries.len() == messages.len()
            && !deliveries.iter().any(|d| matches!(d, Delivery::Failed(_)));
        let mut acks = Vec::new();
        let mut nacks: BTreeMap<(String, Option<Duration>), Vec<String>> = BTreeMap::new();
        for (message, delivery) in messages.iter().zip(deliveries) {
            let (reason, retry_after) = match delivery {
                Delivery::Confirmed => {
                    acks.push(message.id.clone());
                    continue;
                }
                Delivery::Rejected(reason) => (reason, None),
                Delivery::Failed(reason) => (reason, Some(FAILED_RETRY_AFTER)),
            };
            nacks
                .entry((reason, retry_after))
                .or_default()
                .push(message.id.clone());
        }
        // A publisher that answered for fewer messages than it was given: the
        // rest are unconfirmed, so they are released, never acked.
        let answered = acks.len() + nacks.values().map(Vec::len).sum::<usize>();
        if answered < messages.len() {
            let missing = messages[answered..].iter().map(|m| m.id.clone());
            nacks
                .entry(("publisher gave no outcome".into(), Some(FAILED_RETRY_AFTER)))
                .or_default()
                .extend(missing);
        }
        let done = Settlement {
            lease_id,
            acks,
            nacks,
            give_up,
        };
        (done, reached_broker)
    }

    /// The acks alone, taken out to ride on a claim.
    pub fn take_acks(&mut self) -> Option<Settlement> {
        (!self.acks.is_empty()).then(|| Settlement {
            lease_id: self.lease_id.clone(),
            acks: std::mem::take(&mut self.acks),
            nacks: BTreeMap::new(),
            give_up: self.give_up,
        })
    }

    fn is_empty(&self) -> bool {
        self.acks.is_empty() && self.nacks.is_empty()
    }
}

impl<L: Leases, P: Publisher> Worker<L, P> {
    /// Starts the settle calls for `work` once the slot's previous ones are
    /// done (normally long since: one round trip against a whole publish).
    pub(super) async fn settle_later(
        &self,
        settling: &mut Option<JoinHandle<()>>,
        work: Option<Settlement>,
    ) {
        let Some(work) = work.filter(|w| !w.is_empty()) else {
            return;
        };
        if let Some(previous) = settling.take() {
            let _ = previous.await;
        }
        let leases = self.leases.clone();
        let settings = Arc::clone(&self.settings);
        *settling = Some(tokio::spawn(settle(leases, settings, work)));
    }

    /// Reports the outcomes of the acks a claim carried; a server that gave
    /// none dropped them unread, so they are sent again as an Ack.
    pub(super) async fn carried(
        &self,
        acks: Settlement,
        results: &[pb::MessageResult],
        settling: &mut Option<JoinHandle<()>>,
    ) {
        if results.len() == acks.acks.len() {
            report("ack", &acks.lease_id, acks.acks.len(), results);
        } else {
            self.server.ignored_carried_acks();
            self.settle_later(settling, Some(acks)).await;
        }
    }
}

/// Acks and nacks one published batch, retrying transient failures until
/// its `give_up`.
async fn settle<L: Leases>(leases: L, settings: Arc<Settings>, done: Settlement) {
    let Settlement {
        lease_id,
        acks,
        nacks,
        give_up,
    } = done;
    if !acks.is_empty() {
        let count = acks.len();
        let req = pb::AckRequest {
            outbox: settings.outbox.clone(),
            lease_id: lease_id.clone(),
            message_ids: acks,
        };
        if let Some(resp) = retry(give_up, || leases.ack(req.clone())).await {
            report("ack", &lease_id, count, &resp.results);
        }
    }
    for ((reason, retry_after), ids) in nacks {
        tracing::warn!(lease_id = %lease_id, count = ids.len(), reason = %reason, "releasing unpublished messages");
        let count = ids.len();
        let req = pb::NackRequest {
            outbox: settings.outbox.clone(),
            lease_id: lease_id.clone(),
            message_ids: ids,
            error: reason,
            retry_after: retry_after.map(proto_duration),
            dead_letter: false,
        };
        if let Some(resp) = retry(give_up, || leases.nack(req.clone())).await {
            report("nack", &lease_id, count, &resp.results);
        }
    }
}

/// Retries a settle call on transient errors until `give_up`. Past that the
/// lease has long expired and another worker owns the messages.
async fn retry<T, F, Fut>(give_up: Instant, mut call: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let mut attempt = 0;
    loop {
        match call().await {
            Ok(value) => return Some(value),
            Err(status) if is_transient(&status) && Instant::now() < give_up => {
                attempt += 1;
                let delay = RETRY.delay(attempt, &mut rand::rng());
                tokio::time::sleep(delay).await;
            }
            Err(status) => {
                tracing::error!(code = ?status.code(), message = status.message(), "settle failed; the lease will expire and the messages be redelivered");
                return None;
            }
        }
    }
}

fn report(what: &str, lease_id: &str, count: usize, results: &[pb::MessageResult]) {
    let lost = results
        .iter()
        .filter(|r| r.outcome() == pb::Outcome::LeaseLost)
        .count();
    if lost > 0 {
        tracing::warn!(
            lease_id,
            lost,
            "{what}: lease lost for some messages; they will be delivered again"
        );
    }
    tracing::debug!(lease_id, count, "{what} done");
}
