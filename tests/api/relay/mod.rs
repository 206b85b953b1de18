//! outbox-relay end to end: real outboxd, real RabbitMQ, the real relay binary.
//!
//! The tests that use the broker run one at a time (they share it), each with
//! its own database, exchange and queue; the one that takes the broker away
//! cuts only the relay's connection, through a proxy of its own, and checks
//! that another client's connection survives. They print what they measured
//! (duplicates), so `--nocapture` shows it.
#![allow(clippy::print_stdout)]

mod events;
mod process;

use serde_json::json;
use tokio::sync::Mutex;
use uuid::Uuid;

use crate::{
    shared::{
        net::free_port,
        rabbit::{self, Bystander, Rabbit},
    },
    support::{Proxy, TestApp, secs, wait_until},
};
use events::{assert_all_arrived, produce, published, tally, unpublished, wait_all_delivered};
use process::{Relay, listening_ports, relay_command};

/// Relay tests that use the broker take it in turns.
static BROKER: Mutex<()> = Mutex::const_new(());

const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_committed_event_arrives_and_no_rolled_back_one_does() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    let relay = Relay::start(&app, &rabbit, &[]);

    // 16 producers × 40 transactions × 20 events, every 5th transaction rolled back.
    let (committed, rolled_back) = produce(app.pool(), 16, 40, 20, 5).await;
    assert!(committed.len() >= 10_000, "{} committed", committed.len());
    wait_all_delivered(&app, &rabbit, committed.len(), secs(180)).await;
    assert!(relay.terminate().await.success(), "SIGTERM exits 0");

    let got = rabbit.drain().await;
    let counts = tally(&got);
    assert_all_arrived(&committed, &counts);
    let leaked: Vec<_> = rolled_back
        .iter()
        .filter(|id| counts.contains_key(&id.to_string()))
        .collect();
    assert!(leaked.is_empty(), "rolled-back events arrived: {leaked:?}");
    assert_eq!(
        unpublished(&app).await,
        0,
        "the outbox ends fully published"
    );

    // Properties and headers, as consumers rely on them.
    let sample = &got[got.len() / 2];
    let row: (String, chrono::DateTime<chrono::Utc>, i32) =
        sqlx::query_as("SELECT aggregate_id, created_at, attempts FROM outbox WHERE id = $1::uuid")
            .bind(&sample.message_id)
            .fetch_one(app.pool())
            .await
            .expect("the sample's row");
    assert_eq!(sample.kind, "order.created");
    assert_eq!(sample.content_type, "application/json");
    assert_eq!(sample.delivery_mode, 2, "persistent");
    assert_eq!(sample.timestamp, row.1.timestamp() as u64);
    assert_eq!(
        sample.routing_key, "order.created",
        "default routing key is the event type"
    );
    assert_eq!(sample.headers.get("x-aggregate-id"), Some(&row.0));
    assert_eq!(
        sample.headers.get("x-outbox-attempt"),
        Some(&row.2.to_string())
    );
    assert_eq!(
        sample.headers.get("traceparent").map(String::as_str),
        Some(TRACEPARENT)
    );
    let payload: serde_json::Value = serde_json::from_slice(&sample.payload).expect("JSON payload");
    assert_eq!(payload["aggregate"], json!(row.0));
    println!(
        "end to end: {} committed, {} rolled back, {} delivered ({} duplicates)",
        committed.len(),
        rolled_back.len(),
        got.len(),
        got.len() - counts.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_relay_killed_mid_run_loses_nothing_after_a_restart() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    let (committed, _) = produce(app.pool(), 4, 10, 150, 0).await;
    let args = ["--lease", "2s", "--batch-size", "100", "--concurrency", "4"];

    let relay = Relay::start(&app, &rabbit, &args);
    wait_until(secs(60), "the first relay publishes some", async || {
        published(&app).await >= 500
    })
    .await;
    relay.kill9().await;
    let published_at_kill = published(&app).await;

    let relay = Relay::start(&app, &rabbit, &args);
    wait_all_delivered(&app, &rabbit, committed.len(), secs(120)).await;
    assert!(relay.terminate().await.success());

    let got = rabbit.drain().await;
    let counts = tally(&got);
    assert_all_arrived(&committed, &counts);
    let duplicates = got.len() - counts.len();
    println!(
        "kill -9 after {published_at_kill} acks: {duplicates} duplicates of {} events",
        committed.len()
    );
    // Only what was in flight at the kill can be delivered twice. A slot acks
    // one batch while it publishes the next, so each of the 4 slots can hold
    // two batches of 100 published but not yet acked.
    let in_flight = 2 * 4 * 100;
    assert!(
        duplicates <= in_flight,
        "{duplicates} duplicates exceed the {in_flight} that can be in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_slot_publishes_the_backlog_in_sequence_order() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    // One producer, so insert order is commit order; the backlog is there
    // before the relay starts, so every batch is full.
    let (committed, _) = produce(app.pool(), 1, 12, 50, 0).await;
    let relay = Relay::start(
        &app,
        &rabbit,
        &["--batch-size", "100", "--concurrency", "1"],
    );
    wait_all_delivered(&app, &rabbit, committed.len(), secs(60)).await;
    assert!(relay.terminate().await.success());

    let got = rabbit.drain().await;
    assert_all_arrived(&committed, &tally(&got));
    let sequence: Vec<i64> = got
        .iter()
        .map(|m| {
            m.headers
                .get("x-outbox-sequence")
                .and_then(|s| s.parse().ok())
                .expect("an x-outbox-sequence header")
        })
        .collect();
    // Batches come out in seq order and a batch's sends are queued in order.
    assert!(
        sequence.windows(2).all(|w| w[0] < w[1]),
        "out of sequence order: {sequence:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_relays_share_the_work_without_loss() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    let first = Relay::start(&app, &rabbit, &["--worker-id", "relay-a"]);
    let second = Relay::start(&app, &rabbit, &["--worker-id", "relay-b"]);
    let (committed, _) = produce(app.pool(), 4, 25, 50, 0).await;
    wait_all_delivered(&app, &rabbit, committed.len(), secs(120)).await;
    assert!(first.terminate().await.success());
    assert!(second.terminate().await.success());

    let got = rabbit.drain().await;
    let counts = tally(&got);
    assert_all_arrived(&committed, &counts);
    // Each delivery beyond the first needs a lease that expired: attempts - 1.
    let attempts: Vec<(String, i32)> = sqlx::query_as("SELECT id::text, attempts FROM outbox")
        .fetch_all(app.pool())
        .await
        .expect("attempts");
    for (id, attempts) in attempts {
        let received = counts.get(&id).copied().unwrap_or(0);
        assert!(
            received <= attempts as usize,
            "{id} arrived {received}× after {attempts} claims"
        );
    }
    let workers: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT claimed_by FROM outbox ORDER BY 1")
            .fetch_all(app.pool())
            .await
            .expect("workers");
    for relay in ["relay-a", "relay-b"] {
        assert!(
            workers.iter().any(|w| w.starts_with(relay)),
            "{relay} published a share: {workers:?}"
        );
    }
    println!(
        "two relays: {} events, {} deliveries, claimed by {workers:?}",
        committed.len(),
        got.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_recovers_when_the_broker_drops_its_connections() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    // The relay reaches the broker through a proxy of this test's own: cutting
    // it drops the relay's connection and nobody else's.
    let proxy = Proxy::start(rabbit::broker_addr()).await;
    let bystander = Bystander::connect().await;
    let relay = Relay::start_via(
        &app,
        &rabbit,
        &rabbit::url_via(proxy.addr()),
        &[],
        &[("RUST_LOG", "info".into())],
    );
    let (mut committed, _) = produce(app.pool(), 2, 10, 100, 0).await;
    wait_until(secs(60), "the relay publishes", async || {
        published(&app).await > 0
    })
    .await;

    proxy.take_down();
    relay
        .line(secs(30), "the relay reports the broker gone", |l| {
            l.contains("WARN") && l.contains("RabbitMQ unavailable")
        })
        .await;
    // Work that can only be published over a new connection.
    let (more, _) = produce(app.pool(), 2, 10, 100, 0).await;
    committed.extend(more);
    proxy.bring_back();
    wait_all_delivered(&app, &rabbit, committed.len(), secs(120)).await;
    let (status, lines) = relay.terminate_with_output().await;
    assert!(status.success());
    let connected = lines
        .iter()
        .filter(|l| l.contains("connected to RabbitMQ"))
        .count();
    assert_eq!(connected, 2, "connected, lost, connected again: {lines:#?}");
    let counts = tally(&rabbit.drain().await);
    assert_all_arrived(&committed, &counts);
    bystander.assert_untouched(rabbit.queue()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unroutable_messages_are_nacked_with_the_reason_and_dead_lettered() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn_with(|args| {
        args.set("--max-attempts", "3")
            .set("--backoff-base", "100ms")
            .set("--backoff-max", "200ms");
    })
    .await;
    let nowhere = Rabbit::unbound().await;
    let ids = app.insert(5).await;
    let relay = Relay::start(&app, &nowhere, &[]);
    wait_until(
        secs(60),
        "every unroutable event dead-lettered",
        async || {
            app.count("public.outbox", "dead_lettered_at IS NOT NULL")
                .await
                == 5
        },
    )
    .await;
    let (status, lines) = relay.terminate_with_output().await;
    assert!(status.success());

    for id in ids {
        let (published, attempts, error): (
            Option<chrono::DateTime<chrono::Utc>>,
            i32,
            Option<String>,
        ) = sqlx::query_as("SELECT published_at, attempts, last_error FROM outbox WHERE id = $1")
            .bind(id)
            .fetch_one(app.pool())
            .await
            .expect("row");
        assert!(published.is_none(), "an unroutable message is never acked");
        assert_eq!(attempts, 3, "delivered up to max attempts");
        let error = error.unwrap_or_default();
        assert!(
            error.contains("NO_ROUTE"),
            "the broker's reason is kept: {error}"
        );
        // One line each time the broker returned it, with what to look up.
        let about: Vec<&String> = lines
            .iter()
            .filter(|l| l.contains(&id.to_string()))
            .collect();
        assert_eq!(about.len(), 3, "one line per returned message: {about:#?}");
        for line in about {
            for part in [
                "WARN",
                "unroutable",
                "nacked for a retry",
                &format!("exchange={}", nowhere.exchange),
                "routing_key=test.event",
                "reply=312 NO_ROUTE",
            ] {
                assert!(line.contains(part), "{part:?} missing from {line}");
            }
        }
    }
    let dumps: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("Server returned us a message"))
        .collect();
    assert!(
        dumps.is_empty(),
        "lapin's dump of each returned message is quiet: {dumps:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_routing_key_nobody_binds_is_unroutable_too() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn_with(|args| {
        args.set("--max-attempts", "1");
    })
    .await;
    let rabbit = Rabbit::bound("invoices.#").await;
    app.insert(3).await;
    let relay = Relay::start(&app, &rabbit, &["--routing-key", "orders.{aggregate_id}"]);
    wait_until(
        secs(60),
        "dead-lettered after the single attempt",
        async || {
            app.count("public.outbox", "dead_lettered_at IS NOT NULL")
                .await
                == 3
        },
    )
    .await;
    assert!(relay.terminate().await.success());
    assert_eq!(
        app.count("public.outbox", "published_at IS NOT NULL").await,
        0
    );
    assert_eq!(rabbit.depth().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_published_message_carries_the_producers_trace() {
    let _turn = BROKER.lock().await;
    let collector = crate::support::otlp::collector();
    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    let trace_id = Uuid::new_v4().simple().to_string();
    let producer_span = Uuid::new_v4().simple().to_string()[..16].to_owned();
    let id = Uuid::new_v4();
    app.insert_event(
        id,
        "order-9",
        "order.created",
        json!({}),
        json!({ "traceparent": format!("00-{trace_id}-{producer_span}-01") }),
    )
    .await;
    let relay = Relay::start_with_env(
        &app,
        &rabbit,
        &[],
        &[
            (
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                format!("http://{}", collector.addr),
            ),
            ("OTEL_SERVICE_NAME", "outbox-relay".into()),
        ],
    );
    wait_all_delivered(&app, &rabbit, 1, secs(60)).await;
    assert!(relay.terminate().await.success());

    let got = rabbit.drain().await;
    let stored = format!("00-{trace_id}-{producer_span}-01");
    assert_eq!(
        got[0].headers.get("traceparent"),
        Some(&stored),
        "the producer's traceparent reaches consumers unchanged: they continue its trace"
    );

    let publish = collector
        .wait_for(&trace_id, "publish span", |s| {
            s.kind == 4 && s.service == "outbox-relay"
        })
        .await;
    assert_eq!(publish.parent_span_id, producer_span);
    assert_eq!(publish.name, format!("publish {}", rabbit.exchange));
    assert_eq!(publish.attributes["messaging.system"], "rabbitmq");
    assert_eq!(
        publish.attributes["messaging.destination.name"],
        rabbit.exchange
    );
    assert_eq!(
        publish.attributes["messaging.rabbitmq.destination.routing_key"],
        "order.created"
    );
    assert_eq!(publish.attributes["messaging.message.id"], id.to_string());
    collector
        .wait_for(&trace_id, "lease span", |s| s.name == "outbox lease")
        .await;

    // The relay's Ack is a client span whose context reached outboxd.
    collector
        .wait_until("an outboxd span continues the relay's Ack", |spans| {
            spans.iter().any(|client| {
                client.service == "outbox-relay"
                    && client.kind == 3
                    && client.name == "outbox.v1.OutboxService/Ack"
                    && spans
                        .iter()
                        .any(|server| server.kind == 2 && server.parent_span_id == client.span_id)
            })
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_metrics_off_the_relay_relays_and_listens_on_no_port() {
    let _turn = BROKER.lock().await;
    // The check below sees a listener where there is one.
    let own = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener of the test's own");
    let own_port = own.local_addr().expect("its address").port();
    assert!(listening_ports(std::process::id()).contains(&own_port));

    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    let relay = Relay::start(&app, &rabbit, &["--metrics-listen", "off"]);
    app.insert(3).await;
    wait_all_delivered(&app, &rabbit, 3, secs(60)).await;
    assert_eq!(listening_ports(relay.pid()), Vec::<u16>::new());
    let (status, lines) = relay.terminate_with_output().await;
    assert!(status.success(), "{lines:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_metrics_port_exits_64_naming_the_flag_before_connecting_anywhere() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("take a port");
    let taken = taken.local_addr().expect("its address");
    // Stand-ins for outboxd and RabbitMQ that record any connection attempt.
    let server = std::net::TcpListener::bind("127.0.0.1:0").expect("a stand-in outboxd");
    let broker = std::net::TcpListener::bind("127.0.0.1:0").expect("a stand-in broker");
    let server_url = format!("http://{}", server.local_addr().expect("address"));
    let broker_url = rabbit::url_via(broker.local_addr().expect("address"));

    let by_flag = {
        let mut cmd = relay_command();
        cmd.args(["--server", &server_url, "--amqp-url", &broker_url])
            .args(["--metrics-listen", &taken.to_string()]);
        Relay::spawn(cmd)
    };
    let (status, lines) = by_flag.exit_within(secs(10)).await;
    assert_eq!(status.code(), Some(64), "{lines:#?}");
    assert_eq!(lines.len(), 1, "one line: {lines:#?}");
    assert!(
        lines[0].contains(&format!("--metrics-listen {taken}"))
            && lines[0].contains("already in use"),
        "{}",
        lines[0]
    );

    let by_env = {
        let mut cmd = relay_command();
        cmd.args(["--server", &server_url, "--amqp-url", &broker_url])
            .env("OUTBOX_RELAY_METRICS_LISTEN", taken.to_string());
        Relay::spawn(cmd)
    };
    let (status, lines) = by_env.exit_within(secs(10)).await;
    assert_eq!(status.code(), Some(64), "{lines:#?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("OUTBOX_RELAY_METRICS_LISTEN (--metrics-listen)")),
        "the variable is named: {lines:#?}"
    );

    for (what, listener) in [("outboxd", &server), ("RabbitMQ", &broker)] {
        listener.set_nonblocking(true).expect("non-blocking accept");
        assert!(
            matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "the relay connected to {what} before it found its port taken"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bind_queue_makes_an_inserted_event_arrive_in_that_queue() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn().await;
    // As in the quick start: the relay declares the exchange and the queue.
    let fresh = Rabbit::undeclared();
    // With --no-declare: the exchange exists already, the queue does not.
    let mut existing = Rabbit::unbound().await;
    existing.queue = Some(existing.exchange.replace("_ex_", "_q_"));
    for (rabbit, declare) in [(&fresh, true), (&existing, false)] {
        assert_eq!(
            rabbit.try_depth().await,
            None,
            "the queue is the relay's to declare"
        );
        let queue = rabbit.queue();
        let mut extra = vec!["--bind-queue", queue];
        if declare {
            extra.extend(["--exchange", rabbit.exchange.as_str()]);
        }
        let relay = Relay::start(&app, rabbit, &extra);
        let id = Uuid::new_v4();
        app.insert_event(
            id,
            "order-1",
            "order.created",
            json!({ "total": 42 }),
            json!({}),
        )
        .await;
        wait_until(secs(60), "the event is in the bound queue", async || {
            rabbit.try_depth().await == Some(1)
        })
        .await;
        let (status, lines) = relay.terminate_with_output().await;
        assert!(status.success(), "{lines:#?}");
        let got = rabbit.drain().await;
        assert_eq!(got.len(), 1, "declare {declare}");
        assert_eq!(got[0].message_id, id.to_string());
        assert_eq!(got[0].routing_key, "order.created");
        let payload: serde_json::Value =
            serde_json::from_slice(&got[0].payload).expect("JSON payload");
        assert_eq!(payload, json!({ "total": 42 }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_logs_its_first_failed_broker_connection_at_once() {
    let password = "s3cret-never-logged";
    let mut cmd = relay_command();
    cmd.args(["--server", &format!("http://127.0.0.1:{}", free_port())])
        .args([
            "--amqp-url",
            &format!("amqp://guest:{password}@127.0.0.1:{}/%2f", free_port()),
        ])
        .args(["--metrics-listen", "off"])
        .env("RUST_LOG", "info");
    let relay = Relay::spawn(cmd);
    let connecting = relay
        .line(secs(5), "the first attempt is logged", |l| {
            l.contains("connecting to RabbitMQ")
        })
        .await;
    assert!(connecting.contains("INFO"), "{connecting}");
    assert!(
        connecting.contains("amqp://guest:redacted@127.0.0.1:"),
        "{connecting}"
    );
    let failed = relay
        .line(secs(5), "the first failure is logged", |l| {
            l.contains("RabbitMQ unavailable")
        })
        .await;
    assert!(failed.contains("WARN"), "{failed}");
    assert!(
        failed.contains("Connection refused"),
        "the reason: {failed}"
    );
    let (status, lines) = relay.terminate_with_output().await;
    assert!(status.success(), "{lines:#?}");
    let leaks: Vec<&String> = lines.iter().filter(|l| l.contains(password)).collect();
    assert!(leaks.is_empty(), "the password is never logged: {leaks:#?}");
    let warnings = lines
        .iter()
        .filter(|l| l.contains("RabbitMQ") && l.contains("WARN"))
        .count();
    assert_eq!(
        warnings, 1,
        "retries for the same reason are not news: {lines:#?}"
    );
}

/// An event over the claim's byte budget but under the message limit goes out
/// alone; the relay must accept a response that large (gRPC's default is 4 MiB).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_relay_publishes_an_event_larger_than_grpcs_default_limit() {
    let _turn = BROKER.lock().await;
    let app = TestApp::spawn().await;
    let rabbit = Rabbit::bound("#").await;
    let big = Uuid::new_v4();
    app.insert_event(
        big,
        "agg",
        "test.big",
        json!({ "pad": "x".repeat(5 * 1024 * 1024) }),
        json!({}),
    )
    .await;
    let mut committed = vec![big];
    committed.extend(app.insert(3).await);
    let relay = Relay::start(&app, &rabbit, &[]);
    wait_all_delivered(&app, &rabbit, committed.len(), secs(60)).await;
    let (status, lines) = relay.terminate_with_output().await;
    assert!(status.success(), "{lines:#?}");
    assert_all_arrived(&committed, &tally(&rabbit.drain().await));
    assert_eq!(app.stats().await.dead_lettered, 0);
}

/// The trust boundary end to end (#34): outboxd over mutual TLS with
/// authorisation, the real relay with its CA, client certificate and token.
/// Its events arrive; then the token is rotated the usual way (the server's
/// file holds both, the relay's file gets the new one, the old line goes)
/// and the next events arrive too; a relay whose token matches no line
/// publishes nothing and says why.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_publishes_over_mutual_tls_with_a_token_and_follows_its_rotation() {
    use crate::support::pki::{Ca, TempDir};
    use outboxd::auth::token_digest;
    let _turn = BROKER.lock().await;
    let dir = TempDir::new();
    let server_ca = Ca::new("outboxd test CA");
    let client_ca = Ca::new("relays CA");
    let (cert, key) = server_ca.server(1).write_to(&dir, "tls");
    let client_ca_file = dir.write("clients.crt", client_ca.cert_pem());
    let ca_file = dir.write("ca.crt", server_ca.cert_pem());
    let (relay_cert, relay_key) = client_ca.client("relay").write_to(&dir, "relay");
    let line = |name: &str, token: &str| {
        format!(
            "{name} sha256:{} relay:default\n",
            hex::encode(token_digest(token))
        )
    };
    let (old, new) = (Uuid::new_v4().to_string(), Uuid::new_v4().to_string());
    let tokens = dir.write("tokens", line("relay", &old));
    let app = TestApp::spawn_with(|args| {
        args.set("--tls-cert", cert)
            .set("--tls-key", key)
            .set("--tls-client-ca", &client_ca_file)
            .set("--auth-tokens", &tokens)
            .client_tls(
                server_ca
                    .client_tls()
                    .identity(client_ca.client("test").identity()),
            );
    })
    .await;
    let rabbit = Rabbit::bound("#").await;
    let token_file = dir.write("token", format!("{old}\n"));
    let server = format!("https://localhost:{}", app.addr.port());
    let secure = [
        "--server",
        server.as_str(),
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &relay_cert,
        "--tls-key",
        &relay_key,
    ];
    let mut args = secure.to_vec();
    args.extend(["--token-file", &token_file]);
    let relay = Relay::start(&app, &rabbit, &args);

    let (first, _) = produce(app.pool(), 2, 10, 10, 0).await;
    wait_all_delivered(&app, &rabbit, first.len(), secs(120)).await;

    // Rotation: both lines, the relay's new token, the old line gone.
    dir.write(
        "tokens",
        format!("{}{}", line("relay", &old), line("relay-next", &new)),
    );
    dir.write("token", format!("{new}\n"));
    dir.write("tokens", line("relay-next", &new));
    let (second, _) = produce(app.pool(), 2, 10, 10, 0).await;
    wait_all_delivered(&app, &rabbit, first.len() + second.len(), secs(120)).await;
    assert!(relay.terminate().await.success(), "SIGTERM exits 0");
    let counts = tally(&rabbit.drain().await);
    assert_all_arrived(&first, &counts);
    assert_all_arrived(&second, &counts);

    // The old token, now unknown: nothing is claimed, and the relay says why.
    let stale = dir.write("stale-token", format!("{old}\n"));
    let mut args = secure.to_vec();
    args.extend(["--token-file", &stale]);
    let refused = Relay::start(&app, &rabbit, &args);
    let (third, _) = produce(app.pool(), 1, 1, 5, 0).await;
    let said = refused
        .line(secs(30), "the relay's refusal", |l| {
            l.contains("claim refused")
        })
        .await;
    assert!(said.contains("Unauthenticated"), "{said}");
    assert!(!said.contains(&old), "the token is never logged: {said}");
    assert_eq!(
        unpublished(&app).await,
        third.len() as i64,
        "nothing published"
    );
    let (status, _) = refused.terminate_with_output().await;
    assert!(status.success(), "a refused relay still stops cleanly");
    assert!(
        rabbit.drain().await.is_empty(),
        "nothing reached the broker"
    );
}

/// `https://` without `--tls-ca` (#46): the relay checks outboxd's
/// certificate against the system's roots. The test cannot add a CA to the
/// system store, so it names the bundle in SSL_CERT_FILE (SSL_CERT_DIR an
/// empty directory), which rustls-native-certs reads in the store's place.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_trusts_the_system_roots_for_https_without_a_ca_file() {
    use crate::support::pki::{Ca, TempDir};
    let _turn = BROKER.lock().await;
    let dir = TempDir::new();
    let server_ca = Ca::new("outboxd test CA");
    let (cert, key) = server_ca.server(1).write_to(&dir, "tls");
    let ca_file = dir.write("ca.crt", server_ca.cert_pem());
    let empty = dir.path("no-certs");
    std::fs::create_dir_all(&empty).expect("an empty directory");
    let app = TestApp::spawn_with(|args| {
        args.set("--tls-cert", cert)
            .set("--tls-key", key)
            .client_tls(server_ca.client_tls());
    })
    .await;
    let rabbit = Rabbit::bound("#").await;
    let server = format!("https://localhost:{}", app.addr.port());
    let relay = Relay::start_with_env(
        &app,
        &rabbit,
        &["--server", &server],
        &[
            ("SSL_CERT_FILE", ca_file.clone()),
            ("SSL_CERT_DIR", empty.display().to_string()),
        ],
    );
    let (committed, _) = produce(app.pool(), 1, 2, 5, 0).await;
    wait_all_delivered(&app, &rabbit, committed.len(), secs(60)).await;
    let (status, lines) = relay.terminate_with_output().await;
    assert!(status.success(), "{lines:#?}");
    assert_all_arrived(&committed, &tally(&rabbit.drain().await));
}
