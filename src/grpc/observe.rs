//! Server spans and RPC metrics. Spans follow the OpenTelemetry semantic
//! conventions for gRPC at the version in [`crate::telemetry::SEMCONV_SCHEMA_URL`]
//! (1.42.0): name and `rpc.method` are `outbox.v1.OutboxService/<Method>`,
//! `rpc.system.name = grpc`, `rpc.response.status_code` is the status name,
//! and the caller's `traceparent` in gRPC metadata is continued.

use opentelemetry::{global, propagation::Extractor};
use tokio::time::Instant;
use tonic::{
    Code, Request, Status,
    metadata::{KeyRef, MetadataMap},
};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use outbox_runtime::telemetry;

use crate::metrics::ServerMetrics;

/// Reads W3C trace context out of gRPC request metadata.
struct MetadataExtractor<'a>(&'a MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                KeyRef::Ascii(k) => Some(k.as_str()),
                KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

/// The server span of one RPC, child of the caller's trace when it sent one.
/// `outbox`, `worker_id`, `lease_id` and `batch_size` are recorded by the handler.
pub fn server_span<T>(method: &'static str, request: &Request<T>) -> Span {
    service_span("outbox.v1.OutboxService", method, request)
}

/// [`server_span`] for a method of another service (`outbox.v1.OutboxAdmin`).
pub fn service_span<T>(service: &str, method: &'static str, request: &Request<T>) -> Span {
    let span = telemetry::service_rpc_span("server", service, method);
    let parent =
        global::get_text_map_propagator(|p| p.extract(&MetadataExtractor(request.metadata())));
    let _ = span.set_parent(parent);
    if let Some(peer) = request.remote_addr() {
        span.record("network.peer.address", peer.ip().to_string());
    }
    span
}

/// Records the outcome on the span and the duration histogram.
pub fn finish<R>(
    span: &Span,
    metrics: &ServerMetrics,
    method: &'static str,
    started: Instant,
    result: &Result<R, Status>,
) {
    let code = match result {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    };
    span.record("rpc.response.status_code", telemetry::grpc_code_name(code));
    // Server-side errors per the conventions; a client's mistake is not one.
    if matches!(
        code,
        Code::Unknown
            | Code::DeadlineExceeded
            | Code::Unimplemented
            | Code::Internal
            | Code::Unavailable
            | Code::DataLoss
    ) {
        span.record("otel.status_code", "ERROR");
    }
    metrics.rpc(method, code, started.elapsed().as_secs_f64());
}
