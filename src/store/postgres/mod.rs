//! The PostgreSQL store: the only place with SQL. Each configured table is
//! adopted (or checked) at start and its statements built once, with its name
//! quoted; every call is then one autocommit statement on the shared pool.

mod adopt;
mod connect;
mod cursor;
mod error;
mod guard;
mod outbox;
mod rows;
mod schema;
mod session;
mod statements;
mod watchdog;
mod writable;

use std::time::Duration;

use sqlx::PgPool;

pub use adopt::AdoptMode;
pub use connect::{ConnectError, ConnectSettings, connect};
pub use outbox::PgOutbox;

use crate::{
    outbox::OutboxSpec,
    store::{DbState, OutboxStore, Store, StoreError},
};

/// The PostgreSQL store. Cheap to clone; all clones share one pool.
#[derive(Debug, Clone)]
pub struct PgStore {
    session: session::Session,
    outboxes: Vec<PgOutbox>,
}

impl PgStore {
    /// Adopts (or verifies) every configured table and builds its statements.
    pub async fn open(
        pool: PgPool,
        specs: &[OutboxSpec],
        mode: AdoptMode,
    ) -> Result<Self, StoreError> {
        let mut outboxes = Vec::with_capacity(specs.len());
        for spec in specs {
            adopt::adopt(&pool, spec, mode).await?;
            outboxes.push(PgOutbox::prepare(&pool, spec).await?);
        }
        Ok(Self {
            session: session::Session::new(pool),
            outboxes,
        })
    }

    /// Bounds every statement at `statement_timeout` plus a grace for the
    /// database's own timeout error to arrive.
    pub fn with_statement_timeout(mut self, statement_timeout: Duration) -> Self {
        self.session.set_statement_timeout(statement_timeout);
        for outbox in &mut self.outboxes {
            outbox.set_statement_timeout(statement_timeout);
        }
        self
    }

    pub fn pool(&self) -> &PgPool {
        &self.session.pool
    }

    /// The configured outboxes, in configuration order.
    pub fn specs(&self) -> impl Iterator<Item = &OutboxSpec> {
        self.outboxes.iter().map(OutboxStore::spec)
    }
}

impl Store for PgStore {
    type Outbox = PgOutbox;

    fn outboxes(&self) -> Vec<PgOutbox> {
        self.outboxes.clone()
    }

    async fn ping(&self) -> Result<DbState, StoreError> {
        let mut conn = self.session.conn().await?;
        let reason = writable::read_only_reason(&mut conn).await?;
        conn.finish();
        Ok(reason.map_or(DbState::Writable, DbState::ReadOnly))
    }
}

/// Drops `--` comment lines, so the statements in `pg_stat_statements` and in
/// logs are the SQL alone.
fn strip_comments(sql: &str) -> String {
    sql.lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A statement from a SQL file as one line, for DDL logged or compared whole.
fn one_line(sql: &str) -> String {
    strip_comments(sql)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}
