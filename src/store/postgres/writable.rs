//! Whether the database takes writes. A standby answers every read, so a
//! plain `SELECT 1` calls it healthy while every claim fails; start-up and
//! the health check ask this instead.

use sqlx::PgConnection;

/// Why the database on `conn` takes no writes, or `None` when it does: it is
/// in recovery (a standby, or a failover in progress), or read-only by a
/// setting (`default_transaction_read_only`, on the server, the database or
/// the role; `transaction_read_only`, which follows it or recovery).
pub(super) async fn read_only_reason(
    conn: &mut PgConnection,
) -> Result<Option<String>, sqlx::Error> {
    let (recovery, default_read_only, read_only): (bool, bool, bool) = sqlx::query_as(
        "SELECT pg_is_in_recovery(), \
                current_setting('default_transaction_read_only')::bool, \
                current_setting('transaction_read_only')::bool",
    )
    .fetch_one(conn)
    .await?;
    Ok(if recovery {
        Some("the server is in recovery: a standby, or a failover in progress".into())
    } else if default_read_only {
        Some("default_transaction_read_only is on".into())
    } else if read_only {
        Some("transaction_read_only is on".into())
    } else {
        None
    })
}
