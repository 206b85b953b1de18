//! `PgOutbox`: one outbox's statements, run on the shared pool.

use std::{collections::HashSet, sync::Arc, time::Duration};

use sqlx::{AssertSqlSafe, PgPool, Row, postgres::types::Oid};
use uuid::Uuid;

use super::{
    cursor::ClaimCursor,
    guard::{CommitOrderGuard, GRACE, Probe},
    rows::{
        ClaimRows, blocked_key, claimed_batch, dead_letter, inspected, settle_results, stats_of,
    },
    session::{Session, StatementConn},
    statements::{Statements, leases_table},
};
use crate::{
    lease::{
        AckRequest, BlockedKey, ClaimRequest, ClaimedBatch, DeadLetter, ExtendRequest,
        InspectedMessage, LeaseId, MessageId, NackRequest, Page, PageRequest, RedriveSelector,
        Settle, Settled, Stats,
    },
    outbox::OutboxSpec,
    store::{AdminStore, Arrivals, OutboxStore, StoreError, Sweep},
};

const WATCH: &str = include_str!("queries/watch.sql");
const PROBE: &str = include_str!("queries/probe.sql");

/// How many times a claim looks when concurrent claims took every row it chose.
const CLAIM_LOOKS: u32 = 3;

/// What is fixed for an outbox once its table was checked.
#[derive(Debug)]
struct Prepared {
    spec: OutboxSpec,
    sql: Statements,
    /// The sequence behind the table's seq column, when it can be probed.
    sequence: Option<Oid>,
    /// Held by the claim statement running for this outbox: see `claim`.
    claiming: tokio::sync::Mutex<Claiming>,
}

/// What the claims of one outbox carry from one to the next.
#[derive(Debug, Default)]
struct Claiming {
    /// The commit-order guard: an ordered claim's bound, an unordered
    /// cursor's limit.
    guard: CommitOrderGuard,
    /// Where an unordered claim's walk starts (`cursor.rs`).
    cursor: ClaimCursor,
}

/// One PostgreSQL outbox. Cheap to clone; all clones share one pool.
#[derive(Debug, Clone)]
pub struct PgOutbox {
    prepared: Arc<Prepared>,
    session: Session,
}

impl PgOutbox {
    /// Builds the outbox's statements and resolves its table's ids. The table
    /// must have been adopted or verified.
    pub(super) async fn prepare(pool: &PgPool, spec: &OutboxSpec) -> Result<Self, StoreError> {
        let sql = Statements::new(&spec.table, spec.policy.retention.is_zero(), spec.ordering);
        let ids = sqlx::query(WATCH)
            .bind(spec.table.quoted())
            .fetch_one(pool)
            .await?;
        Ok(Self {
            prepared: Arc::new(Prepared {
                spec: spec.clone(),
                sql,
                sequence: ids.try_get("sequence")?,
                claiming: tokio::sync::Mutex::new(Claiming::default()),
            }),
            session: Session::new(pool.clone()),
        })
    }

    pub(super) fn set_statement_timeout(&mut self, statement_timeout: Duration) {
        self.session.set_statement_timeout(statement_timeout);
    }

    fn sql(&self) -> &Statements {
        &self.prepared.sql
    }

    /// Runs one settle statement (`$1` lease, `$2` ids, then `more`'s binds).
    async fn settle(
        &self,
        sql: &Arc<str>,
        lease_id: LeaseId,
        ids: Vec<Uuid>,
        more: impl FnOnce(SettleQuery) -> SettleQuery,
    ) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
        let query = sqlx::query(AssertSqlSafe(sql.clone()))
            .bind(lease_id.as_uuid())
            .bind(ids);
        self.fetch(more(query)).await
    }

    /// Runs a statement that returns one row of stats.
    async fn stats_row(&self, sql: &Arc<str>) -> Result<Stats, StoreError> {
        let mut conn = self.session.conn().await?;
        let row = self
            .session
            .bounded(sqlx::query(AssertSqlSafe(sql.clone())).fetch_one(&mut *conn))
            .await?;
        conn.finish();
        stats_of(&row)
    }

    /// Runs one query, its binds done, and returns its rows.
    async fn fetch(&self, query: SettleQuery) -> Result<Vec<sqlx::postgres::PgRow>, StoreError> {
        let mut conn = self.session.conn().await?;
        let rows = self.session.bounded(query.fetch_all(&mut *conn)).await?;
        conn.finish();
        Ok(rows)
    }

    /// Probes the commit-order guard (`guard.rs`): the `seq` up to which
    /// fresh events of an ordered outbox may be handed out now, and the
    /// furthest an unordered outbox's claim cursor may go.
    async fn guard_bound(
        &self,
        guard: &mut CommitOrderGuard,
        conn: &mut StatementConn,
    ) -> Result<i64, StoreError> {
        let Some(sequence) = self.prepared.sequence else {
            return Err(StoreError::Schema(format!(
                "table {}: the commit-order guard needs a probeable seq sequence",
                self.prepared.spec.table
            )));
        };
        let sent = tokio::time::Instant::now();
        let row = self
            .session
            .bounded(
                sqlx::query(AssertSqlSafe(self.sql().guard.clone()))
                    .bind(sequence)
                    .bind(Uuid::new_v4())
                    .fetch_one(&mut **conn),
            )
            .await?;
        let resets = guard.resets();
        let bound = guard.observe(Probe {
            last_value: row.try_get("last_value")?,
            xmin: row.try_get("xmin")?,
            xmax: row.try_get("xmax")?,
            oldest_start: row.try_get("oldest_start")?,
            read_at: row.try_get("read_at")?,
            epoch: row.try_get("epoch")?,
            sent,
            answered: tokio::time::Instant::now(),
        });
        if guard.resets() > resets {
            tracing::warn!(
                outbox = %self.prepared.spec.name,
                epoch = ?guard.epoch(),
                "the database lost its epoch (a crash or a failover): the commit-order guard and the claim cursor start over, and fresh ordered events wait for the transactions open now"
            );
        }
        Ok(bound)
    }

    fn max_attempts(&self) -> i32 {
        i32::try_from(self.prepared.spec.policy.max_attempts).unwrap_or(i32::MAX)
    }
}

type SettleQuery = sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>;

impl OutboxStore for PgOutbox {
    fn spec(&self) -> &OutboxSpec {
        &self.prepared.spec
    }

    /// One autocommit statement, which writes no WAL unless it dead-letters.
    ///
    /// Claims running at the same moment read the same first rows (no row is
    /// locked while they are chosen), and all but one find them taken: in a
    /// drain with four relay slots a third of the statements were such empty
    /// looks. So this server runs one claim statement per outbox at a time (a
    /// claim takes a millisecond or two; the acks carried with it run beside
    /// it). Claims of other replicas can still collide with it: a claim that
    /// got nothing for that reason looks again, on a snapshot that sees the
    /// other claim's leases, rather than answer "nothing to claim" with a
    /// backlog waiting. The wait for that turn counts against the call's
    /// bound ([`Session::call`]): behind a claim the database does not answer,
    /// the ones queued give up with it instead of one timeout after another.
    async fn claim(&self, req: &ClaimRequest) -> Result<ClaimedBatch, StoreError> {
        self.session
            .call(async {
                let lease_id = LeaseId::generate();
                let ordered = self.prepared.spec.ordering.is_ordered();
                // A table whose seq no sequence feeds has no guard: its
                // unordered claims walk from the start.
                let cursor_kept = !ordered && self.prepared.sequence.is_some();
                let mut state = self.prepared.claiming.lock().await;
                let Claiming { guard, cursor } = &mut *state;
                let mut conn = self.session.conn().await?;
                let mut looks = 0;
                let mut waited_for_guard = false;
                let batch = loop {
                    looks += 1;
                    let bound = if ordered {
                        self.guard_bound(guard, &mut conn).await?
                    } else {
                        if cursor_kept && cursor.wants_probe(tokio::time::Instant::now()) {
                            self.guard_bound(guard, &mut conn).await?;
                            cursor.probed(guard.epoch(), tokio::time::Instant::now());
                        }
                        i64::MAX
                    };
                    let (from, epoch) = if cursor_kept {
                        cursor.position()
                    } else {
                        (0, Uuid::nil())
                    };
                    let query = sqlx::query(AssertSqlSafe(self.sql().claim.clone()))
                        .bind(i64::from(req.max_messages))
                        .bind(lease_id.as_uuid())
                        .bind(req.lease)
                        .bind(req.worker_id.as_str())
                        .bind(self.max_attempts())
                        .bind(i64::try_from(req.max_bytes).unwrap_or(i64::MAX))
                        .bind(i64::try_from(req.max_message_bytes).unwrap_or(i64::MAX))
                        .bind(
                            i64::try_from(req.max_event_bytes.min(req.max_message_bytes))
                                .unwrap_or(i64::MAX),
                        )
                        .bind(bound)
                        .bind(from)
                        .bind(epoch);
                    let rows = self.session.bounded(query.fetch_all(&mut *conn)).await?;
                    let ClaimRows {
                        batch,
                        lost,
                        delayed,
                        walk,
                    } = claimed_batch(lease_id, rows)?;
                    if cursor_kept {
                        cursor.walked(walk, guard.safe());
                    }
                    let nothing = batch.messages.is_empty() && batch.dead_lettered.is_empty();
                    if nothing && ordered && !waited_for_guard && guard.behind() {
                        // Events the guard could not vouch for yet may be all there
                        // is (just inserted, or the first claim since start): one
                        // grace later it can, unless a transaction is still open.
                        waited_for_guard = true;
                        tokio::time::sleep(GRACE).await;
                        continue;
                    }
                    // Rows lost to another claim, or not due yet, took the
                    // batch's room; the cursor has moved past them.
                    if !(nothing && lost + delayed > 0 && looks < CLAIM_LOOKS) {
                        break batch;
                    }
                };
                conn.finish();
                Ok(batch)
            })
            .await
    }

    /// Settles the rows still held in one statement; only ids it did not
    /// settle (lease lost, already settled, unknown) cost a second statement,
    /// which locks and classifies them.
    async fn ack(&self, req: &AckRequest) -> Result<Settled, StoreError> {
        self.session
            .call(async {
                let lease = req.lease_id.as_uuid();
                let ids = uuids(&req.message_ids);
                let mut conn = self.session.conn().await?;
                let mut rows = self
                    .session
                    .bounded(
                        sqlx::query(AssertSqlSafe(self.sql().ack_held.clone()))
                            .bind(lease)
                            .bind(&ids)
                            .fetch_all(&mut *conn),
                    )
                    .await?;
                let settled = rows
                    .iter()
                    .map(|row| row.try_get::<Uuid, _>("id"))
                    .collect::<Result<HashSet<_>, _>>()?;
                let mut rest: Vec<Uuid> =
                    ids.into_iter().filter(|id| !settled.contains(id)).collect();
                rest.sort_unstable();
                rest.dedup();
                if !rest.is_empty() {
                    rows.extend(
                        self.session
                            .bounded(
                                sqlx::query(AssertSqlSafe(self.sql().ack.clone()))
                                    .bind(lease)
                                    .bind(rest)
                                    .fetch_all(&mut *conn),
                            )
                            .await?,
                    );
                }
                conn.finish();
                settle_results(Settle::Ack, req.lease_id, &req.message_ids, &rows)
            })
            .await
    }

    async fn nack(&self, req: &NackRequest) -> Result<Settled, StoreError> {
        self.session
            .call(async {
                let policy = &self.prepared.spec.policy;
                let schedule = policy
                    .backoff
                    .schedule(policy.max_attempts, &mut rand::rng());
                let max_attempts = self.max_attempts();
                let rows = self
                    .settle(
                        &self.sql().nack,
                        req.lease_id,
                        uuids(&req.message_ids),
                        |query| {
                            query
                                .bind(&req.error)
                                .bind(req.retry_after.map(|d| d.as_secs_f64()))
                                .bind(schedule)
                                .bind(req.dead_letter)
                                .bind(max_attempts)
                        },
                    )
                    .await?;
                settle_results(Settle::Nack, req.lease_id, &req.message_ids, &rows)
            })
            .await
    }

    async fn extend(&self, req: &ExtendRequest) -> Result<Settled, StoreError> {
        self.session
            .call(async {
                let sql = if req.message_ids.is_empty() {
                    &self.sql().extend_all
                } else {
                    &self.sql().extend
                };
                let rows = self
                    .settle(sql, req.lease_id, uuids(&req.message_ids), |query| {
                        query.bind(req.lease)
                    })
                    .await?;
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
            })
            .await
    }

    async fn stats(&self) -> Result<Stats, StoreError> {
        self.session
            .call(async { self.stats_row(&self.sql().stats).await })
            .await
    }

    async fn gauges(&self) -> Result<Stats, StoreError> {
        let mut conn = self.session.conn().await?;
        let row = fetch_background(
            &mut conn,
            sqlx::query(AssertSqlSafe(self.sql().gauges.clone())),
        )
        .await?;
        let mut stats = stats_of(&row)?;
        if self.prepared.sequence.is_some() {
            // Probed here too, so the gauge moves on when no claim runs.
            let mut state = self.prepared.claiming.lock().await;
            let Claiming { guard, cursor } = &mut *state;
            self.guard_bound(guard, &mut conn).await?;
            cursor.probed(guard.epoch(), tokio::time::Instant::now());
            stats.commit_order_holdback = guard.holdback(tokio::time::Instant::now());
            stats.claim_cursor = cursor.at();
        }
        conn.finish();
        Ok(stats)
    }

    /// Runs beside claims, on the cursor this replica holds now: rows below
    /// it are covered for good (only a fault uncovers one), so a claim moving
    /// it meanwhile changes nothing the sweep reads.
    async fn sweep(&self) -> Result<Sweep, StoreError> {
        let (cursor, epoch) = self.prepared.claiming.lock().await.cursor.position();
        let mut conn = self.session.conn().await?;
        let row = fetch_background(
            &mut conn,
            sqlx::query(AssertSqlSafe(self.sql().sweep.clone()))
                .bind(cursor)
                .bind(epoch),
        )
        .await?;
        conn.finish();
        Ok(Sweep {
            cursor,
            found: row.try_get("found")?,
            orphans: u64::try_from(row.try_get::<i64, _>("orphans")?).unwrap_or(0),
        })
    }

    async fn purge_published(&self, limit: u32) -> Result<u64, StoreError> {
        let mut conn = self.session.conn().await?;
        let done = self
            .session
            .bounded(
                sqlx::query(AssertSqlSafe(self.sql().purge.clone()))
                    .bind(self.prepared.spec.policy.retention)
                    .bind(i64::from(limit))
                    .execute(&mut *conn),
            )
            .await?;
        conn.finish();
        Ok(done.rows_affected())
    }
}

impl AdminStore for PgOutbox {
    async fn dead_letters(
        &self,
        aggregate_id: Option<&str>,
        page: PageRequest,
    ) -> Result<Page<DeadLetter>, StoreError> {
        self.session
            .call(async {
                let query = sqlx::query(AssertSqlSafe(self.sql().dead_letters.clone()))
                    .bind(page.after.unwrap_or(i64::MIN))
                    .bind(aggregate_id.map(str::to_owned))
                    .bind(i64::from(page.size) + 1);
                let items = self
                    .fetch(query)
                    .await?
                    .iter()
                    .map(dead_letter)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(paged(items, page.size, |d| d.message.sequence))
            })
            .await
    }

    async fn blocked_keys(&self, page: PageRequest) -> Result<Page<BlockedKey>, StoreError> {
        self.session
            .call(async {
                let Some(sql) = &self.sql().blocked_keys else {
                    return Ok(Page {
                        items: Vec::new(),
                        next: None,
                    });
                };
                let query = sqlx::query(AssertSqlSafe(sql.clone()))
                    .bind(page.after.unwrap_or(i64::MIN))
                    .bind(i64::from(page.size) + 1);
                let items = self
                    .fetch(query)
                    .await?
                    .iter()
                    .map(blocked_key)
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(paged(items, page.size, |k| k.sequence))
            })
            .await
    }

    /// On an ordered outbox, a redriven head must not go out beside a later
    /// event of its aggregate that another replica's claim is leasing at this
    /// moment (it saw the head still dead-lettered). The lease table is
    /// locked against writers for the redrive's short transaction: claims
    /// running now finish first, so the redrive's commit happens after their
    /// leases are visible, and claims starting later see the redriven head.
    async fn redrive(&self, selector: &RedriveSelector) -> Result<u64, StoreError> {
        self.session
            .call(async {
                let sql = self.sql();
                let query = match selector {
                    RedriveSelector::Ids(ids) => {
                        sqlx::query(AssertSqlSafe(sql.redrive_ids.clone())).bind(uuids(ids))
                    }
                    RedriveSelector::Aggregate(aggregate) => {
                        sqlx::query(AssertSqlSafe(sql.redrive_aggregate.clone()))
                            .bind(aggregate.clone())
                    }
                    RedriveSelector::All => sqlx::query(AssertSqlSafe(sql.redrive_all.clone())),
                };
                let mut conn = self.session.conn().await?;
                let mut tx = self.session.durable(&mut conn).await?;
                if self.prepared.spec.ordering.is_ordered() {
                    self.session
                        .bounded(
                            sqlx::query(AssertSqlSafe(format!(
                                "LOCK TABLE {} IN SHARE MODE",
                                leases_table(&self.prepared.spec.table)
                            )))
                            .execute(&mut *tx),
                        )
                        .await?;
                }
                let done = self.session.bounded(query.execute(&mut *tx)).await?;
                self.session.bounded(tx.commit()).await?;
                conn.finish();
                Ok(done.rows_affected())
            })
            .await
    }

    async fn discard(&self, ids: &[MessageId]) -> Result<u64, StoreError> {
        self.session
            .call(async {
                let mut conn = self.session.conn().await?;
                let mut tx = self.session.durable(&mut conn).await?;
                let done = self
                    .session
                    .bounded(
                        sqlx::query(AssertSqlSafe(self.sql().discard.clone()))
                            .bind(uuids(ids))
                            .execute(&mut *tx),
                    )
                    .await?;
                self.session.bounded(tx.commit()).await?;
                conn.finish();
                Ok(done.rows_affected())
            })
            .await
    }

    async fn inspect(&self, id: MessageId) -> Result<Option<InspectedMessage>, StoreError> {
        self.session
            .call(async {
                let query =
                    sqlx::query(AssertSqlSafe(self.sql().inspect.clone())).bind(id.as_uuid());
                let rows = self.fetch(query).await?;
                rows.first().map(inspected).transpose()
            })
            .await
    }
}

/// A page from `size + 1` rows read: the extra one only says a next page exists.
fn paged<T>(mut items: Vec<T>, size: u32, position: impl Fn(&T) -> i64) -> Page<T> {
    let size = size as usize;
    let next = if items.len() > size {
        items.truncate(size);
        items.last().map(&position)
    } else {
        None
    };
    Page { items, next }
}

impl Arrivals for PgOutbox {
    fn probeable(&self) -> bool {
        self.prepared.sequence.is_some()
    }

    /// The last value of the table's seq sequence; 0 for a table without a
    /// probeable one.
    async fn sequence(&self) -> Result<i64, StoreError> {
        let Some(sequence) = self.prepared.sequence else {
            return Ok(0);
        };
        let mut conn = self.session.conn().await?;
        let value = self
            .session
            .bounded(
                sqlx::query_scalar(PROBE)
                    .bind(sequence)
                    .fetch_one(&mut *conn),
            )
            .await?;
        conn.finish();
        Ok(value)
    }
}

/// Runs one background statement (the gauges' sample, the sweep), which may
/// read every pending row: under a backlog of millions it outlasts an RPC's
/// statement timeout, and it is no RPC, so it gets a minute of its own.
async fn fetch_background(
    conn: &mut StatementConn,
    query: SettleQuery,
) -> Result<sqlx::postgres::PgRow, StoreError> {
    let mut tx = sqlx::Connection::begin(&mut **conn).await?;
    sqlx::query("SET LOCAL statement_timeout = '60s'")
        .execute(&mut *tx)
        .await?;
    let row = query.fetch_one(&mut *tx).await?;
    tx.commit().await?;
    Ok(row)
}

fn uuids(ids: &[MessageId]) -> Vec<Uuid> {
    ids.iter().map(MessageId::as_uuid).collect()
}
