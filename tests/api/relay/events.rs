//! Producers for the relay tests, and what arrived at the broker.

use std::{collections::HashMap, time::Duration};

use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

use super::TRACEPARENT;
use crate::{
    shared::rabbit::{Rabbit, Received},
    support::{TestApp, wait_until},
};

/// Producer transactions from concurrent tasks; every `rollback_every`-th
/// transaction of a task rolls back. Returns (committed, rolled back) ids.
pub async fn produce(
    pool: &PgPool,
    tasks: usize,
    txs_per_task: usize,
    per_tx: usize,
    rollback_every: usize,
) -> (Vec<Uuid>, Vec<Uuid>) {
    let mut handles = Vec::new();
    for task in 0..tasks {
        let pool = pool.clone();
        handles.push(tokio::spawn(async move {
            let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
            for t in 0..txs_per_task {
                let ids: Vec<Uuid> = (0..per_tx).map(|_| Uuid::new_v4()).collect();
                let aggregates: Vec<String> = (0..per_tx).map(|i| format!("agg-{task}-{t}-{i}")).collect();
                let mut tx = pool.begin().await.expect("begin");
                sqlx::query(
                    "INSERT INTO outbox (id, aggregate_id, event_type, payload, headers) \
                     SELECT id, agg, 'order.created', jsonb_build_object('aggregate', agg, 'pad', repeat('x', 200)), $3 \
                     FROM unnest($1::uuid[], $2::text[]) AS t(id, agg)",
                )
                .bind(&ids)
                .bind(&aggregates)
                .bind(json!({ "traceparent": TRACEPARENT }))
                .execute(&mut *tx)
                .await
                .expect("insert events");
                if rollback_every > 0 && t % rollback_every == rollback_every - 1 {
                    tx.rollback().await.expect("rollback");
                    rolled_back.extend(ids);
                } else {
                    tx.commit().await.expect("commit");
                    committed.extend(ids);
                }
            }
            (committed, rolled_back)
        }));
    }
    let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
    for handle in handles {
        let (c, r) = handle.await.expect("producer task");
        committed.extend(c);
        rolled_back.extend(r);
    }
    (committed, rolled_back)
}

pub async fn unpublished(app: &TestApp) -> i64 {
    app.count("public.outbox", "published_at IS NULL").await
}

pub async fn published(app: &TestApp) -> i64 {
    app.count("public.outbox", "published_at IS NOT NULL").await
}

/// Waits until every row is published and the queue holds at least `expected`.
pub async fn wait_all_delivered(app: &TestApp, rabbit: &Rabbit, expected: usize, limit: Duration) {
    wait_until(
        limit,
        "every committed event published and queued",
        async || unpublished(app).await == 0 && rabbit.depth().await as usize >= expected,
    )
    .await;
}

/// How often each message id arrived.
pub fn tally(got: &[Received]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for m in got {
        *counts.entry(m.message_id.clone()).or_insert(0) += 1;
    }
    counts
}

pub fn assert_all_arrived(committed: &[Uuid], counts: &HashMap<String, usize>) {
    let missing: Vec<_> = committed
        .iter()
        .filter(|id| !counts.contains_key(&id.to_string()))
        .collect();
    assert!(
        missing.is_empty(),
        "{} committed events never arrived, e.g. {:?}",
        missing.len(),
        missing.first()
    );
}
