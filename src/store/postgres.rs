//! `PgStore`: runs each outbox's statements on the shared pool.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::Arc,
    time::Duration,
};

use chrono::{DateTime, Utc};
use sqlx::{
    AssertSqlSafe, PgConnection, PgPool, Postgres, Row,
    pool::PoolConnection,
    postgres::{PgRow, types::Oid},
};
use uuid::Uuid;

use super::{AdoptMode, StoreError, adopt, statements::Statements};
use crate::{
    lease::{
        AckRequest, ClaimRequest, ClaimedBatch, ClaimedMessage, EndedLease, ExtendRequest, LeaseId,
        MessageId, MessageResult, NackRequest, RowState, Settle, Settled, Stats,
    },
    outbox::{OutboxSpec, TableRef},
};

const WATCH: &str = include_str!("queries/watch.sql");
const PROBE: &str = include_str!("queries/probe.sql");
const MARK_QUIET: &str = include_str!("queries/mark_quiet.sql");

/// One configured outbox with its prepared SQL.
#[derive(Debug)]
struct Outbox {
    spec: OutboxSpec,
    sql: Statements,
    /// The table's oid: the key of its quiet mark.
    relid: Oid,
    /// The sequence behind the table's seq column, when it can be probed.
    sequence: Option<Oid>,
}

/// The PostgreSQL store. Cheap to clone; all clones share one pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    outboxes: Arc<HashMap<String, Outbox>>,
    /// How long a statement may go unanswered (see `bounded`).
    deadline: Duration,
}

/// Time for PostgreSQL's own statement-timeout error to arrive before
/// outboxd stops waiting for it.
const STATEMENT_GRACE: Duration = Duration::from_secs(1);

impl PgStore {
    /// Adopts (or verifies) every configured table and builds its statements.
    pub async fn open(
        pool: PgPool,
        specs: &[OutboxSpec],
        mode: AdoptMode,
    ) -> Result<Self, StoreError> {
        let mut outboxes = HashMap::new();
        for spec in specs {
            adopt::adopt(&pool, &spec.table, mode).await?;
            let sql = Statements::new(&spec.table, spec.policy.retention.is_zero());
            let ids = sqlx::query(WATCH)
                .bind(spec.table.quoted())
                .fetch_one(&pool)
                .await?;
            outboxes.insert(
                spec.name.clone(),
                Outbox {
                    spec: spec.clone(),
                    sql,
                    relid: ids.try_get("relid")?,
                    sequence: ids.try_get("sequence")?,
                },
            );
        }
        Ok(Self {
            pool,
            outboxes: Arc::new(outboxes),
            deadline: Duration::from_secs(5) + STATEMENT_GRACE,
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The configured outboxes.
    pub fn specs(&self) -> impl Iterator<Item = &OutboxSpec> {
        self.outboxes.values().map(|o| &o.spec)
    }

    pub fn contains(&self, outbox: &str) -> bool {
        self.outboxes.contains_key(outbox)
    }

    /// Outbox names served by a table, for routing its notifications.
    pub fn outboxes_of(&self, table: &TableRef) -> Vec<String> {
        self.specs()
            .filter(|s| &s.table == table)
            .map(|s| s.name.clone())
            .collect()
    }

    fn outbox(&self, name: &str) -> Result<&Outbox, StoreError> {
        self.outboxes
            .get(name)
            .ok_or_else(|| StoreError::UnknownOutbox(name.to_owned()))
    }

    /// A pooled connection for one call's statements. Queries run on it rather
    /// than on the pool: the pool's executor wraps each query's row stream in a
    /// second stream of its own, which doubled the work per row returned (every
    /// row re-enters the caller's tracing span once per stream).
    ///
    /// An idle connection is taken at once: sqlx's acquire future is large
    /// enough (kilobytes) that building and moving one per statement showed in
    /// profiles. With `test_before_acquire` off, the two paths hand out the same
    /// connection; `try_acquire` never jumps the queue, since released permits
    /// go to waiters first. Only when none is idle does the call wait in line.
    /// A statement that has not answered within `--statement-timeout` and a
    /// grace is abandoned: PostgreSQL ends a slow one itself at the timeout,
    /// so this catches a link that stalled, where its answer cannot arrive.
    /// The caller's `StatementConn` then closes the connection.
    async fn bounded<T>(
        &self,
        statement: impl std::future::Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.deadline, statement).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer from the database within {}",
                humantime::format_duration(self.deadline)
            ))),
        }
    }

    /// Bounds every statement at `statement_timeout` plus a grace for the
    /// database's own timeout error to arrive.
    pub fn with_statement_timeout(mut self, statement_timeout: Duration) -> Self {
        self.deadline = statement_timeout + STATEMENT_GRACE;
        self
    }

    async fn conn(&self) -> Result<StatementConn, StoreError> {
        let conn = match self.pool.try_acquire() {
            Some(conn) => conn,
            None => Box::pin(self.pool.acquire()).await?,
        };
        Ok(StatementConn {
            conn,
            finished: false,
        })
    }

    /// Answers when the database does: the health check.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn().await?;
        sqlx::query("SELECT 1").execute(&mut *conn).await?;
        conn.finish();
        Ok(())
    }

    pub async fn claim(&self, req: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        let outbox = self.outbox(req.outbox.as_str())?;
        let lease_id = LeaseId::generate();
        let mut conn = self.conn().await?;
        let rows = self
            .bounded(
                sqlx::query(AssertSqlSafe(outbox.sql.claim.clone()))
                    .bind(i64::from(req.max_messages))
                    .bind(lease_id.as_uuid())
                    .bind(req.lease)
                    .bind(req.worker_id.as_str())
                    .bind(max_attempts(&outbox.spec))
                    .bind(i64::try_from(req.max_bytes).unwrap_or(i64::MAX))
                    .bind(i64::try_from(req.max_message_bytes).unwrap_or(i64::MAX))
                    .fetch_all(&mut *conn),
            )
            .await?;
        conn.finish();

        let mut batch = ClaimedBatch {
            lease_id,
            expires_at: None,
            messages: Vec::with_capacity(rows.len()),
            dead_lettered: Vec::new(),
            expired_leases: Vec::new(),
        };
        for row in rows {
            let id: Uuid = row.try_get("id")?;
            let dead: bool = row.try_get("dead_lettered")?;
            if let Some(prev) = row.try_get::<Option<Uuid>, _>("prev_lease_id")? {
                let attempts: i32 = row.try_get("attempts")?;
                // A row dead-lettered by this claim kept its count; a re-claimed
                // one was incremented past the expired delivery.
                let attempt = if dead { attempts } else { attempts - 1 };
                let headers: serde_json::Value = row.try_get("headers")?;
                let expired_at: Option<DateTime<Utc>> = row.try_get("prev_locked_until")?;
                batch.expired_leases.push(EndedLease {
                    message_id: id,
                    lease_id: Some(prev),
                    worker_id: row.try_get("prev_claimed_by")?,
                    claimed_at: row.try_get("prev_claimed_at")?,
                    ended_at: expired_at.unwrap_or_else(Utc::now),
                    created_at: row.try_get("created_at")?,
                    attempt: u32::try_from(attempt).unwrap_or(0),
                    traceparent: header(&headers, "traceparent"),
                    tracestate: header(&headers, "tracestate"),
                    dead_lettered: dead,
                });
            }
            if dead {
                batch.dead_lettered.push(id);
                continue;
            }
            batch.expires_at = row.try_get("locked_until")?;
            batch.messages.push(claimed_message(id, &row)?);
        }
        batch.messages.sort_by_key(|m| m.sequence);
        Ok(batch)
    }

    /// Settles the rows still held in one statement; only ids it did not
    /// settle (lease lost, already settled, unknown) cost a second statement,
    /// which locks and classifies them.
    pub async fn ack(&self, req: &AckRequest) -> Result<Settled, StoreError> {
        let outbox = self.outbox(req.outbox.as_str())?;
        let lease = req.lease_id.as_uuid();
        let ids = uuids(&req.message_ids);
        let mut conn = self.conn().await?;
        let mut rows = self
            .bounded(
                sqlx::query(AssertSqlSafe(outbox.sql.ack_held.clone()))
                    .bind(lease)
                    .bind(&ids)
                    .fetch_all(&mut *conn),
            )
            .await?;
        let settled = rows
            .iter()
            .map(|row| row.try_get::<Uuid, _>("id"))
            .collect::<Result<HashSet<_>, _>>()?;
        let mut rest: Vec<Uuid> = ids.into_iter().filter(|id| !settled.contains(id)).collect();
        rest.sort_unstable();
        rest.dedup();
        if !rest.is_empty() {
            rows.extend(
                self.bounded(
                    sqlx::query(AssertSqlSafe(outbox.sql.ack.clone()))
                        .bind(lease)
                        .bind(rest)
                        .fetch_all(&mut *conn),
                )
                .await?,
            );
        }
        conn.finish();
        settle_results(Settle::Ack, req.lease_id, &req.message_ids, &rows)
    }

    pub async fn nack(&self, req: &NackRequest) -> Result<Settled, StoreError> {
        let outbox = self.outbox(req.outbox.as_str())?;
        let policy = &outbox.spec.policy;
        let schedule = policy
            .backoff
            .schedule(policy.max_attempts, &mut rand::rng());
        let mut conn = self.conn().await?;
        let rows = self
            .bounded(
                sqlx::query(AssertSqlSafe(outbox.sql.nack.clone()))
                    .bind(req.lease_id.as_uuid())
                    .bind(uuids(&req.message_ids))
                    .bind(&req.error)
                    .bind(req.retry_after.map(|d| d.as_secs_f64()))
                    .bind(schedule)
                    .bind(req.dead_letter)
                    .bind(max_attempts(&outbox.spec))
                    .fetch_all(&mut *conn),
            )
            .await?;
        conn.finish();
        settle_results(Settle::Nack, req.lease_id, &req.message_ids, &rows)
    }

    pub async fn extend(&self, req: &ExtendRequest) -> Result<Settled, StoreError> {
        let outbox = self.outbox(req.outbox.as_str())?;
        let sql = if req.message_ids.is_empty() {
            &outbox.sql.extend_all
        } else {
            &outbox.sql.extend
        };
        let mut conn = self.conn().await?;
        let rows = self
            .bounded(
                sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(req.lease_id.as_uuid())
                    .bind(uuids(&req.message_ids))
                    .bind(req.lease)
                    .fetch_all(&mut *conn),
            )
            .await?;
        conn.finish();
        let mut settled = if req.message_ids.is_empty() {
            let held: Vec<MessageId> = rows
                .iter()
                .map(|r| r.try_get::<Uuid, _>("id").map(MessageId::from))
                .collect::<Result<_, _>>()?;
            settle_results(Settle::Extend, req.lease_id, &held, &rows)?
        } else {
            settle_results(Settle::Extend, req.lease_id, &req.message_ids, &rows)?
        };
        // Extending ends no lease.
        settled.ended.clear();
        // An expiry only when something was extended: a lost lease has none.
        let mut expires_at = None;
        for row in &rows {
            if row.try_get::<bool, _>("applied")? {
                expires_at = row.try_get("expires_at")?;
                break;
            }
        }
        settled.expires_at = expires_at;
        Ok(settled)
    }

    pub async fn stats(&self, outbox: &str) -> Result<Stats, StoreError> {
        let outbox = self.outbox(outbox)?;
        let mut conn = self.conn().await?;
        let row = self
            .bounded(sqlx::query(AssertSqlSafe(outbox.sql.stats.clone())).fetch_one(&mut *conn))
            .await?;
        conn.finish();
        stats_of(&row)
    }

    /// The gauges of an outbox: `stats` without counting retained history.
    pub async fn gauges(&self, outbox: &str) -> Result<Stats, StoreError> {
        let outbox = self.outbox(outbox)?;
        let mut conn = self.conn().await?;
        // A sample reads every pending row: under a backlog of millions it
        // outlasts an RPC's statement timeout, and it is no RPC.
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        sqlx::query("SET LOCAL statement_timeout = '60s'")
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query(AssertSqlSafe(outbox.sql.gauges.clone()))
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await?;
        conn.finish();
        stats_of(&row)
    }

    /// Whether the outbox table has a sequence the watcher can probe.
    pub fn has_sequence(&self, outbox: &str) -> bool {
        self.outbox(outbox).is_ok_and(|o| o.sequence.is_some())
    }

    /// The outbox table's sequence position: it moves with every insert.
    /// 0 for a table without a probeable sequence (see `has_sequence`).
    pub async fn sequence(&self, outbox: &str) -> Result<i64, StoreError> {
        let Some(sequence) = self.outbox(outbox)?.sequence else {
            return Ok(0);
        };
        let mut conn = self.conn().await?;
        let value = self
            .bounded(
                sqlx::query_scalar(PROBE)
                    .bind(sequence)
                    .fetch_one(&mut *conn),
            )
            .await?;
        conn.finish();
        Ok(value)
    }

    /// Asks the table's trigger not to NOTIFY for `period`, while this server
    /// probes the sequence itself.
    pub async fn mark_quiet(&self, outbox: &str, period: Duration) -> Result<(), StoreError> {
        let outbox = self.outbox(outbox)?;
        let mut conn = self.conn().await?;
        self.bounded(
            sqlx::query(MARK_QUIET)
                .bind(outbox.relid)
                .bind(period.as_secs_f64())
                .execute(&mut *conn),
        )
        .await?;
        conn.finish();
        Ok(())
    }

    /// Deletes up to `limit` published rows older than the outbox's retention.
    /// Returns how many went, so the caller keeps going while batches come back full.
    pub async fn purge_published(&self, outbox: &str, limit: i64) -> Result<u64, StoreError> {
        let outbox = self.outbox(outbox)?;
        let mut conn = self.conn().await?;
        let done = self
            .bounded(
                sqlx::query(AssertSqlSafe(outbox.sql.purge.clone()))
                    .bind(outbox.spec.policy.retention)
                    .bind(limit)
                    .execute(&mut *conn),
            )
            .await?;
        conn.finish();
        Ok(done.rows_affected())
    }
}

/// A pooled connection for one call's statements. Unless `finish` is called
/// after them, dropping it closes the connection instead of returning it to
/// the pool: when a caller stops waiting mid-statement (its RPC was cancelled
/// or passed its deadline), PostgreSQL then ends the statement at its next
/// client check (`client_connection_check_interval`) rather than running it
/// out, and no later call waits behind it. A statement that failed closes its
/// connection too, which costs a reconnect and nothing else.
struct StatementConn {
    conn: PoolConnection<Postgres>,
    finished: bool,
}

impl StatementConn {
    fn finish(mut self) {
        self.finished = true;
    }
}

impl std::ops::Deref for StatementConn {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.conn
    }
}

impl std::ops::DerefMut for StatementConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.conn
    }
}

impl Drop for StatementConn {
    fn drop(&mut self) {
        if !self.finished {
            self.conn.close_on_drop();
        }
    }
}

fn max_attempts(spec: &OutboxSpec) -> i32 {
    i32::try_from(spec.policy.max_attempts).unwrap_or(i32::MAX)
}

fn uuids(ids: &[MessageId]) -> Vec<Uuid> {
    ids.iter().map(MessageId::as_uuid).collect()
}

fn claimed_message(id: Uuid, row: &PgRow) -> Result<ClaimedMessage, StoreError> {
    let headers: serde_json::Value = row.try_get("headers")?;
    let attempts: i32 = row.try_get("attempts")?;
    Ok(ClaimedMessage {
        id,
        aggregate_id: row.try_get("aggregate_id")?,
        event_type: row.try_get("event_type")?,
        payload: row.try_get("payload")?,
        headers: header_map(id, headers),
        created_at: row.try_get::<DateTime<Utc>, _>("created_at")?,
        attempt: u32::try_from(attempts).unwrap_or(0),
        sequence: row.try_get("seq")?,
    })
}

fn stats_of(row: &PgRow) -> Result<Stats, StoreError> {
    let count = |name: &str| -> Result<u64, sqlx::Error> {
        Ok(u64::try_from(row.try_get::<i64, _>(name)?).unwrap_or(0))
    };
    let age = |name: &str| -> Result<Duration, sqlx::Error> {
        Ok(Duration::from_secs_f64(
            row.try_get::<f64, _>(name)?.max(0.0),
        ))
    };
    Ok(Stats {
        pending: count("pending")?,
        in_flight: count("in_flight")?,
        dead_lettered: count("dead_lettered")?,
        oldest_pending_age: age("oldest_pending_secs")?,
        oldest_lease_age: age("oldest_lease_secs")?,
        published_retained: count("published_retained")?,
    })
}

/// The lease a settle statement just ended on `id`.
///
/// The statement returns the two trace headers as text rather than the whole
/// `headers` document, which would be parsed as JSON for every settled row
/// only for lease spans to read those two values.
fn ended_lease(id: Uuid, lease_id: LeaseId, row: &PgRow) -> Result<EndedLease, StoreError> {
    let attempts: Option<i32> = row.try_get("attempts")?;
    let settled_at: DateTime<Utc> = row.try_get("settled_at")?;
    let created_at: Option<DateTime<Utc>> = row.try_get("created_at")?;
    Ok(EndedLease {
        message_id: id,
        lease_id: Some(lease_id.as_uuid()),
        worker_id: row.try_get("claimed_by")?,
        claimed_at: row.try_get("claimed_at")?,
        ended_at: settled_at,
        created_at: created_at.unwrap_or(settled_at),
        attempt: attempts.and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
        traceparent: row.try_get("traceparent")?,
        tracestate: row.try_get("tracestate")?,
        dead_lettered: row.try_get("dead_lettered_now")?,
    })
}

fn header(headers: &serde_json::Value, name: &str) -> Option<String> {
    headers.get(name)?.as_str().map(str::to_owned)
}

/// The row's `headers` object as strings. Producers may store any JSON there;
/// non-string values are passed on as their JSON text rather than dropped. A
/// document that is not an object (an array, a string, null) has no header
/// names to pass on: the event goes out without headers, and the log says so.
fn header_map(id: Uuid, headers: serde_json::Value) -> BTreeMap<String, String> {
    match headers {
        serde_json::Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        other => {
            let kind = match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Number(_) => "a number",
                _ => "a boolean",
            };
            tracing::warn!(
                event_id = %id,
                headers = kind,
                "event headers are not a JSON object; handing the event out without headers"
            );
            BTreeMap::new()
        }
    }
}

/// One result per requested id, in request order, from the rows the settle
/// statement returned (ids it did not return do not exist in the outbox).
fn settle_results(
    settle: Settle,
    lease_id: LeaseId,
    requested: &[MessageId],
    rows: &[PgRow],
) -> Result<Settled, StoreError> {
    let mut seen = HashMap::with_capacity(rows.len());
    let mut ended = Vec::new();
    for row in rows {
        let id: Uuid = row.try_get("id")?;
        let state = RowState {
            held: row.try_get("held")?,
            published: row.try_get("published")?,
            dead_lettered: row.try_get("dead_lettered")?,
        };
        let applied: bool = row.try_get("applied")?;
        let dead_now: bool = row.try_get("dead_lettered_now")?;
        seen.insert(id, (state, applied, dead_now));
        if applied {
            ended.push(ended_lease(id, lease_id, row)?);
        }
    }
    // A repeated id was settled once; every copy reports that one outcome.
    let results = requested
        .iter()
        .map(|id| {
            let (outcome, detail) = match seen.get(&id.as_uuid()) {
                Some(&(state, applied, dead_now)) => settle.outcome(Some(state), applied, dead_now),
                None => settle.outcome(None, false, false),
            };
            MessageResult {
                message_id: *id,
                outcome,
                detail: detail.to_owned(),
            }
        })
        .collect();
    Ok(Settled {
        results,
        expires_at: None,
        ended,
    })
}
