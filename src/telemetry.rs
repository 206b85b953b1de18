//! outboxd's lease spans: one `outbox lease` span per message, from claim to
//! its end, in the producer's trace. The process-wide set-up (logs, exporters,
//! propagation) is `outbox_runtime::telemetry`.

use opentelemetry::{KeyValue, global};
use outbox_runtime::telemetry::message_spans;

pub use outbox_runtime::telemetry::{Telemetry, init, resource};

/// How a lease ended, as the `outbox.lease.outcome` attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    /// Acked: published.
    Ok,
    /// Nacked: released for a retry.
    Nacked,
    DeadLettered,
    /// Ran out unsettled; reported when the row was re-claimed.
    Expired,
}

impl LeaseOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Nacked => "nacked",
            Self::DeadLettered => "dead_lettered",
            Self::Expired => "expired",
        }
    }
}

/// Reports one message's lease as an `outbox lease` span from claim to its end,
/// a child of the producer's trace context stored with the event. The times come
/// from the row (database clock), so whichever replica sees the end reports it.
pub fn record_lease(outbox: &str, lease: &crate::lease::EndedLease, outcome: LeaseOutcome) {
    use opentelemetry::trace::{Span as _, SpanKind, Status, Tracer as _};
    use opentelemetry_semantic_conventions::attribute::MESSAGING_MESSAGE_ID;

    let Some(claimed_at) = lease.claimed_at.filter(|_| message_spans()) else {
        return;
    };
    let mut carrier = std::collections::HashMap::new();
    if let Some(traceparent) = &lease.traceparent {
        carrier.insert("traceparent".to_owned(), traceparent.clone());
    }
    if let Some(tracestate) = &lease.tracestate {
        carrier.insert("tracestate".to_owned(), tracestate.clone());
    }
    let parent = global::get_text_map_propagator(|p| p.extract(&carrier));
    let tracer = global::tracer("outboxd");
    let mut attributes = vec![
        KeyValue::new(MESSAGING_MESSAGE_ID, lease.message_id.to_string()),
        KeyValue::new("outbox.name", outbox.to_owned()),
        KeyValue::new("outbox.lease.attempt", i64::from(lease.attempt)),
        KeyValue::new("outbox.lease.outcome", outcome.as_str()),
    ];
    if let Some(lease_id) = lease.lease_id {
        attributes.push(KeyValue::new("outbox.lease.id", lease_id.to_string()));
    }
    if let Some(worker) = &lease.worker_id {
        attributes.push(KeyValue::new("outbox.worker.id", worker.clone()));
    }
    let mut span = tracer
        .span_builder("outbox lease")
        .with_kind(SpanKind::Internal)
        .with_start_time(std::time::SystemTime::from(claimed_at))
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent);
    match outcome {
        LeaseOutcome::Ok => span.set_status(Status::Ok),
        LeaseOutcome::Expired => {
            span.set_status(Status::error("lease expired before it was settled"))
        }
        LeaseOutcome::DeadLettered => span.set_status(Status::error("dead-lettered")),
        LeaseOutcome::Nacked => {}
    }
    span.end_with_timestamp(std::time::SystemTime::from(lease.ended_at));
}
