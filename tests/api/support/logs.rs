//! Where an in-process server's logs and spans go: log lines to the test
//! writer (shown with a failing test's output, not on every run), spans to the
//! in-process OTLP collector.

use std::sync::Once;

use super::otlp;

/// Installs the subscriber once per test process; later calls do nothing.
pub fn init_tracing() {
    use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let lines = tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(filter);
        // Spans go to the in-process collector, whatever the log level.
        let spans = tracing_opentelemetry::layer()
            .with_tracer(otlp::collector().tracer.clone())
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
        let _ = tracing_subscriber::registry()
            .with(lines)
            .with(spans)
            .try_init();
    });
}
