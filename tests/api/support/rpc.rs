//! The relay worker's side: RPC wrappers that fail the test on an RPC error
//! (or a hang), request builders, and helpers that read answers.

use std::{
    fmt::Debug,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use outboxd::grpc::pb::{
    self, AckRequest, ClaimBatchRequest, ClaimBatchResponse, DiscardRequest, ExtendLeaseRequest,
    ExtendLeaseResponse, GetStatsRequest, GetStatsResponse, ListBlockedKeysRequest,
    ListBlockedKeysResponse, ListDeadLettersRequest, ListDeadLettersResponse, MessageResult,
    NackRequest, Outcome, RedriveRequest, outbox_admin_client::OutboxAdminClient,
};
use tonic::{Code, Status, transport::Channel};
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};
use tonic_types::StatusExt;
use uuid::Uuid;

use tokio::task::JoinHandle;

use super::{TestApp, app::RPC_GUARD, rows::ClaimCounter, secs, wait_until, within};

pub use pb::Outcome::{
    AlreadyDone as ALREADY_DONE, DeadLettered as DEAD_LETTERED, LeaseLost as LEASE_LOST,
    NotFound as NOT_FOUND, Ok as OK,
};

impl TestApp {
    pub async fn claim(
        &self,
        worker: &str,
        max: u32,
        lease: Duration,
        wait: Duration,
    ) -> ClaimBatchResponse {
        self.claim_from("", worker, max, lease, wait).await
    }

    pub async fn claim_from(
        &self,
        outbox: &str,
        worker: &str,
        max: u32,
        lease: Duration,
        wait: Duration,
    ) -> ClaimBatchResponse {
        self.try_claim(claim_request(outbox, worker, max, lease, wait))
            .await
            .unwrap_or_else(|s| panic!("ClaimBatch failed: {s:?}"))
    }

    /// Whether a claim now (no wait, up to ten rows) comes back empty.
    pub async fn nothing_to_claim(&self) -> bool {
        self.claim("probe", 10, secs(30), Duration::ZERO)
            .await
            .messages
            .is_empty()
    }

    /// A ClaimBatch (a long poll) that runs in the background; the task ends with its answer.
    pub fn spawn_claim(
        &self,
        req: ClaimBatchRequest,
    ) -> JoinHandle<Result<ClaimBatchResponse, Status>> {
        let mut client = self.client.clone();
        tokio::spawn(async move {
            client
                .claim_batch(req)
                .await
                .map(tonic::Response::into_inner)
        })
    }

    /// A long poll that has looked once (counted by `claims`) and waits gets
    /// the one event committed then: how long after the commit it answered.
    pub async fn wake_latency(&self, claims: &ClaimCounter) -> Duration {
        let looked = claims.get().await;
        let waiter = self.spawn_claim(claim_request("", "w", 10, secs(30), secs(10)));
        wait_until(
            secs(5),
            "the claim has looked once and is waiting",
            async || claims.get().await > looked,
        )
        .await;
        let inserted = self.insert(1).await;
        let committed = Instant::now();
        let batch = within(secs(12), "the waiting claim", waiter)
            .await
            .expect("the waiter task panicked")
            .expect("ClaimBatch");
        let latency = committed.elapsed();
        assert_eq!(ids(&batch), strings(&inserted), "the committed event");
        latency
    }

    pub async fn try_claim(&self, req: ClaimBatchRequest) -> Result<ClaimBatchResponse, Status> {
        let wait = req.wait.map_or(Duration::ZERO, |w| {
            Duration::try_from(w).unwrap_or(Duration::ZERO)
        });
        let mut client = self.client.clone();
        within(RPC_GUARD + wait, "ClaimBatch", client.claim_batch(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Acks `ids` under `lease_id`; checks there is one result per id, in order.
    pub async fn ack(&self, lease_id: &str, ids: &[impl AsRef<str>]) -> Vec<Outcome> {
        self.ack_in("", lease_id, ids).await
    }

    pub async fn ack_in(
        &self,
        outbox: &str,
        lease_id: &str,
        ids: &[impl AsRef<str>],
    ) -> Vec<Outcome> {
        let req = AckRequest {
            outbox: outbox.into(),
            lease_id: lease_id.into(),
            message_ids: owned(ids),
        };
        let mut client = self.client.clone();
        let resp = within(RPC_GUARD, "Ack", client.ack(req))
            .await
            .unwrap_or_else(|s| panic!("Ack failed: {s:?}"));
        outcomes(ids, &resp.into_inner().results)
    }

    pub async fn nack(&self, req: NackRequest) -> Vec<Outcome> {
        let ids = req.message_ids.clone();
        let mut client = self.client.clone();
        let resp = within(RPC_GUARD, "Nack", client.nack(req))
            .await
            .unwrap_or_else(|s| panic!("Nack failed: {s:?}"));
        outcomes(&ids, &resp.into_inner().results)
    }

    /// Nack with an explicit retry delay (`None`: the outbox's backoff).
    pub async fn nack_retry(
        &self,
        lease_id: &str,
        ids: &[impl AsRef<str>],
        retry_after: Option<Duration>,
    ) -> Vec<Outcome> {
        self.nack(NackRequest {
            lease_id: lease_id.into(),
            message_ids: owned(ids),
            error: "broker said no".into(),
            retry_after: retry_after.and_then(dur),
            ..NackRequest::default()
        })
        .await
    }

    pub async fn extend(
        &self,
        lease_id: &str,
        ids: &[impl AsRef<str>],
        lease: Duration,
    ) -> ExtendLeaseResponse {
        self.try_extend(lease_id, ids, lease)
            .await
            .unwrap_or_else(|s| panic!("ExtendLease failed: {s:?}"))
    }

    pub async fn try_extend(
        &self,
        lease_id: &str,
        ids: &[impl AsRef<str>],
        lease: Duration,
    ) -> Result<ExtendLeaseResponse, Status> {
        let req = ExtendLeaseRequest {
            outbox: String::new(),
            lease_id: lease_id.into(),
            message_ids: owned(ids),
            lease_duration: dur(lease),
        };
        let mut client = self.client.clone();
        within(RPC_GUARD, "ExtendLease", client.extend_lease(req))
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn stats(&self) -> GetStatsResponse {
        self.stats_of("").await
    }

    pub async fn stats_of(&self, outbox: &str) -> GetStatsResponse {
        let mut client = self.client.clone();
        within(
            RPC_GUARD,
            "GetStats",
            client.get_stats(GetStatsRequest {
                outbox: outbox.into(),
            }),
        )
        .await
        .unwrap_or_else(|s| panic!("GetStats failed: {s:?}"))
        .into_inner()
    }

    /// The health service's answer for `service` ("" is the whole server).
    pub async fn health_of(&self, service: &str) -> Result<ServingStatus, Status> {
        let mut health = self.health.clone();
        let resp = within(
            RPC_GUARD,
            "Health/Check",
            health.check(HealthCheckRequest {
                service: service.into(),
            }),
        )
        .await?;
        Ok(ServingStatus::try_from(resp.into_inner().status).unwrap_or(ServingStatus::Unknown))
    }

    /// Health of both names outboxd reports, when they agree.
    pub async fn health_both(&self) -> Option<ServingStatus> {
        let all = self.health_of("").await.ok()?;
        let api = self.health_of(outboxd::server::SERVICE_NAME).await.ok()?;
        (all == api).then_some(all)
    }
}

/// The operator's side: `outbox.v1.OutboxAdmin`, on the server's one port.
/// The `try_` calls hand back the status; the others fail the test on one.
impl TestApp {
    /// An admin client on a connection of its own.
    /// GetDatabaseReport, or `None` when it fails (before the watchdog's
    /// first sample, say).
    pub async fn database_report(&self) -> Option<pb::GetDatabaseReportResponse> {
        let mut admin = self.admin().await;
        within(
            RPC_GUARD,
            "GetDatabaseReport",
            admin.get_database_report(pb::GetDatabaseReportRequest {}),
        )
        .await
        .ok()
        .map(tonic::Response::into_inner)
    }

    pub async fn admin(&self) -> OutboxAdminClient<Channel> {
        OutboxAdminClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect an admin client")
    }

    pub async fn try_list_dead_letters(
        &self,
        req: ListDeadLettersRequest,
    ) -> Result<ListDeadLettersResponse, Status> {
        let mut admin = self.admin().await;
        within(RPC_GUARD, "ListDeadLetters", admin.list_dead_letters(req))
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn list_dead_letters(&self, req: ListDeadLettersRequest) -> ListDeadLettersResponse {
        self.try_list_dead_letters(req)
            .await
            .unwrap_or_else(|s| panic!("ListDeadLetters failed: {s:?}"))
    }

    pub async fn try_list_blocked_keys(
        &self,
        req: ListBlockedKeysRequest,
    ) -> Result<ListBlockedKeysResponse, Status> {
        let mut admin = self.admin().await;
        within(RPC_GUARD, "ListBlockedKeys", admin.list_blocked_keys(req))
            .await
            .map(tonic::Response::into_inner)
    }

    pub async fn list_blocked_keys(&self, req: ListBlockedKeysRequest) -> ListBlockedKeysResponse {
        self.try_list_blocked_keys(req)
            .await
            .unwrap_or_else(|s| panic!("ListBlockedKeys failed: {s:?}"))
    }

    /// Redrive's count.
    pub async fn try_redrive(&self, req: RedriveRequest) -> Result<u64, Status> {
        let mut admin = self.admin().await;
        within(RPC_GUARD, "Redrive", admin.redrive(req))
            .await
            .map(|r| r.into_inner().redriven)
    }

    pub async fn redrive(&self, req: RedriveRequest) -> u64 {
        self.try_redrive(req)
            .await
            .unwrap_or_else(|s| panic!("Redrive failed: {s:?}"))
    }

    /// Discard's count.
    pub async fn try_discard(&self, outbox: &str, ids: &[impl AsRef<str>]) -> Result<u64, Status> {
        let req = DiscardRequest {
            outbox: outbox.into(),
            message_ids: owned(ids),
        };
        let mut admin = self.admin().await;
        within(RPC_GUARD, "Discard", admin.discard(req))
            .await
            .map(|r| r.into_inner().discarded)
    }

    pub async fn discard(&self, outbox: &str, ids: &[impl AsRef<str>]) -> u64 {
        self.try_discard(outbox, ids)
            .await
            .unwrap_or_else(|s| panic!("Discard failed: {s:?}"))
    }
}

pub fn claim_request(
    outbox: &str,
    worker: &str,
    max: u32,
    lease: Duration,
    wait: Duration,
) -> ClaimBatchRequest {
    ClaimBatchRequest {
        outbox: outbox.into(),
        worker_id: worker.into(),
        max_messages: max,
        lease_duration: dur(lease),
        wait: dur(wait),
        acks: Vec::new(),
        max_response_bytes: 0,
    }
}

/// A wire duration from seconds, negative ones included.
pub fn wire(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

/// A wire duration from a `Duration`.
pub fn dur(d: Duration) -> Option<prost_types::Duration> {
    Some(prost_types::Duration::try_from(d).expect("test durations fit a protobuf Duration"))
}

/// The ids of a claimed batch, in the order they came.
pub fn ids(batch: &ClaimBatchResponse) -> Vec<String> {
    batch.messages.iter().map(|m| m.id.clone()).collect()
}

/// Message ids as the wire wants them.
pub fn owned(ids: &[impl AsRef<str>]) -> Vec<String> {
    ids.iter().map(|id| id.as_ref().to_owned()).collect()
}

pub fn strings(ids: &[Uuid]) -> Vec<String> {
    ids.iter().map(Uuid::to_string).collect()
}

/// Outcomes of a settle call, after checking they answer `requested` one by one, in order.
pub fn outcomes(requested: &[impl AsRef<str>], results: &[MessageResult]) -> Vec<Outcome> {
    let answered: Vec<&str> = results.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(
        answered,
        requested.iter().map(AsRef::as_ref).collect::<Vec<&str>>(),
        "one result per requested id, in request order"
    );
    results
        .iter()
        .map(|r| {
            Outcome::try_from(r.outcome).unwrap_or_else(|_| panic!("unknown outcome {}", r.outcome))
        })
        .collect()
}

/// A wire timestamp as chrono time.
pub fn time(ts: Option<prost_types::Timestamp>) -> DateTime<Utc> {
    let ts = ts.expect("timestamp is set");
    DateTime::from_timestamp(
        ts.seconds,
        u32::try_from(ts.nanos).expect("nanos are non-negative"),
    )
    .expect("timestamp in range")
}

/// A wire duration as seconds.
pub fn seconds(d: Option<prost_types::Duration>) -> f64 {
    let d = d.expect("duration is set");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

/// An answer that must be NOT_FOUND naming the unknown outbox `nope`.
#[track_caller]
pub fn assert_not_found<T: Debug>(result: Result<T, Status>, rpc: &str) {
    let status = match result {
        Ok(answer) => panic!("{rpc} on an unknown outbox answered {answer:?}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::NotFound, "{rpc}: {status:?}");
    assert!(
        status.message().contains("nope"),
        "{rpc} names the outbox: {:?}",
        status.message()
    );
}

/// An answer that must be INVALID_ARGUMENT naming each of `fields`, in the
/// message and in google.rpc.BadRequest details, each violation saying why.
#[track_caller]
pub fn assert_invalid<T: Debug>(result: Result<T, Status>, fields: &[&str]) {
    let status = match result {
        Ok(answer) => panic!("a bad {fields:?} was accepted: {answer:?}"),
        Err(status) => status,
    };
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "bad {fields:?}: {status:?}"
    );
    let details = status.get_details_bad_request().unwrap_or_else(|| {
        panic!("bad {fields:?}: no google.rpc.BadRequest details in {status:?}")
    });
    let listed: Vec<&str> = details
        .field_violations
        .iter()
        .map(|v| v.field.as_str())
        .collect();
    for field in fields {
        assert!(
            status.message().contains(field),
            "the message names {field}: {:?}",
            status.message()
        );
        assert!(
            listed.contains(field),
            "BadRequest lists {field}: {listed:?}"
        );
    }
    assert!(
        details
            .field_violations
            .iter()
            .all(|v| !v.description.is_empty()),
        "each violation says why"
    );
}
