//! RabbitMQ for relay tests: a per-test exchange (and queue), read back with
//! fresh connections of the test's own, and deleted when the test ends,
//! failed or not. Tests that take the broker away from the relay do it with a
//! proxy of their own (`shared::proxy::Proxy`), never to the broker's other clients.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use futures::StreamExt;
use lapin::{
    Channel, Connection, ConnectionProperties, ExchangeKind, Queue,
    options::{
        BasicConsumeOptions, ExchangeDeclareOptions, ExchangeDeleteOptions, QueueBindOptions,
        QueueDeclareOptions, QueueDeleteOptions,
    },
    types::{AMQPValue, FieldTable},
};
use uuid::Uuid;

pub const AMQP_URL: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The broker's address, where a test's proxy forwards to.
pub fn broker_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 5672))
}

/// [`AMQP_URL`] with its host and port replaced by `addr` (a proxy's).
pub fn url_via(addr: SocketAddr) -> String {
    format!("amqp://guest:guest@{addr}/%2f")
}

/// One message as a consumer sees it.
#[derive(Debug, Clone)]
pub struct Received {
    pub message_id: String,
    pub kind: String,
    pub content_type: String,
    pub delivery_mode: u8,
    pub timestamp: u64,
    pub headers: BTreeMap<String, String>,
    pub routing_key: String,
    pub payload: Vec<u8>,
}

#[derive(Debug)]
pub struct Rabbit {
    pub exchange: String,
    /// `None`: the exchange has no queue, so every mandatory publish is returned.
    pub queue: Option<String>,
}

async fn connect() -> Connection {
    Connection::connect(AMQP_URL, ConnectionProperties::default())
        .await
        .expect("RabbitMQ at 127.0.0.1:5672 (scripts/test starts it)")
}

/// Declares `queue` passively: an error if it does not exist, its counts if it does.
async fn passive_declare(ch: &Channel, queue: &str) -> lapin::Result<Queue> {
    let options = QueueDeclareOptions {
        passive: true,
        ..QueueDeclareOptions::default()
    };
    ch.queue_declare(queue.into(), options, FieldTable::default())
        .await
}

/// A client of the broker that is not the relay: connected before a test
/// takes the broker away from the relay, it must still be connected after.
pub struct Bystander(Connection);

impl Bystander {
    pub async fn connect() -> Self {
        let properties = ConnectionProperties::default()
            .with_connection_name("outboxd relay test bystander".into());
        Self(
            Connection::connect(AMQP_URL, properties)
                .await
                .expect("RabbitMQ at 127.0.0.1:5672 (scripts/test starts it)"),
        )
    }

    /// Fails the test unless this connection is still open and usable: a
    /// passive declare of `queue` answers on it.
    pub async fn assert_untouched(&self, queue: &str) {
        assert!(
            self.0.status().connected(),
            "the bystander's connection was closed: {:?}",
            self.0.status()
        );
        let ch = self
            .0
            .create_channel()
            .await
            .expect("a new channel on the bystander's connection");
        passive_declare(&ch, queue)
            .await
            .expect("a passive declare on the bystander's connection");
        let _ = ch.close(200, "bye".into()).await;
    }
}

impl Rabbit {
    /// Names for an exchange and a queue that nobody declared yet (the relay
    /// will), deleted like any other when the test ends.
    pub fn undeclared() -> Self {
        let id = Uuid::new_v4().simple();
        Self {
            exchange: format!("outbox_test_ex_{id}"),
            queue: Some(format!("outbox_test_q_{id}")),
        }
    }

    /// An exchange with a queue bound to `binding` (`#` takes everything).
    pub async fn bound(binding: &str) -> Self {
        let mut rabbit = Self::unbound().await;
        let queue = rabbit.exchange.replace("_ex_", "_q_");
        let conn = connect().await;
        let ch = conn.create_channel().await.expect("channel");
        ch.queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions::durable(),
            FieldTable::default(),
        )
        .await
        .expect("declare queue");
        ch.queue_bind(
            queue.as_str().into(),
            rabbit.exchange.as_str().into(),
            binding.into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await
        .expect("bind queue");
        let _ = conn.close(200, "bye".into()).await;
        rabbit.queue = Some(queue);
        rabbit
    }

    /// An exchange nobody listens to.
    pub async fn unbound() -> Self {
        let exchange = format!("outbox_test_ex_{}", Uuid::new_v4().simple());
        let conn = connect().await;
        let ch = conn.create_channel().await.expect("channel");
        ch.exchange_declare(
            exchange.as_str().into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .expect("declare exchange");
        let _ = conn.close(200, "bye".into()).await;
        Self {
            exchange,
            queue: None,
        }
    }

    pub fn queue(&self) -> &str {
        self.queue.as_deref().expect("this exchange has a queue")
    }

    /// Messages waiting in the queue.
    pub async fn depth(&self) -> u32 {
        self.try_depth()
            .await
            .expect("passive declare of the queue")
    }

    /// Messages waiting in the queue; `None` while the queue does not exist.
    pub async fn try_depth(&self) -> Option<u32> {
        let conn = connect().await;
        let ch = conn.create_channel().await.expect("channel");
        let q = passive_declare(&ch, self.queue()).await;
        let _ = conn.close(200, "bye".into()).await;
        q.ok().map(|q| q.message_count())
    }

    /// Consumes everything in the queue; ends once it has been quiet for a moment.
    pub async fn drain(&self) -> Vec<Received> {
        let conn = connect().await;
        let ch = conn.create_channel().await.expect("channel");
        let mut consumer = ch
            .basic_consume(
                self.queue().into(),
                "outbox-test".into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..BasicConsumeOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("consume");
        let mut got = Vec::new();
        while let Ok(Some(delivery)) =
            tokio::time::timeout(Duration::from_millis(1500), consumer.next()).await
        {
            let delivery = delivery.expect("delivery");
            let p = &delivery.properties;
            let headers = p
                .headers()
                .as_ref()
                .map(|t| {
                    t.inner()
                        .iter()
                        .map(|(k, v)| (k.to_string(), text(v)))
                        .collect()
                })
                .unwrap_or_default();
            got.push(Received {
                message_id: p
                    .message_id()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                kind: p.kind().as_ref().map(|s| s.to_string()).unwrap_or_default(),
                content_type: p
                    .content_type()
                    .as_ref()
                    .map(|s| s.to_string())
                    .unwrap_or_default(),
                delivery_mode: p.delivery_mode().unwrap_or(0),
                timestamp: p.timestamp().unwrap_or(0),
                headers,
                routing_key: delivery.routing_key.to_string(),
                payload: delivery.data.clone(),
            });
        }
        let _ = conn.close(200, "bye".into()).await;
        got
    }
}

fn text(value: &AMQPValue) -> String {
    match value {
        AMQPValue::LongString(s) => s.to_string(),
        AMQPValue::ShortString(s) => s.to_string(),
        AMQPValue::LongLongInt(n) => n.to_string(),
        AMQPValue::LongInt(n) => n.to_string(),
        other => format!("{other:?}"),
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        let exchange = self.exchange.clone();
        let queue = self.queue.clone();
        // Drop cannot await; a thread with its own runtime can, also while unwinding.
        let cleanup = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async move {
                let Ok(conn) = Connection::connect(AMQP_URL, ConnectionProperties::default()).await
                else {
                    return;
                };
                if let Ok(ch) = conn.create_channel().await {
                    if let Some(queue) = queue {
                        let _ = ch
                            .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                            .await;
                    }
                    let _ = ch
                        .exchange_delete(exchange.as_str().into(), ExchangeDeleteOptions::default())
                        .await;
                }
                let _ = conn.close(200, "bye".into()).await;
            });
        });
        let _ = cleanup.join();
    }
}
