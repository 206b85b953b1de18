//! ClaimBatch with `wait`: woken by a committed insert through the probe of
//! the table's sequence, not by the poll interval; by the poll interval alone
//! when probing is off; empty at the deadline; and no stampede of waiters.

use std::time::{Duration, Instant};

use outboxd::grpc::pb::ClaimBatchResponse;
use tokio::task::JoinHandle;
use tonic::Status;
use uuid::Uuid;

use crate::support::{
    TestApp, claim_request, ids, insert_plain, millis, secs, strings, wait_until, within,
};

type Waiter = JoinHandle<Result<ClaimBatchResponse, Status>>;

/// Waits until one of `waiters` has its answer, and takes it out of them.
async fn first_answer(
    waiters: &mut Vec<Waiter>,
    limit: Duration,
    what: &str,
) -> ClaimBatchResponse {
    wait_until(limit, what, async || {
        waiters.iter().any(|w| w.is_finished())
    })
    .await;
    let answered = waiters
        .iter()
        .position(|w| w.is_finished())
        .expect("a finished waiter stays finished");
    waiters
        .remove(answered)
        .await
        .expect("waiter task")
        .expect("ClaimBatch")
}

/// A poll interval long enough that any prompt answer must come from a probe.
fn slow_polling(args: &mut crate::support::ServerArgs) {
    args.set("--poll-interval", "30s")
        .set("--health-interval", "1m");
}

/// Commits `n` events whose `seq` values were taken by hand, then moves the
/// sequence past them, as one move; ids in `seq` order. The probe sees them
/// only once they are claimable, so a count of claims is exact: an ordinary
/// insert moves the sequence before its commit, and a probe in between wakes
/// a claim early (it re-checks) or for part of the rows.
async fn commit_then_move_the_sequence(app: &TestApp, n: i64) -> Vec<Uuid> {
    let mut tx = app.pool().begin().await.expect("begin");
    let mut rows: Vec<(i64, Uuid)> = sqlx::query_as(
        "INSERT INTO outbox (seq, id, aggregate_id, event_type, payload) OVERRIDING SYSTEM VALUE
         SELECT coalesce(pg_sequence_last_value(
                    pg_get_serial_sequence('public.outbox', 'seq')::regclass), 0) + i,
                gen_random_uuid(), 'agg', 'test.event', '{}'
         FROM generate_series(1, $1::bigint) AS i
         RETURNING seq, id",
    )
    .bind(n)
    .fetch_all(&mut *tx)
    .await
    .expect("insert with seq values taken by hand");
    tx.commit().await.expect("commit");
    rows.sort_unstable();
    let last = rows.last().expect("rows").0;
    sqlx::query("SELECT setval(pg_get_serial_sequence('public.outbox', 'seq'), $1)")
        .bind(last)
        .execute(app.pool())
        .await
        .expect("move the sequence");
    rows.into_iter().map(|(_, id)| id).collect()
}

#[tokio::test]
async fn a_waiting_claim_wakes_on_commit_well_before_the_poll_interval() {
    let app = TestApp::spawn_with(slow_polling).await;
    let claims = app.count_claims("public.outbox").await;
    let latency = app.wake_latency(&claims).await;
    assert!(
        latency < secs(2),
        "woken {latency:?} after the commit; the poll interval is 30 s"
    );
}

#[tokio::test]
async fn with_probing_off_a_waiting_claim_finds_a_commit_at_its_next_poll() {
    let app = TestApp::spawn_with(|args| {
        args.set("--probe-interval", "0")
            .set("--poll-interval", "1s")
            .set("--health-interval", "1m");
    })
    .await;
    let claims = app.count_claims("public.outbox").await;
    let latency = app.wake_latency(&claims).await;
    // The insert follows the claim's first look at once; the poll comes
    // 0.8-1.2 s after that look (jitter), and nothing else may wake it.
    assert!(
        latency > millis(300) && latency < secs(3),
        "answered {latency:?} after the commit; the poll interval is 1 s"
    );
}

#[tokio::test]
async fn a_waiting_claim_returns_an_empty_batch_at_its_deadline() {
    let app = TestApp::spawn().await;
    let started = Instant::now();
    let batch = app.claim("w", 10, secs(30), secs(1)).await;
    let waited = started.elapsed();
    assert!(batch.messages.is_empty());
    assert_eq!(batch.lease_id, "");
    assert!(waited >= millis(900), "waited the full second, {waited:?}");
    assert!(waited < secs(4), "returned at the deadline, {waited:?}");
}

#[tokio::test]
async fn a_commit_wakes_only_as_many_waiters_as_it_has_rows_for() {
    let app = TestApp::spawn_with(slow_polling).await;
    let claims = app.count_claims("public.outbox").await;
    let mut waiters = Vec::new();
    for w in 0..5 {
        let req = claim_request("", &format!("waiter-{w}"), 10, secs(30), secs(20));
        waiters.push(app.spawn_claim(req));
    }
    wait_until(secs(5), "all five claims are waiting", async || {
        claims.get().await >= 5
    })
    .await;
    assert_eq!(claims.get().await, 5);

    let inserted = commit_then_move_the_sequence(&app, 1).await;
    // Exactly one waiter gets the row, promptly.
    let batch = first_answer(&mut waiters, secs(2), "one waiter answers").await;
    assert_eq!(ids(&batch), strings(&inserted));

    // A second later the others are still waiting, and none of them was woken
    // for nothing: the only claim since is the winner's.
    // A window: nothing may happen during this second.
    tokio::time::sleep(secs(1)).await;
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "the other waiters still wait"
    );
    assert_eq!(claims.get().await, 6, "a move of one row woke one waiter");

    // Five rows in one move: with capacity 10 each, one waiter covers them.
    let more = commit_then_move_the_sequence(&app, 5).await;
    let batch = first_answer(&mut waiters, secs(2), "a waiter answers").await;
    assert_eq!(ids(&batch), strings(&more));
    // A window: no other waiter may be woken for those rows during it.
    tokio::time::sleep(millis(500)).await;
    assert_eq!(
        claims.get().await,
        7,
        "one move of five rows woke one waiter"
    );
    assert!(waiters.iter().all(|w| !w.is_finished()));
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test]
async fn a_rolled_back_insert_hands_out_nothing_and_costs_a_few_looks_at_most() {
    let app = TestApp::spawn_with(slow_polling).await;
    let claims = app.count_claims("public.outbox").await;
    let waiter = app.spawn_claim(claim_request("", "w", 10, secs(30), secs(2)));
    wait_until(secs(5), "the claim is waiting", async || {
        claims.get().await >= 1
    })
    .await;

    // The insert moved the sequence before it rolled back, so the probe wakes
    // the claim, which finds nothing and re-checks a few times, then waits.
    let mut tx = app.pool().begin().await.expect("begin");
    insert_plain(&mut tx, Uuid::new_v4()).await;
    tx.rollback().await.expect("rollback");

    let batch = within(secs(5), "the waiting claim", waiter)
        .await
        .expect("waiter task")
        .expect("ClaimBatch");
    assert!(batch.messages.is_empty());
    let looks = claims.get().await;
    assert!(
        looks < 20,
        "{looks} claims for a rollback: a few re-checks, not a busy loop"
    );
}

#[tokio::test]
async fn a_steady_stream_of_inserts_wakes_each_waiting_claim_through_the_probe() {
    let app = TestApp::spawn_with(slow_polling).await;
    // Twenty inserts 100 ms apart, each awaited by a long-polling claim: each
    // is answered well before the 30 s poll interval, the first after a quiet
    // spell, the rest while the sequence keeps moving.
    let claims = app.count_claims("public.outbox").await;
    let rounds = 20;
    let mut last_insert = tokio::time::Instant::now();
    for round in 0..rounds {
        let looked = claims.get().await;
        let waiter = app.spawn_claim(claim_request("", "w", 10, secs(30), secs(10)));
        wait_until(secs(5), "the claim is waiting", async || {
            claims.get().await > looked
        })
        .await;
        // The stream's schedule: inserts 100 ms apart.
        tokio::time::sleep_until(last_insert + millis(100)).await;
        let inserted = app.insert(1).await;
        last_insert = tokio::time::Instant::now();
        let committed = Instant::now();
        let batch = within(secs(12), "the waiting claim", waiter)
            .await
            .expect("waiter task")
            .expect("ClaimBatch");
        assert_eq!(ids(&batch), strings(&inserted), "round {round}");
        let latency = committed.elapsed();
        assert!(
            latency < secs(2),
            "round {round}: answered {latency:?} after the commit"
        );
    }
}
