//! Claims are sized in bytes as well as in messages: a response stays within
//! `--max-claim-bytes`, an event larger than that goes out alone, and one over
//! `--max-message-bytes` is dead-lettered on sight without taking others with it.
//! Regression for the hole where one 10 MB row made every claim that included it
//! too large for the client, so its whole batch expired and was dead-lettered.

use std::time::Duration;

use serde_json::json;
use uuid::Uuid;

use crate::support::{OK, TestApp, claim_request, gauge, ids, secs, strings};

/// An event whose JSON payload is about `bytes` long.
async fn insert_sized(app: &TestApp, bytes: usize) -> Uuid {
    let id = Uuid::new_v4();
    app.insert_event(
        id,
        "agg",
        "test.sized",
        json!({ "pad": "x".repeat(bytes) }),
        json!({}),
    )
    .await;
    id
}

/// Claims until the outbox is empty; every batch is acked.
async fn drain(app: &TestApp, max: u32) -> Vec<Vec<String>> {
    let mut batches = Vec::new();
    loop {
        let batch = app.claim("w", max, secs(60), Duration::ZERO).await;
        if batch.messages.is_empty() {
            return batches;
        }
        let got = ids(&batch);
        assert_eq!(app.ack(&batch.lease_id, &got).await, vec![OK; got.len()]);
        batches.push(got);
    }
}

#[tokio::test]
async fn a_claim_is_cut_to_the_byte_budget_and_the_rest_follows() {
    let app = TestApp::spawn_with(|args| {
        args.set("--max-claim-bytes", "4096");
    })
    .await;
    let mut inserted = Vec::new();
    for _ in 0..10 {
        inserted.push(insert_sized(&app, 1000).await.to_string());
    }
    let batches = drain(&app, 100).await;
    assert!(
        batches.iter().all(|b| (1..=4).contains(&b.len())),
        "each batch within 4096 bytes: {:?}",
        batches.iter().map(Vec::len).collect::<Vec<_>>()
    );
    let delivered: Vec<String> = batches.concat();
    assert_eq!(delivered, inserted, "all of them, in order, once");
    assert_eq!(app.stats().await.dead_lettered, 0);
}

#[tokio::test]
async fn an_event_over_the_budget_goes_out_alone() {
    let app = TestApp::spawn_with(|args| {
        args.set("--max-claim-bytes", "4096")
            .set("--max-message-bytes", "100000");
    })
    .await;
    let small = insert_sized(&app, 100).await.to_string();
    let big = insert_sized(&app, 20_000).await.to_string();
    let after = insert_sized(&app, 100).await.to_string();
    let batches = drain(&app, 100).await;
    assert_eq!(batches, vec![vec![small], vec![big], vec![after]]);
}

#[tokio::test]
async fn an_event_over_the_message_limit_is_dead_lettered_alone_with_its_size() {
    let app = TestApp::spawn_with(|args| {
        args.set("--max-claim-bytes", "4096")
            .set("--max-message-bytes", "8192");
    })
    .await;
    let before = insert_sized(&app, 100).await;
    let huge = insert_sized(&app, 20_000).await;
    let after = insert_sized(&app, 100).await;
    let batch = app.claim("w", 100, secs(60), Duration::ZERO).await;
    assert_eq!(ids(&batch), strings(&[before, after]));
    let row = app.row(&huge.to_string()).await;
    assert!(row.dead_lettered_at.is_some(), "{row:?}");
    let error = row.last_error.unwrap_or_default();
    let size: u64 = error
        .split_once("event is ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("last_error names the event's size: {error}"));
    assert!(size > 20_000, "the event's size, {size} bytes: {error}");
    assert!(
        error.contains("over the 8192-byte limit (--max-message-bytes)"),
        "last_error names the limit: {error}"
    );
    assert_eq!(row.attempts, 0, "never delivered");
}

/// The original hole, with the default limits and a client that accepts what
/// gRPC clients accept by default (4 MiB): 70 healthy rows and one of 10 MB.
#[tokio::test]
async fn one_huge_row_no_longer_poisons_its_batch_at_the_default_limits() {
    let app = TestApp::spawn().await;
    let mut healthy = Vec::new();
    for i in 0..71 {
        if i == 35 {
            insert_sized(&app, 10 * 1024 * 1024).await;
        } else {
            // A few big-but-fine rows, so the budget, not the count, cuts batches.
            let size = if i % 10 == 0 { 900_000 } else { 500 };
            healthy.push(insert_sized(&app, size).await.to_string());
        }
    }
    let delivered: Vec<String> = drain(&app, 100).await.concat();
    assert_eq!(delivered, healthy, "every healthy row delivered, in order");
    let stats = app.stats().await;
    assert_eq!(stats.dead_lettered, 1, "only the 10 MB row");
    assert_eq!(stats.pending, 0);
}

/// Issue #46: an event between a stock client's 4 MiB and
/// `--max-message-bytes` (8 MiB) failed every claim of a plain gRPC client
/// that included it, each time spending an attempt. A client that states its
/// limit (`max_response_bytes`) is never sent more: such an event goes to none
/// of its claims, uses no attempt, is counted, and waits for a client that can
/// receive it.
#[tokio::test]
async fn a_client_is_never_sent_more_than_its_max_response_bytes() {
    let app = TestApp::spawn().await;
    let before = insert_sized(&app, 100).await;
    let big = insert_sized(&app, 5 * 1024 * 1024).await;
    let after = insert_sized(&app, 100).await;

    // The test's client keeps tonic's default 4 MiB receive limit, and says so.
    let mut stock = claim_request("", "stock", 100, secs(60), Duration::ZERO);
    stock.max_response_bytes = 4 * 1024 * 1024;
    let batch = app
        .try_claim(stock.clone())
        .await
        .expect("a response the client can receive");
    assert_eq!(ids(&batch), strings(&[before, after]));
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK, OK]);
    for _ in 0..3 {
        let batch = app.try_claim(stock.clone()).await.expect("receivable");
        assert!(
            batch.messages.is_empty(),
            "the big event is not for this client"
        );
    }
    let row = app.row(&big.to_string()).await;
    assert_eq!(row.attempts, 0, "no attempt spent: {row:?}");
    assert!(
        row.dead_lettered_at.is_none() && row.lease_left.is_none(),
        "{row:?}"
    );
    let passed_over = gauge(
        &app.scrape().await,
        "outbox_events_too_large_for_client_total",
        "default",
    );
    assert!(passed_over.is_some_and(|n| n >= 4.0), "{passed_over:?}");

    // A client that can receive it gets it, whole.
    let channel = app.endpoint().connect().await.expect("connect");
    let mut large = outboxd::grpc::pb::outbox_service_client::OutboxServiceClient::new(channel)
        .max_decoding_message_size(64 * 1024 * 1024);
    let mut req = stock.clone();
    req.max_response_bytes = 64 * 1024 * 1024;
    let batch = large.claim_batch(req).await.expect("claim").into_inner();
    assert_eq!(ids(&batch), strings(&[big]));
    assert_eq!(batch.messages[0].attempt, 1);

    // Too small a limit is a client's mistake, named.
    stock.max_response_bytes = 1000;
    crate::support::assert_invalid(app.try_claim(stock).await, &["max_response_bytes"]);
}
