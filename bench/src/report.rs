//! REPORT.md: conditions, the targets table, every scenario's figures with
//! medians and spread, the claim plans and the exact commands.

use std::{fmt::Write as _, path::PathBuf, time::Duration};

use crate::{
    Plan,
    cpu::Component,
    db::LeaseStages,
    machine::Machine,
    scenarios::{Cycle, DrainCase, DrainRun, Results, ScalePoint},
    stats::Spread,
};

/// One line of the targets table.
#[derive(Debug, Clone)]
pub struct Check {
    pub target: String,
    pub measured: String,
    /// None: not evaluated (quick mode or scenario not run).
    pub pass: Option<bool>,
}

fn rates(runs: &[DrainRun]) -> Vec<f64> {
    runs.iter().map(|r| r.events_per_sec).collect()
}

/// contender / classic per repetition (they ran back to back in the same repetition).
fn ratios(case: &DrainCase) -> Vec<f64> {
    case.outboxd
        .iter()
        .zip(&case.classic)
        .map(|(o, c)| o.events_per_sec / c.events_per_sec)
        .collect()
}

/// A drain rate as a fraction of the confirm ceiling (0 without a ceiling).
fn ceiling_share(rate: f64, ceiling: f64) -> f64 {
    if ceiling > 0.0 { rate / ceiling } else { 0.0 }
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
        crate::stats::quantile(v, 0.1),
        crate::stats::quantile(v, 0.9)
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

pub fn checks(plan: &Plan, r: &Results) -> Vec<Check> {
    let judge = |ok: bool| if plan.quick { None } else { Some(ok) };
    let mut out = Vec::new();
    let ceiling = Spread::of(&r.ceiling);
    for case in &r.drain {
        let ratio = Spread::of(&ratios(case));
        let bare = Spread::of(&rates(&case.bare)).median;
        let classic = Spread::of(&rates(&case.classic)).median;
        let lean = lean_rate(case);
        let yardstick = match (bare > 0.0, lean > 0.0, classic > 0.0) {
            (true, true, true) => format!(
                " (the bare relay {:.2}×, the lean lease relay {:.2}×)",
                bare / classic,
                lean / classic
            ),
            (true, false, true) => format!(" (the bare relay {:.2}×)", bare / classic),
            _ => String::new(),
        };
        out.push(Check {
            target: format!("drain ≥ 1.2× classic ({})", case_name(case)),
            measured: format!("{}×{yardstick}", ratio.show(2)),
            pass: judge(ratio.median >= 1.2),
        });
    }
    for case in &r.drain {
        let o = Spread::of(&rates(&case.outboxd));
        let share = ceiling_share(o.median, ceiling.median);
        out.push(Check {
            target: format!("drain ≥ 80 % of confirm ceiling ({})", case_name(case)),
            measured: format!(
                "{:.0} % ({:.0} of {:.0} ev/s; the classic relay {:.0} %; the bare relay {:.0} %; the lean lease relay {:.0} %; the broker alone at this shape {:.0} %)",
                share * 100.0,
                o.median,
                ceiling.median,
                ceiling_share(Spread::of(&rates(&case.classic)).median, ceiling.median) * 100.0,
                ceiling_share(Spread::of(&rates(&case.bare)).median, ceiling.median) * 100.0,
                ceiling_share(lean_rate(case), ceiling.median) * 100.0,
                ceiling_share(Spread::of(&case.broker_alone).median, ceiling.median) * 100.0
            ),
            pass: judge(share >= 0.8),
        });
    }
    if let Some(lp) = r.latency.iter().find(|c| c.poll_ms.is_none()) {
        let p50 = Spread::of(&lp.runs.iter().map(|x| x.p50_ms).collect::<Vec<_>>());
        let p99 = Spread::of(&lp.runs.iter().map(|x| x.p99_ms).collect::<Vec<_>>());
        out.push(Check {
            target: format!("latency p50 ≤ 5 ms at {} ev/s", plan.rate),
            measured: format!("{} ms", p50.show(2)),
            pass: judge(p50.median <= 5.0),
        });
        out.push(Check {
            target: format!("latency p99 ≤ 25 ms at {} ev/s", plan.rate),
            measured: format!("{} ms", p99.show(2)),
            pass: judge(p99.median <= 25.0),
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
            });
        }
    }
    if !r.drain.is_empty() {
        let worst = r
            .drain
            .iter()
            .flat_map(|c| c.outboxd.iter().map(|x| x.xacts_per_event))
            .fold(0f64, f64::max);
        out.push(Check {
            target: "≤ 1 DB statement per event (outboxd, worst drain run)".into(),
            measured: format!("{worst:.4} transactions (= statements) per event"),
            pass: judge(worst <= 1.0),
        });
    }
    out
}

fn verdict(c: &Check) -> &'static str {
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
    if !r.latency.is_empty() {
        latency_section(&mut s, plan, r);
        producer_section(&mut s, r);
    }
    if !r.scale.is_empty() {
        scale_section(&mut s, plan, r);
    }
    if !r.drain.is_empty() {
        cost_section(&mut s, r);
    }

    let _ = writeln!(s, "## Commands\n");
    let _ = writeln!(
        s,
        "```sh\ncargo build --release --bins\n{}\n```\n",
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
    let notes = observations(plan, r);
    if !notes.is_empty() || !r.notes.is_empty() {
        let _ = writeln!(s, "## Observations (computed from this run)\n");
        for note in notes.iter().chain(&r.notes) {
            let _ = writeln!(s, "- {note}");
        }
        s.push('\n');
    }
    s
}

/// Facts the figures imply, stated where the run shows them.
fn observations(plan: &Plan, r: &Results) -> Vec<String> {
    let mut out = Vec::new();
    let ceiling = Spread::of(&r.ceiling).median;
    for case in &r.drain {
        let classic = Spread::of(&rates(&case.classic)).median;
        if ceiling > 0.0 && classic * 1.2 > ceiling {
            out.push(format!(
                "Drain, {}: the classic relay already reaches {:.0} % of the one-client confirm ceiling \
                 ({classic:.0} of {ceiling:.0} ev/s), so 1.2× classic ({:.0} ev/s) lies above the ceiling: \
                 on this broker the broker, not the relay design, bounds both.",
                case_name(case),
                classic / ceiling * 100.0,
                classic * 1.2
            ));
        }
    }
    out.extend(r.drain.iter().filter_map(|case| shape_bound(case, ceiling)));
    out.extend(r.drain.iter().filter_map(|case| bare_bound(case, ceiling)));
    out.extend(r.drain.iter().filter_map(|case| lean_bound(case, ceiling)));
    let busiest = r
        .drain
        .iter()
        .flat_map(designs)
        .filter(|(_, runs)| !runs.is_empty())
        .map(|(_, runs)| median_of(runs, |x| x.machine.busy_share))
        .fold(0.0, f64::max);
    out.extend(
        r.drain
            .iter()
            .filter_map(|case| drain_budget(case, busiest, ceiling)),
    );
    let trigger = r.producer.iter().find(|(l, _)| l.contains("NOTIFY"));
    let untriggered = r.producer.iter().find(|(l, _)| l.contains("disabled"));
    if let (Some((_, with)), Some((_, without))) = (trigger, untriggered)
        && *with < f64::from(plan.rate)
    {
        // The producer test runs with no outboxd watching, so the trigger
        // notifies on every commit; in the latency scenario outboxd keeps it
        // quiet and producers commit at the trigger-free rate.
        let verdict = if *without < f64::from(plan.rate) {
            format!(
                "Even without it, {} ev/s of one-event transactions is above this machine's commit rate here; \
                 the latency scenario's latencies are measured at the rate the producer achieved (see the table).",
                plan.rate
            )
        } else {
            "outboxd keeps the trigger quiet while it sees inserts arriving (it probes the sequence instead), so \
             the latency scenario's producers commit at the trigger-free rate."
                .to_owned()
        };
        out.push(format!(
            "Producers: with outboxd's NOTIFY trigger notifying every commit (no outboxd watching the table), \
             16 connections commit {with:.0} one-event transactions/s; with the trigger disabled {without:.0}/s. \
             PostgreSQL serializes the commits of transactions that NOTIFY (a cluster-wide lock taken before \
             commit and held until after the WAL flush), so each such commit waits for the previous one's fsync \
             and they cannot share a group commit. {verdict}"
        ));
    }
    out
}

/// Whether CPU or waiting bounds a drain case that misses 1.2× the classic
/// relay: the machine share the contender would have to keep busy at the CPU
/// it spent per event, against the busiest drain of the run. Tuning starts from
/// this split: beyond what any drain kept busy, only less work per event
/// reaches the target; within it, less waiting could.
fn drain_budget(case: &DrainCase, busiest: f64, ceiling: f64) -> Option<String> {
    let ratio = Spread::of(&ratios(case)).median;
    let runs = &case.outboxd;
    let target = 1.2 * Spread::of(&rates(&case.classic)).median;
    if ratio.is_nan()
        || ratio >= 1.2
        // The ceiling notes above already say why this case cannot reach it.
        || (ceiling > 0.0 && target > ceiling)
        || (target > Spread::of(&case.broker_alone).median && !case.broker_alone.is_empty())
        // Nor when the bare relay, doing the least work, did not reach it.
        || (target > Spread::of(&rates(&case.bare)).median && !case.bare.is_empty())
        || runs.iter().any(|x| x.machine.busy_share <= 0.0 || x.secs <= 0.0)
    {
        return None;
    }
    let cores = median_of(runs, |x| {
        x.machine.busy_secs / x.machine.busy_share / x.secs
    });
    let spent = machine_per100k(runs, None);
    let needed = busy_needed(spent / 100_000.0, target, cores);
    let bound = if needed > busiest {
        "more than any drain of this run kept busy, so less work per event, not less waiting alone, is what would reach it"
    } else {
        "within what drains of this run kept busy, so less waiting in each batch's cycle could reach it at this CPU per event"
    };
    Some(format!(
        "Drain, {}: 1.2× the classic relay is {target:.0} ev/s. At the CPU outboxd + relay spent per event here \
         ({spent:.2} s per 100 000 events with everything on the machine, RabbitMQ's {:.2} of it; the classic relay \
         {:.2}), that rate needs {:.0} % of the machine's {cores:.1} cores busy; this case kept {:.0} % busy and the \
         busiest drain {:.0} %: {bound}.",
        case_name(case),
        machine_per100k(runs, Some(Component::RabbitMq)),
        machine_per100k(&case.classic, None),
        needed * 100.0,
        median_of(runs, |x| x.machine.busy_share) * 100.0,
        busiest * 100.0,
    ))
}

fn lean_rate(case: &DrainCase) -> f64 {
    Spread::of(&rates(&case.lean)).median
}

/// "lies" or "lie", for a list of `n` targets.
fn lie(n: usize) -> &'static str {
    if n == 1 { "lies" } else { "lie" }
}

/// A drain target by name, with the rate it asks for in ev/s.
type Target = (&'static str, f64);

/// The drain targets a case's lease design missed.
fn missed_targets(classic: f64, outboxd: f64, ceiling: f64) -> Vec<Target> {
    [
        ("1.2× the classic relay", classic * 1.2),
        ("80 % of the ceiling", 0.8 * ceiling),
    ]
    .into_iter()
    .filter(|&(_, rate)| rate > 0.0 && outboxd < rate)
    .collect()
}

/// Where a drain case's missed targets stand against the broker alone, fed as
/// the case's workers feed it (one batch in flight each, no database). A target
/// above that rate is out of reach for any relay that keeps one batch per worker
/// in flight, whatever its database side costs; one below it is a matter of
/// what the relay does besides publishing.
fn shape_bound(case: &DrainCase, ceiling: f64) -> Option<String> {
    let alone = Spread::of(&case.broker_alone).median;
    let classic = Spread::of(&rates(&case.classic)).median;
    let outboxd = Spread::of(&rates(&case.outboxd)).median;
    if alone <= 0.0 || classic <= 0.0 || (ceiling > 0.0 && classic * 1.2 > ceiling) {
        return None;
    }
    let missed = missed_targets(classic, outboxd, ceiling);
    if missed.is_empty() {
        return None;
    }
    let needs: Vec<String> = missed
        .iter()
        .map(|(name, rate)| {
            format!(
                "{name} ({rate:.0} ev/s) is {:.0} % of it",
                rate / alone * 100.0
            )
        })
        .collect();
    let above: Vec<&str> = missed
        .iter()
        .filter(|&&(_, rate)| rate > alone)
        .map(|&(name, _)| name)
        .collect();
    let verdict = if above.is_empty() {
        "Within it: what the relay does besides publishing is what stands between this case and the target"
            .to_owned()
    } else {
        format!(
            "{} {} above it: no relay that keeps one batch per worker in flight reaches that on this broker, \
             whatever its database side costs",
            above.join(" and "),
            lie(above.len())
        )
    };
    Some(format!(
        "Drain, {}: the broker alone, fed by {} channel{}, each publishing a batch of {} and awaiting its confirms \
         before the next (no database), confirmed {alone:.0} msg/s ({:.0} % of the one-client ceiling); the classic \
         relay reached {:.0} % of that, outboxd + relay {:.0} %. {}. {verdict}.",
        case_name(case),
        case.workers,
        if case.workers == 1 { "" } else { "s" },
        case.batch,
        ceiling_share(alone, ceiling) * 100.0,
        classic / alone * 100.0,
        outboxd / alone * 100.0,
        needs.join("; "),
    ))
}

/// Where a drain case's missed targets stand against the bare relay of the
/// same shape: the least database work any relay that reads and marks each row
/// does, none of it on the publish's path. A target above its rate asks more
/// than the least work reached here; below it, the lease and the hop through
/// outboxd are what the design pays.
fn bare_bound(case: &DrainCase, ceiling: f64) -> Option<String> {
    let bare = Spread::of(&rates(&case.bare)).median;
    let (classic, outboxd, missed) = missed_against(case, bare, ceiling)?;
    let verdict = split_at(
        &missed,
        bare,
        "even the least work a relay that reads and marks each row does, one batch per worker in flight and \
         nothing waiting on its database statements, did not reach that here",
        "what outboxd + relay does beyond the bare relay (the lease's write, the hop through outboxd)",
    );
    Some(format!(
        "Drain, {}: the bare relay (read each row, publish it with confirms, mark it; no lock, no lease, \
         reads ahead and marks beside the next publish) drained {bare:.0} ev/s, {:.0} % of the ceiling and \
         {:.2}× the classic relay; outboxd + relay kept {:.0} % of its rate, the classic relay {:.0} %. {}.",
        case_name(case),
        ceiling_share(bare, ceiling) * 100.0,
        bare / classic,
        outboxd / bare * 100.0,
        classic / bare * 100.0,
        verdict,
    ))
}

/// Where a drain case's missed targets stand against the lean lease relay of
/// the same shape: the lease's two writes per row with no service around them.
/// A target above its rate asks more of the lease itself than this machine
/// gives; below it, what outboxd adds around the lease is what costs.
fn lean_bound(case: &DrainCase, ceiling: f64) -> Option<String> {
    let lean = lean_rate(case);
    let bare = Spread::of(&rates(&case.bare)).median;
    let (classic, outboxd, missed) = missed_against(case, lean, ceiling)?;
    let verdict = split_at(
        &missed,
        lean,
        "the lease's own writes, with no service around them, did not reach that here",
        "what outboxd adds around the lease (the gRPC hop and its processes, the rest of its claim)",
    );
    let of_bare = if bare > 0.0 {
        format!(
            "; it kept {:.0} % of the bare relay's rate",
            lean / bare * 100.0
        )
    } else {
        String::new()
    };
    Some(format!(
        "Drain, {}: the lean lease relay (each row leased and acked by one autocommit UPDATE each, straight from \
         the harness on outboxd's table; no service) drained {lean:.0} ev/s, {:.0} % of the ceiling and {:.2}× the \
         classic relay{of_bare}, and outboxd + relay kept {:.0} % of its. {verdict}.",
        case_name(case),
        ceiling_share(lean, ceiling) * 100.0,
        lean / classic,
        outboxd / lean * 100.0,
    ))
}

/// The classic relay's and the lease design's median rates and the drain
/// targets the lease design missed, for a note against a yardstick that
/// drained at `yardstick` ev/s; `None` when either was not measured or
/// nothing was missed.
fn missed_against(
    case: &DrainCase,
    yardstick: f64,
    ceiling: f64,
) -> Option<(f64, f64, Vec<Target>)> {
    let classic = Spread::of(&rates(&case.classic)).median;
    let outboxd = Spread::of(&rates(&case.outboxd)).median;
    if yardstick <= 0.0 || classic <= 0.0 {
        return None;
    }
    let missed = missed_targets(classic, outboxd, ceiling);
    (!missed.is_empty()).then_some((classic, outboxd, missed))
}

/// The verdict on missed targets against a yardstick's rate: those above it
/// get `above`'s reason, those within it are put down to `cost`.
fn split_at(missed: &[Target], rate: f64, above: &str, cost: &str) -> String {
    let (over, within): (Vec<_>, Vec<_>) = missed.iter().partition(|&&(_, r)| r > rate);
    let names = |v: &[&Target]| v.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(" and ");
    let mut verdict = Vec::new();
    if !over.is_empty() {
        verdict.push(format!(
            "{} {} above it: {above}",
            names(&over),
            lie(over.len())
        ));
    }
    if !within.is_empty() {
        verdict.push(format!(
            "{} {} within it: {cost} is what stands between this case and {}",
            names(&within),
            lie(within.len()),
            if within.len() == 1 { "it" } else { "them" }
        ));
    }
    verdict.join("; ")
}

/// Share of `cores` busy to process `rate` events/s at `cpu_per_event` CPU
/// seconds each.
fn busy_needed(cpu_per_event: f64, rate: f64, cores: f64) -> f64 {
    if cores > 0.0 {
        cpu_per_event * rate / cores
    } else {
        f64::INFINITY
    }
}

fn drain_section(s: &mut String, plan: &Plan, r: &Results) {
    let ceiling = Spread::of(&r.ceiling);
    let _ = writeln!(s, "## Drain: {} pre-filled events\n", plan.events);
    let _ = writeln!(
        s,
        "Events per second from the start of the relay until every row is published and every message is in the queue. \
         Workers: classic relay workers (each its own DB connection and confirm channel) = `outbox-relay --concurrency` slots \
         (each its own confirm channel), one relay process. RabbitMQ confirm ceiling (one client, one channel, \
         sends queued 100 at a time, 2 000 unconfirmed in flight, same messages): **{} msg/s**. \
         Broker alone, same shape: the broker fed as the case's workers feed it, with no database \
         (as many channels as workers, each publishing one batch and awaiting all its confirms before the next), \
         measured in each repetition before the case's drains; it bounds any relay that keeps one batch per worker \
         in flight, and the next column is how much of it each design kept. \
         Bare relay: the least any relay does per event (read each row once, publish it with confirms, mark it \
         published), on the classic table, with no lock, no lease and no transaction around the publish, reading \
         ahead and marking each batch beside the next one's publish; not safe to run, a yardstick: how far the least \
         work with no waiting gets on this machine, and how much of that each design keeps. It is not a strict \
         bound: its statements run beside the publishes and take CPU from the broker there. \
         Lean lease relay: the lease design's two writes per row and nothing else, on outboxd's table with its \
         indexes, straight from the harness: each worker leases a batch (`UPDATE … SET locked_until`), publishes it \
         with confirms, and acks it (`UPDATE … SET published_at`), the ack and the next claim beside the next \
         publish; no outboxd, no gRPC, no look for expired leases. A yardstick too: beside the bare relay it prices \
         the lease's write, beside outboxd + relay the service around it.\n",
        ceiling.show(0)
    );
    let _ = writeln!(
        s,
        "| batch | workers | classic relay ev/s | outboxd + relay ev/s | ratio | share of ceiling | classic relay's share \
         | broker alone, same shape, msg/s | of it: classic / outboxd | bare relay ev/s | its share of ceiling | of it: classic / outboxd \
         | lean lease relay ev/s | its share of ceiling | of the bare relay | outboxd + relay, of it |"
    );
    let _ = writeln!(
        s,
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    // The classic relay's share shows what a worker with one batch in flight
    // reaches against the ceiling's 2 000 unconfirmed messages, whatever the design.
    let share = |rate: f64| ceiling_share(rate, ceiling.median) * 100.0;
    for case in &r.drain {
        let c = Spread::of(&rates(&case.classic));
        let o = Spread::of(&rates(&case.outboxd));
        let ratio = Spread::of(&ratios(case));
        let alone = Spread::of(&case.broker_alone);
        let bare = Spread::of(&rates(&case.bare));
        let lean = Spread::of(&rates(&case.lean));
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {}× | {:.0} % | {:.0} % | {} | {:.0} % / {:.0} % | {} | {:.0} % | {:.0} % / {:.0} % | {} | {:.0} % | {:.0} % | {:.0} % |",
            case.batch,
            case.workers,
            c.show(0),
            o.show(0),
            ratio.show(2),
            share(o.median),
            share(c.median),
            alone.show(0),
            c.median / alone.median * 100.0,
            o.median / alone.median * 100.0,
            bare.show(0),
            share(bare.median),
            c.median / bare.median * 100.0,
            o.median / bare.median * 100.0,
            lean.show(0),
            share(lean.median),
            lean.median / bare.median * 100.0,
            o.median / lean.median * 100.0,
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

fn producer_section(s: &mut String, r: &Results) {
    if r.producer.is_empty() {
        return;
    }
    let _ = writeln!(
        s,
        "Producer commit ceiling: 16 connections commit one-event transactions as fast as they can \
         (the load the latency scenario asks for is one event per transaction):\n"
    );
    let _ = writeln!(s, "| table | commits/s |\n| --- | ---: |");
    for (label, rate) in &r.producer {
        let _ = writeln!(s, "| {label} | {rate:.0} |");
    }
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
         `INSERT … SELECT generate_series`); leases in flight are the oldest pending rows leased for an hour, \
         ahead of the claimable ones. `SQL ms` is the claim statement's execution time under \
         `EXPLAIN (ANALYZE, BUFFERS, WAL)`, rolled back, once per table.\n",
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
    // The plans of the baseline and of the heaviest points, for profiling.
    let mut shown = Vec::new();
    if let Some(first) = r.scale.first() {
        shown.push(first);
    }
    if let Some(big) = r
        .scale
        .iter()
        .filter(|p| p.leases == 0)
        .max_by_key(|p| (p.history, p.pending))
    {
        shown.push(big);
    }
    shown.extend(r.scale.iter().filter(|p| p.leases > 0));
    let _ = writeln!(
        s,
        "<details><summary>Claim plans (EXPLAIN ANALYZE, BUFFERS, WAL)</summary>\n"
    );
    for p in shown {
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

/// The drains of a case: the two designs, then the yardsticks.
fn designs(case: &DrainCase) -> [(&'static str, &[DrainRun]); 4] {
    [
        ("classic relay", &case.classic),
        ("outboxd + relay", &case.outboxd),
        ("bare relay (yardstick)", &case.bare),
        ("lean lease relay (yardstick)", &case.lean),
    ]
}

fn machine_table(s: &mut String, r: &Results) {
    let _ = writeln!(
        s,
        "Whole machine over each drain, from the relay's start until the backlog was out: busy CPU seconds of both \
         cores per 100 000 events (user + system + interrupts from /proc/stat, steal excluded), split by process name \
         from /proc/PID/stat (PostgreSQL includes its background workers and the children the postmaster reaped, \
         such as autovacuum; the harness includes the classic, bare and lean lease relays' workers and the drain monitor; other is what \
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
         classic, bare and lean lease relays by the harness around their statements; outboxd by its `outbox_rpc_duration_seconds` and \
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
                Cycle::Bare { .. } => format!(
                    "SELECT (reader, ahead of the workers) {:.2}, publish → last confirm {:.2}, UPDATE (beside the next publish) {:.2}",
                    med(0),
                    med(1),
                    med(2)
                ),
                Cycle::Lean { .. } => format!(
                    "claim UPDATE (beside the publish) {:.2}, publish → last confirm {:.2}, ack UPDATE (beside the next publish) {:.2}",
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

#[cfg(test)]
mod tests {
    use super::{bare_bound, busy_needed, lean_bound, shape_bound};
    use crate::scenarios::{DrainCase, DrainRun};

    fn case(classic: f64, outboxd: f64, alone: f64) -> DrainCase {
        let run = |rate| DrainRun {
            events_per_sec: rate,
            ..DrainRun::default()
        };
        DrainCase {
            batch: 100,
            workers: 1,
            classic: vec![run(classic)],
            outboxd: vec![run(outboxd)],
            broker_alone: vec![alone],
            bare: Vec::new(),
            lean: Vec::new(),
        }
    }

    /// Fails naming the note unless it says every one of `parts`.
    fn says(note: &str, parts: &[&str]) {
        for part in parts {
            assert!(note.contains(part), "{part:?} not in: {note}");
        }
    }

    #[test]
    fn shape_bound_says_which_missed_targets_lie_above_the_broker_alone() {
        let note = |c, o, alone| shape_bound(&case(c, o, alone), 18_000.0).unwrap_or_default();
        says(
            &note(10_000.0, 9_000.0, 11_000.0),
            &[
                "1.2× the classic relay and 80 % of the ceiling lie above it",
                "classic relay reached 91 % of that, outboxd + relay 82 %",
                "1.2× the classic relay (12000 ev/s) is 109 % of it",
            ],
        );
        says(
            &note(10_000.0, 9_000.0, 13_000.0),
            &["80 % of the ceiling lies above it"],
        );
        says(
            &note(10_000.0, 9_000.0, 16_000.0),
            &["is 75 % of it; 80 % of the ceiling (14400 ev/s) is 90 % of it. Within it"],
        );
        // Targets met: nothing to say.
        assert!(shape_bound(&case(10_000.0, 15_000.0, 16_000.0), 18_000.0).is_none());
        // Without a broker-alone figure nothing is claimed.
        let mut unmeasured = case(10_000.0, 9_000.0, 0.0);
        unmeasured.broker_alone.clear();
        assert!(shape_bound(&unmeasured, 18_000.0).is_none());
    }

    #[test]
    fn bare_bound_splits_missed_targets_at_the_bare_relay() {
        let with_bare = |classic, outboxd, bare| {
            let mut c = case(classic, outboxd, 20_000.0);
            c.bare = vec![DrainRun {
                events_per_sec: bare,
                ..DrainRun::default()
            }];
            bare_bound(&c, 15_000.0).unwrap_or_default()
        };
        // 1.2× classic and 80 % of the ceiling are both 12 000 ev/s here.
        says(
            &with_bare(10_000.0, 9_000.0, 11_000.0),
            &[
                "1.2× the classic relay and 80 % of the ceiling lie above it",
                "drained 11000 ev/s, 73 % of the ceiling and 1.10× the classic relay",
                "outboxd + relay kept 82 % of its rate, the classic relay 91 %",
            ],
        );
        // 1.2× classic = 10 800 under the bare relay's 11 500; 80 % of the ceiling above it.
        says(
            &with_bare(9_000.0, 9_000.0, 11_500.0),
            &[
                "80 % of the ceiling lies above it",
                "1.2× the classic relay lies within it",
            ],
        );
        // Targets met, or no bare relay measured: nothing to say.
        assert!(with_bare(10_000.0, 13_000.0, 14_000.0).is_empty());
        assert!(bare_bound(&case(10_000.0, 9_000.0, 20_000.0), 15_000.0).is_none());
    }

    #[test]
    fn lean_bound_splits_missed_targets_at_the_lean_lease_relay() {
        let with_lean = |classic, outboxd, bare, lean| {
            let mut c = case(classic, outboxd, 20_000.0);
            c.bare = vec![DrainRun {
                events_per_sec: bare,
                ..DrainRun::default()
            }];
            c.lean = vec![DrainRun {
                events_per_sec: lean,
                ..DrainRun::default()
            }];
            lean_bound(&c, 15_000.0).unwrap_or_default()
        };
        // Both targets are 12 000 ev/s; the lease alone reached 10 000.
        says(
            &with_lean(10_000.0, 9_000.0, 12_500.0, 10_000.0),
            &[
                "1.2× the classic relay and 80 % of the ceiling lie above it: the lease's own writes",
                "drained 10000 ev/s, 67 % of the ceiling and 1.00× the classic relay",
                "it kept 80 % of the bare relay's rate, and outboxd + relay kept 90 % of its",
            ],
        );
        // The lease alone reached 12 500: the service is what costs.
        says(
            &with_lean(10_000.0, 9_000.0, 13_000.0, 12_500.0),
            &["1.2× the classic relay and 80 % of the ceiling lie within it: what outboxd adds"],
        );
        assert!(with_lean(10_000.0, 13_000.0, 14_000.0, 13_500.0).is_empty());
        assert!(lean_bound(&case(10_000.0, 9_000.0, 20_000.0), 15_000.0).is_none());
    }

    #[test]
    fn busy_needed_scales_cpu_per_event_by_rate_over_cores() {
        // 12.63 CPU s per 100 000 events at 15 842 ev/s on 2 cores: the whole machine.
        let share = busy_needed(12.63e-5, 15_842.0, 2.0);
        assert!((share - 1.0004).abs() < 1e-3, "{share}");
        assert!((busy_needed(10e-5, 10_000.0, 2.0) - 0.5).abs() < 1e-9);
        assert!(busy_needed(1e-5, 1.0, 0.0).is_infinite());
    }
}
