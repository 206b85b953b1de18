//! The composition root: pool, migrations, table adoption, the gRPC server and
//! the named background tasks, and the order in which they stop.

use std::{net::SocketAddr, time::Duration};

use anyhow::Context;
use sqlx::{PgPool, migrate::Migrator, postgres::PgPoolOptions};
use tokio::{net::TcpListener, task::JoinHandle, time::Instant};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tonic::{server::NamedService, transport::server::TcpIncoming};
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    config::{Config, DatabaseConfig},
    grpc::{
        OutboxApi,
        pb::{self, outbox_service_server::OutboxServiceServer},
    },
    metrics::{self, Metrics, ServerMetrics},
    service::{OutboxService, Outboxes},
    store::{self, AdoptMode, ConnectError, OutboxStore, PgFeed, PgStore, Store, StoreError},
    wakeup,
    watch::{self, WatchSettings},
};

/// The schema migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The health-service name readiness probes ask about.
pub const SERVICE_NAME: &str = <OutboxServiceServer<OutboxApi> as NamedService>::NAME;

/// How long `outboxd migrate` waits for an unreachable database by default: a
/// migration Job must fail where someone sees it, not hang.
pub const MIGRATE_START_TIMEOUT: Duration = Duration::from_secs(120);

/// Why start-up failed, sorted by what the operator must do (the exit code).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A listen address cannot be bound (in use, not resolvable): configuration.
    #[error("{0}")]
    Listen(String),
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
    /// 64 (EX_USAGE) for a listen address, 69 (EX_UNAVAILABLE) for the
    /// database, 1 otherwise. An interrupted start is the caller's to judge:
    /// the server was asked to stop (0), a migration did not finish (1).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Listen(_) => crate::config::EXIT_CONFIG as u8,
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
fn start_store_error(db: &DatabaseConfig, what: &str, err: StoreError) -> StartError {
    match err {
        StoreError::Refused(reason) | StoreError::Schema(reason) => StartError::Database(format!(
            "{what} in database {} as role {:?}: {reason}",
            db.display_url,
            db.connect.get_username()
        )),
        other => StartError::Other(anyhow::Error::new(other).context(what.to_owned())),
    }
}

async fn run_migrations(db: &DatabaseConfig, pool: &PgPool) -> Result<(), StartError> {
    // A replica waits here while another migrates (sqlx's advisory lock), and
    // a migration may build an index: neither is bounded by the statement
    // timeout, so migrations get a connection of their own without it.
    let options = (*pool.connect_options()).clone().options([
        ("statement_timeout", "0"),
        ("lock_timeout", DDL_LOCK_TIMEOUT),
    ]);
    let ddl = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy_with(options);
    let result = MIGRATOR.run(&ddl).await;
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

/// A server whose database is ready and whose ports are bound, not yet serving.
pub struct Server {
    config: Config,
    store: PgStore,
    notifications: PgFeed,
    listener: TcpListener,
    metrics_listener: TcpListener,
}

impl Server {
    /// Binds both listeners first, so a port in use fails before any
    /// connection or migration; then waits for the database (see
    /// `store::connect`), migrates unless told not to, and checks the tables.
    pub async fn build(config: Config, cancel: &CancellationToken) -> Result<Self, StartError> {
        let listener = config
            .listen
            .bind("--listen (OUTBOXD_LISTEN)")
            .await
            .map_err(StartError::Listen)?;
        let metrics_listener = config
            .metrics_listen
            .bind("--metrics-listen (OUTBOXD_METRICS_LISTEN)")
            .await
            .map_err(StartError::Listen)?;
        let db = &config.database;
        let pool = store::connect(&db.connect_settings(None), cancel).await?;
        let prepare = async {
            let mode = if config.migrate {
                run_migrations(db, &pool).await?;
                AdoptMode::Create
            } else {
                AdoptMode::Verify
            };
            PgStore::open(pool.clone(), &db.outboxes, mode)
                .await
                .map_err(|e| start_store_error(db, "preparing outbox tables", e))
        };
        let store = tokio::select! {
            store = prepare => store?,
            () = cancel.cancelled() => return Err(StartError::Interrupted),
        }
        .with_statement_timeout(db.statement_timeout);
        let notifications = store
            .listen()
            .await
            .context("listening for outbox notifications")?;
        Ok(Self {
            config,
            store,
            notifications,
            listener,
            metrics_listener,
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.metrics_listener.local_addr()
    }

    /// Serves until `shutdown`, then stops in order, each step bounded: health
    /// NOT_SERVING, long polls end, stop accepting and drain in-flight RPCs,
    /// stop background tasks, close the pool.
    pub async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self {
            config,
            store,
            notifications,
            listener,
            metrics_listener,
        } = self;
        let addr = listener.local_addr()?;
        let outboxes = Outboxes::new(store.outboxes());
        let (health, health_service) = tonic_health::server::health_reporter();
        health
            .set_service_status(SERVICE_NAME, ServingStatus::Serving)
            .await;

        let metrics = Metrics::new("outboxd")?;
        let server_metrics = ServerMetrics::new(&metrics);

        let background = CancellationToken::new();
        let tasks = TaskTracker::new();
        tasks.spawn(metrics::serve(
            metrics_listener,
            metrics.clone(),
            background.clone(),
        ));
        tasks.spawn(sample_gauges(
            store.clone(),
            server_metrics.clone(),
            config.metrics_interval,
            background.clone(),
        ));
        tasks.spawn(wakeup::listen(
            notifications,
            outboxes.wakeup(),
            background.clone(),
        ));
        for outbox in outboxes.iter().cloned() {
            tasks.spawn(watch::watch(
                outbox,
                WatchSettings {
                    probe_interval: config.probe_interval,
                    poll_interval: config.poll_interval,
                },
                background.clone(),
            ));
        }
        tasks.spawn(check_health(
            store.clone(),
            health.clone(),
            config.health_interval,
            shutdown.clone(),
        ));
        tasks.spawn(retention(
            store.clone(),
            config.retention_interval,
            config.retention_batch,
            background.clone(),
        ));

        let service = OutboxService::new(
            outboxes,
            config.poll_interval,
            shutdown.clone(),
            server_metrics.clone(),
        );
        let api = OutboxApi::new(service, config.limits.clone(), server_metrics);
        let reflection = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection_v1 = reflection().build_v1()?;
        let reflection_v1alpha = reflection().build_v1alpha()?;

        let stop_accepting = CancellationToken::new();
        let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
        let router = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(Duration::from_secs(30)))
            .http2_keepalive_timeout(Some(Duration::from_secs(10)))
            .layer(tower::util::MapResponseLayer::new(
                oversized_is_resource_exhausted,
            ))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(OutboxServiceServer::new(api));
        let mut grpc: JoinHandle<Result<(), tonic::transport::Error>> = tokio::spawn(
            router.serve_with_incoming_shutdown(incoming, stop_accepting.clone().cancelled_owned()),
        );
        tracing::info!(%addr, outboxes = ?store.specs().map(|s| s.name.as_str()).collect::<Vec<_>>(), "serving");

        let early = tokio::select! {
            () = shutdown.cancelled() => None,
            res = &mut grpc => Some(res),
        };
        if let Some(res) = early {
            background.cancel();
            res.context("gRPC server task")?.context("gRPC server")?;
            anyhow::bail!("gRPC server stopped unexpectedly");
        }

        set_health(&health, ServingStatus::NotServing).await;
        stop_accepting.cancel();
        match tokio::time::timeout(config.drain_timeout, &mut grpc).await {
            Ok(res) => res.context("gRPC server task")?.context("gRPC server")?,
            Err(_) => {
                tracing::warn!(timeout = ?config.drain_timeout, "drain timed out; dropping remaining RPCs");
                grpc.abort();
            }
        }
        background.cancel();
        tasks.close();
        if tokio::time::timeout(Duration::from_secs(5), tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("background tasks did not stop in time");
        }
        store.pool().close().await;
        metrics.shutdown(Duration::from_secs(5)).await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// tonic refuses a request over its size limit with OUT_OF_RANGE; gRPC's
/// convention for a message too large is RESOURCE_EXHAUSTED, which is what
/// clients look for.
fn oversized_is_resource_exhausted<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let headers = response.headers_mut();
    let oversized = headers.get("grpc-status").is_some_and(|s| s == "11")
        && headers
            .get("grpc-message")
            .and_then(|m| m.to_str().ok())
            .is_some_and(|m| m.replace("%20", " ").contains("message length too large"));
    if oversized {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from_static("8"),
        );
    }
    response
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health.set_service_status("", status).await;
    health.set_service_status(SERVICE_NAME, status).await;
}

/// SERVING only while the database answers; stops at shutdown so nothing flips
/// the status back while draining.
async fn check_health(
    store: PgStore,
    health: HealthReporter,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut serving = true;
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let ok = matches!(
            tokio::time::timeout(every.max(Duration::from_secs(1)), store.ping()).await,
            Ok(Ok(()))
        );
        if shutdown.is_cancelled() {
            return;
        }
        if ok != serving {
            serving = ok;
            if ok {
                tracing::info!("database answers again: SERVING");
                set_health(&health, ServingStatus::Serving).await;
            } else {
                tracing::warn!("database does not answer: NOT_SERVING");
                set_health(&health, ServingStatus::NotServing).await;
            }
        }
    }
}

/// Samples each outbox's gauges: one query per outbox per interval, whatever
/// the scrape rate, using the pending-rows index.
async fn sample_gauges(
    store: PgStore,
    metrics: ServerMetrics,
    every: Duration,
    cancel: CancellationToken,
) {
    let outboxes = store.outboxes();
    let mut failing = false;
    let mut stretched = false;
    let mut pacing = GaugePacing::default();
    loop {
        let began = Instant::now();
        for outbox in &outboxes {
            let name = &outbox.spec().name;
            match outbox.gauges().await {
                Ok(stats) => {
                    metrics.set_gauges(name, stats);
                    failing = false;
                }
                Err(err) if !failing => {
                    tracing::warn!(outbox = %name, error = %err, "gauge sampling failed; keeping the last values");
                    failing = true;
                }
                Err(_) => {}
            }
        }
        let took = began.elapsed();
        let pause = pacing.next(every, took);
        if (pause > every) != stretched {
            stretched = pause > every;
            if stretched {
                tracing::info!(
                    took_ms = took.as_millis(),
                    next_in_secs = pause.as_secs(),
                    "gauge samples are slow (a sample reads every pending row): sampling less often"
                );
            } else {
                tracing::info!("gauge sampling back to every --metrics-interval");
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The pause before the next gauge sample. A sample reads every pending row,
/// so with a large backlog (0.4–0.7 µs a row here: 140 ms for 200 000 rows,
/// 0.44–0.75 s for a million) it would keep a database backend busy for much
/// of each interval, just when the relays are behind. The pause stretches so
/// that sampling takes at most 1/20 of the time; the gauges then lag by more
/// than the interval, which the log says once.
fn gauge_pause(every: Duration, took: Duration) -> Duration {
    every.max(took.saturating_mul(GAUGE_DUTY))
}

/// Paces samples by the last two: one slow sample (the first, which opens a
/// connection and plans its query, or a blip) does not stretch the pause;
/// a backlog, which makes every sample slow, does.
#[derive(Debug, Default)]
struct GaugePacing {
    previous: Duration,
}

impl GaugePacing {
    fn next(&mut self, every: Duration, took: Duration) -> Duration {
        let pause = gauge_pause(every, took.min(self.previous));
        self.previous = took;
        pause
    }
}

/// The least pause after a sample, in samples' durations: 19 keeps sampling
/// to 1/20 of the time.
const GAUGE_DUTY: u32 = 19;

/// Deletes published rows past each outbox's retention, in short batches.
async fn retention(store: PgStore, every: Duration, batch: u32, cancel: CancellationToken) {
    let outboxes = store.outboxes();
    let mut failing = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        for outbox in &outboxes {
            let name = &outbox.spec().name;
            let mut deleted = 0u64;
            loop {
                if cancel.is_cancelled() {
                    return;
                }
                match outbox.purge_published(batch).await {
                    Ok(n) => {
                        deleted += n;
                        if failing {
                            tracing::info!("retention works again");
                            failing = false;
                        }
                        if n < u64::from(batch) {
                            break;
                        }
                    }
                    Err(err) => {
                        if !failing {
                            tracing::warn!(outbox = %name, error = %err, "retention failed; will retry");
                            failing = true;
                        }
                        break;
                    }
                }
            }
            if deleted > 0 {
                tracing::info!(outbox = %name, count = deleted, "deleted published rows past retention");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_sample_keeps_the_interval_and_a_slow_one_stretches_it() {
        let every = Duration::from_secs(5);
        assert_eq!(gauge_pause(every, Duration::from_millis(140)), every);
        // 3.5 s, as a backlog of some 5 million rows takes: 1/20 of the time.
        assert_eq!(
            gauge_pause(every, Duration::from_millis(3500)),
            Duration::from_millis(66_500)
        );
        assert_eq!(gauge_pause(Duration::ZERO, Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn one_slow_sample_keeps_the_interval_and_two_in_a_row_stretch_it() {
        let every = Duration::from_secs(5);
        let slow = Duration::from_millis(3500);
        let mut pacing = GaugePacing::default();
        assert_eq!(pacing.next(every, slow), every, "the first sample");
        assert_eq!(pacing.next(every, Duration::from_millis(10)), every);
        assert_eq!(pacing.next(every, slow), every, "a blip");
        assert_eq!(pacing.next(every, slow), Duration::from_millis(66_500));
    }
}
