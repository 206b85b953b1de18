//! Every exchange and queue the relay's tools declare, in one place: the
//! relay's exchange and its try-out queue, and the passive check
//! `outbox-consume` makes of the queue it reads.

use lapin::{
    Channel, ErrorKind, ExchangeKind,
    options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions},
    protocol::{AMQPErrorKind, AMQPSoftError},
    types::FieldTable,
};

/// What the relay declares on each new channel: after a reconnect they may be
/// gone with the broker's state.
#[derive(Debug, Clone, Copy)]
pub struct Topology<'a> {
    pub exchange: &'a str,
    /// Declare the exchange (false: it is managed elsewhere).
    pub declare: bool,
    /// A durable queue to declare and bind to the exchange with `#`.
    pub bind_queue: Option<&'a str>,
}

impl Topology<'_> {
    pub async fn declare(&self, channel: &Channel) -> Result<(), String> {
        if self.declare {
            channel
                .exchange_declare(
                    self.exchange.into(),
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
        if let Some(queue) = self.bind_queue {
            channel
                .queue_declare(
                    queue.into(),
                    QueueDeclareOptions::durable(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| format!("declaring queue {queue:?}: {e}"))?;
            channel
                .queue_bind(
                    queue.into(),
                    self.exchange.into(),
                    "#".into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(|e| {
                    format!(
                        "binding queue {queue:?} to exchange {:?}: {e}",
                        self.exchange
                    )
                })?;
        }
        Ok(())
    }
}

/// Why a queue cannot be read.
#[derive(Debug)]
pub enum QueueCheck {
    /// The broker has no queue by that name.
    Missing,
    /// The check itself failed, for this reason.
    Failed(String),
}

/// Checks that `queue` exists without creating it (a passive declare): a
/// mistyped name must not make a new queue that nothing is bound to.
pub async fn check_queue(channel: &Channel, queue: &str) -> Result<(), QueueCheck> {
    channel
        .queue_declare(
            queue.into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map(drop)
        .map_err(|e| match e.kind() {
            ErrorKind::ProtocolError(amqp)
                if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)) =>
            {
                QueueCheck::Missing
            }
            _ => QueueCheck::Failed(e.to_string()),
        })
}
