//! GetStats: the counts an operator alerts on, by the database clock.

use std::time::Duration;

use outboxd::grpc::pb::{GetStatsResponse, NackRequest};
use uuid::Uuid;

use crate::support::{DEAD_LETTERED, OK, TestApp, ids, seconds, secs};

/// (pending, in_flight, dead_lettered, published_retained)
fn counts(s: &GetStatsResponse) -> (u64, u64, u64, u64) {
    (
        s.pending,
        s.in_flight,
        s.dead_lettered,
        s.published_retained,
    )
}

#[tokio::test]
async fn stats_of_an_empty_outbox_are_zero() {
    let app = TestApp::spawn().await;
    let stats = app.stats().await;
    assert_eq!(counts(&stats), (0, 0, 0, 0));
    assert_eq!(seconds(stats.oldest_pending_age), 0.0);
}

#[tokio::test]
async fn stats_follow_claim_ack_nack_and_dead_letter() {
    let app = TestApp::spawn().await;
    // The oldest event was written ten minutes ago (by the database clock).
    let old = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload, created_at)
         VALUES ($1, 'agg', 'test.event', '{}', now() - interval '10 minutes')",
    )
    .bind(old)
    .execute(app.pool())
    .await
    .expect("insert an old event");
    app.insert(2).await;

    let stats = app.stats().await;
    assert_eq!(counts(&stats), (3, 0, 0, 0));
    let age = seconds(stats.oldest_pending_age);
    assert!(
        (600.0..630.0).contains(&age),
        "oldest pending is ~10 min old, {age}"
    );

    let batch = app.claim("w", 2, secs(60), Duration::ZERO).await;
    let [first, second] = <[String; 2]>::try_from(ids(&batch)).expect("two messages");
    assert_eq!(first, old.to_string());
    let stats = app.stats().await;
    assert_eq!(
        counts(&stats),
        (3, 2, 0, 0),
        "claimed rows are pending and in flight"
    );
    assert!(
        seconds(stats.oldest_pending_age) >= 600.0,
        "a leased row still counts as pending age"
    );

    assert_eq!(app.ack(&batch.lease_id, &[second]).await, [OK]);
    assert_eq!(counts(&app.stats().await), (2, 1, 0, 1));

    assert_eq!(
        app.nack_retry(&batch.lease_id, &[first], Some(secs(60)))
            .await,
        [OK]
    );
    let stats = app.stats().await;
    assert_eq!(counts(&stats), (2, 0, 0, 1));
    let age = seconds(stats.oldest_pending_age);
    assert!(
        age < 60.0,
        "a row waiting out its backoff does not age the queue, {age}"
    );

    let last = app.claim("w", 10, secs(60), Duration::ZERO).await;
    assert_eq!(last.messages.len(), 1);
    let dead = app
        .nack(NackRequest {
            lease_id: last.lease_id.clone(),
            message_ids: ids(&last),
            error: "poison".into(),
            dead_letter: true,
            ..NackRequest::default()
        })
        .await;
    assert_eq!(dead, [DEAD_LETTERED]);
    let stats = app.stats().await;
    assert_eq!(counts(&stats), (1, 0, 1, 1));
    assert_eq!(
        seconds(stats.oldest_pending_age),
        0.0,
        "only a backing-off row is left"
    );
}
