//! Issue #33, per-aggregate order: each figure of an outbox with
//! `ordering=aggregate` against the same figure of an unordered outbox
//! (`ordering=none`) measured in the same run, the two alternating.
//!
//! - Ordered drain: the drain's backlog spread over `--aggregates` aggregates,
//!   drained by outboxd + outbox-relay from an ordered outbox and from an
//!   unordered one, at the drain's batch sizes and worker counts. Target:
//!   ordered ≥ 0.8 × unordered events/s.
//! - Ordered claim: one table with published history and pending events over
//!   `--aggregates` aggregates, served by two outboxd processes, one with the
//!   outbox ordered, one unordered; `ClaimBatch(100)` from each in turn.
//!   Target: the ordered claim's p50 and p99 ≤ 1.5 × the unordered one's.
//! - Hot aggregate: every event of one aggregate, ordered: one event at a
//!   time by construction; its rate is reported with no target.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context as _;
use outboxd::pb::outbox_service_client::OutboxServiceClient;
use sqlx::{AssertSqlSafe, Connection as _};

use crate::{
    Plan, db,
    procs::{self, Proc},
    scenarios::{self, Ctx, DrainRun, OutboxdTable, Results},
    stats,
};

/// Untimed claims from each outbox before the timed ones (connections, caches).
pub const WARM_UP: usize = 3;

/// What outboxd puts in its claim statement (`claim.sql`) for an ordered
/// outbox under `poison=block`, to keep every event but its aggregate's head
/// out: `HEAD_ONLY` of `src/store/postgres/statements.rs`, with its
/// `{parked}` empty (a test keeps the two alike).
const HEAD_ONLY: &str = "AND NOT EXISTS (SELECT 1 FROM {table} AS p
                      WHERE p.aggregate_id = o.aggregate_id AND p.seq < o.seq
                        AND p.published_at IS NULL AND p.discarded_at IS NULL{parked}
                      OFFSET 0)
      AND NOT EXISTS (SELECT 1 FROM {leases} AS x
                      WHERE x.aggregate_id = o.aggregate_id::text
                        AND x.locked_until > now() AND x.id <> o.id
                      OFFSET 0)";

/// outboxd's claim statement for an ordered `schema.outbox` (poison=block),
/// bound as the scale scenario binds the unordered one; the commit-order
/// guard's bound ($9) lets every row through, as it does once no writer that
/// started before the claim is still open.
fn ordered_claim_sql(schema: &str) -> String {
    let head_only = HEAD_ONLY.replace("{parked}", "");
    // Since #48 every claim has the guard's bound; before, only the ordered
    // one added it.
    let fresh_order = if scenarios::CLAIM_SQL.contains("o.seq <= $9::bigint") {
        head_only.clone()
    } else {
        format!("AND o.seq <= $9::bigint\n      {head_only}")
    };
    let sql = scenarios::CLAIM_SQL
        .replace("{expired_order}", &head_only)
        .replace("{fresh_order}", &fresh_order)
        .replace("{lease_aggregate}", "c.aggregate_id::text");
    scenarios::bind_claim(&sql, schema, 0, None)
}

/// The two sides of every comparison here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// `ordering=none`, outboxd's default.
    Unordered,
    /// `ordering=aggregate`.
    Ordered,
}

impl Order {
    /// Both, the first one alternating across repetitions.
    fn in_turn(rep: usize) -> [Self; 2] {
        if rep.is_multiple_of(2) {
            [Self::Unordered, Self::Ordered]
        } else {
            [Self::Ordered, Self::Unordered]
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Unordered => "unordered (ordering=none)",
            Self::Ordered => "ordered (ordering=aggregate)",
        }
    }

    /// The drains' schema of this side's `outbox` table.
    fn schema(self) -> &'static str {
        match self {
            Self::Unordered => "unordered",
            Self::Ordered => "ordered",
        }
    }

    /// The `--outbox` option for `table` on this side: the outbox is
    /// `default`, the relay's.
    fn outbox_arg(self, table: &str) -> String {
        match self {
            Self::Unordered => format!("default={table}"),
            Self::Ordered => format!("default={table}:ordering=aggregate"),
        }
    }
}

#[derive(Debug, Clone)]
pub struct OrderedDrainCase {
    pub batch: u32,
    pub workers: u32,
    pub unordered: Vec<DrainRun>,
    pub ordered: Vec<DrainRun>,
}

impl OrderedDrainCase {
    /// Ordered over unordered of `f`, per repetition (the two ran back to back).
    pub fn paired(&self, f: impl Fn(&DrainRun) -> f64) -> Vec<f64> {
        self.ordered
            .iter()
            .zip(&self.unordered)
            .map(|(o, u)| f(o) / f(u))
            .collect()
    }
}

#[derive(Debug, Clone)]
pub struct ClaimSide {
    /// ClaimBatch(100) round trips, milliseconds.
    pub claim_ms: Vec<f64>,
    /// The claim statement's execution time under EXPLAIN ANALYZE (rolled
    /// back); NaN when not explained.
    pub sql_ms: f64,
    pub plan: String,
}

#[derive(Debug, Clone)]
pub struct OrderedClaim {
    pub history: u64,
    pub pending: u64,
    pub aggregates: u64,
    pub ordered: ClaimSide,
    pub unordered: ClaimSide,
}

impl OrderedClaim {
    /// Ordered over unordered at quantile `q` of the claim times.
    pub fn ratio(&self, q: f64) -> f64 {
        stats::quantile(&self.ordered.claim_ms, q) / stats::quantile(&self.unordered.claim_ms, q)
    }
}

#[derive(Debug, Clone)]
pub struct HotCase {
    pub batch: u32,
    pub workers: u32,
    pub events: u64,
    pub runs: Vec<DrainRun>,
}

/// Progress steps of the scenarios `plan` runs here.
pub fn steps(plan: &Plan) -> u64 {
    let reps = plan.reps as u64;
    let mut n = 0;
    if plan.ordered_drain || plan.hot {
        n += 1;
    }
    if plan.ordered_drain {
        n += reps * 2 * (plan.batch_sizes.len() * plan.workers.len()) as u64;
    }
    if plan.hot {
        n += reps;
    }
    if plan.ordered_claim {
        n += 2;
    }
    n
}

pub async fn run(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    if plan.ordered_drain || plan.hot {
        prepare_drains(ctx).await?;
    }
    if plan.ordered_drain {
        ordered_drain(ctx, plan, results).await?;
    }
    if plan.hot {
        hot(ctx, plan, results).await?;
    }
    if plan.ordered_claim {
        results.ordered_claim = Some(ordered_claim(ctx, plan).await?);
    }
    Ok(())
}

/// outboxd with these `--outbox` options on `db_name`, ready to serve at
/// the address returned.
async fn start(
    ctx: &Ctx,
    db_name: &str,
    tag: &str,
    outboxes: &[&str],
) -> anyhow::Result<(Proc, SocketAddr)> {
    let extra: Vec<&str> = outboxes.iter().flat_map(|o| ["--outbox", o]).collect();
    let (proc, addr) =
        procs::start_outboxd_with(&ctx.bins, &ctx.url(db_name)?, &ctx.log_dir, tag, &extra).await?;
    ctx.record(&proc.cmdline).await;
    Ok((proc, addr))
}

async fn create_schemas(ctx: &Ctx, db_name: &str, schemas: &[&str]) -> anyhow::Result<()> {
    let mut conn = db::connect(&ctx.url(db_name)?).await?;
    for schema in schemas {
        sqlx::raw_sql(AssertSqlSafe(format!(
            "CREATE SCHEMA IF NOT EXISTS {schema}"
        )))
        .execute(&mut conn)
        .await
        .with_context(|| format!("creating schema {schema}"))?;
    }
    let _ = conn.close().await;
    Ok(())
}

/// The drains' database: `ordered.outbox` and `unordered.outbox`, created and
/// adopted by one outboxd that then stops, so each table has what its
/// ordering makes outboxd keep beside it (and nothing more).
async fn prepare_drains(ctx: &Ctx) -> anyhow::Result<()> {
    ctx.progress
        .doing("ordering: outboxd adopts an ordered and an unordered outbox, then stops");
    db::create_database(&ctx.admin, &ctx.db_ordering).await?;
    create_schemas(ctx, &ctx.db_ordering, &["ordered", "unordered"]).await?;
    let outboxes = [
        "ordered=ordered.outbox:ordering=aggregate",
        "unordered=unordered.outbox",
    ];
    let (outboxd, _) = start(ctx, &ctx.db_ordering, "adopt-ordering", &outboxes).await?;
    outboxd.stop(Duration::from_secs(10)).await?;
    ctx.progress.done_step();
    Ok(())
}

/// outboxd + relay draining `n` events over `aggregates` from `order`'s table.
async fn drain(
    ctx: &Ctx,
    order: Order,
    n: u64,
    aggregates: u64,
    batch: u32,
    workers: u32,
    budget: Duration,
) -> anyhow::Result<DrainRun> {
    let table = OutboxdTable {
        db_name: &ctx.db_ordering,
        schema: order.schema(),
        outbox: Some(order.outbox_arg(&format!("{}.outbox", order.schema()))),
        aggregates,
        tag: order.schema(),
        secure: None,
    };
    scenarios::drain_outboxd_on(ctx, &table, n, batch, workers, budget).await
}

async fn ordered_drain(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    let mut cases: Vec<OrderedDrainCase> = Vec::new();
    for &batch in &plan.batch_sizes {
        for &workers in &plan.workers {
            cases.push(OrderedDrainCase {
                batch,
                workers,
                unordered: Vec::new(),
                ordered: Vec::new(),
            });
        }
    }
    let (n, aggregates) = (plan.events, plan.aggregates);
    for rep in 0..plan.reps {
        for case in &mut cases {
            let (batch, workers) = (case.batch, case.workers);
            for order in Order::in_turn(rep) {
                ctx.progress.doing(format!(
                    "rep {}/{}: drain {n} over {aggregates} aggregates, {}, batch {batch}, {workers} worker(s)",
                    rep + 1,
                    plan.reps,
                    order.label(),
                ));
                let run = scenarios::retried(ctx, "ordered drain run", || {
                    drain(
                        ctx,
                        order,
                        n,
                        aggregates,
                        batch,
                        workers,
                        scenarios::drain_budget(n),
                    )
                })
                .await?;
                ctx.progress.log(format!(
                    "rep {} drain {} b{batch} w{workers}: {:.0} ev/s, {:.1} events per batch{}",
                    rep + 1,
                    order.label(),
                    run.events_per_sec,
                    n as f64 / run.batches.max(1) as f64,
                    run.holdback_secs
                        .map(|s| format!(", commit-order holdback up to {s:.3} s"))
                        .unwrap_or_default()
                ));
                match order {
                    Order::Unordered => case.unordered.push(run),
                    Order::Ordered => case.ordered.push(run),
                }
                ctx.progress.done_step();
            }
        }
    }
    results.ordered_drain = cases;
    Ok(())
}

async fn hot(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    let (n, batch, workers) = (plan.hot_events, plan.latency_batch, plan.latency_workers);
    let mut case = HotCase {
        batch,
        workers,
        events: n,
        runs: Vec::new(),
    };
    for rep in 0..plan.reps {
        ctx.progress.doing(format!(
            "rep {}/{}: drain {n} events of one aggregate, ordered, batch {batch}, {workers} worker(s)",
            rep + 1,
            plan.reps,
        ));
        // One event at a time: far slower than a drain of many aggregates.
        let budget = Duration::from_secs(60 + n / 20);
        let run = scenarios::retried(ctx, "hot aggregate run", || {
            drain(ctx, Order::Ordered, n, 1, batch, workers, budget)
        })
        .await?;
        ctx.progress.log(format!(
            "rep {} hot aggregate: {:.0} ev/s, {:.2} events per batch",
            rep + 1,
            run.events_per_sec,
            n as f64 / run.batches.max(1) as f64,
        ));
        case.runs.push(run);
        ctx.progress.done_step();
    }
    results.hot = Some(case);
    Ok(())
}

/// The claim statements of both sides for `public.outbox`, bound as the
/// scale scenario binds them (a claim of 100 for 60 s).
fn claim_statement(order: Order) -> String {
    match order {
        Order::Unordered => scenarios::claim_sql("public"),
        Order::Ordered => ordered_claim_sql("public"),
    }
}

async fn ordered_claim(ctx: &Ctx, plan: &Plan) -> anyhow::Result<OrderedClaim> {
    let db_name = &ctx.db_ordered_claim;
    let (history, pending, aggregates) =
        (plan.ordered_history, plan.ordered_pending, plan.aggregates);
    ctx.progress.doing(format!(
        "ordered claim: {history} history rows and {pending} pending over {aggregates} aggregates"
    ));
    db::create_database(&ctx.admin, db_name).await?;
    // The table, its indexes and its lease table come from an ordered
    // outboxd, on the empty table; the rows come after.
    let ordered_arg = Order::Ordered.outbox_arg("public.outbox");
    let unordered_arg = Order::Unordered.outbox_arg("public.outbox");
    let (adopting, _) = start(ctx, db_name, "adopt-ordered-claim", &[&ordered_arg]).await?;
    adopting.stop(Duration::from_secs(10)).await?;
    let url = ctx.url(db_name)?;
    let mut conn = db::connect(&url).await?;
    // History first: published events older than every pending one.
    db::fill_history(&mut conn, 1, history, aggregates).await?;
    db::fill_pending(
        &mut conn,
        db::Shape::Outboxd,
        history + 1,
        pending,
        aggregates,
    )
    .await?;
    db::vacuum_analyze(&mut conn).await?;
    db::checkpoint(&mut conn).await?;
    ctx.progress.done_step();

    ctx.progress.doing(format!(
        "ordered claim: {} claims of 100 from each outbox, in turn",
        plan.ordered_claims
    ));
    // outboxd's sessions plan with sequential scans priced out; so do these.
    sqlx::raw_sql("SET enable_seqscan = off")
        .execute(&mut conn)
        .await
        .context("SET enable_seqscan")?;
    let mut sides = Vec::new();
    // Each explained twice, the second kept: the first reads what the fill
    // left cold, and would make whichever runs first look slower.
    for order in [
        Order::Ordered,
        Order::Unordered,
        Order::Ordered,
        Order::Unordered,
    ] {
        sides.push(scenarios::explain(&mut conn, &claim_statement(order)).await?);
    }
    let sides: Vec<(String, f64)> = sides.split_off(2);
    let _ = conn.close().await;
    // Two outboxd on the one table: the same rows, the same machine.
    let (ordered, ordered_addr) = start(ctx, db_name, "ordered-claim", &[&ordered_arg]).await?;
    let (unordered, unordered_addr) =
        start(ctx, db_name, "unordered-claim", &[&unordered_arg]).await?;
    let timed = claims(plan, [ordered_addr, unordered_addr]).await;
    ordered.stop(Duration::from_secs(10)).await?;
    unordered.stop(Duration::from_secs(10)).await?;
    let (ordered_ms, unordered_ms) = timed?;
    let [(ordered_plan, ordered_sql), (unordered_plan, unordered_sql)]: [(String, f64); 2] =
        sides.try_into().map_err(|_| anyhow::anyhow!("two plans"))?;
    let result = OrderedClaim {
        history,
        pending,
        aggregates,
        ordered: ClaimSide {
            claim_ms: ordered_ms,
            sql_ms: ordered_sql,
            plan: ordered_plan,
        },
        unordered: ClaimSide {
            claim_ms: unordered_ms,
            sql_ms: unordered_sql,
            plan: unordered_plan,
        },
    };
    ctx.progress.log(format!(
        "ordered claim h{history} p{pending} a{aggregates}: p50 {:.2} vs {:.2} ms ({:.2}×), p99 {:.2} vs {:.2} ms ({:.2}×)",
        stats::quantile(&result.ordered.claim_ms, 0.5),
        stats::quantile(&result.unordered.claim_ms, 0.5),
        result.ratio(0.5),
        stats::quantile(&result.ordered.claim_ms, 0.99),
        stats::quantile(&result.unordered.claim_ms, 0.99),
        result.ratio(0.99),
    ));
    ctx.progress.done_step();
    Ok(result)
}

/// Timed `ClaimBatch(100)`s from the ordered and the unordered outboxd (at
/// `addrs`) in turn, the order flipping each round, after [`WARM_UP`] untimed
/// rounds. Every timed claim must return 100 events; a warm-up claim may
/// return fewer (an ordered outboxd just started holds new events back until
/// the transactions open at its start have ended) and is then repeated, for
/// up to a minute.
async fn claims(plan: &Plan, addrs: [SocketAddr; 2]) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let mut clients = Vec::new();
    for addr in addrs {
        clients.push(
            OutboxServiceClient::connect(format!("http://{addr}"))
                .await
                .context("connecting to outboxd")?,
        );
    }
    let warm_until = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut times = [Vec::new(), Vec::new()];
    let mut k = 0;
    for _ in 0..100_000 {
        if k >= plan.ordered_claims + WARM_UP {
            break;
        }
        let turn = if k % 2 == 0 { [0, 1] } else { [1, 0] };
        let mut short = false;
        for side in turn {
            let (ms, got) = scenarios::claim_counted(&mut clients[side], "default").await?;
            if k >= WARM_UP {
                anyhow::ensure!(
                    got == 100,
                    "ordered claim: a claim from the {} outbox returned {got} events, not 100",
                    if side == 0 { "ordered" } else { "unordered" }
                );
                times[side].push(ms);
            } else if got < 100 {
                short = true;
            }
        }
        if short {
            anyhow::ensure!(
                tokio::time::Instant::now() < warm_until,
                "ordered claim: claims still returned fewer than 100 events after a minute"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        k += 1;
    }
    let [o, u] = times;
    Ok((o, u))
}

#[cfg(test)]
mod tests {
    use super::{HEAD_ONLY, ordered_claim_sql};

    /// outboxd's statement builder, where its ordered claim's text comes from.
    const STATEMENTS: &str = include_str!("../../src/store/postgres/statements.rs");

    #[test]
    fn the_ordered_claim_is_outboxds() {
        assert!(
            STATEMENTS.contains(HEAD_ONLY),
            "HEAD_ONLY differs from outboxd's in src/store/postgres/statements.rs"
        );
        let sql = ordered_claim_sql("public");
        for placeholder in ["{", "$1", "$8", "$9"] {
            assert!(!sql.contains(placeholder), "{placeholder} left in\n{sql}");
        }
        assert!(
            sql.contains("o.seq <= 9223372036854775807::bigint"),
            "{sql}"
        );
        assert!(
            sql.contains("x.aggregate_id = o.aggregate_id::text"),
            "{sql}"
        );
    }
}
