//! The bare relay: the least any relay does per event, and nothing else. It
//! reads each row once, publishes it with confirms and marks it published,
//! with no lock, no lease and no transaction around the publish; one task reads
//! ahead in delivery order, and each worker marks a batch beside the publish of
//! its next one. It is not safe to run: nothing stops a second copy from
//! publishing the same rows, and nothing tells a restart which rows were
//! published but not yet marked. It is a yardstick for the drain: a relay that
//! reads and marks every row, with one batch per worker in flight, does at
//! least this much database work and waits at least this long, so how much of
//! the bare relay's rate a design keeps is what its own safety costs it. Not a
//! strict bound on this machine: its statements run beside the publishes and
//! take their CPU from the broker there.

use std::{
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use sqlx::{Connection as _, PgConnection};
use tokio::{
    sync::{Mutex, mpsc},
    time::Instant,
};

use crate::{
    classic::{self, Settings, Shared, Worker},
    rabbit::Msg,
};

/// Keyset read in delivery order, from the classic table's pending index:
/// rows after the last one read, ties on `created_at` broken by id.
const READ: &str = "SELECT id, aggregate_id::text AS aggregate_id, event_type, payload::text AS payload, created_at \
     FROM outbox \
     WHERE published_at IS NULL AND created_at >= $1 AND (created_at > $1 OR id > $2) \
     ORDER BY created_at, id LIMIT $3";

/// A batch as read: the ids to mark and the messages to publish.
type Batch = (Vec<uuid::Uuid>, Vec<Msg>);

/// Reads the backlog in batches and hands them to the workers, at most one
/// batch per worker ahead of them. Returns when a read comes back empty.
pub async fn reader(
    mut db: PgConnection,
    tx: mpsc::Sender<Batch>,
    s: Settings,
    shared: Arc<Shared>,
) -> anyhow::Result<()> {
    let mut after = (DateTime::<Utc>::UNIX_EPOCH, uuid::Uuid::nil());
    let limit = i64::from(s.batch);
    for _ in 0..100_000_000u64 {
        if !shared.going(&s) {
            break;
        }
        let began = Instant::now();
        let rows = sqlx::query(READ)
            .bind(after.0)
            .bind(after.1)
            .bind(limit)
            .fetch_all(&mut db)
            .await
            .context("bare relay read")?;
        shared.statements.fetch_add(1, Ordering::Relaxed);
        if rows.is_empty() {
            break;
        }
        let mut batch: Batch = (
            Vec::with_capacity(rows.len()),
            Vec::with_capacity(rows.len()),
        );
        for row in &rows {
            let (id, created, msg) = classic::message(row)?;
            after = (created, id);
            batch.0.push(id);
            batch.1.push(msg);
        }
        shared
            .select_nanos
            .fetch_add(classic::nanos(began.elapsed()), Ordering::Relaxed);
        if tx.send(batch).await.is_err() {
            break;
        }
    }
    let _ = db.close().await;
    Ok(())
}

/// One bare worker: its connection for the marks. A batch's mark runs beside
/// the next batch's publish, so the worker's cycle is the broker's confirm
/// alone.
pub async fn worker(w: Worker, rx: Arc<Mutex<mpsc::Receiver<Batch>>>) -> anyhow::Result<()> {
    let (mut db, ch, s, shared) = w.into_parts();
    let mut unmarked: Vec<uuid::Uuid> = Vec::new();
    for _ in 0..100_000_000u64 {
        if !shared.going(&s) {
            break;
        }
        let next = rx.lock().await.recv().await;
        let Some((ids, msgs)) = next else {
            break;
        };
        let publish = classic::publish(&ch, &s, &msgs);
        let (published, marked) = tokio::join!(publish, mark(&mut db, &unmarked, &shared));
        let (published, marked) = (published?, marked?);
        shared.count_sent(msgs.len(), [Duration::ZERO, published, marked]);
        unmarked = ids;
    }
    let last = mark(&mut db, &unmarked, &shared).await;
    classic::close(db, &ch).await;
    last.map(|_| ())
}

/// Marks published rows in one autocommit statement; nothing to do for none.
async fn mark(
    db: &mut PgConnection,
    ids: &[uuid::Uuid],
    shared: &Shared,
) -> anyhow::Result<Duration> {
    if ids.is_empty() {
        return Ok(Duration::ZERO);
    }
    let began = Instant::now();
    sqlx::query(classic::MARK)
        .bind(ids)
        .execute(&mut *db)
        .await
        .context("bare relay UPDATE published_at")?;
    shared.statements.fetch_add(1, Ordering::Relaxed);
    Ok(began.elapsed())
}
