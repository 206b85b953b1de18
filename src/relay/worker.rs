//! One in-flight slot: claim (long-poll) → publish with confirms → ack the
//! confirmed, nack the rest → again. Never acks what the broker did not confirm.
//!
//! The settle calls of a batch run while the slot claims and publishes the next
//! one: the ack round trip is off the critical path, so one slot keeps the broker
//! busy instead of waiting on outboxd twice per batch. At most one batch per slot
//! is being settled at a time, so settling can never fall behind without bound.

use std::{
    collections::BTreeMap,
    future::Future,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tokio::{task::JoinHandle, time::Instant};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use super::{
    leases::Leases,
    publisher::{Delivery, Publisher},
};
use crate::{grpc::pb, lease::BackoffPolicy};

/// What every slot of a relay process shares.
#[derive(Debug, Clone)]
pub struct Settings {
    pub outbox: String,
    pub worker_id: String,
    pub batch_size: u32,
    pub lease: Duration,
    pub wait: Duration,
}

/// outboxd's reachability as last reported, so each change is logged once.
#[derive(Debug)]
pub struct ServerLink {
    up: AtomicBool,
}

impl Default for ServerLink {
    fn default() -> Self {
        // Assume up: the first failure is then a change worth a line.
        Self {
            up: AtomicBool::new(true),
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
        self.claim_loop(&stop, &mut settling).await;
        if let Some(previous) = settling {
            let _ = previous.await;
        }
    }

    async fn claim_loop(
        &mut self,
        stop: &CancellationToken,
        settling: &mut Option<JoinHandle<()>>,
    ) {
        let mut failures = 0u32;
        while !stop.is_cancelled() {
            if self.publisher.ready().await.is_err() {
                failures += 1;
                let delay = RETRY.delay(failures, &mut rand::rng());
                if pause(stop, delay).await {
                    break;
                }
                continue;
            }
            let claim = tokio::select! {
                () = stop.cancelled() => break,
                claim = self.leases.claim(self.claim_request()) => claim,
            };
            let batch = match claim {
                Ok(batch) => {
                    self.server.up();
                    failures = 0;
                    batch
                }
                Err(status) => {
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
            let settle = self.relay(batch).await;
            if let Some(previous) = settling.take() {
                // Normally long done: one ack round trip against a whole publish.
                let _ = previous.await;
            }
            *settling = Some(tokio::spawn(settle));
        }
    }

    fn claim_request(&self) -> pb::ClaimBatchRequest {
        pb::ClaimBatchRequest {
            outbox: self.settings.outbox.clone(),
            worker_id: self.settings.worker_id.clone(),
            max_messages: self.settings.batch_size,
            lease_duration: Some(proto_duration(self.settings.lease)),
            wait: Some(proto_duration(self.settings.wait)),
        }
    }

    /// Publishes one claimed batch, extending its lease while that runs long, and
    /// returns the settle calls: ack what the broker confirmed, nack the rest.
    async fn relay(
        &mut self,
        batch: pb::ClaimBatchResponse,
    ) -> impl Future<Output = ()> + Send + 'static {
        let lease_id = batch.lease_id.clone();
        let half = self.settings.lease / 2;
        let deliveries = {
            let publish = self.publisher.publish(&batch.messages);
            tokio::pin!(publish);
            let mut next = Instant::now() + half;
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

        let mut acks = Vec::new();
        // (reason, retry_after) -> ids: one Nack per distinct reason.
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

        let give_up = Instant::now() + self.settings.lease * 2;
        settle(
            self.leases.clone(),
            Arc::clone(&self.settings),
            lease_id,
            acks,
            nacks,
            give_up,
        )
    }
}

/// Acks and nacks one published batch, retrying transient failures until
/// `give_up`.
async fn settle<L: Leases>(
    leases: L,
    settings: Arc<Settings>,
    lease_id: String,
    acks: Vec<String>,
    nacks: BTreeMap<(String, Option<Duration>), Vec<String>>,
    give_up: Instant,
) {
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
        acks: Vec<pb::AckRequest>,
        nacks: Vec<pb::NackRequest>,
        extends: Vec<Instant>,
        stop_when_empty: Option<CancellationToken>,
    }

    impl FakeLeases {
        fn script<T>(&self, f: impl FnOnce(&mut Script) -> T) -> T {
            f(&mut self.0.lock().expect("fake lock"))
        }
    }

    impl Leases for FakeLeases {
        async fn claim(&self, _: pb::ClaimBatchRequest) -> Result<pb::ClaimBatchResponse, Status> {
            let next = self.script(|s| {
                let next = s.claims.pop_front();
                if let Some(stop) = s.stop_when_empty.as_ref().filter(|_| s.claims.is_empty()) {
                    stop.cancel();
                }
                next
            });
            next.unwrap_or_else(|| Ok(pb::ClaimBatchResponse::default()))
        }

        async fn ack(&self, req: pb::AckRequest) -> Result<pb::AckResponse, Status> {
            let results = req
                .message_ids
                .iter()
                .map(|id| pb::MessageResult {
                    message_id: id.clone(),
                    outcome: pb::Outcome::Ok.into(),
                    detail: String::new(),
                })
                .collect();
            self.script(|s| s.acks.push(req));
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

    /// Answers each message by a rule on its event type, after a delay.
    struct FakePublisher {
        delay: Duration,
        answer: fn(&pb::OutboxMessage) -> Option<Delivery>,
    }

    impl Publisher for FakePublisher {
        async fn ready(&mut self) -> Result<(), String> {
            Ok(())
        }

        async fn publish(&mut self, batch: &[pb::OutboxMessage]) -> Vec<Delivery> {
            tokio::time::sleep(self.delay).await;
            batch.iter().map_while(self.answer).collect()
        }
    }

    fn batch(types: &[&str]) -> pb::ClaimBatchResponse {
        pb::ClaimBatchResponse {
            lease_id: "lease-1".into(),
            lease_expires_at: None,
            messages: types
                .iter()
                .enumerate()
                .map(|(i, t)| pb::OutboxMessage {
                    id: format!("m{i}"),
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
        let leases = FakeLeases::default();
        let stop = CancellationToken::new();
        leases.script(|s| {
            s.claims = claims.into();
            s.stop_when_empty = Some(stop.clone());
        });
        let settings = Arc::new(Settings {
            outbox: "default".into(),
            worker_id: "w1".into(),
            batch_size: 10,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(1),
        });
        Worker::new(leases.clone(), publisher, settings, Arc::default())
            .run(stop)
            .await;
        leases
    }

    #[tokio::test(start_paused = true)]
    async fn only_confirmed_messages_are_acked_and_the_rest_nacked_with_their_reason() {
        let publisher = FakePublisher {
            delay: Duration::ZERO,
            answer: by_type,
        };
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
        let publisher = FakePublisher {
            delay: Duration::ZERO,
            answer: by_type,
        };
        let leases = drive(vec![Ok(batch(&["ok", "silent", "ok"]))], publisher).await;
        leases.script(|s| {
            assert_eq!(s.acks[0].message_ids, ["m0"]);
            let released: Vec<_> = s.nacks.iter().flat_map(|n| n.message_ids.clone()).collect();
            assert_eq!(released, ["m1", "m2"]);
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_publish_keeps_its_lease_alive() {
        let publisher = FakePublisher {
            delay: Duration::from_secs(40),
            answer: by_type,
        };
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
        let publisher = FakePublisher {
            delay: Duration::ZERO,
            answer: by_type,
        };
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
}
