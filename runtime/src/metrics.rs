//! The metrics endpoint every outbox binary serves: a meter provider per
//! server or relay (not the global one, so two servers in one process — as in
//! the tests — never mix their numbers), exposed in the Prometheus text format
//! and pushed over OTLP when an endpoint is configured. Instruments are defined
//! by their owners (outboxd's and the relay's own `metrics` modules).

use std::time::Duration;

use axum::{
    Router, extract::State, http::header, response::IntoResponse, routing::get, serve::Listener,
};
use opentelemetry::metrics::{Meter, MeterProvider as _};
use opentelemetry_prometheus_text_exporter::PrometheusExporter;
use opentelemetry_sdk::{
    metrics::{SdkMeterProvider, periodic_reader_with_async_runtime::PeriodicReader},
    runtime,
};
use tokio_util::sync::CancellationToken;

use crate::{http, telemetry};

/// Latency buckets (seconds) from a millisecond to a minute.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Commit-to-ack buckets (seconds): up to an hour, where a stuck outbox shows.
pub const AGE_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0];

/// A meter provider with its Prometheus reader (and an OTLP reader if configured).
#[derive(Debug, Clone)]
pub struct Metrics {
    provider: SdkMeterProvider,
    prometheus: PrometheusExporter,
}

impl Metrics {
    /// Must be called inside the tokio runtime that will push OTLP metrics.
    pub fn new(service: &str) -> anyhow::Result<Self> {
        let prometheus = PrometheusExporter::builder()
            // Names here already carry their unit and `_total`.
            .without_units()
            .without_counter_suffixes()
            .build();
        let mut builder = SdkMeterProvider::builder()
            .with_resource(telemetry::resource(service))
            .with_reader(prometheus.clone());
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
            prometheus,
        })
    }

    pub fn meter(&self, scope: &'static str) -> Meter {
        self.provider.meter(scope)
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        if let Err(err) = self.prometheus.export(&mut out) {
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

/// Serves `GET /metrics` on `listener` until `cancel`; a connection that
/// sends no request header within [`http::HEADER_READ_TIMEOUT`] is closed.
pub async fn serve<L: Listener>(listener: L, metrics: Metrics, cancel: CancellationToken) {
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
    http::serve(listener, |_, _| app.clone(), cancel).await;
}
