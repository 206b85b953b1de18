//! The case's workers: they claim, "publish" (record), ack and sometimes nack
//! over gRPC, spread over the outboxd replicas, moving on when one fails them.

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use chrono::{DateTime, TimeDelta, Utc};
use outboxd::grpc::pb::{
    self, AckRequest, ClaimBatchRequest, ClaimBatchResponse, MessageResult, NackRequest,
    outbox_service_client::OutboxServiceClient,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use tokio::{
    task::JoinHandle,
    time::{Instant, sleep},
};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, transport::Channel};

use crate::{
    history::{self, Claim, History, Settle, SettleKind},
    shared::wait::millis,
};

/// The workers' lease: short, so leases lost to a fault come back within the case.
pub const LEASE: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(1);
const BATCH: u32 = 50;
/// A claim's deadline: its long-poll plus room for a slow statement.
const CLAIM_DEADLINE: Duration = Duration::from_secs(4);
const SETTLE_DEADLINE: Duration = Duration::from_secs(3);
/// How long a worker keeps retrying one settle call before leaving its rows
/// to lease expiry, as a worker that gave up would.
const SETTLE_PATIENCE: Duration = Duration::from_secs(20);

/// The outboxd addresses workers spread over; a worker whose server fails it
/// moves on to the next one.
#[derive(Debug, Clone, Default)]
pub struct Targets(Arc<Mutex<Vec<String>>>);

impl Targets {
    pub fn new(urls: impl IntoIterator<Item = String>) -> Self {
        Self(Arc::new(Mutex::new(urls.into_iter().collect())))
    }

    fn pick(&self, n: usize) -> String {
        let urls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        urls[n % urls.len()].clone()
    }
}

/// A worker's connection: the target it uses and whether its last call
/// failed; it claims and settles over gRPC and records every call in the
/// history. A worker with one target reconnects to it after a failure.
pub struct Conn {
    targets: Targets,
    pick: usize,
    client: OutboxServiceClient<Channel>,
    failing: bool,
    history: History,
}

impl Conn {
    pub fn new(targets: Targets, pick: usize, history: History) -> Self {
        let client = connect_lazy(&targets.pick(pick));
        Self {
            targets,
            pick,
            client,
            failing: false,
            history,
        }
    }

    fn succeeded(&mut self) {
        if std::mem::take(&mut self.failing) {
            self.history.recovered();
        }
    }

    /// After a failed call: a fresh connection to the next target.
    async fn failed(&mut self, status: &Status) {
        let code = status.code();
        assert!(
            !matches!(
                code,
                Code::InvalidArgument
                    | Code::NotFound
                    | Code::OutOfRange
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::Unimplemented
            ),
            "a well-formed call was refused: {status:?}"
        );
        self.history.call_failed(format!("{code:?}"));
        self.failing = true;
        self.pick += 1;
        self.client = connect_lazy(&self.targets.pick(self.pick));
        // A worker's back-off before its next call, as a real one would.
        sleep(millis(100)).await;
    }

    /// One claim for `worker` (a long poll of `WAIT`, on a lease of `LEASE`),
    /// recorded; `None` when the call failed (after the back-off) or the
    /// batch is empty.
    pub async fn claim(&mut self, worker: &str) -> Option<ClaimBatchResponse> {
        let req = ClaimBatchRequest {
            outbox: String::new(),
            worker_id: worker.to_owned(),
            max_messages: BATCH,
            lease_duration: Some(LEASE.try_into().expect("fits")),
            wait: Some(WAIT.try_into().expect("fits")),
            acks: Vec::new(),
            max_response_bytes: 0,
        };
        let start = self.history.now();
        let result = call(
            CLAIM_DEADLINE,
            self.client.claim_batch(request(req, CLAIM_DEADLINE)),
        )
        .await;
        let end = self.history.now();
        let batch = match result {
            Ok(batch) => {
                self.succeeded();
                batch
            }
            Err(status) => {
                self.failed(&status).await;
                return None;
            }
        };
        if batch.messages.is_empty() {
            return None;
        }
        let expires_at = db_time(batch.lease_expires_at);
        self.history.claim(Claim {
            worker: worker.to_owned(),
            lease_id: batch.lease_id.clone(),
            messages: batch
                .messages
                .iter()
                .map(|m| (m.id.clone(), m.attempt))
                .collect(),
            start,
            end,
            claimed_at: expires_at - TimeDelta::from_std(LEASE).expect("fits"),
            expires_at,
        });
        Some(batch)
    }

    /// One settle call, repeated on failure (a repeated ack is ALREADY_DONE)
    /// for up to `SETTLE_PATIENCE`; every try is recorded.
    pub async fn settle(
        &mut self,
        worker: &str,
        kind: SettleKind,
        lease_id: &str,
        ids: Vec<String>,
    ) {
        self.settle_with(worker, kind, lease_id, ids, millis(100))
            .await;
    }

    /// A nack of `ids` asking for a retry after `retry`, as
    /// [`Conn::settle`] sends and records it; whether it was answered (the
    /// outcomes are in the history).
    pub async fn nack_after(
        &mut self,
        worker: &str,
        lease_id: &str,
        ids: Vec<String>,
        retry: Duration,
    ) {
        self.settle_with(worker, SettleKind::Nack, lease_id, ids, retry)
            .await;
    }

    async fn settle_with(
        &mut self,
        worker: &str,
        kind: SettleKind,
        lease_id: &str,
        ids: Vec<String>,
        retry: Duration,
    ) {
        let give_up = Instant::now() + SETTLE_PATIENCE;
        loop {
            let start = self.history.now();
            let result = match kind {
                SettleKind::Ack => {
                    let req = AckRequest {
                        outbox: String::new(),
                        lease_id: lease_id.into(),
                        message_ids: ids.clone(),
                    };
                    call(
                        SETTLE_DEADLINE,
                        self.client.ack(request(req, SETTLE_DEADLINE)),
                    )
                    .await
                    .map(|r| r.results)
                }
                SettleKind::Nack => {
                    let req = NackRequest {
                        outbox: String::new(),
                        lease_id: lease_id.into(),
                        message_ids: ids.clone(),
                        error: "the broker refused it".into(),
                        retry_after: Some(retry.try_into().expect("fits")),
                        dead_letter: false,
                    };
                    call(
                        SETTLE_DEADLINE,
                        self.client.nack(request(req, SETTLE_DEADLINE)),
                    )
                    .await
                    .map(|r| r.results)
                }
            };
            let end = self.history.now();
            let outcomes = match &result {
                Ok(results) => outcomes(&ids, results),
                Err(_) => ids
                    .iter()
                    .map(|id| (id.clone(), history::Outcome::Unknown))
                    .collect(),
            };
            self.history.settle(Settle {
                kind,
                worker: worker.into(),
                lease_id: lease_id.into(),
                start,
                end,
                outcomes,
            });
            match result {
                Ok(_) => {
                    self.succeeded();
                    return;
                }
                Err(status) => self.failed(&status).await,
            }
            if Instant::now() >= give_up {
                return;
            }
        }
    }
}

fn connect_lazy(url: &str) -> OutboxServiceClient<Channel> {
    let channel = Channel::from_shared(url.to_owned())
        .expect("a valid URL")
        .connect_timeout(millis(500))
        .connect_lazy();
    OutboxServiceClient::new(channel)
}

/// A request with a gRPC deadline, which the client also enforces itself.
async fn call<T>(
    deadline: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(deadline + millis(200), fut).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded("the client gave up")),
    }
}

fn request<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(deadline);
    req
}

fn outcomes(ids: &[String], results: &[MessageResult]) -> Vec<(String, history::Outcome)> {
    assert_eq!(
        results.iter().map(|r| &r.message_id).collect::<Vec<_>>(),
        ids.iter().collect::<Vec<_>>(),
        "one result per id, in request order"
    );
    results
        .iter()
        .map(|r| {
            let outcome = match pb::Outcome::try_from(r.outcome) {
                Ok(pb::Outcome::Ok) => history::Outcome::Ok,
                Ok(pb::Outcome::AlreadyDone) => history::Outcome::AlreadyDone,
                Ok(pb::Outcome::LeaseLost) => history::Outcome::LeaseLost,
                Ok(pb::Outcome::NotFound) => history::Outcome::NotFound,
                Ok(pb::Outcome::DeadLettered) => history::Outcome::DeadLettered,
                _ => panic!("outcome {} for {}", r.outcome, r.message_id),
            };
            (r.message_id.clone(), outcome)
        })
        .collect()
}

fn db_time(ts: Option<prost_types::Timestamp>) -> DateTime<Utc> {
    let ts = ts.expect("a claim with messages has an expiry");
    DateTime::from_timestamp(ts.seconds, u32::try_from(ts.nanos).expect("nanos >= 0"))
        .expect("a timestamp in range")
}

/// The case's workers; `stop` ends them after their current batch.
pub struct Workers {
    stop: CancellationToken,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    pub fn spawn(n: usize, targets: &Targets, history: &History) -> Self {
        Self::start((0..n).map(|i| {
            let conn = Conn::new(targets.clone(), i, history.clone());
            move |stop| work(format!("worker-{i}"), conn, stop, i as u64)
        }))
    }

    /// Workers of a case's own: each is handed the token that stops it.
    pub fn start<W, F>(workers: impl IntoIterator<Item = W>) -> Self
    where
        W: FnOnce(CancellationToken) -> F,
        F: Future<Output = ()> + Send + 'static,
    {
        let stop = CancellationToken::new();
        let handles = workers
            .into_iter()
            .map(|worker| tokio::spawn(worker(stop.clone())))
            .collect();
        Self { stop, handles }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        for handle in self.handles {
            handle.await.expect("a worker panicked");
        }
    }
}

/// Claim, publish (record), then ack the batch; now and then nack one message
/// (the broker refused it) or hold the batch past its lease (a slow publish).
async fn work(name: String, mut conn: Conn, stop: CancellationToken, seed: u64) {
    let history = conn.history.clone();
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.is_cancelled() {
        let Some(batch) = conn.claim(&name).await else {
            continue;
        };
        let lease_id = batch.lease_id.clone();
        let mut ids: Vec<String> = batch.messages.iter().map(|m| m.id.clone()).collect();
        if rng.random_bool(0.03) {
            // A publish slower than the lease: the rows may go to someone else
            // (expired leases are claimed again at the next poll, within 200 ms),
            // and this worker's ack lands while they may hold them.
            history.expose(ids.clone());
            // The slow publish itself: a schedule, not a wait for anything.
            sleep(LEASE + millis(150)).await;
        } else {
            // The broker's confirms take this long: a schedule, not a wait.
            sleep(millis(rng.random_range(10..150))).await;
        }
        let refused: Vec<String> = if rng.random_bool(0.05) {
            ids.drain(..1).collect()
        } else {
            Vec::new()
        };
        for id in &ids {
            history.delivered(id.clone(), Some(lease_id.clone()), None);
        }
        if !refused.is_empty() {
            history.expose(refused.clone());
            conn.settle(&name, SettleKind::Nack, &lease_id, refused)
                .await;
        }
        if !ids.is_empty() {
            conn.settle(&name, SettleKind::Ack, &lease_id, ids).await;
        }
    }
}
