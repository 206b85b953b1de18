//! Producers that commit events straight into the case's database.

use std::time::Duration;

use sqlx::PgPool;
use tokio::{task::JoinHandle, time::sleep};
use uuid::Uuid;

use crate::history::History;

/// Producers: `tasks` tasks commit `total` events between them in transactions
/// of ten, spread over `spread`; every seventh transaction rolls back. A
/// transaction the server fails is not counted, and its events are in doubt
/// when the commit itself failed (see `History::in_doubt`).
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
                    match transaction(&pool, &ids, task, t % 7 == 0).await {
                        Ok(true) => {
                            history.committed(ids.iter().map(Uuid::to_string));
                            committed += 1;
                        }
                        Ok(false) => {}
                        // The server failed (a crash, a failover): nothing was
                        // committed, or maybe it was; the final table tells.
                        Err(Failed::Before) => {}
                        Err(Failed::AtCommit) => history.in_doubt(ids.iter().map(Uuid::to_string)),
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

/// How a producer's transaction failed: before its commit was sent (nothing
/// committed), or at the commit (committed or not, nobody knows).
enum Failed {
    Before,
    AtCommit,
}

/// Inserts `ids` in one transaction and commits it (`Ok(true)`), or rolls
/// it back (`Ok(false)`) when `roll_back`.
async fn transaction(
    pool: &PgPool,
    ids: &[Uuid],
    task: usize,
    roll_back: bool,
) -> Result<bool, Failed> {
    let mut tx = pool.begin().await.map_err(|_| Failed::Before)?;
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload)
         SELECT id, 'agg-' || $2 || '-' || n, 'fault.test', jsonb_build_object('n', n)
         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)",
    )
    .bind(ids)
    .bind(task.to_string())
    .execute(&mut *tx)
    .await
    .map_err(|_| Failed::Before)?;
    if roll_back {
        // A failed rollback leaves nothing committed either.
        let _ = tx.rollback().await;
        return Ok(false);
    }
    tx.commit().await.map_err(|_| Failed::AtCommit)?;
    Ok(true)
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
