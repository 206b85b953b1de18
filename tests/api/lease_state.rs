//! Lease state lives in an unlogged table beside the outbox table: a claim and
//! an ExtendLease write nothing durable, and losing the lease table (a crash of
//! PostgreSQL empties it, a promoted replica starts without it) costs
//! redeliveries, never an event.

use std::time::Duration;

use crate::support::{LEASE_LOST, OK, TestApp, ids, outcomes, secs, wait_until};

/// Counts row-level UPDATEs and DELETEs of `public.outbox` from now on.
async fn count_row_writes(app: &TestApp) {
    app.db
        .execute(
            "CREATE SEQUENCE test_row_writes MINVALUE 0 START 0;
             CREATE FUNCTION test_count_row_write() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM nextval('test_row_writes'); RETURN NULL; END $$;
             CREATE TRIGGER test_row_writes AFTER UPDATE OR DELETE ON public.outbox
                 FOR EACH ROW EXECUTE FUNCTION test_count_row_write();",
        )
        .await;
}

async fn row_writes(app: &TestApp) -> i64 {
    app.db
        .scalar_i64(
            "SELECT CASE WHEN is_called THEN last_value + 1 ELSE 0 END FROM test_row_writes",
        )
        .await
}

#[tokio::test]
async fn a_claim_and_an_extend_write_no_outbox_row_and_an_ack_writes_each_once() {
    let app = TestApp::spawn().await;
    let persistence = app
        .db
        .scalar_i64(
            "SELECT count(*) FROM pg_class WHERE oid = 'public.outbox_leases'::regclass \
             AND relpersistence = 'u'",
        )
        .await;
    assert_eq!(persistence, 1, "the lease table is unlogged");
    app.insert(5).await;
    count_row_writes(&app).await;

    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch.messages.len(), 5);
    let resp = app.extend(&batch.lease_id, &ids(&batch), secs(60)).await;
    assert_eq!(outcomes(&ids(&batch), &resp.results), [OK; 5]);
    assert_eq!(
        row_writes(&app).await,
        0,
        "claim and extend left the outbox rows alone"
    );

    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK; 5]);
    assert_eq!(row_writes(&app).await, 5, "one write per acked row");
    let row = app.row(&ids(&batch)[0]).await;
    assert_eq!(row.row_attempts, 1, "the ack wrote the count of attempts");
    assert_eq!(row.claimed_by.as_deref(), Some("w"));
    assert_eq!(
        row.lease_id.map(|l| l.to_string()),
        Some(batch.lease_id.clone()),
        "the row keeps the lease it was published under"
    );
    assert_eq!(
        app.count("public.outbox_leases", "true").await,
        0,
        "an ack ends its leases"
    );
}

#[tokio::test]
async fn an_emptied_lease_table_fences_stale_settles_and_every_event_is_delivered_again() {
    let app = TestApp::spawn().await;
    app.insert(6).await;
    let first = app.claim("w1", 3, secs(60), Duration::ZERO).await;
    let second = app.claim("w2", 3, secs(60), Duration::ZERO).await;
    assert_eq!(first.messages.len() + second.messages.len(), 6);

    // What a crash of PostgreSQL or a failover does to the unlogged tables:
    // the leases go, and the epoch with them.
    app.db
        .execute("TRUNCATE public.outbox_leases, public.outbox_epoch")
        .await;

    assert_eq!(
        app.ack(&first.lease_id, &ids(&first)).await,
        [LEASE_LOST; 3],
        "an ack under a vanished lease is fenced"
    );
    let resp = app.extend(&second.lease_id, &ids(&second), secs(60)).await;
    assert_eq!(outcomes(&ids(&second), &resp.results), [LEASE_LOST; 3]);
    assert_eq!(
        app.nack_retry(&second.lease_id, &ids(&second), None).await,
        [LEASE_LOST; 3]
    );

    let again = app.claim("w3", 10, secs(60), Duration::ZERO).await;
    let mut redelivered = ids(&again);
    let mut all: Vec<String> = ids(&first).into_iter().chain(ids(&second)).collect();
    redelivered.sort();
    all.sort();
    assert_eq!(redelivered, all, "every event is claimable again");
    assert_eq!(app.ack(&again.lease_id, &ids(&again)).await, [OK; 6]);
    assert_eq!(app.count("public.outbox", "published_at IS NULL").await, 0);
}

/// Attempts a lease counted are written to the row when the lease ends (ack,
/// nack, dead-lettering). Losing the lease table forgets only the attempts of
/// leases that expired unsettled since then: a redelivery too many before a
/// poison event is dead-lettered, never one too few.
#[tokio::test]
async fn attempts_written_by_a_settle_survive_the_loss_of_the_lease_table() {
    let app = TestApp::spawn().await;
    app.insert(1).await;
    let first = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(first.messages[0].attempt, 1);
    let id = ids(&first)[0].clone();
    assert_eq!(
        app.nack_retry(&first.lease_id, &[&id], Some(Duration::ZERO))
            .await,
        [OK]
    );
    assert_eq!(
        app.row(&id).await.row_attempts,
        1,
        "the nack wrote the count"
    );

    // Second delivery, left to expire: counted in the lease table only.
    let second = app.claim("w", 1, secs(1), Duration::ZERO).await;
    assert_eq!(second.messages[0].attempt, 2);
    wait_until(secs(10), "the second lease expires", async || {
        app.row(&id).await.lease_left.is_some_and(|left| left < 0.0)
    })
    .await;
    let third = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(third.messages[0].attempt, 3, "an expired lease counts");

    app.db.execute("TRUNCATE public.outbox_leases").await;
    let fourth = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(
        fourth.messages[0].attempt, 2,
        "after the loss the count resumes from the row's: the nacked attempt stays"
    );
}
