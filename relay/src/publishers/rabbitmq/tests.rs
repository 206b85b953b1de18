//! The publisher conformance suite against the RabbitMQ at 127.0.0.1:5672
//! (guest/guest). Each case declares its own exchanges and queue, named after
//! the case, the process and the clock, and deletes just those.

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    sync::Mutex,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use futures::StreamExt as _;
use lapin::{
    Connection,
    options::{BasicConsumeOptions, ExchangeDeleteOptions, QueueDeleteOptions},
    tcp::OwnedTLSConfig,
    types::{AMQPValue, FieldTable},
};

use outbox_runtime::metrics::Metrics;

use super::{RabbitMq, RabbitMqConfig, RoutingKey, connect};
use crate::{
    metrics::RelayMetrics,
    publishers::conformance::{Harness, Received, Route, conformance_suite},
};

const UPSTREAM: &str = "127.0.0.1:5672";

struct RabbitMqHarness {
    /// The routed exchange and its queue; the unroutable exchange adds a suffix.
    name: String,
    admin: Connection,
    metrics: Metrics,
    /// The exchanges and queue the brokers handed out declare.
    created: Mutex<Vec<Created>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Created {
    Exchange(String),
    Queue(String),
}

impl Harness for RabbitMqHarness {
    type Broker = RabbitMq;

    async fn new(case: &str) -> Self {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let name = format!(
            "outbox-relay-conformance.{case}.{}.{nanos}",
            std::process::id()
        );
        let url = format!("amqp://guest:guest@{UPSTREAM}/%2f");
        let admin = connect(&url, &OwnedTLSConfig::default(), "outbox-relay conformance")
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ at {UPSTREAM} (guest/guest): {e}"));
        Self {
            name,
            admin,
            metrics: Metrics::new("outbox-relay").expect("metrics"),
            created: Mutex::default(),
        }
    }

    fn upstream(&self) -> SocketAddr {
        UPSTREAM.parse().expect("address")
    }

    fn broker(&self, route: Route, addr: SocketAddr) -> RabbitMq {
        let (exchange, bind_queue) = match route {
            Route::Routed => (self.name.clone(), Some(self.name.clone())),
            Route::Unroutable => (format!("{}.nowhere", self.name), None),
        };
        {
            let mut created = self.created.lock().expect("created lock");
            created.push(Created::Exchange(exchange.clone()));
            created.extend(bind_queue.clone().map(Created::Queue));
        }
        let config = RabbitMqConfig {
            url: format!("amqp://guest:guest@{addr}/%2f"),
            tls: OwnedTLSConfig::default(),
            exchange,
            declare: true,
            routing_key: RoutingKey::parse("{event_type}").expect("template"),
            confirm_timeout: Duration::from_secs(5),
            bind_queue,
        };
        RabbitMq::new(&config, "conformance", RelayMetrics::new(&self.metrics))
    }

    async fn receive(&mut self) -> Option<Received> {
        let channel = self.admin.create_channel().await.expect("channel");
        let mut consumer = channel
            .basic_consume(
                self.name.as_str().into(),
                "conformance".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("basic.consume");
        let delivery = tokio::time::timeout(Duration::from_secs(5), consumer.next())
            .await
            .ok()??
            .expect("delivery");
        let _ = channel.close(200, "done".into()).await;
        let props = &delivery.properties;
        let headers = props.headers().as_ref().map_or_else(BTreeMap::new, |h| {
            h.inner()
                .iter()
                .map(|(k, v)| (k.to_string(), text(v)))
                .collect()
        });
        Some(Received {
            id: props
                .message_id()
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default(),
            headers,
            payload: delivery.data.clone(),
        })
    }

    async fn clean_up(self) {
        let created = self.created.into_inner().unwrap_or_default();
        for what in created {
            // A channel per delete: an error closes the channel it happens on.
            let Ok(channel) = self.admin.create_channel().await else {
                continue;
            };
            let deleted = match &what {
                Created::Exchange(name) => {
                    channel
                        .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                        .await
                }
                Created::Queue(name) => channel
                    .queue_delete(name.as_str().into(), QueueDeleteOptions::default())
                    .await
                    .map(drop),
            };
            if let Err(e) = deleted {
                eprintln!("conformance clean-up: {what:?}: {e}");
            }
        }
        let _ = self.admin.close(200, "done".into()).await;
    }
}

fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => s.to_string(),
        AMQPValue::ShortString(s) => s.to_string(),
        other => format!("{other:?}"),
    }
}

conformance_suite!(RabbitMqHarness);
