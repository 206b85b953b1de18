//! Overload at the door: clients that hold connections open, send absurd
//! headers, or name a thousand bad ids must not take outboxd's file
//! descriptors, memory or its clients' metadata limits with them.

use std::{net::SocketAddr, time::Duration};

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
    harness::{Case, Outboxd, http_get},
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

/// A request header of 1 MiB used to keep its gRPC connection open for
/// minutes after outboxd stopped reading it. Over the header limit, h2 ends
/// the connection at once (GOAWAY), for one long header as for many small
/// ones; a header block that never ends, or a connection that never sends
/// the HTTP/2 preface, is closed after the 10 s header deadline (it used to
/// take the 40 s keep-alive, and the preface-less one stayed for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_or_unfinished_request_headers_end_their_connection() {
    let case = Case::begin().await;
    let server = Outboxd::start(&case.db.url(), free_port()).await;
    let addr = server.addr;

    let one_long = request_with_headers(&[("x-big", 1 << 20)]);
    let many: Vec<(String, usize)> = (0..400).map(|i| (format!("x-h{i:03}"), 90)).collect();
    let many: Vec<(&str, usize)> = many.iter().map(|(n, l)| (n.as_str(), *l)).collect();
    let many_small = request_with_headers(&many);
    for (what, bytes) in [
        ("1 MiB header", one_long),
        ("400 headers, 40 KiB", many_small),
    ] {
        let (took, frames) = held(addr, bytes, secs(10)).await;
        let took = took.unwrap_or_else(|| panic!("{what}: still open after 10 s"));
        assert!(
            took < secs(3),
            "{what}: the connection ended at once: {took:?}"
        );
        let go_away = frames.iter().find(|(kind, _)| *kind == GOAWAY);
        let code = go_away
            .and_then(|(_, payload)| payload.get(4..8))
            .map(|code| u32::from_be_bytes(code.try_into().expect("four bytes")));
        assert!(
            code.is_some(),
            "{what}: a GOAWAY before the end: {frames:?}"
        );
        println!("door: {what}: GOAWAY (error code {code:?}), connection ended after {took:?}");
    }

    // The two slow ones at once: each waits out the deadline.
    let unfinished = {
        let mut bytes = PREFACE.to_vec();
        frame(&mut bytes, SETTINGS, 0, 0, &[]);
        frame(&mut bytes, HEADERS, 0, 1, &[0x83, 0x86, 0x84]);
        held(addr, bytes, secs(30))
    };
    let silent = held(addr, Vec::new(), secs(30));
    let ((unfinished, _), (silent, _)) = tokio::join!(unfinished, silent);
    for (what, took) in [
        ("a header block never ended", unfinished),
        ("no preface", silent),
    ] {
        let took = took.unwrap_or_else(|| panic!("{what}: still open after 30 s"));
        assert!(
            took < secs(15),
            "{what}: closed at the header deadline, not {took:?}"
        );
        println!("door: {what}: connection ended after {took:?}");
    }
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

const HEADERS: u8 = 0x1;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_HEADERS: u8 = 0x4;
/// The frame size every HTTP/2 peer accepts before it says otherwise.
const FRAME: usize = 16 * 1024;
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Sends `bytes` on a new connection to `addr`, keeping its write half open
/// (no FIN from this side, however far the write gets: only outboxd may end
/// the connection), and reads until outboxd ends it. How long that took
/// (`None`: not within `limit`), and the frames it sent.
async fn held(
    addr: SocketAddr,
    bytes: Vec<u8>,
    limit: Duration,
) -> (Option<Duration>, Vec<(u8, Vec<u8>)>) {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut reader, mut writer) = stream.into_split();
    let began = Instant::now();
    let write = tokio::spawn(async move {
        let written = writer.write_all(&bytes).await;
        std::future::pending::<()>().await;
        drop((writer, written));
    });
    let mut received = Vec::new();
    let ended = timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match reader.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => received.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let took = began.elapsed();
    write.abort();
    (ended.ok().map(|()| took), frames(&received))
}

/// The client preface, empty settings, and a request on stream 1 whose
/// header block carries `headers` (name, value length), each a literal
/// written out (not Huffman-coded), over a HEADERS frame and CONTINUATIONs.
fn request_with_headers(headers: &[(&str, usize)]) -> Vec<u8> {
    let mut block = vec![0x83, 0x86, 0x84]; // :method POST, :scheme http, :path /
    for (name, len) in headers {
        block.push(0x00); // a literal, not indexed, with a new name
        hpack_integer(&mut block, name.len());
        block.extend_from_slice(name.as_bytes());
        hpack_integer(&mut block, *len);
        block.resize(block.len() + len, b'a');
    }
    let mut out = PREFACE.to_vec();
    frame(&mut out, SETTINGS, 0, 0, &[]);
    let chunks: Vec<&[u8]> = block.chunks(FRAME).collect();
    for (i, chunk) in chunks.iter().enumerate() {
        let kind = if i == 0 { HEADERS } else { CONTINUATION };
        let flags = if i + 1 == chunks.len() {
            END_HEADERS
        } else {
            0
        };
        frame(&mut out, kind, flags, 1, chunk);
    }
    out
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a frame's payload fits");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// An HPACK integer with a 7-bit prefix (RFC 7541, 5.1), string not Huffman-coded.
fn hpack_integer(out: &mut Vec<u8>, mut value: usize) {
    if value < 127 {
        out.push(value as u8);
        return;
    }
    out.push(127);
    value -= 127;
    while value >= 128 {
        out.push((value % 128) as u8 | 0x80);
        value /= 128;
    }
    out.push(value as u8);
}

/// The frames in what the server sent: type and payload.
fn frames(mut bytes: &[u8]) -> Vec<(u8, Vec<u8>)> {
    let mut frames = Vec::new();
    while bytes.len() >= 9 {
        let len = usize::from(bytes[0]) << 16 | usize::from(bytes[1]) << 8 | usize::from(bytes[2]);
        let payload = bytes.get(9..9 + len).unwrap_or(&bytes[9..]);
        frames.push((bytes[3], payload.to_vec()));
        bytes = bytes.get(9 + len..).unwrap_or_default();
    }
    frames
}
