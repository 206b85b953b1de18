//! Producers that commit events straight into the case's database.

use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};
use sqlx::PgPool;
use tokio::{task::JoinHandle, time::sleep};
use uuid::Uuid;

use crate::{history::History, shared::wait::millis};

/// Producer tasks.
const TASKS: usize = 4;

/// Producers: `TASKS` tasks commit `total` events between them in
/// transactions of ten, spread over `spread`; every seventh transaction rolls
/// back. Each task writes aggregates of its own, one event of each per
/// transaction, so an aggregate's events are committed one transaction at a
/// time, in `seq` order. A transaction the server fails is not counted, and
/// its events are in doubt when the commit itself failed (see
/// `History::in_doubt`).
pub fn produce(pool: &PgPool, history: &History, total: usize, spread: Duration) -> JoinHandle<()> {
    const PER_TX: usize = 10;
    let txs = total.div_ceil(TASKS * PER_TX);
    let pause = spread / u32::try_from(txs).expect("a modest size");
    let handles: Vec<JoinHandle<()>> = (0..TASKS)
        .map(|task| {
            let (pool, history) = (pool.clone(), history.clone());
            let aggregates: Vec<String> = (1..=PER_TX).map(|n| format!("agg-{task}-{n}")).collect();
            tokio::spawn(async move {
                let mut committed = 0;
                let mut t = 0;
                while committed < txs {
                    t += 1;
                    let ids: Vec<Uuid> = (0..PER_TX).map(|_| Uuid::new_v4()).collect();
                    let tx = Tx {
                        ids: &ids,
                        aggregates: &aggregates,
                        held: Duration::ZERO,
                        roll_back: t % 7 == 0,
                    };
                    if tx.run(&pool, &history).await {
                        committed += 1;
                    }
                    // The producers' pace: `total` events spread over `spread`.
                    sleep(pause).await;
                }
            })
        })
        .collect();
    join(handles)
}

/// Producers for an ordered outbox: `TASKS` tasks commit `total` events over
/// `spread`, in transactions of one to five events of random aggregates out
/// of `aggregates` that every task writes, each transaction held open up to
/// 40 ms after its insert; every seventh rolls back. Transactions that write
/// one aggregate then overlap and commit out of `seq` order, which is what
/// the commit-order guard must sort out (with [`produce`]'s one writer per
/// aggregate, order would hold without it). Fewer aggregates put more of
/// each aggregate's events close together.
pub fn produce_shared(
    pool: &PgPool,
    history: &History,
    total: usize,
    spread: Duration,
    aggregates: usize,
) -> JoinHandle<()> {
    let per_task = total.div_ceil(TASKS);
    // Three events a transaction on average.
    let pause = spread / u32::try_from(per_task.div_ceil(3)).expect("a modest size");
    let handles: Vec<JoinHandle<()>> = (0..TASKS)
        .map(|task| {
            let (pool, history) = (pool.clone(), history.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(1000 + task as u64);
                let mut committed = 0;
                let mut t = 0;
                while committed < per_task {
                    t += 1;
                    let n = rng.random_range(1..=5).min(per_task - committed);
                    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
                    let names: Vec<String> = (0..n)
                        .map(|_| format!("agg-{:03}", rng.random_range(0..aggregates)))
                        .collect();
                    let tx = Tx {
                        ids: &ids,
                        aggregates: &names,
                        held: millis(rng.random_range(0..40)),
                        roll_back: t % 7 == 0,
                    };
                    if tx.run(&pool, &history).await {
                        committed += n;
                    }
                    // The producers' pace.
                    sleep(pause).await;
                }
            })
        })
        .collect();
    join(handles)
}

fn join(handles: Vec<JoinHandle<()>>) -> JoinHandle<()> {
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

/// One producer transaction: `ids[i]` of aggregate `aggregates[i]`.
struct Tx<'a> {
    ids: &'a [Uuid],
    aggregates: &'a [String],
    /// How long it stays open after its insert (others insert and commit meanwhile).
    held: Duration,
    roll_back: bool,
}

impl Tx<'_> {
    /// Runs it and records the outcome; whether it committed.
    async fn run(&self, pool: &PgPool, history: &History) -> bool {
        let ids = || self.ids.iter().map(Uuid::to_string);
        match self.commit(pool).await {
            Ok(true) => {
                history.committed(ids());
                true
            }
            Ok(false) => false,
            // The server failed (a crash, a failover): nothing was
            // committed, or maybe it was; the final table tells.
            Err(Failed::Before) => false,
            Err(Failed::AtCommit) => {
                history.in_doubt(ids());
                false
            }
        }
    }

    /// Inserts the events in one transaction and commits it (`Ok(true)`), or
    /// rolls it back (`Ok(false)`).
    async fn commit(&self, pool: &PgPool) -> Result<bool, Failed> {
        let mut tx = pool.begin().await.map_err(|_| Failed::Before)?;
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_id, event_type, payload)
             SELECT id, aggregate, 'fault.test', jsonb_build_object('n', n)
             FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS t(id, aggregate, n)",
        )
        .bind(self.ids)
        .bind(self.aggregates)
        .execute(&mut *tx)
        .await
        .map_err(|_| Failed::Before)?;
        if !self.held.is_zero() {
            // Held open while others insert and commit: a schedule.
            sleep(self.held).await;
        }
        if self.roll_back {
            // A failed rollback leaves nothing committed either.
            let _ = tx.rollback().await;
            return Ok(false);
        }
        tx.commit().await.map_err(|_| Failed::AtCommit)?;
        Ok(true)
    }
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
