//! Reaching the database at start. A refusal that no retry can fix (a wrong
//! role or password, a database that does not exist) ends start-up at once; a
//! database that is down, starting or out of connections is retried with
//! backoff, and one that answers but takes no writes (a standby, during a
//! failover) is asked again every second; each new cause is logged when it
//! first appears.

use std::time::Duration;

use sqlx::{
    ConnectOptions, PgPool,
    postgres::{PgConnectOptions, PgPoolOptions},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{
    error::{is_refusal, is_transient, refusal},
    writable::read_only_reason,
};

/// How often start-up asks a database that takes no writes whether it does
/// now: a promotion is over in seconds, and each question is one statement.
const READ_ONLY_POLL: Duration = Duration::from_secs(1);

/// What start-up needs to open the pool.
#[derive(Debug, Clone)]
pub struct ConnectSettings {
    pub options: PgConnectOptions,
    /// The URL with its password masked, for messages.
    pub display_url: String,
    pub max_connections: u32,
    /// Bounds each attempt, and later each RPC's wait for a pooled connection.
    pub acquire_timeout: Duration,
    /// How long to keep retrying an unreachable database; `None` is forever.
    pub give_up_after: Option<Duration>,
    /// Bounds every statement of outboxd's sessions, and each lock wait.
    pub statement_timeout: Duration,
}

/// Why start-up could not get a pool.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The database answered and said no; retrying cannot help.
    #[error("cannot use database {url} as role {role:?}: {reason}")]
    Refused {
        url: String,
        role: String,
        reason: String,
    },
    /// Still unreachable when the start-up deadline passed.
    #[error(
        "database {url} still unreachable after {waited} ({cause}); check the host and port in DATABASE_URL, or wait longer with --db-start-timeout"
    )]
    Unreachable {
        url: String,
        waited: String,
        cause: String,
    },
    /// Still taking no writes when the start-up deadline passed.
    #[error(
        "database {url} still takes no writes after {waited} ({reason}); point DATABASE_URL at the primary, or wait longer with --db-start-timeout"
    )]
    ReadOnly {
        url: String,
        waited: String,
        reason: String,
    },
    #[error("shutdown before the database became reachable")]
    Cancelled,
}

/// One failed attempt, sorted.
enum Attempt {
    Refused(String),
    Transient(String),
    /// It answers but takes no writes, for this reason.
    ReadOnly(String),
}

/// Opens the pool once the database accepts a session of outboxd's and takes
/// writes.
///
/// Each attempt is one connection of its own, not the pool's: a pool retries
/// refused connections until its acquire timeout and then reports only that
/// it timed out, which hides the cause an operator needs.
///
/// A standby is waited for like a database that is down, within the same
/// `give_up_after`: during a failover the promotion comes in seconds, and
/// migrations (or any claim) on it could only fail.
pub async fn connect(
    settings: &ConnectSettings,
    cancel: &CancellationToken,
) -> Result<PgPool, ConnectError> {
    let options = session_options(&settings.options, settings.statement_timeout, 0);
    let started = Instant::now();
    let mut backoff = Duration::from_millis(200);
    let mut last_cause: Option<String> = None;
    let mut was_read_only = false;
    let mut pool: Option<PgPool> = None;
    loop {
        let failure = match reach(&options, settings.acquire_timeout).await {
            Ok(version) => {
                // The pool's own first connection, with the settings the
                // server version allows, is sorted the same way: the database
                // may refuse or fill up between the probe and it.
                let pool = pool.get_or_insert_with(|| {
                    PgPoolOptions::new()
                        .max_connections(settings.max_connections)
                        .acquire_timeout(settings.acquire_timeout)
                        // A broken connection fails one statement with
                        // UNAVAILABLE and is dropped; pinging before every
                        // statement would double round trips.
                        .test_before_acquire(false)
                        .connect_lazy_with(session_options(
                            &settings.options,
                            settings.statement_timeout,
                            version,
                        ))
                });
                match pool.acquire().await {
                    Ok(mut conn) => match read_only_reason(&mut conn).await {
                        Ok(None) => {
                            drop(conn);
                            if was_read_only {
                                tracing::info!(database = %settings.display_url, "database accepts writes");
                            } else if last_cause.is_some() {
                                tracing::info!(database = %settings.display_url, "database reachable again");
                            }
                            tracing::info!(database = %settings.display_url, "connected to database");
                            return Ok(pool.clone());
                        }
                        Ok(Some(reason)) => Attempt::ReadOnly(reason),
                        Err(err) => {
                            // Not back into the pool: it may be broken.
                            conn.close_on_drop();
                            classify(&err)
                        }
                    },
                    Err(sqlx::Error::PoolTimedOut) => Attempt::Transient(format!(
                        "no pooled connection within {}",
                        humantime::format_duration(settings.acquire_timeout)
                    )),
                    Err(err) => classify(&err),
                }
            }
            Err(attempt) => attempt,
        };
        let (cause, read_only) = match failure {
            Attempt::Refused(reason) => {
                return Err(ConnectError::Refused {
                    url: settings.display_url.clone(),
                    role: settings.options.get_username().to_owned(),
                    reason,
                });
            }
            Attempt::Transient(cause) => (cause, false),
            Attempt::ReadOnly(reason) => (reason, true),
        };
        let mut pause = if read_only { READ_ONLY_POLL } else { backoff };
        if let Some(limit) = settings.give_up_after {
            let Some(left) = limit
                .checked_sub(started.elapsed())
                .filter(|l| !l.is_zero())
            else {
                let url = settings.display_url.clone();
                let waited = humantime::format_duration(limit).to_string();
                return Err(if read_only {
                    ConnectError::ReadOnly {
                        url,
                        waited,
                        reason: cause,
                    }
                } else {
                    ConnectError::Unreachable { url, waited, cause }
                });
            };
            pause = pause.min(left);
        }
        if last_cause.as_deref() == Some(cause.as_str()) {
            tracing::debug!(database = %settings.display_url, cause = %cause, "database still not ready");
        } else if read_only {
            tracing::warn!(
                database = %settings.display_url,
                reason = %cause,
                "database does not accept writes; waiting until it does"
            );
        } else {
            tracing::warn!(
                database = %settings.display_url,
                cause = %cause,
                "database not reachable; retrying with backoff"
            );
        }
        last_cause = Some(cause);
        was_read_only = read_only;
        tokio::select! {
            () = cancel.cancelled() => return Err(ConnectError::Cancelled),
            () = tokio::time::sleep(pause) => {}
        }
        if !read_only {
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }
}

/// One connection of outboxd's own, closed at once: the server's version, or
/// why there is none.
async fn reach(options: &PgConnectOptions, within: Duration) -> Result<u32, Attempt> {
    match tokio::time::timeout(within, options.connect()).await {
        Ok(Ok(conn)) => {
            let version = conn.server_version_num().unwrap_or(0);
            let _ = sqlx::Connection::close(conn).await;
            Ok(version)
        }
        Ok(Err(err)) => Err(classify(&err)),
        Err(_) => Err(Attempt::Transient(format!(
            "no answer within {}",
            humantime::format_duration(within)
        ))),
    }
}

/// outboxd's session settings, sent as connection options.
///
/// `synchronous_commit = off`: outboxd's own writes (claim, ack, nack,
/// extend, retention) need not wait for their WAL flush; one lost in a
/// database crash only makes its rows claimable again, a redelivery that
/// at-least-once already allows, never a loss. Producers' commits are
/// unaffected.
///
/// `enable_seqscan = off`: every statement outboxd runs has an index made for
/// it, and its plan is cached per connection. Planned while the table was still
/// empty (a new deployment, a drained queue) it would be a sequential scan,
/// kept until autovacuum re-analyzes the table, and as history grows each
/// claim and ack would read the whole table (20–30 ms at 20 000 rows,
/// measured).
///
/// `jit = off`: outboxd's statements each read a few index pages, and with
/// `enable_seqscan = off` any sequential scan left in a plan (a catalog, a
/// one-row table) costs it past `jit_above_cost`: compiling it took 0.4 s,
/// a hundred times the statement (measured on the commit-order probe).
///
/// `statement_timeout` and `lock_timeout`: a stalled or locked database
/// answers an RPC with UNAVAILABLE within the limit instead of holding it as
/// long as the stall lasts. `client_connection_check_interval` (PostgreSQL 14
/// and later; `server_version` 0 leaves it out) ends a statement soon after
/// outboxd closes its connection because the caller gave up.
fn session_options(
    options: &PgConnectOptions,
    statement_timeout: Duration,
    server_version: u32,
) -> PgConnectOptions {
    let timeout = statement_timeout.as_millis().max(1).to_string();
    let mut settings = vec![
        ("synchronous_commit", "off".to_owned()),
        ("enable_seqscan", "off".to_owned()),
        ("jit", "off".to_owned()),
        ("statement_timeout", timeout.clone()),
        ("lock_timeout", timeout),
    ];
    if server_version >= 140_000 {
        settings.push(("client_connection_check_interval", "1000".to_owned()));
    }
    options.clone().options(settings)
}

fn classify(err: &sqlx::Error) -> Attempt {
    match err {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            if is_refusal(&code) {
                Attempt::Refused(refusal(&code, db.message()))
            } else if code == "08P01" {
                // A protocol violation at log-in is how PgBouncer says "no
                // such database" or "no such user": waiting will not help.
                Attempt::Refused(format!(
                    "{} (SQLSTATE 08P01); check the database name and user in DATABASE_URL",
                    db.message()
                ))
            } else if is_transient(&code) || code.starts_with("57") {
                Attempt::Transient(format!("{} (SQLSTATE {code})", db.message()))
            } else {
                // Answered, and not with anything a wait can change.
                Attempt::Refused(format!("{} (SQLSTATE {code})", db.message()))
            }
        }
        sqlx::Error::Tls(err) => Attempt::Refused(format!(
            "TLS: {err}; check sslmode and the certificates in DATABASE_URL"
        )),
        sqlx::Error::Configuration(err) => Attempt::Refused(format!("{err}")),
        // rustls reports a certificate it does not trust as I/O: invalid data.
        sqlx::Error::Io(err) if err.kind() == std::io::ErrorKind::InvalidData => {
            Attempt::Refused(format!(
                "TLS: {err}; check sslmode, sslrootcert and the server's certificate in DATABASE_URL"
            ))
        }
        sqlx::Error::Io(err) => Attempt::Transient(io_cause(err)),
        other => Attempt::Transient(other.to_string()),
    }
}

fn io_cause(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        _ => err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_connection_is_transient_and_says_so() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        match classify(&sqlx::Error::Io(io)) {
            Attempt::Transient(cause) => assert_eq!(cause, "connection refused"),
            Attempt::Refused(reason) | Attempt::ReadOnly(reason) => panic!("{reason}"),
        }
    }

    #[test]
    fn an_untrusted_certificate_is_a_refusal_with_a_tls_hint() {
        let io = std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "invalid peer certificate: UnknownIssuer",
        );
        match classify(&sqlx::Error::Io(io)) {
            Attempt::Refused(reason) => assert!(reason.contains("sslmode"), "{reason}"),
            Attempt::Transient(cause) | Attempt::ReadOnly(cause) => panic!("retried: {cause}"),
        }
    }
}
