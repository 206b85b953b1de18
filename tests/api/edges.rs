//! Small edges found by the fault campaign: each pins one reply.

use std::time::Duration;

use outboxd::grpc::pb::{ClaimBatchRequest, Outcome};
use serde_json::json;
use tonic::Code;
use uuid::Uuid;

use crate::support::{OK, TestApp, claim_request, ids, millis, secs, wait_until};

#[tokio::test]
async fn extending_a_lost_lease_reports_no_expiry() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let first = app.claim("w1", 1, secs(1), Duration::ZERO).await;
    let held = ids(&first);
    wait_until(secs(10), "the lease is re-claimed", async || {
        !app.claim("w2", 1, secs(60), Duration::ZERO)
            .await
            .messages
            .is_empty()
    })
    .await;
    let extended = app.extend(&first.lease_id, &held, secs(30)).await;
    let outcomes: Vec<i32> = extended.results.iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, vec![Outcome::LeaseLost as i32]);
    assert_eq!(extended.lease_expires_at, None, "nothing was extended");
}

#[tokio::test]
async fn an_unknown_outbox_name_is_echoed_only_in_part() {
    let app = TestApp::spawn().await;
    let name = "n".repeat(10_000);
    let status = app
        .try_claim(ClaimBatchRequest {
            outbox: name,
            ..claim_request("", "w", 1, secs(30), Duration::ZERO)
        })
        .await
        .expect_err("an unknown outbox");
    assert_eq!(status.code(), Code::NotFound);
    let message = status.message();
    assert!(message.len() < 200, "{} bytes: {message}", message.len());
    assert!(
        message.starts_with("outbox \"nnnn") && message.contains("\"… is not configured"),
        "the name's beginning is echoed, cut short: {message}"
    );
}

#[tokio::test]
async fn a_request_over_the_size_limit_is_resource_exhausted() {
    let app = TestApp::spawn().await;
    let status = app
        .try_claim(ClaimBatchRequest {
            worker_id: "w".repeat(5 * 1024 * 1024),
            ..claim_request("", "w", 1, secs(30), Duration::ZERO)
        })
        .await
        .expect_err("a 5 MiB request");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
}

#[tokio::test]
async fn headers_that_are_not_an_object_arrive_as_none_and_the_event_still_flows() {
    let app = TestApp::spawn().await;
    for headers in [json!(["a", "b"]), json!("text"), json!(null)] {
        app.insert_event(Uuid::new_v4(), "agg", "t", json!({}), headers)
            .await;
    }
    let batch = app.claim("w", 10, secs(30), millis(0)).await;
    assert_eq!(batch.messages.len(), 3);
    assert!(batch.messages.iter().all(|m| m.headers.is_empty()));
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK; 3]);
}
