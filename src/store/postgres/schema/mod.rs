//! An outbox table's DDL, in one place: the SQL files beside this module.
//! `{table}` stands for the quoted table, `{<suffix>}` for the name of one of
//! its indexes (see [`TableRef::object_name`]).
//!
//! Adoption (`adopt.rs`) runs them to create a missing table, to add what an
//! existing table lacks, and, with `--no-migrate`, reads the names it checks
//! from them: the three cannot drift apart.
//!
//! The files under `migrations/` are frozen history and stay byte-identical:
//! sqlx refuses to start when a migration it applied has changed (checksums),
//! and a release rolled back to refuses a database that ran a migration it does
//! not know. So the first migration still creates the default table with the
//! index and trigger of its day, and adoption, which runs after the migrations
//! at every start, brings that table to this schema (dropping
//! [`OBSOLETE_INDEXES`] and [`OBSOLETE_TRIGGER`]).
//! A change to an outbox table goes here, idempotent and under names an older
//! release also keeps; only what is shared by all tables needs a migration.
//!
//! Each outbox table has a lease table beside it (`leases.sql`), created by
//! adoption too. The wake-up trigger of earlier releases is dropped: producers
//! pay nothing per insert, and outboxd probes the table's sequence instead.

use std::sync::LazyLock;

use super::{
    one_line,
    statements::{epoch_table, leases_table},
};
use crate::outbox::TableRef;

const TABLE: &str = include_str!("table.sql");
const COLUMNS: &str = include_str!("columns.sql");
const INDEXES: &str = include_str!("indexes.sql");
const LEASES: &str = include_str!("leases.sql");
const ORDERED: &str = include_str!("ordered.sql");

/// The wake-up trigger earlier releases put on every outbox table. Any trigger
/// on the table costs producers (measured with 16 connections inserting one
/// row per transaction: about 17 % of commits/s, notifying or not), so
/// adoption drops it.
pub(super) const OBSOLETE_TRIGGER: &str = "outboxd_notify";

/// Free space left on each page of a table outboxd creates (see `table.sql`).
/// Adoption sets it on an existing table that has no fillfactor of its own.
pub(super) const FILLFACTOR: u8 = 45;

/// Producer columns and the types outboxd can read them as: those of
/// `table.sql` first, then those of the classic shape (ids are read as text).
pub(super) const PRODUCER_TYPES: &[(&str, &[&str])] = &[
    ("id", &["uuid"]),
    ("aggregate_id", &["text", "uuid", "character varying"]),
    ("event_type", &["text", "character varying"]),
    ("payload", &["jsonb", "json"]),
    ("created_at", &["timestamp with time zone"]),
];

/// Index suffixes earlier versions created and nothing reads any more (the
/// indexes over the lease columns the outbox row no longer carries): dropped
/// once their replacements are valid, so producers and acks stop paying for
/// their upkeep. Names stay listed for as long as a database may still hold
/// them.
pub(super) const OBSOLETE_INDEXES: &[&str] = &["unleased_idx", "leased_idx", "lease_idx"];

/// A column outboxd owns, with its definition from `columns.sql`.
#[derive(Debug)]
pub(super) struct Column {
    pub name: String,
    definition: String,
}

/// One index of `indexes.sql`.
#[derive(Debug)]
pub(super) struct Index {
    suffix: String,
    /// The statement, its placeholders still in.
    create: String,
}

impl Index {
    /// The index's name on `table`.
    pub fn name(&self, table: &TableRef) -> String {
        table.object_name(&self.suffix)
    }

    /// `CREATE INDEX CONCURRENTLY IF NOT EXISTS` for `table`.
    pub fn create(&self, table: &TableRef) -> String {
        fill(&self.create, table).replace(
            &format!("{{{}}}", self.suffix),
            &format!("\"{}\"", self.name(table)),
        )
    }
}

/// `CREATE TABLE IF NOT EXISTS` with the producers' columns.
pub(super) fn create_table(table: &TableRef) -> String {
    fill(&one_line(TABLE), table)
}

/// The columns outboxd owns, in the order `columns.sql` adds them.
pub(super) fn service_columns() -> &'static [Column] {
    static COLUMNS_PARSED: LazyLock<Vec<Column>> = LazyLock::new(|| {
        COLUMNS
            .lines()
            .filter_map(|line| line.trim().strip_prefix("ADD COLUMN IF NOT EXISTS "))
            .map(|column| {
                let column = one_line(column.trim_end_matches(','));
                let (name, definition) = column.split_once(' ').unwrap_or((&column, ""));
                Column {
                    name: name.to_owned(),
                    definition: definition.to_owned(),
                }
            })
            .collect()
    });
    &COLUMNS_PARSED
}

/// One `ALTER TABLE` adding `columns` as `columns.sql` defines them.
pub(super) fn add_columns(table: &TableRef, columns: &[&Column]) -> String {
    let adds: Vec<String> = columns
        .iter()
        .map(|c| format!("ADD COLUMN IF NOT EXISTS {} {}", c.name, c.definition))
        .collect();
    format!("ALTER TABLE {} {}", table.quoted(), adds.join(", "))
}

/// The index set of every outbox table, in the order adoption builds it.
pub(super) fn indexes() -> &'static [Index] {
    static INDEXES_PARSED: LazyLock<Vec<Index>> = LazyLock::new(|| parse_indexes(INDEXES));
    &INDEXES_PARSED
}

/// What an ordered outbox's table has besides [`indexes`] (`ordered.sql`).
pub(super) fn ordered_indexes() -> &'static [Index] {
    static ORDERED_PARSED: LazyLock<Vec<Index>> = LazyLock::new(|| parse_indexes(ORDERED));
    &ORDERED_PARSED
}

fn parse_indexes(sql: &str) -> Vec<Index> {
    one_line(sql)
        .split(';')
        .map(str::trim)
        .filter(|statement| !statement.is_empty())
        .map(|statement| {
            let named = statement
                .strip_prefix("CREATE INDEX CONCURRENTLY IF NOT EXISTS {")
                .and_then(|rest| rest.split_once('}'));
            let Some((suffix, _)) = named else {
                panic!("not an index of the form adoption builds: {statement}")
            };
            Index {
                suffix: suffix.to_owned(),
                create: statement.to_owned(),
            }
        })
        .collect()
}

/// Drops an index of `table` (an obsolete one, or one an interrupted
/// `CREATE INDEX CONCURRENTLY` left invalid) without blocking producers.
pub(super) fn drop_index(table: &TableRef, name: &str) -> String {
    format!(
        "DROP INDEX CONCURRENTLY IF EXISTS \"{}\".\"{name}\"",
        table.schema()
    )
}

/// Adds the columns a lease table an earlier release created lacks: the
/// aggregate (ordered outboxes) and the delay mark (the claim cursor).
pub(super) fn add_lease_columns(table: &TableRef) -> String {
    format!(
        "ALTER TABLE {} ADD COLUMN IF NOT EXISTS aggregate_id text, \
         ADD COLUMN IF NOT EXISTS delayed boolean NOT NULL DEFAULT false",
        leases_table(table)
    )
}

/// `DROP TRIGGER` of the wake-up trigger earlier releases created on `table`.
pub(super) fn drop_trigger(table: &TableRef) -> String {
    format!(
        "DROP TRIGGER IF EXISTS {OBSOLETE_TRIGGER} ON {}",
        table.quoted()
    )
}

/// The lease table of `table`, its indexes and the epoch table, each
/// statement idempotent.
pub(super) fn create_leases(table: &TableRef) -> String {
    let mut sql = one_line(LEASES)
        .replace("{leases}", &leases_table(table))
        .replace("{epoch}", &epoch_table(table));
    for suffix in [
        "leases_lease_idx",
        "leases_expiry_idx",
        "leases_aggregate_idx",
    ] {
        sql = sql.replace(
            &format!("{{{suffix}}}"),
            &format!("\"{}\"", table.object_name(suffix)),
        );
    }
    sql
}

fn fill(sql: &str, table: &TableRef) -> String {
    sql.replace("{table}", &table.quoted())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> TableRef {
        TableRef::new("sales", "outbox").expect("valid")
    }

    #[test]
    fn the_service_columns_are_read_from_their_file() {
        let columns: Vec<(&str, &str)> = service_columns()
            .iter()
            .map(|c| (c.name.as_str(), c.definition.as_str()))
            .collect();
        assert_eq!(columns.len(), 13, "{columns:?}");
        assert_eq!(columns[0], ("headers", "jsonb NOT NULL DEFAULT '{}'"));
        assert_eq!(columns[1], ("seq", "bigint GENERATED ALWAYS AS IDENTITY"));
        assert_eq!(columns[10], ("dead_lettered_at", "timestamptz"));
        assert_eq!(columns[11], ("discarded_at", "timestamptz"));
        assert_eq!(columns[12], ("redrives", "integer NOT NULL DEFAULT 0"));
        let some: Vec<&Column> = service_columns().iter().skip(9).take(2).collect();
        assert_eq!(
            add_columns(&table(), &some),
            "ALTER TABLE \"sales\".\"outbox\" ADD COLUMN IF NOT EXISTS last_error text, \
             ADD COLUMN IF NOT EXISTS dead_lettered_at timestamptz"
        );
    }

    #[test]
    fn every_index_is_named_and_filled_in() {
        let names: Vec<String> = indexes().iter().map(|i| i.name(&table())).collect();
        assert_eq!(
            names,
            [
                "outbox_pending_idx",
                "outbox_published_idx",
                "outbox_dead_letter_idx"
            ]
        );
        assert_eq!(
            indexes()[0].create(&table()),
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"outbox_pending_idx\" ON \"sales\".\"outbox\" \
             (seq) WHERE published_at IS NULL AND dead_lettered_at IS NULL"
        );
        for index in indexes().iter().chain(ordered_indexes()) {
            assert!(!index.create(&table()).contains('{'), "{index:?}");
        }
        assert_eq!(
            ordered_indexes()[0].create(&table()),
            "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"outbox_aggregate_idx\" ON \"sales\".\"outbox\" \
             (aggregate_id, seq) WHERE published_at IS NULL AND discarded_at IS NULL"
        );
    }

    #[test]
    fn table_and_leases_are_filled_in_and_agree_with_the_checks() {
        let create = create_table(&table());
        assert!(create.starts_with("CREATE TABLE IF NOT EXISTS \"sales\".\"outbox\" ("));
        for (column, types) in PRODUCER_TYPES {
            assert!(
                create.contains(&format!("{column} ")),
                "table.sql lacks {column}"
            );
            assert!(!types.is_empty());
        }
        assert!(
            create.ends_with(&format!("WITH (fillfactor = {FILLFACTOR})")),
            "{create}"
        );
        let leases = create_leases(&table());
        assert!(
            leases.starts_with("CREATE UNLOGGED TABLE IF NOT EXISTS \"sales\".\"outbox_leases\" ("),
            "{leases}"
        );
        assert!(leases.contains("CREATE INDEX IF NOT EXISTS \"outbox_leases_lease_idx\" ON \"sales\".\"outbox_leases\" (lease_id)"), "{leases}");
        assert!(!create.contains('{') && !leases.contains('{'));
        for obsolete in OBSOLETE_INDEXES {
            assert!(
                indexes()
                    .iter()
                    .all(|i| i.name(&table()) != table().object_name(obsolete)),
                "{obsolete} is both obsolete and current"
            );
        }
    }
}
