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

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::{
    leases::Leases,
    publisher::{Delivery, Publisher},
};
use outboxd::{backoff::BackoffPolicy, pb};

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

/// outboxd's reachability as last reported, so each change is logged once, and
/// whether it applies the acks a claim carries.
#[derive(Debug)]
pub struct ServerLink {
    up: AtomicBool,
    ignores_carried_acks: AtomicBool,
}

impl Default for ServerLink {
    fn default() -> Self {
        // Assume up: the first failure is then a change worth a line.
        Self {
            up: AtomicBool::new(true),
            ignores_carried_acks: AtomicBool::new(false),
        }
    }
}

impl ServerLink {
    fn up(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!("outboxd reachable again");
        }
    }

    fn down(&self, status: &Status) {
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::warn!(code = ?status.code(), message = status.message(), "outboxd unavailable; retrying with backoff");
        }
    }

    /// A claim came back without results for the acks it carried: the server
    /// predates them and dropped the field unread.
    fn ignored_carried_acks(&self) {
        if !self.ignores_carried_acks.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                "outboxd ignores acks sent with a claim (an older server); acking with Ack calls"
            );
        }
    }

    fn takes_carried_acks(&self) -> bool {
        !self.ignores_carried_acks.load(Ordering::Relaxed)
    }
}

/// What is left to tell outboxd about one published batch.
#[derive(Debug)]
struct Settlement {
    lease_id: String,
    /// Confirmed by the broker.
    acks: Vec<String>,
    /// (reason, retry_after) -> ids: one Nack per distinct reason.
    nacks: BTreeMap<(String, Option<Duration>), Vec<String>>,
    /// Past this the lease has long expired and another worker owns the
    /// messages: transient failures are retried until then only.
    give_up: Instant,
}

impl Settlement {
    /// The acks alone, taken out to ride on a claim.
    fn take_acks(&mut self) -> Option<Settlement> {
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

/// Capped exponential backoff for reconnects and retried calls.
const RETRY: BackoffPolicy = BackoffPolicy {
    base: Duration::from_millis(200),
    factor: 2.0,
    cap: Duration::from_secs(10),
    jitter: 0.2,
};

/// Released messages that never reached the broker come back this soon.
const FAILED_RETRY_AFTER: Duration = Duration::from_secs(1);

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
                        let delay = RETRY.delay(failures, &mut rand::rng());
                        if pause(stop, delay).await {
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
                    let delay = RETRY.delay(failures, &mut rand::rng());
                    if pause(stop, delay).await {
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

    /// Starts the settle calls for `work` once the slot's previous ones are
    /// done (normally long since: one round trip against a whole publish).
    async fn settle_later(&self, settling: &mut Option<JoinHandle<()>>, work: Option<Settlement>) {
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
    async fn carried(
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

    fn claim_request(&self, wait: Duration, acks: Option<&Settlement>) -> pb::ClaimBatchRequest {
        pb::ClaimBatchRequest {
            outbox: self.settings.outbox.clone(),
            worker_id: self.settings.worker_id.clone(),
            max_messages: self.settings.batch_size,
            lease_duration: Some(proto_duration(self.settings.lease)),
            wait: Some(proto_duration(wait)),
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
        let lease_id = batch.lease_id.clone();
        let half = self.settings.lease / 2;
        let deliveries = {
            let publish = self.publisher.publish(&batch.messages);
            tokio::pin!(publish);
            // A batch claimed ahead may be past its half lease already: then
            // it is extended at once.
            let mut next = claimed_at + half;
            loop {
                tokio::select! {
                    deliveries = &mut publish => break deliveries,
                    () = tokio::time::sleep_until(next) => {
                        extend(&self.leases, &self.settings, &lease_id).await;
                        next += half;
                    }
                }
            }
        };

        let reached_broker = deliveries.len() == batch.messages.len()
            && !deliveries.iter().any(|d| matches!(d, Delivery::Failed(_)));
        let mut acks = Vec::new();
        let mut nacks: BTreeMap<(String, Option<Duration>), Vec<String>> = BTreeMap::new();
        for (message, delivery) in batch.messages.iter().zip(deliveries) {
            match delivery {
                Delivery::Confirmed => acks.push(message.id.clone()),
                Delivery::Rejected(reason) => nacks
                    .entry((reason, None))
                    .or_default()
                    .push(message.id.clone()),
                Delivery::Failed(reason) => nacks
                    .entry((reason, Some(FAILED_RETRY_AFTER)))
                    .or_default()
                    .push(message.id.clone()),
            }
        }
        // A publisher that answered for fewer messages than it was given: the
        // rest are unconfirmed, so they are released, never acked.
        let answered = acks.len() + nacks.values().map(Vec::len).sum::<usize>();
        if answered < batch.messages.len() {
            let missing = batch.messages[answered..].iter().map(|m| m.id.clone());
            nacks
                .entry(("publisher gave no outcome".into(), Some(FAILED_RETRY_AFTER)))
                .or_default()
                .extend(missing);
        }

        let done = Settlement {
            lease_id,
            acks,
            nacks,
            give_up: Instant::now() + self.settings.lease * 2,
        };
        (done, reached_broker)
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

async fn extend<L: Leases>(leases: &L, settings: &Settings, lease_id: &str) {
    let req = pb::ExtendLeaseRequest {
        outbox: settings.outbox.clone(),
        lease_id: lease_id.to_owned(),
        message_ids: Vec::new(),
        lease_duration: Some(proto_duration(settings.lease)),
    };
    match leases.extend(req).await {
        Ok(resp) => tracing::debug!(
            lease_id,
            extended = resp.results.len(),
            "lease extended while publishing"
        ),
        Err(status) => {
            tracing::warn!(lease_id, code = ?status.code(), "could not extend lease; publishing on")
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

fn is_transient(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::Unknown
            | Code::Cancelled
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Sleeps unless stopped first; true when stopped.
async fn pause(stop: &CancellationToken, delay: Duration) -> bool {
    tokio::select! {
        () = stop.cancelled() => true,
        () = tokio::time::sleep(delay) => false,
    }
}

fn proto_duration(d: Duration) -> prost_types::Duration {
    prost_types::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::VecDeque,
        sync::{Arc, Mutex},
    };

    use super::*;

    /// Hands out scripted claim results and records every settle call.
    #[derive(Clone, Default)]
    struct FakeLeases(Arc<Mutex<Script>>);

    #[derive(Default)]
    struct Script {
        claims: VecDeque<Result<pb::ClaimBatchResponse, Status>>,
        /// Every ack applied, in order: Ack calls and acks a claim carried.
        acks: Vec<pb::AckRequest>,
        /// The leases whose acks came by Ack call, in order.
        ack_calls: Vec<String>,
        /// Per claim, the leases whose acks it carried.
        carried: Vec<Vec<String>>,
        /// Play a server older than carried acks: drop them unread.
        ignore_carried: bool,
        nacks: Vec<pb::NackRequest>,
        extends: Vec<Instant>,
        /// When each claim was made and how long it was allowed to wait.
        claimed: Vec<(Instant, Duration)>,
        stop_when_empty: Option<CancellationToken>,
    }

    impl FakeLeases {
        fn script<T>(&self, f: impl FnOnce(&mut Script) -> T) -> T {
            f(&mut self.0.lock().expect("fake lock"))
        }
    }

    impl Leases for FakeLeases {
        async fn claim(
            &self,
            req: pb::ClaimBatchRequest,
        ) -> Result<pb::ClaimBatchResponse, Status> {
            let wait = req.wait.map_or(Duration::ZERO, |w| {
                Duration::from_secs(u64::try_from(w.seconds).unwrap_or(0))
            });
            let next = self.script(|s| {
                s.claimed.push((Instant::now(), wait));
                s.carried
                    .push(req.acks.iter().map(|a| a.lease_id.clone()).collect());
                let next = s.claims.pop_front();
                if let Some(stop) = s.stop_when_empty.as_ref().filter(|_| s.claims.is_empty()) {
                    stop.cancel();
                }
                next
            });
            let mut resp = next.unwrap_or_else(|| Ok(pb::ClaimBatchResponse::default()))?;
            // Like the server: acks applied only when the claim succeeds.
            if !self.script(|s| s.ignore_carried) {
                for ack in req.acks {
                    let ack = pb::AckRequest {
                        outbox: req.outbox.clone(),
                        lease_id: ack.lease_id,
                        message_ids: ack.message_ids,
                    };
                    resp.ack_results.extend(ok_results(&ack.message_ids));
                    self.script(|s| s.acks.push(ack));
                }
            }
            Ok(resp)
        }

        async fn ack(&self, req: pb::AckRequest) -> Result<pb::AckResponse, Status> {
            let results = ok_results(&req.message_ids);
            self.script(|s| {
                s.ack_calls.push(req.lease_id.clone());
                s.acks.push(req);
            });
            Ok(pb::AckResponse { results })
        }

        async fn nack(&self, req: pb::NackRequest) -> Result<pb::NackResponse, Status> {
            self.script(|s| s.nacks.push(req));
            Ok(pb::NackResponse::default())
        }

        async fn extend(
            &self,
            _: pb::ExtendLeaseRequest,
        ) -> Result<pb::ExtendLeaseResponse, Status> {
            self.script(|s| s.extends.push(Instant::now()));
            Ok(pb::ExtendLeaseResponse::default())
        }
    }

    fn ok_results(ids: &[String]) -> Vec<pb::MessageResult> {
        ids.iter()
            .map(|id| pb::MessageResult {
                message_id: id.clone(),
                outcome: pb::Outcome::Ok.into(),
                detail: String::new(),
            })
            .collect()
    }

    /// Answers each message by a rule on its event type, after a delay, and
    /// logs when each batch started and ended (by its first message id).
    struct FakePublisher {
        delay: Duration,
        answer: fn(&pb::OutboxMessage) -> Option<Delivery>,
        log: Arc<Mutex<Vec<(Instant, Instant, String)>>>,
    }

    impl FakePublisher {
        fn new(delay: Duration) -> Self {
            Self {
                delay,
                answer: by_type,
                log: Arc::default(),
            }
        }
    }

    impl Publisher for FakePublisher {
        async fn ready(&mut self) -> Result<(), String> {
            Ok(())
        }

        async fn publish(&mut self, batch: &[pb::OutboxMessage]) -> Vec<Delivery> {
            let started = Instant::now();
            tokio::time::sleep(self.delay).await;
            let first = batch.first().map(|m| m.id.clone()).unwrap_or_default();
            self.log
                .lock()
                .expect("log lock")
                .push((started, Instant::now(), first));
            batch.iter().map_while(self.answer).collect()
        }
    }

    fn batch(types: &[&str]) -> pb::ClaimBatchResponse {
        leased("lease-1", "m", types)
    }

    fn leased(lease: &str, prefix: &str, types: &[&str]) -> pb::ClaimBatchResponse {
        pb::ClaimBatchResponse {
            lease_id: lease.into(),
            lease_expires_at: None,
            ack_results: Vec::new(),
            messages: types
                .iter()
                .enumerate()
                .map(|(i, t)| pb::OutboxMessage {
                    id: format!("{prefix}{i}"),
                    event_type: (*t).into(),
                    ..Default::default()
                })
                .collect(),
        }
    }

    fn by_type(m: &pb::OutboxMessage) -> Option<Delivery> {
        match m.event_type.as_str() {
            "ok" => Some(Delivery::Confirmed),
            "unroutable" => Some(Delivery::Rejected(
                "returned by broker: 312 NO_ROUTE".into(),
            )),
            "lost" => Some(Delivery::Failed("connection reset".into())),
            _ => None,
        }
    }

    async fn drive(
        claims: Vec<Result<pb::ClaimBatchResponse, Status>>,
        publisher: FakePublisher,
    ) -> FakeLeases {
        drive_with(claims, publisher, 10).await
    }

    async fn drive_with(
        claims: Vec<Result<pb::ClaimBatchResponse, Status>>,
        publisher: FakePublisher,
        batch_size: u32,
    ) -> FakeLeases {
        drive_as(claims, publisher, batch_size, true, false).await
    }

    /// Runs one slot over scripted claims until they are used up.
    async fn drive_as(
        claims: Vec<Result<pb::ClaimBatchResponse, Status>>,
        publisher: FakePublisher,
        batch_size: u32,
        ack_with_claim: bool,
        old_server: bool,
    ) -> FakeLeases {
        let leases = FakeLeases::default();
        let stop = CancellationToken::new();
        leases.script(|s| {
            s.claims = claims.into();
            s.stop_when_empty = Some(stop.clone());
            s.ignore_carried = old_server;
        });
        let settings = Arc::new(Settings {
            outbox: "default".into(),
            worker_id: "w1".into(),
            batch_size,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(1),
            claim_ahead: true,
            ack_with_claim,
        });
        Worker::new(leases.clone(), publisher, settings, Arc::default())
            .run(stop)
            .await;
        leases
    }

    #[tokio::test(start_paused = true)]
    async fn only_confirmed_messages_are_acked_and_the_rest_nacked_with_their_reason() {
        let publisher = FakePublisher::new(Duration::ZERO);
        let leases = drive(
            vec![Ok(batch(&["ok", "unroutable", "lost", "ok"]))],
            publisher,
        )
        .await;
        leases.script(|s| {
            assert_eq!(s.acks.len(), 1);
            assert_eq!(s.acks[0].message_ids, ["m0", "m3"]);
            assert_eq!(s.acks[0].lease_id, "lease-1");
            assert_eq!(s.nacks.len(), 2);
            let unroutable = s
                .nacks
                .iter()
                .find(|n| n.message_ids == ["m1"])
                .expect("m1 nacked");
            assert!(unroutable.error.contains("NO_ROUTE"));
            assert_eq!(
                unroutable.retry_after, None,
                "broker refusals follow the outbox backoff"
            );
            let lost = s
                .nacks
                .iter()
                .find(|n| n.message_ids == ["m2"])
                .expect("m2 nacked");
            assert_eq!(lost.retry_after.map(|d| d.seconds), Some(1));
        });
    }

    #[tokio::test(start_paused = true)]
    async fn messages_without_an_outcome_are_released_not_acked() {
        let publisher = FakePublisher::new(Duration::ZERO);
        let leases = drive(vec![Ok(batch(&["ok", "silent", "ok"]))], publisher).await;
        leases.script(|s| {
            assert_eq!(s.acks[0].message_ids, ["m0"]);
            let released: Vec<_> = s.nacks.iter().flat_map(|n| n.message_ids.clone()).collect();
            assert_eq!(released, ["m1", "m2"]);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_publish_keeps_its_lease_alive() {
        let publisher = FakePublisher::new(Duration::from_secs(40));
        let started = Instant::now();
        let leases = drive(vec![Ok(batch(&["ok"]))], publisher).await;
        leases.script(|s| {
            let at: Vec<u64> = s.extends.iter().map(|t| (*t - started).as_secs()).collect();
            assert_eq!(at, [15, 30], "extended at each half lease while publishing");
            assert_eq!(s.acks.len(), 1);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn an_unavailable_server_is_retried_not_fatal() {
        let publisher = FakePublisher::new(Duration::ZERO);
        let leases = drive(
            vec![
                Err(Status::unavailable("down")),
                Err(Status::unavailable("down")),
                Ok(batch(&["ok"])),
            ],
            publisher,
        )
        .await;
        leases.script(|s| assert_eq!(s.acks.len(), 1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_batch_claims_the_next_while_it_publishes_and_publishes_it_after() {
        let publisher = FakePublisher::new(Duration::from_secs(5));
        let log = Arc::clone(&publisher.log);
        let started = Instant::now();
        let leases = drive_with(
            vec![
                Ok(leased("lease-a", "a", &["ok", "ok"])),
                Ok(leased("lease-b", "b", &["ok", "ok"])),
                Ok(leased("lease-c", "c", &["ok"])),
            ],
            publisher,
            2,
        )
        .await;
        let secs = |t: Instant| (t - started).as_secs();
        leases.script(|s| {
            let claims: Vec<(u64, u64)> = s
                .claimed
                .iter()
                .map(|(at, wait)| (secs(*at), wait.as_secs()))
                .collect();
            // a: long-poll at 0; b: ahead, at once, while a publishes; c: ahead
            // while b publishes (b was full); c is short, so nothing after it.
            assert_eq!(claims, [(0, 1), (0, 0), (5, 0)]);
            let acked: Vec<&str> = s.acks.iter().map(|a| a.lease_id.as_str()).collect();
            assert_eq!(acked, ["lease-a", "lease-b", "lease-c"]);
        });
        let log = log.lock().expect("log lock");
        let order: Vec<&str> = log.iter().map(|(_, _, first)| first.as_str()).collect();
        assert_eq!(order, ["a0", "b0", "c0"], "batches publish in claim order");
        for pair in log.windows(2) {
            assert!(pair[1].0 >= pair[0].1, "one batch at a time: {log:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_short_batch_does_not_claim_ahead() {
        let publisher = FakePublisher::new(Duration::from_secs(5));
        let leases = drive_with(
            vec![
                Ok(leased("lease-a", "a", &["ok"])),
                Ok(leased("lease-b", "b", &["ok"])),
            ],
            publisher,
            2,
        )
        .await;
        leases.script(|s| {
            let waits: Vec<u64> = s.claimed.iter().map(|(_, w)| w.as_secs()).collect();
            assert_eq!(
                waits,
                [1, 1],
                "every claim a long poll after the last publish"
            );
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_claimed_ahead_keeps_its_lease_from_its_claim() {
        // Lease 30 s, extended at each half. a publishes 0..20 s; b, claimed at
        // 0, publishes 20..40 s: past its half lease when it starts, so it is
        // extended at once, then 15 s after its claim's next half.
        let publisher = FakePublisher::new(Duration::from_secs(20));
        let started = Instant::now();
        let leases = drive_with(
            vec![
                Ok(leased("lease-a", "a", &["ok", "ok"])),
                Ok(leased("lease-b", "b", &["ok"])),
            ],
            publisher,
            2,
        )
        .await;
        leases.script(|s| {
            let at: Vec<u64> = s.extends.iter().map(|t| (*t - started).as_secs()).collect();
            assert_eq!(at, [15, 20, 30]);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_publish_stops_claiming_ahead() {
        let publisher = FakePublisher::new(Duration::from_secs(1));
        let leases = drive_with(
            vec![
                Ok(leased("lease-a", "a", &["lost", "lost"])),
                Ok(leased("lease-b", "b", &["ok", "ok"])),
                Ok(leased("lease-c", "c", &["ok", "ok"])),
            ],
            publisher,
            2,
        )
        .await;
        leases.script(|s| {
            let waits: Vec<u64> = s.claimed.iter().map(|(_, w)| w.as_secs()).collect();
            // b was claimed ahead before a failed; after a's failure, c is a
            // plain claim made once b is done.
            assert_eq!(waits, [1, 0, 1]);
            assert_eq!(s.nacks.len(), 1);
            assert_eq!(s.acks.len(), 2);
        });
    }

    /// Three short batches (run with batch size 3), one slot: each claim
    /// follows the last publish.
    fn three_short_batches() -> Vec<Result<pb::ClaimBatchResponse, Status>> {
        vec![
            Ok(leased("lease-a", "a", &["ok"])),
            Ok(leased("lease-b", "b", &["ok", "lost"])),
            Ok(leased("lease-c", "c", &["ok"])),
        ]
    }

    fn acked_leases(s: &Script) -> Vec<&str> {
        s.acks.iter().map(|a| a.lease_id.as_str()).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_batch_is_acked_by_the_next_claim() {
        let publisher = FakePublisher::new(Duration::from_secs(1));
        let leases = drive_as(three_short_batches(), publisher, 3, true, false).await;
        leases.script(|s| {
            assert_eq!(
                s.carried,
                [
                    vec![],
                    vec!["lease-a".to_owned()],
                    vec!["lease-b".to_owned()]
                ]
            );
            assert_eq!(acked_leases(s), ["lease-a", "lease-b", "lease-c"]);
            assert_eq!(s.acks[1].message_ids, ["b0"], "only the confirmed one");
            // The last batch has no claim after it: the stop sends its ack.
            assert_eq!(s.ack_calls, ["lease-c"]);
            assert_eq!(s.nacks.len(), 1, "nacks are calls of their own");
        });
    }

    #[tokio::test(start_paused = true)]
    async fn without_ack_with_claim_every_ack_is_a_call() {
        let publisher = FakePublisher::new(Duration::from_secs(1));
        let leases = drive_as(three_short_batches(), publisher, 3, false, false).await;
        leases.script(|s| {
            assert!(s.carried.iter().all(Vec::is_empty), "{:?}", s.carried);
            assert_eq!(s.ack_calls, ["lease-a", "lease-b", "lease-c"]);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn acks_an_older_server_dropped_are_sent_again_as_calls() {
        let publisher = FakePublisher::new(Duration::from_secs(1));
        let leases = drive_as(three_short_batches(), publisher, 3, true, true).await;
        leases.script(|s| {
            // The second claim carried a's acks and got no results for them:
            // from then on acks are calls, a's included.
            assert_eq!(
                s.carried,
                [vec![], vec!["lease-a".to_owned()], Vec::<String>::new()]
            );
            assert_eq!(s.ack_calls, ["lease-a", "lease-b", "lease-c"]);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn the_acks_of_a_failed_claim_are_sent_as_a_call() {
        let publisher = FakePublisher::new(Duration::from_secs(1));
        let leases = drive_as(
            vec![
                Ok(leased("lease-a", "a", &["ok"])),
                Err(Status::unavailable("down")),
                Ok(leased("lease-b", "b", &["ok"])),
            ],
            publisher,
            2,
            true,
            false,
        )
        .await;
        leases.script(|s| {
            assert_eq!(s.carried[1], ["lease-a"], "the failed claim carried them");
            assert!(s.carried[2].is_empty(), "then an Ack took them");
            assert_eq!(s.ack_calls, ["lease-a", "lease-b"]);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_made_ahead_carries_the_acks_of_the_batch_before() {
        let publisher = FakePublisher::new(Duration::from_secs(5));
        let leases = drive_with(
            vec![
                Ok(leased("lease-a", "a", &["ok", "ok"])),
                Ok(leased("lease-b", "b", &["ok", "ok"])),
                Ok(leased("lease-c", "c", &["ok", "ok"])),
                Ok(leased("lease-d", "d", &["ok"])),
            ],
            publisher,
            2,
        )
        .await;
        leases.script(|s| {
            // a, then b ahead at once (nothing confirmed yet); c ahead when b
            // starts (a confirmed); d ahead when c starts (b confirmed). c's
            // acks find no claim before d is published, so they go as a call.
            assert_eq!(
                s.carried,
                [
                    vec![],
                    vec![],
                    vec!["lease-a".to_owned()],
                    vec!["lease-b".to_owned()]
                ]
            );
            assert_eq!(s.ack_calls, ["lease-c", "lease-d"]);
            assert_eq!(
                acked_leases(s),
                ["lease-a", "lease-b", "lease-c", "lease-d"]
            );
        });
    }
}
