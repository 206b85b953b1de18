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
        let url = format!("amqp://guest:guest@{addr}/%2f");
        self.broker_at(route, url, OwnedTLSConfig::default())
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

impl RabbitMqHarness {
    /// A broker at `url` (with `tls` for amqps://) publishing to `route`.
    fn broker_at(&self, route: Route, url: String, tls: OwnedTLSConfig) -> RabbitMq {
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
            url,
            tls,
            exchange,
            declare: true,
            routing_key: RoutingKey::parse("{event_type}").expect("template"),
            confirm_timeout: Duration::from_secs(5),
            bind_queue,
        };
        RabbitMq::new(&config, "conformance", RelayMetrics::new(&self.metrics))
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

/// A throwaway amqps:// endpoint: TLS terminated here, with a certificate for
/// `localhost` that only the returned CA (PEM) vouches for, and the plain
/// bytes forwarded to the shared broker, which stays untouched.
struct TlsProxy {
    url: String,
    ca_pem: String,
    accept: tokio::task::JoinHandle<()>,
}

impl TlsProxy {
    async fn start(upstream: SocketAddr) -> Self {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("rcgen");
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));
        let config = rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(vec![made.cert.der().clone()], key)
        .expect("server certificate");
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let accept = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let (Ok(mut tls), Ok(mut plain)) = (
                        acceptor.accept(inbound).await,
                        tokio::net::TcpStream::connect(upstream).await,
                    ) else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Self {
            url: format!("amqps://guest:guest@localhost:{port}/%2f"),
            ca_pem: made.cert.pem(),
            accept,
        }
    }
}

impl Drop for TlsProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// `--amqp-tls-ca` reaches the handshake: over amqps:// with the CA, a
/// publish is confirmed and arrives; without it, the broker's certificate is
/// not trusted and nothing is published.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_amqps_broker_signed_by_the_given_ca_confirms_and_an_unknown_one_is_refused() {
    use futures::FutureExt as _;

    use crate::publishers::{Broker as _, Delivery, Publisher as _, conformance::Harness as _};

    let mut harness = RabbitMqHarness::new("amqps").await;
    let outcome = std::panic::AssertUnwindSafe(async {
        let proxy = TlsProxy::start(harness.upstream()).await;
        let untrusted =
            harness.broker_at(Route::Routed, proxy.url.clone(), OwnedTLSConfig::default());
        let err = untrusted
            .publisher()
            .ready()
            .await
            .expect_err("unknown issuer");
        assert!(err.to_lowercase().contains("certificate"), "{err}");
        let tls = OwnedTLSConfig {
            identity: None,
            cert_chain: Some(proxy.ca_pem.clone()),
        };
        let broker = harness.broker_at(Route::Routed, proxy.url.clone(), tls);
        let mut publisher = broker.publisher();
        publisher.ready().await.expect("connected over amqps://");
        let sent = outboxd::pb::OutboxMessage {
            id: "0190d0d2-0000-7000-8000-0000000075c1".into(),
            event_type: "conformance.tls".into(),
            payload: b"{}".to_vec(),
            ..Default::default()
        };
        let deliveries = publisher.publish(std::slice::from_ref(&sent)).await;
        assert_eq!(deliveries, [Delivery::Confirmed]);
        let got = harness.receive().await.expect("the message arrived");
        assert_eq!(got.id, sent.id);
    })
    .catch_unwind()
    .await;
    harness.clean_up().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
