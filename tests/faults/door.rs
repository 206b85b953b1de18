//! Overload at the door: clients that hold connections open, send absurd
//! headers, or name a thousand bad ids must not take outboxd's file
//! descriptors, memory or its clients' metadata limits with them.

use std::net::SocketAddr;

use outboxd::grpc::pb::{
    AckRequest, ClaimBatchRequest, DiscardRequest, GetStatsRequest, NackRequest, RedriveRequest,
    outbox_admin_client::OutboxAdminClient, outbox_service_client::OutboxServiceClient,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
    task::JoinSet,
    time::{Instant, timeout},
};
use tonic::Code;
use tonic_types::StatusExt as _;

use crate::{
    harness::{Case, Outboxd},
    shared::{
        net::free_port,
        wait::{millis, secs},
    },
};

/// Idle connections to the status page used to take every file descriptor
/// under `ulimit -n 1024` (1 100 of them), and then each claim that needed a
/// new database connection failed UNAVAILABLE. Each listener now holds at
/// most its share of the file limit, refuses (and counts) the rest, and
/// closes a connection that sends no request header within 10 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_to_the_status_page_leave_the_database_its_connections() {
    const FILES: u32 = 1024;
    const IDLE: usize = 1100;
    let case = Case::begin().await;
    let status = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let server = Outboxd::start_limited(
        &case.db.url(),
        free_port(),
        FILES,
        &[
            "--admin-http-listen",
            &status.to_string(),
            "--metrics-listen",
            &metrics.to_string(),
        ],
    )
    .await;
    let mut client = OutboxServiceClient::connect(server.url())
        .await
        .expect("a client before the flood");

    let began = Instant::now();
    let mut idle = Vec::with_capacity(IDLE);
    for _ in 0..IDLE {
        // The listen backlog takes whatever outboxd has not accepted yet.
        idle.push(
            TcpStream::connect(status)
                .await
                .expect("connect to the status page"),
        );
    }
    // Long enough for outboxd to accept (or refuse) every one of them.
    tokio::time::sleep(millis(500)).await;

    // Ten calls at once, each held on a table lock: the pool has to open
    // connections for most of them while the flood is on.
    let mut lock = case.db.pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *lock)
        .await
        .expect("lock the outbox table");
    let mut calls = JoinSet::new();
    for _ in 0..10 {
        let mut client = client.clone();
        calls.spawn(async move { client.get_stats(GetStatsRequest::default()).await });
    }
    tokio::time::sleep(secs(1)).await;
    lock.commit().await.expect("release the lock");
    while let Some(answer) = calls.join_next().await {
        answer
            .expect("a call task")
            .expect("stats on a new database connection while the status page is flooded");
    }
    let claim = ClaimBatchRequest {
        outbox: "default".into(),
        worker_id: "door".into(),
        max_messages: 10,
        ..Default::default()
    };
    client
        .claim_batch(claim)
        .await
        .expect("a claim while the status page is flooded");
    let mut fresh = OutboxServiceClient::connect(server.url())
        .await
        .expect("a new API connection while the status page is full");
    fresh
        .get_stats(GetStatsRequest::default())
        .await
        .expect("stats on a new API connection");

    let refused = refused_connections(metrics, "status_page").await;
    assert!(
        refused > 0.0,
        "connections over the status page's cap are refused and counted"
    );

    // Every idle connection ends: the refused at once, the others when the
    // header-read timeout passes.
    let mut ends = JoinSet::new();
    for mut stream in idle {
        ends.spawn(async move {
            let mut byte = [0u8; 1];
            // EOF or a reset: closed either way.
            let _ = stream.read(&mut byte).await;
        });
    }
    timeout(secs(20), async {
        while ends.join_next().await.is_some() {}
    })
    .await
    .expect("outboxd closes idle connections to the status page");
    let closed_after = began.elapsed();

    let (code, _) = http_get(status, "/").await;
    assert_eq!(code, 200, "the status page serves again once they are gone");
    println!(
        "door: {IDLE} idle connections under ulimit -n {FILES}: {refused} refused, all closed after {:.1}s",
        closed_after.as_secs_f64()
    );
    drop(server);
}

/// A refusal naming a thousand bad ids used to carry a 32.9 KB message and
/// 68.9 KB of details, over a default client's 16 KiB of response metadata:
/// the client saw RESOURCE_EXHAUSTED instead of why. The refusal names the
/// first few and counts the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_of_a_thousand_bad_ids_reaches_a_default_client() {
    const LEASE: &str = "6f1c2b0e-8a4b-4c3e-9d1f-0a2b3c4d5e6f";
    let case = Case::begin().await;
    let server = Outboxd::start(&case.db.url(), free_port()).await;
    let ids: Vec<String> = (0..1000).map(|i| format!("bad-{i}")).collect();
    let mut client = OutboxServiceClient::connect(server.url())
        .await
        .expect("a default client");
    let mut admin = OutboxAdminClient::connect(server.url())
        .await
        .expect("a default admin client");

    let discard = admin
        .discard(DiscardRequest {
            outbox: "default".into(),
            message_ids: ids.clone(),
        })
        .await;
    assert_bounded("Discard", discard.map(|_| ()));
    let redrive = admin
        .redrive(RedriveRequest {
            outbox: "default".into(),
            message_ids: ids.clone(),
            ..Default::default()
        })
        .await;
    assert_bounded("Redrive", redrive.map(|_| ()));
    let ack = client
        .ack(AckRequest {
            outbox: "default".into(),
            lease_id: LEASE.into(),
            message_ids: ids.clone(),
        })
        .await;
    assert_bounded("Ack", ack.map(|_| ()));
    let nack = client
        .nack(NackRequest {
            outbox: "default".into(),
            lease_id: LEASE.into(),
            message_ids: ids,
            ..Default::default()
        })
        .await;
    assert_bounded("Nack", nack.map(|_| ()));
    drop(server);
}

/// INVALID_ARGUMENT, naming the first ids and how many more, in under 1 KB.
fn assert_bounded(method: &str, answer: Result<(), tonic::Status>) {
    let status = answer.expect_err("a thousand bad ids are refused");
    let message = status.message();
    let shown: String = message.chars().take(300).collect();
    assert_eq!(status.code(), Code::InvalidArgument, "{method}: {shown:?}…");
    assert!(
        message.len() < 1024,
        "{method}: {} bytes: {shown:?}",
        message.len()
    );
    assert!(
        message.contains("message_ids[0]") && message.contains("990 more"),
        "{method}: names the first ids and counts the rest: {message:?}"
    );
    assert!(
        status.details().len() < 1024,
        "{method}: details of {} bytes",
        status.details().len()
    );
    let listed = status
        .get_details_bad_request()
        .map_or(0, |bad| bad.field_violations.len());
    assert!(
        (1..=11).contains(&listed),
        "{method}: the first few violations in the details, not {listed}"
    );
    println!(
        "door: {method} with 1000 bad ids: {} B message, {} B details: {message}",
        message.len(),
        status.details().len()
    );
}

/// `outbox_connections_refused_total` for `listener`, from `/metrics`.
async fn refused_connections(metrics: SocketAddr, listener: &str) -> f64 {
    let (code, body) = http_get(metrics, "/metrics").await;
    assert_eq!(code, 200, "metrics: {body}");
    let label = format!("listener=\"{listener}\"");
    body.lines()
        .filter(|line| {
            line.starts_with("outbox_connections_refused_total{") && line.contains(&label)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// One HTTP/1.1 GET on a connection of its own: the status code and the body.
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .expect("send the request");
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .await
            .expect("read the response");
        String::from_utf8_lossy(&response).into_owned()
    };
    let response = timeout(secs(10), exchange)
        .await
        .unwrap_or_else(|_| panic!("GET {path} on {addr} answered within 10 s"));
    let code = response
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("an HTTP status line: {response:?}"));
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (code, body)
}
