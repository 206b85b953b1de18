//! Traces reach an in-process OTLP collector; metrics move on `/metrics`.

use serde_json::json;
use tonic::Request;
use uuid::Uuid;

use crate::support::{LEASE_LOST, OK, TestApp, millis, otlp::collector, secs, wait_until};
use outboxd::grpc::pb::AckRequest;

/// A fresh W3C trace context: (traceparent, trace id, span id).
fn producer_context() -> (String, String, String) {
    let trace_id = Uuid::new_v4().simple().to_string();
    let span_id = Uuid::new_v4().simple().to_string()[..16].to_owned();
    (format!("00-{trace_id}-{span_id}-01"), trace_id, span_id)
}

/// Commits an event whose producer ran in a trace of its own: (event id,
/// trace id, the producer's span id).
async fn insert_traced(app: &TestApp) -> (Uuid, String, String) {
    let (traceparent, trace_id, producer_span) = producer_context();
    let id = Uuid::new_v4();
    app.insert_event(
        id,
        "order-1",
        "order.created",
        json!({}),
        json!({ "traceparent": traceparent }),
    )
    .await;
    (id, trace_id, producer_span)
}

#[tokio::test]
async fn the_lease_span_continues_the_producers_trace() {
    let app = TestApp::spawn().await;
    let (id, trace_id, producer_span) = insert_traced(&app).await;
    let batch = app.claim("w-trace", 10, secs(30), secs(0)).await;
    assert_eq!(app.ack(&batch.lease_id, &[id.to_string()]).await, [OK]);

    let lease = collector()
        .wait_for(&trace_id, "outbox lease span", |s| s.name == "outbox lease")
        .await;
    assert_eq!(
        lease.parent_span_id, producer_span,
        "child of the producer's span"
    );
    assert_eq!(lease.attributes["outbox.lease.outcome"], "ok");
    assert_eq!(lease.attributes["messaging.message.id"], id.to_string());
    assert_eq!(lease.attributes["outbox.worker.id"], "w-trace");
    assert_eq!(lease.attributes["outbox.lease.attempt"], "1");
    assert_eq!(lease.attributes["outbox.lease.id"], batch.lease_id);
}

#[tokio::test]
async fn an_expired_lease_is_reported_when_the_row_is_reclaimed() {
    let app = TestApp::spawn().await;
    let (id, trace_id, producer_span) = insert_traced(&app).await;
    let first = app.claim("w-slow", 1, secs(1), secs(0)).await;
    assert_eq!(first.messages.len(), 1);
    // The retry comes once the 1 s lease has run out.
    let again = app.claim("w-next", 1, secs(30), secs(5)).await;
    assert_eq!(again.messages.len(), 1, "re-claimed after expiry");

    let expired = collector()
        .wait_for(&trace_id, "expired lease span", |s| {
            s.name == "outbox lease"
                && s.attributes.get("outbox.lease.outcome").map(String::as_str) == Some("expired")
        })
        .await;
    assert_eq!(expired.parent_span_id, producer_span);
    assert_eq!(expired.attributes["outbox.worker.id"], "w-slow");
    assert_eq!(expired.attributes["outbox.lease.id"], first.lease_id);
    assert_eq!(expired.attributes["outbox.lease.attempt"], "1");
    assert_eq!(expired.attributes["messaging.message.id"], id.to_string());
}

#[tokio::test]
async fn the_server_span_continues_the_callers_trace() {
    let app = TestApp::spawn().await;
    let (traceparent, trace_id, caller_span) = producer_context();
    let mut request = Request::new(AckRequest {
        outbox: String::new(),
        lease_id: Uuid::new_v4().to_string(),
        message_ids: vec![Uuid::new_v4().to_string()],
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().expect("ascii"));
    app.client.clone().ack(request).await.expect("ack answers");

    let span = collector()
        .wait_for(&trace_id, "server span", |s| {
            s.name == "outbox.v1.OutboxService/Ack"
        })
        .await;
    assert_eq!(span.parent_span_id, caller_span);
    assert_eq!(span.kind, 2, "server span");
    assert_eq!(span.attributes["rpc.system.name"], "grpc");
    assert_eq!(span.attributes["rpc.method"], "outbox.v1.OutboxService/Ack");
    assert_eq!(span.attributes["rpc.response.status_code"], "OK");
    assert_eq!(span.attributes["batch_size"], "1");
}

/// The value of `name{outbox="default"...}`, summed over other labels; 0 if absent.
fn value(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| !l.contains("outbox=") || l.contains("outbox=\"default\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn metric_reaches(app: &TestApp, name: &str, what: &str, check: impl Fn(f64) -> bool) {
    wait_until(secs(10), what, async || {
        check(value(&app.scrape().await, name))
    })
    .await;
}

#[tokio::test]
async fn metrics_move_through_claim_nack_expiry_and_ack() {
    let app = TestApp::spawn_with(|args| {
        args.set("--metrics-interval", "100ms");
    })
    .await;
    let id = Uuid::new_v4();
    app.insert_event(id, "a", "t", json!({}), json!({})).await;
    metric_reaches(&app, "outbox_pending_messages", "one pending", |v| v == 1.0).await;
    // The age grows while the row waits, by the database clock.
    metric_reaches(
        &app,
        "outbox_oldest_pending_age_seconds",
        "age above 0.3 s",
        |v| v > 0.3,
    )
    .await;

    let empty_before = value(&app.scrape().await, "outbox_empty_claims_total");
    let batch = app.claim("w-metrics", 10, secs(30), secs(0)).await;
    assert_eq!(batch.messages.len(), 1);
    metric_reaches(&app, "outbox_messages_claimed_total", "claimed 1", |v| {
        v == 1.0
    })
    .await;
    metric_reaches(&app, "outbox_in_flight_messages", "one in flight", |v| {
        v == 1.0
    })
    .await;
    let empty = app.claim("w-metrics", 10, secs(30), secs(0)).await;
    assert!(empty.messages.is_empty(), "the only row is leased");
    metric_reaches(
        &app,
        "outbox_empty_claims_total",
        "an empty claim counted",
        |v| v > empty_before,
    )
    .await;

    assert_eq!(
        app.nack_retry(&batch.lease_id, &[id.to_string()], Some(millis(0)))
            .await,
        [OK]
    );
    metric_reaches(&app, "outbox_messages_nacked_total", "nacked 1", |v| {
        v == 1.0
    })
    .await;

    // A lease that runs out is counted when the row is claimed again.
    let short = app.claim("w-metrics", 10, secs(1), secs(0)).await;
    assert_eq!(short.messages.len(), 1);
    let again = app.claim("w-metrics", 10, secs(30), secs(5)).await;
    assert_eq!(again.messages.len(), 1);
    metric_reaches(&app, "outbox_leases_expired_total", "one expiry", |v| {
        v == 1.0
    })
    .await;

    // The stale lease's ack is refused and counted; the live one is acked.
    assert_eq!(
        app.ack(&short.lease_id, &[id.to_string()]).await,
        [LEASE_LOST]
    );
    metric_reaches(&app, "outbox_lease_lost_total", "one stale ack", |v| {
        v == 1.0
    })
    .await;
    assert_eq!(app.ack(&again.lease_id, &[id.to_string()]).await, [OK]);
    metric_reaches(&app, "outbox_messages_acked_total", "acked 1", |v| v == 1.0).await;
    metric_reaches(
        &app,
        "outbox_commit_to_ack_seconds_count",
        "one commit-to-ack sample",
        |v| v == 1.0,
    )
    .await;
    metric_reaches(&app, "outbox_pending_messages", "nothing pending", |v| {
        v == 0.0
    })
    .await;
    metric_reaches(
        &app,
        "outbox_oldest_pending_age_seconds",
        "age back to zero",
        |v| v == 0.0,
    )
    .await;
    metric_reaches(
        &app,
        "outbox_in_flight_messages",
        "nothing in flight",
        |v| v == 0.0,
    )
    .await;

    let body = app.scrape().await;
    assert!(
        value(&body, "outbox_rpc_duration_seconds_count") >= 6.0,
        "RPC durations recorded"
    );
    assert!(
        body.contains("outbox_claim_batch_size_bucket"),
        "batch size histogram exposed"
    );
    assert!(
        body.contains("outbox_dead_lettered_messages"),
        "dead-letter gauge exposed"
    );
}
