//! PostgreSQL's errors in the store's terms, sorted by SQLSTATE.

use crate::store::StoreError;

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
                Some(code) if is_transient(code) || code == IN_RECOVERY => {
                    Self::Unavailable(match read_only_hint(code) {
                        Some(hint) => format!("{err}; {hint}"),
                        None => err.to_string(),
                    })
                }
                Some("42P01") | Some("42703") => Self::Schema(format!(
                    "outbox table changed under outboxd ({db}); restart to re-check it"
                )),
                Some(code) if is_refusal(code) => Self::Refused(refusal(code, db.message())),
                _ => Self::Internal(err.to_string()),
            },
            _ => Self::Internal(err.to_string()),
        }
    }
}

/// `feature_not_supported`: in general no retry fixes it, but outboxd's
/// statements are fixed (and tested on every supported version), so what
/// raises it for them is a standby refusing the unlogged lease table ("cannot
/// access temporary or unlogged relations during recovery"), and the same
/// statement succeeds once it is promoted. Transient for statements only, not
/// at log-in, where a proxy may use it to refuse outboxd's options for good.
const IN_RECOVERY: &str = "0A000";

/// SQLSTATEs after which the same statement may succeed later: lost or refused
/// connections (class 08), shutdown and recovery (57P0x), a statement or lock
/// wait that ran past its timeout (57014, 55P03), lack of resources
/// (class 53), serialization failures and deadlocks (40001, 40P01), and a read-only
/// standby or a failover in progress (25006; and [`IN_RECOVERY`] for a statement).
pub(crate) fn is_transient(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || matches!(
            code,
            "57P01" | "57P02" | "57P03" | "57014" | "40001" | "40P01" | "25006" | "55P03"
        )
}

/// What a refused write says about the database, for the log: PostgreSQL's
/// words name neither the standby nor the failover an operator must look for.
fn read_only_hint(code: &str) -> Option<&'static str> {
    match code {
        IN_RECOVERY => Some(
            "the database is probably a standby in recovery (a failover in progress?): outboxd needs the primary",
        ),
        "25006" => Some(
            "the database is read-only (a standby, or default_transaction_read_only): outboxd needs the primary",
        ),
        _ => None,
    }
}

/// SQLSTATEs that no retry can fix: invalid authorization (class 28), a
/// database or schema that does not exist (3D000, 3F000), a missing privilege
/// (42501).
pub(crate) fn is_refusal(code: &str) -> bool {
    code.starts_with("28") || matches!(code, "3D000" | "3F000" | "42501")
}

/// The refusal as one line: PostgreSQL's words, its code, and what to do.
pub(crate) fn refusal(code: &str, message: &str) -> String {
    let hint = match code {
        "3D000" => "create the database, or fix the database name in DATABASE_URL",
        "3F000" => {
            "create the schema (CREATE SCHEMA), or fix the table named in --outbox / OUTBOXD_OUTBOXES"
        }
        "42501" => {
            "grant the role the privilege, or run `outboxd migrate` as a role that owns the tables and start outboxd with --no-migrate"
        }
        "28P01" => "check the password in DATABASE_URL",
        _ => "check the user and password in DATABASE_URL and the server's pg_hba.conf",
    };
    format!("{message} (SQLSTATE {code}); {hint}")
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
        for code in ["08006", "57P01", "53300", "40P01", "25006"] {
            assert!(is_transient(code), "{code}");
        }
        for code in ["23505", "42P01", "22P02"] {
            assert!(!is_transient(code), "{code}");
        }
    }

    #[test]
    fn refusals_are_neither_transient_nor_internal() {
        for code in ["28000", "28P01", "3D000", "3F000", "42501"] {
            assert!(is_refusal(code) && !is_transient(code), "{code}");
        }
        for code in ["57P03", "08006", "53300", "42P01", "23505"] {
            assert!(!is_refusal(code), "{code}");
        }
        assert!(
            refusal("3D000", "database \"nope\" does not exist").contains("create the database")
        );
    }
}
