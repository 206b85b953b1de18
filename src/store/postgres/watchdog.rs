//! The database watchdog's sample: `queries/watchdog.sql`, read into
//! [`DatabaseSample`].

use std::{sync::LazyLock, time::Duration};

use chrono::{DateTime, Utc};
use sqlx::{AssertSqlSafe, Row, postgres::PgRow};

use super::{PgStore, strip_comments};
use crate::store::{
    OutboxStore as _, StoreError,
    watchdog::{
        DatabaseSample, OpenTransaction, PreparedTransaction, ReplicationSlot, TableHealth,
    },
};

/// The file's five statements, in order, comments stripped.
static STATEMENTS: LazyLock<Vec<String>> = LazyLock::new(|| {
    strip_comments(include_str!("queries/watchdog.sql"))
        .split("\n;")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
});

impl PgStore {
    /// One sample of what holds back the xmin horizon and of each outbox
    /// table's upkeep: five catalogue reads on one connection, each bounded
    /// like every statement. Autocommit, so the sampling backend holds no
    /// snapshot between them.
    pub async fn database_sample(&self) -> Result<DatabaseSample, StoreError> {
        let [now, transactions, slots, prepared, tables] = STATEMENTS.as_slice() else {
            unreachable!("watchdog.sql has five statements");
        };
        let (names, outboxes): (Vec<String>, Vec<String>) = self
            .outboxes
            .iter()
            .map(|o| (o.spec().table.quoted(), o.spec().name.clone()))
            .unzip();
        let session = &self.session;
        let mut conn = session.conn().await?;
        let read_at: DateTime<Utc> = session
            .bounded(sqlx::query(AssertSqlSafe(now.as_str())).fetch_one(&mut *conn))
            .await?
            .try_get("read_at")?;
        let transactions = session
            .bounded(sqlx::query(AssertSqlSafe(transactions.as_str())).fetch_all(&mut *conn))
            .await?
            .iter()
            .map(open_transaction)
            .collect::<Result<_, _>>()?;
        let slots = session
            .bounded(sqlx::query(AssertSqlSafe(slots.as_str())).fetch_all(&mut *conn))
            .await?
            .iter()
            .map(slot)
            .collect::<Result<_, _>>()?;
        let prepared_rows = session
            .bounded(sqlx::query(AssertSqlSafe(prepared.as_str())).fetch_all(&mut *conn))
            .await?;
        let prepared_count = match prepared_rows.first() {
            Some(row) => u64::try_from(row.try_get::<i64, _>("total")?).unwrap_or(0),
            None => 0,
        };
        let prepared = prepared_rows
            .iter()
            .map(prepared_transaction)
            .collect::<Result<_, _>>()?;
        let tables = session
            .bounded(
                sqlx::query(AssertSqlSafe(tables.as_str()))
                    .bind(&names)
                    .bind(&outboxes)
                    .fetch_all(&mut *conn),
            )
            .await?
            .iter()
            .map(table_health)
            .collect::<Result<_, _>>()?;
        conn.finish();
        Ok(DatabaseSample {
            read_at,
            transactions,
            slots,
            prepared,
            prepared_count,
            tables,
        })
    }
}

fn secs(value: f64) -> Duration {
    Duration::try_from_secs_f64(value.max(0.0)).unwrap_or(Duration::MAX)
}

fn open_transaction(row: &PgRow) -> Result<OpenTransaction, sqlx::Error> {
    Ok(OpenTransaction {
        pid: row.try_get("pid")?,
        application_name: row.try_get("application_name")?,
        state: row.try_get("state")?,
        xact_start: row.try_get("xact_start")?,
        age: secs(row.try_get("age_secs")?),
        idle_in_transaction: row.try_get::<Option<f64>, _>("idle_secs")?.map(secs),
        writer: row.try_get("writer")?,
    })
}

fn slot(row: &PgRow) -> Result<ReplicationSlot, sqlx::Error> {
    Ok(ReplicationSlot {
        name: row.try_get("slot_name")?,
        slot_type: row.try_get("slot_type")?,
        active: row.try_get("active")?,
        xmin: row.try_get("xmin")?,
        catalog_xmin: row.try_get("catalog_xmin")?,
        xmin_age: row.try_get("xmin_age")?,
        catalog_xmin_age: row.try_get("catalog_xmin_age")?,
        retained_wal_bytes: row.try_get("retained_wal_bytes")?,
    })
}

fn prepared_transaction(row: &PgRow) -> Result<PreparedTransaction, sqlx::Error> {
    Ok(PreparedTransaction {
        gid: row.try_get("gid")?,
        owner: row.try_get("owner")?,
        prepared: row.try_get("prepared")?,
        age: secs(row.try_get("age_secs")?),
    })
}

fn table_health(row: &PgRow) -> Result<TableHealth, sqlx::Error> {
    Ok(TableHealth {
        outbox: row.try_get("outbox")?,
        dead_tuples: row.try_get("dead_tuples")?,
        live_tuples: row.try_get("live_tuples")?,
        since_vacuum: row.try_get::<Option<f64>, _>("vacuum_age_secs")?.map(secs),
        since_analyze: row.try_get::<Option<f64>, _>("analyze_age_secs")?.map(secs),
        table_bytes: row.try_get("table_bytes")?,
        index_bytes: row.try_get("index_bytes")?,
    })
}
