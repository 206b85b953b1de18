//! Database down: RPCs are UNAVAILABLE (retryable, never INTERNAL), health goes
//! NOT_SERVING, and both come back when the database does.

use std::time::Duration;

use outboxd::grpc::pb::{AckRequest, ExtendLeaseRequest, GetStatsRequest, NackRequest};
use tonic::{Code, Status};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::{
    OK, Proxy, TestApp, TestDb, claim_request, dur, ids, secs, strings, wait_until, within,
};

#[track_caller]
fn assert_unavailable<T: std::fmt::Debug>(result: Result<T, Status>, rpc: &str) {
    match result {
        Ok(answer) => panic!("{rpc} answered without a database: {answer:?}"),
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{rpc}: {status:?}"),
    }
}

/// Every RPC, with requests that would succeed if the database were there.
async fn every_rpc_is_unavailable(app: &TestApp, lease: &str, held: &[String]) {
    let mut client = app.client.clone();
    assert_unavailable(
        client
            .claim_batch(claim_request("", "w", 10, secs(30), Duration::ZERO))
            .await,
        "ClaimBatch",
    );
    assert_unavailable(
        client
            .claim_batch(claim_request("", "w", 10, secs(30), secs(5)))
            .await,
        "ClaimBatch with wait",
    );
    let ack = AckRequest {
        outbox: String::new(),
        lease_id: lease.into(),
        message_ids: held.to_vec(),
    };
    assert_unavailable(client.ack(ack).await, "Ack");
    let nack = NackRequest {
        lease_id: lease.into(),
        message_ids: held.to_vec(),
        ..NackRequest::default()
    };
    assert_unavailable(client.nack(nack).await, "Nack");
    let extend = ExtendLeaseRequest {
        outbox: String::new(),
        lease_id: lease.into(),
        message_ids: held.to_vec(),
        lease_duration: dur(secs(60)),
    };
    assert_unavailable(client.extend_lease(extend).await, "ExtendLease");
    assert_unavailable(
        client.get_stats(GetStatsRequest::default()).await,
        "GetStats",
    );
}

#[tokio::test]
async fn database_down_gives_unavailable_and_not_serving_until_it_returns() {
    let app = TestApp::spawn().await;
    app.insert(2).await;
    let held = app.claim("w", 1, secs(60), Duration::ZERO).await;
    assert_eq!(app.health_both().await, Some(ServingStatus::Serving));

    app.proxy.take_down();
    // First on the pooled connections the cut just broke...
    every_rpc_is_unavailable(&app, &held.lease_id, &ids(&held)).await;
    wait_until(secs(5), "health reports NOT_SERVING", async || {
        app.health_both().await == Some(ServingStatus::NotServing)
    })
    .await;
    // ...then on new connections the database refuses.
    every_rpc_is_unavailable(&app, &held.lease_id, &ids(&held)).await;

    app.proxy.bring_back();
    wait_until(secs(10), "health reports SERVING again", async || {
        app.health_both().await == Some(ServingStatus::Serving)
    })
    .await;
    let batch = app.claim("w", 10, secs(60), Duration::ZERO).await;
    assert_eq!(batch.messages.len(), 1, "the other row is claimable again");
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK]);
    assert_eq!(
        app.ack(&held.lease_id, &ids(&held)).await,
        [OK],
        "a lease taken before the outage still settles after it"
    );
}

#[tokio::test]
async fn a_server_started_before_its_database_waits_for_it() {
    let db = TestDb::create().await;
    let proxy = Proxy::start(db.upstream()).await;
    proxy.take_down();
    let starting = tokio::spawn(TestApp::spawn_behind(db, proxy.clone(), |_| {}));
    wait_until(
        secs(10),
        "start-up has tried the database twice",
        async || proxy.refused() >= 2,
    )
    .await;
    assert!(
        !starting.is_finished(),
        "start-up retries the database instead of failing"
    );

    proxy.bring_back();
    let app = within(secs(15), "start-up once the database answers", starting)
        .await
        .expect("start-up task")
        .expect("the server starts once the database answers");
    assert_eq!(app.health_both().await, Some(ServingStatus::Serving));
    let inserted = app.insert(1).await;
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&batch), strings(&inserted));
}

#[tokio::test]
async fn a_claim_that_waited_through_an_outage_is_woken_by_the_probe_once_the_database_returns() {
    let app = TestApp::spawn_with(|args| {
        args.set("--poll-interval", "30s").set("--max-wait", "1m");
    })
    .await;
    let claims = app.count_claims("public.outbox").await;
    let waiter = app.spawn_claim(claim_request("", "w", 10, secs(30), secs(60)));
    wait_until(secs(5), "the claim is waiting", async || {
        claims.get().await >= 1
    })
    .await;

    // The watcher probes for the waiting claim, and fails, while the
    // database is away.
    app.proxy.take_down();
    wait_until(secs(5), "health reports NOT_SERVING", async || {
        app.health_both().await == Some(ServingStatus::NotServing)
    })
    .await;
    app.proxy.bring_back();
    wait_until(secs(15), "health reports SERVING again", async || {
        app.health_both().await == Some(ServingStatus::Serving)
    })
    .await;

    let inserted = app.insert(1).await;
    let committed = std::time::Instant::now();
    let batch = within(secs(10), "the waiting claim", waiter)
        .await
        .expect("waiter task")
        .expect("ClaimBatch");
    let latency = committed.elapsed();
    assert_eq!(ids(&batch), strings(&inserted));
    assert!(
        latency < secs(2),
        "woken {latency:?} after the commit; the poll interval is 30 s"
    );
}
