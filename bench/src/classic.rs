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
use lapin::{Channel, Connection};
use sqlx::{Connection as _, PgConnection, Row as _, postgres::PgRow};
use tokio::{task::JoinHandle, time::Instant};

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

impl Shared {
    /// Whether a worker may take another batch: not told to stop, and before
    /// the deadline.
    pub fn going(&self, s: &Settings) -> bool {
        !self.stop.load(Ordering::Relaxed) && Instant::now() < s.deadline
    }

    /// Counts a batch of `published` messages.
    pub fn count_batch(&self, published: usize) {
        self.batches.fetch_add(1, Ordering::Relaxed);
        self.published
            .fetch_add(published as u64, Ordering::Relaxed);
    }

    /// Counts a batch that carried `published` messages, with the time its
    /// select, publish and mark took.
    pub fn count_sent(&self, published: usize, [select, publish, mark]: [Duration; 3]) {
        for (total, d) in [
            (&self.select_nanos, select),
            (&self.publish_nanos, publish),
            (&self.mark_nanos, mark),
        ] {
            total.fetch_add(nanos(d), Ordering::Relaxed);
        }
        self.sent_batches.fetch_add(1, Ordering::Relaxed);
        self.count_batch(published);
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

/// What one worker of any design holds: its own database connection, its own
/// confirm channel on the shared AMQP connection (as outbox-relay's slots),
/// the run's settings and what the workers share.
pub struct Worker {
    db: PgConnection,
    ch: Channel,
    s: Settings,
    shared: Arc<Shared>,
}

impl Worker {
    /// Runs the worker `run` on a task of its own, which first opens the
    /// worker's confirm channel.
    pub fn spawn<F, Fut>(
        db: PgConnection,
        amqp: Arc<Connection>,
        s: Settings,
        shared: Arc<Shared>,
        run: F,
    ) -> JoinHandle<anyhow::Result<()>>
    where
        F: FnOnce(Self) -> Fut + Send + 'static,
        Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
    {
        tokio::spawn(async move {
            let ch = rabbit::confirm_channel(&amqp).await?;
            run(Self { db, ch, s, shared }).await
        })
    }

    /// The connection, channel, settings and shared counters, to use apart.
    pub fn into_parts(self) -> (PgConnection, Channel, Settings, Arc<Shared>) {
        (self.db, self.ch, self.s, self.shared)
    }
}

/// Publishes a batch with confirms; returns how long that took.
pub async fn publish(ch: &Channel, s: &Settings, msgs: &[Msg]) -> anyhow::Result<Duration> {
    let began = Instant::now();
    rabbit::publish_confirmed(ch, &s.exchange, msgs, Duration::from_secs(15)).await?;
    Ok(began.elapsed())
}

/// Closes a worker's database connection and channel.
pub async fn close(db: PgConnection, ch: &Channel) {
    let _ = db.close().await;
    let _ = ch.close(200, "bye".into()).await;
}

/// One classic worker, the whole batch in one transaction.
pub async fn worker(w: Worker) -> anyhow::Result<()> {
    let (mut db, ch, s, shared) = w.into_parts();
    let limit = i64::from(s.batch);
    for _ in 0..100_000_000u64 {
        if !shared.going(&s) {
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
            shared.count_batch(0);
        } else {
            let selected = began.elapsed();
            let published = publish(&ch, &s, &batch).await?;
            let marking = Instant::now();
            sqlx::query(MARK)
                .bind(&ids)
                .execute(&mut *tx)
                .await
                .context("classic UPDATE published_at")?;
            tx.commit().await.context("COMMIT")?;
            shared.count_sent(batch.len(), [selected, published, marking.elapsed()]);
        }
        let statements = if batch.is_empty() { 3 } else { 4 };
        shared.statements.fetch_add(statements, Ordering::Relaxed);
        if batch.len() < s.batch as usize {
            tokio::time::sleep(s.poll).await;
        }
    }
    close(db, &ch).await;
    Ok(())
}

/// One classic worker without a broker (issue #48's claim-drain): select,
/// mark published, commit, as fast as the database lets it, so the drain
/// measures the database's share of the pattern alone. Stops at the first
/// empty batch: every row left is then locked by another worker, which marks
/// it.
pub async fn drain_no_broker(
    mut db: PgConnection,
    batch: u32,
    deadline: Instant,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let limit = i64::from(batch);
    for _ in 0..100_000_000u64 {
        if shared.stop.load(Ordering::Relaxed) || Instant::now() >= deadline {
            break;
        }
        let began = Instant::now();
        let mut tx = db.begin().await.context("BEGIN")?;
        let rows = sqlx::query(SELECT)
            .bind(limit)
            .fetch_all(&mut *tx)
            .await
            .context("classic SELECT ... FOR UPDATE SKIP LOCKED")?;
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            // Read as the relay reads them, payload and all.
            let (id, _, _) = message(row)?;
            ids.push(id);
        }
        if ids.is_empty() {
            tx.commit().await.context("COMMIT")?;
            shared.statements.fetch_add(3, Ordering::Relaxed);
            shared.count_batch(0);
            break;
        }
        let selected = began.elapsed();
        let marking = Instant::now();
        sqlx::query(MARK)
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .context("classic UPDATE published_at")?;
        tx.commit().await.context("COMMIT")?;
        shared.statements.fetch_add(4, Ordering::Relaxed);
        shared.count_sent(ids.len(), [selected, Duration::ZERO, marking.elapsed()]);
    }
    let _ = db.close().await;
    Ok(())
}
