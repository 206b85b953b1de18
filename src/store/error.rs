//! Storage failures, classified where the SQLSTATE is known.

/// What went wrong in storage, in the terms the API cares about.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown outbox {0:?}")]
    UnknownOutbox(String),
    /// The database cannot be reached or refuses work for now; retrying later may succeed.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A table does not have the shape outboxd needs (and may not be changed).
    #[error("{0}")]
    Schema(String),
    #[error("database error: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for StoreError {
    fn from(err: sqlx::Error) -> Self {
        match &err {
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed
            | sqlx::Error::Protocol(_) => Self::Unavailable(err.to_string()),
            sqlx::Error::Database(db) => match db.code().as_deref() {
                Some(code) if is_transient(code) => Self::Unavailable(err.to_string()),
                Some("42P01") | Some("42703") => Self::Schema(format!(
                    "outbox table changed under outboxd ({db}); restart to re-check it"
                )),
                _ => Self::Internal(err.to_string()),
            },
            _ => Self::Internal(err.to_string()),
        }
    }
}

/// SQLSTATEs after which the same statement may succeed later: lost or refused
/// connections (class 08), shutdown and recovery (57P0x), lack of resources
/// (class 53), serialization failures and deadlocks (40001, 40P01), and a read-only
/// standby or a failover in progress (25006).
fn is_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "40001" | "40P01" | "25006" | "55P03"
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_loss_is_unavailable() {
        let err = StoreError::from(sqlx::Error::PoolTimedOut);
        assert!(matches!(err, StoreError::Unavailable(_)));
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(matches!(
            StoreError::from(sqlx::Error::Io(io)),
            StoreError::Unavailable(_)
        ));
    }

    #[test]
    fn transient_sqlstates() {
        for code in ["08006", "57P01", "53300", "40P01"] {
            assert!(is_transient(code), "{code}");
        }
        for code in ["23505", "42P01", "22P02"] {
            assert!(!is_transient(code), "{code}");
        }
    }
}
