//! An outbox message as an AMQP message: routing key, properties and
//! headers, its producer span and `traceparent`, and what its confirm means.

use lapin::{
    BasicProperties, Confirmation,
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use opentelemetry::{
    KeyValue, global,
    global::BoxedSpan,
    trace::{Span as _, SpanKind, Tracer as _},
};
use opentelemetry_semantic_conventions::attribute::{
    MESSAGING_DESTINATION_NAME, MESSAGING_MESSAGE_ID, MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE, MESSAGING_RABBITMQ_DESTINATION_ROUTING_KEY, MESSAGING_SYSTEM,
};
use outbox_runtime::telemetry::{self, fresh_span_context};
use outboxd::pb::OutboxMessage;

use super::config::RoutingKey;
use crate::{metrics::PublishResult, publishers::Delivery};

/// How the relay's messages are addressed and traced.
#[derive(Debug)]
pub(super) struct Messages {
    pub exchange: String,
    pub routing_key: RoutingKey,
    /// Whether to build a publish span per message (`telemetry::message_spans`).
    pub spans: bool,
}

impl Messages {
    pub fn routing_key(&self, m: &OutboxMessage) -> String {
        self.routing_key.render(&m.event_type, &m.aggregate_id)
    }

    /// A producer span per message, in the producer's trace (its stored
    /// `traceparent`), and the `traceparent` to add to the message when the
    /// event was stored without one: the span's, or fresh ids when no span is
    /// built (see `telemetry::message_spans`), so it can be followed downstream.
    pub fn span(
        &self,
        m: &OutboxMessage,
        routing_key: &str,
    ) -> (Option<BoxedSpan>, Option<String>) {
        let span = self.spans.then(|| {
            let parent = global::get_text_map_propagator(|p| p.extract(&m.headers));
            let tracer = global::tracer("outbox-relay");
            tracer
                .span_builder(format!("publish {}", self.exchange))
                .with_kind(SpanKind::Producer)
                .with_attributes([
                    KeyValue::new(MESSAGING_SYSTEM, "rabbitmq"),
                    KeyValue::new(MESSAGING_OPERATION_TYPE, "send"),
                    KeyValue::new(MESSAGING_OPERATION_NAME, "publish"),
                    KeyValue::new(MESSAGING_DESTINATION_NAME, self.exchange.clone()),
                    KeyValue::new(
                        MESSAGING_RABBITMQ_DESTINATION_ROUTING_KEY,
                        routing_key.to_owned(),
                    ),
                    KeyValue::new(MESSAGING_MESSAGE_ID, m.id.clone()),
                ])
                .start_with_context(&tracer, &parent)
        });
        // Stored headers travel unchanged (the contract), so a producer's
        // traceparent reaches consumers as written and they join its trace.
        let traceparent = (!m.headers.contains_key("traceparent")).then(|| {
            let ids = span
                .as_ref()
                .map_or_else(fresh_span_context, |s| s.span_context().clone());
            telemetry::traceparent(&ids)
        });
        (span, traceparent)
    }
}

/// AMQP properties: the stored headers, the `traceparent` to add when the
/// event has none, and ours.
pub(super) fn properties(m: &OutboxMessage, traceparent: Option<String>) -> BasicProperties {
    let mut headers = FieldTable::default();
    // Producer headers first, so ours win on a clash. Built straight from
    // the claimed message: this runs for every message published.
    for (key, value) in &m.headers {
        headers.insert(
            ShortString::from(key.as_str()),
            AMQPValue::LongString(LongString::from(value.as_str())),
        );
    }
    if let Some(traceparent) = traceparent {
        headers.insert(
            "traceparent".into(),
            AMQPValue::LongString(LongString::from(traceparent)),
        );
    }
    headers.insert(
        "x-aggregate-id".into(),
        AMQPValue::LongString(LongString::from(m.aggregate_id.as_str())),
    );
    headers.insert(
        "x-outbox-attempt".into(),
        AMQPValue::LongLongInt(i64::from(m.attempt)),
    );
    headers.insert(
        "x-outbox-sequence".into(),
        AMQPValue::LongLongInt(m.sequence),
    );
    // Only on a re-publication: `x-outbox-attempt` starts again at 1 after an
    // operator's redrive, and this tells consumers it is not a first delivery.
    if m.redrives > 0 {
        headers.insert(
            "x-outbox-redriven".into(),
            AMQPValue::LongLongInt(i64::from(m.redrives)),
        );
    }
    let mut props = BasicProperties::default()
        .with_message_id(m.id.as_str().into())
        .with_type(m.event_type.as_str().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_headers(headers);
    if let Some(created) = &m.created_at {
        props = props.with_timestamp(u64::try_from(created.seconds).unwrap_or(0));
    }
    props
}

/// What a confirm (or its absence) means for the message, and the broker's
/// reply (`312 NO_ROUTE`) when it returned the message as unroutable.
pub(super) fn confirmation(
    confirm: Result<lapin::Result<Confirmation>, tokio::time::error::Elapsed>,
) -> (Delivery, PublishResult, Option<String>) {
    let (delivery, result) = match confirm {
        Err(_) => (
            Delivery::Failed("publisher confirm timed out".into()),
            PublishResult::Failed,
        ),
        Ok(Err(err)) => (Delivery::Failed(err.to_string()), PublishResult::Failed),
        Ok(Ok(Confirmation::Ack(None))) => (Delivery::Confirmed, PublishResult::Confirmed),
        Ok(Ok(Confirmation::Ack(Some(returned)))) => {
            let reply = format!("{} {}", returned.reply_code, returned.reply_text);
            return (
                Delivery::Rejected(format!("returned by broker: {reply}")),
                PublishResult::Returned,
                Some(reply),
            );
        }
        Ok(Ok(Confirmation::Nack(returned))) => (
            Delivery::Rejected(match returned {
                Some(r) => format!("nacked by broker: {} {}", r.reply_code, r.reply_text),
                None => "nacked by broker".into(),
            }),
            PublishResult::BrokerNacked,
        ),
        Ok(Ok(Confirmation::NotRequested)) => (
            Delivery::Failed("channel is not in confirm mode".into()),
            PublishResult::Failed,
        ),
    };
    (delivery, result, None)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use opentelemetry::trace::{SpanContext, TraceContextExt as _};
    use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::SdkTracerProvider};

    use super::*;

    /// Messages as `telemetry::init` leaves the process: W3C propagation and
    /// the SDK's tracer (with nothing to export to).
    fn messages(spans: bool) -> Messages {
        global::set_text_map_propagator(TraceContextPropagator::new());
        global::set_tracer_provider(SdkTracerProvider::builder().build());
        Messages {
            exchange: "outbox".into(),
            routing_key: RoutingKey::parse("{event_type}").expect("valid"),
            spans,
        }
    }

    fn message(headers: &[(&str, &str)]) -> OutboxMessage {
        OutboxMessage {
            id: "0190d0d2-0000-7000-8000-000000000001".into(),
            event_type: "order.paid".into(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..OutboxMessage::default()
        }
    }

    /// What a consumer's propagator reads from the published `traceparent`.
    fn context_of(traceparent: Option<&String>) -> SpanContext {
        let carrier: HashMap<_, _> = traceparent
            .map(|t| ("traceparent".to_owned(), t.clone()))
            .into_iter()
            .collect();
        global::get_text_map_propagator(|p| p.extract(&carrier))
            .span()
            .span_context()
            .clone()
    }

    fn header<'a>(props: &'a BasicProperties, key: &str) -> Option<&'a AMQPValue> {
        props.headers().as_ref()?.inner().get(key)
    }

    const STORED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[tokio::test]
    async fn an_event_without_a_traceparent_gets_one_with_or_without_spans() {
        for spans in [true, false] {
            let messages = messages(spans);
            let m = message(&[("k", "v")]);
            let (span, traceparent) = messages.span(&m, "order.paid");
            assert_eq!(span.is_some(), spans);
            let context = context_of(traceparent.as_ref());
            assert!(context.is_valid(), "spans {spans}: {traceparent:?}");
            assert!(context.is_sampled());
            if let Some(span) = &span {
                assert_eq!(span.span_context().trace_id(), context.trace_id());
            }
            let props = properties(&m, traceparent.clone());
            assert_eq!(
                header(&props, "traceparent"),
                traceparent
                    .map(|t| AMQPValue::LongString(t.into()))
                    .as_ref()
            );
            assert_eq!(
                header(&props, "k"),
                Some(&AMQPValue::LongString("v".into()))
            );
        }
        let (_, first) = messages(false).span(&message(&[]), "k");
        let (_, second) = messages(false).span(&message(&[]), "k");
        assert_ne!(
            context_of(first.as_ref()).trace_id(),
            context_of(second.as_ref()).trace_id(),
            "each event starts its own trace"
        );
    }

    #[tokio::test]
    async fn a_stored_traceparent_is_published_unchanged_with_or_without_spans() {
        for spans in [true, false] {
            let m = message(&[("traceparent", STORED)]);
            let (_, traceparent) = messages(spans).span(&m, "order.paid");
            assert_eq!(traceparent, None);
            assert_eq!(
                header(&properties(&m, traceparent), "traceparent"),
                Some(&AMQPValue::LongString(STORED.into()))
            );
        }
    }

    #[test]
    fn a_redriven_event_says_so_and_a_first_delivery_does_not() {
        let mut m = message(&[]);
        m.attempt = 1;
        assert_eq!(header(&properties(&m, None), "x-outbox-redriven"), None);
        m.redrives = 2;
        let props = properties(&m, None);
        assert_eq!(
            header(&props, "x-outbox-redriven"),
            Some(&AMQPValue::LongLongInt(2))
        );
        assert_eq!(
            header(&props, "x-outbox-attempt"),
            Some(&AMQPValue::LongLongInt(1))
        );
    }
}
