//! Start-up: waiting for the database, migrations, and why start-up failed,
//! sorted by the exit code that tells the operator what to do.

use std::time::Duration;

use sqlx::{PgPool, migrate::Migrator, postgres::PgPoolOptions};
use tokio_util::sync::CancellationToken;

use crate::{
    config::DatabaseConfig,
    store::{self, AdoptMode, ConnectError, PgStore, StoreError},
};

/// The schema migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// How long `outboxd migrate` waits for an unreachable database by default: a
/// migration Job must fail where someone sees it, not hang.
pub const MIGRATE_START_TIMEOUT: Duration = Duration::from_secs(120);

/// Why start-up failed, sorted by what the operator must do (the exit code).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address cannot be bound (in use, not resolvable): configuration.
    #[error("{0}")]
    Listen(String),
    /// A file a flag names (the TLS certificate, say) became unusable between
    /// validation and start: configuration.
    #[error("{0}")]
    Config(String),
    /// The database refuses outboxd, or stayed unreachable past the start-up
    /// timeout, or lacks a table outboxd may not create: no retry will help.
    #[error("{0}")]
    Database(String),
    /// SIGTERM or SIGINT before start-up finished.
    #[error("stopped by a signal before start-up finished")]
    Interrupted,
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

impl StartError {
    /// 64 (EX_USAGE) for a listen address or a file, 69 (EX_UNAVAILABLE) for the
    /// database, 1 otherwise. An interrupted start is the caller's to judge:
    /// the server was asked to stop (0), a migration did not finish (1).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Listen(_) | Self::Config(_) => crate::config::EXIT_CONFIG as u8,
            Self::Database(_) => EXIT_DATABASE,
            Self::Interrupted | Self::Other(_) => 1,
        }
    }
}

/// Exit code when the database refuses outboxd or cannot be reached in time
/// (EX_UNAVAILABLE from sysexits.h).
pub const EXIT_DATABASE: u8 = 69;

impl From<ConnectError> for StartError {
    fn from(err: ConnectError) -> Self {
        match err {
            ConnectError::Cancelled => Self::Interrupted,
            other => Self::Database(other.to_string()),
        }
    }
}

/// A store error during migration or adoption: refusals and tables that
/// cannot be used are the operator's to fix; the rest may pass on a restart.
pub(super) fn start_store_error(db: &DatabaseConfig, what: &str, err: StoreError) -> StartError {
    match err {
        StoreError::Refused(reason) | StoreError::Schema(reason) => StartError::Database(format!(
            "{what} in database {} as role {:?}: {reason}",
            db.display_url,
            db.connect.get_username()
        )),
        other => StartError::Other(anyhow::Error::new(other).context(what.to_owned())),
    }
}

pub(super) async fn run_migrations(db: &DatabaseConfig, pool: &PgPool) -> Result<(), StartError> {
    // A replica waits here while another migrates (sqlx's advisory lock), and
    // a migration may build an index: neither is bounded by the statement
    // timeout, so migrations get a connection of their own without it, and
    // whose commits wait for their WAL flush (a migration lost in a crash
    // would be applied again over what it left).
    let options = (*pool.connect_options()).clone().options([
        ("statement_timeout", "0"),
        ("lock_timeout", DDL_LOCK_TIMEOUT),
        ("synchronous_commit", "on"),
    ]);
    let ddl = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    let result = legacy_migrations(&ddl).await;
    ddl.close().await;
    match result {
        Ok(()) => Ok(()),
        Err(
            sqlx::migrate::MigrateError::Execute(err)
            | sqlx::migrate::MigrateError::ExecuteMigration(err, _),
        ) => Err(start_store_error(
            db,
            "running migrations",
            StoreError::from(err),
        )),
        Err(err) => Err(StartError::Other(
            anyhow::Error::new(err).context("running migrations"),
        )),
    }
}

/// The frozen migrations (`migrations/README.md`), only on a database an
/// earlier release migrated: they create the first release's `public.outbox`
/// with its trigger, which adoption would then upgrade at once. Elsewhere
/// adoption creates each configured table in today's shape, and a first start
/// reports no upgrade of something that was never there.
async fn legacy_migrations(ddl: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    let migrated: bool = sqlx::query_scalar("SELECT to_regclass('_sqlx_migrations') IS NOT NULL")
        .fetch_one(ddl)
        .await?;
    if migrated {
        MIGRATOR.run(ddl).await
    } else {
        tracing::debug!("a database no earlier release migrated: no legacy migrations to run");
        Ok(())
    }
}

/// How long migrations and table adoption wait for any one lock (another
/// replica migrating, a long transaction ahead of an index build) before
/// start-up fails saying so, instead of waiting for ever.
pub const DDL_LOCK_TIMEOUT: &str = "5min";

/// `outboxd migrate`: migrations under sqlx's advisory lock, then table adoption.
pub async fn migrate(db: &DatabaseConfig, cancel: &CancellationToken) -> Result<(), StartError> {
    let pool = store::connect(&db.connect_settings(Some(MIGRATE_START_TIMEOUT)), cancel).await?;
    let work = async {
        run_migrations(db, &pool).await?;
        PgStore::open(pool.clone(), &db.outboxes, AdoptMode::Create)
            .await
            .map_err(|e| start_store_error(db, "adopting outbox tables", e))
    };
    tokio::select! {
        done = work => { done?; }
        () = cancel.cancelled() => return Err(StartError::Interrupted),
    }
    pool.close().await;
    tracing::info!(outboxes = db.outboxes.len(), "migrations applied");
    Ok(())
}
