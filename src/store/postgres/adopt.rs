//! Brings a configured table to the shape outboxd needs, adding only what is
//! missing. Catalog checks come first, so a table that is already in shape costs
//! no DDL and no lock at all: many replicas restart against a hot table daily.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Row};

use super::{
    schema::{
        self, FILLFACTOR, OBSOLETE_INDEXES, OBSOLETE_TRIGGER, PRODUCER_TYPES, add_columns,
        add_lease_columns, create_leases, create_table, drop_index, drop_trigger, service_columns,
    },
    statements::{epoch_table, leases_table},
};
use crate::{
    outbox::{OutboxSpec, TableRef},
    store::StoreError,
};

/// Whether start-up may change a table or only check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdoptMode {
    /// Create the table if absent and add missing columns, indexes and the
    /// lease table; drop what earlier releases left that costs producers.
    Create,
    /// Check only (`--no-migrate`: a migration Job owns DDL); a gap is an error.
    Verify,
}

/// Serialises adoption across replicas starting at once (any constant works;
/// this one spells "outboxd" in ASCII).
const ADOPT_LOCK: i64 = 0x006f_7574_626f_7864;

pub(crate) async fn adopt(
    pool: &PgPool,
    spec: &OutboxSpec,
    mode: AdoptMode,
) -> Result<(), StoreError> {
    let table = &spec.table;
    let mut conn = pool.acquire().await?;
    // DDL on a large table (an index built concurrently, a rewrite adding
    // `seq`) runs longer than any RPC's statement: no statement timeout here,
    // lock waits bounded by the DDL limit, and the connection is closed
    // afterwards rather than pooled with these settings. Its commits wait
    // for their WAL flush: a table or index created here and lost in a crash
    // would leave outboxd (and the producers) without it until a restart.
    conn.close_on_drop();
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SET statement_timeout = 0; SET lock_timeout = '{}'; SET synchronous_commit = on",
        crate::server::DDL_LOCK_TIMEOUT
    )))
    .execute(&mut *conn)
    .await?;
    if mode == AdoptMode::Create {
        lock_adoption(&mut conn).await?;
    }
    let result = adopt_locked(&mut conn, table, spec.ordering.is_ordered(), mode).await;
    if mode == AdoptMode::Create {
        // Unlock even after a failure; a broken connection drops the lock anyway.
        let _ = sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(ADOPT_LOCK)
            .execute(&mut *conn)
            .await;
    }
    result
}

/// Takes the adoption lock by polling, never by queueing in `pg_advisory_lock`:
/// a session blocked there holds a snapshot, and CREATE INDEX CONCURRENTLY in
/// the session that has the lock waits for every older snapshot to end. Replicas
/// starting together would deadlock, and one of them would fail to start.
async fn lock_adoption(conn: &mut PgConnection) -> Result<(), StoreError> {
    loop {
        let locked: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(ADOPT_LOCK)
            .fetch_one(&mut *conn)
            .await?;
        if locked {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn adopt_locked(
    conn: &mut PgConnection,
    table: &TableRef,
    ordered: bool,
    mode: AdoptMode,
) -> Result<(), StoreError> {
    let quoted = table.quoted();
    let missing_gap = |what: String| {
        StoreError::Schema(format!(
            "table {table} {what}; run `outboxd migrate` with this outbox configured, or start without --no-migrate"
        ))
    };

    let exists: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(&quoted)
        .fetch_one(&mut *conn)
        .await?;
    if exists.is_none() {
        if mode == AdoptMode::Verify {
            return Err(missing_gap("does not exist".into()));
        }
        tracing::info!(%table, "creating outbox table");
        // In today's shape at once, columns and all: nothing below has an
        // upgrade to report for a table created here.
        let ddl = format!(
            "BEGIN; {}; {}; COMMIT;",
            create_table(table),
            add_columns(table, &service_columns().iter().collect::<Vec<_>>())
        );
        run(conn, ddl).await?;
    }
    let created = exists.is_none();

    let columns: Vec<(String, String)> = sqlx::query(
        "SELECT attname::text, format_type(atttypid, atttypmod) FROM pg_attribute \
         WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped",
    )
    .bind(&quoted)
    .fetch_all(&mut *conn)
    .await?
    .into_iter()
    .map(|row| (row.get(0), row.get(1)))
    .collect();
    let type_of = |name: &str| {
        columns
            .iter()
            .find(|(c, _)| c == name)
            .map(|(_, t)| t.as_str())
    };

    for (name, allowed) in PRODUCER_TYPES {
        match type_of(name) {
            None => {
                return Err(StoreError::Schema(format!(
                    "table {table} has no column {name}"
                )));
            }
            Some(found) if !allowed.contains(&found) => {
                return Err(StoreError::Schema(format!(
                    "table {table}: column {name} is {found}, expected one of {allowed:?}"
                )));
            }
            Some(_) => {}
        }
    }

    let missing: Vec<_> = service_columns()
        .iter()
        .filter(|column| type_of(&column.name).is_none())
        .collect();
    if !missing.is_empty() {
        let names: Vec<_> = missing.iter().map(|c| c.name.as_str()).collect();
        if mode == AdoptMode::Verify {
            return Err(missing_gap(format!("lacks columns {names:?}")));
        }
        tracing::info!(%table, columns = ?names, "adopting table: adding columns");
        // Adding `seq` rewrites the table under an exclusive lock; a bounded lock
        // wait fails this start-up instead of queueing every producer behind it.
        let ddl = format!(
            "BEGIN; SET LOCAL lock_timeout = '10s'; {}; COMMIT;",
            add_columns(table, &missing)
        );
        run(conn, ddl).await?;
    }

    let ordered_indexes = if ordered {
        schema::ordered_indexes()
    } else {
        &[]
    };
    for index in schema::indexes().iter().chain(ordered_indexes) {
        let name = index.name(table);
        let valid = index_valid(conn, &quoted, &name).await?;
        if valid == Some(true) {
            continue;
        }
        if mode == AdoptMode::Verify {
            return Err(missing_gap(format!("lacks index {name}")));
        }
        if valid == Some(false) {
            // Left behind by an interrupted CREATE INDEX CONCURRENTLY.
            run(conn, drop_index(table, &name)).await?;
        }
        if created {
            tracing::debug!(%table, index = %name, "creating index");
        } else {
            tracing::info!(%table, index = %name, "adopting table: creating index");
        }
        run(conn, index.create(table)).await?;
    }

    if mode == AdoptMode::Create {
        for suffix in OBSOLETE_INDEXES {
            let name = table.object_name(suffix);
            if index_valid(conn, &quoted, &name).await?.is_some() {
                // The first migration still creates this index, so a fresh
                // install drops it too; only an upgrade is worth a line.
                let empty: bool = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                    "SELECT NOT EXISTS (SELECT 1 FROM {quoted})"
                )))
                .fetch_one(&mut *conn)
                .await?;
                if empty {
                    tracing::debug!(%table, index = %name, "dropping the first migration's index");
                } else {
                    tracing::info!(%table, index = %name, "upgrading the index layout: dropping the index it replaces");
                }
                run(conn, drop_index(table, &name)).await?;
            }
        }
    }

    let leases = leases_table(table);
    let has_leases: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
        .bind(&leases)
        .fetch_one(&mut *conn)
        .await?;
    match mode {
        // Idempotent, and cheap on the small lease table: run every start, so
        // an index dropped by hand comes back.
        AdoptMode::Create => {
            if has_leases.is_none() {
                tracing::debug!(%table, leases = %leases, "creating the lease table");
            } else if !has_column(conn, &leases, "aggregate_id").await?
                || !has_column(conn, &leases, "delayed").await?
            {
                run(conn, add_lease_columns(table)).await?;
            }
            run(conn, create_leases(table)).await?;
        }
        AdoptMode::Verify if has_leases.is_none() => {
            return Err(missing_gap(format!("has no lease table {leases}")));
        }
        AdoptMode::Verify => {
            if ordered && !has_column(conn, &leases, "aggregate_id").await? {
                return Err(missing_gap(format!(
                    "has a lease table {leases} without the aggregate_id column ordered outboxes need"
                )));
            }
            if !has_column(conn, &leases, "delayed").await? {
                return Err(missing_gap(format!(
                    "has a lease table {leases} without the delayed column this release's claims need"
                )));
            }
            let epoch = epoch_table(table);
            let has_epoch: Option<String> = sqlx::query_scalar("SELECT to_regclass($1)::text")
                .bind(&epoch)
                .fetch_one(&mut *conn)
                .await?;
            if has_epoch.is_none() {
                return Err(missing_gap(format!("has no epoch table {epoch}")));
            }
        }
    }
    if ordered {
        check_ordered_sequence(conn, table).await?;
    }

    if mode == AdoptMode::Create {
        set_fillfactor(conn, table).await?;
    }
    drop_notify_trigger(conn, table, mode).await
}

/// Leaves room on each page for the ack's new row version, unless the table
/// already has a fillfactor someone chose. Affects pages filled from now on;
/// takes a lock that lets producers insert.
async fn set_fillfactor(conn: &mut PgConnection, table: &TableRef) -> Result<(), StoreError> {
    let chosen: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_class, unnest(coalesce(reloptions, '{}')) AS opt \
         WHERE oid = $1::regclass AND opt LIKE 'fillfactor=%')",
    )
    .bind(table.quoted())
    .fetch_one(&mut *conn)
    .await?;
    if !chosen {
        tracing::info!(%table, fillfactor = FILLFACTOR, "adopting table: leaving room for acks on each page");
        run(
            conn,
            format!(
                "ALTER TABLE {} SET (fillfactor = {FILLFACTOR})",
                table.quoted()
            ),
        )
        .await?;
    }
    Ok(())
}

/// Drops the wake-up trigger of earlier releases: it made every producer's
/// insert run a function, and, with nobody marking the table quiet any more,
/// notify (notifying transactions commit one at a time). Dropping it waits for
/// a lock producers hold while they insert; when that wait times out, outboxd
/// starts anyway and says so: the trigger slows producers but breaks nothing.
async fn drop_notify_trigger(
    conn: &mut PgConnection,
    table: &TableRef,
    mode: AdoptMode,
) -> Result<(), StoreError> {
    let has_trigger: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::regclass AND tgname = $2)",
    )
    .bind(table.quoted())
    .bind(OBSOLETE_TRIGGER)
    .fetch_one(&mut *conn)
    .await?;
    if !has_trigger {
        return Ok(());
    }
    if mode == AdoptMode::Verify {
        tracing::warn!(%table, trigger = OBSOLETE_TRIGGER, "table still has the wake-up trigger of an earlier release, which slows producers' commits; run `outboxd migrate` to drop it");
        return Ok(());
    }
    let ddl = format!(
        "BEGIN; SET LOCAL lock_timeout = '10s'; {}; COMMIT;",
        drop_trigger(table)
    );
    match run(conn, ddl).await {
        Ok(()) => {
            tracing::info!(%table, trigger = OBSOLETE_TRIGGER, "dropped the wake-up trigger: producers no longer notify");
            Ok(())
        }
        Err(err @ StoreError::Unavailable(_)) => Err(err),
        Err(err) => {
            let _ = sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await;
            tracing::warn!(%table, trigger = OBSOLETE_TRIGGER, error = %err, "could not drop the wake-up trigger of an earlier release (it slows producers' commits); the next start tries again");
            Ok(())
        }
    }
}

/// Whether `relation` (quoted) has the column.
async fn has_column(
    conn: &mut PgConnection,
    relation: &str,
    column: &str,
) -> Result<bool, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::regclass \
         AND attname = $2 AND NOT attisdropped)",
    )
    .bind(relation)
    .bind(column)
    .fetch_one(&mut *conn)
    .await?)
}

/// An ordered outbox's commit-order guard reads how far the table's `seq`
/// sequence has gone, so `seq` must come from one sequence that hands out its
/// values in the order they are drawn: a sequence cache above 1 lets one
/// session insert a value long after others drew higher ones.
async fn check_ordered_sequence(
    conn: &mut PgConnection,
    table: &TableRef,
) -> Result<(), StoreError> {
    let cache: Option<i64> = sqlx::query_scalar(
        "SELECT s.seqcache FROM pg_sequence s \
         WHERE s.seqrelid = pg_get_serial_sequence($1, 'seq')::regclass",
    )
    .bind(table.quoted())
    .fetch_optional(&mut *conn)
    .await?;
    match cache {
        None => Err(StoreError::Schema(format!(
            "table {table}: ordering=aggregate needs seq to be drawn from its own sequence (an identity column or serial), which outboxd probes to keep commit order"
        ))),
        Some(cache) if cache > 1 => Err(StoreError::Schema(format!(
            "table {table}: ordering=aggregate needs the seq sequence's CACHE to be 1 (it is {cache}): cached values are inserted out of the order they were drawn"
        ))),
        Some(_) => Ok(()),
    }
}

/// Runs DDL built from the schema files (the table name is a quoted identifier).
async fn run(conn: &mut PgConnection, ddl: String) -> Result<(), StoreError> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(ddl))
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Whether the table has the named index: `None` when absent, `Some(false)` when
/// an interrupted `CREATE INDEX CONCURRENTLY` left it invalid.
async fn index_valid(
    conn: &mut PgConnection,
    quoted: &str,
    name: &str,
) -> Result<Option<bool>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = $1::regclass AND c.relname = $2",
    )
    .bind(quoted)
    .bind(name)
    .fetch_optional(&mut *conn)
    .await?)
}
