//! The claim cursor of an unordered outbox: claims read from it instead of
//! from the lowest pending row, and no event is ever passed over: not one a
//! late commit brings below rows already acked, not a nacked one, not one
//! that comes due later, not one redriven. The sweep that checks the cursor
//! counts what it finds (0 in every test: see `Drop for TestApp`), and finds
//! what a hand in the lease table leaves.

use std::time::Duration;

use outboxd::grpc::pb::RedriveRequest;

use crate::{
    shared::cluster::PrivateCluster,
    support::{
        OK, TestApp, gauge, ids, millis, open_transaction, run_outboxd, said, secs, wait_until,
    },
};

/// Commits `n` events to the default outbox in one statement.
async fn insert_many(app: &TestApp, n: u32) {
    app.db
        .execute(&format!(
            "INSERT INTO public.outbox (id, aggregate_id, event_type, payload) \
             SELECT gen_random_uuid(), 'agg-' || g, 'test.event', '{{}}' \
             FROM generate_series(1, {n}) AS g"
        ))
        .await;
}

/// Claims everything claimable now, acking each batch.
async fn drain(app: &TestApp) -> usize {
    let mut total = 0;
    loop {
        let batch = app.claim("drainer", 1000, secs(60), Duration::ZERO).await;
        if batch.messages.is_empty() {
            return total;
        }
        total += batch.messages.len();
        assert!(
            app.ack(&batch.lease_id, &ids(&batch))
                .await
                .iter()
                .all(|o| *o == OK)
        );
    }
}

/// Shared buffers (hit and read) the claim statement used since the last
/// reset of `pg_stat_statements`, and how many times it ran.
async fn claim_buffers(app: &TestApp) -> (i64, i64) {
    sqlx::query_as::<_, (i64, i64)>(
        "SELECT coalesce(sum(shared_blks_hit + shared_blks_read), 0)::bigint,
                coalesce(sum(calls), 0)::bigint
         FROM pg_stat_statements
         WHERE query LIKE '%FOR UPDATE OF l SKIP LOCKED%'
           AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(app.pool())
    .await
    .expect("read pg_stat_statements")
}

async fn reset_statements(app: &TestApp) {
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(app.pool())
        .await
        .expect("reset pg_stat_statements");
}

/// The walk comes back if a claim steps over the leases others hold: this
/// compares the buffers one claim of 100 reads behind 10 000 live leases with
/// those of the same claim behind none, on a server of the test's own with
/// `pg_stat_statements` (the shared one does not preload it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_behind_ten_thousand_leases_reads_about_what_one_behind_none_reads() {
    let cluster =
        PrivateCluster::start_with(&["shared_preload_libraries = 'pg_stat_statements'"]).await;
    let db = cluster.create_db().await;
    db.execute("CREATE EXTENSION pg_stat_statements").await;
    let app = TestApp::spawn_on(db, |args| {
        args.set("--max-batch", "1000");
    })
    .await
    .expect("outboxd on the test's server");
    insert_many(&app, 10_300).await;

    // Behind none: the first 100, acked at once.
    reset_statements(&app).await;
    let first = app.claim("w", 100, secs(60), Duration::ZERO).await;
    assert_eq!(first.messages.len(), 100);
    let (none_held, calls) = claim_buffers(&app).await;
    assert_eq!(calls, 1);
    assert_eq!(app.ack(&first.lease_id, &ids(&first)).await, [OK; 100]);

    // Another worker takes 10 000 and holds them.
    for _ in 0..10 {
        let held = app.claim("holder", 1000, secs(300), Duration::ZERO).await;
        assert_eq!(held.messages.len(), 1000);
    }
    // One more small claim after a pause, so the cursor has caught up with
    // the commit-order guard (it trails it by a probe or two).
    tokio::time::sleep(millis(50)).await;
    let one = app.claim("holder", 1, secs(300), Duration::ZERO).await;
    assert_eq!(one.messages.len(), 1);

    reset_statements(&app).await;
    let behind = app.claim("w", 100, secs(60), Duration::ZERO).await;
    assert_eq!(behind.messages.len(), 100);
    let (many_held, calls) = claim_buffers(&app).await;
    assert_eq!(calls, 1);
    // The figure the benchmark's report quotes (run with --nocapture).
    eprintln!(
        "claim of 100: {none_held} shared buffers behind no lease, {many_held} behind 10 000 live leases"
    );
    assert!(
        many_held <= 2 * none_held,
        "a claim of 100 behind 10 000 live leases read {many_held} buffers, behind none {none_held}: the claim walks the held rows again"
    );
    assert_eq!(app.ack(&behind.lease_id, &ids(&behind)).await, [OK; 100]);
}

/// A producer transaction that took a low seq and commits after higher ones
/// were claimed and acked: the cursor must not have passed it. The sweep is
/// off, so only the claim can hand it out.
#[tokio::test]
async fn a_late_commit_below_acked_rows_goes_out_at_the_next_claim() {
    let app = TestApp::spawn_with(|args| {
        args.set("--claim-sweep-interval", "0");
    })
    .await;
    let mut late = app.pool().begin().await.expect("begin the late producer");
    let late_id = uuid::Uuid::new_v4();
    crate::support::insert_plain(&mut late, late_id).await;

    insert_many(&app, 300).await;
    assert_eq!(drain(&app).await, 300);
    // Claims after the drain move nothing past the open transaction.
    for _ in 0..3 {
        assert!(app.nothing_to_claim().await);
        tokio::time::sleep(millis(20)).await;
    }

    late.commit().await.expect("the late commit");
    let batch = app.claim("w", 10, secs(60), Duration::ZERO).await;
    assert_eq!(
        ids(&batch),
        [late_id.to_string()],
        "the late commit goes out at the next claim"
    );
    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK]);
}

/// An event its producer made due later gets a delay row when a claim first
/// walks it, is not handed out before its time, and then is.
#[tokio::test]
async fn an_event_due_later_waits_under_a_delay_row_and_then_goes_out() {
    let app = TestApp::spawn().await;
    app.db
        .execute(
            "INSERT INTO public.outbox (id, aggregate_id, event_type, payload, available_at) \
             VALUES (gen_random_uuid(), 'later', 'test.event', '{}', now() + interval '1500 ms')",
        )
        .await;
    insert_many(&app, 5).await;
    let due = app.claim("w", 10, secs(60), Duration::ZERO).await;
    assert_eq!(due.messages.len(), 5, "the five due now, not the later one");
    assert_eq!(app.ack(&due.lease_id, &ids(&due)).await, [OK; 5]);
    assert_eq!(
        app.count("public.outbox_leases", "delayed AND locked_until > now()")
            .await,
        1,
        "the later event waits under a delay row"
    );
    assert!(app.nothing_to_claim().await, "not before its time");

    let later = app.claim("w", 10, secs(60), secs(5)).await;
    assert_eq!(later.messages.len(), 1);
    assert_eq!(later.messages[0].aggregate_id, "later");
    assert_eq!(later.messages[0].attempt, 1, "the wait was no delivery");
    let at: bool = sqlx::query_scalar(
        "SELECT l.claimed_at >= o.available_at FROM public.outbox_leases AS l
         JOIN public.outbox AS o USING (id) WHERE NOT l.delayed",
    )
    .fetch_one(app.pool())
    .await
    .expect("the lease");
    assert!(at, "handed out at its available_at or later");
    assert_eq!(app.ack(&later.lease_id, &ids(&later)).await, [OK]);
}

/// A nacked event sits below the cursor once later events are claimed: its
/// delay row brings it back when its backoff ends.
#[tokio::test]
async fn a_nacked_event_below_the_cursor_comes_back_after_its_backoff() {
    let app = TestApp::spawn().await;
    insert_many(&app, 3).await;
    let batch = app.claim("w", 3, secs(60), Duration::ZERO).await;
    let all = ids(&batch);
    assert_eq!(
        app.nack_retry(&batch.lease_id, &all[..1], Some(millis(800)))
            .await,
        [OK]
    );
    assert_eq!(app.ack(&batch.lease_id, &all[1..]).await, [OK; 2]);
    insert_many(&app, 3).await;
    let next = app.claim("w", 10, secs(60), Duration::ZERO).await;
    assert_eq!(
        next.messages.len(),
        3,
        "the new ones, not the nacked one yet"
    );
    assert!(!ids(&next).contains(&all[0]));
    assert_eq!(app.ack(&next.lease_id, &ids(&next)).await, [OK; 3]);

    let again = app.claim("w", 10, secs(60), secs(5)).await;
    assert_eq!(ids(&again), all[..1], "the nacked event, after its backoff");
    assert_eq!(again.messages[0].attempt, 2);
    assert_eq!(app.ack(&again.lease_id, &ids(&again)).await, [OK]);
}

/// A dead letter lies below the cursor; redriven, it is handed out again.
#[tokio::test]
async fn a_redriven_dead_letter_below_the_cursor_is_handed_out() {
    let app = TestApp::spawn().await;
    insert_many(&app, 3).await;
    let batch = app.claim("w", 3, secs(60), Duration::ZERO).await;
    let all = ids(&batch);
    let dead = app
        .nack(outboxd::grpc::pb::NackRequest {
            lease_id: batch.lease_id.clone(),
            message_ids: all[..1].to_vec(),
            error: "poison".into(),
            dead_letter: true,
            ..Default::default()
        })
        .await;
    assert_eq!(dead, [crate::support::DEAD_LETTERED]);
    assert_eq!(app.ack(&batch.lease_id, &all[1..]).await, [OK; 2]);
    insert_many(&app, 2).await;
    assert_eq!(drain(&app).await, 2);

    let redriven = app
        .redrive(RedriveRequest {
            outbox: String::new(),
            message_ids: all[..1].to_vec(),
            ..Default::default()
        })
        .await;
    assert_eq!(redriven, 1);
    let again = app.claim("w", 10, secs(60), Duration::ZERO).await;
    assert_eq!(ids(&again), all[..1]);
    assert_eq!(app.ack(&again.lease_id, &ids(&again)).await, [OK]);
}

/// What only a fault can do, done by hand: lease rows deleted below the
/// cursor (the sweep finds those events, hands them out again and counts
/// them), and a lease row whose outbox row is gone (removed and counted).
#[tokio::test]
async fn the_sweep_hands_out_and_counts_what_a_hand_in_the_lease_table_uncovered() {
    let mut app = TestApp::spawn_with(|args| {
        args.set("--claim-sweep-interval", "300ms")
            .set("--metrics-interval", "100ms");
    })
    .await;
    app.sweep_findings_expected = true;
    insert_many(&app, 5).await;
    let batch = app.claim("w", 5, secs(60), Duration::ZERO).await;
    assert_eq!(batch.messages.len(), 5);
    let all = ids(&batch);
    assert_eq!(app.ack(&batch.lease_id, &all[2..]).await, [OK; 3]);
    // The cursor moves on with claims, up to what the commit-order guard
    // has vouched for: a little later, past all five.
    wait_until(secs(10), "the cursor passes the five events", async || {
        assert!(app.nothing_to_claim().await);
        gauge(&app.scrape().await, "outbox_claim_cursor", "default").is_some_and(|c| c >= 5.0)
    })
    .await;
    app.db
        .execute(&format!(
            "DELETE FROM public.outbox_leases WHERE id IN ('{}', '{}');
             INSERT INTO public.outbox_leases (id, lease_id, locked_until, claimed_by, claimed_at, attempts)
             VALUES (gen_random_uuid(), gen_random_uuid(), now() + interval '1 hour', 'gone', now(), 1)",
            all[0], all[1]
        ))
        .await;

    wait_until(
        secs(10),
        "the sweep counts two events and one orphan lease",
        async || {
            let body = app.scrape().await;
            gauge(&body, "outbox_claim_sweep_found_total", "default") == Some(2.0)
                && gauge(&body, "outbox_orphan_leases_removed_total", "default") == Some(1.0)
        },
    )
    .await;
    let body = app.scrape().await;
    assert!(gauge(&body, "outbox_claim_sweeps_total", "default").is_some_and(|n| n >= 1.0));
    let again = app.claim("w", 10, secs(60), Duration::ZERO).await;
    let mut got = ids(&again);
    got.sort();
    let mut expected = all[..2].to_vec();
    expected.sort();
    assert_eq!(got, expected, "the uncovered events are handed out again");
    assert_eq!(app.ack(&again.lease_id, &ids(&again)).await, [OK; 2]);
    assert_eq!(app.count("public.outbox_leases", "true").await, 0);
}

/// A transaction left open holds the cursor back: the holdback gauge, so far
/// an ordered outbox's, says so for an unordered one too.
#[tokio::test]
async fn a_transaction_holding_the_cursor_back_shows_as_holdback() {
    let app = TestApp::spawn_with(|args| {
        args.set("--metrics-interval", "100ms");
    })
    .await;
    let (writer, _pid) = open_transaction(&app.db, "cursor-holder").await;
    insert_many(&app, 3).await;
    assert_eq!(drain(&app).await, 3, "unordered events go out meanwhile");
    wait_until(secs(10), "the holdback grows past 0.5 s", async || {
        gauge(
            &app.scrape().await,
            "outbox_commit_order_holdback_seconds",
            "default",
        )
        .is_some_and(|v| v > 0.5)
    })
    .await;
    drop(writer);
    wait_until(secs(10), "the holdback is over", async || {
        gauge(
            &app.scrape().await,
            "outbox_commit_order_holdback_seconds",
            "default",
        ) == Some(0.0)
    })
    .await;
    let cursor = gauge(&app.scrape().await, "outbox_claim_cursor", "default");
    assert!(cursor.is_some_and(|c| c >= 0.0), "{cursor:?}");
}

#[tokio::test]
async fn a_claim_sweep_interval_that_does_not_parse_exits_64_naming_it() {
    for (args, env) in [
        (
            vec![
                "--database-url",
                "postgres://u@h/d",
                "--claim-sweep-interval",
                "often",
            ],
            vec![],
        ),
        (
            vec!["--database-url", "postgres://u@h/d"],
            vec![("OUTBOXD_CLAIM_SWEEP_INTERVAL", "often")],
        ),
    ] {
        let output = run_outboxd(&args, &env).await;
        let text = said(&output);
        assert_eq!(output.status.code(), Some(64), "{text}");
        assert!(text.contains("--claim-sweep-interval"), "{text}");
        if !env.is_empty() {
            assert!(text.contains("OUTBOXD_CLAIM_SWEEP_INTERVAL"), "{text}");
        }
    }
}
