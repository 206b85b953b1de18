//! RabbitMQ with lapin: one shared connection per process, one confirm-mode
//! channel per in-flight slot, reconnected on demand after any failure. The
//! slots' first `ready()` connects at start, so a broker that is down shows in
//! the log at once, not at the first batch.

mod config;
mod link;
mod message;
mod publisher;
pub mod topology;

#[cfg(test)]
mod tests;

use std::sync::Arc;

use outbox_runtime::telemetry;

pub use config::{ConnectionArgs, RabbitMqArgs, RabbitMqConfig, RoutingKey, redact_url};
pub use link::connect;
pub use publisher::RabbitMqPublisher;

use crate::{metrics::RelayMetrics, publishers::Broker};
use link::Link;
use message::Messages;

/// The process's RabbitMQ broker, shared by every slot.
#[derive(Debug, Clone)]
pub struct RabbitMq(Arc<Shared>);

/// What every slot's publisher reads.
#[derive(Debug)]
struct Shared {
    config: RabbitMqConfig,
    messages: Messages,
    metrics: RelayMetrics,
    link: Link,
}

impl RabbitMq {
    /// Connects on the first slot's `ready()`, not here. `worker_id` names the
    /// connection (`outbox-relay <worker_id>`) for operators.
    pub fn new(config: &RabbitMqConfig, worker_id: &str, metrics: RelayMetrics) -> Self {
        Self(Arc::new(Shared {
            messages: Messages {
                exchange: config.exchange.clone(),
                routing_key: config.routing_key.clone(),
                spans: telemetry::message_spans(),
            },
            link: Link::new(
                config.url.clone(),
                config.tls.clone(),
                format!("outbox-relay {worker_id}"),
            ),
            config: config.clone(),
            metrics,
        }))
    }
}

impl Broker for RabbitMq {
    type Publisher = RabbitMqPublisher;

    fn destination(&self) -> &str {
        &self.0.config.exchange
    }

    fn publisher(&self) -> RabbitMqPublisher {
        RabbitMqPublisher {
            broker: Arc::clone(&self.0),
            channel: None,
        }
    }
}
