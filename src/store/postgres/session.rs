//! How one call reaches the database: a pooled connection of its own, each
//! statement bounded in time, the connection closed rather than pooled when
//! the call did not finish.

use std::{future::Future, time::Duration};

use sqlx::{PgConnection, PgPool, Postgres, Transaction, pool::PoolConnection};

use crate::store::StoreError;

/// Time for PostgreSQL's own statement-timeout error to arrive before
/// outboxd stops waiting for it.
const STATEMENT_GRACE: Duration = Duration::from_secs(1);

/// The pool and how long a statement may go unanswered (see `bounded`).
#[derive(Debug, Clone)]
pub(super) struct Session {
    pub pool: PgPool,
    deadline: Duration,
}

impl Session {
    /// Bounded by the default `--statement-timeout` until told otherwise.
    pub fn new(pool: PgPool) -> Self {
        Self {
            pool,
            deadline: Duration::from_secs(5) + STATEMENT_GRACE,
        }
    }

    /// Bounds every statement at `statement_timeout` plus a grace for the
    /// database's own timeout error to arrive.
    pub fn set_statement_timeout(&mut self, statement_timeout: Duration) {
        self.deadline = statement_timeout + STATEMENT_GRACE;
    }

    /// A statement that has not answered within `--statement-timeout` and a
    /// grace is abandoned: PostgreSQL ends a slow one itself at the timeout,
    /// so this catches a link that stalled, where its answer cannot arrive.
    /// The caller's `StatementConn` then closes the connection.
    pub async fn bounded<T>(
        &self,
        statement: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.deadline, statement).await {
            Ok(result) => Ok(result?),
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer from the database within {}",
                humantime::format_duration(self.deadline)
            ))),
        }
    }

    /// Bounds a whole call (waiting for its turn, for a connection, and every
    /// statement it runs) like one statement: however many calls queue for
    /// the same lock or connection, each answers within `--statement-timeout`
    /// and the grace. A statement still running when the bound passes is
    /// abandoned with its connection (see [`StatementConn`]).
    pub async fn call<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.deadline, call).await {
            Ok(result) => result,
            Err(_) => Err(StoreError::Unavailable(format!(
                "no answer from the database within {}",
                humantime::format_duration(self.deadline)
            ))),
        }
    }

    /// A transaction whose commit waits for its WAL to be flushed (and
    /// replicated to a synchronous standby), whatever the session's
    /// `synchronous_commit = off` (`connect.rs`). For the writes an operator
    /// is told were done (Discard, Redrive): one lost in a crash would come
    /// back as if never answered. Costs a round trip and a flush, fine for a
    /// call a person makes.
    pub async fn durable<'c>(
        &self,
        conn: &'c mut StatementConn,
    ) -> Result<Transaction<'c, Postgres>, StoreError> {
        let mut tx = self.bounded(sqlx::Connection::begin(&mut **conn)).await?;
        self.bounded(sqlx::query("SET LOCAL synchronous_commit = on").execute(&mut *tx))
            .await?;
        Ok(tx)
    }

    /// A pooled connection for one call's statements. Queries run on it rather
    /// than on the pool: the pool's executor wraps each query's row stream in a
    /// second stream of its own, which doubled the work per row returned (every
    /// row re-enters the caller's tracing span once per stream).
    ///
    /// An idle connection is taken at once: sqlx's acquire future is large
    /// enough (kilobytes) that building and moving one per statement showed in
    /// profiles. With `test_before_acquire` off, the two paths hand out the same
    /// connection; `try_acquire` never jumps the queue, since released permits
    /// go to waiters first. Only when none is idle does the call wait in line.
    pub async fn conn(&self) -> Result<StatementConn, StoreError> {
        let conn = match self.pool.try_acquire() {
            Some(conn) => conn,
            None => Box::pin(self.pool.acquire()).await?,
        };
        Ok(StatementConn {
            conn: Some(conn),
            finished: false,
        })
    }
}

/// A pooled connection for one call's statements. Unless `finish` is called
/// after them, dropping it closes the connection instead of returning it to
/// the pool: when a caller stops waiting mid-statement (its RPC was cancelled
/// or passed its deadline), PostgreSQL then ends the statement at its next
/// client check (`client_connection_check_interval`) rather than running it
/// out, and no later call waits behind it. A statement that failed closes its
/// connection too, which costs a reconnect and nothing else.
///
/// The socket is dropped, not closed the polite way: sqlx's close sends a
/// Terminate message first, and on a connection whose statement was given
/// up that never finished; its close-on-drop timeout (5 s) then let the
/// backend wait on a lock, holding its place in the lock queue, for as long
/// as the statement timeout (measured: still waiting 4 s after the deadline,
/// gone within the 1 s client check when the socket is dropped).
pub(super) struct StatementConn {
    /// `None` only once dropped.
    conn: Option<PoolConnection<Postgres>>,
    finished: bool,
}

impl StatementConn {
    pub fn finish(mut self) {
        self.finished = true;
    }
}

impl std::ops::Deref for StatementConn {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        self.conn.as_ref().expect("live until dropped")
    }
}

impl std::ops::DerefMut for StatementConn {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().expect("live until dropped")
    }
}

impl Drop for StatementConn {
    fn drop(&mut self) {
        if !self.finished
            && let Some(conn) = self.conn.take()
        {
            // Detached, the pool opens a replacement when it needs one.
            drop(conn.detach());
        }
    }
}
