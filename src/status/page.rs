//! The page itself: server-rendered HTML (maud escapes every value), inline
//! style, no scripts; the browser reloads it every [`super::REFRESH`].
//!
//! Each figure cell carries `data-outbox` and `data-figure` attributes with
//! the plain value, so a test (or a scraper) reads exactly what is shown
//! without parsing the human-friendly text.

use std::time::Duration;

use bytesize::ByteSize;
use chrono::{DateTime, SecondsFormat, Utc};
use maud::{DOCTYPE, Markup, html};

use super::view::{BLOCKED_KEYS_SHOWN, OutboxView, View};
use crate::tasks::watchdog::{DatabaseReport, HolderKind};

const STYLE: &str = "
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; background: #fafafa; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.15em; margin: 1.4em 0 .4em; }
h3 { font-size: 1em; margin: 1em 0 .3em; }
table { border-collapse: collapse; margin: .3em 0 .8em; background: #fff; }
th, td { border: 1px solid #d4d4d4; padding: .25em .6em; text-align: left; vertical-align: top; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
th { background: #f0f0f0; font-weight: 600; }
.muted { color: #666; } .when { color: #666; font-size: .9em; }
.bad { background: #fde8e8; } .warn { background: #fff6d9; } .ok { background: #eaf7ea; }
td.attention { font-weight: 700; border: 2px solid #1b1b1b; }
td.attention.bad { background: #f4b4b4; } td.attention.warn { background: #ffe08a; }
td.attention::before { content: '\\25B2\\00A0'; }
td.last-error { max-width: 28em; overflow-wrap: anywhere; font-size: .9em; }
.error { color: #a00; }
code { font-size: .95em; }
";

pub fn render(view: &View, refresh: Duration) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta http-equiv="refresh" content=(refresh.as_secs());
                title { "outboxd status" }
                style { (STYLE) }
            }
            body {
                h1 { "outboxd status" }
                p.when {
                    "Page made " (timestamp(view.rendered_at))
                    "; it reloads every " (refresh.as_secs()) " s. Read-only: "
                    code { "outboxctl" } " redrives and discards."
                }
                h2 { "Outboxes" }
                (outboxes(view))
                h2 { "The database" }
                @match &view.database {
                    Some(report) => (database(report, &view.outboxes)),
                    None => p.muted {
                        "The database watchdog has no sample yet: it reads the database every --watchdog-interval."
                    },
                }
            }
        }
    }
}

fn outboxes(view: &View) -> Markup {
    html! {
        @if view.outboxes.is_empty() {
            p.muted { "No outbox this credential administers." }
        } @else {
            table id="outboxes" {
                tr {
                    th { "Outbox" } th { "Table" } th { "Pending" } th { "In flight" }
                    th { "Oldest pending" } th { "Dead letters" } th { "Blocked keys" }
                    th { "Oldest blocked" } th title="At the last gauge sample (--metrics-interval)" { "Commit-order hold" }
                    th title="The newest dead letter's error, else the error of the pending event retried last" { "Last error" }
                    th { "Read at" }
                }
                @for outbox in &view.outboxes {
                    (outbox_row(outbox))
                }
            }
            @for outbox in view.outboxes.iter().filter(|o| o.spec.ordering.blocks()) {
                (blocked_keys(outbox))
            }
        }
        @if view.hidden > 0 {
            p.muted { (view.hidden) " more outbox(es) configured, not shown: this credential has no admin scope for them." }
        }
    }
}

fn outbox_row(outbox: &OutboxView) -> Markup {
    let name = outbox.spec.name.as_str();
    let figure = |figure: &str, value: String, shown: String, attention: Attention| {
        html! {
            td class=(attention.class()) data-outbox=(name) data-figure=(figure) data-value=(value)
                data-attention=[attention.name()] { (shown) }
        }
    };
    html! {
        tr data-outbox=(name) {
            td { b { (name) } br; span.muted { "ordering=" (outbox.spec.ordering) } }
            td { code { (outbox.spec.table) } }
            @match &outbox.stats {
                Ok(stats) => {
                    (figure("pending", stats.pending.to_string(), stats.pending.to_string(), Attention::None))
                    (figure("in_flight", stats.in_flight.to_string(), stats.in_flight.to_string(), Attention::None))
                    (figure("oldest_pending_age", secs(stats.oldest_pending_age), age(stats.oldest_pending_age), Attention::of_pending_age(stats.oldest_pending_age)))
                    (figure("dead_lettered", stats.dead_lettered.to_string(), stats.dead_lettered.to_string(), Attention::bad_if(stats.dead_lettered > 0)))
                    (figure("blocked_keys", stats.blocked_keys.to_string(), stats.blocked_keys.to_string(), Attention::bad_if(stats.blocked_keys > 0)))
                    (figure("oldest_blocked_age", secs(stats.oldest_blocked_age), age(stats.oldest_blocked_age), Attention::bad_if(!stats.oldest_blocked_age.is_zero())))
                }
                Err(error) => td.error colspan="6" { "could not read: " (error) }
            }
            (figure("commit_order_holdback", secs(outbox.holdback), holdback(outbox.holdback), Attention::of_holdback(outbox.holdback)))
            @match &outbox.stats {
                Ok(stats) => td.last-error data-outbox=(name) data-figure="last_error" {
                    @match &stats.last_error {
                        Some(error) => code { (shorten(error, LAST_ERROR_SHOWN)) },
                        None => span.muted { "–" },
                    }
                },
                Err(_) => td.muted { "–" },
            }
            td.when data-outbox=(name) data-figure="read_at" { (timestamp(outbox.read_at)) }
        }
    }
}

/// Characters of an outbox's last error shown on the page; `outboxctl
/// dead-letters list` and `inspect` show it whole.
const LAST_ERROR_SHOWN: usize = 300;

/// The oldest pending event's age at which its cell asks for a look, and at
/// which it is marked bad: the chart's `OutboxOldestPendingAgeHigh` fires at
/// 5 minutes by default.
const PENDING_AGE_WARN: Duration = Duration::from_secs(60);
const PENDING_AGE_BAD: Duration = Duration::from_secs(300);

/// Whether a figure needs someone's attention. Marked with a class (colour),
/// bold type, a border and a sign before the value, so it still stands out
/// printed in grey or to a reader who cannot tell the colours apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Attention {
    None,
    Warn,
    Bad,
}

impl Attention {
    fn bad_if(bad: bool) -> Self {
        if bad { Self::Bad } else { Self::None }
    }

    fn of_pending_age(age: Duration) -> Self {
        if age >= PENDING_AGE_BAD {
            Self::Bad
        } else if age >= PENDING_AGE_WARN {
            Self::Warn
        } else {
            Self::None
        }
    }

    /// Holding new events back for a transaction open a minute is worth a look.
    fn of_holdback(held: Duration) -> Self {
        if held >= PENDING_AGE_WARN {
            Self::Warn
        } else {
            Self::None
        }
    }

    fn name(self) -> Option<&'static str> {
        match self {
            Self::None => None,
            Self::Warn => Some("warn"),
            Self::Bad => Some("bad"),
        }
    }

    /// The figure cell's classes: numbers align right (`n`), and more.
    fn class(self) -> &'static str {
        match self {
            Self::None => "n",
            Self::Warn => "n attention warn",
            Self::Bad => "n attention bad",
        }
    }
}

fn shorten(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

fn holdback(held: Duration) -> String {
    if held.is_zero() {
        "–".to_owned()
    } else {
        age(held)
    }
}

fn blocked_keys(outbox: &OutboxView) -> Markup {
    let name = outbox.spec.name.as_str();
    html! {
        h3 { "Blocked keys of " (name) }
        @match &outbox.blocked {
            Err(error) => p.error { "could not read: " (error) },
            Ok(keys) if keys.is_empty() => p.muted { "None: every aggregate is moving." },
            Ok(keys) => {
                table.blocked data-outbox=(name) {
                    tr { th { "Aggregate" } th { "Dead-lettered head" } th { "Blocked for" } th { "Events held" } }
                    @for key in keys {
                        tr {
                            td { code { (key.aggregate_id) } }
                            td { code { (key.head) } }
                            td.n { (age(since(key.blocked_since, outbox.read_at))) }
                            td.n { (key.held) }
                        }
                    }
                }
                @if keys.len() as u32 >= BLOCKED_KEYS_SHOWN {
                    p.muted { "The " (BLOCKED_KEYS_SHOWN) " oldest; " code { "outboxctl blocked-keys list" } " lists them all." }
                }
            }
        }
    }
}

fn database(report: &DatabaseReport, outboxes: &[OutboxView]) -> Markup {
    let sample = &report.sample;
    html! {
        p.when { "Sampled " (timestamp(sample.read_at)) " (database clock)." }
        h3 { "xmin horizon" }
        p {
            "Held back for "
            span class=(if report.holders.is_empty() { "ok" } else { "warn" }) data-figure="xmin_horizon_age" data-value=(secs(report.horizon_age)) {
                (age(report.horizon_age))
            }
            @if report.holders.is_empty() { " — nothing holds it." }
        }
        @if !report.holders.is_empty() {
            table id="holders" {
                tr { th { "Held by" } th { "Who" } th { "State" } th { "For" } }
                @for holder in &report.holders {
                    tr {
                        @match &holder.kind {
                            HolderKind::Transaction { pid, application_name, state, .. } => {
                                td { "transaction" }
                                td { "pid " (pid) " · " (or_none(application_name)) }
                                td { (state) }
                            }
                            HolderKind::Slot { name, slot_type, active } => {
                                td { "replication slot" }
                                td { code { (name) } " (" (slot_type) ")" }
                                td { (if *active { "active" } else { "inactive" }) }
                            }
                            HolderKind::Prepared { gid, owner } => {
                                td { "prepared transaction" }
                                td { code { (gid) } " · " (owner) }
                                td { "prepared" }
                            }
                        }
                        td.n { (age(holder.age)) }
                    }
                }
            }
        }
        (commit_order(report, outboxes))
        h3 { "Open transactions" }
        @if sample.transactions.is_empty() {
            p.muted { "None holding an id or a snapshot." }
        } @else {
            table id="transactions" {
                tr { th { "pid" } th { "Application" } th { "State" } th { "Open for" } th { "Idle in transaction" } th { "Wrote" } }
                @for t in &sample.transactions {
                    tr {
                        td.n { (t.pid) }
                        td { (or_none(&t.application_name)) }
                        td { (t.state) }
                        td.n { (age(t.age)) }
                        td.n { (t.idle_in_transaction.map_or_else(|| "–".to_owned(), age)) }
                        td { (if t.writer { "yes" } else { "no" }) }
                    }
                }
            }
        }
        h3 { "Replication slots" }
        @if sample.slots.is_empty() {
            p.muted { "None." }
        } @else {
            table id="slots" {
                tr { th { "Slot" } th { "Type" } th { "Active" } th { "xmin age (transactions)" } th { "Catalog xmin age" } th { "WAL kept" } th { "Same xmin for" } }
                @for slot in &sample.slots {
                    tr class=(if slot.holds_xmin() && !slot.active { "warn" } else { "" }) {
                        td { code { (slot.name) } }
                        td { (slot.slot_type) }
                        td { (if slot.active { "yes" } else { "no" }) }
                        td.n { (slot.xmin_age.map_or_else(|| "–".to_owned(), |a| a.to_string())) }
                        td.n { (slot.catalog_xmin_age.map_or_else(|| "–".to_owned(), |a| a.to_string())) }
                        td.n { (slot.retained_wal_bytes.map_or_else(|| "–".to_owned(), size)) }
                        td.n { (report.slot_held_for.get(&slot.name).map_or_else(|| "–".to_owned(), |d| age(*d))) }
                    }
                }
            }
        }
        h3 { "Prepared transactions" }
        @if sample.prepared_count == 0 {
            p.muted { "None." }
        } @else {
            table id="prepared" {
                tr { th { "gid" } th { "Owner" } th { "Prepared at" } th { "For" } }
                @for p in &sample.prepared {
                    tr { td { code { (p.gid) } } td { (p.owner) } td { (timestamp(p.prepared)) } td.n { (age(p.age)) } }
                }
            }
            @if sample.prepared_count > sample.prepared.len() as u64 {
                p.muted { (sample.prepared_count) " in all; the oldest are listed." }
            }
        }
        h3 { "Outbox tables" }
        table id="tables" {
            tr { th { "Outbox" } th { "Dead tuples" } th { "Live tuples" } th { "Since vacuum" } th { "Since analyze" } th { "Table" } th { "Indexes" } }
            @for table in sample.tables.iter().filter(|t| outboxes.iter().any(|o| o.spec.name == t.outbox)) {
                tr {
                    td { (table.outbox) }
                    td.n data-outbox=(table.outbox) data-figure="dead_tuples" data-value=(table.dead_tuples) { (table.dead_tuples) }
                    td.n { (table.live_tuples) }
                    td.n { (table.since_vacuum.map_or_else(|| "never".to_owned(), age)) }
                    td.n { (table.since_analyze.map_or_else(|| "never".to_owned(), age)) }
                    td.n { (size(table.table_bytes)) }
                    td.n { (size(table.index_bytes)) }
                }
            }
        }
    }
}

/// Which ordered outbox's guard holds events back, and for whom.
fn commit_order(report: &DatabaseReport, outboxes: &[OutboxView]) -> Markup {
    let holding: Vec<&OutboxView> = outboxes.iter().filter(|o| !o.holdback.is_zero()).collect();
    html! {
        @if !holding.is_empty() {
            h3 { "Commit-order guard" }
            p.warn {
                "Holding back new events of "
                @for (i, o) in holding.iter().enumerate() {
                    @if i > 0 { ", " }
                    b { (o.spec.name) }
                }
                " until the transactions open in the database end. "
                @match &report.commit_order_cause {
                    Some(t) => {
                        "The oldest is pid " (t.pid) " (" (or_none(&t.application_name)) ", " (t.state)
                        "), open for " (age(t.age)) "."
                    }
                    None => "The watchdog's last sample saw no writing transaction; the next one may.",
                }
            }
        }
    }
}

fn or_none(text: &str) -> &str {
    if text.is_empty() {
        "(no application_name)"
    } else {
        text
    }
}

/// Whole seconds are enough to read during an incident.
fn age(d: Duration) -> String {
    humantime::format_duration(Duration::from_secs(d.as_secs())).to_string()
}

/// The exact value, for the `data-value` attributes.
fn secs(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64())
}

fn since(then: DateTime<Utc>, now: DateTime<Utc>) -> Duration {
    (now - then).to_std().unwrap_or_default()
}

fn size(bytes: i64) -> String {
    ByteSize::b(u64::try_from(bytes).unwrap_or(0))
        .display()
        .iec()
        .to_string()
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}
