//! RabbitMQ with lapin: one shared connection per process, one confirm-mode
//! channel per in-flight slot, reconnected on demand after any failure. The
//! slots' first `ready()` connects at start, so a broker that is down shows in
//! the log at once, not at the first batch.

use std::{
    sync::{Arc, Mutex as StdMutex, PoisonError},
    time::Duration,
};

use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ExchangeKind,
    options::{
        BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
        QueueDeclareOptions,
    },
    types::{AMQPValue, FieldTable, LongString, ShortString},
};
use opentelemetry::{
    KeyValue, global,
    global::BoxedSpan,
    trace::{Span as _, SpanKind, Status, Tracer as _},
};
use opentelemetry_semantic_conventions::attribute::{
    MESSAGING_DESTINATION_NAME, MESSAGING_MESSAGE_ID, MESSAGING_OPERATION_NAME,
    MESSAGING_OPERATION_TYPE, MESSAGING_RABBITMQ_DESTINATION_ROUTING_KEY, MESSAGING_SYSTEM,
};
use tokio::{sync::Mutex, time::Instant};

use super::{
    config::{RelayConfig, RoutingKey, redact_url},
    publisher::{Delivery, Publisher},
};
use outbox_runtime::telemetry::{self, fresh_span_context};
use outboxd::pb::OutboxMessage;

use crate::metrics::{PublishResult, RelayMetrics};

/// The process's broker connection, shared by every slot.
#[derive(Debug)]
pub struct Broker {
    url: String,
    /// Shown by `rabbitmqctl list_connections name`, so operators see whose it is.
    connection_name: String,
    exchange: String,
    declare: bool,
    /// Declared and bound with `#` on each new channel (`--bind-queue`).
    bind_queue: Option<String>,
    routing_key: RoutingKey,
    confirm_timeout: Duration,
    /// Whether to build a publish span per message (`telemetry::message_spans`).
    spans: bool,
    metrics: RelayMetrics,
    connection: Mutex<Option<Arc<Connection>>>,
    /// Last reported state, so each change is logged once, not each retry.
    link: StdMutex<Link>,
}

/// The broker as the relay last reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    Untried,
    Connecting,
    /// A slot has a channel ready to publish on.
    Up,
    /// Connecting or opening a channel failed, for this reason.
    Down(String),
}

/// A state change worth a log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Connecting,
    Connected,
    Unavailable,
    /// Still down, for another reason than the one last logged.
    StillUnavailable,
}

impl Link {
    /// The state after `to`, and the line it is worth. `Connecting` counts only
    /// as the first attempt: later attempts show as a change of reason or as
    /// connected.
    fn next(&self, to: Link) -> (Link, Option<Change>) {
        let change = match (self, &to) {
            (Link::Untried, Link::Connecting) => Some(Change::Connecting),
            (_, Link::Connecting) => return (self.clone(), None),
            (Link::Down(was), Link::Down(now)) if was == now => None,
            (Link::Down(_), Link::Down(_)) => Some(Change::StillUnavailable),
            (_, Link::Down(_)) => Some(Change::Unavailable),
            (Link::Up, Link::Up) => None,
            (_, Link::Up) => Some(Change::Connected),
            (_, Link::Untried) => None,
        };
        (to, change)
    }
}

impl Broker {
    pub fn new(config: &RelayConfig, metrics: RelayMetrics) -> Arc<Self> {
        Arc::new(Self {
            url: config.amqp_url.clone(),
            connection_name: format!("outbox-relay {}", config.worker_id),
            exchange: config.exchange.clone(),
            declare: config.declare,
            bind_queue: config.bind_queue.clone(),
            routing_key: config.routing_key.clone(),
            confirm_timeout: config.confirm_timeout,
            spans: telemetry::message_spans(),
            metrics,
            connection: Mutex::new(None),
            link: StdMutex::new(Link::Untried),
        })
    }

    /// A publisher for one slot.
    pub fn publisher(self: &Arc<Self>) -> AmqpPublisher {
        AmqpPublisher {
            broker: Arc::clone(self),
            channel: None,
        }
    }

    async fn connection(&self) -> Result<Arc<Connection>, String> {
        let mut slot = self.connection.lock().await;
        if let Some(conn) = slot.as_ref().filter(|c| c.status().connected()) {
            return Ok(Arc::clone(conn));
        }
        if slot.take().is_some() {
            self.report(Link::Down("connection lost".into()));
        }
        self.report(Link::Connecting);
        let properties = ConnectionProperties::default()
            .with_connection_name(self.connection_name.as_str().into());
        match Connection::connect(&self.url, properties).await {
            Ok(conn) => {
                let conn = Arc::new(conn);
                *slot = Some(Arc::clone(&conn));
                Ok(conn)
            }
            Err(err) => Err(err.to_string()),
        }
    }

    /// A producer span per message, in the producer's trace (its stored
    /// `traceparent`), and the `traceparent` to add to the message when the
    /// event was stored without one: the span's, or fresh ids when no span is
    /// built (see `telemetry::message_spans`), so it can be followed downstream.
    fn publish_span(
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

    /// Logs the broker's state when it changes: the first attempt, connected,
    /// unavailable with the reason, and a new reason while still down.
    fn report(&self, to: Link) {
        let reason = match &to {
            Link::Down(reason) => Some(reason.clone()),
            _ => None,
        };
        let change = {
            // A panic elsewhere cannot leave a `Link` half-written.
            let mut link = self.link.lock().unwrap_or_else(PoisonError::into_inner);
            let (next, change) = link.next(to);
            *link = next;
            change
        };
        let Some(change) = change else {
            return;
        };
        let broker = redact_url(&self.url);
        match change {
            Change::Connecting => tracing::info!(%broker, "connecting to RabbitMQ"),
            Change::Connected => tracing::info!(%broker, "connected to RabbitMQ"),
            Change::Unavailable => tracing::warn!(
                %broker,
                reason,
                "RabbitMQ unavailable; holding claims until it is back"
            ),
            Change::StillUnavailable => {
                tracing::warn!(%broker, reason, "RabbitMQ still unavailable")
            }
        }
    }

    /// AMQP properties: the stored headers, the `traceparent` to add when the
    /// event has none, and ours.
    fn properties(&self, m: &OutboxMessage, traceparent: Option<String>) -> BasicProperties {
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
}

/// What a confirm (or its absence) means for the message, and the broker's
/// reply (`312 NO_ROUTE`) when it returned the message as unroutable.
fn confirmation(
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

/// One slot's confirm-mode channel.
#[derive(Debug)]
pub struct AmqpPublisher {
    broker: Arc<Broker>,
    channel: Option<Channel>,
}

impl AmqpPublisher {
    async fn channel(&mut self) -> Result<Channel, String> {
        if let Some(channel) = self.channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        self.channel = None;
        match self.open_channel().await {
            Ok(channel) => {
                self.broker.report(Link::Up);
                self.channel = Some(channel.clone());
                Ok(channel)
            }
            Err(reason) => {
                self.broker.report(Link::Down(reason.clone()));
                Err(reason)
            }
        }
    }

    /// A confirm-mode channel, with the exchange (and the try-out queue)
    /// declared: after a reconnect they may be gone with the broker's state.
    async fn open_channel(&self) -> Result<Channel, String> {
        let broker = &self.broker;
        let conn = broker.connection().await?;
        let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        if broker.declare {
            channel
                .exchange_declare(
                    broker.exchange.as_str().into(),
                    ExchangeKind::Topic,
                    ExchangeDeclareOptions {
                        durable: true,
                        ..ExchangeDeclareOptions::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(|e| e.to_string())?;
        }
        if let Some(queue) = &broker.bind_queue {
            channel
                .queue_declare(
                    queue.as_str().into(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| format!("declaring queue {queue:?}: {e}"))?;
            channel
                .queue_bind(
                    queue.as_str().into(),
                    broker.exchange.as_str().into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    format!(
                        "binding queue {queue:?} to exchange {:?}: {e}",
                        broker.exchange
                    )
                })?;
        }
        Ok(channel)
    }
}

impl Publisher for AmqpPublisher {
    async fn ready(&mut self) -> Result<(), String> {
        self.channel().await.map(|_| ())
    }

    async fn publish(&mut self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(reason) => return vec![Delivery::Failed(reason); batch.len()],
        };
        let broker = &self.broker;
        let mut spans = Vec::with_capacity(batch.len());
        let sends: Vec<_> = batch
            .iter()
            .map(|m| {
                let routing_key = broker.routing_key.render(&m.event_type, &m.aggregate_id);
                let (span, traceparent) = broker.publish_span(m, &routing_key);
                spans.push(span);
                channel.basic_publish(
                    broker.exchange.as_str().into(),
                    routing_key.into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &m.payload,
                    broker.properties(m, traceparent),
                )
            })
            .collect();
        let sent_at = Instant::now();
        let deadline = sent_at + broker.confirm_timeout;
        // Queue the whole batch before waiting for any of it. lapin resolves a
        // send only once its I/O thread has written the frames, so sending one
        // message at a time costs two thread hand-offs and a socket write per
        // message. `join_all` first polls the sends in order, and that first poll
        // is where lapin numbers a message and queues its frames: the broker still
        // gets the batch in sequence order, in as few writes as lapin makes.
        let sent: Vec<Result<_, String>> =
            match tokio::time::timeout_at(deadline, futures::future::join_all(sends)).await {
                Ok(sent) => sent
                    .into_iter()
                    .map(|r| r.map_err(|e| e.to_string()))
                    .collect(),
                Err(_) => batch
                    .iter()
                    .map(|_| Err("sending to the broker timed out".into()))
                    .collect(),
            };
        broker.metrics.published(&broker.exchange, batch.len());
        let mut deliveries = Vec::with_capacity(batch.len());
        let mut outcomes = Vec::with_capacity(batch.len());
        for ((sent, span), m) in sent.into_iter().zip(spans).zip(batch) {
            let (delivery, result, returned) = match sent {
                Err(reason) => (Delivery::Failed(reason), PublishResult::Failed, None),
                Ok(confirm) => confirmation(tokio::time::timeout_at(deadline, confirm).await),
            };
            if let Some(reply) = returned {
                // One line per message, in place of lapin's dump of its
                // properties (silenced in `telemetry`). Rare, so the routing
                // key is rendered again rather than kept for every message.
                tracing::warn!(
                    event_id = %m.id,
                    exchange = %broker.exchange,
                    routing_key = %broker.routing_key.render(&m.event_type, &m.aggregate_id),
                    %reply,
                    "unroutable: the broker returned the message (no queue bound for its routing key); nacked for a retry"
                );
            }
            outcomes.push((result, sent_at.elapsed().as_secs_f64()));
            if let Some(mut span) = span {
                match &delivery {
                    Delivery::Confirmed => span.set_status(Status::Ok),
                    Delivery::Rejected(reason) | Delivery::Failed(reason) => {
                        span.set_status(Status::error(reason.clone()));
                    }
                }
                span.end();
            }
            deliveries.push(delivery);
        }
        broker.metrics.settled(&broker.exchange, outcomes);
        if deliveries.iter().any(|d| matches!(d, Delivery::Failed(_))) {
            // Whatever failed may have broken the channel: start afresh next time.
            self.channel = None;
        }
        deliveries
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use std::collections::HashMap;

    use opentelemetry::trace::{SpanContext, TraceContextExt as _};
    use opentelemetry_sdk::{propagation::TraceContextPropagator, trace::SdkTracerProvider};

    use super::*;
    use outbox_runtime::metrics::Metrics;

    use crate::RelayArgs;

    /// A broker as `telemetry::init` leaves the process: W3C propagation and
    /// the SDK's tracer (with nothing to export to).
    fn broker(spans: bool) -> Arc<Broker> {
        global::set_text_map_propagator(TraceContextPropagator::new());
        global::set_tracer_provider(SdkTracerProvider::builder().build());
        let config = RelayArgs::try_parse_from(["outbox-relay"])
            .expect("parses")
            .validate()
            .expect("valid");
        let metrics = Metrics::new("outbox-relay").expect("metrics");
        let broker = Broker::new(&config, RelayMetrics::new(&metrics));
        Arc::new(Broker {
            spans,
            ..Arc::into_inner(broker).expect("sole owner")
        })
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

    #[test]
    fn the_broker_state_is_logged_from_the_first_attempt_and_on_each_change() {
        let down = |reason: &str| Link::Down(reason.into());
        let mut link = Link::Untried;
        let mut logged = Vec::new();
        for to in [
            Link::Connecting,
            down("refused"),
            Link::Connecting,
            down("refused"),
            down("refused"),
            down("timed out"),
            Link::Up,
            Link::Up,
            Link::Connecting,
            down("connection lost"),
            down("refused"),
            Link::Up,
        ] {
            let (next, change) = link.next(to);
            link = next;
            logged.extend(change);
        }
        use Change::*;
        assert_eq!(
            logged,
            [
                Connecting,
                Unavailable,
                StillUnavailable,
                Connected,
                Unavailable,
                StillUnavailable,
                Connected
            ]
        );
        assert_eq!(Link::Untried.next(Link::Up), (Link::Up, Some(Connected)));
    }

    const STORED: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[tokio::test]
    async fn an_event_without_a_traceparent_gets_one_with_or_without_spans() {
        for spans in [true, false] {
            let broker = broker(spans);
            let m = message(&[("k", "v")]);
            let (span, traceparent) = broker.publish_span(&m, "order.paid");
            assert_eq!(span.is_some(), spans);
            let context = context_of(traceparent.as_ref());
            assert!(context.is_valid(), "spans {spans}: {traceparent:?}");
            assert!(context.is_sampled());
            if let Some(span) = &span {
                assert_eq!(span.span_context().trace_id(), context.trace_id());
            }
            let props = broker.properties(&m, traceparent.clone());
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
        let (_, first) = broker(false).publish_span(&message(&[]), "k");
        let (_, second) = broker(false).publish_span(&message(&[]), "k");
        assert_ne!(
            context_of(first.as_ref()).trace_id(),
            context_of(second.as_ref()).trace_id(),
            "each event starts its own trace"
        );
    }

    #[tokio::test]
    async fn a_stored_traceparent_is_published_unchanged_with_or_without_spans() {
        for spans in [true, false] {
            let broker = broker(spans);
            let m = message(&[("traceparent", STORED)]);
            let (_, traceparent) = broker.publish_span(&m, "order.paid");
            assert_eq!(traceparent, None);
            assert_eq!(
                header(&broker.properties(&m, traceparent), "traceparent"),
                Some(&AMQPValue::LongString(STORED.into()))
            );
        }
    }
}
