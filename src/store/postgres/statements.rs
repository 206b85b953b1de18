//! Per-outbox SQL, built once at start from the files in `queries/`. The table
//! name is the only thing spliced in, and it is a validated, quoted identifier.

use std::sync::Arc;

use super::strip_comments;
use crate::outbox::TableRef;

const CLAIM: &str = include_str!("queries/claim.sql");
const SETTLE_ROWS: &str = include_str!("queries/settle_rows.sql");
const SETTLED: &str = include_str!("queries/settled.sql");
const ACK: &str = include_str!("queries/ack.sql");
const ACK_DELETE: &str = include_str!("queries/ack_delete.sql");
const ACK_HELD: &str = include_str!("queries/ack_held.sql");
const NACK: &str = include_str!("queries/nack.sql");
const EXTEND: &str = include_str!("queries/extend.sql");
const STATS: &str = include_str!("queries/stats.sql");
const PURGE: &str = include_str!("queries/purge.sql");

const BY_ID: &str = "id = ANY($2::uuid[])";
/// ExtendLease without ids: every row still held under the lease.
const BY_LEASE: &str = "lease_id = $1::uuid AND published_at IS NULL AND dead_lettered_at IS NULL \
                        AND cardinality($2::uuid[]) = 0";

#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub claim: Arc<str>,
    /// Ack of the rows still held: the one statement of a normal ack.
    pub ack_held: Arc<str>,
    /// Ack that locks and classifies every named row, for the ids `ack_held`
    /// did not settle.
    pub ack: Arc<str>,
    pub nack: Arc<str>,
    pub extend: Arc<str>,
    pub extend_all: Arc<str>,
    pub stats: Arc<str>,
    /// `stats` without the count of retained history, for the metrics sampler.
    pub gauges: Arc<str>,
    pub purge: Arc<str>,
}

impl Statements {
    /// `delete_on_ack`: zero retention, so an ack deletes the row.
    pub fn new(table: &TableRef, delete_on_ack: bool) -> Self {
        let quoted = table.quoted();
        let build =
            |sql: &str| -> Arc<str> { strip_comments(&sql.replace("{table}", &quoted)).into() };
        // Each settle statement: lock the rows it names, then its own change
        // behind the shared fence; a nack also says which rows it dead-lettered,
        // an extend the new expiry.
        let settle = |filter: &str, change: &str, dead_lettered_now: &str, also: &str| {
            let settled = SETTLED
                .replace("{change}", change.trim_end())
                .replace("{dead_lettered_now}", dead_lettered_now)
                .replace("{also}", also);
            build(&format!(
                "{}\n{settled}",
                SETTLE_ROWS.replace("{filter}", filter)
            ))
        };
        let expires = ",\n       now() + $3::interval AS expires_at";
        Self {
            claim: build(CLAIM),
            ack_held: build(&ACK_HELD.replace(
                "{settle}",
                if delete_on_ack {
                    "DELETE FROM {table} AS o"
                } else {
                    "UPDATE {table} AS o SET published_at = now(), locked_until = NULL"
                },
            )),
            ack: settle(
                BY_ID,
                if delete_on_ack { ACK_DELETE } else { ACK },
                "false",
                "",
            ),
            nack: settle(BY_ID, NACK, "o.dead_lettered_at IS NOT NULL", ""),
            extend: settle(BY_ID, EXTEND, "false", expires),
            extend_all: settle(BY_LEASE, EXTEND, "false", expires),
            stats: build(&STATS.replace(
                "{published_retained}",
                "(SELECT count(*) FROM {table} WHERE published_at IS NOT NULL)",
            )),
            gauges: build(&STATS.replace("{published_retained}", "0::bigint")),
            purge: build(PURGE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_name_the_quoted_table_and_no_placeholders() {
        let table = TableRef::new("sales", "outbox").expect("valid");
        let s = Statements::new(&table, false);
        for sql in [
            &s.claim,
            &s.ack_held,
            &s.ack,
            &s.nack,
            &s.extend,
            &s.extend_all,
            &s.stats,
            &s.gauges,
            &s.purge,
        ] {
            assert!(sql.contains("\"sales\".\"outbox\""), "{sql}");
            assert!(!sql.contains('{'), "{sql}");
            assert!(
                !sql.lines().any(|l| l.trim_start().starts_with("--")),
                "comment lines are stripped: {sql}"
            );
        }
        assert!(s.ack.contains("UPDATE"));
        assert!(s.ack_held.contains("UPDATE"));
        let deleting = Statements::new(&table, true);
        assert!(deleting.ack.contains("DELETE"));
        assert!(deleting.ack_held.contains("DELETE"));
    }

    #[test]
    fn every_settle_statement_keeps_the_fence_and_only_extend_reports_an_expiry() {
        let table = TableRef::new("public", "outbox").expect("valid");
        for delete_on_ack in [false, true] {
            let s = Statements::new(&table, delete_on_ack);
            for sql in [&s.ack, &s.nack, &s.extend, &s.extend_all] {
                assert!(sql.contains("FOR UPDATE"), "{sql}");
                assert!(
                    sql.contains("c.held AND NOT c.published AND NOT c.dead_lettered"),
                    "{sql}"
                );
                assert_eq!(
                    sql.contains("expires_at"),
                    sql.contains("$3::interval"),
                    "{sql}"
                );
                // The change appears once, right before the fence.
                let step = sql.split("settled AS (").nth(1).unwrap_or_default();
                let change = step.split("WHERE o.id = c.id").next().unwrap_or_default();
                let writes = change.matches("UPDATE").count() + change.matches("DELETE").count();
                assert_eq!(writes, 1, "{sql}");
            }
            assert!(
                s.nack
                    .contains("o.dead_lettered_at IS NOT NULL AS dead_lettered_now")
            );
            assert!(s.ack.contains("false AS dead_lettered_now"));
        }
    }
}
