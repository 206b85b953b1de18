//! outbox-bench: outboxd + outbox-relay against the classic relay, measured
//! the same way in one run, designs alternating across repetitions, and judged
//! by the targets of issue #32 as ratios to the classic relay: WAL bytes and
//! PostgreSQL CPU per event in the drain, producer commits/s into the outbox
//! table with outboxd stopped, idle and draining, the drain's events/s, latency
//! under steady load, and the claim with history; and the per-aggregate order
//! of issue #33 as ratios to the unordered outbox: the ordered drain, the
//! ordered claim with history, and the rate of one hot aggregate; and what a
//! claim costs the database of issue #48 (`claims.rs`): PostgreSQL CPU and
//! WAL per event of workers that claim and ack at once against the classic
//! relay's, and a claim behind leases other workers hold. Writes
//! `bench/results/REPORT.md` and PNG charts.
//!
//! Run from the workspace root after
//! `cargo build --release --workspace --bins`:
//!
//! ```sh
//! target/release/outbox-bench            # full run
//! target/release/outbox-bench --quick    # harness check (< 3 min), targets not evaluated
//! ```
#![allow(clippy::print_stdout)]

mod charts;
mod claims;
mod classic;
mod cpu;
mod db;
mod machine;
mod ordering;
mod procs;
mod progress;
mod rabbit;
mod report;
mod scenarios;
mod scrape;
mod security;
mod stats;

use std::{path::PathBuf, process::ExitCode, time::Duration};

use anyhow::Context as _;
use clap::Parser;

/// Benchmark outboxd + outbox-relay against the classic relay. Uses the local PostgreSQL and RabbitMQ; creates and drops its
/// own databases, exchange and queue.
#[derive(Debug, Clone, Parser)]
#[command(name = "outbox-bench", version)]
pub struct Args {
    /// Small sizes, one repetition, no targets evaluated: a harness check for CI (< 3 min).
    #[arg(long)]
    pub quick: bool,

    /// Scenarios to run (comma-separated): drain, producers, latency, scale, ordered-drain, ordered-claim,
    /// hot-aggregate (`ordering` stands for these three), secure-pairs, secure-drain (`security`
    /// stands for these two), claim-drain, held-leases (issue #48's).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "drain,producers,latency,scale,ordered-drain,ordered-claim,hot-aggregate,secure-pairs,secure-drain,claim-drain,held-leases"
    )]
    pub scenarios: Vec<String>,

    /// Repetitions of each measured case; designs alternate across them.
    #[arg(long)]
    pub reps: Option<usize>,

    /// Drain: pre-filled backlog size.
    #[arg(long)]
    pub events: Option<u64>,

    /// Drain: batch sizes (comma-separated), used by both designs.
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    pub batch_sizes: Vec<u32>,

    /// Drain: worker counts (classic workers = relay --concurrency slots).
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub workers: Vec<u32>,

    /// Producers: seconds each window of 16 connections committing flat out lasts.
    #[arg(long)]
    pub producer_secs: Option<u64>,

    /// Latency: producer rate, events per second, one event per transaction.
    #[arg(long, default_value_t = 2000)]
    pub rate: u32,

    /// Latency: measured seconds of steady load per run.
    #[arg(long)]
    pub latency_secs: Option<u64>,

    /// Latency: classic relay poll intervals in milliseconds (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "100,500")]
    pub poll_ms: Vec<u64>,

    /// Latency, and the producers' draining relay: batch size used by both designs.
    #[arg(long, default_value_t = 100)]
    pub latency_batch: u32,

    /// Latency, and the producers' draining relay: classic workers = relay --concurrency slots.
    #[arg(long, default_value_t = 4)]
    pub latency_workers: u32,

    /// Scale: published history sizes (comma-separated; each point is measured against the empty table
    /// claimed beside it, and the leases point comes at the largest).
    #[arg(long, value_delimiter = ',')]
    pub history: Option<Vec<u64>>,

    /// Scale: pending backlog sizes (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub pending: Option<Vec<u64>>,

    /// Scale: leases in flight ahead of the pending rows (in outboxd's lease table).
    #[arg(long)]
    pub leases: Option<u64>,

    /// Scale: timed claims of 100 per point.
    #[arg(long)]
    pub claims: Option<usize>,

    /// Ordered drain, ordered claim: aggregates the events are spread over (`aggregate_id`s).
    #[arg(long)]
    pub aggregates: Option<u64>,

    /// Ordered claim: published history rows.
    #[arg(long)]
    pub ordered_history: Option<u64>,

    /// Ordered claim: pending events (over `--aggregates` aggregates).
    #[arg(long)]
    pub ordered_pending: Option<u64>,

    /// Ordered claim: timed claims of 100 per outbox (ordered and unordered, in turn).
    #[arg(long)]
    pub ordered_claims: Option<usize>,

    /// Hot aggregate: events of the one aggregate drained.
    #[arg(long)]
    pub hot_events: Option<u64>,

    /// Security: timed claim→ack pairs per batch size and per side
    /// (plaintext, TLS + token).
    #[arg(long)]
    pub secure_claims: Option<usize>,

    /// Claim-drain: pre-filled backlog per drain (each design drains it on a
    /// fresh table, then as much again beside the retained rows).
    #[arg(long)]
    pub claim_events: Option<u64>,

    /// Claim-drain: shapes as BATCHxWORKERS (comma-separated); 100x4 is the
    /// shape of the CPU target.
    #[arg(long, value_delimiter = ',', value_parser = parse_shape)]
    pub claim_shapes: Option<Vec<(u32, u32)>>,

    /// Claim-drain: VACUUM ANALYZE both designs' tables before each drain
    /// (`false`: ANALYZE only, the dead row versions left in place).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub claim_vacuum: bool,

    /// Claim-drain, an experiment: set this fillfactor on outboxd's table
    /// before its drains (outboxd keeps a table's own fillfactor), to see
    /// what its page fill does to the WAL. Unset: outboxd's own.
    #[arg(long, value_parser = clap::value_parser!(u8).range(10..=100))]
    pub claim_fillfactor: Option<u8>,

    /// Held-leases: leases held by another worker at each point (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub held: Option<Vec<u64>>,

    /// Held-leases: timed claims of 100 per point (and as many beside them with none held).
    #[arg(long)]
    pub held_claims: Option<usize>,

    /// Directory holding the `outboxd` and `outbox-relay` binaries.
    #[arg(long, default_value = "target/release")]
    pub bin_dir: PathBuf,

    /// PostgreSQL server (any database; the bench creates its own). Loopback only.
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/postgres")]
    pub database_url: String,

    /// RabbitMQ. Loopback only.
    #[arg(long, default_value = "amqp://guest:guest@127.0.0.1:5672/%2f")]
    pub amqp_url: String,

    /// Where REPORT.md and the charts go.
    #[arg(long, default_value = "bench/results")]
    pub out: PathBuf,

    /// Where process logs go (kept out of the results).
    #[arg(long, default_value = "target/bench-logs")]
    pub log_dir: PathBuf,
}

/// The sizes actually used, after `--quick` and explicit overrides.
#[derive(Debug, Clone)]
pub struct Plan {
    pub quick: bool,
    pub drain: bool,
    pub producers: bool,
    pub latency: bool,
    pub scale: bool,
    pub ordered_drain: bool,
    pub ordered_claim: bool,
    pub hot: bool,
    pub reps: usize,
    pub events: u64,
    pub batch_sizes: Vec<u32>,
    pub workers: Vec<u32>,
    pub producer_secs: u64,
    pub rate: u32,
    pub latency_secs: u64,
    pub poll_ms: Vec<u64>,
    pub latency_batch: u32,
    pub latency_workers: u32,
    pub history: Vec<u64>,
    pub pending: Vec<u64>,
    pub leases: u64,
    pub claims: usize,
    pub aggregates: u64,
    pub ordered_history: u64,
    pub ordered_pending: u64,
    pub ordered_claims: usize,
    pub hot_events: u64,
    pub secure_pairs: bool,
    pub secure_drain: bool,
    pub secure_claims: usize,
    pub claim_drain: bool,
    pub held_leases: bool,
    pub claim_events: u64,
    pub claim_shapes: Vec<(u32, u32)>,
    pub claim_vacuum: bool,
    pub claim_fillfactor: Option<u8>,
    pub held: Vec<u64>,
    pub held_claims: usize,
}

/// `100x4`: batch 100, 4 workers.
fn parse_shape(s: &str) -> Result<(u32, u32), String> {
    let (b, w) = s
        .split_once(['x', '×'])
        .ok_or_else(|| format!("{s:?} is not BATCHxWORKERS, e.g. 100x4"))?;
    let b: u32 = b
        .trim()
        .parse()
        .map_err(|_| format!("bad batch in {s:?}"))?;
    let w: u32 = w
        .trim()
        .parse()
        .map_err(|_| format!("bad worker count in {s:?}"))?;
    Ok((b, w))
}

/// The scenarios `--scenarios` accepts; `ordering` stands for the three
/// ordered ones, `security` for the two secure ones.
const SCENARIOS: [&str; 11] = [
    "drain",
    "producers",
    "latency",
    "scale",
    "ordered-drain",
    "ordered-claim",
    "hot-aggregate",
    "secure-pairs",
    "secure-drain",
    "claim-drain",
    "held-leases",
];

impl Plan {
    fn from_args(a: &Args) -> anyhow::Result<Self> {
        let q = a.quick;
        let has = |s: &str| {
            a.scenarios.iter().any(|x| {
                x.trim() == s
                    || (x.trim() == "ordering" && SCENARIOS[4..7].contains(&s))
                    || (x.trim() == "security" && SCENARIOS[7..9].contains(&s))
            })
        };
        for s in &a.scenarios {
            anyhow::ensure!(
                SCENARIOS.contains(&s.trim()) || ["ordering", "security"].contains(&s.trim()),
                "unknown scenario {s:?} ({}, or ordering, security)",
                SCENARIOS.join(", ")
            );
        }
        let plan = Self {
            quick: q,
            drain: has("drain"),
            producers: has("producers"),
            latency: has("latency"),
            scale: has("scale"),
            ordered_drain: has("ordered-drain"),
            ordered_claim: has("ordered-claim"),
            hot: has("hot-aggregate"),
            secure_pairs: has("secure-pairs"),
            secure_drain: has("secure-drain"),
            secure_claims: a.secure_claims.unwrap_or(if q { 20 } else { 500 }),
            reps: a.reps.unwrap_or(if q { 1 } else { 3 }),
            events: a.events.unwrap_or(if q { 4_000 } else { 200_000 }),
            batch_sizes: if q && a.batch_sizes == [100, 1000] {
                vec![100]
            } else {
                a.batch_sizes.clone()
            },
            workers: if q && a.workers == [1, 4] {
                vec![4]
            } else {
                a.workers.clone()
            },
            producer_secs: a.producer_secs.unwrap_or(if q { 2 } else { 10 }),
            rate: if q && a.rate == 2000 { 500 } else { a.rate },
            latency_secs: a.latency_secs.unwrap_or(if q { 4 } else { 30 }),
            poll_ms: if q && a.poll_ms == [100, 500] {
                vec![100]
            } else {
                a.poll_ms.clone()
            },
            latency_batch: a.latency_batch,
            latency_workers: a.latency_workers,
            history: a
                .history
                .clone()
                .unwrap_or_else(|| if q { vec![20_000] } else { vec![5_000_000] }),
            pending: a.pending.clone().unwrap_or_else(|| {
                if q {
                    vec![1_000]
                } else {
                    vec![10_000, 100_000]
                }
            }),
            leases: a.leases.unwrap_or(if q { 1_000 } else { 10_000 }),
            claims: a.claims.unwrap_or(if q { 5 } else { 30 }),
            aggregates: a.aggregates.unwrap_or(if q { 200 } else { 10_000 }),
            ordered_history: a
                .ordered_history
                .unwrap_or(if q { 20_000 } else { 5_000_000 }),
            ordered_pending: a.ordered_pending.unwrap_or(if q { 6_000 } else { 100_000 }),
            ordered_claims: a.ordered_claims.unwrap_or(if q { 10 } else { 200 }),
            hot_events: a.hot_events.unwrap_or(if q { 200 } else { 5_000 }),
            claim_drain: has("claim-drain"),
            held_leases: has("held-leases"),
            claim_events: a.claim_events.unwrap_or(if q { 4_000 } else { 40_000 }),
            claim_shapes: a.claim_shapes.clone().unwrap_or_else(|| {
                if q {
                    vec![claims::TARGET_SHAPE]
                } else {
                    claims::SHAPES.to_vec()
                }
            }),
            claim_vacuum: a.claim_vacuum,
            claim_fillfactor: a.claim_fillfactor,
            held: a.held.clone().unwrap_or_else(|| {
                if q {
                    vec![0, 1_000]
                } else {
                    vec![0, 1_000, 10_000]
                }
            }),
            held_claims: a.held_claims.unwrap_or(if q { 5 } else { 100 }),
        };
        anyhow::ensure!(plan.reps >= 1 && plan.reps <= 20, "--reps must be 1..=20");
        anyhow::ensure!(
            plan.events >= 100 && plan.events <= 10_000_000,
            "--events must be 100..=10M"
        );
        anyhow::ensure!(
            plan.rate >= 1 && plan.rate <= 50_000,
            "--rate must be 1..=50000"
        );
        anyhow::ensure!(
            plan.producer_secs >= 1 && plan.producer_secs <= 600,
            "--producer-secs must be 1..=600"
        );
        anyhow::ensure!(
            plan.latency_secs >= 1 && plan.latency_secs <= 600,
            "--latency-secs must be 1..=600"
        );
        anyhow::ensure!(
            !plan.history.is_empty() && !plan.pending.is_empty(),
            "--history and --pending need a value"
        );
        anyhow::ensure!(
            plan.claims >= 1 && plan.claims <= 1000,
            "--claims must be 1..=1000"
        );
        anyhow::ensure!(
            (100..=10_000_000).contains(&plan.aggregates),
            "--aggregates must be 100..=10M (an ordered claim of 100 takes one event of each of 100 aggregates)"
        );
        anyhow::ensure!(
            plan.ordered_claims >= 1 && plan.ordered_claims <= 10_000,
            "--ordered-claims must be 1..=10000"
        );
        // Both outboxes' claims (and their warm-up) take from the same pending
        // events; half of them stay, so the last claims still find 100 aggregates.
        anyhow::ensure!(
            (plan.ordered_claims as u64 + ordering::WARM_UP as u64) * 2 * 100 * 2
                <= plan.ordered_pending
                && plan.ordered_pending <= 10_000_000,
            "--ordered-pending must be at most 10M and at least 400 × (--ordered-claims + {})",
            ordering::WARM_UP
        );
        anyhow::ensure!(
            plan.ordered_history <= 100_000_000,
            "--ordered-history must be at most 100M"
        );
        anyhow::ensure!(
            (1..=100_000).contains(&plan.secure_claims),
            "--secure-claims must be 1..=100000"
        );
        anyhow::ensure!(
            (100..=10_000_000).contains(&plan.claim_events),
            "--claim-events must be 100..=10M"
        );
        anyhow::ensure!(
            !plan.claim_shapes.is_empty()
                && plan
                    .claim_shapes
                    .iter()
                    .all(|&(b, w)| (1..=1000).contains(&b) && (1..=32).contains(&w)),
            "--claim-shapes: batch 1..=1000, workers 1..=32"
        );
        anyhow::ensure!(
            !plan.held.is_empty() && plan.held.iter().all(|&h| h <= 1_000_000),
            "--held needs values of at most 1M"
        );
        anyhow::ensure!(
            (1..=10_000).contains(&plan.held_claims),
            "--held-claims must be 1..=10000"
        );
        anyhow::ensure!(
            plan.hot_events >= 1 && plan.hot_events <= 1_000_000,
            "--hot-events must be 1..=1M"
        );
        anyhow::ensure!(
            plan.batch_sizes
                .iter()
                .chain([&plan.latency_batch])
                .all(|b| (1..=1000).contains(b)),
            "batch sizes must be 1..=1000 (outboxd's --max-batch)"
        );
        anyhow::ensure!(
            plan.workers
                .iter()
                .chain([&plan.latency_workers])
                .all(|w| (1..=32).contains(w)),
            "worker counts must be 1..=32"
        );
        Ok(plan)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("outbox-bench: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("outbox-bench: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let plan = Plan::from_args(&args)?;
    db::check_loopback(&args.database_url).context("--database-url")?;
    db::check_loopback(&args.amqp_url).context("--amqp-url")?;
    let bins = procs::Binaries::find(&args.bin_dir)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    std::fs::create_dir_all(&args.log_dir)
        .with_context(|| format!("creating {}", args.log_dir.display()))?;

    let started = std::time::Instant::now();
    let machine = machine::describe(&args).await;
    let ctx = scenarios::Ctx::setup(&args, &plan, bins).await?;
    let result = tokio::select! {
        result = scenarios::run_all(&ctx, &plan) => result,
        () = interrupted() => Err(anyhow::anyhow!("interrupted")),
    };
    // Clean up whatever happened; report the first error.
    let cleanup = ctx.cleanup().await;
    let results = result?;
    cleanup?;

    let elapsed = started.elapsed();
    let charts = charts::draw(&args.out, &results, &plan);
    let charts = match charts {
        Ok(files) => files,
        Err(err) => {
            eprintln!("outbox-bench: charts not drawn: {err:#}");
            Vec::new()
        }
    };
    let text = report::render(&plan, &machine, &results, &charts, elapsed);
    let path = args.out.join("REPORT.md");
    std::fs::write(&path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!("{}", report::summary(&plan, &results));
    println!(
        "report: {}  ({} s)",
        path.display(),
        elapsed.as_secs_f64().round()
    );
    if plan.quick {
        println!("quick mode: harness check only, speed targets not evaluated");
    }
    Ok(())
}

/// Ctrl-C or SIGTERM: the run stops, child processes are killed and the
/// databases, exchange and queue are still removed.
async fn interrupted() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}

/// Bounded waits share this: poll `every` until `deadline`.
pub const POLL: Duration = Duration::from_millis(20);
