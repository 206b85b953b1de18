//! outbox-relay, the reference worker: claims leased batches from outboxd,
//! publishes them to a broker (RabbitMQ, with publisher confirms and
//! `mandatory`), and acks what the broker confirmed. At-least-once: a crash at
//! any point leaves the messages to lease expiry and redelivery, never to loss.
//!
//! The worker loop (`worker/`) knows outboxd only through [`Leases`] and the
//! broker only through [`Broker`] and [`Publisher`] (`publishers/`).

pub mod config;
pub mod credentials;
mod leases;
pub mod metrics;
pub mod publishers;
mod worker;

use std::{sync::Arc, time::Duration};

use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use outbox_runtime::metrics::{self as endpoint, Metrics};

use crate::metrics::RelayMetrics;

pub use config::{BrokerConfig, MetricsListen, RelayArgs, RelayConfig};
pub use leases::{GrpcLeases, Leases};
pub use publishers::{Broker, Delivery, Publisher, rabbitmq::RabbitMq};
pub use worker::{ServerLink, Settings, Worker};

/// Binds the metrics listener (nothing for `off`). Called before anything
/// connects, so a taken port is a configuration error, reported as one: the
/// message names `--metrics-listen` and says what to do.
pub async fn bind_metrics(listen: &MetricsListen) -> Result<Option<TcpListener>, String> {
    match listen {
        MetricsListen::Off => Ok(None),
        MetricsListen::At(addr) => addr.bind("--metrics-listen").await.map(Some),
    }
}

/// Runs `concurrency` slots until `stop`, then gives in-flight batches until the
/// drain timeout to publish and settle. What is left then expires with its lease.
/// `metrics_listener` comes from [`bind_metrics`].
pub async fn run(
    config: RelayConfig,
    metrics_listener: Option<TcpListener>,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let leases =
        GrpcLeases::connect_lazy(&config.server, config.tls.as_ref(), config.token.as_ref())
            .map_err(anyhow::Error::msg)?;
    // Re-reads the token file until the slots are done: a drain's acks still
    // need a valid token.
    let token_stop = CancellationToken::new();
    let token_watch = config
        .token
        .clone()
        .map(|file| tokio::spawn(file.watch(credentials::TOKEN_POLL, token_stop.clone())));
    let metrics = Metrics::new("outbox-relay")?;
    let metrics_addr = match &metrics_listener {
        Some(listener) => listener.local_addr()?.to_string(),
        None => "off".to_owned(),
    };
    let relay_metrics = RelayMetrics::new(&metrics);
    let metrics_stop = CancellationToken::new();
    let endpoint = metrics_listener.map(|listener| {
        tokio::spawn(endpoint::serve(
            listener,
            metrics.clone(),
            metrics_stop.clone(),
        ))
    });
    // The one place that knows every broker: each arm starts the slots on its
    // own, then says what it relays to.
    let slots = match &config.broker {
        BrokerConfig::RabbitMq(rabbitmq) => {
            let broker = RabbitMq::new(rabbitmq, &config.worker_id, relay_metrics);
            let slots = start(&config, &leases, &broker, &stop);
            relaying(
                &config,
                &metrics_addr,
                broker.destination(),
                rabbitmq.bind_queue.as_deref(),
            );
            slots
        }
    };
    stop.cancelled().await;
    tracing::info!(timeout = ?config.drain_timeout, "stopped claiming; finishing in-flight batches");
    if tokio::time::timeout(config.drain_timeout, slots.wait())
        .await
        .is_err()
    {
        tracing::warn!("drain timed out; unfinished batches are left to lease expiry");
    }
    metrics_stop.cancel();
    token_stop.cancel();
    if let Some(endpoint) = endpoint {
        let _ = endpoint.await;
    }
    if let Some(watch) = token_watch {
        let _ = watch.await;
    }
    metrics.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// Spawns `concurrency` slots, each with its own publisher from `broker`,
/// claiming until `stop`; the tracker is closed, so waiting on it ends when
/// they all have.
fn start<L: Leases, B: Broker>(
    config: &RelayConfig,
    leases: &L,
    broker: &B,
    stop: &CancellationToken,
) -> TaskTracker {
    let settings = Arc::new(Settings {
        outbox: config.outbox.clone(),
        worker_id: config.worker_id.clone(),
        batch_size: config.batch_size,
        lease: config.lease,
        wait: config.wait,
        claim_ahead: config.claim_ahead,
        ack_with_claim: config.ack_with_claim,
    });
    let server = Arc::new(ServerLink::default());
    let slots = TaskTracker::new();
    for _ in 0..config.concurrency {
        let worker = Worker::new(
            leases.clone(),
            broker.publisher(),
            Arc::clone(&settings),
            Arc::clone(&server),
        );
        slots.spawn(worker.run(stop.clone()));
    }
    slots.close();
    slots
}

/// The start-up line. Its fields keep the names they had with RabbitMQ alone:
/// `exchange` is the broker's destination, `bind_queue` RabbitMQ's try-out
/// queue (absent for a broker without one).
fn relaying(config: &RelayConfig, metrics: &str, destination: &str, bind_queue: Option<&str>) {
    tracing::info!(
        server = %config.server,
        tls = config.tls.is_some(),
        token_file = config.token.as_ref().map(|t| t.path.display().to_string()),
        outbox = %config.outbox,
        exchange = %destination,
        worker_id = %config.worker_id,
        concurrency = config.concurrency,
        claim_ahead = config.claim_ahead,
        ack_with_claim = config.ack_with_claim,
        bind_queue,
        metrics = %metrics,
        "relaying"
    );
}
