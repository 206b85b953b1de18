//! The two database roles of docs/database-roles.sql, which the README quotes
//! (#46): `outboxd migrate` as the DDL role, then a server with `--no-migrate`
//! as the runtime role, each holding exactly the grants that file gives, and
//! everything a server does at run time working under them: claims (with the
//! commit-order guard of an ordered outbox), acks, nacks, extends, GetStats and
//! the gauges, the admin calls, retention and the database watchdog.

use std::{sync::Arc, time::Duration};

use hyper::{Method, StatusCode};
use outboxd::grpc::pb::{
    InspectMessageRequest, ListBlockedKeysRequest, ListDeadLettersRequest, ListOutboxesRequest,
    NackRequest, RedriveRequest,
};
use serde_json::json;
use sqlx::{AssertSqlSafe, Connection, PgConnection};
use url::Url;
use uuid::Uuid;

use crate::support::{
    DEAD_LETTERED, OK, TestApp, TestDb, gauge, http, ids, insert_row, open_transaction,
    run_outboxd, said, secs, wait_until, within,
};

/// The roles' SQL, from the one file the README quotes.
const ROLES_SQL: &str = include_str!("../../docs/database-roles.sql");
const README: &str = include_str!("../../README.md");

/// The names and passwords in the file, replaced by the test's own: roles are
/// the whole server's, and the PostgreSQL server is shared.
const MIGRATOR: &str = "outboxd_migrator";
const RUNTIME: &str = "outboxd_runtime";
const MIGRATOR_PASSWORD: &str = "change-me-migrator";
const RUNTIME_PASSWORD: &str = "change-me-runtime";

/// The two roles, under names of this test's own, dropped at the end (also
/// when the test fails): first whatever they own or were granted in the test
/// database, then the roles.
struct Roles {
    migrator: String,
    runtime: String,
    password: String,
    /// The test database as its superuser, where the grants live.
    db_url: String,
    dropped: bool,
}

impl Roles {
    /// Runs docs/database-roles.sql with this test's names.
    async fn create(db: &TestDb) -> Self {
        let roles = Self {
            migrator: format!("{}_migrator", db.name),
            runtime: format!("{}_runtime", db.name),
            password: Uuid::new_v4().simple().to_string(),
            db_url: db.url(),
            dropped: false,
        };
        let sql = ROLES_SQL
            .replace(MIGRATOR_PASSWORD, &roles.password)
            .replace(RUNTIME_PASSWORD, &roles.password)
            .replace(MIGRATOR, &roles.migrator)
            .replace(RUNTIME, &roles.runtime);
        for placeholder in [MIGRATOR, RUNTIME, "change-me"] {
            assert!(
                !sql.contains(placeholder),
                "every name and password in the file is the test's own:\n{sql}"
            );
        }
        db.execute(&sql).await;
        roles
    }

    /// The test database's URL as `role`.
    fn url(&self, role: &str) -> String {
        let mut url = Url::parse(&self.db_url).expect("test URL");
        url.set_username(role).expect("a postgres URL takes a user");
        url.set_password(Some(&self.password))
            .expect("a postgres URL takes a password");
        url.to_string()
    }

    async fn drop_now(&mut self) {
        self.dropped = true;
        if let Err(e) = drop_roles(&self.db_url, &self.migrator, &self.runtime).await {
            panic!("{e}");
        }
    }
}

impl Drop for Roles {
    fn drop(&mut self) {
        if self.dropped {
            return;
        }
        let (url, migrator, runtime) = (
            self.db_url.clone(),
            self.migrator.clone(),
            self.runtime.clone(),
        );
        // Drop may run inside a runtime (or while a test unwinds): a thread
        // and a runtime of its own, as for TestDb.
        let done = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map(|rt| rt.block_on(drop_roles(&url, &migrator, &runtime)))
        })
        .join();
        match done {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => eprintln!("warning: {e}"),
            _ => eprintln!(
                "warning: could not drop the roles {} and {}",
                self.migrator, self.runtime
            ),
        }
    }
}

async fn drop_roles(db_url: &str, migrator: &str, runtime: &str) -> Result<(), String> {
    let mut conn = PgConnection::connect(db_url)
        .await
        .map_err(|e| format!("cannot reach the test database: {e}"))?;
    // One DROP OWNED per role: naming both in one statement fails on the
    // default privileges one holds for the other ("could not find tuple for
    // default ACL").
    let sql = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename IN ('{migrator}', '{runtime}'); \
         DROP OWNED BY \"{migrator}\" CASCADE; \
         DROP OWNED BY \"{runtime}\" CASCADE; \
         DROP ROLE IF EXISTS \"{migrator}\", \"{runtime}\""
    );
    let dropped = sqlx::raw_sql(AssertSqlSafe(sql)).execute(&mut conn).await;
    let _ = conn.close().await;
    dropped
        .map(drop)
        .map_err(|e| format!("drop roles {migrator}, {runtime}: {e}"))
}

/// Commits one event of `aggregate` to `table`; its id.
async fn produce(db: &TestDb, table: &str, aggregate: &str) -> String {
    let id = Uuid::new_v4();
    let mut conn = db.pool.acquire().await.expect("producer connection");
    insert_row(
        &mut conn,
        table,
        id,
        aggregate,
        "test.event",
        &json!({ "n": 1 }),
        &json!({}),
    )
    .await;
    id.to_string()
}

#[tokio::test]
async fn outboxd_serves_with_no_migrate_under_the_documented_runtime_role() {
    // The README shows the file as it is, so the two cannot drift apart.
    assert!(
        README.contains(ROLES_SQL.trim_end()),
        "README.md quotes docs/database-roles.sql verbatim"
    );
    let db = TestDb::create().await;
    let mut roles = Roles::create(&db).await;
    let outboxes = [
        "default=public.outbox",
        "orders=public.orders_outbox:ordering=aggregate",
    ];

    // The DDL role migrates, and owns what it made.
    let migrator_url = roles.url(&roles.migrator);
    let mut migrate = vec!["migrate", "--database-url", &migrator_url];
    for outbox in &outboxes {
        migrate.extend(["--outbox", outbox]);
    }
    let output = run_outboxd(&migrate, &[]).await;
    assert!(
        output.status.success(),
        "outboxd migrate: {}",
        said(&output)
    );
    let owners: Vec<String> = sqlx::query_scalar(
        "SELECT DISTINCT tableowner::text FROM pg_tables WHERE schemaname = 'public' \
         AND tablename IN ('outbox', 'outbox_leases', 'orders_outbox', 'orders_outbox_leases')",
    )
    .fetch_all(&db.pool)
    .await
    .expect("table owners");
    assert_eq!(owners, [roles.migrator.clone()]);

    // The runtime role may not change the schema.
    let runtime_url = roles.url(&roles.runtime);
    let mut runtime = PgConnection::connect(&runtime_url)
        .await
        .expect("connect as the runtime role");
    for ddl in [
        "CREATE TABLE public.not_allowed (id int)",
        "TRUNCATE public.outbox_leases",
        "ALTER TABLE public.outbox ADD COLUMN not_allowed int",
    ] {
        let refused = sqlx::raw_sql(ddl).execute(&mut runtime).await;
        let code = refused
            .as_ref()
            .err()
            .and_then(|e| e.as_database_error())
            .and_then(|e| e.code())
            .map(|c| c.into_owned());
        assert_eq!(code.as_deref(), Some("42501"), "{ddl}: {refused:?}");
    }
    let _ = runtime.close().await;

    // The server, as the runtime role, without migrating; retention, gauges and
    // the watchdog run often enough to be seen.
    let mut app = TestApp::spawn_on(Arc::clone(&db), |args| {
        args.set("--database-url", runtime_url.as_str())
            .flag("--no-migrate")
            .set("--retention", "1s")
            .set("--retention-interval", "200ms")
            .set("--metrics-interval", "200ms")
            .set("--watchdog-interval", "200ms")
            .set("--admin-http-listen", "127.0.0.1:0");
        for outbox in &outboxes {
            args.add("--outbox", *outbox);
        }
    })
    .await
    .unwrap_or_else(|e| panic!("outboxd --no-migrate as the runtime role: {e:#}"));

    // Claim, extend (named and whole lease), ack, nack, dead-letter.
    let events = [
        produce(&db, "public.outbox", "a").await,
        produce(&db, "public.outbox", "b").await,
        produce(&db, "public.outbox", "c").await,
    ];
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&batch), events);
    let lease = batch.lease_id.clone();
    let extended = app.extend(&lease, &events[..1], secs(60)).await;
    assert!(extended.lease_expires_at.is_some(), "{extended:?}");
    let whole = app.extend(&lease, &[] as &[&str], secs(60)).await;
    assert!(whole.lease_expires_at.is_some(), "{whole:?}");
    assert_eq!(app.ack(&lease, &events[..1]).await, [OK]);
    assert_eq!(
        app.nack_retry(&lease, &events[1..2], Some(Duration::ZERO))
            .await,
        [OK]
    );
    let poison = NackRequest {
        lease_id: lease.clone(),
        message_ids: vec![events[2].clone()],
        error: "poison".into(),
        dead_letter: true,
        ..NackRequest::default()
    };
    assert_eq!(app.nack(poison).await, [DEAD_LETTERED]);
    let again = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&again), events[1..2]);
    assert_eq!(app.ack(&again.lease_id, &events[1..2]).await, [OK]);
    let stats = app.stats().await;
    assert_eq!((stats.pending, stats.dead_lettered), (0, 1), "{stats:?}");

    // The admin calls: list, inspect, redrive, discard.
    let listed = app
        .list_dead_letters(ListDeadLettersRequest::default())
        .await;
    let dead: Vec<_> = listed
        .dead_letters
        .iter()
        .filter_map(|d| d.message.as_ref().map(|m| m.id.clone()))
        .collect();
    assert_eq!(dead, events[2..]);
    let mut admin = app.admin().await;
    let inspected = within(
        secs(30),
        "InspectMessage",
        admin.inspect_message(InspectMessageRequest {
            outbox: String::new(),
            message_id: events[2].clone(),
        }),
    )
    .await
    .expect("InspectMessage")
    .into_inner();
    assert_eq!(inspected.last_error, "poison", "{inspected:?}");
    let listed = within(
        secs(30),
        "ListOutboxes",
        admin.list_outboxes(ListOutboxesRequest {}),
    )
    .await
    .expect("ListOutboxes")
    .into_inner();
    assert_eq!(listed.outboxes.len(), 2, "{listed:?}");
    let redrive = RedriveRequest {
        message_ids: vec![events[2].clone()],
        ..RedriveRequest::default()
    };
    assert_eq!(app.redrive(redrive).await, 1);
    let redriven = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&redriven), events[2..]);
    let poison = NackRequest {
        lease_id: redriven.lease_id.clone(),
        message_ids: vec![events[2].clone()],
        error: "poison again".into(),
        dead_letter: true,
        ..NackRequest::default()
    };
    assert_eq!(app.nack(poison).await, [DEAD_LETTERED]);
    assert_eq!(app.discard("", &events[2..]).await, 1);

    // Retention deletes the published rows and the discarded dead letter.
    wait_until(secs(20), "retention empties the table", async || {
        app.count("public.outbox", "true").await == 0
    })
    .await;

    // An ordered outbox: the commit-order guard reads the seq sequence, a
    // dead-lettered head blocks its aggregate, and a redrive of it locks the
    // lease table.
    let head = produce(&db, "public.orders_outbox", "order-1").await;
    let next = produce(&db, "public.orders_outbox", "order-1").await;
    let first = app.claim_from("orders", "w", 10, secs(30), secs(10)).await;
    assert_eq!(ids(&first), std::slice::from_ref(&head), "the head alone");
    let poison = NackRequest {
        outbox: "orders".into(),
        lease_id: first.lease_id.clone(),
        message_ids: vec![head.clone()],
        error: "poison".into(),
        dead_letter: true,
        ..NackRequest::default()
    };
    assert_eq!(app.nack(poison).await, [DEAD_LETTERED]);
    let blocked = app
        .list_blocked_keys(ListBlockedKeysRequest {
            outbox: "orders".into(),
            ..ListBlockedKeysRequest::default()
        })
        .await;
    assert_eq!(blocked.blocked_keys.len(), 1, "{blocked:?}");
    assert_eq!(blocked.blocked_keys[0].held, 1);
    assert_eq!(app.stats_of("orders").await.blocked_keys, 1);
    let redrive = RedriveRequest {
        outbox: "orders".into(),
        aggregate_id: "order-1".into(),
        ..RedriveRequest::default()
    };
    assert_eq!(app.redrive(redrive).await, 1);
    for expected in [head, next] {
        let batch = app.claim_from("orders", "w", 10, secs(30), secs(10)).await;
        assert_eq!(ids(&batch), std::slice::from_ref(&expected), "in order");
        assert_eq!(
            app.ack_in("orders", &batch.lease_id, &[expected]).await,
            [OK]
        );
    }

    // The gauges are sampled, and the status page shows both outboxes.
    wait_until(secs(20), "the gauges are sampled", async || {
        let body = app.scrape().await;
        ["default", "orders"]
            .iter()
            .all(|o| gauge(&body, "outbox_pending_messages", o).is_some())
    })
    .await;
    let page = http(
        app.status_addr.expect("--admin-http-listen was given"),
        Method::GET,
        "/",
        &[],
        None,
    )
    .await;
    assert_eq!(page.status, StatusCode::OK, "{}", page.body);
    assert!(page.body.contains("orders"), "{}", page.body);

    // The watchdog names another role's open transaction (pg_read_all_stats).
    let (mut holder, pid) = open_transaction(&db, "roles-test-holder").await;
    wait_until(secs(20), "the report names the holder", async || {
        app.database_report().await.is_some_and(|r| {
            r.transactions
                .iter()
                .any(|t| t.pid == pid && t.application_name == "roles-test-holder")
        })
    })
    .await;
    sqlx::raw_sql("COMMIT")
        .execute(&mut holder)
        .await
        .expect("end the transaction");

    app.stop(secs(10)).await.expect("a graceful stop");
    drop(app);
    roles.drop_now().await;
}
