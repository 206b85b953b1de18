//! One in-flight slot: claim (long-poll) → publish with confirms → ack the
//! confirmed, nack the rest → again. Never acks what the broker did not confirm.
//!
//! The settle calls of a batch run while the slot claims and publishes the next
//! one: the ack round trip is off the critical path, so one slot keeps the broker
//! busy instead of waiting on outboxd twice per batch. At most one batch per slot
//! is being settled at a time, so settling can never fall behind without bound.
//!
//! With claim-ahead, a slot that got a full batch (a backlog) also claims its
//! next batch while the first one publishes, without waiting, so the claim round
//! trip is off the critical path too. The batch claimed ahead is not published
//! before the current one is confirmed: a slot still publishes one batch at a
//! time, in order, and a crash still redelivers at most two batches per slot
//! (one being settled, one being published), claim-ahead or not.

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
    /// Claim the next batch while a full one publishes.
    pub claim_ahead: bool,
}

/// A claim on its way, and when it was sent: the lease runs from there.
type Ahead = (Instant, JoinHandle<Result<pb::ClaimBatchResponse, Status>>);

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
        let mut ahead: Option<Ahead> = None;
        // Whether the last publish reached the broker; claiming ahead while it
        // is unreachable would only cost the next batch an attempt.
        let mut broker_ok = true;
        loop {
            let (claimed_at, claim) = match ahead.take() {
                // Claimed already: published even after a stop, like any batch
                // in hand, rather than left to wait out its lease.
                Some((claimed_at, handle)) => (
                    claimed_at,
                    handle
                        .await
                        .unwrap_or_else(|e| Err(Status::internal(e.to_string()))),
                ),
                None => {
                    if stop.is_cancelled() {
                        break;
                    }
                    if self.publisher.ready().await.is_err() {
                        failures += 1;
                        let delay = RETRY.delay(failures, &mut rand::rng());
                        if pause(stop, delay).await {
                            break;
                        }
                        continue;
                    }
                    let claimed_at = Instant::now();
                    tokio::select! {
                        () = stop.cancelled() => break,
                        claim = self.leases.claim(self.claim_request(self.settings.wait)) => (claimed_at, claim),
                    }
                }
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
            // A full batch means a backlog: claim the next one now, without
            // waiting, so it is in hand when this one is confirmed.
            if self.settings.claim_ahead
                && broker_ok
                && batch.messages.len() >= self.settings.batch_size as usize
                && !stop.is_cancelled()
            {
                let leases = self.leases.clone();
                let req = self.claim_request(Duration::ZERO);
                ahead = Some((
                    Instant::now(),
                    tokio::spawn(async move { leases.claim(req).await }),
                ));
            }
            let (settle, reached_broker) = self.relay(batch, claimed_at).await;
            broker_ok = reached_broker;
            if let Some(previous) = settling.take() {
                // Normally long done: one ack round trip against a whole publish.
                let _ = previous.await;
            }
            *settling = Some(tokio::spawn(settle));
        }
    }

    fn claim_request(&self, wait: Duration) -> pb::ClaimBatchRequest {
        pb::ClaimBatchRequest {
            outbox: self.settings.outbox.clone(),
            worker_id: self.settings.worker_id.clone(),
            max_messages: self.settings.batch_size,
            lease_duration: Some(proto_duration(self.settings.lease)),
            wait: Some(proto_duration(wait)),
        }
    }

    /// Publishes one claimed batch, extending its lease (which runs from
    /// `claimed_at`) while that runs long, and returns the settle calls (ack
    /// what the broker confirmed, nack the rest) and whether every message
    /// reached the broker, confirmed or refused.
    async fn relay(
        &mut self,
        batch: pb::ClaimBatchResponse,
        claimed_at: Instant,
    ) -> (impl Future<Output = ()> + Send + 'static, bool) {
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
        let settle = settle(
            self.leases.clone(),
            Arc::clone(&self.settings),
            lease_id,
            acks,
            nacks,
            give_up,
        );
        (settle, reached_broker)
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
        let leases = FakeLeases::default();
        let stop = CancellationToken::new();
        leases.script(|s| {
            s.claims = claims.into();
            s.stop_when_empty = Some(stop.clone());
        });
        let settings = Arc::new(Settings {
            outbox: "default".into(),
            worker_id: "w1".into(),
            batch_size,
            lease: Duration::from_secs(30),
            wait: Duration::from_secs(1),
            claim_ahead: true,
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
}
