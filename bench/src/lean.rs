//! The lean lease relay: the lease design's database work with nothing around
//! it. Each worker leases a batch on outboxd's own table, with its indexes,
//! in one autocommit `UPDATE … SET locked_until` straight from the harness,
//! publishes it with confirms and acks it with one autocommit `UPDATE … SET
//! published_at` checked against the lease. The ack of one batch and the
//! claim of the next run beside the publish of the one between them, as
//! outbox-relay's acks ride on its claims made ahead.
//!
//! Left out is everything outboxd adds to those two writes: the gRPC hop and
//! its processes, the look for expired leases, dead-lettering, the previous
//! lease's columns returned for its span, `claimed_by` / `claimed_at`. So set
//! beside the bare relay (one write per row, no lease) it prices the lease's
//! own write on this machine, and set beside outboxd + relay it prices the
//! service. A yardstick, not a relay: it never takes back an expired lease.

use std::{sync::atomic::Ordering, time::Duration};

use anyhow::Context as _;
use sqlx::PgConnection;
use tokio::time::Instant;
use uuid::Uuid;

use crate::{
    classic::{self, Settings, Shared, Worker},
    rabbit::Msg,
};

/// Fresh rows in delivery order from the unleased index, leased for 30 s.
/// $1 batch size, $2 lease id.
const CLAIM: &str = "UPDATE outbox AS o \
     SET locked_until = now() + interval '30 seconds', lease_id = $2, attempts = o.attempts + 1 \
     FROM (SELECT id FROM outbox \
           WHERE published_at IS NULL AND dead_lettered_at IS NULL AND locked_until IS NULL \
             AND available_at <= now() \
           ORDER BY seq LIMIT $1 FOR UPDATE SKIP LOCKED) AS c \
     WHERE o.id = c.id \
     RETURNING o.id, o.aggregate_id::text AS aggregate_id, o.event_type, o.payload::text AS payload, o.created_at";

/// Settles the rows that still carry the lease. $1 ids, $2 lease id.
const ACK: &str = "UPDATE outbox SET published_at = now(), locked_until = NULL \
     WHERE id = ANY($1) AND lease_id = $2 AND published_at IS NULL";

/// A leased batch: its lease, the ids to ack and the messages to publish.
struct Leased {
    lease: Uuid,
    ids: Vec<Uuid>,
    msgs: Vec<Msg>,
}

/// One lean worker: its connection for its claims and acks. Returns when a
/// claim comes back empty.
pub async fn worker(w: Worker) -> anyhow::Result<()> {
    let (mut db, ch, s, shared) = w.into_parts();
    let mut next = claim(&mut db, &s, &shared).await?.0;
    let mut unacked: Option<Leased> = None;
    for _ in 0..100_000_000u64 {
        if !shared.going(&s) {
            break;
        }
        let Some(batch) = next.take() else {
            break;
        };
        let publish = classic::publish(&ch, &s, &batch.msgs);
        let beside = async {
            let acked = ack(&mut db, unacked.as_ref(), &shared).await?;
            let (claimed, took) = claim(&mut db, &s, &shared).await?;
            anyhow::Ok((acked, claimed, took))
        };
        let (published, beside) = tokio::join!(publish, beside);
        let (published, (acked, claimed, took)) = (published?, beside?);
        shared.count_sent(batch.msgs.len(), [took, published, acked]);
        next = claimed;
        unacked = Some(batch);
    }
    let last = ack(&mut db, unacked.as_ref(), &shared).await;
    classic::close(db, &ch).await;
    last.map(|_| ())
}

/// Leases up to a batch; `None` when nothing was claimable. Also returns how
/// long the statement took.
async fn claim(
    db: &mut PgConnection,
    s: &Settings,
    shared: &Shared,
) -> anyhow::Result<(Option<Leased>, Duration)> {
    let began = Instant::now();
    let lease = Uuid::new_v4();
    let rows = sqlx::query(CLAIM)
        .bind(i64::from(s.batch))
        .bind(lease)
        .fetch_all(&mut *db)
        .await
        .context("lean lease relay claim")?;
    shared.statements.fetch_add(1, Ordering::Relaxed);
    let mut leased = Leased {
        lease,
        ids: Vec::with_capacity(rows.len()),
        msgs: Vec::with_capacity(rows.len()),
    };
    for row in &rows {
        let (id, _, msg) = classic::message(row)?;
        leased.ids.push(id);
        leased.msgs.push(msg);
    }
    let took = began.elapsed();
    Ok(((!leased.ids.is_empty()).then_some(leased), took))
}

/// Acks a published batch; nothing to do for none. Every row must still carry
/// the lease: nothing else claims here, so a shortfall is a harness bug.
async fn ack(
    db: &mut PgConnection,
    batch: Option<&Leased>,
    shared: &Shared,
) -> anyhow::Result<Duration> {
    let Some(batch) = batch else {
        return Ok(Duration::ZERO);
    };
    let began = Instant::now();
    let done = sqlx::query(ACK)
        .bind(&batch.ids)
        .bind(batch.lease)
        .execute(&mut *db)
        .await
        .context("lean lease relay ack")?;
    shared.statements.fetch_add(1, Ordering::Relaxed);
    anyhow::ensure!(
        done.rows_affected() == batch.ids.len() as u64,
        "lean lease relay ack settled {} of {} rows",
        done.rows_affected(),
        batch.ids.len()
    );
    Ok(began.elapsed())
}
