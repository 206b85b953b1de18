//! Statement plans: outboxd's connections cache them, so a plan made while the
//! table was empty must not read the whole table once history has grown.

use crate::support::{OK, TestApp, ids, secs, wait_until};

/// Rows of `public.outbox` updated so far, as reported. Only the server
/// updates them (acks, one row each; claims write the lease table), on the one session whose scans
/// are counted below, and a session reports its counts of a table together:
/// once its updates are in, so are its scans before them.
async fn updates(app: &TestApp) -> i64 {
    sqlx::query_scalar::<_, i64>(
        "SELECT coalesce(n_tup_upd, 0) FROM pg_stat_user_tables WHERE relid = 'public.outbox'::regclass",
    )
    .fetch_one(app.pool())
    .await
    .expect("read the table's update counter")
}

/// Waits until the server's session has reported `n` updated rows, and every
/// scan that came before them.
async fn reported(app: &TestApp, n: i64, what: &str) {
    wait_until(secs(20), what, async || updates(app).await >= n).await;
}

/// Sequential and index scans of `public.outbox` recorded so far.
async fn scans(app: &TestApp) -> (i64, i64) {
    sqlx::query_as::<_, (i64, i64)>(
        "SELECT coalesce(seq_scan, 0), coalesce(idx_scan, 0)
         FROM pg_stat_user_tables WHERE relid = 'public.outbox'::regclass",
    )
    .fetch_one(app.pool())
    .await
    .expect("read the table's scan counters")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plans_cached_on_an_empty_table_keep_using_the_indexes_as_history_grows() {
    // One connection: every statement below runs on the one session whose
    // plans are cached.
    let app = TestApp::spawn_with(|args| {
        args.set("--db-max-connections", "1");
    })
    .await;
    // As autovacuum leaves a drained table: analyzed while empty. Autovacuum is
    // then kept away so no later ANALYZE re-plans behind the test's back.
    app.db.execute("VACUUM ANALYZE outbox").await;
    app.db
        .execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
        .await;

    // Past the executions after which PostgreSQL settles on a cached plan.
    const WARM_UP: i64 = 8;
    for _ in 0..WARM_UP {
        app.insert(1).await;
        let batch = app.claim("w", 10, secs(30), secs(0)).await;
        assert_eq!(batch.messages.len(), 1);
        assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, vec![OK]);
    }

    // History grows with no ANALYZE in between.
    app.db
        .execute(
            "INSERT INTO outbox (id, aggregate_id, event_type, payload, published_at)
             SELECT gen_random_uuid(), 'agg', 'test.history', '{}', now()
             FROM generate_series(1, 20000)",
        )
        .await;
    // Each warm-up round updated one row once: its ack.
    reported(&app, WARM_UP, "the server reports what the warm-up scanned").await;
    let (seq_before, idx_before) = scans(&app).await;

    const ROUNDS: i64 = 5;
    for _ in 0..ROUNDS {
        app.insert(20).await;
        let batch = app.claim("w", 20, secs(30), secs(0)).await;
        assert_eq!(batch.messages.len(), 20);
        assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, vec![OK; 20]);
    }

    // Each round updated 20 rows once: their ack.
    reported(
        &app,
        WARM_UP + 20 * ROUNDS,
        "the server reports what the rounds scanned",
    )
    .await;
    let (seq_after, idx_after) = scans(&app).await;
    assert!(
        seq_after + idx_after >= seq_before + idx_before + 2 * ROUNDS,
        "a claim and an ack scan the table at least once each: ({seq_before}, {idx_before}) -> ({seq_after}, {idx_after})"
    );
    assert_eq!(
        (seq_after - seq_before, idx_after - idx_before > 0),
        (0, true),
        "claims and acks with 20 000 history rows: (sequential scans, used an index)"
    );
}
