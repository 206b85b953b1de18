//! ClaimBatch with `wait`: woken by a committed insert (NOTIFY, or the sequence
//! probe while inserts keep arriving), not by the poll interval; empty at the
//! deadline; and no stampede of waiters.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use outboxd::grpc::pb::ClaimBatchResponse;
use sqlx::{Connection, PgConnection, postgres::PgListener};
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

/// A poll interval long enough that any prompt answer must come from a notification.
fn slow_polling(args: &mut crate::support::ServerArgs) {
    args.set("--poll-interval", "10s")
        .set("--health-interval", "1m");
}

#[tokio::test]
async fn a_waiting_claim_wakes_on_commit_well_before_the_poll_interval() {
    let app = TestApp::spawn_with(slow_polling).await;
    app.listening().await;
    let claims = app.count_updates("public.outbox").await;
    let latency = app.wake_latency(&claims).await;
    assert!(
        latency < secs(2),
        "woken {latency:?} after the commit; the poll interval is 10 s"
    );
    assert_eq!(
        claims.get().await,
        2,
        "one empty claim, then one claim on the notification"
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
    // Notifications alone: the sequence watcher can see an insert before its
    // commit, and the re-check that follows would blur the count of claims.
    let app = TestApp::spawn_with(|args| {
        slow_polling(args);
        args.set("--probe-interval", "0");
    })
    .await;
    app.listening().await;
    let claims = app.count_updates("public.outbox").await;
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

    let inserted = app.insert(1).await;
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
    assert_eq!(claims.get().await, 6, "one notification woke one waiter");

    // Five rows in one commit: with capacity 10 each, one waiter covers them.
    let more = app.insert(5).await;
    let batch = first_answer(&mut waiters, secs(2), "a waiter answers").await;
    assert_eq!(ids(&batch), strings(&more));
    // A window: no other waiter may be woken for those rows during it.
    tokio::time::sleep(millis(500)).await;
    assert_eq!(
        claims.get().await,
        7,
        "one commit of five rows woke one waiter"
    );
    assert!(waiters.iter().all(|w| !w.is_finished()));
    for waiter in waiters {
        waiter.abort();
    }
}

#[tokio::test]
async fn a_rolled_back_insert_wakes_no_waiting_claim() {
    let app = TestApp::spawn_with(slow_polling).await;
    app.listening().await;
    let claims = app.count_updates("public.outbox").await;
    let waiter = app.spawn_claim(claim_request("", "w", 10, secs(30), secs(2)));
    wait_until(secs(5), "the claim is waiting", async || {
        claims.get().await >= 1
    })
    .await;

    let mut tx = app.pool().begin().await.expect("begin");
    insert_plain(&mut tx, Uuid::new_v4()).await;
    tx.rollback().await.expect("rollback");

    let batch = within(secs(5), "the waiting claim", waiter)
        .await
        .expect("waiter task")
        .expect("ClaimBatch");
    assert!(batch.messages.is_empty());
    // The first claim, and the last look at the deadline: nothing in between.
    assert_eq!(claims.get().await, 2, "the rollback sent no notification");
}

#[tokio::test]
async fn a_steady_stream_of_inserts_silences_the_trigger_and_still_wakes_waiters() {
    let app = TestApp::spawn_with(slow_polling).await;
    app.listening().await;
    let notifications = Arc::new(AtomicUsize::new(0));
    let mut listener = PgListener::connect_with(app.pool())
        .await
        .expect("listener");
    listener.listen("outboxd").await.expect("LISTEN");
    let counted = Arc::clone(&notifications);
    let counter = tokio::spawn(async move {
        while let Ok(Some(_)) = listener.try_recv().await {
            counted.fetch_add(1, Ordering::SeqCst);
        }
    });

    // Twenty inserts 100 ms apart, each awaited by a long-polling claim: each
    // is answered well before the 10 s poll interval, the first through a
    // notification, the rest through the sequence probe.
    let claims = app.count_updates("public.outbox").await;
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
    let quiet: bool = sqlx::query_scalar(
        "SELECT quiet_until > clock_timestamp() FROM outboxd_quiet WHERE relid = 'public.outbox'::regclass",
    )
    .fetch_one(app.pool())
    .await
    .expect("the table is marked quiet while inserts arrive");
    assert!(quiet, "the quiet mark is renewed while inserts arrive");
    let sent = notifications.load(Ordering::SeqCst);
    assert!(
        sent <= 3,
        "{sent} of {rounds} inserts notified; the trigger stays quiet while outboxd probes"
    );

    // Once inserts stop, the mark runs out and the trigger notifies again.
    wait_until(secs(10), "the quiet mark runs out", async || {
        sqlx::query_scalar::<_, bool>(
            "SELECT NOT EXISTS (SELECT 1 FROM outboxd_quiet WHERE quiet_until > clock_timestamp())",
        )
        .fetch_one(app.pool())
        .await
        .unwrap_or(false)
    })
    .await;
    let before = notifications.load(Ordering::SeqCst);
    app.insert(1).await;
    wait_until(
        secs(5),
        "a notification after the mark ran out",
        async || notifications.load(Ordering::SeqCst) > before,
    )
    .await;
    counter.abort();
}

#[tokio::test]
async fn a_producer_needs_no_rights_on_the_quiet_mark() {
    let app = TestApp::spawn_with(slow_polling).await;
    let role: String = format!("p_{}", app.db.name).chars().take(60).collect();
    app.db
        .execute(&format!(
            "CREATE ROLE \"{role}\" LOGIN;
             REVOKE ALL ON SCHEMA public FROM PUBLIC;
             GRANT USAGE ON SCHEMA public TO \"{role}\";
             GRANT INSERT ON public.outbox TO \"{role}\";"
        ))
        .await;
    let mut url = url::Url::parse(&app.db.url_via(app.db.upstream())).expect("test URL");
    url.set_username(&role).expect("a URL with a user");
    let mut producer = PgConnection::connect(url.as_str())
        .await
        .expect("connect as the producer role");
    sqlx::raw_sql("SET search_path = pg_catalog")
        .execute(&mut producer)
        .await
        .expect("search_path");
    let insert = "INSERT INTO public.outbox (id, aggregate_id, event_type, payload) \
                  VALUES (gen_random_uuid(), 'a', 'quiet.test', '{}')";

    // Marked quiet, as a busy outboxd does, and not marked: the trigger reads
    // the mark as its owner either way.
    app.db
        .execute(
            "INSERT INTO outboxd_quiet VALUES ('public.outbox'::regclass, clock_timestamp() + interval '1 minute')
             ON CONFLICT (relid) DO UPDATE SET quiet_until = excluded.quiet_until",
        )
        .await;
    sqlx::raw_sql(insert)
        .execute(&mut producer)
        .await
        .expect("insert while the table is marked quiet");
    app.db.execute("DELETE FROM outboxd_quiet").await;
    sqlx::raw_sql(insert)
        .execute(&mut producer)
        .await
        .expect("insert while the trigger notifies");
    let _ = producer.close().await;
    assert_eq!(
        app.db
            .scalar_i64("SELECT count(*) FROM outbox WHERE event_type = 'quiet.test'")
            .await,
        2
    );
    app.db
        .execute(&format!("DROP OWNED BY \"{role}\"; DROP ROLE \"{role}\";"))
        .await;
}
