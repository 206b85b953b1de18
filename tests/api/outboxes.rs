//! Several outboxes on one server: each RPC names one, unknown names are
//! NOT_FOUND, and outboxes never see each other's rows or notifications.

use std::time::{Duration, Instant};

use outboxd::grpc::pb::{AckRequest, ExtendLeaseRequest, GetStatsRequest, NackRequest};
use uuid::Uuid;

use crate::support::{
    NOT_FOUND, OK, TestApp, assert_not_found, claim_request, dur, ids, millis, outcomes, secs,
    strings, wait_until, within,
};

#[tokio::test]
async fn an_unknown_outbox_is_not_found_for_every_rpc() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let before = app.snapshot("outbox").await;
    let mut client = app.client.clone();
    let lease = Uuid::new_v4().to_string();
    let id = Uuid::new_v4().to_string();

    assert_not_found(
        client
            .claim_batch(claim_request("nope", "w", 1, secs(30), Duration::ZERO))
            .await,
        "ClaimBatch",
    );
    let started = Instant::now();
    assert_not_found(
        client
            .claim_batch(claim_request("nope", "w", 1, secs(30), secs(5)))
            .await,
        "ClaimBatch with wait",
    );
    assert!(
        started.elapsed() < secs(2),
        "refused at once, not after the wait"
    );
    let ack = AckRequest {
        outbox: "nope".into(),
        lease_id: lease.clone(),
        message_ids: vec![id.clone()],
    };
    assert_not_found(client.ack(ack).await, "Ack");
    let nack = NackRequest {
        outbox: "nope".into(),
        lease_id: lease.clone(),
        message_ids: vec![id.clone()],
        ..NackRequest::default()
    };
    assert_not_found(client.nack(nack).await, "Nack");
    let extend = ExtendLeaseRequest {
        outbox: "nope".into(),
        lease_id: lease,
        message_ids: vec![id],
        lease_duration: dur(secs(30)),
    };
    assert_not_found(client.extend_lease(extend).await, "ExtendLease");
    assert_not_found(
        client
            .get_stats(GetStatsRequest {
                outbox: "nope".into(),
            })
            .await,
        "GetStats",
    );
    assert_eq!(app.snapshot("outbox").await, before);
}

#[tokio::test]
async fn the_empty_outbox_name_means_default() {
    let app = TestApp::spawn().await;
    let inserted = strings(&app.insert(2).await);
    let first = app
        .claim_from("default", "w", 1, secs(30), Duration::ZERO)
        .await;
    let second = app.claim_from("", "w", 1, secs(30), Duration::ZERO).await;
    assert_eq!([ids(&first), ids(&second)].concat(), inserted);
    assert_eq!(app.ack_in("", &first.lease_id, &ids(&first)).await, [OK]);
    assert_eq!(
        app.ack_in("default", &second.lease_id, &ids(&second)).await,
        [OK]
    );
}

#[tokio::test]
async fn two_outboxes_are_isolated() {
    let app = TestApp::spawn_with(|args| {
        args.add("--outbox", "default=public.outbox")
            .add("--outbox", "orders=public.orders_outbox")
            .set("--poll-interval", "5s");
    })
    .await;
    let defaults = strings(&app.insert_into("public.outbox", 2).await);
    let orders = strings(&app.insert_into("public.orders_outbox", 3).await);

    let from_orders = app
        .claim_from("orders", "w", 10, secs(30), Duration::ZERO)
        .await;
    assert_eq!(ids(&from_orders), orders);
    let from_default = app
        .claim_from("default", "w", 10, secs(30), Duration::ZERO)
        .await;
    assert_eq!(ids(&from_default), defaults);

    // An id of one outbox does not exist in the other, whatever the lease.
    assert_eq!(
        app.ack_in("default", &from_orders.lease_id, &orders).await,
        [NOT_FOUND; 3]
    );
    assert_eq!(
        app.ack_in("orders", &from_default.lease_id, &defaults)
            .await,
        [NOT_FOUND; 2]
    );
    let mut client = app.client.clone();
    let nack = NackRequest {
        outbox: "orders".into(),
        lease_id: from_default.lease_id.clone(),
        message_ids: defaults.clone(),
        ..NackRequest::default()
    };
    let results = client.nack(nack).await.expect("Nack").into_inner().results;
    assert_eq!(outcomes(&defaults, &results), [NOT_FOUND; 2]);
    let extend = ExtendLeaseRequest {
        outbox: "default".into(),
        lease_id: from_orders.lease_id.clone(),
        message_ids: orders.clone(),
        lease_duration: dur(secs(60)),
    };
    let results = client
        .extend_lease(extend)
        .await
        .expect("ExtendLease")
        .into_inner()
        .results;
    assert_eq!(outcomes(&orders, &results), [NOT_FOUND; 3]);

    assert_eq!(
        app.ack_in("orders", &from_orders.lease_id, &orders).await,
        [OK; 3]
    );
    assert_eq!(app.stats_of("orders").await.published_retained, 3);
    assert_eq!(app.stats_of("default").await.published_retained, 0);
    assert_eq!(app.stats_of("default").await.in_flight, 2);

    // A commit to one outbox does not wake a claim waiting on the other. The
    // orders rows above were committed while nobody waited, so the orders
    // outbox owes its next waiter a wake-up (see `watch`): a short claim takes
    // it first.
    app.claim_from("orders", "w", 10, secs(30), millis(300))
        .await;
    let order_claims = app.count_claims("public.orders_outbox").await;
    let waiter = app.spawn_claim(claim_request("orders", "w", 10, secs(30), secs(2)));
    wait_until(secs(5), "the orders claim is waiting", async || {
        order_claims.get().await >= 1
    })
    .await;
    app.insert_into("public.outbox", 1).await;
    let batch = within(secs(5), "the orders claim", waiter)
        .await
        .expect("waiter task")
        .expect("ClaimBatch");
    assert!(
        batch.messages.is_empty(),
        "nothing of the default outbox came through orders"
    );
    assert_eq!(
        order_claims.get().await,
        2,
        "the orders waiter was not woken by the other table"
    );
}
