//! Retention: published rows are deleted after `--retention` (or at ack with
//! zero retention); pending and dead-lettered rows are kept.

use std::time::Duration;

use outboxd::grpc::pb::NackRequest;

use crate::support::{DEAD_LETTERED, NOT_FOUND, OK, TestApp, ids, secs, wait_until};

#[tokio::test]
async fn zero_retention_deletes_a_row_when_it_is_acked() {
    let app = TestApp::spawn_with(|args| {
        args.set("--retention", "0");
    })
    .await;
    app.insert(2).await;
    let batch = app.claim("w", 2, secs(30), Duration::ZERO).await;
    let [acked, kept] = <[String; 2]>::try_from(ids(&batch)).expect("two messages");
    assert_eq!(app.ack(&batch.lease_id, &[&acked]).await, [OK]);
    assert!(
        app.row_in("outbox", &acked).await.is_none(),
        "deleted on ack"
    );
    assert!(app.row_in("outbox", &kept).await.is_some());
    assert_eq!(
        app.ack(&batch.lease_id, &[acked]).await,
        [NOT_FOUND],
        "a deleted row is gone, repeat acks included"
    );
    let stats = app.stats().await;
    assert_eq!((stats.pending, stats.published_retained), (1, 0));
}

#[tokio::test]
async fn published_rows_past_retention_are_deleted_and_others_kept() {
    let app = TestApp::spawn_with(|args| {
        args.set("--retention", "1s")
            .set("--retention-interval", "200ms");
    })
    .await;
    let inserted = app.insert(5).await;
    let batch = app.claim("w", 4, secs(60), Duration::ZERO).await;
    let [a, b, dead, leased] = <[String; 4]>::try_from(ids(&batch)).expect("four messages");
    let pending = inserted[4].to_string();
    assert_eq!(
        app.ack(&batch.lease_id, &[a.clone(), b.clone()]).await,
        [OK, OK]
    );
    let outcome = app
        .nack(NackRequest {
            lease_id: batch.lease_id.clone(),
            message_ids: vec![dead.clone()],
            error: "poison".into(),
            dead_letter: true,
            ..NackRequest::default()
        })
        .await;
    assert_eq!(outcome, [DEAD_LETTERED]);
    assert!(
        app.row_in("outbox", &a).await.is_some(),
        "kept until its retention passes"
    );

    wait_until(
        secs(10),
        "published rows past retention are deleted",
        async || app.count("outbox", "published_at IS NOT NULL").await == 0,
    )
    .await;
    assert!(app.row_in("outbox", &a).await.is_none());
    assert!(app.row_in("outbox", &b).await.is_none());
    for kept in [&dead, &leased, &pending] {
        assert!(
            app.row_in("outbox", kept).await.is_some(),
            "{kept} is not published and stays"
        );
    }
    assert_eq!(app.count("outbox", "true").await, 3);
}
