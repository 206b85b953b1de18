//! Metrics: every name defined once here, exposed in the Prometheus text format
//! on `--metrics-listen` and pushed over OTLP when an endpoint is configured.
//!
//! Each server or relay owns its meter provider (not the global one), so two
//! servers in one process — as in the tests — never mix their numbers.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Router, extract::State, http::header, response::IntoResponse, routing::get};
use opentelemetry::{
    KeyValue,
    metrics::{Counter, Histogram, Meter, MeterProvider as _, ObservableGauge},
};
use opentelemetry_sdk::{
    metrics::{SdkMeterProvider, periodic_reader_with_async_runtime::PeriodicReader},
    runtime,
};
use prometheus::{Encoder, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::{store::Stats, telemetry};

/// Latency buckets (seconds) from a millisecond to a minute.
const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Commit-to-ack buckets (seconds): up to an hour, where a stuck outbox shows.
const AGE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// A meter provider with its Prometheus registry (and an OTLP reader if configured).
#[derive(Debug, Clone)]
pub struct Metrics {
    provider: SdkMeterProvider,
    registry: prometheus::Registry,
}

impl Metrics {
    /// Must be called inside the tokio runtime that will push OTLP metrics.
    pub fn new(service: &str) -> anyhow::Result<Self> {
        let registry = prometheus::Registry::new();
        let prometheus = opentelemetry_prometheus::exporter()
            .with_registry(registry.clone())
            // Names here already carry their unit and `_total`.
            .without_units()
            .without_counter_suffixes()
            .build()?;
        let mut builder = SdkMeterProvider::builder()
            .with_resource(telemetry::resource(service))
            .with_reader(prometheus);
        let otlp = [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
        ]
        .iter()
        .any(|var| std::env::var(var).is_ok_and(|v| !v.trim().is_empty()));
        if otlp {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .build()?;
            builder =
                builder.with_reader(PeriodicReader::builder(exporter, runtime::Tokio).build());
        }
        Ok(Self {
            provider: builder.build(),
            registry,
        })
    }

    pub fn meter(&self, scope: &'static str) -> Meter {
        self.provider.meter(scope)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(err) = TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %err, "metrics encoding failed");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// Pushes what is pending and stops the readers, bounded.
    pub async fn shutdown(self, deadline: Duration) {
        let provider = self.provider;
        let flush = tokio::task::spawn_blocking(move || provider.shutdown());
        if tokio::time::timeout(deadline, flush).await.is_err() {
            tracing::warn!("metrics exporter did not flush in time");
        }
    }
}

/// Serves `GET /metrics` until `cancel`.
pub async fn serve(listener: TcpListener, metrics: Metrics, cancel: CancellationToken) {
    async fn scrape(State(metrics): State<Metrics>) -> impl IntoResponse {
        (
            [(
                header::CONTENT_TYPE,
                "text/plain; version=0.0.4; charset=utf-8",
            )],
            metrics.render(),
        )
    }
    let app = Router::new()
        .route("/metrics", get(scrape))
        .with_state(metrics);
    if let Err(err) = axum::serve(listener, app)
        .with_graceful_shutdown(cancel.cancelled_owned())
        .await
    {
        tracing::warn!(error = %err, "metrics endpoint stopped");
    }
}

/// outboxd's instruments. Counters and histograms carry an `outbox` label.
#[derive(Debug, Clone)]
pub struct ServerMetrics {
    claimed: Counter<u64>,
    acked: Counter<u64>,
    nacked: Counter<u64>,
    dead_lettered: Counter<u64>,
    lease_expired: Counter<u64>,
    lease_lost: Counter<u64>,
    empty_claims: Counter<u64>,
    rpc_duration: Histogram<f64>,
    claim_batch_size: Histogram<u64>,
    commit_to_ack: Histogram<f64>,
    gauges: Arc<Mutex<BTreeMap<String, Stats>>>,
    _observers: Arc<Vec<ObservableGauge<f64>>>,
}

impl ServerMetrics {
    pub fn new(metrics: &Metrics) -> Self {
        let meter = metrics.meter("outboxd");
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        let gauges: Arc<Mutex<BTreeMap<String, Stats>>> = Arc::default();
        let gauge = |name: &'static str,
                     unit: &'static str,
                     help: &'static str,
                     read: fn(&Stats) -> f64| {
            let snapshot = Arc::clone(&gauges);
            meter
                .f64_observable_gauge(name)
                .with_description(help)
                .with_unit(unit)
                .with_callback(move |observer| {
                    let snapshot = snapshot.lock().unwrap_or_else(|p| p.into_inner());
                    for (outbox, stats) in snapshot.iter() {
                        observer.observe(read(stats), &[KeyValue::new("outbox", outbox.clone())]);
                    }
                })
                .build()
        };
        let observers = vec![
            gauge(
                "outbox_pending_messages",
                "{message}",
                "Unpublished, not dead-lettered messages.",
                |s| s.pending as f64,
            ),
            gauge(
                "outbox_in_flight_messages",
                "{message}",
                "Messages under an unexpired lease.",
                |s| s.in_flight as f64,
            ),
            gauge(
                "outbox_dead_lettered_messages",
                "{message}",
                "Dead-lettered messages awaiting an operator.",
                |s| s.dead_lettered as f64,
            ),
            gauge(
                "outbox_oldest_pending_age_seconds",
                "s",
                "Age of the oldest claimable or leased unpublished message, by the database clock. Alert on this.",
                |s| s.oldest_pending_age.as_secs_f64(),
            ),
            gauge(
                "outbox_oldest_lease_age_seconds",
                "s",
                "Age of the oldest unexpired lease, by the database clock.",
                |s| s.oldest_lease_age.as_secs_f64(),
            ),
        ];
        Self {
            claimed: counter(
                "outbox_messages_claimed_total",
                "Messages handed out under a lease.",
            ),
            acked: counter("outbox_messages_acked_total", "Messages acked (published)."),
            nacked: counter(
                "outbox_messages_nacked_total",
                "Messages released for a retry by a nack.",
            ),
            dead_lettered: counter(
                "outbox_messages_dead_lettered_total",
                "Messages dead-lettered (by nack or on reaching max attempts).",
            ),
            lease_expired: counter(
                "outbox_leases_expired_total",
                "Leases that ran out unsettled, counted when their message was re-claimed.",
            ),
            lease_lost: counter(
                "outbox_lease_lost_total",
                "Settle attempts refused because the message was no longer under that lease (stale acks).",
            ),
            empty_claims: counter(
                "outbox_empty_claims_total",
                "Claim statements that found nothing claimable (long-poll re-checks included).",
            ),
            rpc_duration: meter
                .f64_histogram("outbox_rpc_duration_seconds")
                .with_description("gRPC handling time by method and status code.")
                .with_unit("s")
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build(),
            claim_batch_size: meter
                .u64_histogram("outbox_claim_batch_size")
                .with_description("Messages per non-empty claim.")
                .with_boundaries(BATCH_BUCKETS.to_vec())
                .build(),
            commit_to_ack: meter
                .f64_histogram("outbox_commit_to_ack_seconds")
                .with_description("From created_at to the ack, by the database clock.")
                .with_unit("s")
                .with_boundaries(AGE_BUCKETS.to_vec())
                .build(),
            gauges,
            _observers: Arc::new(observers),
        }
    }

    pub fn rpc(&self, method: &'static str, code: tonic::Code, seconds: f64) {
        let attrs = [
            KeyValue::new("method", method),
            KeyValue::new("code", format!("{code:?}")),
        ];
        self.rpc_duration.record(seconds, &attrs);
    }

    pub fn claimed(&self, outbox: &str, messages: usize) {
        let attrs = [KeyValue::new("outbox", outbox.to_owned())];
        if messages == 0 {
            self.empty_claims.add(1, &attrs);
        } else {
            self.claimed.add(messages as u64, &attrs);
            self.claim_batch_size.record(messages as u64, &attrs);
        }
    }

    pub fn acked(&self, outbox: &str, n: usize) {
        self.add(&self.acked, outbox, n);
    }

    pub fn nacked(&self, outbox: &str, n: usize) {
        self.add(&self.nacked, outbox, n);
    }

    pub fn dead_lettered(&self, outbox: &str, n: usize) {
        self.add(&self.dead_lettered, outbox, n);
    }

    pub fn leases_expired(&self, outbox: &str, n: usize) {
        self.add(&self.lease_expired, outbox, n);
    }

    pub fn lease_lost(&self, outbox: &str, n: usize) {
        self.add(&self.lease_lost, outbox, n);
    }

    /// One observation per acked message; the label is built once per call.
    pub fn commit_to_ack(&self, outbox: &str, seconds: impl IntoIterator<Item = f64>) {
        let labels = [KeyValue::new("outbox", outbox.to_owned())];
        for s in seconds {
            self.commit_to_ack.record(s.max(0.0), &labels);
        }
    }

    /// The latest sample of an outbox's gauges.
    pub fn set_gauges(&self, outbox: &str, stats: Stats) {
        let mut gauges = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        gauges.insert(outbox.to_owned(), stats);
    }

    fn add(&self, counter: &Counter<u64>, outbox: &str, n: usize) {
        if n > 0 {
            counter.add(n as u64, &[KeyValue::new("outbox", outbox.to_owned())]);
        }
    }
}

/// outbox-relay's instruments, labelled by exchange.
#[derive(Debug, Clone)]
pub struct RelayMetrics {
    published: Counter<u64>,
    confirmed: Counter<u64>,
    returned: Counter<u64>,
    broker_nacked: Counter<u64>,
    failed: Counter<u64>,
    publish_duration: Histogram<f64>,
}

/// How one publish ended, for the relay's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PublishResult {
    Confirmed,
    Returned,
    BrokerNacked,
    Failed,
}

impl RelayMetrics {
    pub fn new(metrics: &Metrics) -> Self {
        let meter = metrics.meter("outbox-relay");
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        Self {
            published: counter(
                "outbox_relay_published_total",
                "Messages sent to the broker.",
            ),
            confirmed: counter(
                "outbox_relay_confirmed_total",
                "Messages the broker confirmed.",
            ),
            returned: counter(
                "outbox_relay_returned_total",
                "Messages the broker returned as unroutable (mandatory).",
            ),
            broker_nacked: counter(
                "outbox_relay_broker_nacked_total",
                "Messages the broker nacked.",
            ),
            failed: counter(
                "outbox_relay_publish_failed_total",
                "Publishes that failed or timed out before a confirm (connection loss).",
            ),
            publish_duration: meter
                .f64_histogram("outbox_relay_publish_duration_seconds")
                .with_description("From sending a message to its broker confirm.")
                .with_unit("s")
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build(),
        }
    }

    pub fn published(&self, exchange: &str, n: usize) {
        self.published
            .add(n as u64, &[KeyValue::new("exchange", exchange.to_owned())]);
    }

    /// A batch's outcomes, each with its seconds from send to confirm; counted
    /// per batch, with the label built once, since this runs for every message.
    pub fn settled(
        &self,
        exchange: &str,
        outcomes: impl IntoIterator<Item = (PublishResult, f64)>,
    ) {
        let attrs = [KeyValue::new("exchange", exchange.to_owned())];
        let (mut confirmed, mut returned, mut nacked, mut failed) = (0, 0, 0, 0);
        for (result, seconds) in outcomes {
            match result {
                PublishResult::Confirmed => {
                    confirmed += 1;
                    self.publish_duration.record(seconds, &attrs);
                }
                PublishResult::Returned => returned += 1,
                PublishResult::BrokerNacked => nacked += 1,
                PublishResult::Failed => failed += 1,
            }
        }
        for (counter, n) in [
            (&self.confirmed, confirmed),
            (&self.returned, returned),
            (&self.broker_nacked, nacked),
            (&self.failed, failed),
        ] {
            if n > 0 {
                counter.add(n, &attrs);
            }
        }
    }
}
