//! Process-wide telemetry: logs (text or JSON, `RUST_LOG` filter, trace and span
//! ids on JSON lines inside a span) and traces (OpenTelemetry, exported over
//! OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set).
//!
//! Traps handled here: the Rust SDK ignores `OTEL_PROPAGATORS`, so the W3C
//! trace-context propagator is set in code; tracing-opentelemetry needs the SDK
//! tracer, not the global boxed one; and spans are exported by a batch processor
//! on the tokio runtime, because the default one exports from a plain thread
//! where the tonic exporter finds no reactor.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use opentelemetry::{
    global,
    trace::{SpanContext, TraceFlags, TraceState, TracerProvider as _},
};
use opentelemetry_sdk::{
    Resource,
    propagation::TraceContextPropagator,
    runtime,
    trace::{
        IdGenerator as _, RandomIdGenerator, SdkTracerProvider,
        span_processor_with_async_runtime::BatchSpanProcessor,
    },
};
use tracing::Level;
use tracing_subscriber::{
    EnvFilter, Layer, Registry, filter::Targets, fmt, layer::SubscriberExt, util::SubscriberInitExt,
};

use crate::cli::LogFormat;

/// The semantic-conventions version spans and attributes follow.
pub const SEMCONV_SCHEMA_URL: &str = opentelemetry_semantic_conventions::SCHEMA_URL;

/// True when the standard variables ask for an OTLP exporter.
pub fn otlp_configured() -> bool {
    [
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    ]
    .iter()
    .any(|var| std::env::var(var).is_ok_and(|v| !v.trim().is_empty()))
}

/// The resource: `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` when given,
/// otherwise this binary's name as `service.name`.
pub fn resource(default_service: &str) -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name="));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder
            .with_service_name(default_service.to_owned())
            .build()
    }
}

/// A tracer provider that exports over OTLP when configured. Without an endpoint
/// it still assigns trace and span ids, so logs correlate with callers' traces.
/// Must be called inside the tokio runtime that will run the exporter.
pub fn tracer_provider(default_service: &str) -> anyhow::Result<SdkTracerProvider> {
    let builder = SdkTracerProvider::builder().with_resource(resource(default_service));
    let builder = if otlp_configured() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .build()?;
        builder.with_span_processor(BatchSpanProcessor::builder(exporter, runtime::Tokio).build())
    } else {
        builder
    };
    Ok(builder.build())
}

/// Owns what must be flushed at exit.
#[derive(Debug)]
pub struct Telemetry {
    tracer_provider: SdkTracerProvider,
}

impl Telemetry {
    /// Flushes and stops the exporter, bounded: a dead collector must not hold
    /// up a pod's exit.
    pub async fn shutdown(self, deadline: Duration) {
        let provider = self.tracer_provider;
        let flush = tokio::task::spawn_blocking(move || provider.shutdown());
        match tokio::time::timeout(deadline, flush).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(err))) => tracing::warn!(error = %err, "trace exporter shutdown failed"),
            Ok(Err(_)) | Err(_) => tracing::warn!("trace exporter did not flush in time"),
        }
    }
}

/// Spans per message (outboxd's lease spans, the relay's publish spans) are
/// built only when something exports them: they are the tracing whose cost
/// grows with throughput, and unexported they cost CPU for nothing.
static MESSAGE_SPANS: AtomicBool = AtomicBool::new(true);

/// Whether to build a span per message (see `MESSAGE_SPANS`).
pub fn message_spans() -> bool {
    MESSAGE_SPANS.load(Ordering::Relaxed)
}

/// A new, sampled span context with fresh ids, for a message that has to carry
/// a `traceparent` when no span is built for it.
pub fn fresh_span_context() -> SpanContext {
    let ids = RandomIdGenerator::default();
    SpanContext::new(
        ids.new_trace_id(),
        ids.new_span_id(),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

/// A W3C `traceparent` header value for `ids`, as the trace-context
/// propagator writes it, without the global propagator's lock and carrier: the
/// relay writes one for every message stored without one.
pub fn traceparent(ids: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        ids.trace_id(),
        ids.span_id(),
        ids.trace_flags() & TraceFlags::SAMPLED
    )
}

/// Targets quieter than `RUST_LOG` says, unless it names them itself:
/// lapin logs every message the broker returns (unroutable) at WARN as a dump
/// of its properties, and the relay logs one line per such message itself;
/// sqlx logs PostgreSQL's notices at INFO, such as "relation
/// _sqlx_migrations already exists, skipping" at every start.
const QUIET_TARGETS: &[(&str, &str)] = &[
    ("lapin::returned_messages", "error"),
    ("sqlx::postgres::notice", "warn"),
];

/// `RUST_LOG` (default `info`; an invalid one is ignored too), with
/// [`QUIET_TARGETS`] lowered unless `RUST_LOG` names them.
fn log_filter(rust_log: Option<&str>) -> EnvFilter {
    let rust_log = rust_log.filter(|v| !v.trim().is_empty());
    let mut filter = rust_log
        .and_then(|v| EnvFilter::try_new(v).ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    for (target, level) in QUIET_TARGETS {
        if rust_log.is_some_and(|v| v.contains(target)) {
            continue;
        }
        if let Ok(directive) = format!("{target}={level}").parse() {
            filter = filter.add_directive(directive);
        }
    }
    filter
}

/// Installs logs and traces for a binary. Call once, inside the runtime.
/// `crate_name` (the binary's `env!("CARGO_CRATE_NAME")`) is whose spans are
/// exported, with this crate's RPC spans.
pub fn init(
    service: &str,
    crate_name: &'static str,
    format: LogFormat,
) -> anyhow::Result<Telemetry> {
    MESSAGE_SPANS.store(otlp_configured(), Ordering::Relaxed);
    global::set_text_map_propagator(TraceContextPropagator::new());
    let provider = tracer_provider(service)?;
    global::set_tracer_provider(provider.clone());
    install_subscriber(format, crate_name, provider.tracer(service.to_owned()));
    Ok(Telemetry {
        tracer_provider: provider,
    })
}

/// The global subscriber: log lines filtered by `RUST_LOG`, and this crate's
/// spans (and this crate's) to OpenTelemetry whatever the log level — `RUST_LOG=warn` must quiet
/// the logs, not cut the traces (or the trace context sent to outboxd).
pub fn install_subscriber(
    format: LogFormat,
    crate_name: &'static str,
    tracer: opentelemetry_sdk::trace::Tracer,
) {
    let filter = log_filter(std::env::var("RUST_LOG").ok().as_deref());
    let spans = Targets::new()
        .with_target(crate_name, Level::INFO)
        .with_target(env!("CARGO_CRATE_NAME"), Level::INFO);
    // Entering and leaving a span must stay cheap: sqlx re-enters the RPC span
    // on every poll of a query's row stream, hundreds of times per call. Busy
    // and idle times per span (tracked inactivity) cost a clock read and a lock
    // each time, and activating the span's OpenTelemetry context on entry
    // serves only code that reads `Context::current()`; every span here names
    // its parent explicitly, and JSON logs look ids up by span.
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_tracked_inactivity(false)
        .with_context_activation(false)
        .with_filter(spans);
    let lines: Box<dyn Layer<Registry> + Send + Sync> = match format {
        // Colours only on a terminal: piped into a file or a log collector,
        // escape codes are noise.
        LogFormat::Text => fmt::layer()
            .with_target(false)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => json_subscriber::layer()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_opentelemetry_ids(true)
            .with_filter(filter)
            .boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(lines)
        .with(otel)
        .with(AskEveryEvent)
        .try_init();
}

/// Makes every callsite ask the filters each time (`Interest::sometimes`).
/// Per-layer filters pass their verdict from `enabled()` to `on_event()` in
/// a thread-local; a callsite cached as `always` skips `enabled()` and reads
/// whatever the last `enabled()` on that thread left there. sqlx's query
/// logger calls `enabled()` without then logging, so the first event after a
/// query was dropped: outboxd's start-up line, or an admin call's audit line
/// (tokio-rs/tracing#2519, #2704). One filter check per event is the cost.
struct AskEveryEvent;

impl<S: tracing::Subscriber> Layer<S> for AskEveryEvent {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
}

/// A gRPC span of `outbox.v1.OutboxService/<method>`, per the semantic
/// conventions; `kind` is `server` or `client`. The handler records `outbox`,
/// `worker_id`, `lease_id` and `batch_size`, and the status when it is known.
pub fn rpc_span(kind: &'static str, method: &str) -> tracing::Span {
    service_rpc_span(kind, "outbox.v1.OutboxService", method)
}

/// [`rpc_span`] for a method of another service of the API (`outbox.v1.OutboxAdmin`).
pub fn service_rpc_span(kind: &'static str, service: &str, method: &str) -> tracing::Span {
    use tracing::field::Empty;
    let full = format!("{service}/{method}");
    tracing::info_span!(
        "rpc",
        otel.name = %full,
        otel.kind = kind,
        otel.status_code = Empty,
        rpc.system.name = "grpc",
        rpc.method = %full,
        rpc.response.status_code = Empty,
        network.peer.address = Empty,
        outbox = Empty,
        worker_id = Empty,
        lease_id = Empty,
        batch_size = Empty,
        acked = Empty,
    )
}

/// The status-code name `rpc.response.status_code` carries (`INVALID_ARGUMENT`).
pub fn grpc_code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use opentelemetry::{propagation::TextMapPropagator as _, trace::TraceContextExt as _};

    use super::*;

    #[test]
    fn lapins_returned_message_dumps_are_quiet_unless_asked_for() {
        let quiet = "lapin::returned_messages=error";
        for rust_log in [
            None,
            Some(""),
            Some("warn"),
            Some("lapin=debug,info"),
            Some("["),
        ] {
            let filter = log_filter(rust_log).to_string();
            assert!(filter.contains(quiet), "{rust_log:?}: {filter}");
        }
        assert_eq!(log_filter(None).max_level_hint(), Some(Level::INFO.into()));
        let asked = log_filter(Some("info,lapin::returned_messages=warn")).to_string();
        assert!(!asked.contains(quiet), "{asked}");
        assert!(asked.contains("lapin::returned_messages=warn"), "{asked}");
        assert!(
            log_filter(None)
                .to_string()
                .contains("sqlx::postgres::notice=warn")
        );
    }

    #[test]
    fn traceparent_is_what_the_trace_context_propagator_writes() {
        let propagator = TraceContextPropagator::new();
        for ids in [fresh_span_context(), fresh_span_context()] {
            let mut carrier = HashMap::new();
            let context = opentelemetry::Context::new().with_remote_span_context(ids.clone());
            propagator.inject_context(&context, &mut carrier);
            assert_eq!(carrier.get("traceparent"), Some(&traceparent(&ids)));
            let read = propagator.extract(&carrier);
            assert_eq!(read.span().span_context().trace_id(), ids.trace_id());
        }
    }
}
