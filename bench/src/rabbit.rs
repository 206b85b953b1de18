//! RabbitMQ: the bench's exchange and queue, the message properties every
//! design publishes with, and pipelined publishing with confirms.

use std::time::Duration;

use anyhow::{Context as _, bail};
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, PublisherConfirm,
    options::{
        BasicPublishOptions, ConfirmSelectOptions, ExchangeDeleteOptions, QueueDeclareOptions,
        QueueDeleteOptions, QueuePurgeOptions,
    },
    types::{AMQPValue, FieldTable, LongString},
};
use outbox_relay::publishers::rabbitmq::topology::Topology;
use tokio::sync::Mutex;

/// A durable topic exchange with one durable queue bound to `#`.
pub struct Rabbit {
    pub exchange: String,
    pub queue: String,
    url: String,
    /// Reopened when something (another test suite on the same broker) closes it.
    admin: Mutex<Option<(Connection, Channel)>>,
}

impl std::fmt::Debug for Rabbit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rabbit")
            .field("exchange", &self.exchange)
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

pub async fn connect(url: &str, name: &str) -> anyhow::Result<Connection> {
    let props = ConnectionProperties::default().with_connection_name(name.into());
    Connection::connect(url, props)
        .await
        .context("connecting to RabbitMQ")
}

/// A channel in confirm mode.
pub async fn confirm_channel(conn: &Connection) -> anyhow::Result<Channel> {
    let ch = conn.create_channel().await.context("opening a channel")?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .context("confirm.select")?;
    Ok(ch)
}

impl Rabbit {
    pub async fn setup(url: &str, suffix: &str) -> anyhow::Result<Self> {
        let conn = connect(url, "outbox-bench admin").await?;
        let exchange = format!("outbox-bench-{suffix}");
        let queue = format!("outbox-bench-{suffix}");
        let ch = conn.create_channel().await.context("opening a channel")?;
        Topology {
            exchange: &exchange,
            declare: true,
            bind_queue: Some(&queue),
        }
        .declare(&ch)
        .await
        .map_err(anyhow::Error::msg)
        .context("declaring the exchange and its queue")?;
        Ok(Self {
            exchange,
            queue,
            url: url.to_owned(),
            admin: Mutex::new(Some((conn, ch))),
        })
    }

    async fn admin(&self) -> anyhow::Result<Channel> {
        let mut slot = self.admin.lock().await;
        if let Some((_, ch)) = slot
            .as_ref()
            .filter(|(c, ch)| c.status().connected() && ch.status().connected())
        {
            return Ok(ch.clone());
        }
        if let Some((conn, _)) = slot.take().filter(|(c, _)| c.status().connected()) {
            let ch = conn.create_channel().await.context("opening a channel")?;
            *slot = Some((conn, ch.clone()));
            return Ok(ch);
        }
        let conn = connect(&self.url, "outbox-bench admin").await?;
        let ch = conn.create_channel().await.context("opening a channel")?;
        *slot = Some((conn, ch.clone()));
        Ok(ch)
    }

    /// Messages in the queue.
    pub async fn depth(&self) -> anyhow::Result<u64> {
        let ch = self.admin().await?;
        let q = ch
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .context("reading the queue depth")?;
        Ok(u64::from(q.message_count()))
    }

    pub async fn purge(&self) -> anyhow::Result<()> {
        let ch = self.admin().await?;
        ch.queue_purge(self.queue.as_str().into(), QueuePurgeOptions::default())
            .await
            .context("purging the queue")?;
        Ok(())
    }

    /// Waits until the queue holds `want` messages. Returns false at the deadline.
    pub async fn wait_depth(
        &self,
        want: u64,
        deadline: tokio::time::Instant,
    ) -> anyhow::Result<bool> {
        // A publisher that died (another suite closing every broker
        // connection) leaves the depth still: fail early, the run is retried.
        const STALL: std::time::Duration = std::time::Duration::from_secs(30);
        let mut last = (u64::MAX, tokio::time::Instant::now());
        for _ in 0..1_000_000 {
            let depth = self.depth().await?;
            if depth >= want {
                return Ok(true);
            }
            let now = tokio::time::Instant::now();
            if depth != last.0 {
                last = (depth, now);
            } else if now.duration_since(last.1) >= STALL {
                bail!("the queue stayed at {depth} of {want} messages for {STALL:?}");
            }
            if now >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(crate::POLL).await;
        }
        Ok(false)
    }

    pub async fn cleanup(&self) -> anyhow::Result<()> {
        let ch = self.admin().await?;
        ch.queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .context("deleting the queue")?;
        ch.exchange_delete(
            self.exchange.as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await
        .context("deleting the exchange")?;
        if let Some((conn, _)) = self.admin.lock().await.take() {
            let _ = conn.close(200, "bye".into()).await;
        }
        Ok(())
    }
}

/// One message to publish.
#[derive(Debug, Clone)]
pub struct Msg {
    pub id: String,
    pub aggregate_id: String,
    pub event_type: String,
    pub payload: Vec<u8>,
    pub created_secs: u64,
    pub sequence: i64,
}

/// The properties outbox-relay sets (without a trace header): persistent, with
/// message id, type, content type, timestamp and the x-outbox headers.
pub fn properties(m: &Msg) -> BasicProperties {
    let mut headers = FieldTable::default();
    headers.insert(
        "x-aggregate-id".into(),
        AMQPValue::LongString(LongString::from(m.aggregate_id.as_str())),
    );
    headers.insert("x-outbox-attempt".into(), AMQPValue::LongLongInt(1));
    headers.insert(
        "x-outbox-sequence".into(),
        AMQPValue::LongLongInt(m.sequence),
    );
    BasicProperties::default()
        .with_message_id(m.id.as_str().into())
        .with_type(m.event_type.as_str().into())
        .with_content_type("application/json".into())
        .with_delivery_mode(2)
        .with_timestamp(m.created_secs)
        .with_headers(headers)
}

/// Queues every message (mandatory, persistent) before waiting for any, as
/// outbox-relay does: lapin resolves a send once its I/O thread has written
/// it, so one-at-a-time sends would cost a thread hand-off per message.
/// `join_all` polls the sends in order, so they go out in order.
pub async fn send_all(
    ch: &Channel,
    exchange: &str,
    msgs: &[Msg],
) -> anyhow::Result<Vec<PublisherConfirm>> {
    let sends = msgs.iter().map(|m| {
        ch.basic_publish(
            exchange.into(),
            m.event_type.as_str().into(),
            BasicPublishOptions {
                mandatory: true,
                ..BasicPublishOptions::default()
            },
            &m.payload,
            properties(m),
        )
    });
    futures::future::join_all(sends)
        .await
        .into_iter()
        .map(|sent| sent.context("basic.publish"))
        .collect()
}

/// Publishes every message, then awaits every confirm. Fails unless the
/// broker acked all of them.
pub async fn publish_confirmed(
    ch: &Channel,
    exchange: &str,
    batch: &[Msg],
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + timeout;
    let pending = tokio::time::timeout_at(deadline, send_all(ch, exchange, batch))
        .await
        .context("sending to the broker timed out")??;
    for confirm in pending {
        match tokio::time::timeout_at(deadline, confirm).await {
            Err(_) => bail!("publisher confirm timed out"),
            Ok(Err(err)) => return Err(err).context("publisher confirm"),
            Ok(Ok(Confirmation::Ack(None))) => {}
            Ok(Ok(other)) => bail!("broker did not confirm: {other:?}"),
        }
    }
    Ok(())
}
