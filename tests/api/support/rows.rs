//! The producer's side (plain SQL inserts, one transaction per call) and the
//! outbox tables' state, read directly from the test database.

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool};
use uuid::Uuid;

use super::{TestApp, TestDb};

impl TestApp {
    // ---- producer side ----

    /// Commits `n` events to the default outbox table in one transaction.
    pub async fn insert(&self, n: usize) -> Vec<Uuid> {
        self.insert_into("public.outbox", n).await
    }

    /// Commits `n` events to `table` in one transaction; ids in insertion order.
    pub async fn insert_into(&self, table: &str, n: usize) -> Vec<Uuid> {
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
        let mut tx = self
            .pool()
            .begin()
            .await
            .expect("begin producer transaction");
        for (i, id) in ids.iter().enumerate() {
            let payload = json!({ "n": i });
            insert_row(
                &mut tx,
                table,
                *id,
                &format!("agg-{i}"),
                "test.event",
                &payload,
                &json!({}),
            )
            .await;
        }
        tx.commit().await.expect("commit producer transaction");
        ids
    }

    /// Commits one event with every producer column chosen by the test.
    pub async fn insert_event(
        &self,
        id: Uuid,
        aggregate: &str,
        event_type: &str,
        payload: Value,
        headers: Value,
    ) {
        let mut conn = self.pool().acquire().await.expect("producer connection");
        insert_row(
            &mut conn,
            "public.outbox",
            id,
            aggregate,
            event_type,
            &payload,
            &headers,
        )
        .await;
    }

    // ---- table state ----

    /// The service columns of one row of the default outbox, its lease (from
    /// the lease table) folded in as the service sees it.
    pub async fn row(&self, id: &str) -> Row {
        self.row_in("public.outbox", id)
            .await
            .unwrap_or_else(|| panic!("row {id} is not in public.outbox"))
    }

    pub async fn row_in(&self, table: &str, id: &str) -> Option<Row> {
        let id = Uuid::parse_str(id).expect("row ids are UUIDs");
        let sql = format!(
            "SELECT o.created_at, coalesce(l.attempts, o.attempts) AS attempts, \
                    coalesce(l.lease_id, o.lease_id) AS lease_id, \
                    coalesce(l.claimed_by, o.claimed_by) AS claimed_by, \
                    coalesce(l.claimed_at, o.claimed_at) AS claimed_at, \
                    o.published_at, o.dead_lettered_at, o.last_error, o.available_at, \
                    l.locked_until, \
                    extract(epoch FROM l.locked_until - now())::float8 AS lease_left, \
                    o.attempts AS row_attempts \
             FROM {table} AS o LEFT JOIN {table}_leases AS l ON l.id = o.id AND NOT l.delayed \
             WHERE o.id = $1"
        );
        sqlx::query_as::<_, Row>(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .expect("read an outbox row")
    }

    /// Every row of `table` and of its lease table with every column, as
    /// text: equal snapshots mean nothing changed.
    pub async fn snapshot(&self, table: &str) -> String {
        let sql = format!(
            "SELECT (SELECT coalesce(jsonb_agg(to_jsonb(o) ORDER BY o.seq), '[]') FROM {table} AS o)::text \
                    || (SELECT coalesce(jsonb_agg(to_jsonb(l) ORDER BY l.id), '[]') FROM {table}_leases AS l)::text"
        );
        sqlx::query_scalar::<_, String>(AssertSqlSafe(sql))
            .fetch_one(self.pool())
            .await
            .expect("snapshot an outbox table")
    }

    pub async fn count(&self, table: &str, filter: &str) -> i64 {
        self.db
            .scalar_i64(&format!("SELECT count(*) FROM {table} WHERE {filter}"))
            .await
    }

    /// The database clock, the only clock leases and retries are measured by.
    pub async fn db_now(&self) -> DateTime<Utc> {
        sqlx::query_scalar::<_, DateTime<Utc>>("SELECT now()")
            .fetch_one(self.pool())
            .await
            .expect("read the database clock")
    }

    /// Counts INSERT statements into `table`'s lease table from now on (every
    /// claim runs one, and a statement-level trigger fires even when no row is
    /// inserted), so a test can see how often the server ran a claim: an empty
    /// claim leases nothing but still counts. A claim joins the wake-up queue
    /// before it looks, so once its look is counted it is waiting.
    pub async fn count_claims(&self, table: &str) -> ClaimCounter {
        let suffix = table.replace('.', "_");
        let sequence = format!("test_updates_{suffix}");
        self.db
            .execute(&format!(
                "CREATE SEQUENCE {sequence} MINVALUE 0 START 0;
                 CREATE OR REPLACE FUNCTION test_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN
                     -- Claims only: the claim sweep and redrives insert delay rows too.
                     IF current_query() LIKE '%SKIP LOCKED%' THEN
                         PERFORM nextval(TG_ARGV[0]::regclass);
                     END IF;
                     RETURN NULL;
                 END $$;
                 CREATE TRIGGER test_count_claims AFTER INSERT ON {table}_leases
                     FOR EACH STATEMENT EXECUTE FUNCTION test_count_update('{sequence}');"
            ))
            .await;
        ClaimCounter {
            pool: self.pool().clone(),
            sequence,
        }
    }
}

/// See [`TestApp::count_claims`].
#[derive(Debug)]
pub struct ClaimCounter {
    pool: PgPool,
    sequence: String,
}

impl ClaimCounter {
    /// Claim statements run on the table so far (sequences are not
    /// transactional, so statements still in flight count too).
    pub async fn get(&self) -> i64 {
        let sql = format!(
            "SELECT CASE WHEN is_called THEN last_value + 1 ELSE 0 END FROM {}",
            self.sequence
        );
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("read the update counter")
    }
}

/// The service columns of an outbox row, and the lease left by the database clock.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Row {
    pub created_at: DateTime<Utc>,
    pub attempts: i32,
    pub lease_id: Option<Uuid>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub published_at: Option<DateTime<Utc>>,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub available_at: DateTime<Utc>,
    pub locked_until: Option<DateTime<Utc>>,
    /// Seconds until the lease expires (negative: expired; `None`: no lease).
    pub lease_left: Option<f64>,
    /// The count of attempts the outbox row itself holds: written when a lease
    /// ends (ack, nack, dead-lettering), not by a claim.
    pub row_attempts: i32,
}

/// A plain event into `public.outbox` on `conn`, in whatever transaction
/// the caller holds open there (to commit later, or roll back).
pub async fn insert_plain(conn: &mut PgConnection, id: Uuid) {
    let (empty, no_headers) = (json!({}), json!({}));
    insert_row(conn, "outbox", id, "agg", "test.event", &empty, &no_headers).await;
}

pub async fn insert_row(
    conn: &mut PgConnection,
    table: &str,
    id: Uuid,
    aggregate: &str,
    event_type: &str,
    payload: &Value,
    headers: &Value,
) {
    let sql = format!(
        "INSERT INTO {table} (id, aggregate_id, event_type, payload, headers) VALUES ($1, $2, $3, $4, $5)"
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .bind(aggregate)
        .bind(event_type)
        .bind(payload)
        .bind(headers)
        .execute(conn)
        .await
        .expect("producer insert");
}

/// A connection of the test's own that holds a transaction with an id open,
/// in the test's database, under `application_name`; returns it and its pid.
pub async fn open_transaction(db: &TestDb, application_name: &str) -> (PgConnection, i32) {
    let mut conn = PgConnection::connect(&db.url())
        .await
        .expect("connect to the test database");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET application_name = '{application_name}'"
    )))
    .execute(&mut conn)
    .await
    .expect("set application_name");
    sqlx::raw_sql("BEGIN; SELECT txid_current()")
        .execute(&mut conn)
        .await
        .expect("open a transaction with an id");
    let pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut conn)
        .await
        .expect("the holder's pid");
    (conn, pid)
}
