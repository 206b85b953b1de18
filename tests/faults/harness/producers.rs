//! Producers that commit events straight into the case's database.

use std::time::Duration;

use sqlx::PgPool;
use tokio::{task::JoinHandle, time::sleep};
use uuid::Uuid;

use crate::history::History;

/// Producers: `tasks` tasks commit `total` events between them in transactions
/// of ten, spread over `spread`; every seventh transaction rolls back.
pub fn produce(pool: &PgPool, history: &History, total: usize, spread: Duration) -> JoinHandle<()> {
    const TASKS: usize = 4;
    const PER_TX: usize = 10;
    let txs = total.div_ceil(TASKS * PER_TX);
    let pause = spread / u32::try_from(txs).expect("a modest size");
    let handles: Vec<JoinHandle<()>> = (0..TASKS)
        .map(|task| {
            let (pool, history) = (pool.clone(), history.clone());
            tokio::spawn(async move {
                let mut committed = 0;
                let mut t = 0;
                while committed < txs {
                    t += 1;
                    let ids: Vec<Uuid> = (0..PER_TX).map(|_| Uuid::new_v4()).collect();
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query(
                        "INSERT INTO outbox (id, aggregate_id, event_type, payload)
                         SELECT id, 'agg-' || $2 || '-' || n, 'fault.test', jsonb_build_object('n', n)
                         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)",
                    )
                    .bind(&ids)
                    .bind(task.to_string())
                    .execute(&mut *tx)
                    .await
                    .expect("insert events");
                    if t % 7 == 0 {
                        tx.rollback().await.expect("rollback");
                    } else {
                        tx.commit().await.expect("commit");
                        history.committed(ids.iter().map(Uuid::to_string));
                        committed += 1;
                    }
                    // The producers' pace: `total` events spread over `spread`.
                    sleep(pause).await;
                }
            })
        })
        .collect();
    tokio::spawn(async move {
        for handle in handles {
            handle.await.expect("a producer panicked");
        }
    })
}

/// Commits `n` events in one transaction: a backlog that appears at once.
pub async fn burst(pool: &PgPool, history: &History, n: usize) {
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload)
         SELECT id, 'burst-' || n, 'fault.test', jsonb_build_object('n', n)
         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)",
    )
    .bind(&ids)
    .execute(pool)
    .await
    .expect("insert a burst");
    history.committed(ids.iter().map(Uuid::to_string));
}
