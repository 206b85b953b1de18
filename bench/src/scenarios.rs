//! The scenarios: drain, producers (commits/s with outboxd stopped, idle and
//! draining), latency under steady load, claim latency with history (and, in
//! `ordering.rs`, the per-aggregate order's). Each
//! measured case runs every design once per repetition, the order of the
//! designs rotating from one repetition to the next.

use std::{
    path::PathBuf,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use anyhow::{Context as _, bail};
use futures::StreamExt as _;
use hdrhistogram::Histogram;
use lapin::{options::BasicConsumeOptions, types::FieldTable};
use outboxd::pb::{self, outbox_service_client::OutboxServiceClient};
use sqlx::{AssertSqlSafe, Connection as _, PgConnection, PgPool};
use tokio::{sync::Mutex, time::Instant};

use crate::{
    Args, Plan, classic,
    cpu::{MachineCpu, Snapshot},
    db::{self, Shape},
    procs::{self, Binaries, RelayOpts, Usage},
    progress::Progress,
    rabbit::{self, Rabbit},
    scrape,
};

/// The claim statement outboxd runs, for EXPLAIN (ANALYZE, BUFFERS, WAL).
pub const CLAIM_SQL: &str = include_str!("../../src/store/postgres/queries/claim.sql");

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Design {
    Classic,
    Outboxd,
}

impl Design {
    /// Both designs, the first one alternating across repetitions, so that
    /// neither always runs on the machine the other left behind.
    pub fn in_turn(rep: usize) -> [Self; 2] {
        if rep.is_multiple_of(2) {
            [Self::Classic, Self::Outboxd]
        } else {
            [Self::Outboxd, Self::Classic]
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Self::Classic => "classic relay",
            Self::Outboxd => "outboxd + relay",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct DrainRun {
    pub events_per_sec: f64,
    pub secs: f64,
    /// Database transactions (commits + rollbacks) per published event.
    pub xacts_per_event: f64,
    /// Statements the harness sent (classic only; outboxd's are one per transaction).
    pub statements_per_event: Option<f64>,
    pub outboxd: Usage,
    pub relay: Usage,
    /// Every process's CPU from the relay's start until the backlog was out.
    pub machine: MachineCpu,
    /// Batches that carried messages.
    pub batches: u64,
    /// WAL bytes written per event over the drain.
    pub wal_per_event: f64,
    pub cycle: Option<Cycle>,
    /// Ordered outboxes: the largest `outbox_commit_order_holdback_seconds`
    /// outboxd reported during the drain (sampled every 500 ms).
    pub holdback_secs: Option<f64>,
}

/// Mean milliseconds of the parts of one batch, each design timed from the
/// inside: the classic relay by the harness around its statements, outboxd by
/// its own and the relay's histograms.
#[derive(Debug, Clone, Copy)]
pub enum Cycle {
    Classic {
        /// BEGIN and `SELECT … FOR UPDATE SKIP LOCKED`.
        select: f64,
        /// Sending the batch until its last confirm.
        publish: f64,
        /// `UPDATE published_at` and COMMIT.
        mark: f64,
    },
    Outboxd {
        /// ClaimBatch inside outboxd, with the acks it carries.
        claim: f64,
        /// From a batch's send to a message's confirm, mean over messages.
        confirm: f64,
        /// Ack calls inside outboxd (the relay overlaps them with the next
        /// batch); `None` when every ack rode on a claim.
        ack: Option<f64>,
        /// Ack calls per claim that returned a batch.
        ack_calls_per_batch: f64,
    },
}

impl Cycle {
    /// The three parts in the order the variant lists them.
    pub fn parts(&self) -> [f64; 3] {
        match *self {
            Self::Classic {
                select,
                publish,
                mark,
            } => [select, publish, mark],
            Self::Outboxd {
                claim,
                confirm,
                ack,
                ..
            } => [claim, confirm, ack.unwrap_or(f64::NAN)],
        }
    }

    /// outboxd's Ack calls per batch; NaN for the classic relay.
    pub fn ack_calls_per_batch(&self) -> f64 {
        match *self {
            Self::Outboxd {
                ack_calls_per_batch,
                ..
            } => ack_calls_per_batch,
            Self::Classic { .. } => f64::NAN,
        }
    }
}

#[derive(Debug, Clone)]
pub struct DrainCase {
    pub batch: u32,
    pub workers: u32,
    pub classic: Vec<DrainRun>,
    pub outboxd: Vec<DrainRun>,
}

#[derive(Debug, Clone)]
pub struct LatencyRun {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    pub achieved_rate: f64,
    pub sent: u64,
    pub delivered: u64,
    /// outboxd only: where its part of the time went.
    pub stages: Option<db::LeaseStages>,
}

#[derive(Debug, Clone)]
pub struct LatencyCase {
    pub design: Design,
    /// Classic poll interval.
    pub poll_ms: Option<u64>,
    pub runs: Vec<LatencyRun>,
    /// All repetitions merged, in microseconds.
    pub merged: Histogram<u64>,
}

impl LatencyCase {
    pub fn label(&self) -> String {
        match self.poll_ms {
            Some(ms) => format!("classic relay, {ms} ms poll"),
            None => "outboxd + relay, long-poll".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct ScalePoint {
    pub history: u64,
    pub pending: u64,
    pub leases: u64,
    /// ClaimBatch(100) round trips, milliseconds.
    pub claim_ms: Vec<f64>,
    /// The same claims from the empty table (no history, no leases, the same
    /// pending rows), each taken next to one of `claim_ms`: the baseline of
    /// this point, measured under the same conditions of the machine.
    pub empty_ms: Vec<f64>,
    /// Execution time of the claim statement under EXPLAIN ANALYZE (rolled back).
    pub sql_ms: f64,
    /// The same for the empty table.
    pub empty_sql_ms: f64,
    pub plan: String,
}

impl ScalePoint {
    /// Median claim time against the empty table's median at this point.
    pub fn vs_empty(&self) -> f64 {
        crate::stats::Spread::of(&self.claim_ms).median
            / crate::stats::Spread::of(&self.empty_ms).median
    }
}

#[derive(Debug, Clone, Default)]
pub struct Results {
    pub drain: Vec<DrainCase>,
    pub latency: Vec<LatencyCase>,
    pub scale: Vec<ScalePoint>,
    pub commands: Vec<String>,
    pub payload_bytes: usize,
    pub notes: Vec<String>,
    /// Commits per second from [`PRODUCERS`] connections, per mode.
    pub producer: Vec<ProducerCase>,
    /// Issue #33: ordered against unordered drains, per shape.
    pub ordered_drain: Vec<crate::ordering::OrderedDrainCase>,
    /// Issue #33: ordered against unordered claims on the same table.
    pub ordered_claim: Option<crate::ordering::OrderedClaim>,
    /// Issue #33: drains of a single aggregate's events, ordered.
    pub hot: Option<crate::ordering::HotCase>,
    /// Issue #34: the API over TLS with a token against plaintext.
    pub security: Option<crate::security::Security>,
    /// Issue #48: drains by workers that claim and ack at once, no broker.
    pub claim_drain: Vec<crate::claims::ClaimDrainCase>,
    /// Issue #48: claims behind leases held by another worker.
    pub held: Vec<crate::claims::HeldPoint>,
}

pub struct Ctx {
    pub args: Args,
    pub bins: Binaries,
    pub admin: PgPool,
    pub rabbit: Rabbit,
    pub prefix: String,
    pub db_outboxd: String,
    pub db_classic: String,
    pub db_scale: String,
    /// Issue #33's drains: an ordered and an unordered outbox side by side.
    pub db_ordering: String,
    /// Issue #33's claims with history.
    pub db_ordered_claim: String,
    /// Issue #34's claim→ack pairs and drains.
    pub db_security: String,
    /// Issue #48's claims behind held leases.
    pub db_claims: String,
    pub progress: Progress,
    commands: Mutex<Vec<String>>,
    pub log_dir: PathBuf,
}

impl Ctx {
    pub async fn setup(args: &Args, plan: &Plan, bins: Binaries) -> anyhow::Result<Self> {
        let admin = db::pool(&args.database_url, 2).await?;
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let prefix = format!(
            "outbox_bench_{}_{}",
            std::process::id(),
            stamp % 100_000_000
        );
        let rabbit = Rabbit::setup(
            &args.amqp_url,
            &prefix.trim_start_matches("outbox_bench_").replace('_', "-"),
        )
        .await?;
        let steps = steps(plan);
        let ctx = Self {
            args: args.clone(),
            bins,
            admin,
            rabbit,
            db_outboxd: format!("{prefix}_o"),
            db_classic: format!("{prefix}_c"),
            db_scale: format!("{prefix}_s"),
            db_ordering: format!("{prefix}_a"),
            db_ordered_claim: format!("{prefix}_h"),
            db_security: format!("{prefix}_t"),
            db_claims: format!("{prefix}_l"),
            prefix,
            progress: Progress::new(steps),
            commands: Mutex::new(Vec::new()),
            log_dir: args.log_dir.clone(),
        };
        Ok(ctx)
    }

    pub fn url(&self, db: &str) -> anyhow::Result<String> {
        db::url_for(&self.args.database_url, db)
    }

    pub async fn record(&self, cmdline: &str) {
        let mut cmds = self.commands.lock().await;
        // Ports and database names change per run; keep the first of each shape.
        let shape: String = cmdline
            .split_whitespace()
            .filter(|w| !w.contains("127.0.0.1:") && !w.contains(&self.prefix))
            .collect::<Vec<_>>()
            .join(" ");
        let seen = cmds.iter().any(|c| {
            c.split_whitespace()
                .filter(|w| !w.contains("127.0.0.1:") && !w.contains(&self.prefix))
                .collect::<Vec<_>>()
                .join(" ")
                == shape
        });
        if !seen {
            cmds.push(cmdline.to_owned());
        }
    }

    pub async fn cleanup(&self) -> anyhow::Result<()> {
        self.progress.finish();
        let mut first_err = None;
        for name in [
            &self.db_outboxd,
            &self.db_classic,
            &self.db_scale,
            &self.db_ordering,
            &self.db_ordered_claim,
            &self.db_security,
            &self.db_claims,
        ] {
            if let Err(err) = db::drop_database(&self.admin, name).await {
                first_err.get_or_insert(err);
            }
        }
        if let Err(err) = self.rabbit.cleanup().await {
            first_err.get_or_insert(err);
        }
        self.admin.close().await;
        first_err.map_or(Ok(()), Err)
    }

    pub async fn migrate(&self, db_name: &str) -> anyhow::Result<()> {
        let url = self.url(db_name)?;
        let args = vec!["migrate".to_owned(), "--database-url".to_owned(), url];
        let mut proc = procs::Proc::spawn(
            &format!("migrate-{db_name}"),
            &self.bins.outboxd,
            &args,
            &self.log_dir,
        )?;
        let deadline = Instant::now() + Duration::from_secs(120);
        for _ in 0..100_000 {
            if proc.check_alive().is_err() {
                break;
            }
            if Instant::now() >= deadline {
                bail!("outboxd migrate did not finish in 120 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut conn = db::connect(&self.url(db_name)?).await?;
        let ok: Option<String> = sqlx::query_scalar("SELECT to_regclass('public.outbox')::text")
            .fetch_one(&mut conn)
            .await
            .context("checking the migrated table")?;
        let _ = conn.close().await;
        if ok.is_none() {
            bail!(
                "outboxd migrate did not create public.outbox (see {})",
                self.log_dir.display()
            );
        }
        Ok(())
    }
}

fn steps(plan: &Plan) -> u64 {
    let reps = plan.reps as u64;
    let mut n = 0;
    if plan.drain {
        // Per case: two designs.
        n += reps * 2 * (plan.batch_sizes.len() * plan.workers.len()) as u64;
    }
    if plan.producers {
        n += 1 + reps * 2 * ProducerMode::ALL.len() as u64;
    }
    if plan.latency {
        n += reps * (1 + plan.poll_ms.len() as u64);
    }
    if plan.scale {
        n += (plan.history.len() * plan.pending.len()) as u64 + 1;
    }
    n + crate::ordering::steps(plan) + crate::security::steps(plan) + crate::claims::steps(plan)
}

pub async fn run_all(ctx: &Ctx, plan: &Plan) -> anyhow::Result<Results> {
    let mut results = Results {
        payload_bytes: db::payload(12345).len(),
        ..Results::default()
    };
    for name in [&ctx.db_outboxd, &ctx.db_classic, &ctx.db_scale] {
        db::create_database(&ctx.admin, name).await?;
    }
    ctx.progress.doing("migrating the bench databases");
    ctx.migrate(&ctx.db_outboxd).await?;
    ctx.migrate(&ctx.db_scale).await?;
    let mut conn = db::connect(&ctx.url(&ctx.db_classic)?).await?;
    sqlx::raw_sql(db::CLASSIC_SCHEMA)
        .execute(&mut conn)
        .await
        .context("creating the classic table")?;
    let _ = conn.close().await;

    if plan.drain {
        drain(ctx, plan, &mut results).await?;
    }
    if plan.producers {
        producers(ctx, plan, &mut results).await?;
    }
    if plan.latency {
        latency(ctx, plan, &mut results).await?;
    }
    if plan.scale {
        scale(ctx, plan, &mut results).await?;
    }
    crate::ordering::run(ctx, plan, &mut results).await?;
    crate::security::run(ctx, plan, &mut results).await?;
    crate::claims::run(ctx, plan, &mut results).await?;
    results.commands = ctx.commands.lock().await.clone();
    Ok(results)
}

/// Runs `f` up to three times: other test suites share this broker and
/// database, and some of them close every connection on the broker.
pub async fn retried<T, F, Fut>(ctx: &Ctx, what: &str, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    const ATTEMPTS: u32 = 3;
    let mut attempt = 1;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(err) if attempt < ATTEMPTS => {
                ctx.progress.log(format!(
                    "{what} failed ({err:#}); retrying ({attempt}/{ATTEMPTS})"
                ));
                tokio::time::sleep(Duration::from_secs(3)).await;
                attempt += 1;
            }
            Err(err) => return Err(err.context(format!("{what} failed {ATTEMPTS} times"))),
        }
    }
}

// ---------------------------------------------------------------- drain

async fn drain(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    let mut cases: Vec<DrainCase> = Vec::new();
    for &batch in &plan.batch_sizes {
        for &workers in &plan.workers {
            cases.push(DrainCase {
                batch,
                workers,
                classic: Vec::new(),
                outboxd: Vec::new(),
            });
        }
    }
    let n = plan.events;
    for rep in 0..plan.reps {
        for case in &mut cases {
            let (batch, workers) = (case.batch, case.workers);
            for design in Design::in_turn(rep) {
                ctx.progress.doing(format!(
                    "rep {}/{}: drain {n} with {}, batch {}, {} worker(s)",
                    rep + 1,
                    plan.reps,
                    design.label(),
                    case.batch,
                    case.workers
                ));
                let run = retried(ctx, "drain run", || async move {
                    match design {
                        Design::Classic => drain_classic(ctx, n, batch, workers).await,
                        Design::Outboxd => drain_outboxd(ctx, n, batch, workers).await,
                    }
                })
                .await?;
                ctx.progress.log(format!(
                    "rep {} drain {} b{} w{}: {:.0} ev/s, {:.4} xact/ev",
                    rep + 1,
                    design.label(),
                    case.batch,
                    case.workers,
                    run.events_per_sec,
                    run.xacts_per_event
                ));
                match design {
                    Design::Classic => case.classic.push(run),
                    Design::Outboxd => case.outboxd.push(run),
                }
                ctx.progress.done_step();
            }
        }
    }
    results.drain = cases;
    Ok(())
}

/// Empties the table and the queue, fills `n` pending events, and settles the
/// database (VACUUM ANALYZE, CHECKPOINT) so every run starts alike.
async fn prepare_backlog(ctx: &Ctx, db_name: &str, shape: Shape, n: u64) -> anyhow::Result<()> {
    prepare_backlog_in(ctx, db_name, "public", shape, n, db::AGGREGATES).await
}

/// [`prepare_backlog`] of `schema.outbox`, its events spread over `aggregates`.
pub async fn prepare_backlog_in(
    ctx: &Ctx,
    db_name: &str,
    schema: &str,
    shape: Shape,
    n: u64,
    aggregates: u64,
) -> anyhow::Result<()> {
    let mut conn = db::connect_in(&ctx.url(db_name)?, schema).await?;
    db::truncate(&mut conn).await?;
    db::fill_pending(&mut conn, shape, 1, n, aggregates).await?;
    db::vacuum_analyze(&mut conn).await?;
    db::checkpoint(&mut conn).await?;
    let _ = conn.close().await;
    ctx.rabbit.purge().await?;
    Ok(())
}

fn drain_deadline(n: u64) -> Instant {
    Instant::now() + drain_budget(n)
}

/// How long a drain of `n` events may take. Generous: even 200 events/s
/// finishes; a stuck run fails instead of hanging.
pub fn drain_budget(n: u64) -> Duration {
    Duration::from_secs(60 + n / 200)
}

/// Waits for every message in the queue and no pending row. Returns the time it
/// was seen and the number of monitoring queries sent to the database.
async fn wait_drained(
    ctx: &Ctx,
    db_name: &str,
    schema: &str,
    n: u64,
    deadline: Instant,
) -> anyhow::Result<(Instant, i64)> {
    if !ctx.rabbit.wait_depth(n, deadline).await? {
        bail!("drain: the queue did not reach {n} messages in time");
    }
    let mut conn = db::connect_in(&ctx.url(db_name)?, schema).await?;
    let mut queries = 0i64;
    for _ in 0..1_000_000 {
        queries += 1;
        if db::pending(&mut conn).await? == 0 {
            let done = Instant::now();
            let _ = conn.close().await;
            return Ok((done, queries));
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(crate::POLL).await;
    }
    let _ = conn.close().await;
    bail!("drain: rows still pending at the deadline")
}

async fn drain_outboxd(ctx: &Ctx, n: u64, batch: u32, workers: u32) -> anyhow::Result<DrainRun> {
    let table = OutboxdTable {
        db_name: &ctx.db_outboxd,
        schema: "public",
        outbox: None,
        aggregates: db::AGGREGATES,
        tag: "drain",
        secure: None,
    };
    drain_outboxd_on(ctx, &table, n, batch, workers, drain_budget(n)).await
}

/// The table an outboxd drain runs on, and how outboxd is told of it.
pub struct OutboxdTable<'a> {
    pub db_name: &'a str,
    /// Where its `outbox` table is.
    pub schema: &'a str,
    /// outboxd's `--outbox` argument (`default=…`, the relay's outbox); `None`:
    /// outboxd's default, `public.outbox`.
    pub outbox: Option<String>,
    /// The backlog's events are spread over this many aggregates.
    pub aggregates: u64,
    /// Names the processes' logs.
    pub tag: &'a str,
    /// outboxd over TLS with a token, and the relay configured for it.
    pub secure: Option<&'a procs::Secure>,
}

/// A drain of `n` events by outboxd + outbox-relay from `table`, failed
/// when it takes longer than `budget`.
pub async fn drain_outboxd_on(
    ctx: &Ctx,
    table: &OutboxdTable<'_>,
    n: u64,
    batch: u32,
    workers: u32,
    budget: Duration,
) -> anyhow::Result<DrainRun> {
    let db_name = table.db_name;
    prepare_backlog_in(
        ctx,
        db_name,
        table.schema,
        Shape::Outboxd,
        n,
        table.aggregates,
    )
    .await?;
    let extra: Vec<&str> = table
        .outbox
        .as_deref()
        .map(|arg| vec!["--outbox", arg])
        .unwrap_or_default();
    let (outboxd, addr) = procs::start_outboxd_secured(
        &ctx.bins,
        &ctx.url(db_name)?,
        &ctx.log_dir,
        table.tag,
        &extra,
        table.secure,
    )
    .await?;
    ctx.record(&outboxd.cmdline).await;
    let x0 = db::xacts(&ctx.admin, db_name).await?;
    let started = Instant::now();
    let opts = RelayOpts {
        server: addr,
        amqp_url: &ctx.args.amqp_url,
        exchange: &ctx.rabbit.exchange,
        batch,
        concurrency: workers,
        secure: table.secure,
    };
    let footprint = Footprint::start(ctx).await?;
    let relay = procs::start_relay(&ctx.bins, &opts, &ctx.log_dir, table.tag)?;
    ctx.record(&relay.cmdline).await;
    let holdback = outboxd.metrics.map(HoldbackWatch::start);
    let waited = wait_drained(ctx, db_name, table.schema, n, Instant::now() + budget).await;
    let (machine, wal_per_event) = footprint.since(ctx, n).await?;
    let holdback_secs = match holdback {
        Some(watch) => watch.max().await,
        None => None,
    };
    let usage_outboxd = outboxd.usage();
    let usage_relay = relay.usage();
    let (batches, cycle) = outboxd_cycle(&outboxd, &relay).await;
    relay.stop(Duration::from_secs(10)).await?;
    outboxd.stop(Duration::from_secs(10)).await?;
    let (done, polls) = waited?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let x1 = db::xacts(&ctx.admin, db_name).await?;
    let secs = done.duration_since(started).as_secs_f64();
    Ok(DrainRun {
        events_per_sec: n as f64 / secs,
        secs,
        xacts_per_event: (x1 - x0 - polls).max(0) as f64 / n as f64,
        statements_per_event: None,
        outboxd: usage_outboxd,
        relay: usage_relay,
        machine,
        batches,
        wal_per_event,
        cycle,
        holdback_secs,
    })
}

/// Samples outboxd's `outbox_commit_order_holdback_seconds` every 500 ms
/// through a drain; its largest value (over every outbox), `None` when
/// outboxd never exported it.
struct HoldbackWatch {
    largest: Arc<std::sync::Mutex<Option<f64>>>,
    task: tokio_util::task::AbortOnDropHandle<()>,
}

impl HoldbackWatch {
    const METRIC: &str = "outbox_commit_order_holdback_seconds";

    fn start(metrics: std::net::SocketAddr) -> Self {
        let largest = Arc::new(std::sync::Mutex::new(None::<f64>));
        let seen = Arc::clone(&largest);
        let task = tokio::spawn(async move {
            for _ in 0..1_000_000 {
                if let Ok(scrape) = scrape::fetch(metrics).await
                    && let Some(v) = scrape::gauge_max(&scrape, Self::METRIC)
                    && let Ok(mut m) = seen.lock()
                {
                    *m = Some(m.map_or(v, |x: f64| x.max(v)));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self {
            largest,
            task: tokio_util::task::AbortOnDropHandle::new(task),
        }
    }

    async fn max(self) -> Option<f64> {
        self.task.abort();
        let _ = self.task.await;
        self.largest.lock().ok().and_then(|m| *m)
    }
}

/// The whole machine's CPU and the cluster's WAL, from one point of a drain.
struct Footprint {
    cpu: Snapshot,
    wal: f64,
}

impl Footprint {
    async fn start(ctx: &Ctx) -> anyhow::Result<Self> {
        Ok(Self {
            cpu: Snapshot::take()?,
            wal: db::wal_lsn(&ctx.admin).await?,
        })
    }

    /// CPU since the start, and WAL bytes per event of `n`.
    async fn since(&self, ctx: &Ctx, n: u64) -> anyhow::Result<(MachineCpu, f64)> {
        let cpu = Snapshot::take()?.since(&self.cpu);
        let wal = db::wal_lsn(&ctx.admin).await? - self.wal;
        Ok((cpu, wal / n as f64))
    }
}

/// outboxd's batch cycle from its own and the relay's metrics; `None` (and the
/// run still counts) when an endpoint does not answer.
async fn outboxd_cycle(outboxd: &procs::Proc, relay: &procs::Proc) -> (u64, Option<Cycle>) {
    let (Some(server), Some(client)) = (outboxd.metrics, relay.metrics) else {
        return (0, None);
    };
    let (Ok(server), Ok(client)) = (scrape::fetch(server).await, scrape::fetch(client).await)
    else {
        return (0, None);
    };
    let (_, batches) = scrape::histogram(&server, "outbox_claim_batch_size", "", "");
    (batches as u64, outboxd_parts(&server, &client, batches))
}

fn outboxd_parts(
    server: &prometheus_parse::Scrape,
    relay: &prometheus_parse::Scrape,
    batches: f64,
) -> Option<Cycle> {
    let rpc = "outbox_rpc_duration_seconds";
    let (_, ack_calls) = scrape::histogram(server, rpc, "method", "Ack");
    Some(Cycle::Outboxd {
        claim: scrape::mean_ms(server, rpc, "method", "ClaimBatch")?,
        confirm: scrape::mean_ms(relay, "outbox_relay_publish_duration_seconds", "", "")?,
        ack: scrape::mean_ms(server, rpc, "method", "Ack"),
        ack_calls_per_batch: ack_calls / batches.max(1.0),
    })
}

async fn drain_classic(ctx: &Ctx, n: u64, batch: u32, workers: u32) -> anyhow::Result<DrainRun> {
    let db_name = &ctx.db_classic;
    prepare_backlog(ctx, db_name, Shape::Classic, n).await?;
    let run = OwnDrain::begin(ctx, db_name, n).await?;
    let shared = Arc::new(classic::Shared::default());
    let _stop_guard = classic::StopGuard(Arc::clone(&shared));
    let handles = start_classic(
        ctx,
        db_name,
        batch,
        workers,
        Duration::from_millis(100),
        run.deadline,
        &shared,
    )
    .await?;
    run.finish(
        ctx,
        handles,
        "classic relay",
        &shared,
        |[select, publish, mark]| Cycle::Classic {
            select,
            publish,
            mark,
        },
    )
    .await
}

/// A drain by the harness's own workers (the classic relay): its
/// database, backlog, deadline, and what it started from.
struct OwnDrain<'a> {
    db_name: &'a str,
    n: u64,
    deadline: Instant,
    x0: i64,
    footprint: Footprint,
    started: Instant,
}

impl<'a> OwnDrain<'a> {
    /// Starts the clock and the counters, right before the workers start.
    async fn begin(ctx: &Ctx, db_name: &'a str, n: u64) -> anyhow::Result<Self> {
        Ok(Self {
            db_name,
            n,
            deadline: drain_deadline(n),
            x0: db::xacts(&ctx.admin, db_name).await?,
            footprint: Footprint::start(ctx).await?,
            started: Instant::now(),
        })
    }

    /// Waits until the backlog is out, stops the workers and gathers the
    /// run's figures; `cycle` names the three timed parts of a batch.
    async fn finish(
        self,
        ctx: &Ctx,
        workers: Workers,
        what: &str,
        shared: &classic::Shared,
        cycle: fn([f64; 3]) -> Cycle,
    ) -> anyhow::Result<DrainRun> {
        let waited = wait_drained(ctx, self.db_name, "public", self.n, self.deadline).await;
        let (machine, wal_per_event) = self.footprint.since(ctx, self.n).await?;
        shared.stop.store(true, Ordering::Relaxed);
        join_workers(workers, what).await?;
        let (done, polls) = waited?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let x1 = db::xacts(&ctx.admin, self.db_name).await?;
        let secs = done.duration_since(self.started).as_secs_f64();
        let n = self.n as f64;
        Ok(DrainRun {
            events_per_sec: n / secs,
            secs,
            xacts_per_event: (x1 - self.x0 - polls).max(0) as f64 / n,
            statements_per_event: Some(shared.statements.load(Ordering::Relaxed) as f64 / n),
            outboxd: Usage::default(),
            relay: Usage::default(),
            machine,
            batches: shared.sent_batches.load(Ordering::Relaxed),
            wal_per_event,
            cycle: shared.cycle_ms().map(cycle),
            holdback_secs: None,
        })
    }
}

type Workers = (
    Arc<lapin::Connection>,
    Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
);

async fn start_classic(
    ctx: &Ctx,
    db_name: &str,
    batch: u32,
    workers: u32,
    poll: Duration,
    deadline: Instant,
    shared: &Arc<classic::Shared>,
) -> anyhow::Result<Workers> {
    let amqp = Arc::new(rabbit::connect(&ctx.args.amqp_url, "outbox-bench classic relay").await?);
    let url = ctx.url(db_name)?;
    let mut handles = Vec::new();
    for _ in 0..workers {
        let db = db::connect_relay(&url).await?;
        let settings = classic::Settings {
            batch,
            poll,
            exchange: ctx.rabbit.exchange.clone(),
            deadline,
        };
        handles.push(classic::Worker::spawn(
            db,
            Arc::clone(&amqp),
            settings,
            Arc::clone(shared),
            classic::worker,
        ));
    }
    Ok((amqp, handles))
}

/// Joins the harness's own relay workers; `what` names them in errors.
async fn join_workers((amqp, handles): Workers, what: &str) -> anyhow::Result<()> {
    let mut first_err = None;
    for h in handles {
        match tokio::time::timeout(Duration::from_secs(30), h).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => {
                first_err.get_or_insert(err);
            }
            Ok(Err(join)) => {
                first_err.get_or_insert(anyhow::anyhow!("{what} worker panicked: {join}"));
            }
            Err(_) => {
                first_err.get_or_insert(anyhow::anyhow!("{what} worker did not stop in 30 s"));
            }
        }
    }
    let _ = amqp.close(200, "bye".into()).await;
    first_err.map_or(Ok(()), |e| Err(e.context(what.to_owned())))
}

// ---------------------------------------------------------------- producers

/// Producer connections committing one-event transactions as fast as they can.
pub const PRODUCERS: usize = 16;

/// What runs on the outbox table while the producers commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProducerMode {
    /// outboxd not running at all (it created and adopted the table earlier);
    /// the classic table with nothing running.
    Stopped,
    /// outboxd running with no relay, nothing claiming; the classic table
    /// with nothing running.
    Idle,
    /// A relay draining a backlog: outboxd + outbox-relay, against the classic
    /// relay draining the same kind of backlog at the same shape.
    Draining,
}

impl ProducerMode {
    pub const ALL: [Self; 3] = [Self::Stopped, Self::Idle, Self::Draining];

    pub fn label(self) -> &'static str {
        match self {
            Self::Stopped => "outboxd stopped",
            Self::Idle => "outboxd idle",
            Self::Draining => "draining",
        }
    }
}

#[derive(Debug, Clone)]
pub struct ProducerCase {
    pub mode: ProducerMode,
    /// Commits per second into the classic table, one per repetition.
    pub classic: Vec<f64>,
    /// Commits per second into outboxd's table, one per repetition, each
    /// measured next to `classic`'s of the same repetition.
    pub outboxd: Vec<f64>,
}

impl ProducerCase {
    /// outboxd's table against the classic table, per repetition.
    pub fn ratios(&self) -> Vec<f64> {
        self.outboxd
            .iter()
            .zip(&self.classic)
            .map(|(o, c)| o / c)
            .collect()
    }
}

fn table_label(design: Design) -> &'static str {
    match design {
        Design::Classic => "classic table",
        Design::Outboxd => "outboxd's table",
    }
}

/// Pending rows a draining case starts from: more than a relay drains in the
/// window, so it is still draining when the producers stop.
pub fn producer_backlog(plan: &Plan) -> u64 {
    25_000 * plan.producer_secs
}

async fn producers(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    // outboxd creates and adopts its table (and whatever it keeps beside it)
    // once, so "stopped" measures the table outboxd left, not a bare migration.
    ctx.progress
        .doing("producers: outboxd adopts its table, then stops");
    let (outboxd, _) =
        procs::start_outboxd(&ctx.bins, &ctx.url(&ctx.db_outboxd)?, &ctx.log_dir, "adopt").await?;
    outboxd.stop(Duration::from_secs(10)).await?;
    ctx.progress.done_step();
    let mut cases: Vec<ProducerCase> = ProducerMode::ALL
        .into_iter()
        .map(|mode| ProducerCase {
            mode,
            classic: Vec::new(),
            outboxd: Vec::new(),
        })
        .collect();
    for rep in 0..plan.reps {
        for case in &mut cases {
            let mode = case.mode;
            for design in Design::in_turn(rep) {
                ctx.progress.doing(format!(
                    "rep {}/{}: producers for {} s, {}, {}",
                    rep + 1,
                    plan.reps,
                    plan.producer_secs,
                    mode.label(),
                    table_label(design)
                ));
                let (rate, lasted) = retried(ctx, "producer run", || {
                    producer_run(ctx, plan, mode, design)
                })
                .await?;
                ctx.progress.log(format!(
                    "rep {} producers, {}, {}: {rate:.0} commits/s",
                    rep + 1,
                    mode.label(),
                    table_label(design)
                ));
                if !lasted {
                    results.notes.push(format!(
                        "Producers, {}, repetition {}: the {} drained its whole backlog of {} events before the \
                         producers stopped, so part of that window had no relay draining.",
                        mode.label(),
                        rep + 1,
                        design.label(),
                        producer_backlog(plan)
                    ));
                }
                match design {
                    Design::Classic => case.classic.push(rate),
                    Design::Outboxd => case.outboxd.push(rate),
                }
                ctx.progress.done_step();
            }
        }
    }
    results.producer = cases;
    Ok(())
}

/// One window of producers on `design`'s table with `mode` running beside
/// them: commits per second, and whether a draining relay still had pending
/// rows at the end (true when nothing drains).
async fn producer_run(
    ctx: &Ctx,
    plan: &Plan,
    mode: ProducerMode,
    design: Design,
) -> anyhow::Result<(f64, bool)> {
    let (db_name, shape) = match design {
        Design::Classic => (&ctx.db_classic, Shape::Classic),
        Design::Outboxd => (&ctx.db_outboxd, Shape::Outboxd),
    };
    let draining = mode == ProducerMode::Draining;
    prepare_backlog(
        ctx,
        db_name,
        shape,
        if draining { producer_backlog(plan) } else { 0 },
    )
    .await?;
    let url = ctx.url(db_name)?;
    let deadline = Instant::now() + Duration::from_secs(plan.producer_secs + 120);
    let shared = Arc::new(classic::Shared::default());
    let _stop_guard = classic::StopGuard(Arc::clone(&shared));
    let mut procs_running = Vec::new();
    let mut classic_workers = None;
    match (mode, design) {
        (ProducerMode::Stopped, _) | (ProducerMode::Idle, Design::Classic) => {}
        (ProducerMode::Idle | ProducerMode::Draining, Design::Outboxd) => {
            procs_running = start_outboxd_service(ctx, plan, &url, "producers", draining).await?;
        }
        (ProducerMode::Draining, Design::Classic) => {
            classic_workers = Some(
                start_classic(
                    ctx,
                    db_name,
                    plan.latency_batch,
                    plan.latency_workers,
                    Duration::from_millis(100),
                    deadline,
                    &shared,
                )
                .await?,
            );
        }
    }
    // The producers start once the relay publishes.
    if draining && !ctx.rabbit.wait_depth(1, deadline).await? {
        bail!("producers: the relay published nothing");
    }
    for p in &mut procs_running {
        p.check_alive()?;
    }
    let committed = commit_flat_out(&url, shape, plan.producer_secs).await;
    let lasted = if draining {
        let mut conn = db::connect(&url).await?;
        let left = db::pending(&mut conn).await;
        let _ = conn.close().await;
        left? > 0
    } else {
        true
    };
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(workers) = classic_workers {
        join_workers(workers, "classic relay").await?;
    }
    for p in procs_running {
        p.stop(Duration::from_secs(10)).await?;
    }
    ctx.rabbit.purge().await?;
    Ok((committed?, lasted))
}

/// How many one-event transactions [`PRODUCERS`] connections commit per
/// second into the table at `url` when they go as fast as they can for `secs`.
async fn commit_flat_out(url: &str, shape: Shape, secs: u64) -> anyhow::Result<f64> {
    let count = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::new();
    for _ in 0..PRODUCERS {
        conns.push(db::connect(url).await?);
    }
    let started = Instant::now();
    let stop_at = started + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for (j, mut conn) in conns.into_iter().enumerate() {
        let count = Arc::clone(&count);
        tasks.push(tokio::spawn(async move {
            for i in 0..100_000_000u64 {
                if Instant::now() >= stop_at {
                    break;
                }
                produce(&mut conn, shape, i * PRODUCERS as u64 + j as u64).await?;
                count.fetch_add(1, Ordering::Relaxed);
            }
            let _ = conn.close().await;
            anyhow::Ok(())
        }));
    }
    let first_err = first_failure(tasks).await;
    let elapsed = started.elapsed().as_secs_f64();
    if let Some(err) = first_err {
        return Err(err);
    }
    Ok(count.load(Ordering::Relaxed) as f64 / elapsed)
}

// ---------------------------------------------------------------- latency

async fn latency(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    let mut cases: Vec<LatencyCase> = std::iter::once(None)
        .chain(plan.poll_ms.iter().copied().map(Some))
        .map(|poll_ms| {
            Ok(LatencyCase {
                design: if poll_ms.is_some() {
                    Design::Classic
                } else {
                    Design::Outboxd
                },
                poll_ms,
                runs: Vec::new(),
                merged: Histogram::new_with_bounds(1, 600_000_000, 3).context("histogram")?,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let count = cases.len();
    for rep in 0..plan.reps {
        for k in 0..count {
            // Rotate the order each repetition.
            let case = &mut cases[(k + rep) % count];
            ctx.progress.doing(format!(
                "rep {}/{}: {} events/s for {} s, {}",
                rep + 1,
                plan.reps,
                plan.rate,
                plan.latency_secs,
                case.label()
            ));
            let (design, poll_ms) = (case.design, case.poll_ms);
            let (run, hist) = retried(ctx, "latency run", || {
                latency_run(ctx, plan, design, poll_ms)
            })
            .await?;
            ctx.progress.log(format!(
                "rep {} latency {}: p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms at {:.0}/s",
                rep + 1,
                case.label(),
                run.p50_ms,
                run.p99_ms,
                run.max_ms,
                run.achieved_rate
            ));
            case.merged.add(&hist).context("merging histograms")?;
            case.runs.push(run);
            ctx.progress.done_step();
        }
    }
    results.latency = cases;
    Ok(())
}

const UNSET: u64 = u64::MAX;

/// The producer's statement: one event, its own transaction.
fn insert_sql(shape: Shape) -> &'static str {
    match shape {
        Shape::Outboxd => {
            "INSERT INTO outbox (id, aggregate_id, event_type, payload) \
             VALUES ($1, $2, 'order.paid', $3::jsonb)"
        }
        Shape::Classic => {
            "INSERT INTO outbox (id, aggregate_id, event_type, payload) \
             VALUES ($1, $2::uuid, 'order.paid', $3::jsonb)"
        }
    }
}

/// Commits event number `n` in a transaction of its own, as a producer does.
async fn produce(conn: &mut PgConnection, shape: Shape, n: u64) -> anyhow::Result<()> {
    sqlx::query(insert_sql(shape))
        .bind(uuid::Uuid::new_v4())
        .bind(uuid::Uuid::from_u128(u128::from(n % 5000) + 1).to_string())
        .bind(db::payload(n))
        .execute(conn)
        .await
        .context("producer INSERT")?;
    Ok(())
}

/// Waits for every producer task; the first failure, if any.
async fn first_failure(
    tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
) -> Option<anyhow::Error> {
    let mut first = None;
    for task in tasks {
        let failure = match task.await {
            Ok(Ok(())) => continue,
            Ok(Err(err)) => err,
            Err(join) => anyhow::anyhow!("producer panicked: {join}"),
        };
        first.get_or_insert(failure);
    }
    first
}

async fn latency_run(
    ctx: &Ctx,
    plan: &Plan,
    design: Design,
    poll_ms: Option<u64>,
) -> anyhow::Result<(LatencyRun, Histogram<u64>)> {
    let (db_name, shape) = match design {
        Design::Classic => (&ctx.db_classic, Shape::Classic),
        Design::Outboxd => (&ctx.db_outboxd, Shape::Outboxd),
    };
    prepare_backlog(ctx, db_name, shape, 0).await?;
    let total = u64::from(plan.rate) * plan.latency_secs;
    let total_usize = usize::try_from(total)?;
    let committed: Arc<Vec<AtomicU64>> =
        Arc::new((0..total_usize).map(|_| AtomicU64::new(UNSET)).collect());
    let delivered: Arc<Vec<AtomicU64>> =
        Arc::new((0..total_usize).map(|_| AtomicU64::new(UNSET)).collect());
    // A producer that cannot keep the schedule stops after this; what it
    // committed is still measured, and the achieved rate is reported.
    let produce_for = plan.latency_secs + (plan.latency_secs / 2).max(10);
    let produce_until = Instant::now() + Duration::from_secs(1 + produce_for);
    let hard_stop = produce_until + Duration::from_secs(40);

    // The design under test.
    let mut procs_running = Vec::new();
    let mut classic_workers = None;
    let shared = Arc::new(classic::Shared::default());
    let _stop_guard = classic::StopGuard(Arc::clone(&shared));
    match design {
        Design::Outboxd => {
            procs_running =
                start_outboxd_service(ctx, plan, &ctx.url(db_name)?, "latency", true).await?;
        }
        Design::Classic => {
            let poll = Duration::from_millis(poll_ms.unwrap_or(100));
            classic_workers = Some(
                start_classic(
                    ctx,
                    db_name,
                    plan.latency_batch,
                    plan.latency_workers,
                    poll,
                    hard_stop,
                    &shared,
                )
                .await?,
            );
        }
    }

    // The consumer.
    let consumer_conn = rabbit::connect(&ctx.args.amqp_url, "outbox-bench consumer").await?;
    let consumer_ch = consumer_conn
        .create_channel()
        .await
        .context("consumer channel")?;
    let mut consumer = consumer_ch
        .basic_consume(
            ctx.rabbit.queue.as_str().into(),
            "outbox-bench".into(),
            BasicConsumeOptions {
                no_ack: true,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .context("basic.consume")?;
    // Let the relay connect and start its long-polls before the clock starts.
    tokio::time::sleep(Duration::from_secs(1)).await;
    for p in &mut procs_running {
        p.check_alive()?;
    }
    let t0 = std::time::Instant::now();
    let received = Arc::new(AtomicU64::new(0));
    let consume = {
        let delivered = Arc::clone(&delivered);
        let received = Arc::clone(&received);
        tokio_util::task::AbortOnDropHandle::new(tokio::spawn(async move {
            for _ in 0..(total * 2 + 10) {
                let next = tokio::time::timeout_at(hard_stop, consumer.next()).await;
                let Ok(Some(Ok(delivery))) = next else { break };
                let at = u64::try_from(t0.elapsed().as_micros()).unwrap_or(UNSET - 1);
                let n = serde_json::from_slice::<serde_json::Value>(&delivery.data)
                    .ok()
                    .and_then(|v| v.get("n").and_then(serde_json::Value::as_u64));
                if let Some(slot) = n.and_then(|n| delivered.get(usize::try_from(n).ok()?)) {
                    // First delivery counts (at-least-once may repeat).
                    let _ = slot.compare_exchange(UNSET, at, Ordering::Relaxed, Ordering::Relaxed);
                    if received.fetch_add(1, Ordering::Relaxed) + 1 >= total {
                        break;
                    }
                }
            }
        }))
    };

    // The producer: one event per transaction, on a fixed schedule, spread
    // over a few connections so one slow commit does not delay the next.
    let connections = PRODUCERS as u64;
    let url = ctx.url(db_name)?;
    let mut producers = Vec::new();
    let interval_us = 1_000_000.0 / f64::from(plan.rate);
    for j in 0..connections {
        let mut conn = db::connect(&url).await?;
        let committed = Arc::clone(&committed);
        producers.push(tokio::spawn(async move {
            let mut i = j;
            while i < total {
                let due = t0 + Duration::from_micros((i as f64 * interval_us) as u64);
                tokio::time::sleep_until(due.into()).await;
                if Instant::now() >= produce_until {
                    break;
                }
                produce(&mut conn, shape, i).await?;
                let at = u64::try_from(t0.elapsed().as_micros()).unwrap_or(UNSET - 1);
                committed[usize::try_from(i)?].store(at, Ordering::Relaxed);
                i += connections;
            }
            let _ = conn.close().await;
            anyhow::Ok(())
        }));
    }
    let produce_err = first_failure(producers).await;
    // Everything committed should arrive within a few poll intervals.
    let settle_by = Instant::now() + Duration::from_secs(20);
    for _ in 0..10_000 {
        if received.load(Ordering::Relaxed) >= total || Instant::now() >= settle_by {
            break;
        }
        tokio::time::sleep(crate::POLL).await;
    }
    consume.abort();
    let _ = consumer_conn.close(200, "bye".into()).await;
    shared.stop.store(true, Ordering::Relaxed);
    if let Some(workers) = classic_workers {
        join_workers(workers, "classic relay").await?;
    }
    for p in procs_running {
        p.stop(Duration::from_secs(10)).await?;
    }
    if let Some(err) = produce_err {
        return Err(err);
    }
    let stages = match design {
        Design::Outboxd => {
            let mut conn = db::connect(&url).await?;
            let stages = db::lease_stages(&mut conn).await;
            let _ = conn.close().await;
            stages?
        }
        Design::Classic => None,
    };

    // Commit → delivery, skipping the first second (connections warming up).
    let mut hist = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).context("histogram")?;
    let warmup = u64::from(plan.rate);
    let mut first_commit = UNSET;
    let mut last_commit = 0;
    let mut sent = 0u64;
    let mut got = 0u64;
    for i in 0..total_usize {
        let c = committed[i].load(Ordering::Relaxed);
        let d = delivered[i].load(Ordering::Relaxed);
        if c == UNSET {
            continue;
        }
        sent += 1;
        first_commit = first_commit.min(c);
        last_commit = last_commit.max(c);
        if d == UNSET {
            continue;
        }
        got += 1;
        if (i as u64) < warmup {
            continue;
        }
        // The broker can deliver before the producer sees its COMMIT return.
        hist.saturating_record(d.saturating_sub(c).max(1));
    }
    if got < sent {
        bail!(
            "latency: {} of {sent} committed events never arrived ({})",
            sent - got,
            design.label()
        );
    }
    let span_s = (last_commit.saturating_sub(first_commit)) as f64 / 1e6;
    let ms = |v: u64| v as f64 / 1000.0;
    Ok((
        LatencyRun {
            p50_ms: ms(hist.value_at_quantile(0.50)),
            p99_ms: ms(hist.value_at_quantile(0.99)),
            max_ms: ms(hist.max()),
            achieved_rate: if span_s > 0.0 {
                sent as f64 / span_s
            } else {
                0.0
            },
            sent,
            delivered: got,
            stages,
        },
        hist,
    ))
}

// ---------------------------------------------------------------- scale

/// The schema of the empty table the scale scenario claims from beside every
/// point, and its outbox name in outboxd.
const EMPTY_SCHEMA: &str = "empty";

async fn scale(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    let db_name = &ctx.db_scale;
    let url = ctx.url(db_name)?;
    let mut conn = db::connect(&url).await?;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE SCHEMA IF NOT EXISTS {EMPTY_SCHEMA}"
    )))
    .execute(&mut conn)
    .await
    .context("creating the empty table's schema")?;
    let _ = conn.close().await;
    // One outboxd serves both tables (it creates the empty one at start), so
    // the two differ only in what they hold.
    let empty_outbox = format!("{EMPTY_SCHEMA}={EMPTY_SCHEMA}.outbox");
    let (outboxd, addr) = procs::start_outboxd_with(
        &ctx.bins,
        &url,
        &ctx.log_dir,
        "scale",
        &[
            "--outbox",
            "default=public.outbox",
            "--outbox",
            &empty_outbox,
            // The claim cursor's gauge, read before each EXPLAIN, fresh.
            "--metrics-interval",
            crate::claims::GAUGE_INTERVAL,
        ],
    )
    .await?;
    ctx.record(&outboxd.cmdline).await;
    let outcome = scale_points(ctx, plan, &url, addr, outboxd.metrics).await;
    outboxd.stop(Duration::from_secs(10)).await?;
    results.scale = outcome?;
    Ok(())
}

/// The two tables of a point: `public.outbox` with the history (and leases),
/// and the empty table with only the same number of pending rows.
struct ScaleTables {
    history: sqlx::PgConnection,
    empty: sqlx::PgConnection,
}

impl ScaleTables {
    /// Fresh pending rows in both tables (plus `leases` rows leased for 15
    /// minutes ahead of them in the history table), then one CHECKPOINT:
    /// every point, and both tables of it, start from the same clean state.
    async fn reset(
        &mut self,
        client: &mut OutboxServiceClient<tonic::transport::Channel>,
        pending: u64,
        leases: u64,
    ) -> anyhow::Result<()> {
        reset_pending(&mut self.history, pending + leases).await?;
        if leases > 0 {
            // Taken through outboxd's ClaimBatch by another worker (#48), not
            // written into the lease table: outboxd keeps a claim cursor in
            // memory, and leases it never handed out would not be the state a
            // real claim meets.
            crate::claims::hold_leases(client, "default", leases).await?;
            db::vacuum_analyze(&mut self.history).await?;
        }
        reset_pending(&mut self.empty, pending).await?;
        db::checkpoint(&mut self.history).await
    }
}

async fn scale_points(
    ctx: &Ctx,
    plan: &Plan,
    url: &str,
    addr: std::net::SocketAddr,
    metrics: Option<std::net::SocketAddr>,
) -> anyhow::Result<Vec<ScalePoint>> {
    let mut client = OutboxServiceClient::connect(format!("http://{addr}"))
        .await
        .context("connecting to outboxd")?
        .max_decoding_message_size(outboxd::client::MAX_RESPONSE_BYTES);
    let mut tables = ScaleTables {
        history: db::connect(url).await?,
        empty: db::connect_in(url, EMPTY_SCHEMA).await?,
    };
    let mut points = Vec::new();
    let mut history_now = 0u64;
    let last = plan.history.len() - 1;
    for (hi, &history) in plan.history.iter().enumerate() {
        if history > history_now {
            ctx.progress.doing(format!(
                "scale: filling published history to {history} rows"
            ));
            db::fill_history(
                &mut tables.history,
                history_now + 1,
                history - history_now,
                db::AGGREGATES,
            )
            .await?;
            history_now = history;
        }
        let mut cases: Vec<(u64, u64)> = plan.pending.iter().map(|&p| (p, 0)).collect();
        if hi == last {
            cases.push((plan.pending[0], plan.leases));
        }
        for (pending, leases) in cases {
            ctx.progress.doing(if leases == 0 {
                format!("scale: claims with {history} history, {pending} pending")
            } else {
                format!("scale: claims behind {leases} leases in flight, {history} history")
            });
            tables.reset(&mut client, pending, leases).await?;
            let point = measure_claims(
                plan,
                &mut client,
                metrics,
                &mut tables,
                history,
                pending,
                leases,
            )
            .await?;
            ctx.progress.log(format!(
                "scale h{history} p{pending} leases {leases}: claim median {:.2} ms \
                 (empty table {:.2} ms, {:.2}×), sql {:.2} ms (empty {:.2} ms)",
                crate::stats::Spread::of(&point.claim_ms).median,
                crate::stats::Spread::of(&point.empty_ms).median,
                point.vs_empty(),
                point.sql_ms,
                point.empty_sql_ms,
            ));
            points.push(point);
            ctx.progress.done_step();
        }
    }
    let _ = tables.history.close().await;
    let _ = tables.empty.close().await;
    Ok(points)
}

/// Deletes every lease and every unpublished row, and inserts `pending` fresh ones.
async fn reset_pending(conn: &mut sqlx::PgConnection, pending: u64) -> anyhow::Result<()> {
    if db::has_leases(conn).await? {
        sqlx::query("DELETE FROM outbox_leases")
            .execute(&mut *conn)
            .await
            .context("clearing leases")?;
    }
    sqlx::query("DELETE FROM outbox WHERE published_at IS NULL")
        .execute(&mut *conn)
        .await
        .context("clearing pending rows")?;
    db::fill_pending(conn, Shape::Outboxd, 1, pending, db::AGGREGATES).await?;
    db::vacuum_analyze(conn).await?;
    Ok(())
}

/// A statement under `EXPLAIN (ANALYZE, BUFFERS, WAL)`, rolled back: its plan
/// and execution time, milliseconds.
pub async fn explain(conn: &mut sqlx::PgConnection, sql: &str) -> anyhow::Result<(String, f64)> {
    let mut tx = conn.begin().await.context("BEGIN")?;
    let lines: Vec<String> = sqlx::query_scalar(AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, WAL) {sql}"
    )))
    .fetch_all(&mut *tx)
    .await
    .context("EXPLAIN ANALYZE of the claim")?;
    tx.rollback().await.context("ROLLBACK")?;
    let ms = lines
        .iter()
        .find_map(|l| l.trim().strip_prefix("Execution Time:"))
        .and_then(|v| v.trim().trim_end_matches("ms").trim().parse::<f64>().ok())
        .unwrap_or(f64::NAN);
    Ok((lines.join("\n"), ms))
}

/// outboxd's claim statement for `schema.outbox`, its names quoted as outboxd
/// quotes them and its parameters bound to a claim of 100 for 60 s from the
/// start of the table (no cursor).
pub fn claim_sql(schema: &str) -> String {
    claim_sql_at(schema, 0, None)
}

/// [`claim_sql`] from claim cursor `cursor`, used while the table's epoch is
/// `epoch` (as outboxd binds its own cursor and epoch).
pub fn claim_sql_at(schema: &str, cursor: i64, epoch: Option<uuid::Uuid>) -> String {
    bind_claim(
        &CLAIM_SQL
            // An unordered outbox's claim (see outboxd's `statements.rs`).
            .replace("{expired_order}", "")
            .replace("{fresh_order}", "")
            .replace("{lease_aggregate}", "NULL"),
        schema,
        cursor,
        epoch,
    )
}

/// A claim statement (`sql`, outboxd's with its ordering placeholders filled)
/// for `schema.outbox`, bound as [`claim_sql`] binds it, from `cursor` under
/// `epoch` (`None`: an epoch no table holds, so the claim starts from the
/// beginning). `$9`, the commit-order guard's bound, lets every row through,
/// as it does once no writer that started before the claim is still open.
pub fn bind_claim(sql: &str, schema: &str, cursor: i64, epoch: Option<uuid::Uuid>) -> String {
    let epoch = epoch.map_or_else(|| "NULL".to_owned(), |e| format!("'{e}'"));
    let values = [
        "100".to_owned(),
        "'00000000-0000-0000-0000-00000000bbbb'".to_owned(),
        "'60 seconds'".to_owned(),
        "'outbox-bench'".to_owned(),
        "10".to_owned(),
        "3145728".to_owned(),
        "8388608".to_owned(),
        "8388608".to_owned(),
        i64::MAX.to_string(),
        cursor.to_string(),
        epoch,
    ];
    let mut out = sql
        .replace("{table}", &format!("\"{schema}\".\"outbox\""))
        .replace("{leases}", &format!("\"{schema}\".\"{}\"", db::LEASES))
        .replace("{epoch}", &format!("\"{schema}\".\"{}\"", db::EPOCH));
    // Highest first: `$1` is a prefix of `$10` and `$11`.
    for (i, value) in values.iter().enumerate().rev() {
        out = out.replace(&format!("${}", i + 1), value);
    }
    out
}

/// One timed `ClaimBatch(100)` from `outbox` and its (untimed) ack.
pub async fn claim_once(
    client: &mut OutboxServiceClient<tonic::transport::Channel>,
    outbox: &str,
) -> anyhow::Result<f64> {
    let (elapsed, got) = claim_counted(client, outbox).await?;
    if got != 100 {
        bail!("scale: a claim returned {got} messages, not 100");
    }
    Ok(elapsed)
}

/// One timed `ClaimBatch(100)` from `outbox` and its (untimed) ack: the
/// milliseconds it took and the messages it returned.
pub async fn claim_counted(
    client: &mut OutboxServiceClient<tonic::transport::Channel>,
    outbox: &str,
) -> anyhow::Result<(f64, usize)> {
    let request = pb::ClaimBatchRequest {
        outbox: outbox.to_owned(),
        worker_id: "outbox-bench".into(),
        max_messages: 100,
        lease_duration: Some(prost_types::Duration {
            seconds: 60,
            nanos: 0,
        }),
        wait: None,
        acks: Vec::new(),
        max_response_bytes: 0,
    };
    let started = Instant::now();
    let batch = tokio::time::timeout(Duration::from_secs(30), client.claim_batch(request))
        .await
        .context("ClaimBatch timed out")?
        .context("ClaimBatch")?
        .into_inner();
    let elapsed = started.elapsed().as_secs_f64() * 1000.0;
    if batch.messages.is_empty() {
        return Ok((elapsed, 0));
    }
    let ack = pb::AckRequest {
        outbox: outbox.to_owned(),
        lease_id: batch.lease_id.clone(),
        message_ids: batch.messages.iter().map(|m| m.id.clone()).collect(),
    };
    tokio::time::timeout(Duration::from_secs(30), client.ack(ack))
        .await
        .context("Ack timed out")?
        .context("Ack")?;
    Ok((elapsed, batch.messages.len()))
}

/// Claims from the point's table and from the empty table in turn (the order
/// alternating), so both see the machine in the same state: on a shared host
/// a baseline measured minutes earlier differs by more than history does.
async fn measure_claims(
    plan: &Plan,
    client: &mut OutboxServiceClient<tonic::transport::Channel>,
    metrics: Option<std::net::SocketAddr>,
    tables: &mut ScaleTables,
    history: u64,
    pending: u64,
    leases: u64,
) -> anyhow::Result<ScalePoint> {
    // The first few warm the connections and caches, and bring outboxd's
    // claim cursor to where the timed claims find it.
    crate::claims::in_turn(client, ["default", EMPTY_SCHEMA], 3).await?;
    // The statement outboxd runs: its cursor and the table's epoch bound in.
    tokio::time::sleep(crate::claims::GAUGE_SETTLE).await;
    let (plan_text, _, sql_ms, _) =
        crate::claims::explain_bound(&mut tables.history, metrics, "public", "default").await?;
    let (_, _, empty_sql_ms, _) =
        crate::claims::explain_bound(&mut tables.empty, metrics, EMPTY_SCHEMA, EMPTY_SCHEMA)
            .await?;
    let [claim_ms, empty_ms] =
        crate::claims::in_turn(client, ["default", EMPTY_SCHEMA], plan.claims).await?;
    Ok(ScalePoint {
        history,
        pending,
        leases,
        claim_ms,
        empty_ms,
        sql_ms,
        empty_sql_ms,
        plan: plan_text,
    })
}

/// outboxd on `url` and, with `relay`, an `outbox-relay` at the latency
/// scenario's shape draining it: the processes to stop afterwards, the relay
/// first.
async fn start_outboxd_service(
    ctx: &Ctx,
    plan: &Plan,
    url: &str,
    label: &str,
    relay: bool,
) -> anyhow::Result<Vec<procs::Proc>> {
    let (outboxd, addr) = procs::start_outboxd(&ctx.bins, url, &ctx.log_dir, label).await?;
    ctx.record(&outboxd.cmdline).await;
    let mut running = Vec::new();
    if relay {
        let opts = RelayOpts {
            server: addr,
            amqp_url: &ctx.args.amqp_url,
            exchange: &ctx.rabbit.exchange,
            batch: plan.latency_batch,
            concurrency: plan.latency_workers,
            secure: None,
        };
        let relay = procs::start_relay(&ctx.bins, &opts, &ctx.log_dir, label)?;
        ctx.record(&relay.cmdline).await;
        running.push(relay);
    }
    running.push(outboxd);
    Ok(running)
}
