//! The database watchdog: who holds back the xmin horizon (an open
//! transaction, a replication slot), the outbox table's dead tuples, as
//! gauges, in GetDatabaseReport and, once per holder, in the log.

use outboxd::grpc::pb::GetDatabaseReportResponse;
use sqlx::{Connection, PgConnection};
use uuid::Uuid;

use crate::{
    shared::{cluster::PrivateCluster, wait::holds_within},
    support::{
        Outboxd, TestApp, TestDb, gauge, millis, open_transaction, secs, wait_until, within,
    },
};

/// The value of an unlabelled series `name` in a scrape.
fn db_gauge(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .find_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
}

async fn report_of(app: &TestApp) -> Option<GetDatabaseReportResponse> {
    app.database_report().await
}

fn age_secs(d: Option<&prost_types::Duration>) -> f64 {
    d.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

#[tokio::test]
async fn an_open_transaction_shows_as_the_horizon_holder_until_it_ends() {
    let app = TestApp::spawn_with(|args| {
        args.set("--watchdog-interval", "200ms");
    })
    .await;
    let (mut holder, pid) = open_transaction(&app.db, "watchdog-test-holder").await;
    let opened = tokio::time::Instant::now();
    // Held for a while: the gauge passes the time it has been open.
    tokio::time::sleep(secs(2)).await;
    let held = opened.elapsed().as_secs_f64();
    wait_until(
        secs(20),
        "the horizon age passes the time held",
        async || {
            db_gauge(&app.scrape().await, "outbox_db_xmin_horizon_age_seconds")
                .is_some_and(|age| age >= held)
        },
    )
    .await;
    let body = app.scrape().await;
    assert!(
        db_gauge(&body, "outbox_db_oldest_transaction_age_seconds").unwrap_or(0.0) >= held,
        "{body}"
    );
    assert!(
        db_gauge(&body, "outbox_db_idle_in_transaction_seconds").unwrap_or(0.0) > 1.0,
        "{body}"
    );

    let found = report_of(&app).await.expect("a report");
    assert!(found.read_at.is_some());
    assert!(age_secs(found.xmin_horizon_age.as_ref()) >= held);
    let named = found
        .transactions
        .iter()
        .find(|t| t.pid == pid)
        .unwrap_or_else(|| panic!("the holder {pid} is named: {found:?}"));
    assert_eq!(named.application_name, "watchdog-test-holder");
    assert_eq!(named.state, "idle in transaction");
    assert!(named.writer);
    assert!(named.idle_in_transaction.is_some());

    sqlx::raw_sql("COMMIT")
        .execute(&mut holder)
        .await
        .expect("end the transaction");
    wait_until(secs(20), "the horizon age falls back", async || {
        db_gauge(&app.scrape().await, "outbox_db_xmin_horizon_age_seconds")
            .is_some_and(|age| age < 1.0)
    })
    .await;
    let after = report_of(&app).await.expect("a report");
    assert!(after.transactions.iter().all(|t| t.pid != pid), "{after:?}");
}

#[tokio::test]
async fn an_old_holder_is_warned_about_once_without_its_query_and_cleared_once() {
    let db = TestDb::create().await;
    let server = Outboxd::start(
        &db,
        &["--watchdog-interval", "200ms", "--xmin-warn-after", "1s"],
    )
    .await;
    server.wait_said(&["serving"]).await;
    let (mut holder, pid) = open_transaction(&db, "watchdog-test-warned").await;
    // A query text the log must never show.
    let secret = format!("secret_{}", Uuid::new_v4().simple());
    sqlx::query(sqlx::AssertSqlSafe(format!("SELECT 1 AS {secret}")))
        .execute(&mut holder)
        .await
        .expect("a query in the transaction");
    let pid_field = format!("pid={pid}");
    server
        .wait_said(&["WARN", "xmin horizon", &pid_field, "watchdog-test-warned"])
        .await;
    // Several samples later, still once.
    tokio::time::sleep(secs(1)).await;
    let warned = server.lines_with(&["WARN", "xmin horizon", &pid_field]);
    assert_eq!(warned.len(), 1, "{}", server.said());
    assert!(warned[0].contains("idle in transaction"), "{}", warned[0]);
    assert!(!server.said().contains(&secret), "{}", server.said());

    sqlx::raw_sql("ROLLBACK")
        .execute(&mut holder)
        .await
        .expect("end the transaction");
    server
        .wait_said(&["INFO", "no longer holds back", &pid_field])
        .await;
    tokio::time::sleep(secs(1)).await;
    assert_eq!(
        server
            .lines_with(&["no longer holds back", &pid_field])
            .len(),
        1,
        "{}",
        server.said()
    );
    assert_eq!(
        server
            .lines_with(&["WARN", "xmin horizon", &pid_field])
            .len(),
        1
    );
}

/// Drops the test's replication slot however the test ends.
struct SlotGuard {
    admin_url: String,
    name: String,
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        let url = self.admin_url.clone();
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&url).await?;
                sqlx::query(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = $1",
                )
                .bind(&name)
                .execute(&mut conn)
                .await
                .map(drop)
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("warning: could not drop replication slot {}", self.name);
        }
    }
}

#[tokio::test]
async fn a_replication_slot_is_reported_by_name_with_the_wal_it_keeps() {
    let app = TestApp::spawn_with(|args| {
        args.set("--watchdog-interval", "200ms");
    })
    .await;
    let name = format!("outboxd_test_{}", Uuid::new_v4().simple());
    let wal_level: String = sqlx::query_scalar("SHOW wal_level")
        .fetch_one(app.pool())
        .await
        .expect("wal_level");
    let _guard = SlotGuard {
        admin_url: app.db.url(),
        name: name.clone(),
    };
    let slot_type = if wal_level == "logical" {
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')")
            .bind(&name)
            .execute(app.pool())
            .await
            .expect("create a logical slot");
        "logical"
    } else {
        // This cluster has no logical WAL (wal_level is not `logical`): a
        // physical slot that reserves WAL at once stands in.
        sqlx::query("SELECT pg_create_physical_replication_slot($1, immediately_reserve => true)")
            .bind(&name)
            .execute(app.pool())
            .await
            .expect("create a physical slot");
        "physical"
    };
    // Some WAL after the slot's restart point.
    app.db
        .execute("CREATE TABLE wal_filler AS SELECT g FROM generate_series(1, 1000) AS g")
        .await;
    let mut last = None;
    let found = holds_within(secs(20), millis(100), async || {
        last = report_of(&app).await;
        last.as_ref().is_some_and(|r| {
            r.replication_slots
                .iter()
                .any(|s| s.name == name && s.retained_wal_bytes.unwrap_or(0) > 0)
        })
    })
    .await;
    assert!(found, "slot {name} with retained WAL in {last:?}");
    let slot = last
        .as_ref()
        .and_then(|r| r.replication_slots.iter().find(|s| s.name == name))
        .expect("the slot");
    assert_eq!(slot.slot_type, slot_type);
    if slot_type == "logical" {
        assert!(slot.catalog_xmin_age.is_some(), "{slot:?}");
    }
    let body = app.scrape().await;
    assert!(
        db_gauge(&body, "outbox_db_replication_slot_retained_wal_bytes").unwrap_or(0.0) > 0.0,
        "{body}"
    );
}

#[tokio::test]
async fn dead_tuples_show_after_deletes_without_vacuum() {
    let app = TestApp::spawn_with(|args| {
        args.set("--watchdog-interval", "200ms");
    })
    .await;
    // Autovacuum would clean up behind the test's back.
    app.db
        .execute("ALTER TABLE outbox SET (autovacuum_enabled = false)")
        .await;
    app.insert(200).await;
    let mut conn = app.pool().acquire().await.expect("a connection");
    sqlx::query("DELETE FROM outbox")
        .execute(&mut *conn)
        .await
        .expect("delete the rows");
    // Statistics reach pg_stat_user_tables asynchronously: flush this
    // session's now (PostgreSQL 15).
    sqlx::query("SELECT pg_stat_force_next_flush()")
        .execute(&mut *conn)
        .await
        .expect("flush the statistics");
    drop(conn);
    wait_until(
        secs(30),
        "200 dead tuples in the outbox table",
        async || {
            gauge(&app.scrape().await, "outbox_table_dead_tuples", "default")
                .is_some_and(|dead| dead >= 200.0)
        },
    )
    .await;
    let body = app.scrape().await;
    assert!(
        gauge(&body, "outbox_table_size_bytes", "default").unwrap_or(0.0) > 0.0,
        "{body}"
    );
    assert!(
        gauge(&body, "outbox_table_index_size_bytes", "default").unwrap_or(0.0) > 0.0,
        "{body}"
    );
    assert_eq!(
        gauge(&body, "outbox_table_last_autovacuum_age_seconds", "default"),
        None,
        "never vacuumed: absent"
    );
    let found = report_of(&app).await.expect("a report");
    let table = found
        .tables
        .iter()
        .find(|t| t.outbox == "default")
        .expect("the default outbox's table");
    assert!(table.dead_tuples >= 200, "{table:?}");
    assert!(table.since_vacuum.is_none(), "{table:?}");
}

#[tokio::test]
async fn the_report_names_the_writer_an_ordered_outbox_waits_for() {
    let app = TestApp::spawn_with(|args| {
        args.add("--outbox", "default=public.outbox")
            .add("--outbox", "orders=public.orders_outbox:ordering=aggregate")
            .set("--metrics-interval", "100ms")
            .set("--watchdog-interval", "200ms");
    })
    .await;
    let (mut writer, pid) = open_transaction(&app.db, "watchdog-test-writer").await;
    // An ordered event committed while the writer is open waits for it.
    app.db
        .execute(
            "INSERT INTO public.orders_outbox (id, aggregate_id, event_type, payload) \
             VALUES (gen_random_uuid(), 'a', 'test.event', '{}')",
        )
        .await;
    let mut last = None;
    let named = holds_within(secs(20), millis(100), async || {
        last = report_of(&app).await;
        last.as_ref()
            .and_then(|r| r.commit_order_cause.as_ref())
            .is_some_and(|c| c.pid == pid)
    })
    .await;
    assert!(named, "the writer {pid} is named as the cause: {last:?}");
    let cause = last
        .as_ref()
        .and_then(|r| r.commit_order_cause.clone())
        .expect("a cause");
    assert_eq!(cause.application_name, "watchdog-test-writer");
    assert_eq!(cause.state, "idle in transaction");

    sqlx::raw_sql("COMMIT")
        .execute(&mut writer)
        .await
        .expect("the writer ends");
    let cleared = holds_within(secs(20), millis(100), async || {
        report_of(&app)
            .await
            .is_some_and(|r| r.commit_order_cause.is_none())
    })
    .await;
    assert!(cleared, "no cause once the writer ended");
}

/// On a server of the test's own with `max_prepared_transactions` (0 on the
/// shared one, and changing it needs a restart) and `wal_level=logical`: a
/// forgotten prepared transaction and a logical slot, each named as a
/// holder of the horizon, in the report and the gauges.
#[tokio::test]
async fn a_forgotten_prepared_transaction_and_a_logical_slot_are_reported() {
    let cluster = PrivateCluster::start_with(&[
        "max_prepared_transactions = 5",
        "wal_level = logical",
        "max_replication_slots = 5",
    ])
    .await;
    let db = cluster.create_db().await;
    let app = TestApp::spawn_on(db.clone(), |args| {
        args.set("--watchdog-interval", "200ms");
    })
    .await
    .expect("outboxd on the test's server");

    // The slot first: creating a logical slot waits for every transaction
    // holding an id to end, the prepared one included.
    let slot = format!("outboxd_test_{}", Uuid::new_v4().simple());
    within(
        secs(30),
        "creating a logical slot",
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')")
            .bind(&slot)
            .execute(app.pool()),
    )
    .await
    .expect("create a logical slot");
    let gid = format!("outboxd-test-{}", Uuid::new_v4().simple());
    let mut conn = PgConnection::connect(&db.url()).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "BEGIN; SELECT txid_current(); PREPARE TRANSACTION '{gid}'"
    )))
    .execute(&mut conn)
    .await
    .expect("prepare a transaction and forget it");

    let mut last = None;
    let found = holds_within(secs(20), millis(100), async || {
        last = report_of(&app).await;
        last.as_ref().is_some_and(|r| {
            r.prepared_transactions.iter().any(|p| p.gid == gid)
                && r.replication_slots.iter().any(|s| s.name == slot)
        })
    })
    .await;
    assert!(found, "the prepared transaction and the slot in {last:?}");
    let report = last.expect("a report");
    assert_eq!(report.prepared_transaction_count, 1);
    let prepared = &report.prepared_transactions[0];
    assert_eq!(prepared.owner, "postgres");
    assert!(prepared.prepared.is_some() && prepared.age.is_some());
    let logical = report
        .replication_slots
        .iter()
        .find(|s| s.name == slot)
        .expect("the slot");
    assert_eq!(logical.slot_type, "logical");
    assert!(logical.catalog_xmin_age.is_some(), "{logical:?}");
    wait_until(secs(20), "the prepared transaction's gauges", async || {
        let body = app.scrape().await;
        db_gauge(&body, "outbox_db_prepared_transactions") == Some(1.0)
            && db_gauge(&body, "outbox_db_oldest_prepared_transaction_age_seconds")
                .is_some_and(|age| age > 0.0)
            && db_gauge(&body, "outbox_db_replication_slots_holding_xmin").is_some_and(|n| n >= 1.0)
    })
    .await;

    // Settled, both go from the report (and the database can be dropped).
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ROLLBACK PREPARED '{gid}'")))
        .execute(&mut conn)
        .await
        .expect("roll the prepared transaction back");
    sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(app.pool())
        .await
        .expect("drop the slot");
    wait_until(secs(20), "both leave the report", async || {
        report_of(&app).await.is_some_and(|r| {
            r.prepared_transaction_count == 0 && r.replication_slots.iter().all(|s| s.name != slot)
        })
    })
    .await;
}
