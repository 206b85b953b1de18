//! One slot's confirm-mode channel, and a batch published on it.

use std::sync::Arc;

use lapin::{
    Channel,
    options::{BasicPublishOptions, ConfirmSelectOptions},
};
use opentelemetry::trace::{Span as _, Status};
use tokio::time::Instant;

use outboxd::pb::OutboxMessage;

use super::{
    Shared,
    link::State,
    message::{confirmation, properties},
    topology::Topology,
};
use crate::{
    metrics::PublishResult,
    publishers::{Delivery, Publisher},
};

/// One slot's confirm-mode channel on the shared connection, opened again
/// after any failure.
#[derive(Debug)]
pub struct RabbitMqPublisher {
    pub(super) broker: Arc<Shared>,
    pub(super) channel: Option<Channel>,
}

impl RabbitMqPublisher {
    async fn channel(&mut self) -> Result<Channel, String> {
        if let Some(channel) = self.channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(channel.clone());
        }
        self.channel = None;
        match self.open_channel().await {
            Ok(channel) => {
                self.broker.link.report(State::Up);
                self.channel = Some(channel.clone());
                Ok(channel)
            }
            Err(reason) => {
                self.broker.link.report(State::Down(reason.clone()));
                Err(reason)
            }
        }
    }

    /// A confirm-mode channel, with the exchange (and the try-out queue)
    /// declared: after a reconnect they may be gone with the broker's state.
    async fn open_channel(&self) -> Result<Channel, String> {
        let config = &self.broker.config;
        let conn = self.broker.link.connection().await?;
        let channel = conn.create_channel().await.map_err(|e| e.to_string())?;
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(|e| e.to_string())?;
        Topology {
            exchange: &config.exchange,
            declare: config.declare,
            bind_queue: config.bind_queue.as_deref(),
        }
        .declare(&channel)
        .await?;
        Ok(channel)
    }
}

impl Publisher for RabbitMqPublisher {
    async fn ready(&mut self) -> Result<(), String> {
        self.channel().await.map(|_| ())
    }

    async fn publish(&mut self, batch: &[OutboxMessage]) -> Vec<Delivery> {
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(reason) => return vec![Delivery::Failed(reason); batch.len()],
        };
        let broker = &self.broker;
        let exchange = broker.config.exchange.as_str();
        let mut spans = Vec::with_capacity(batch.len());
        let sends: Vec<_> = batch
            .iter()
            .map(|m| {
                let routing_key = broker.messages.routing_key(m);
                let (span, traceparent) = broker.messages.span(m, &routing_key);
                spans.push(span);
                channel.basic_publish(
                    exchange.into(),
                    routing_key.into(),
                    // Mandatory: an unroutable message comes back as returned
                    // rather than being dropped and confirmed.
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &m.payload,
                    properties(m, traceparent),
                )
            })
            .collect();
        let sent_at = Instant::now();
        let deadline = sent_at + broker.config.confirm_timeout;
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
        broker.metrics.published(exchange, batch.len());
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
                    exchange = %exchange,
                    routing_key = %broker.messages.routing_key(m),
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
        broker.metrics.settled(exchange, outcomes);
        if deliveries.iter().any(|d| matches!(d, Delivery::Failed(_))) {
            // Whatever failed may have broken the channel: start afresh next time.
            self.channel = None;
        }
        deliveries
    }
}
