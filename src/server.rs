//! The composition root: pool, migrations, table adoption, the gRPC server and
//! the named background tasks, and the order in which they stop.

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context;
use sqlx::{
    PgPool,
    migrate::Migrator,
    postgres::{PgListener, PgPoolOptions},
};
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
    service::OutboxService,
    store::{AdoptMode, PgStore},
    wakeup::{self, Wakeup},
    watch::{self, WatchSettings},
};

/// The schema migrations, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// The health-service name readiness probes ask about.
pub const SERVICE_NAME: &str = <OutboxServiceServer<OutboxApi> as NamedService>::NAME;

/// Connects, retrying with capped backoff until the database answers or `cancel`:
/// a replica started before its database should wait, not crash-loop.
pub async fn connect(db: &DatabaseConfig, cancel: &CancellationToken) -> anyhow::Result<PgPool> {
    let mut backoff = Duration::from_millis(200);
    let mut warned = false;
    loop {
        let attempt = PgPoolOptions::new()
            .max_connections(db.max_connections)
            .acquire_timeout(db.acquire_timeout)
            // A broken connection fails one statement with UNAVAILABLE and is
            // dropped; pinging before every statement would double round trips.
            .test_before_acquire(false)
            // outboxd's own writes (claim, ack, nack, extend, retention) need not
            // wait for their WAL flush: one lost in a database crash only makes
            // its rows claimable again, a redelivery that at-least-once already
            // allows, never a loss. Skipping the flush takes an fsync off every
            // claim's and every ack's round trip. Producers' commits are unaffected.
            //
            // Every statement outboxd runs has an index made for it, and its plan
            // is cached per connection: planned while the table was still empty
            // (a new deployment, a drained queue) it would be a sequential scan,
            // kept until autovacuum re-analyzes the table, and as history grows
            // each claim and ack would read the whole table (20–30 ms at 20 000
            // rows, measured). With sequential scans priced out the cached plans
            // use the indexes whatever the statistics said when they were made.
            .connect_with(
                db.connect
                    .clone()
                    .options([("synchronous_commit", "off"), ("enable_seqscan", "off")]),
            )
            .await;
        match attempt {
            Ok(pool) => {
                tracing::info!(database = %db.display_url, "connected to database");
                return Ok(pool);
            }
            Err(err) if !warned => {
                tracing::warn!(database = %db.display_url, error = %err, "database not reachable; retrying");
                warned = true;
            }
            Err(err) => tracing::debug!(error = %err, "database still not reachable"),
        }
        tokio::select! {
            () = cancel.cancelled() => anyhow::bail!("shutdown before the database became reachable"),
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// `outboxd migrate`: migrations under sqlx's advisory lock, then table adoption.
pub async fn migrate(db: &DatabaseConfig, cancel: &CancellationToken) -> anyhow::Result<()> {
    let pool = connect(db, cancel).await?;
    MIGRATOR.run(&pool).await.context("running migrations")?;
    PgStore::open(pool.clone(), &db.outboxes, AdoptMode::Create)
        .await
        .context("adopting outbox tables")?;
    pool.close().await;
    tracing::info!(outboxes = db.outboxes.len(), "migrations applied");
    Ok(())
}

/// A server whose database is ready and whose ports are bound, not yet serving.
pub struct Server {
    config: Config,
    store: PgStore,
    notifications: PgListener,
    listener: TcpListener,
    metrics_listener: TcpListener,
}

impl Server {
    pub async fn build(config: Config, cancel: &CancellationToken) -> anyhow::Result<Self> {
        let pool = connect(&config.database, cancel).await?;
        let mode = if config.migrate {
            MIGRATOR.run(&pool).await.context("running migrations")?;
            AdoptMode::Create
        } else {
            AdoptMode::Verify
        };
        let store = PgStore::open(pool, &config.database.outboxes, mode)
            .await
            .context("preparing outbox tables")?;
        let notifications = wakeup::connect(&store)
            .await
            .context("listening for outbox notifications")?;
        let listener = TcpListener::bind(config.listen)
            .await
            .with_context(|| format!("binding {}", config.listen))?;
        let metrics_listener = metrics::bind(config.metrics_listen).await?;
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
        let wakeup = Wakeup::new(store.specs().map(|s| s.name.clone()));
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
            store.clone(),
            Arc::clone(&wakeup),
            notifications,
            background.clone(),
        ));
        for outbox in store.specs().map(|s| s.name.clone()) {
            tasks.spawn(watch::watch(
                store.clone(),
                Arc::clone(&wakeup),
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
            store.clone(),
            wakeup,
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
    let names: Vec<String> = store.specs().map(|s| s.name.clone()).collect();
    let mut failing = false;
    let mut stretched = false;
    loop {
        let began = Instant::now();
        for name in &names {
            match store.gauges(name).await {
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
        let pause = gauge_pause(every, took);
        if (pause > every) != stretched {
            stretched = pause > every;
            if stretched {
                tracing::info!(
                    took_ms = took.as_millis(),
                    next_in_secs = pause.as_secs(),
                    "gauge sampling is slow (a large backlog): sampling less often"
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

/// The least pause after a sample, in samples' durations: 19 keeps sampling
/// to 1/20 of the time.
const GAUGE_DUTY: u32 = 19;

/// Deletes published rows past each outbox's retention, in short batches.
async fn retention(store: PgStore, every: Duration, batch: u32, cancel: CancellationToken) {
    let names: Vec<String> = store.specs().map(|s| s.name.clone()).collect();
    let mut failing = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        for name in &names {
            let mut deleted = 0u64;
            loop {
                if cancel.is_cancelled() {
                    return;
                }
                match store.purge_published(name, i64::from(batch)).await {
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
}
