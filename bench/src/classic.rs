//! The classic relay, exactly as the pattern describes it: one transaction
//! selects unpublished rows `FOR UPDATE SKIP LOCKED`, publishes each with
//! publisher confirms while holding the locks, marks them published, commits.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use lapin::Connection;
use sqlx::{Connection as _, PgConnection, Row as _, postgres::PgRow};
use tokio::time::Instant;

use crate::rabbit::{self, Msg};

const SELECT: &str = "SELECT id, aggregate_id::text AS aggregate_id, event_type, payload::text AS payload, created_at \
     FROM outbox WHERE published_at IS NULL ORDER BY created_at LIMIT $1 FOR UPDATE SKIP LOCKED";
pub const MARK: &str = "UPDATE outbox SET published_at = now() WHERE id = ANY($1)";

/// What the workers of one run share.
#[derive(Debug, Default)]
pub struct Shared {
    pub stop: AtomicBool,
    /// Statements sent, BEGIN and COMMIT included.
    pub statements: AtomicU64,
    pub batches: AtomicU64,
    pub published: AtomicU64,
    /// Time spent in each part of the batch cycle, summed over batches that
    /// carried messages: what one batch costs where, against outboxd's cycle.
    pub select_nanos: AtomicU64,
    pub publish_nanos: AtomicU64,
    pub mark_nanos: AtomicU64,
    pub sent_batches: AtomicU64,
}

impl Shared {
    /// Mean milliseconds per batch of SELECT (with BEGIN), publish with
    /// confirms, and UPDATE with COMMIT.
    pub fn cycle_ms(&self) -> Option<[f64; 3]> {
        let n = self.sent_batches.load(Ordering::Relaxed);
        (n > 0).then(|| {
            [&self.select_nanos, &self.publish_nanos, &self.mark_nanos]
                .map(|t| t.load(Ordering::Relaxed) as f64 / n as f64 / 1e6)
        })
    }
}

pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Stops the workers when dropped, so an error path never leaves them running.
#[derive(Debug)]
pub struct StopGuard(pub Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::Relaxed);
    }
}

#[derive(Debug, Clone)]
pub struct Settings {
    pub batch: u32,
    /// Sleep when a batch comes back short (the relay has caught up).
    pub poll: Duration,
    pub exchange: String,
    /// Hard stop, whatever happens.
    pub deadline: Instant,
}

/// A selected row's id, creation time and message, with the properties
/// outbox-relay gives it.
pub fn message(row: &PgRow) -> anyhow::Result<(uuid::Uuid, DateTime<Utc>, Msg)> {
    let id: uuid::Uuid = row.try_get("id")?;
    let created: DateTime<Utc> = row.try_get("created_at")?;
    let payload: String = row.try_get("payload")?;
    let msg = Msg {
        id: id.to_string(),
        aggregate_id: row.try_get("aggregate_id")?,
        event_type: row.try_get("event_type")?,
        payload: payload.into_bytes(),
        created_secs: u64::try_from(created.timestamp()).unwrap_or(0),
        sequence: 0,
    };
    Ok((id, created, msg))
}

/// One worker: its own database connection and its own confirm channel on the
/// shared AMQP connection (as outbox-relay's slots).
pub async fn worker(
    mut db: PgConnection,
    amqp: Arc<Connection>,
    s: Settings,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let ch = rabbit::confirm_channel(&amqp).await?;
    let limit = i64::from(s.batch);
    for _ in 0..100_000_000u64 {
        if shared.stop.load(Ordering::Relaxed) || Instant::now() >= s.deadline {
            break;
        }
        let began = Instant::now();
        let mut tx = db.begin().await.context("BEGIN")?;
        let rows = sqlx::query(SELECT)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .context("classic SELECT ... FOR UPDATE SKIP LOCKED")?;
        let mut batch = Vec::with_capacity(rows.len());
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let (id, _, msg) = message(row)?;
            batch.push(msg);
            ids.push(id);
        }
        if batch.is_empty() {
            tx.commit().await.context("COMMIT")?;
        } else {
            let publishing = Instant::now();
            rabbit::publish_confirmed(&ch, &s.exchange, &batch, Duration::from_secs(15)).await?;
            let marking = Instant::now();
            sqlx::query(MARK)
                .bind(&ids)
                .execute(&mut *tx)
                .await
                .context("classic UPDATE published_at")?;
            tx.commit().await.context("COMMIT")?;
            let done = Instant::now();
            for (total, d) in [
                (&shared.select_nanos, publishing - began),
                (&shared.publish_nanos, marking - publishing),
                (&shared.mark_nanos, done - marking),
            ] {
                total.fetch_add(nanos(d), Ordering::Relaxed);
            }
            shared.sent_batches.fetch_add(1, Ordering::Relaxed);
        }
        let statements = if batch.is_empty() { 3 } else { 4 };
        shared.statements.fetch_add(statements, Ordering::Relaxed);
        shared.batches.fetch_add(1, Ordering::Relaxed);
        shared
            .published
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        if batch.len() < s.batch as usize {
            tokio::time::sleep(s.poll).await;
        }
    }
    let _ = db.close().await;
    let _ = ch.close(200, "bye".into()).await;
    Ok(())
}
