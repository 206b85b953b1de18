//! The publisher conformance suite: what every [`Broker`] and its
//! [`Publisher`] must do for the worker loop to be right, written once against
//! the traits. A broker runs it by implementing [`Harness`] and invoking
//! [`conformance_suite!`] (see `rabbitmq/tests.rs`).
//!
//! The harness works on a live broker that may be shared: each case creates
//! destinations of its own, uniquely named, and deletes only those.

use std::{
    collections::BTreeMap,
    future::Future,
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use tokio::{
    net::{TcpListener, TcpStream},
    task::{AbortHandle, JoinHandle},
};

use outboxd::pb::OutboxMessage;

use super::{Broker, Delivery, Publisher};

/// A message as a consumer of the routed destination saw it.
#[derive(Debug)]
pub(crate) struct Received {
    pub id: String,
    pub headers: BTreeMap<String, String>,
    pub payload: Vec<u8>,
}

/// Where a harness's broker publishes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// A destination that routes every message to where `receive` reads.
    Routed,
    /// A destination that routes nothing anywhere.
    Unroutable,
}

/// One broker under test: its destinations, and a way to read what arrived.
pub(crate) trait Harness: Sized + Send {
    type Broker: Broker;

    /// Names the test's own destinations after `case`, uniquely.
    fn new(case: &str) -> impl Future<Output = Self> + Send;

    /// Where the real broker listens, for a [`Proxy`] to forward to.
    fn upstream(&self) -> SocketAddr;

    /// A broker that reaches the real one at `addr` and publishes to `route`.
    fn broker(&self, route: Route, addr: SocketAddr) -> Self::Broker;

    /// The next message that reached the routed destination, if one arrives
    /// within a few seconds.
    fn receive(&mut self) -> impl Future<Output = Option<Received>> + Send;

    /// Deletes what this harness created, and nothing else.
    fn clean_up(self) -> impl Future<Output = ()> + Send;
}

/// Runs each case of the suite as a test of its own against `$harness`,
/// cleaning up after it whether it passed or not.
macro_rules! conformance_suite {
    ($harness:ty) => {
        $crate::publishers::conformance::conformance_suite!(
            $harness:
            a_routable_message_is_confirmed_with_its_id_and_headers_intact,
            an_unroutable_message_comes_back_rejected_not_confirmed,
            a_publish_on_a_lost_connection_fails_and_the_next_reconnects,
        );
    };
    ($harness:ty: $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                use futures::FutureExt as _;
                use $crate::publishers::conformance::Harness as _;
                let mut harness = <$harness>::new(stringify!($case)).await;
                let outcome = std::panic::AssertUnwindSafe(
                    $crate::publishers::conformance::$case(&mut harness),
                )
                .catch_unwind()
                .await;
                harness.clean_up().await;
                if let Err(panic) = outcome {
                    std::panic::resume_unwind(panic);
                }
            }
        )+
    };
}
pub(crate) use conformance_suite;

fn message(id: &str) -> OutboxMessage {
    OutboxMessage {
        id: id.into(),
        aggregate_id: "order-1".into(),
        event_type: "conformance.checked".into(),
        payload: br#"{"order_id":1}"#.to_vec(),
        headers: [
            ("tenant", "t-1"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        ..OutboxMessage::default()
    }
}

async fn ready_publisher<B: Broker>(broker: &B) -> B::Publisher {
    let mut publisher = broker.publisher();
    if let Err(reason) = publisher.ready().await {
        panic!("the broker is not ready: {reason}");
    }
    publisher
}

/// Confirmed means safe to ack: the message must have arrived as stored, its
/// id (the consumers' dedup key) and the producer's headers unchanged.
pub(crate) async fn a_routable_message_is_confirmed_with_its_id_and_headers_intact<H: Harness>(
    harness: &mut H,
) {
    let broker = harness.broker(Route::Routed, harness.upstream());
    let mut publisher = ready_publisher(&broker).await;
    let sent = message("0190d0d2-0000-7000-8000-00000000c0f1");
    let deliveries = publisher.publish(std::slice::from_ref(&sent)).await;
    assert_eq!(deliveries, [Delivery::Confirmed]);
    let got = harness
        .receive()
        .await
        .expect("the confirmed message arrived");
    assert_eq!(got.id, sent.id);
    assert_eq!(got.payload, sent.payload);
    for (key, value) in &sent.headers {
        assert_eq!(got.headers.get(key), Some(value), "header {key}");
    }
}

/// A message no consumer will see must not be acked: it comes back refused
/// (for the outbox's retry and dead-lettering), never confirmed.
pub(crate) async fn an_unroutable_message_comes_back_rejected_not_confirmed<H: Harness>(
    harness: &mut H,
) {
    let broker = harness.broker(Route::Unroutable, harness.upstream());
    let mut publisher = ready_publisher(&broker).await;
    let deliveries = publisher
        .publish(&[message("0190d0d2-0000-7000-8000-00000000c0f2")])
        .await;
    assert!(
        matches!(&deliveries[..], [Delivery::Rejected(_)]),
        "{deliveries:?}"
    );
}

/// A lost connection fails what was in flight (released for a prompt retry,
/// not acked), and the publisher recovers by itself at the next publish.
pub(crate) async fn a_publish_on_a_lost_connection_fails_and_the_next_reconnects<H: Harness>(
    harness: &mut H,
) {
    let proxy = Proxy::start(harness.upstream()).await;
    let broker = harness.broker(Route::Routed, proxy.addr);
    let mut publisher = ready_publisher(&broker).await;
    let first = message("0190d0d2-0000-7000-8000-00000000c0f3");
    assert_eq!(
        publisher.publish(&[first]).await,
        [Delivery::Confirmed],
        "through the proxy"
    );
    proxy.cut();
    let lost = publisher
        .publish(&[message("0190d0d2-0000-7000-8000-00000000c0f4")])
        .await;
    assert!(matches!(&lost[..], [Delivery::Failed(_)]), "{lost:?}");
    proxy.restore();
    let again = publisher
        .publish(&[message("0190d0d2-0000-7000-8000-00000000c0f5")])
        .await;
    assert_eq!(again, [Delivery::Confirmed], "reconnected");
}

/// A TCP forwarder in front of the broker whose connections a test can cut:
/// a lost connection as the publisher meets it, without touching the broker.
pub(crate) struct Proxy {
    pub addr: SocketAddr,
    open: Arc<AtomicBool>,
    pipes: Arc<Mutex<Vec<AbortHandle>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let open = Arc::new(AtomicBool::new(true));
        let pipes = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn({
            let (open, pipes) = (Arc::clone(&open), Arc::clone(&pipes));
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if !open.load(Ordering::SeqCst) {
                        // Refused: the connection closes before the handshake.
                        continue;
                    }
                    let pipe = tokio::spawn(async move {
                        if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                            let _ =
                                tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                        }
                    });
                    lock(&pipes).push(pipe.abort_handle());
                }
            }
        });
        Self {
            addr,
            open,
            pipes,
            accept,
        }
    }

    /// Drops every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        for pipe in lock(&self.pipes).drain(..) {
            pipe.abort();
        }
    }

    /// Accepts connections again.
    pub fn restore(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
