//! Timeouts under a locked table (issue #47): however many claims queue
//! behind one the database does not answer, each answers within
//! `--statement-timeout` and its grace; a claim whose client gave up leaves
//! no statement behind in PostgreSQL.

use std::time::Duration;

use outboxd::grpc::pb::{ClaimBatchRequest, outbox_service_client::OutboxServiceClient};
use tokio::time::Instant;
use tonic::transport::Channel;

use crate::{
    harness::{Case, Outboxd},
    shared::{
        db::TestDb,
        net::free_port,
        wait::{secs, wait_until},
    },
};

fn claim(worker: &str) -> ClaimBatchRequest {
    ClaimBatchRequest {
        worker_id: worker.into(),
        max_messages: 10,
        lease_duration: Some(prost_types::Duration {
            seconds: 30,
            nanos: 0,
        }),
        ..ClaimBatchRequest::default()
    }
}

/// Holds `LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE` until dropped.
async fn lock_outbox(db: &TestDb) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = db.pool.begin().await.expect("begin the locker");
    sqlx::query("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *tx)
        .await
        .expect("lock the outbox table");
    tx
}

/// outboxd's claim statements in this database that wait on a lock, told
/// by how the statement begins (pg_stat_activity keeps only its first
/// kilobyte); the gauge sampler's and the watchdog's statements wait behind
/// the lock too, on timers of their own.
async fn claims_waiting_on_locks(db: &TestDb) -> i64 {
    db.scalar_i64(
        "SELECT count(*) FROM pg_stat_activity
         WHERE datname = current_database() AND application_name = 'outboxd'
           AND wait_event_type = 'Lock' AND query LIKE 'WITH expired AS%'",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_queued_behind_a_locked_table_each_answer_within_the_statement_timeout() {
    const CLAIMS: usize = 10;
    let case = Case::begin().await;
    let server =
        Outboxd::start_with(&case.db.url(), free_port(), &["--statement-timeout", "1s"]).await;
    let channel = Channel::from_shared(server.url())
        .expect("url")
        .connect()
        .await
        .expect("connect");
    let locker = lock_outbox(&case.db).await;

    let began = Instant::now();
    let calls = (0..CLAIMS).map(|n| {
        let mut client = OutboxServiceClient::new(channel.clone());
        tokio::spawn(async move {
            let answer = client.claim_batch(claim(&format!("w{n}"))).await;
            (answer, began.elapsed())
        })
    });
    let mut slowest = Duration::ZERO;
    for call in futures::future::join_all(calls).await {
        let (answer, took) = call.expect("claim task");
        let status = answer.expect_err("no claim through a locked table");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        slowest = slowest.max(took);
    }
    drop(locker);
    println!(
        "{CLAIMS} claims behind a locked table, 1s statement timeout: slowest UNAVAILABLE after {slowest:?}"
    );
    // 1 s and the 1 s grace, with room for a slow machine; before the fix
    // the k-th claim answered after about k seconds.
    assert!(
        slowest < secs(4),
        "every claim answered in time: {slowest:?}"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_claim_whose_client_gave_up_leaves_no_statement_waiting_on_the_lock() {
    let case = Case::begin().await;
    // A statement timeout far beyond the test: only outboxd ending the
    // abandoned statement can free its backend in time.
    let server =
        Outboxd::start_with(&case.db.url(), free_port(), &["--statement-timeout", "60s"]).await;
    let mut client = OutboxServiceClient::connect(server.url())
        .await
        .expect("connect");
    let locker = lock_outbox(&case.db).await;

    let mut request = tonic::Request::new(claim("impatient"));
    request.set_timeout(secs(1));
    let began = Instant::now();
    let status = client
        .claim_batch(request)
        .await
        .expect_err("no claim through a locked table");
    assert_eq!(
        claims_waiting_on_locks(&case.db).await,
        1,
        "the claim reached the lock"
    );
    // tonic's client reports its own deadline as CANCELLED "Timeout expired".
    assert!(
        matches!(
            status.code(),
            tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
        ),
        "{status:?}"
    );
    assert!(began.elapsed() < secs(3), "the client's deadline held");
    wait_until(secs(10), "outboxd's abandoned statement ends", async || {
        claims_waiting_on_locks(&case.db).await == 0
    })
    .await;
    println!(
        "abandoned claim: no outboxd backend waits on the lock {:?} after the client gave up",
        began.elapsed()
    );
    drop(locker);
    // The server goes on serving.
    let batch = client
        .claim_batch(claim("patient"))
        .await
        .expect("a claim once the lock is gone");
    assert!(batch.into_inner().messages.is_empty());
    drop(server);
}
