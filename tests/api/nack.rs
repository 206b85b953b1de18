//! Nack: retry after a backoff or `retry_after`, dead-letter on request or at
//! max attempts; the same limit holds when workers crash and leases expire.

use std::time::Duration;

use outboxd::grpc::pb::NackRequest;
use uuid::Uuid;

use crate::support::{
    DEAD_LETTERED, LEASE_LOST, NOT_FOUND, OK, TestApp, dur, ids, millis, secs, wait_until,
};

/// Nacks one message and brackets the retry delay the server chose by the
/// database clock: `available_at` minus the time just after the call is at most
/// the delay, minus the time just before it at least. Sound however slow the
/// call, and tight when it is fast.
async fn nack_delay(
    app: &TestApp,
    lease: &str,
    id: &str,
    retry_after: Option<Duration>,
) -> (f64, f64) {
    let before = app.db_now().await;
    assert_eq!(app.nack_retry(lease, &[id], retry_after).await, [OK]);
    let after = app.db_now().await;
    let available = app.row(id).await.available_at;
    let secs = |d: chrono::TimeDelta| d.as_seconds_f64();
    // Microsecond timestamps: allow one microsecond of rounding either way.
    (
        secs(available - after) - 1e-6,
        secs(available - before) + 1e-6,
    )
}

#[tokio::test]
async fn nack_outcomes_come_back_one_per_id_in_request_order() {
    let app = TestApp::spawn().await;
    app.insert(4).await;
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    let [a, b, c, d] = <[String; 4]>::try_from(ids(&batch)).expect("four messages");
    let lease = batch.lease_id.as_str();
    let missing = Uuid::new_v4().to_string();
    assert_eq!(app.ack(lease, &[&d]).await, [OK]);

    let outcomes = app
        .nack(NackRequest {
            lease_id: lease.into(),
            message_ids: vec![missing.clone(), b.clone(), a.clone(), d.clone()],
            error: "broker unreachable".into(),
            retry_after: dur(secs(60)),
            ..NackRequest::default()
        })
        .await;
    assert_eq!(
        outcomes,
        [NOT_FOUND, OK, OK, LEASE_LOST],
        "acked rows cannot be nacked"
    );
    assert_eq!(
        app.nack_retry(lease, &[&a], None).await,
        [LEASE_LOST],
        "a nack releases the lease"
    );
    assert_eq!(
        app.nack_retry(&Uuid::new_v4().to_string(), &[&c], None)
            .await,
        [LEASE_LOST],
        "not under that lease"
    );
    let dead = app
        .nack(NackRequest {
            lease_id: lease.into(),
            message_ids: vec![c.clone()],
            error: "poison".into(),
            dead_letter: true,
            ..NackRequest::default()
        })
        .await;
    assert_eq!(dead, [DEAD_LETTERED]);

    let row = app.row(&a).await;
    assert_eq!(row.last_error.as_deref(), Some("broker unreachable"));
    assert!(
        row.lease_id.is_none() && row.locked_until.is_none(),
        "lease cleared"
    );
    assert!(row.dead_lettered_at.is_none());
}

#[tokio::test]
async fn nack_without_retry_after_follows_the_backoff_policy() {
    let app = TestApp::spawn_with(|args| {
        args.set("--backoff-base", "2s");
    })
    .await;
    app.insert(1).await;
    let batch = app.claim("w", 1, secs(30), Duration::ZERO).await;
    let id = batch.messages[0].id.clone();
    let (low, high) = nack_delay(&app, &batch.lease_id, &id, None).await;

    // Attempt 1 waits the base delay, 2 s ± 20 % jitter, by the database clock.
    assert!(
        high >= 1.6 && low <= 2.4,
        "retry delay in 1.6..=2.4 s, measured between {low} and {high} s"
    );
    assert!(app.nothing_to_claim().await);

    let retry = app.claim("w", 1, secs(30), secs(10)).await;
    assert_eq!(ids(&retry), [id.as_str()]);
    assert_eq!(retry.messages[0].attempt, 2);
    let row = app.row(&id).await;
    assert!(
        row.claimed_at.expect("claimed") >= row.available_at,
        "not claimed before its backoff ran out"
    );
}

#[tokio::test]
async fn nack_retry_after_zero_makes_the_row_claimable_at_once() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let batch = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(
        app.nack_retry(&batch.lease_id, &ids(&batch), Some(Duration::ZERO))
            .await,
        [OK]
    );
    let again = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&again), ids(&batch));
    assert_eq!(again.messages[0].attempt, 2);
}

#[tokio::test]
async fn nack_retry_after_delays_the_next_claim() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let batch = app.claim("w", 1, secs(30), Duration::ZERO).await;
    let id = batch.messages[0].id.clone();
    let (low, high) = nack_delay(&app, &batch.lease_id, &id, Some(secs(3))).await;
    assert!(
        high >= 3.0 && low <= 3.0,
        "retry delay 3 s, measured between {low} and {high} s"
    );
    assert!(app.nothing_to_claim().await);
    let retry = app.claim("w", 1, secs(30), secs(10)).await;
    assert_eq!(
        ids(&retry),
        [id.as_str()],
        "claimable once the delay is over"
    );
    let row = app.row(&id).await;
    assert!(
        row.claimed_at.expect("claimed") >= row.available_at,
        "not claimed before its retry_after ran out"
    );
}

#[tokio::test]
async fn nack_dead_letter_gives_up_at_once() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let batch = app.claim("w", 1, secs(30), Duration::ZERO).await;
    let outcomes = app
        .nack(NackRequest {
            lease_id: batch.lease_id.clone(),
            message_ids: ids(&batch),
            error: "schema violation".into(),
            retry_after: dur(Duration::ZERO),
            dead_letter: true,
            ..NackRequest::default()
        })
        .await;
    assert_eq!(outcomes, [DEAD_LETTERED]);
    let row = app.row(&batch.messages[0].id).await;
    assert!(row.dead_lettered_at.is_some());
    assert_eq!(row.last_error.as_deref(), Some("schema violation"));
    assert!(
        app.claim("w", 1, secs(30), secs(1))
            .await
            .messages
            .is_empty(),
        "never delivered again"
    );
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [LEASE_LOST]);
}

#[tokio::test]
async fn nack_on_the_last_attempt_dead_letters() {
    let app = TestApp::spawn_with(|args| {
        args.set("--max-attempts", "3");
    })
    .await;
    let id = app.insert(1).await[0].to_string();
    for attempt in 1..=2 {
        let batch = app.claim("w", 1, secs(30), Duration::ZERO).await;
        assert_eq!(batch.messages[0].attempt, attempt);
        assert_eq!(
            app.nack_retry(&batch.lease_id, &ids(&batch), Some(Duration::ZERO))
                .await,
            [OK]
        );
    }
    let last = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(last.messages[0].attempt, 3);
    assert_eq!(
        app.nack_retry(&last.lease_id, &ids(&last), Some(Duration::ZERO))
            .await,
        [DEAD_LETTERED]
    );
    let row = app.row(&id).await;
    assert!(row.dead_lettered_at.is_some());
    assert_eq!(row.attempts, 3);
    assert!(app.nothing_to_claim().await);
}

#[tokio::test]
async fn repeated_lease_expiries_dead_letter_at_max_attempts() {
    // A worker that crashes on a poison message never settles it; the claim after
    // the last attempt must dead-letter the row instead of handing it out again.
    let app = TestApp::spawn_with(|args| {
        args.set("--max-attempts", "3");
    })
    .await;
    let id = app.insert(1).await[0].to_string();
    for attempt in 1..=3 {
        let batch = app.claim("crashy", 1, secs(1), secs(10)).await;
        assert_eq!(ids(&batch), [id.as_str()]);
        assert_eq!(batch.messages[0].attempt, attempt);
    }
    wait_until(secs(5), "the last lease has expired", async || {
        app.row(&id).await.lease_left.is_some_and(|left| left < 0.0)
    })
    .await;

    let after = app.claim("crashy", 1, secs(1), Duration::ZERO).await;
    assert!(
        after.messages.is_empty(),
        "a row past max attempts is not handed out"
    );
    let row = app.row(&id).await;
    assert!(row.dead_lettered_at.is_some());
    assert_eq!(row.attempts, 3);
    let error = row.last_error.unwrap_or_default();
    assert!(
        error.contains("max attempts"),
        "last_error says why: {error:?}"
    );
    assert!(
        app.claim("w", 1, secs(1), millis(600))
            .await
            .messages
            .is_empty()
    );
    assert_eq!(app.stats().await.dead_lettered, 1);
}
