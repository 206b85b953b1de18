//! An in-process OTLP trace collector: a tonic `TraceService` that keeps every
//! span it receives, and the tracer provider that exports to it. Both live on a
//! runtime of their own, because each test's runtime ends with the test.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use opentelemetry::{global, trace::TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_proto::tonic::{
    collector::trace::v1::{
        ExportTraceServiceRequest, ExportTraceServiceResponse,
        trace_service_server::{TraceService, TraceServiceServer},
    },
    common::v1::{AnyValue, any_value::Value},
};
use opentelemetry_sdk::{
    propagation::TraceContextPropagator,
    runtime,
    trace::{
        BatchConfigBuilder, SdkTracerProvider, Tracer,
        span_processor_with_async_runtime::BatchSpanProcessor,
    },
};
use tokio::net::TcpListener;
use tonic::{Request, Response, Status};

use crate::shared::wait::{holds_within, wait_until};

/// A span as the collector received it; ids in lowercase hex.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub name: String,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: String,
    /// 1 internal, 2 server, 3 client, 4 producer, 5 consumer.
    pub kind: i32,
    pub attributes: HashMap<String, String>,
    pub service: String,
}

#[derive(Debug, Default, Clone)]
struct Store(Arc<Mutex<Vec<ReceivedSpan>>>);

#[tonic::async_trait]
impl TraceService for Store {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        let mut spans = self.0.lock().expect("collector lock");
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .as_ref()
                .and_then(|r| r.attributes.iter().find(|kv| kv.key == "service.name"))
                .map(|kv| text(kv.value.as_ref()))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    spans.push(ReceivedSpan {
                        name: span.name,
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent_span_id: hex(&span.parent_span_id),
                        kind: span.kind,
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), text(kv.value.as_ref())))
                            .collect(),
                        service: service.clone(),
                    });
                }
            }
        }
        Ok(Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: Option<&AnyValue>) -> String {
    match value.and_then(|v| v.value.as_ref()) {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        other => format!("{other:?}"),
    }
}

/// The process-wide collector and the tracer that exports to it.
pub struct Collector {
    pub addr: SocketAddr,
    store: Store,
    pub tracer: Tracer,
}

impl Collector {
    /// Every span received so far in trace `trace_id`.
    pub fn spans_in(&self, trace_id: &str) -> Vec<ReceivedSpan> {
        let spans = self.store.0.lock().expect("collector lock");
        spans
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }

    /// Every span received so far.
    pub fn all(&self) -> Vec<ReceivedSpan> {
        self.store.0.lock().expect("collector lock").clone()
    }

    /// Waits until trace `trace_id` holds a span matching `pick`.
    pub async fn wait_for(
        &self,
        trace_id: &str,
        what: &str,
        pick: impl Fn(&ReceivedSpan) -> bool,
    ) -> ReceivedSpan {
        let find = || self.spans_in(trace_id).into_iter().find(|s| pick(s));
        let arrived = holds_within(
            Duration::from_secs(20),
            Duration::from_millis(50),
            async || find().is_some(),
        )
        .await;
        assert!(
            arrived,
            "no {what} in trace {trace_id}; it holds {:#?}",
            self.spans_in(trace_id)
        );
        find().expect("a span once there stays")
    }

    /// Waits until some span received satisfies `holds`, given every span received.
    pub async fn wait_until(&self, what: &str, holds: impl Fn(&[ReceivedSpan]) -> bool) {
        wait_until(Duration::from_secs(20), what, async || holds(&self.all())).await;
    }
}

/// Starts the collector once per test process and installs its tracer
/// provider as the global one (lease spans use the global tracer).
pub fn collector() -> &'static Collector {
    static COLLECTOR: OnceLock<Collector> = OnceLock::new();
    COLLECTOR.get_or_init(|| {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("otlp-collector".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                    .expect("collector runtime");
                rt.block_on(async move {
                    let listener = TcpListener::bind("127.0.0.1:0")
                        .await
                        .expect("bind collector");
                    let addr = listener.local_addr().expect("collector address");
                    let store = Store::default();
                    let exporter = opentelemetry_otlp::SpanExporter::builder()
                        .with_tonic()
                        .with_endpoint(format!("http://{addr}"))
                        .build()
                        .expect("span exporter");
                    let batch = BatchConfigBuilder::default()
                        .with_scheduled_delay(Duration::from_millis(100))
                        .build();
                    let provider = SdkTracerProvider::builder()
                        .with_span_processor(
                            BatchSpanProcessor::builder(exporter, runtime::Tokio)
                                .with_batch_config(batch)
                                .build(),
                        )
                        .with_resource(outboxd::telemetry::resource("outboxd-tests"))
                        .build();
                    global::set_text_map_propagator(TraceContextPropagator::new());
                    global::set_tracer_provider(provider.clone());
                    let tracer = provider.tracer("outboxd");
                    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
                    let server = tonic::transport::Server::builder()
                        .add_service(TraceServiceServer::new(store.clone()))
                        .serve_with_incoming(incoming);
                    ready_tx
                        .send(Collector {
                            addr,
                            store,
                            tracer,
                        })
                        .expect("hand the collector over");
                    let _ = server.await;
                    drop(provider);
                });
            })
            .expect("collector thread");
        ready_rx.recv().expect("the collector starts")
    })
}
