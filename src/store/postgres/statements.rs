//! Per-outbox SQL, built once at start from the files in `queries/`. The table
//! name is the only thing spliced in, and it is a validated, quoted identifier.

use std::sync::Arc;

use super::strip_comments;
use crate::outbox::{Ordering, Poison, TableRef};

const CLAIM: &str = include_str!("queries/claim.sql");
const SETTLE_ROWS: &str = include_str!("queries/settle_rows.sql");
const SETTLED: &str = include_str!("queries/settled.sql");
const ACK: &str = include_str!("queries/ack.sql");
const ACK_HELD: &str = include_str!("queries/ack_held.sql");
const NACK: &str = include_str!("queries/nack.sql");
const EXTEND: &str = include_str!("queries/extend.sql");
const STATS: &str = include_str!("queries/stats.sql");
const PURGE: &str = include_str!("queries/purge.sql");
const BLOCKED: &str = include_str!("queries/blocked.sql");
const BLOCKED_KEYS: &str = include_str!("queries/blocked_keys.sql");
const DEAD_LETTERS: &str = include_str!("queries/dead_letters.sql");
const REDRIVE: &str = include_str!("queries/redrive.sql");
const DISCARD: &str = include_str!("queries/discard.sql");
const INSPECT: &str = include_str!("queries/inspect.sql");
const GUARD: &str = include_str!("queries/guard.sql");
const SWEEP: &str = include_str!("queries/sweep.sql");

/// What keeps an ordered claim to each aggregate's head, in both parts of the
/// claim (`claim.sql`): no earlier event of the aggregate still unsettled
/// ({parked}: under poison=park a dead-lettered one no longer counts), and no
/// other event of it under a live lease. One probe of the aggregate index and
/// one of the lease table's per row considered (OFFSET 0 keeps each a
/// per-row subplan, as for the lease probe in `claim.sql`).
const HEAD_ONLY: &str = "AND NOT EXISTS (SELECT 1 FROM {table} AS p
                      WHERE p.aggregate_id = o.aggregate_id AND p.seq < o.seq
                        AND p.published_at IS NULL AND p.discarded_at IS NULL{parked}
                      OFFSET 0)
      AND NOT EXISTS (SELECT 1 FROM {leases} AS x
                      WHERE x.aggregate_id = o.aggregate_id::text
                        AND x.locked_until > now() AND x.id <> o.id
                      OFFSET 0)";

/// GetStats' last error: the newest dead letter's, else the pending event's
/// whose retry is due last (the one nacked most recently, give or take its
/// backoff). Each part reads one index.
const LAST_ERROR: &str = "(SELECT e.last_error FROM (
        (SELECT d.last_error, 1 AS rank FROM {table} AS d
         WHERE d.dead_lettered_at IS NOT NULL AND d.discarded_at IS NULL
           AND d.last_error IS NOT NULL
         ORDER BY d.dead_lettered_at DESC LIMIT 1)
        UNION ALL
        (SELECT p.last_error, 2 AS rank FROM {table} AS p
         WHERE p.published_at IS NULL AND p.dead_lettered_at IS NULL
           AND p.last_error IS NOT NULL
         ORDER BY p.available_at DESC LIMIT 1)
    ) AS e ORDER BY e.rank LIMIT 1)";

const BY_ID: &str = "o.id = ANY($2::uuid[])";
/// ExtendLease without ids: every row still held under the lease.
const BY_LEASE: &str = "l.lease_id = $1::uuid AND cardinality($2::uuid[]) = 0";

#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub claim: Arc<str>,
    /// Ack of the rows still held: the one statement of a normal ack.
    pub ack_held: Arc<str>,
    /// Classifies the ids `ack_held` did not settle.
    pub ack: Arc<str>,
    pub nack: Arc<str>,
    pub extend: Arc<str>,
    pub extend_all: Arc<str>,
    pub stats: Arc<str>,
    /// `stats` without the count of retained history, for the metrics sampler.
    pub gauges: Arc<str>,
    pub purge: Arc<str>,
    /// One page of dead letters (`dead_letters.sql`).
    pub dead_letters: Arc<str>,
    /// One page of blocked aggregates; `None` where nothing blocks (an
    /// unordered outbox, or poison=park).
    pub blocked_keys: Option<Arc<str>>,
    pub redrive_ids: Arc<str>,
    pub redrive_aggregate: Arc<str>,
    pub redrive_all: Arc<str>,
    pub discard: Arc<str>,
    /// One event by id with its live lease (`inspect.sql`).
    pub inspect: Arc<str>,
    /// One probe of the commit-order guard, with the epoch (`guard.sql`).
    pub guard: Arc<str>,
    /// The claim cursor's check and the orphan leases' removal (`sweep.sql`).
    pub sweep: Arc<str>,
}

impl Statements {
    /// `delete_on_ack`: zero retention, so an ack deletes the row.
    pub fn new(table: &TableRef, delete_on_ack: bool, ordering: Ordering) -> Self {
        let quoted = table.quoted();
        let leases = leases_table(table);
        let epoch = epoch_table(table);
        let build = |sql: &str| -> Arc<str> {
            strip_comments(
                &sql.replace("{table}", &quoted)
                    .replace("{leases}", &leases)
                    .replace("{epoch}", &epoch),
            )
            .into()
        };
        let head_only = |poison: Poison| {
            HEAD_ONLY.replace(
                "{parked}",
                match poison {
                    Poison::Block => "",
                    Poison::Park => " AND p.dead_lettered_at IS NULL",
                },
            )
        };
        // The lease row records an ordered event's aggregate (`leases.sql`).
        let lease_aggregate = if ordering.is_ordered() {
            "c.aggregate_id::text"
        } else {
            "NULL"
        };
        let claim = match ordering {
            Ordering::None => CLAIM
                .replace("{expired_order}", "")
                .replace("{fresh_order}", ""),
            Ordering::Aggregate(poison) => CLAIM
                .replace("{expired_order}", &head_only(poison))
                .replace("{fresh_order}", &head_only(poison)),
        }
        .replace("{lease_aggregate}", lease_aggregate);
        let blocked = if ordering.blocks() {
            BLOCKED
        } else {
            "SELECT NULL::text AS aggregate_id, NULL::bigint AS seq, NULL::timestamptz AS since WHERE false"
        };
        let redrive = |selector: &str| {
            build(
                &REDRIVE
                    .replace("{selector}", selector)
                    .replace("{lease_aggregate}", lease_aggregate),
            )
        };
        // Each settle statement: classify the rows it names, then its own
        // change (a `settled` step, fenced by the lease row); an extend also
        // says the new expiry.
        let settle = |filter: &str, change: &str, also: &str| {
            build(&format!(
                "{}\n{}\n{}",
                SETTLE_ROWS.replace("{filter}", filter),
                change.trim_end(),
                SETTLED.replace("{also}", also)
            ))
        };
        let expires = ",\n       now() + $3::interval AS expires_at";
        Self {
            claim: build(&claim),
            ack_held: build(&ACK_HELD.replace(
                "{settle}",
                if delete_on_ack {
                    "DELETE FROM {table} AS o USING held AS h"
                } else {
                    "UPDATE {table} AS o SET published_at = now(), attempts = h.attempts, \
                     lease_id = $1::uuid, claimed_by = h.claimed_by, claimed_at = h.claimed_at \
                     FROM held AS h"
                },
            )),
            ack: settle(BY_ID, ACK, ""),
            nack: settle(BY_ID, NACK, ""),
            extend: settle(BY_ID, EXTEND, expires),
            extend_all: settle(BY_LEASE, EXTEND, expires),
            stats: build(
                &STATS
                    .replace(
                        "{published_retained}",
                        "(SELECT count(*) FROM {table} WHERE published_at IS NOT NULL)",
                    )
                    .replace("{last_error}", LAST_ERROR)
                    .replace("{blocked}", blocked),
            ),
            gauges: build(
                &STATS
                    .replace("{published_retained}", "0::bigint")
                    .replace("{last_error}", "NULL::text")
                    .replace("{blocked}", blocked),
            ),
            purge: build(PURGE),
            dead_letters: build(DEAD_LETTERS),
            blocked_keys: ordering
                .blocks()
                .then(|| build(&BLOCKED_KEYS.replace("{blocked}", BLOCKED))),
            redrive_ids: redrive("o.id = ANY($1::uuid[])"),
            redrive_aggregate: redrive("o.aggregate_id::text = $1::text"),
            redrive_all: redrive("true"),
            discard: build(DISCARD),
            inspect: build(INSPECT),
            guard: build(GUARD),
            sweep: build(&SWEEP.replace("{lease_aggregate}", lease_aggregate)),
        }
    }
}

/// The quoted name of `table`'s lease table (`schema/leases.sql`).
pub(crate) fn leases_table(table: &TableRef) -> String {
    format!(
        "\"{}\".\"{}\"",
        table.schema(),
        table.object_name(LEASES_SUFFIX)
    )
}

/// The lease table's name is the outbox table's with this suffix.
pub(crate) const LEASES_SUFFIX: &str = "leases";

/// The quoted name of `table`'s epoch table (`schema/leases.sql`).
pub(crate) fn epoch_table(table: &TableRef) -> String {
    format!(
        "\"{}\".\"{}\"",
        table.schema(),
        table.object_name(EPOCH_SUFFIX)
    )
}

/// The epoch table's name is the outbox table's with this suffix.
pub(crate) const EPOCH_SUFFIX: &str = "epoch";

#[cfg(test)]
mod tests {
    use super::*;

    fn all(s: &Statements) -> [&Arc<str>; 16] {
        [
            &s.sweep,
            &s.inspect,
            &s.dead_letters,
            &s.redrive_ids,
            &s.redrive_aggregate,
            &s.redrive_all,
            &s.discard,
            &s.claim,
            &s.ack_held,
            &s.ack,
            &s.nack,
            &s.extend,
            &s.extend_all,
            &s.stats,
            &s.gauges,
            &s.purge,
        ]
    }

    #[test]
    fn statements_name_the_quoted_tables_and_no_placeholders() {
        let table = TableRef::new("sales", "outbox").expect("valid");
        let s = Statements::new(&table, false, Ordering::None);
        for sql in all(&s) {
            assert!(sql.contains("\"sales\".\"outbox\""), "{sql}");
            assert!(!sql.contains('{'), "{sql}");
            assert!(
                !sql.lines().any(|l| l.trim_start().starts_with("--")),
                "comment lines are stripped: {sql}"
            );
        }
        assert!(s.claim.contains("\"sales\".\"outbox_leases\""));
        assert!(
            s.guard.contains("\"sales\".\"outbox_epoch\"") && !s.guard.contains('{'),
            "{}",
            s.guard
        );
        assert!(s.ack_held.contains("UPDATE \"sales\".\"outbox\""));
        let deleting = Statements::new(&table, true, Ordering::None);
        assert!(
            deleting
                .ack_held
                .contains("DELETE FROM \"sales\".\"outbox\"")
        );
    }

    /// The point of the lease table: a claim and an extend never write the
    /// logged outbox table except to dead-letter, and nothing locks its rows.
    #[test]
    fn only_the_settles_write_the_outbox_table_and_nothing_locks_it() {
        let table = TableRef::new("public", "outbox").expect("valid");
        for delete_on_ack in [false, true] {
            let s = Statements::new(&table, delete_on_ack, Ordering::None);
            for sql in all(&s) {
                assert!(
                    !sql.contains("FOR UPDATE SKIP LOCKED")
                        || sql.contains("FOR UPDATE OF l SKIP LOCKED"),
                    "{sql}"
                );
                assert!(
                    !sql.contains("FOR UPDATE\n") && !sql.contains("FOR SHARE"),
                    "{sql}"
                );
            }
            let outbox_writes = |sql: &str| {
                sql.matches("UPDATE \"public\".\"outbox\" ").count()
                    + sql.matches("DELETE FROM \"public\".\"outbox\" ").count()
            };
            assert_eq!(outbox_writes(&s.extend), 0);
            assert_eq!(outbox_writes(&s.extend_all), 0);
            assert_eq!(outbox_writes(&s.ack), 0);
            // The claim writes the outbox row only in its dead-letter step.
            assert_eq!(outbox_writes(&s.claim), 1);
            assert!(s.claim.contains("dead_lettered_at = now()"));
            assert_eq!(outbox_writes(&s.ack_held), 1);
            // An unordered claim's bound is the largest bigint; every claim
            // starts at the cursor while its epoch holds.
            assert!(s.claim.contains("o.seq <= $9::bigint"));
            assert!(s.claim.contains("e.epoch = $11::uuid"));
            assert_eq!(outbox_writes(&s.nack), 1);
            // Every settle is fenced by the lease row.
            for sql in [&s.ack_held, &s.nack, &s.extend, &s.extend_all] {
                assert!(sql.contains("l.lease_id = $1::uuid"), "{sql}");
            }
            assert!(s.extend.contains("expires_at"));
            assert!(!s.nack.contains("expires_at"));
        }
    }

    #[test]
    fn an_ordered_claim_keeps_to_heads_and_below_the_guard() {
        let table = TableRef::new("public", "outbox").expect("valid");
        let block = Statements::new(&table, false, Ordering::Aggregate(Poison::Block));
        let park = Statements::new(&table, false, Ordering::Aggregate(Poison::Park));
        for s in [&block, &park] {
            assert!(s.claim.contains("o.seq <= $9::bigint"), "{}", s.claim);
            assert_eq!(s.claim.matches("p.seq < o.seq").count(), 2, "both parts");
            assert_eq!(s.claim.matches("x.locked_until > now()").count(), 2);
            assert!(s.claim.contains("c.aggregate_id"));
            assert!(!s.claim.contains('{'), "{}", s.claim);
        }
        assert!(!block.claim.contains("p.dead_lettered_at IS NULL"));
        assert_eq!(park.claim.matches("p.dead_lettered_at IS NULL").count(), 2);
        assert!(block.blocked_keys.is_some() && park.blocked_keys.is_none());
        assert!(block.stats.contains("p.seq < d.seq"));
        assert!(!park.stats.contains("p.seq < d.seq"));
        let unordered = Statements::new(&table, false, Ordering::None);
        assert!(!unordered.claim.contains("p.seq < o.seq"));
        assert!(unordered.blocked_keys.is_none());
    }
}
