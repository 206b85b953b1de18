//! Ack: fenced by the lease, idempotent under it, and per-message outcomes.

use std::time::Duration;

use outboxd::grpc::pb::LeaseAck;
use uuid::Uuid;

use crate::support::{
    ALREADY_DONE, LEASE_LOST, NOT_FOUND, OK, TestApp, claim_request, ids, outcomes, secs,
    wait_until,
};

#[tokio::test]
async fn ack_outcomes_come_back_one_per_id_in_request_order() {
    let app = TestApp::spawn().await;
    app.insert(4).await;
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    let [a, b, c, d] = <[String; 4]>::try_from(ids(&batch)).expect("four messages");
    let lease = batch.lease_id.as_str();
    let other_lease = Uuid::new_v4().to_string();
    let missing = Uuid::new_v4().to_string();

    assert_eq!(app.ack(lease, &[&a]).await, [OK]);
    assert_eq!(
        app.ack(lease, &[&a]).await,
        [ALREADY_DONE],
        "re-ack under the same lease"
    );
    assert_eq!(
        app.ack(&other_lease, &[&b]).await,
        [LEASE_LOST],
        "not under that lease"
    );
    assert_eq!(
        app.ack(&other_lease, &[&a]).await,
        [LEASE_LOST],
        "acked under another lease"
    );
    assert_eq!(app.ack(lease, &[&missing]).await, [NOT_FOUND]);

    // One call, every outcome, answered in the order asked (not table order).
    let mixed = [d.clone(), missing, a.clone(), b.clone(), d.clone()];
    assert_eq!(
        app.ack(lease, &mixed).await,
        [OK, NOT_FOUND, ALREADY_DONE, OK, OK],
        "a repeated id reports the one settle it had"
    );
    assert!(app.row(&d).await.published_at.is_some());
    assert!(app.row(&b).await.published_at.is_some());
    assert!(
        app.row(&c).await.published_at.is_none(),
        "an id not named stays leased"
    );
}

#[tokio::test]
async fn stale_ack_is_rejected_after_reclaim() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let stale = app.claim("w1", 1, secs(1), Duration::ZERO).await;
    let fresh = app.claim("w2", 1, secs(30), secs(10)).await;
    assert_eq!(ids(&fresh), ids(&stale), "the expired row was reclaimed");
    assert_eq!(fresh.messages[0].attempt, 2);

    assert_eq!(app.ack(&stale.lease_id, &ids(&stale)).await, [LEASE_LOST]);
    assert!(app.row(&stale.messages[0].id).await.published_at.is_none());
    assert_eq!(app.ack(&fresh.lease_id, &ids(&fresh)).await, [OK]);
    assert_eq!(
        app.ack(&stale.lease_id, &ids(&stale)).await,
        [LEASE_LOST],
        "published under the other lease"
    );
}

#[tokio::test]
async fn ack_after_expiry_without_reclaim_succeeds() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let batch = app.claim("w", 1, secs(1), Duration::ZERO).await;
    let id = batch.messages[0].id.clone();
    wait_until(
        secs(5),
        "the lease has expired by the database clock",
        async || app.row(&id).await.lease_left.is_some_and(|left| left < 0.0),
    )
    .await;

    // The publish happened; refusing the ack would only cause a duplicate.
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK]);
    let row = app.row(&id).await;
    assert!(row.published_at.is_some());
    assert!(app.nothing_to_claim().await);
}

#[tokio::test]
async fn acked_rows_are_never_claimed_again() {
    let app = TestApp::spawn().await;
    app.insert(3).await;
    let batch = app.claim("w", 10, secs(1), Duration::ZERO).await;
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK, OK, OK]);
    // Even once their lease would have run out.
    let again = app.claim("w", 10, secs(30), secs(2)).await;
    assert!(again.messages.is_empty());
    assert_eq!(
        app.count("outbox", "published_at IS NOT NULL AND attempts = 1")
            .await,
        3
    );
}

#[tokio::test]
async fn a_claim_applies_the_acks_it_carries_with_ack_outcomes() {
    let app = TestApp::spawn().await;
    app.insert(4).await;
    let first = app.claim("w", 2, secs(30), Duration::ZERO).await;
    let missing = Uuid::new_v4().to_string();
    let mut carried = ids(&first);
    carried.push(missing);
    let mut req = claim_request("", "w", 2, secs(30), Duration::ZERO);
    req.acks = vec![LeaseAck {
        lease_id: first.lease_id.clone(),
        message_ids: carried.clone(),
    }];

    let second = app.try_claim(req.clone()).await.expect("ClaimBatch");
    assert_eq!(
        outcomes(&carried, &second.ack_results),
        [OK, OK, NOT_FOUND],
        "one outcome per carried id, as Ack answers"
    );
    for id in ids(&first) {
        assert!(app.row(&id).await.published_at.is_some(), "{id} acked");
    }
    assert_eq!(second.messages.len(), 2, "and the claim still claims");
    assert!(ids(&second).iter().all(|id| !carried.contains(id)));

    // Carried again (a retry after a lost answer): harmless.
    let third = app.try_claim(req).await.expect("ClaimBatch");
    assert_eq!(
        outcomes(&carried, &third.ack_results),
        [ALREADY_DONE, ALREADY_DONE, NOT_FOUND]
    );
    assert!(third.messages.is_empty(), "the other two are leased");
}

#[tokio::test]
async fn carried_acks_are_applied_before_the_long_poll_waits() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let first = app.claim("w", 1, secs(30), Duration::ZERO).await;
    let id = first.messages[0].id.clone();
    let mut req = claim_request("", "w", 10, secs(30), secs(4));
    req.acks = vec![LeaseAck {
        lease_id: first.lease_id.clone(),
        message_ids: vec![id.clone()],
    }];
    let poll = app.spawn_claim(req);
    wait_until(
        secs(3),
        "the carried ack is applied while the claim still waits",
        async || app.row(&id).await.published_at.is_some(),
    )
    .await;
    assert!(!poll.is_finished(), "the long poll is still waiting");
    let answer = poll.await.expect("task").expect("ClaimBatch");
    assert!(answer.messages.is_empty());
    assert_eq!(outcomes(&[id], &answer.ack_results), [OK]);
}
