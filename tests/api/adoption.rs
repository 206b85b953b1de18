//! Adopting an existing outbox table of the classic shape (uuid aggregate_id, no
//! lease columns): served as it is, adopted once however many replicas start,
//! and refused with a clear reason when start-up may not change it.

use std::{sync::Arc, time::Duration};

use outboxd::server::Server;
use serde_json::json;
use sqlx::AssertSqlSafe;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{OK, Outboxd, ServerArgs, TestApp, TestDb, config_for, ids, secs, within};

/// The table as a classic relay would have left it.
const CLASSIC_TABLE: &str = "CREATE TABLE public.legacy_outbox (
    id uuid PRIMARY KEY,
    aggregate_id uuid NOT NULL,
    event_type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz
)";

fn legacy(args: &mut ServerArgs) {
    args.add("--outbox", "legacy=public.legacy_outbox");
}

struct Legacy {
    db: Arc<TestDb>,
    /// Unpublished rows: (id, aggregate_id), oldest first.
    pending: Vec<(Uuid, Uuid)>,
    published: Vec<Uuid>,
}

/// A fresh database holding a classic outbox with three unpublished rows and two
/// the old relay already published.
async fn classic_outbox() -> Legacy {
    let db = TestDb::create().await;
    db.execute(CLASSIC_TABLE).await;
    let pending: Vec<(Uuid, Uuid)> = (0..3).map(|_| (Uuid::new_v4(), Uuid::new_v4())).collect();
    let published: Vec<Uuid> = (0..2).map(|_| Uuid::new_v4()).collect();
    for (age, (id, aggregate)) in pending.iter().enumerate() {
        sqlx::query(
            "INSERT INTO public.legacy_outbox (id, aggregate_id, event_type, payload, created_at)
             VALUES ($1, $2, 'order.created', $3, now() - make_interval(mins => $4))",
        )
        .bind(id)
        .bind(aggregate)
        .bind(json!({ "n": age }))
        .bind(10 - age as i32)
        .execute(&db.pool)
        .await
        .expect("insert a classic row");
    }
    for id in &published {
        sqlx::query(
            "INSERT INTO public.legacy_outbox (id, aggregate_id, event_type, payload, published_at)
             VALUES ($1, gen_random_uuid(), 'order.shipped', '{}', now() - interval '1 hour')",
        )
        .bind(id)
        .execute(&db.pool)
        .await
        .expect("insert a published classic row");
    }
    Legacy {
        db,
        pending,
        published,
    }
}

/// Columns, indexes and triggers of the legacy table, as text.
async fn shape(db: &TestDb) -> String {
    sqlx::query_scalar::<_, String>(
        "SELECT concat_ws(' | ',
            (SELECT string_agg(attname || ' ' || format_type(atttypid, atttypmod), ', ' ORDER BY attnum)
               FROM pg_attribute
              WHERE attrelid = 'public.legacy_outbox'::regclass AND attnum > 0 AND NOT attisdropped),
            (SELECT string_agg(indexdef, '; ' ORDER BY indexname)
               FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'legacy_outbox'),
            (SELECT string_agg(tgname, ', ' ORDER BY tgname)
               FROM pg_trigger WHERE tgrelid = 'public.legacy_outbox'::regclass AND NOT tgisinternal))",
    )
    .fetch_one(&db.pool)
    .await
    .expect("read the table's shape")
}

async fn count(db: &TestDb, sql: &str) -> i64 {
    sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
        .fetch_one(&db.pool)
        .await
        .expect("count")
}

/// Builds a `--no-migrate` server on the legacy table and returns why it refused;
/// `what` names the table's state for the failure message if it started.
async fn refused_without_migrate(db: &TestDb, what: &str) -> String {
    refused(db, what, |args| {
        legacy(args);
        args.flag("--no-migrate");
    })
    .await
}

/// Builds a server with `customize` and returns why it refused to start.
async fn refused(db: &TestDb, what: &str, customize: impl FnOnce(&mut ServerArgs)) -> String {
    let config = config_for(db, db.upstream(), customize);
    let built = within(
        secs(30),
        "Server::build",
        Server::build(config, &CancellationToken::new()),
    )
    .await;
    match built {
        Ok(_) => panic!("outboxd served {what}"),
        Err(err) => format!("{err:#}"),
    }
}

#[tokio::test]
async fn a_classic_outbox_table_is_adopted_and_served() {
    let legacy_outbox = classic_outbox().await;
    let app = TestApp::spawn_on(Arc::clone(&legacy_outbox.db), legacy)
        .await
        .expect("the server adopts the classic table");

    let batch = app
        .claim_from("legacy", "w", 10, secs(30), Duration::ZERO)
        .await;
    let expected_ids: Vec<String> = legacy_outbox
        .pending
        .iter()
        .map(|(id, _)| id.to_string())
        .collect();
    let expected_aggregates: Vec<String> = legacy_outbox
        .pending
        .iter()
        .map(|(_, agg)| agg.to_string())
        .collect();
    assert_eq!(
        ids(&batch),
        expected_ids,
        "unpublished rows, in insertion order"
    );
    let aggregates: Vec<String> = batch
        .messages
        .iter()
        .map(|m| m.aggregate_id.clone())
        .collect();
    assert_eq!(
        aggregates, expected_aggregates,
        "uuid aggregate ids come as text"
    );
    assert!(
        batch
            .messages
            .iter()
            .all(|m| m.attempt == 1 && m.event_type == "order.created")
    );
    assert!(batch.messages.iter().all(|m| m.headers.is_empty()));

    assert_eq!(
        app.ack_in("legacy", &batch.lease_id, &ids(&batch)).await,
        [OK; 3]
    );
    assert!(
        app.claim_from("legacy", "w", 10, secs(30), Duration::ZERO)
            .await
            .messages
            .is_empty(),
        "rows the old relay published are never handed out"
    );
    for id in &legacy_outbox.published {
        let row = app
            .row_in("public.legacy_outbox", &id.to_string())
            .await
            .expect("kept");
        assert_eq!(row.attempts, 0, "published row {id} was never claimed");
        assert!(row.lease_id.is_none());
    }

    // The application keeps inserting the classic columns only, with no
    // trigger to run; outboxd notices the insert and wakes a waiting claim.
    let waiter = app.spawn_claim(crate::support::claim_request(
        "legacy",
        "w",
        10,
        secs(30),
        secs(10),
    ));
    let (new_id, new_aggregate) = (Uuid::new_v4(), Uuid::new_v4());
    sqlx::query(
        "INSERT INTO public.legacy_outbox (id, aggregate_id, event_type, payload) VALUES ($1, $2, 'order.paid', '{}')",
    )
    .bind(new_id)
    .bind(new_aggregate)
    .execute(app.pool())
    .await
    .expect("classic insert");
    let batch = within(secs(12), "the waiting legacy claim", waiter)
        .await
        .expect("waiter task")
        .expect("ClaimBatch");
    assert_eq!(ids(&batch), [new_id.to_string()]);
    assert_eq!(batch.messages[0].aggregate_id, new_aggregate.to_string());

    let indexes = count(
        &app.db,
        "SELECT count(*) FROM pg_indexes WHERE schemaname = 'public' AND tablename = 'legacy_outbox'",
    )
    .await;
    assert_eq!(indexes, 4, "the primary key and the three outboxd indexes");
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.legacy_outbox'::regclass AND NOT tgisinternal",
        )
        .await,
        0,
        "no trigger on the producers' insert path"
    );
    assert_eq!(
        count(
            &app.db,
            "SELECT count(*) FROM pg_class WHERE oid = 'public.legacy_outbox'::regclass \
             AND reloptions @> ARRAY['fillfactor=45']",
        )
        .await,
        1,
        "room left on each page for the acks"
    );
}

#[tokio::test]
async fn a_second_server_adopts_the_same_table_idempotently() {
    let legacy_outbox = classic_outbox().await;
    let db = Arc::clone(&legacy_outbox.db);
    let first = TestApp::spawn_on(Arc::clone(&db), legacy)
        .await
        .expect("the first server adopts");
    let adopted = shape(&db).await;
    let second = TestApp::spawn_on(Arc::clone(&db), legacy)
        .await
        .expect("a second server on the same table starts");
    assert_eq!(
        shape(&db).await,
        adopted,
        "no duplicate columns, indexes or triggers"
    );
    let verify_only = TestApp::spawn_on(Arc::clone(&db), |args| {
        legacy(args);
        args.flag("--no-migrate");
    })
    .await
    .expect("--no-migrate accepts an adopted table");
    assert_eq!(shape(&db).await, adopted);
    assert_eq!(
        count(
            &db,
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'legacy_outbox'"
        )
        .await,
        4
    );

    // Replicas share only the database: claim on one, settle on another.
    let batch = second
        .claim_from("legacy", "w", 10, secs(30), Duration::ZERO)
        .await;
    assert_eq!(batch.messages.len(), 3);
    assert_eq!(
        verify_only
            .ack_in("legacy", &batch.lease_id, &ids(&batch))
            .await,
        [OK; 3]
    );
    assert_eq!(first.stats_of("legacy").await.published_retained, 5);
}

#[tokio::test]
async fn no_migrate_refuses_an_unadopted_table_with_a_clear_error() {
    let legacy_outbox = classic_outbox().await;
    let db = &legacy_outbox.db;
    let before = shape(db).await;
    let err = refused_without_migrate(db, "a table outboxd has not adopted").await;
    assert!(
        err.contains("public.legacy_outbox"),
        "the error names the table: {err}"
    );
    assert!(
        err.contains("lacks columns"),
        "the error says what is missing: {err}"
    );
    assert!(
        err.contains("outboxd migrate"),
        "the error says how to fix it: {err}"
    );
    assert_eq!(shape(db).await, before, "verification changed nothing");
}

#[tokio::test]
async fn replicas_starting_together_adopt_the_table_once() {
    let legacy_outbox = classic_outbox().await;
    let db = &legacy_outbox.db;
    let (a, b, c) = tokio::join!(
        TestApp::spawn_on(Arc::clone(db), legacy),
        TestApp::spawn_on(Arc::clone(db), legacy),
        TestApp::spawn_on(Arc::clone(db), legacy),
    );
    let replicas =
        [a, b, c].map(|r| r.unwrap_or_else(|e| panic!("a replica did not start: {e:#}")));
    assert_eq!(
        count(
            db,
            "SELECT count(*) FROM pg_indexes WHERE tablename = 'legacy_outbox'"
        )
        .await,
        4
    );
    let batch = replicas[0]
        .claim_from("legacy", "w", 10, secs(30), Duration::ZERO)
        .await;
    assert_eq!(batch.messages.len(), 3);
    assert_eq!(
        replicas[2]
            .ack_in("legacy", &batch.lease_id, &ids(&batch))
            .await,
        [OK; 3]
    );
}

/// Earlier versions kept lease state on the row, with indexes over it and a
/// wake-up trigger; a start-up that may change the table builds the pending
/// index, drops the old indexes and the trigger, and creates the lease table. A
/// `--no-migrate` start asks for the migration.
#[tokio::test]
async fn the_lease_indexes_and_trigger_of_an_earlier_version_are_replaced() {
    let legacy_outbox = classic_outbox().await;
    let db = &legacy_outbox.db;
    // A database an earlier release set up: its frozen migrations ran there
    // (the trigger's function is theirs), and this release's start runs any
    // it has not.
    outboxd::server::MIGRATOR
        .run(&db.pool)
        .await
        .expect("the frozen migrations");
    let first = TestApp::spawn_on(Arc::clone(db), legacy)
        .await
        .expect("the first server adopts");
    let adopted = shape(db).await;
    // The layout of the previous version, as its adoption left it.
    db.execute(
        "DROP INDEX public.legacy_outbox_pending_idx;
         DROP TABLE public.legacy_outbox_leases;
         CREATE INDEX legacy_outbox_unleased_idx ON public.legacy_outbox (seq)
             WHERE published_at IS NULL AND dead_lettered_at IS NULL AND locked_until IS NULL;
         CREATE INDEX legacy_outbox_leased_idx ON public.legacy_outbox (locked_until)
             WHERE published_at IS NULL AND dead_lettered_at IS NULL AND locked_until IS NOT NULL;
         CREATE INDEX legacy_outbox_lease_idx ON public.legacy_outbox (lease_id)
             WHERE lease_id IS NOT NULL AND published_at IS NULL;
         CREATE TRIGGER outboxd_notify AFTER INSERT ON public.legacy_outbox
             REFERENCING NEW TABLE AS outboxd_new_rows
             FOR EACH STATEMENT EXECUTE FUNCTION outboxd_notify();",
    )
    .await;

    let err = refused_without_migrate(db, "a table without its pending index").await;
    assert!(err.contains("legacy_outbox_pending_idx"), "{err}");

    let upgraded = TestApp::spawn_on(Arc::clone(db), legacy)
        .await
        .expect("a server of this version upgrades the table");
    assert_eq!(
        shape(db).await,
        adopted,
        "the same shape as a fresh adoption"
    );
    let batch = upgraded
        .claim_from("legacy", "w", 10, secs(30), Duration::ZERO)
        .await;
    assert_eq!(batch.messages.len(), 3);
    assert_eq!(
        first.ack_in("legacy", &batch.lease_id, &ids(&batch)).await,
        [OK; 3]
    );
}

/// The migration that creates the default outbox predates lease tables;
/// start-up brings that table to the current indexes, drops its trigger and
/// gives it a lease table.
#[tokio::test]
async fn the_default_outbox_has_the_current_indexes_and_no_trigger() {
    let app = TestApp::spawn().await;
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT indexname::text FROM pg_indexes WHERE tablename IN ('outbox', 'outbox_leases') \
         ORDER BY indexname",
    )
    .fetch_all(app.pool())
    .await
    .expect("list indexes");
    assert_eq!(
        names,
        [
            "outbox_dead_letter_idx",
            "outbox_leases_aggregate_idx",
            "outbox_leases_expiry_idx",
            "outbox_leases_lease_idx",
            "outbox_leases_pkey",
            "outbox_pending_idx",
            "outbox_pkey",
            "outbox_published_idx",
        ]
    );
    let triggers = app
        .db
        .scalar_i64(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = 'public.outbox'::regclass AND NOT tgisinternal",
        )
        .await;
    assert_eq!(triggers, 0);
}

/// Ordering a table that was served unordered: start-up gives it the
/// aggregate index, and its lease table (here as an earlier release made it,
/// without the aggregate column) what ordered claims read. A table whose seq
/// sequence caches values cannot keep commit order and is refused.
#[tokio::test]
async fn ordering_an_outbox_adds_its_index_and_upgrades_an_earlier_lease_table() {
    let legacy_outbox = classic_outbox().await;
    let db = &legacy_outbox.db;
    drop(
        TestApp::spawn_on(Arc::clone(db), legacy)
            .await
            .expect("adopted unordered"),
    );
    db.execute("ALTER TABLE public.legacy_outbox_leases DROP COLUMN aggregate_id")
        .await;
    let ordered = |args: &mut ServerArgs| {
        args.add("--outbox", "legacy=public.legacy_outbox:ordering=aggregate");
    };

    let err = refused(db, "an ordered table without its index", |args| {
        ordered(args);
        args.flag("--no-migrate");
    })
    .await;
    assert!(err.contains("legacy_outbox_aggregate_idx"), "{err}");

    let app = TestApp::spawn_on(Arc::clone(db), ordered)
        .await
        .expect("a server orders the table");
    let indexes = count(
        db,
        "SELECT count(*) FROM pg_indexes WHERE indexname IN \
         ('legacy_outbox_aggregate_idx', 'legacy_outbox_leases_aggregate_idx')",
    )
    .await;
    assert_eq!(indexes, 2);
    // The classic rows: one aggregate each, all heads.
    let batch = app.claim_from("legacy", "w", 10, secs(30), secs(5)).await;
    assert_eq!(batch.messages.len(), 3);
    drop(app);

    db.execute("ALTER SEQUENCE public.legacy_outbox_seq_seq CACHE 20")
        .await;
    let err = refused(db, "ordering over a caching sequence", ordered).await;
    assert!(err.contains("CACHE to be 1"), "{err}");
}

/// A brand-new database: outboxd creates each configured table in today's
/// shape and says so, without the upgrade lines (adding columns, dropping the
/// wake-up trigger) that would read as if something old had been there, and
/// without the first release's `public.outbox` for an outbox of another name.
#[tokio::test]
async fn a_first_start_on_a_new_database_creates_without_upgrading() {
    let db = TestDb::create().await;
    let server = Outboxd::start(
        &db,
        &["--outbox", "orders=public.orders:ordering=aggregate"],
    )
    .await;
    let said = server.said();
    assert!(
        !server
            .lines_with(&["creating outbox table", "public.orders"])
            .is_empty(),
        "{said}"
    );
    for upgrade in [
        "adopting table",
        "wake-up trigger",
        "dropping the",
        "upgrading",
        "fillfactor",
    ] {
        assert!(
            !said.contains(upgrade),
            "no upgrade line ({upgrade}):\n{said}"
        );
    }
    let stray = db
        .scalar_i64(
            "SELECT count(*) FROM pg_class WHERE relname IN ('outbox', '_sqlx_migrations', 'outboxd_quiet')",
        )
        .await;
    assert_eq!(stray, 0, "nothing but the configured outbox is created");
    let columns = db
        .scalar_i64(
            "SELECT count(*) FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name = 'orders' AND column_name = 'redrives'",
        )
        .await;
    assert_eq!(columns, 1, "the table has today's columns");
    drop(server);

    // A second start has nothing to create or upgrade.
    let again = Outboxd::start(
        &db,
        &["--outbox", "orders=public.orders:ordering=aggregate"],
    )
    .await;
    assert!(
        again.lines_with(&["creating"]).is_empty(),
        "{}",
        again.said()
    );
}
