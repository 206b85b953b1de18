//! REPORT.md: conditions, the targets table, every scenario's figures with
//! medians and spread, the claim plans and the exact commands.

use std::{fmt::Write as _, path::PathBuf, time::Duration};

use crate::{
    Plan,
    cpu::Component,
    db::LeaseStages,
    machine::Machine,
    ordering::{Order, OrderedClaim},
    scenarios::{Cycle, DrainCase, DrainRun, PRODUCERS, Results, ScalePoint},
    stats::{Spread, quantile},
};

/// One line of the targets table.
#[derive(Debug, Clone)]
pub struct Check {
    pub target: String,
    pub measured: String,
    /// None: not evaluated (quick mode or scenario not run), or no target.
    pub pass: Option<bool>,
    /// A figure reported with no target.
    pub no_target: bool,
}

fn rates(runs: &[DrainRun]) -> Vec<f64> {
    runs.iter().map(|r| r.events_per_sec).collect()
}

/// outboxd / classic of `f` per repetition (the two designs ran back to back
/// in the same repetition).
fn paired(case: &DrainCase, f: impl Fn(&DrainRun) -> f64) -> Vec<f64> {
    case.outboxd
        .iter()
        .zip(&case.classic)
        .map(|(o, c)| f(o) / f(c))
        .collect()
}

/// Drain throughput, outboxd / classic per repetition.
fn ratios(case: &DrainCase) -> Vec<f64> {
    paired(case, |x| x.events_per_sec)
}

/// WAL bytes per published event of a drain.
fn wal_per_event(x: &DrainRun) -> f64 {
    x.wal_per_event
}

/// PostgreSQL's CPU seconds per 100 000 published events of a drain.
fn postgres_per100k(x: &DrainRun) -> f64 {
    x.machine.of(Component::Postgres) / events(x) * 100_000.0
}

/// "1.04× (4.92 vs 4.71 ms)": a point against the empty table claimed beside it.
fn vs_empty(p: &ScalePoint) -> String {
    format!(
        "{:.2}× ({:.2} vs {:.2} ms)",
        p.vs_empty(),
        Spread::of(&p.claim_ms).median,
        Spread::of(&p.empty_ms).median
    )
}

/// "4.71 [p10 3.90, p90 5.87]": claim times, which the scale table shows by
/// decile rather than min–max (one slow claim would hide the spread).
fn median_p10_p90(v: &[f64]) -> String {
    format!(
        "{:.2} [p10 {:.2}, p90 {:.2}]",
        Spread::of(v).median,
        quantile(v, 0.1),
        quantile(v, 0.9)
    )
}

fn case_name(c: &DrainCase) -> String {
    format!(
        "batch {}, {} worker{}",
        c.batch,
        c.workers,
        if c.workers == 1 { "" } else { "s" }
    )
}

/// A drain cost target: outboxd's `f` at most `limit` × the classic relay's,
/// on the median of the per-repetition ratios.
fn cost_check(
    case: &DrainCase,
    what: &str,
    limit: f64,
    f: fn(&DrainRun) -> f64,
    unit: &str,
    digits: usize,
    judge: impl Fn(bool) -> Option<bool>,
) -> Check {
    let ratio = Spread::of(&paired(case, f));
    Check {
        target: format!(
            "{what} ≤ {limit:.2}× the classic relay's ({})",
            case_name(case)
        ),
        measured: format!(
            "{}× ({:.digits$} vs {:.digits$} {unit})",
            ratio.show(2),
            median_of(&case.outboxd, f),
            median_of(&case.classic, f),
        ),
        pass: judge(ratio.median <= limit),
        no_target: false,
    }
}

/// The targets of issue #32, in its order: WAL and PostgreSQL CPU per event in
/// each drain shape, producer commits/s in each mode, latency, claims; then
/// issue #33's: the ordered drain and the ordered claim against unordered ones,
/// and the hot aggregate's rate (no target).
pub fn checks(plan: &Plan, r: &Results) -> Vec<Check> {
    let mut out = checks_32(plan, r);
    out.extend(checks_33(plan, r));
    if let Some(sec) = &r.security {
        out.extend(crate::security::checks(sec));
    }
    out.extend(crate::claims::checks(plan, r));
    out
}

fn checks_32(plan: &Plan, r: &Results) -> Vec<Check> {
    let judge = |ok: bool| if plan.quick { None } else { Some(ok) };
    let mut out = Vec::new();
    for case in &r.drain {
        out.push(cost_check(
            case,
            "WAL bytes per published event",
            1.05,
            wal_per_event,
            "bytes/ev",
            0,
            judge,
        ));
    }
    for case in &r.drain {
        out.push(cost_check(
            case,
            "PostgreSQL CPU per event",
            1.0,
            postgres_per100k,
            "CPU s /100k ev",
            2,
            judge,
        ));
    }
    for case in &r.producer {
        let ratio = Spread::of(&case.ratios());
        out.push(Check {
            target: format!(
                "producer commits/s into outboxd's table ≥ 0.9× the classic table's ({})",
                case.mode.label()
            ),
            measured: format!(
                "{}× ({:.0} vs {:.0} commits/s)",
                ratio.show(2),
                Spread::of(&case.outboxd).median,
                Spread::of(&case.classic).median
            ),
            pass: judge(ratio.median >= 0.9),
            no_target: false,
        });
    }
    if let Some(lp) = r.latency.iter().find(|c| c.poll_ms.is_none()) {
        let p50 = Spread::of(&lp.runs.iter().map(|x| x.p50_ms).collect::<Vec<_>>());
        let p99 = Spread::of(&lp.runs.iter().map(|x| x.p99_ms).collect::<Vec<_>>());
        out.push(Check {
            target: format!("latency p50 ≤ 5 ms at {} ev/s", plan.rate),
            measured: format!("{} ms", p50.show(2)),
            pass: judge(p50.median <= 5.0),
            no_target: false,
        });
        out.push(Check {
            target: format!("latency p99 ≤ 25 ms at {} ev/s", plan.rate),
            measured: format!("{} ms", p99.show(2)),
            pass: judge(p99.median <= 25.0),
            no_target: false,
        });
    }
    if let Some(&hmax) = plan.history.iter().max() {
        for p in r
            .scale
            .iter()
            .filter(|p| p.history == hmax && p.leases == 0)
        {
            out.push(Check {
                target: format!(
                    "claim with {hmax} history ≤ 1.3× empty ({} pending)",
                    p.pending
                ),
                measured: vs_empty(p),
                pass: judge(p.vs_empty() <= 1.3),
                no_target: false,
            });
        }
        for p in r.scale.iter().filter(|p| p.leases > 0) {
            out.push(Check {
                target: format!(
                    "claim behind {} leases ≤ 2× empty ({} history)",
                    p.leases, p.history
                ),
                measured: vs_empty(p),
                pass: judge(p.vs_empty() <= 2.0),
                no_target: false,
            });
        }
    }
    out
}

fn verdict(c: &Check) -> &'static str {
    if c.no_target {
        return "reported";
    }
    match c.pass {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not evaluated",
    }
}

/// Short summary for the terminal.
pub fn summary(plan: &Plan, r: &Results) -> String {
    let mut s = String::from("target | measured | result\n");
    for c in checks(plan, r) {
        let _ = writeln!(
            s,
            "{} | {} | {}",
            c.target,
            c.measured,
            verdict(&c).trim_matches('*')
        );
    }
    s
}

pub fn render(
    plan: &Plan,
    m: &Machine,
    r: &Results,
    charts: &[PathBuf],
    elapsed: Duration,
) -> String {
    let mut s = String::new();
    let now = chrono::Utc::now().format("%Y-%m-%d %H:%M UTC");
    let _ = writeln!(s, "# outboxd benchmark report\n");
    let _ = writeln!(
        s,
        "Generated by `outbox-bench` on {now} in {:.0} s ({} mode, {} repetition{} per case, designs alternating).\n",
        elapsed.as_secs_f64(),
        if plan.quick {
            "**quick** (harness check, small sizes: figures are not meaningful)"
        } else {
            "full"
        },
        plan.reps,
        if plan.reps == 1 { "" } else { "s" }
    );
    let _ = writeln!(
        s,
        "Figures are `median [min–max]` over the repetitions. Ratios are computed against baselines measured in this same run.\n"
    );

    let _ = writeln!(s, "## Conditions\n");
    let _ = writeln!(s, "| | |\n| --- | --- |");
    let _ = writeln!(
        s,
        "| machine | {} cores, {:.1} GiB, {} |",
        m.cores, m.memory_gib, m.cpu_model
    );
    let _ = writeln!(s, "| kernel | {} |", m.kernel);
    let _ = writeln!(
        s,
        "| load average at start | {} (the machine is shared with other builds and tests) |",
        m.load_before
    );
    let _ = writeln!(s, "| CPUs allowed | {} |", m.cpu_layout);
    let _ = writeln!(s, "| PostgreSQL | {} |", m.postgres);
    let _ = writeln!(s, "| RabbitMQ | {} |", m.rabbitmq);
    let _ = writeln!(s, "| rustc | {} |", m.rustc);
    let _ = writeln!(s, "| git commit | {} |", m.git_commit);
    let _ = writeln!(
        s,
        "| everything co-located | PostgreSQL, RabbitMQ, outboxd, outbox-relay and the harness on one machine, loopback only |"
    );
    let _ = writeln!(
        s,
        "| payload | ~{} bytes of JSON per event, persistent messages, durable queue, `mandatory`, publisher confirms |\n",
        r.payload_bytes
    );

    let _ = writeln!(s, "## Targets\n");
    let _ = writeln!(s, "| target | measured | result |\n| --- | --- | --- |");
    for c in checks(plan, r) {
        let _ = writeln!(s, "| {} | {} | {} |", c.target, c.measured, verdict(&c));
    }
    s.push('\n');

    if !r.drain.is_empty() {
        drain_section(&mut s, plan, r);
    }
    if !r.producer.is_empty() {
        producer_section(&mut s, plan, r);
    }
    if !r.latency.is_empty() {
        latency_section(&mut s, plan, r);
    }
    if !r.scale.is_empty() {
        scale_section(&mut s, plan, r);
    }
    if !r.drain.is_empty() {
        cost_section(&mut s, r);
    }
    ordering_section(&mut s, plan, r);
    if let Some(sec) = &r.security {
        crate::security::section(&mut s, sec);
    }
    crate::claims::section(&mut s, plan, r);

    let _ = writeln!(s, "## Commands\n");
    let _ = writeln!(
        s,
        "```sh\ncargo build --release --workspace --bins\n{}\n```\n",
        m.command
    );
    let _ = writeln!(
        s,
        "Processes the harness started (ports and database names vary per run):\n"
    );
    let _ = writeln!(s, "```sh");
    for c in &r.commands {
        let _ = writeln!(s, "{c}");
    }
    let _ = writeln!(s, "```\n");
    if !charts.is_empty() {
        let _ = writeln!(s, "## Charts\n");
        for c in charts {
            if let Some(name) = c.file_name().and_then(|n| n.to_str()) {
                let _ = writeln!(s, "![{name}]({name})\n");
            }
        }
    }
    if !r.notes.is_empty() {
        let _ = writeln!(s, "## Observations (computed from this run)\n");
        for note in &r.notes {
            let _ = writeln!(s, "- {note}");
        }
        s.push('\n');
    }
    s
}

fn drain_section(s: &mut String, plan: &Plan, r: &Results) {
    let _ = writeln!(s, "## Drain: {} pre-filled events\n", plan.events);
    let _ = writeln!(
        s,
        "Events per second from the start of the relay until every row is published and every message is in the queue. \
         Workers: classic relay workers (each its own DB connection and confirm channel) = `outbox-relay --concurrency` slots \
         (each its own confirm channel), one relay process. The ratio is outboxd + relay over the classic relay, per \
         repetition (the two ran back to back). WAL and CPU per event of the same drains are under Cost.\n"
    );
    let _ = writeln!(
        s,
        "| batch | workers | classic relay ev/s | outboxd + relay ev/s | ratio |\n| ---: | ---: | ---: | ---: | ---: |"
    );
    for case in &r.drain {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {}× |",
            case.batch,
            case.workers,
            Spread::of(&rates(&case.classic)).show(0),
            Spread::of(&rates(&case.outboxd)).show(0),
            Spread::of(&ratios(case)).show(2),
        );
    }
    s.push('\n');
}

fn producer_section(s: &mut String, plan: &Plan, r: &Results) {
    let _ = writeln!(s, "## Producers: commits/s into the outbox table\n");
    let _ = writeln!(
        s,
        "{PRODUCERS} connections commit one-event transactions (one INSERT each) as fast as they can for {} s, into \
         outboxd's table and into the classic table in turn, the order alternating across repetitions; the ratio is \
         outboxd's table over the classic table's, per repetition. Stopped: outboxd not running (it created and \
         adopted its table earlier in the run), nothing running on the classic table. Idle: outboxd running on its \
         table with no relay, nothing claiming; nothing running on the classic table. Draining: outboxd + relay \
         (batch {}, {} slots) draining a backlog of {} events while the producers insert, against the classic relay \
         (batch {}, {} workers) draining the same backlog on the classic table, so both sides share the CPU alike; the \
         producers start once the relay has published.\n",
        plan.producer_secs,
        plan.latency_batch,
        plan.latency_workers,
        crate::scenarios::producer_backlog(plan),
        plan.latency_batch,
        plan.latency_workers,
    );
    let _ = writeln!(
        s,
        "| mode | classic table, commits/s | outboxd's table, commits/s | ratio |\n| --- | ---: | ---: | ---: |"
    );
    for case in &r.producer {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {}× |",
            case.mode.label(),
            Spread::of(&case.classic).show(0),
            Spread::of(&case.outboxd).show(0),
            Spread::of(&case.ratios()).show(2),
        );
    }
    s.push('\n');
}

fn latency_section(s: &mut String, plan: &Plan, r: &Results) {
    let _ = writeln!(
        s,
        "## Latency under steady load: {} events/s for {} s\n",
        plan.rate, plan.latency_secs
    );
    let _ = writeln!(
        s,
        "A producer commits one event per transaction on a fixed schedule (16 connections, so commits can group); a consumer on the queue \
         takes commit → delivery from the commit time the producer recorded when its COMMIT returned (same clock, same \
         process). The first second is warm-up and not counted. Both designs: batch {}, {} workers / slots. The classic \
         workers sleep one poll interval whenever a batch comes back short; with {} workers polling independently the \
         table is looked at about every interval / {}.\n",
        plan.latency_batch, plan.latency_workers, plan.latency_workers, plan.latency_workers
    );
    let _ = writeln!(
        s,
        "| design | p50 ms | p99 ms | max ms | achieved rate ev/s | delivered / committed |"
    );
    let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: |");
    for case in &r.latency {
        let col = |f: fn(&crate::scenarios::LatencyRun) -> f64| {
            Spread::of(&case.runs.iter().map(f).collect::<Vec<_>>())
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} / {} |",
            case.label(),
            col(|x| x.p50_ms).show(2),
            col(|x| x.p99_ms).show(2),
            col(|x| x.max_ms).show(1),
            col(|x| x.achieved_rate).show(0),
            case.runs.iter().map(|x| x.delivered).sum::<u64>(),
            case.runs.iter().map(|x| x.sent).sum::<u64>()
        );
    }
    s.push('\n');
    lease_stages(s, r);
}

/// outboxd's share of commit → delivery, from its rows' own timestamps.
fn lease_stages(s: &mut String, r: &Results) {
    let stages: Vec<_> = r
        .latency
        .iter()
        .flat_map(|case| case.runs.iter().filter_map(|run| run.stages))
        .collect();
    if stages.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "outboxd's part, on the database clock, from each row's `created_at` (the producer's INSERT, just before \
         its COMMIT), `claimed_at` (the claim statement that leased it) and `published_at` (its ack), over the rows \
         after the first second; medians over the repetitions. Commit → delivery above is insert → claim plus the \
         claim's return to the relay and the publish up to the consumer; claim → ack also covers the confirm and \
         the ack.\n"
    );
    let _ = writeln!(
        s,
        "| outboxd stage | p50 ms | p99 ms | max ms |\n| --- | ---: | ---: | ---: |"
    );
    let row = |s: &mut String, label: &str, pick: fn(&LeaseStages) -> [f64; 3]| {
        let col = |i: usize| Spread::of(&stages.iter().map(|x| pick(x)[i]).collect::<Vec<_>>());
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} |",
            col(0).show(2),
            col(1).show(2),
            col(2).show(1)
        );
    };
    row(s, "insert → claim (wake-up, claim)", |x| x.to_claim);
    row(s, "claim → ack (publish, confirm, ack)", |x| x.to_ack);
    s.push('\n');
}

fn scale_section(s: &mut String, plan: &Plan, r: &Results) {
    let _ = writeln!(s, "## Claim latency with history\n");
    let _ = writeln!(
        s,
        "One `ClaimBatch(max 100)` over gRPC, {} timed claims per point (after 3 warm-up claims), each acked \
         before the next (untimed). Each point has its own baseline: one outboxd serves the point's table and an \
         empty table (`empty.outbox`: no history, no leases, the same number of pending rows; both keep the rows \
         earlier points claimed and acked, the same number in each), and the claims alternate between the two, \
         so both are measured under the same conditions of the machine; `vs empty` is the ratio of the two \
         medians. Before each point both tables get fresh pending rows, `VACUUM ANALYZE` \
         and one `CHECKPOINT`. History rows are published rows retained (`published_at` set directly by \
         `INSERT … SELECT generate_series`); leases in flight are the oldest pending rows, leased for 15 minutes \
         through outboxd's own `ClaimBatch` by another worker and never acked (so outboxd's claim cursor \
         knows them), ahead of the claimable ones. `SQL ms` is the claim statement's execution time under \
         `EXPLAIN (ANALYZE, BUFFERS, WAL)`, rolled back, once per table after the warm-up claims, bound with \
         the claim cursor outboxd reports (`outbox_claim_cursor`, sampled every second) and the table's epoch.\n",
        plan.claims
    );
    let _ = writeln!(
        s,
        "| history rows | pending | leases in flight | claim ms | empty table, same moment, ms | vs empty | SQL ms | empty SQL ms |"
    );
    let _ = writeln!(
        s,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for p in &r.scale {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.2}× | {:.2} | {:.2} |",
            p.history,
            p.pending,
            p.leases,
            median_p10_p90(&p.claim_ms),
            median_p10_p90(&p.empty_ms),
            p.vs_empty(),
            p.sql_ms,
            p.empty_sql_ms
        );
    }
    s.push('\n');
    // The plan of every point, for profiling.
    let _ = writeln!(
        s,
        "<details><summary>Claim plans (EXPLAIN ANALYZE, BUFFERS, WAL)</summary>\n"
    );
    for p in &r.scale {
        let _ = writeln!(
            s,
            "{} history, {} pending, {} leases:\n\n```\n{}\n```\n",
            p.history, p.pending, p.leases, p.plan
        );
    }
    let _ = writeln!(s, "</details>\n");
}

fn cost_section(s: &mut String, r: &Results) {
    let _ = writeln!(s, "## Cost\n");
    let _ = writeln!(
        s,
        "Database transactions per published event are `xact_commit + xact_rollback` deltas of the bench database in \
         `pg_stat_database` over the drain, minus the harness's own monitoring queries (outboxd's start-up, health and \
         metrics queries are included). Every outboxd statement is its own transaction, so for outboxd transactions = \
         statements. For the classic relay the harness also counts the statements it sent (BEGIN, SELECT, UPDATE, COMMIT). \
         CPU seconds (user + system) and peak RSS (VmHWM) come from /proc, per 100 000 events.\n"
    );
    let _ = writeln!(
        s,
        "| batch | workers | outboxd xact/ev | classic xact/ev | classic statements/ev | outboxd CPU s /100k | relay CPU s /100k | outboxd peak RSS MiB | relay peak RSS MiB |"
    );
    let _ = writeln!(
        s,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for case in &r.drain {
        let per100k = |runs: &[DrainRun], f: fn(&DrainRun) -> f64| {
            let n_events = |x: &DrainRun| x.events_per_sec * x.secs;
            Spread::of(
                &runs
                    .iter()
                    .map(|x| f(x) / n_events(x) * 100_000.0)
                    .collect::<Vec<_>>(),
            )
        };
        let plain = |runs: &[DrainRun], f: fn(&DrainRun) -> f64| {
            Spread::of(&runs.iter().map(f).collect::<Vec<_>>())
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case.batch,
            case.workers,
            plain(&case.outboxd, |x| x.xacts_per_event).show(4),
            plain(&case.classic, |x| x.xacts_per_event).show(4),
            plain(&case.classic, |x| x
                .statements_per_event
                .unwrap_or(f64::NAN))
            .show(4),
            per100k(&case.outboxd, |x| x.outboxd.cpu_secs).show(2),
            per100k(&case.outboxd, |x| x.relay.cpu_secs).show(2),
            plain(&case.outboxd, |x| x.outboxd.peak_rss_mib).show(1),
            plain(&case.outboxd, |x| x.relay.peak_rss_mib).show(1),
        );
    }
    s.push('\n');
    machine_table(s, r);
    cycle_table(s, r);
}

/// A run's events: rate × duration, as the drain measured them.
fn events(x: &DrainRun) -> f64 {
    x.events_per_sec * x.secs
}

fn median_of(runs: &[DrainRun], f: impl Fn(&DrainRun) -> f64) -> f64 {
    Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).median
}

/// Median whole-machine CPU seconds per 100 000 events: all of it, or one part.
fn machine_per100k(runs: &[DrainRun], part: Option<Component>) -> f64 {
    median_of(runs, |x| {
        let secs = part.map_or(x.machine.busy_secs, |c| x.machine.of(c));
        secs / events(x) * 100_000.0
    })
}

/// The drains of a case: the two designs.
fn designs(case: &DrainCase) -> [(&'static str, &[DrainRun]); 2] {
    [
        ("classic relay", &case.classic),
        ("outboxd + relay", &case.outboxd),
    ]
}

fn machine_table(s: &mut String, r: &Results) {
    let _ = writeln!(
        s,
        "Whole machine over each drain, from the relay's start until the backlog was out: busy CPU seconds of both \
         cores per 100 000 events (user + system + interrupts from /proc/stat, steal excluded), split by process name \
         from /proc/PID/stat (PostgreSQL includes its background workers and the children the postmaster reaped, \
         such as autovacuum; the harness includes the classic relay's workers and the drain monitor; other is what \
         no listed process accounts for). Medians over the repetitions. When both designs keep the machine near \
         saturation, their throughput ratio is close to the inverse of their total CPU per event.\n"
    );
    let _ = write!(
        s,
        "| batch | workers | design | ev/s | machine busy | WAL bytes /ev | CPU s /100k |"
    );
    for c in Component::ALL {
        let _ = write!(s, " {} |", c.label());
    }
    let _ = writeln!(s, " other |");
    let _ = writeln!(
        s,
        "| ---: | ---: | --- | ---: | ---: | ---: | ---: |{}",
        " ---: |".repeat(Component::ALL.len() + 1)
    );
    for case in &r.drain {
        for (label, runs) in designs(case) {
            if runs.iter().all(|x| x.machine.busy_secs <= 0.0) {
                continue;
            }
            let _ = write!(
                s,
                "| {} | {} | {label} | {:.0} | {:.0} % | {:.0} | {:.2} |",
                case.batch,
                case.workers,
                median_of(runs, |x| x.events_per_sec),
                median_of(runs, |x| x.machine.busy_share * 100.0),
                median_of(runs, |x| x.wal_per_event),
                machine_per100k(runs, None),
            );
            for c in Component::ALL {
                let _ = write!(s, " {:.2} |", machine_per100k(runs, Some(c)));
            }
            let _ = writeln!(
                s,
                " {:.2} |",
                median_of(runs, |x| x.machine.other() / events(x) * 100_000.0)
            );
        }
    }
    s.push('\n');
}

fn cycle_table(s: &mut String, r: &Results) {
    let _ = writeln!(
        s,
        "Batch cycle, mean milliseconds, each design timed from the inside (medians over the repetitions): the \
         classic relay by the harness around its statements; outboxd by its `outbox_rpc_duration_seconds` and \
         `outbox_claim_batch_size` histograms and the relay's `outbox_relay_publish_duration_seconds` (from a batch's \
         send to each message's confirm), scraped at the end of the drain. \"ms per batch\" is the drain's duration \
         × workers / batches: the time one worker spends on one batch.\n"
    );
    let _ = writeln!(
        s,
        "| batch | workers | design | batches | ms per batch | parts (ms) |\n| ---: | ---: | --- | ---: | ---: | --- |"
    );
    for case in &r.drain {
        for (label, runs) in designs(case) {
            let timed: Vec<(&DrainRun, Cycle)> = runs
                .iter()
                .filter(|x| x.batches > 0)
                .filter_map(|x| x.cycle.map(|c| (x, c)))
                .collect();
            if timed.is_empty() {
                continue;
            }
            let med = |i: usize| {
                Spread::of(&timed.iter().map(|(_, c)| c.parts()[i]).collect::<Vec<_>>()).median
            };
            let parts = match timed[0].1 {
                Cycle::Classic { .. } => format!(
                    "BEGIN + SELECT {:.2}, publish → last confirm {:.2}, UPDATE + COMMIT {:.2}",
                    med(0),
                    med(1),
                    med(2)
                ),
                Cycle::Outboxd { .. } => {
                    let calls = Spread::of(
                        &timed
                            .iter()
                            .map(|(_, c)| c.ack_calls_per_batch())
                            .collect::<Vec<_>>(),
                    )
                    .median;
                    let acks = if calls > 0.0 {
                        format!(
                            "Ack calls in outboxd {:.2} (beside the next batch; {:.1} per 100 batches, the other acks carried by claims)",
                            med(2),
                            calls * 100.0
                        )
                    } else {
                        "every ack carried by the next claim".to_owned()
                    };
                    format!(
                        "ClaimBatch in outboxd {:.2} (with the acks it carries), send → confirm per message {:.2}, {acks}",
                        med(0),
                        med(1)
                    )
                }
            };
            let per_batch: Vec<f64> = timed
                .iter()
                .map(|(x, _)| x.secs * f64::from(case.workers) * 1e3 / x.batches as f64)
                .collect();
            let batches: Vec<f64> = timed.iter().map(|(x, _)| x.batches as f64).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {label} | {:.0} | {} | {parts} |",
                case.batch,
                case.workers,
                Spread::of(&batches).median,
                Spread::of(&per_batch).show(2),
            );
        }
    }
    s.push('\n');
}

// ---------------------------------------------------------------- issue #33

/// Issue #33: the ordered drain ≥ 0.8 × the unordered one per shape; the
/// ordered claim's p50 and p99 ≤ 1.5 × the unordered one's; the hot
/// aggregate's rate, reported.
fn checks_33(plan: &Plan, r: &Results) -> Vec<Check> {
    let judge = |ok: bool| if plan.quick { None } else { Some(ok) };
    let mut out = Vec::new();
    for case in &r.ordered_drain {
        let ratio = Spread::of(&case.paired(|x| x.events_per_sec));
        out.push(Check {
            target: format!(
                "ordered drain ≥ 0.8× the unordered drain ({}, {} aggregates)",
                shape_name(case.batch, case.workers),
                plan.aggregates
            ),
            measured: format!(
                "{}× ({:.0} vs {:.0} ev/s)",
                ratio.show(2),
                median_of(&case.ordered, |x| x.events_per_sec),
                median_of(&case.unordered, |x| x.events_per_sec),
            ),
            pass: judge(ratio.median >= 0.8),
            no_target: false,
        });
    }
    if let Some(c) = &r.ordered_claim {
        for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
            let ratio = c.ratio(q);
            out.push(Check {
                target: format!(
                    "ordered claim {name} ≤ 1.5× the unordered claim's ({} history, {} pending over {} aggregates)",
                    c.history, c.pending, c.aggregates
                ),
                measured: format!(
                    "{ratio:.2}× ({:.2} vs {:.2} ms)",
                    quantile(&c.ordered.claim_ms, q),
                    quantile(&c.unordered.claim_ms, q)
                ),
                pass: judge(ratio <= 1.5),
                no_target: false,
            });
        }
    }
    if let Some(h) = &r.hot {
        out.push(Check {
            target: format!(
                "single hot aggregate, ordered ({} events, {})",
                h.events,
                shape_name(h.batch, h.workers)
            ),
            measured: format!("{} ev/s", Spread::of(&rates(&h.runs)).show(0)),
            pass: None,
            no_target: true,
        });
    }
    out
}

fn shape_name(batch: u32, workers: u32) -> String {
    format!(
        "batch {batch}, {workers} worker{}",
        if workers == 1 { "" } else { "s" }
    )
}

/// Events per batch that carried messages, over a drain.
fn per_batch(x: &DrainRun) -> f64 {
    if x.batches == 0 {
        f64::NAN
    } else {
        events(x) / x.batches as f64
    }
}

/// Mean milliseconds of part `i` of outboxd's batch cycle (0 ClaimBatch,
/// 1 send → confirm, 2 Ack calls).
fn cycle_part(i: usize) -> impl Fn(&DrainRun) -> f64 {
    move |x: &DrainRun| x.cycle.map_or(f64::NAN, |c| c.parts()[i])
}

/// "a / b" of medians, `digits` decimals.
fn pair(a: &[DrainRun], b: &[DrainRun], f: impl Fn(&DrainRun) -> f64, digits: usize) -> String {
    format!(
        "{:.digits$} / {:.digits$}",
        median_of(a, &f),
        median_of(b, &f)
    )
}

fn ordering_section(s: &mut String, plan: &Plan, r: &Results) {
    if r.ordered_drain.is_empty() && r.ordered_claim.is_none() && r.hot.is_none() {
        return;
    }
    let _ = writeln!(
        s,
        "## Per-aggregate order (#33)
"
    );
    let _ = writeln!(
        s,
        "An outbox with `ordering=aggregate` (`--outbox NAME=SCHEMA.TABLE:ordering=aggregate`) against an unordered \
         one (`ordering=none`) in the same run, the two alternating. Events carry realistic aggregate ids (a uuid as \
         text, event `g` of aggregate `md5(g % aggregates)`, so each aggregate's events are spread over the whole \
         backlog).\n"
    );
    if !r.ordered_drain.is_empty() {
        let _ = writeln!(
            s,
            "### Ordered drain: {} events over {} aggregates\n",
            plan.events, plan.aggregates
        );
        let _ = writeln!(
            s,
            "The drain scenario's backlog and measurement (outboxd + outbox-relay, from the relay's start until every \
             row is published and every message is in the queue), on two tables of one database: `ordered.outbox`, \
             served with `ordering=aggregate`, and `unordered.outbox`, with `ordering=none`; each created and adopted \
             by outboxd with its own ordering (so only the ordered one has what ordering keeps beside it). The ratio \
             is ordered over unordered, per repetition (the two ran back to back, the order alternating). Columns \
             with two figures are unordered / ordered, medians. Events per batch are the drain's events over the \
             claims that returned any; ClaimBatch is the mean inside outboxd (`outbox_rpc_duration_seconds`, acks \
             carried included); holdback is the largest `outbox_commit_order_holdback_seconds` seen, sampled every \
             500 ms.\n"
        );
        let _ = writeln!(
            s,
            "| batch | workers | unordered ev/s | ordered ev/s | ratio | events per batch | ClaimBatch ms | PostgreSQL CPU s /100k | WAL bytes /ev | holdback s (max) |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        for case in &r.ordered_drain {
            let (u, o) = (&case.unordered, &case.ordered);
            let holdback = o
                .iter()
                .filter_map(|x| x.holdback_secs)
                .reduce(f64::max)
                .map_or_else(|| "–".to_owned(), |v| format!("{v:.3}"));
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {}× | {} | {} | {} | {} | {holdback} |",
                case.batch,
                case.workers,
                Spread::of(&rates(u)).show(0),
                Spread::of(&rates(o)).show(0),
                Spread::of(&case.paired(|x| x.events_per_sec)).show(2),
                pair(u, o, per_batch, 1),
                pair(u, o, cycle_part(0), 2),
                pair(u, o, postgres_per100k, 2),
                pair(u, o, wal_per_event, 0),
            );
        }
        s.push('\n');
    }
    if let Some(c) = &r.ordered_claim {
        ordered_claim_section(s, plan, c);
    }
    if let Some(h) = &r.hot {
        let _ = writeln!(s, "### A single hot aggregate, ordered\n");
        let _ = writeln!(
            s,
            "{} events, all of one `aggregate_id`, drained from `ordered.outbox` as above (batch {}, {} relay slots). \
             An ordered outbox hands out an aggregate's next event only once its previous one is acked, so this is \
             the rate of one claim → publish → confirm → ack cycle at a time; no target.\n",
            h.events, h.batch, h.workers
        );
        let _ = writeln!(
            s,
            "| ev/s | events per batch | ClaimBatch ms | send → confirm ms | Ack call ms | PostgreSQL CPU s /100k |\n\
             | ---: | ---: | ---: | ---: | ---: | ---: |"
        );
        let col = |f: &dyn Fn(&DrainRun) -> f64, d: usize| {
            Spread::of(&h.runs.iter().map(f).collect::<Vec<_>>()).show(d)
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {} |\n",
            col(&|x| x.events_per_sec, 0),
            col(&per_batch, 2),
            col(&cycle_part(0), 2),
            col(&cycle_part(1), 2),
            col(&cycle_part(2), 2),
            col(&postgres_per100k, 2),
        );
    }
}

fn ordered_claim_section(s: &mut String, plan: &Plan, c: &OrderedClaim) {
    let _ = writeln!(
        s,
        "### Ordered claim: {} history rows, {} pending over {} aggregates\n",
        c.history, c.pending, c.aggregates
    );
    let _ = writeln!(
        s,
        "One table (`public.outbox`), created and adopted by an ordered outboxd on the empty table, then filled with \
         {} published history rows (`INSERT … SELECT generate_series`, as the scale scenario) and {} pending events \
         after them, both over {} aggregates, `VACUUM ANALYZE`, one `CHECKPOINT`. Two outboxd serve it, one with \
         the outbox `ordering=aggregate`, one with `ordering=none`; `ClaimBatch(max 100)` over gRPC goes to each in \
         turn (the order flipping every round), {} timed claims each after {} untimed rounds, each acked before the \
         next (untimed); both take from the same pending events. Every timed claim returned 100 events. `SQL ms` \
         is the claim statement's execution time under `EXPLAIN (ANALYZE, BUFFERS, WAL)` on the filled table, \
         rolled back, before the claims (each statement explained twice, the second kept; the ordered one as \
         outboxd builds it for `poison=block`, its commit-order bound letting every row through).\n",
        c.history,
        c.pending,
        c.aggregates,
        plan.ordered_claims,
        crate::ordering::WARM_UP
    );
    let _ = writeln!(
        s,
        "| outbox | p50 ms | p90 ms | p99 ms | max ms | SQL ms |\n| --- | ---: | ---: | ---: | ---: | ---: |"
    );
    for (label, side) in [
        (Order::Unordered.label(), &c.unordered),
        (Order::Ordered.label(), &c.ordered),
    ] {
        let q = |x| quantile(&side.claim_ms, x);
        let _ = writeln!(
            s,
            "| {label} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
            q(0.5),
            q(0.9),
            q(0.99),
            q(1.0),
            side.sql_ms
        );
    }
    let _ = writeln!(
        s,
        "| ordered / unordered | {:.2}× | {:.2}× | {:.2}× | {:.2}× | {:.2}× |\n",
        c.ratio(0.5),
        c.ratio(0.9),
        c.ratio(0.99),
        c.ratio(1.0),
        c.ordered.sql_ms / c.unordered.sql_ms
    );
    let _ = writeln!(
        s,
        "<details><summary>Claim plans (EXPLAIN ANALYZE, BUFFERS, WAL)</summary>\n"
    );
    for (label, side) in [
        (Order::Ordered.label(), &c.ordered),
        (Order::Unordered.label(), &c.unordered),
    ] {
        let _ = writeln!(s, "{label}:\n\n```\n{}\n```\n", side.plan);
    }
    let _ = writeln!(s, "</details>\n");
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{Check, checks};
    use crate::{
        Plan,
        cpu::{Component, MachineCpu},
        ordering::{ClaimSide, HotCase, OrderedClaim, OrderedDrainCase},
        scenarios::{DrainCase, DrainRun, ProducerCase, ProducerMode, Results},
    };

    /// A full run's plan with every scenario, one repetition.
    pub(crate) fn plan() -> Plan {
        Plan {
            quick: false,
            drain: true,
            producers: true,
            latency: true,
            scale: true,
            ordered_drain: true,
            ordered_claim: true,
            hot: true,
            reps: 1,
            events: 100_000,
            batch_sizes: vec![100],
            workers: vec![1],
            producer_secs: 10,
            rate: 2000,
            latency_secs: 30,
            poll_ms: vec![100],
            latency_batch: 100,
            latency_workers: 4,
            history: vec![5_000_000],
            pending: vec![10_000],
            leases: 10_000,
            claims: 30,
            aggregates: 10_000,
            ordered_history: 5_000_000,
            ordered_pending: 100_000,
            ordered_claims: 200,
            hot_events: 5_000,
            secure_pairs: true,
            secure_drain: true,
            secure_claims: 500,
            claim_drain: true,
            held_leases: true,
            claim_events: 40_000,
            claim_shapes: crate::claims::SHAPES.to_vec(),
            claim_vacuum: true,
            claim_fillfactor: None,
            held: vec![0, 1_000, 10_000],
            held_claims: 100,
        }
    }

    /// A drain of 100 000 events in 10 s with `wal` bytes and `pg` PostgreSQL
    /// CPU seconds per 100 000 events.
    fn run(wal: f64, pg: f64) -> DrainRun {
        DrainRun {
            events_per_sec: 10_000.0,
            secs: 10.0,
            wal_per_event: wal,
            machine: MachineCpu {
                busy_secs: 10.0,
                busy_share: 0.5,
                by: vec![(Component::Postgres, pg)],
            },
            ..DrainRun::default()
        }
    }

    fn find<'a>(checks: &'a [Check], part: &str) -> &'a Check {
        checks
            .iter()
            .find(|c| c.target.contains(part))
            .unwrap_or_else(|| panic!("no target with {part:?}"))
    }

    #[test]
    fn cost_targets_are_ratios_to_the_classic_relay() {
        let results = |o: DrainRun| Results {
            drain: vec![DrainCase {
                batch: 100,
                workers: 1,
                classic: vec![run(1200.0, 2.0)],
                outboxd: vec![o],
            }],
            ..Results::default()
        };
        let met = checks(&plan(), &results(run(1250.0, 2.0)));
        let wal = find(&met, "WAL bytes per published event ≤ 1.05×");
        assert_eq!(wal.pass, Some(true), "{wal:?}");
        assert!(
            wal.measured.contains("1.04× (1250 vs 1200 bytes/ev)"),
            "{wal:?}"
        );
        let cpu = find(&met, "PostgreSQL CPU per event ≤ 1.00×");
        assert_eq!(cpu.pass, Some(true), "{cpu:?}");
        let missed = checks(&plan(), &results(run(1300.0, 2.1)));
        assert_eq!(find(&missed, "WAL").pass, Some(false));
        assert_eq!(find(&missed, "PostgreSQL CPU").pass, Some(false));
        // Quick runs evaluate nothing.
        let quick = Plan {
            quick: true,
            ..plan()
        };
        assert!(
            checks(&quick, &results(run(1300.0, 2.1)))
                .iter()
                .all(|c| c.pass.is_none())
        );
    }

    #[test]
    fn producer_targets_pair_each_repetition_with_its_classic_window() {
        let r = Results {
            producer: vec![ProducerCase {
                mode: ProducerMode::Draining,
                classic: vec![10_000.0, 8_000.0, 12_000.0],
                outboxd: vec![9_500.0, 7_000.0, 10_000.0],
            }],
            ..Results::default()
        };
        let all = checks(&plan(), &r);
        let c = find(&all, "(draining)");
        // Ratios 0.95, 0.875, 0.83: median 0.875.
        assert_eq!(c.pass, Some(false), "{c:?}");
        assert!(c.measured.starts_with("0.88 [0.83–0.95]×"), "{c:?}");
    }

    fn rate(events_per_sec: f64) -> DrainRun {
        DrainRun {
            events_per_sec,
            secs: 10.0,
            ..DrainRun::default()
        }
    }

    fn side(claim_ms: Vec<f64>) -> ClaimSide {
        ClaimSide {
            claim_ms,
            sql_ms: f64::NAN,
            plan: String::new(),
        }
    }

    #[test]
    fn ordering_targets_are_ratios_to_the_unordered_outbox() {
        let r = Results {
            ordered_drain: vec![OrderedDrainCase {
                batch: 100,
                workers: 4,
                // Ratios 0.85, 0.7, 0.9: median 0.85.
                unordered: vec![rate(10_000.0), rate(10_000.0), rate(10_000.0)],
                ordered: vec![rate(8_500.0), rate(7_000.0), rate(9_000.0)],
            }],
            ordered_claim: Some(OrderedClaim {
                history: 5_000_000,
                pending: 100_000,
                aggregates: 10_000,
                ordered: side((1..=100).map(|i| f64::from(i) * 0.03).collect()),
                unordered: side((1..=100).map(|i| f64::from(i) * 0.02).collect()),
            }),
            hot: Some(HotCase {
                batch: 100,
                workers: 4,
                events: 5_000,
                runs: vec![rate(400.0)],
            }),
            ..Results::default()
        };
        let all = checks(&plan(), &r);
        let drain = find(&all, "ordered drain ≥ 0.8×");
        assert_eq!(drain.pass, Some(true), "{drain:?}");
        assert!(drain.target.contains("batch 100, 4 workers"), "{drain:?}");
        assert!(drain.target.contains("10000 aggregates"), "{drain:?}");
        assert!(
            drain
                .measured
                .starts_with("0.85 [0.70–0.90]× (8500 vs 10000 ev/s)"),
            "{drain:?}"
        );
        // 1.5× at every quantile: met, at the limit.
        for name in ["ordered claim p50", "ordered claim p99"] {
            let c = find(&all, name);
            assert_eq!(c.pass, Some(true), "{c:?}");
            assert!(c.measured.starts_with("1.50×"), "{c:?}");
        }
        let hot = find(&all, "single hot aggregate");
        assert!(hot.no_target && hot.pass.is_none(), "{hot:?}");
        assert_eq!(super::verdict(hot), "reported");
        assert_eq!(hot.measured, "400 ev/s");
        // A slower ordered drain misses.
        let slow = Results {
            ordered_drain: vec![OrderedDrainCase {
                batch: 100,
                workers: 4,
                unordered: vec![rate(10_000.0)],
                ordered: vec![rate(7_900.0)],
            }],
            ..Results::default()
        };
        assert_eq!(
            find(&checks(&plan(), &slow), "ordered drain").pass,
            Some(false)
        );
    }

    #[test]
    fn the_ordering_section_shows_every_part() {
        let r = Results {
            ordered_drain: vec![OrderedDrainCase {
                batch: 100,
                workers: 4,
                unordered: vec![rate(10_000.0)],
                ordered: vec![DrainRun {
                    holdback_secs: Some(0.25),
                    ..rate(9_000.0)
                }],
            }],
            ordered_claim: Some(OrderedClaim {
                history: 20_000,
                pending: 6_000,
                aggregates: 200,
                ordered: side(vec![2.0, 3.0]),
                unordered: side(vec![1.0, 2.0]),
            }),
            hot: Some(HotCase {
                batch: 100,
                workers: 4,
                events: 200,
                runs: vec![rate(300.0)],
            }),
            ..Results::default()
        };
        let mut s = String::new();
        super::ordering_section(&mut s, &plan(), &r);
        for part in [
            "## Per-aggregate order (#33)",
            "### Ordered drain",
            "| 100 | 4 | 10000 | 9000 | 0.90× |",
            "| 0.250 |",
            "### Ordered claim: 20000 history rows, 6000 pending over 200 aggregates",
            "| ordered / unordered |",
            "### A single hot aggregate, ordered",
            "| 300 |",
        ] {
            assert!(s.contains(part), "no {part:?} in\n{s}");
        }
        let mut empty = String::new();
        super::ordering_section(&mut empty, &plan(), &Results::default());
        assert!(empty.is_empty());
    }
}
