//! The slot loop against scripted leases and a fake publisher, on paused time.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use super::*;
use crate::publishers::Delivery;

/// Hands out scripted claim results and records every settle call.
#[derive(Clone, Default)]
struct FakeLeases(Arc<Mutex<Script>>);

#[derive(Default)]
struct Script {
    claims: VecDeque<Result<pb::ClaimBatchResponse, Status>>,
    /// Answers for the next Ack calls, before they succeed.
    ack_failures: VecDeque<Status>,
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
    async fn claim(&self, req: pb::ClaimBatchRequest) -> Result<pb::ClaimBatchResponse, Status> {
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
            if let Some(failure) = s.ack_failures.pop_front() {
                return Err(failure);
            }
            s.acks.push(req);
            Ok(pb::AckResponse { results })
        })
    }

    async fn nack(&self, req: pb::NackRequest) -> Result<pb::NackResponse, Status> {
        self.script(|s| s.nacks.push(req));
        Ok(pb::NackResponse::default())
    }

    async fn extend(&self, _: pb::ExtendLeaseRequest) -> Result<pb::ExtendLeaseResponse, Status> {
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

/// outboxd answers UNAVAILABLE while its database is a standby in recovery
/// (a failover): the settle is retried until it lands, not dropped.
#[tokio::test(start_paused = true)]
async fn an_ack_answered_unavailable_is_retried() {
    let publisher = FakePublisher::new(Duration::ZERO);
    let leases = FakeLeases::default();
    leases.script(|s| {
        s.ack_failures = [
            Status::unavailable("database unavailable; retry with backoff"),
            Status::unavailable("database unavailable; retry with backoff"),
        ]
        .into();
    });
    let stop = CancellationToken::new();
    leases.script(|s| {
        s.claims = [Ok(batch(&["ok"]))].into();
        s.stop_when_empty = Some(stop.clone());
    });
    let settings = Arc::new(Settings {
        outbox: "default".into(),
        worker_id: "w1".into(),
        batch_size: 10,
        lease: Duration::from_secs(30),
        wait: Duration::from_secs(1),
        claim_ahead: true,
        ack_with_claim: false,
    });
    Worker::new(leases.clone(), publisher, settings, Arc::default())
        .run(stop)
        .await;
    leases.script(|s| {
        assert_eq!(
            s.ack_calls.len(),
            3,
            "two answered UNAVAILABLE, the third landed"
        );
        assert_eq!(s.acks.len(), 1);
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
