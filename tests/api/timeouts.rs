//! Every statement is bounded in time: a locked or stalled table answers
//! UNAVAILABLE within `--statement-timeout` instead of holding the call as long
//! as the lock lasts, and a client's shorter deadline ends the statement when
//! the client gives up. Regression for calls that waited out a whole stall.

use std::time::{Duration, Instant};

use outboxd::grpc::pb::{AckRequest, GetStatsRequest};
use tonic::{Code, Request};

use crate::support::{OK, TestApp, claim_request, ids, millis, secs, wait_until};

/// Holds an ACCESS EXCLUSIVE lock on the outbox table until dropped.
async fn lock_table(app: &TestApp) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = app.pool().begin().await.expect("begin");
    sqlx::query("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("lock the outbox table");
    tx
}

/// outboxd's claims waiting for a lock in this test's database (its gauge
/// sampler and retention may wait too; they are no RPC).
async fn waiting_claims(app: &TestApp) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = 'outboxd' \
         AND wait_event_type = 'Lock' AND query LIKE 'WITH expired AS%'",
    )
    .fetch_one(app.pool())
    .await
    .expect("pg_stat_activity")
}

#[tokio::test]
async fn a_locked_table_answers_unavailable_within_the_statement_timeout() {
    let app = TestApp::spawn_with(|args| {
        args.set("--statement-timeout", "1s");
    })
    .await;
    app.insert(2).await;
    let batch = app.claim("w", 1, secs(60), Duration::ZERO).await;
    let before = app.snapshot("outbox").await;
    let lock = lock_table(&app).await;

    let started = Instant::now();
    let claim = app
        .try_claim(claim_request("", "w", 10, secs(30), Duration::ZERO))
        .await;
    let took = started.elapsed();
    let status = claim.expect_err("a claim behind the lock fails");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(took < secs(4), "answered within the limit: {took:?}");

    let mut client = app.client.clone();
    let started = Instant::now();
    let ack = client
        .ack(AckRequest {
            outbox: String::new(),
            lease_id: batch.lease_id.clone(),
            message_ids: ids(&batch),
        })
        .await;
    assert_eq!(ack.map(|_| ()).unwrap_err().code(), Code::Unavailable);
    let stats = client.get_stats(GetStatsRequest::default()).await;
    assert_eq!(stats.map(|_| ()).unwrap_err().code(), Code::Unavailable);
    assert!(started.elapsed() < secs(8), "{:?}", started.elapsed());

    // Nothing changed, and the lease still acks once the lock is gone.
    lock.rollback().await.expect("release the lock");
    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "the refused calls changed nothing"
    );
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK]);
}

#[tokio::test]
async fn a_shorter_client_deadline_ends_the_statement_when_the_client_gives_up() {
    let app = TestApp::spawn_with(|args| {
        args.set("--statement-timeout", "60s");
    })
    .await;
    app.insert(1).await;
    let lock = lock_table(&app).await;

    let mut request = Request::new(claim_request("", "w", 10, secs(30), Duration::ZERO));
    request.set_timeout(millis(500));
    let mut client = app.client.clone();
    let started = Instant::now();
    let status = client
        .claim_batch(request)
        .await
        .expect_err("the claim cannot finish behind the lock");
    assert!(
        matches!(status.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{status:?}"
    );
    assert!(started.elapsed() < secs(5), "{:?}", started.elapsed());

    // The lock is still held: only a cancelled statement stops waiting for it.
    wait_until(
        secs(10),
        "outboxd's claim statement is cancelled",
        async || waiting_claims(&app).await == 0,
    )
    .await;
    lock.rollback().await.expect("release the lock");
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch.messages.len(), 1, "the row was never leased");
}
