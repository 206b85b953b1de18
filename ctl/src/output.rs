//! What commands print: aligned tables for people, or one JSON document per
//! command for scripts. JSON field names are a contract: only ever added to.
//! Times are RFC 3339 (UTC), ages in seconds; absent ones are `null`.

#![allow(clippy::print_stdout)] // printing is this module's job

use chrono::{DateTime, SecondsFormat, Utc};
use outboxd::pb;
use serde_json::{Value, json};

use crate::cli::Output;

pub struct Out(Output);

impl Out {
    pub fn new(output: Output) -> Self {
        Self(output)
    }

    fn emit(&self, json: Value, table: impl FnOnce() -> String) {
        match self.0 {
            Output::Json => println!("{json}"),
            Output::Table => print!("{}", table()),
        }
    }

    /// The outboxes' figures, then what the database watchdog found last
    /// (`None`: not readable by this caller, or not sampled yet). `hidden`
    /// outboxes are configured but not this caller's to see: counted, so a
    /// partial list does not pass for the whole.
    pub fn stats(
        &self,
        all: &[(String, pb::GetStatsResponse)],
        hidden: u32,
        database: Option<&pb::GetDatabaseReportResponse>,
    ) {
        let json = json!({
            "database": database.map(database_json),
            "hidden_outboxes": hidden,
            "outboxes": all.iter().map(|(name, s)| json!({
                "outbox": name,
                "pending": s.pending,
                "in_flight": s.in_flight,
                "dead_lettered": s.dead_lettered,
                "published_retained": s.published_retained,
                "blocked_keys": s.blocked_keys,
                "oldest_pending_age_seconds": seconds(s.oldest_pending_age),
                "oldest_blocked_age_seconds": seconds(s.oldest_blocked_age),
            })).collect::<Vec<_>>(),
        });
        self.emit(json, || {
            table(
                &[
                    "OUTBOX",
                    "PENDING",
                    "IN FLIGHT",
                    "DEAD",
                    "BLOCKED",
                    "RETAINED",
                    "OLDEST PENDING",
                    "OLDEST BLOCKED",
                ],
                all.iter()
                    .map(|(name, s)| {
                        vec![
                            name.clone(),
                            s.pending.to_string(),
                            s.in_flight.to_string(),
                            s.dead_lettered.to_string(),
                            s.blocked_keys.to_string(),
                            s.published_retained.to_string(),
                            age(s.oldest_pending_age),
                            age(s.oldest_blocked_age),
                        ]
                    })
                    .collect(),
            ) + hidden_text(hidden).as_str()
                + database.map(database_text).unwrap_or_default().as_str()
        });
    }

    pub fn dead_letters(&self, outbox: &str, reply: &pb::ListDeadLettersResponse) {
        let json = json!({
            "outbox": outbox,
            "dead_letters": reply.dead_letters.iter().map(|d| {
                let m = d.message.clone().unwrap_or_default();
                json!({
                    "id": m.id,
                    "aggregate_id": m.aggregate_id,
                    "event_type": m.event_type,
                    "sequence": m.sequence,
                    "attempts": m.attempt,
                    "created_at": time(m.created_at),
                    "dead_lettered_at": time(d.dead_lettered_at),
                    "last_error": d.last_error,
                })
            }).collect::<Vec<_>>(),
            "more": !reply.next_page_token.is_empty(),
        });
        self.emit(json, || {
            let rows = reply
                .dead_letters
                .iter()
                .map(|d| {
                    let m = d.message.clone().unwrap_or_default();
                    vec![
                        m.id,
                        m.aggregate_id,
                        m.event_type,
                        m.sequence.to_string(),
                        m.attempt.to_string(),
                        text_time(d.dead_lettered_at),
                        one_line(&d.last_error),
                    ]
                })
                .collect();
            let mut text = table(
                &[
                    "ID",
                    "AGGREGATE",
                    "TYPE",
                    "SEQ",
                    "ATTEMPTS",
                    "DEAD-LETTERED AT",
                    "LAST ERROR",
                ],
                rows,
            );
            if !reply.next_page_token.is_empty() {
                text.push_str("(more: raise --limit)\n");
            }
            text
        });
    }

    pub fn blocked_keys(&self, outbox: &str, reply: &pb::ListBlockedKeysResponse) {
        let json = json!({
            "outbox": outbox,
            "blocked_keys": reply.blocked_keys.iter().map(|k| json!({
                "aggregate_id": k.aggregate_id,
                "head_message_id": k.head_message_id,
                "blocked_since": time(k.blocked_since),
                "held": k.held,
            })).collect::<Vec<_>>(),
            "more": !reply.next_page_token.is_empty(),
        });
        self.emit(json, || {
            let rows = reply
                .blocked_keys
                .iter()
                .map(|k| {
                    vec![
                        k.aggregate_id.clone(),
                        k.head_message_id.clone(),
                        text_time(k.blocked_since),
                        k.held.to_string(),
                    ]
                })
                .collect();
            table(&["AGGREGATE", "HEAD", "BLOCKED SINCE", "HELD"], rows)
        });
    }

    pub fn inspect(&self, outbox: &str, r: &pb::InspectMessageResponse) {
        let m = r.message.clone().unwrap_or_default();
        let payload = String::from_utf8_lossy(&m.payload).into_owned();
        let json = json!({
            "outbox": outbox,
            "id": m.id,
            "state": r.state,
            "aggregate_id": m.aggregate_id,
            "event_type": m.event_type,
            "sequence": m.sequence,
            "attempts": m.attempt,
            "created_at": time(m.created_at),
            "available_at": time(r.available_at),
            "leased_until": time(r.leased_until),
            "leased_by": non_empty(&r.leased_by),
            "published_at": time(r.published_at),
            "dead_lettered_at": time(r.dead_lettered_at),
            "discarded_at": time(r.discarded_at),
            "last_error": non_empty(&r.last_error),
            "headers": m.headers,
            // The stored JSON as a value when it parses, else as text.
            "payload": serde_json::from_str::<Value>(&payload).unwrap_or(Value::String(payload.clone())),
        });
        self.emit(json, || {
            let rows = [
                ("id", m.id.clone()),
                ("state", r.state.clone()),
                ("aggregate", m.aggregate_id.clone()),
                ("event type", m.event_type.clone()),
                ("sequence", m.sequence.to_string()),
                ("attempts", m.attempt.to_string()),
                ("created at", text_time(m.created_at)),
                ("available at", text_time(r.available_at)),
                ("leased until", text_time(r.leased_until)),
                ("leased by", or_dash(&r.leased_by)),
                ("published at", text_time(r.published_at)),
                ("dead-lettered at", text_time(r.dead_lettered_at)),
                ("discarded at", text_time(r.discarded_at)),
                ("last error", or_dash(&one_line(&r.last_error))),
                ("payload", one_line(&payload)),
            ];
            let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
            rows.iter()
                .map(|(k, v)| format!("{k:<width$}  {v}\n"))
                .collect()
        });
    }

    /// Each health service's status; "" (the server as a whole) shows as `(server)`.
    pub fn health(&self, answers: &[(&str, &str)]) {
        let serving = answers.iter().all(|(_, status)| *status == "SERVING");
        let json = json!({
            "serving": serving,
            "services": answers
                .iter()
                .map(|(service, status)| json!({ "service": service, "status": status }))
                .collect::<Vec<_>>(),
        });
        self.emit(json, || {
            let rows = answers
                .iter()
                .map(|(service, status)| {
                    let name = if service.is_empty() {
                        "(server)"
                    } else {
                        service
                    };
                    vec![name.to_owned(), (*status).to_owned()]
                })
                .collect();
            table(&["SERVICE", "STATUS"], rows)
        });
    }

    /// What a redrive or discard changed.
    pub fn count(&self, outbox: &str, what: &str, n: u64) {
        let mut json = json!({ "outbox": outbox });
        json[what] = json!(n);
        self.emit(json, || format!("{what}: {n}\n"));
    }
}

fn transaction_json(t: &pb::DatabaseTransaction) -> Value {
    json!({
        "pid": t.pid,
        "application_name": t.application_name,
        "state": t.state,
        "writer": t.writer,
        "xact_start": time(t.xact_start),
        "age_seconds": seconds(t.age),
        "idle_in_transaction_seconds": t.idle_in_transaction.map(|d| seconds(Some(d))),
    })
}

fn database_json(r: &pb::GetDatabaseReportResponse) -> Value {
    json!({
        "read_at": time(r.read_at),
        "xmin_horizon_age_seconds": seconds(r.xmin_horizon_age),
        "transactions": r.transactions.iter().map(transaction_json).collect::<Vec<_>>(),
        "replication_slots": r.replication_slots.iter().map(|s| json!({
            "name": s.name,
            "slot_type": s.slot_type,
            "active": s.active,
            "xmin_age": s.xmin_age,
            "catalog_xmin_age": s.catalog_xmin_age,
            "retained_wal_bytes": s.retained_wal_bytes,
            "held_for_seconds": s.held_for.map(|d| seconds(Some(d))),
        })).collect::<Vec<_>>(),
        "prepared_transactions": r.prepared_transaction_count,
        "tables": r.tables.iter().map(|t| json!({
            "outbox": t.outbox,
            "dead_tuples": t.dead_tuples,
            "live_tuples": t.live_tuples,
            "since_vacuum_seconds": t.since_vacuum.map(|d| seconds(Some(d))),
            "since_analyze_seconds": t.since_analyze.map(|d| seconds(Some(d))),
            "table_bytes": t.table_bytes,
            "index_bytes": t.index_bytes,
        })).collect::<Vec<_>>(),
        "commit_order_cause": r.commit_order_cause.as_ref().map(transaction_json),
    })
}

/// The line under the outboxes' table for people, when some are not shown.
fn hidden_text(hidden: u32) -> String {
    if hidden == 0 {
        return String::new();
    }
    format!(
        "({hidden} more outbox(es) configured, not shown: this credential has no admin scope for them)\n"
    )
}

/// The database's part of `stats` for people: who holds the horizon back,
/// then each outbox table's upkeep.
fn database_text(r: &pb::GetDatabaseReportResponse) -> String {
    let holder = |t: &pb::DatabaseTransaction| {
        format!(
            "pid {} ({}, {}, open {})",
            t.pid,
            or_dash(&t.application_name),
            t.state,
            age(t.age)
        )
    };
    let mut text = format!("\nDATABASE (read at {})\n", text_time(r.read_at));
    text.push_str(&format!(
        "xmin horizon held back for {}{}\n",
        age(r.xmin_horizon_age),
        r.transactions
            .first()
            .map(|t| format!(", oldest transaction {}", holder(t)))
            .unwrap_or_default()
    ));
    if let Some(cause) = &r.commit_order_cause {
        text.push_str(&format!(
            "ordered events held back for commit order by {}\n",
            holder(cause)
        ));
    }
    for slot in &r.replication_slots {
        text.push_str(&format!(
            "replication slot {} ({}, {}), xmin age {}, retained WAL {} bytes\n",
            slot.name,
            slot.slot_type,
            if slot.active { "active" } else { "inactive" },
            slot.xmin_age
                .or(slot.catalog_xmin_age)
                .map_or_else(|| "-".to_owned(), |a| a.to_string()),
            slot.retained_wal_bytes.unwrap_or(0),
        ));
    }
    if r.prepared_transaction_count > 0 {
        text.push_str(&format!(
            "prepared transactions: {}\n",
            r.prepared_transaction_count
        ));
    }
    text.push('\n');
    let tables = table(
        &[
            "OUTBOX",
            "DEAD TUPLES",
            "LIVE TUPLES",
            "VACUUMED",
            "ANALYZED",
            "TABLE",
            "INDEXES",
        ],
        r.tables
            .iter()
            .map(|t| {
                let ago = |d: Option<prost_types::Duration>| {
                    d.map_or_else(|| "never".to_owned(), |d| format!("{} ago", age(Some(d))))
                };
                vec![
                    t.outbox.clone(),
                    t.dead_tuples.to_string(),
                    t.live_tuples.to_string(),
                    ago(t.since_vacuum),
                    ago(t.since_analyze),
                    format!("{} B", t.table_bytes),
                    format!("{} B", t.index_bytes),
                ]
            })
            .collect(),
    );
    text + tables.as_str()
}

/// Columns padded to their widest cell; the last one is left ragged.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<String>| -> String {
        let last = cells.len().saturating_sub(1);
        let mut text = cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                if i == last {
                    c
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ");
        text.truncate(text.trim_end().len());
        text.push('\n');
        text
    };
    let mut text = line(header.iter().map(|h| (*h).to_owned()).collect());
    for row in rows {
        text.push_str(&line(row));
    }
    text
}

fn datetime(t: Option<prost_types::Timestamp>) -> Option<DateTime<Utc>> {
    let t = t?;
    DateTime::from_timestamp(t.seconds, u32::try_from(t.nanos).ok()?)
}

fn time(t: Option<prost_types::Timestamp>) -> Value {
    datetime(t).map_or(Value::Null, |t| {
        json!(t.to_rfc3339_opts(SecondsFormat::Millis, true))
    })
}

fn text_time(t: Option<prost_types::Timestamp>) -> String {
    datetime(t).map_or_else(
        || "-".to_owned(),
        |t| t.to_rfc3339_opts(SecondsFormat::Secs, true),
    )
}

fn seconds(d: Option<prost_types::Duration>) -> f64 {
    d.map_or(0.0, |d| d.seconds as f64 + f64::from(d.nanos) / 1e9)
}

/// An age for people: `0s`, `42s`, `3m12s`, `5h02m`.
fn age(d: Option<prost_types::Duration>) -> String {
    let s = d.map_or(0, |d| d.seconds.max(0));
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

fn non_empty(s: &str) -> Value {
    if s.is_empty() { Value::Null } else { json!(s) }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s.to_owned()
    }
}

/// A cell stays on its row: newlines in errors or payloads become spaces.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns_and_ages_read_as_people_say_them() {
        let text = table(&["A", "LONGER"], vec![vec!["xyz".into(), "1".into()]]);
        assert_eq!(text, "A    LONGER\nxyz  1\n");
        let d = |s| {
            Some(prost_types::Duration {
                seconds: s,
                nanos: 0,
            })
        };
        assert_eq!(age(d(0)), "0s");
        assert_eq!(age(d(192)), "3m12s");
        assert_eq!(age(d(5 * 3600 + 120)), "5h02m");
    }
}
