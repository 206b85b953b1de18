//! The fault suite: outboxd (and the relay) as real processes under load while
//! faults hit them, every case on a database of its own and checked by the
//! same history checker (`history`). Cases run one at a time: they measure
//! recoveries on a small machine, and each prints one line of figures
//! (`cargo test --test faults -- --nocapture` shows them).
#![allow(clippy::print_stdout)]

mod harness;
mod history;
mod proxy;
mod relay;
// The api tests' broker helpers: a queue of the case's own, deleted at the end.
#[allow(dead_code)]
#[path = "../api/relay/rabbit.rs"]
mod rabbit;

use harness::{
    Outboxd, Sampler, Targets, TestDb, Workers, conclude, free_port, millis, produce, secs,
};
use history::History;
use proxy::Proxy;
use tokio::{sync::Mutex, time::Instant, time::sleep};

/// Cases take turns: each has the machine to itself.
static TURN: Mutex<()> = Mutex::const_new(());

const EVENTS: usize = 3000;
const WORKERS: usize = 4;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outboxd_killed_9_and_restarted_loses_nothing_and_fences_every_stale_ack() {
    let _turn = TURN.lock().await;
    let began = Instant::now();
    let db = TestDb::create().await;
    let history = History::new();
    let port = free_port();
    let mut server = Outboxd::start(&db.url(), port).await;
    let workers = Workers::spawn(WORKERS, &Targets::new([server.url()]), &history);
    let sampler = Sampler::start(&db.pool, &history);
    let producers = produce(&db.pool, &history, EVENTS, secs(10));

    for round in 1..=4 {
        sleep(secs(2)).await;
        sampler.begin(format!("kill -9 outboxd ({round})")).await;
        server.kill9().await;
        sleep(millis(500)).await;
        server = Outboxd::start(&db.url(), port).await;
        sampler.end();
    }
    producers.await.expect("producers");
    conclude("kill -9 outboxd", &db, &history, workers, sampler, began).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_one_killed_9_workers_move_to_the_live_one() {
    let _turn = TURN.lock().await;
    let began = Instant::now();
    let db = TestDb::create().await;
    let history = History::new();
    let ports = [free_port(), free_port()];
    let first = Outboxd::start(&db.url(), ports[0]).await;
    let second = Outboxd::start(&db.url(), ports[1]).await;
    // Workers 0 and 2 start on the first replica, 1 and 3 on the second.
    let targets = Targets::new([first.url(), second.url()]);
    let workers = Workers::spawn(WORKERS, &targets, &history);
    let sampler = Sampler::start(&db.pool, &history);
    let producers = produce(&db.pool, &history, EVENTS, secs(10));

    sleep(secs(3)).await;
    sampler.begin("kill -9 the second replica").await;
    second.kill9().await;
    sampler.end();
    sleep(secs(3)).await;
    let second = Outboxd::start(&db.url(), ports[1]).await;
    sleep(secs(2)).await;
    sampler.begin("kill -9 the first replica").await;
    first.kill9().await;
    sampler.end();

    producers.await.expect("producers");
    conclude(
        "two replicas, one killed",
        &db,
        &history,
        workers,
        sampler,
        began,
    )
    .await;
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_connections_cut_and_stalled_lose_nothing() {
    let _turn = TURN.lock().await;
    let began = Instant::now();
    let db = TestDb::create().await;
    let history = History::new();
    let proxy = Proxy::start(TestDb::upstream()).await;
    let server = Outboxd::start(&db.url_via(proxy.addr()), free_port()).await;
    let workers = Workers::spawn(WORKERS, &Targets::new([server.url()]), &history);
    let sampler = Sampler::start(&db.pool, &history);
    let producers = produce(&db.pool, &history, EVENTS, secs(12));

    for round in 1..=3 {
        sleep(secs(2)).await;
        sampler
            .begin(format!("cut outboxd's database connections ({round})"))
            .await;
        proxy.cut();
        sampler.end();
        sleep(secs(1)).await;
        sampler
            .begin(format!("stall outboxd's database connections 3s ({round})"))
            .await;
        proxy.stall();
        sleep(secs(3)).await;
        proxy.resume();
        sampler.end();
    }
    producers.await.expect("producers");
    conclude("cut and stalled", &db, &history, workers, sampler, began).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outboxd_backends_terminated_listener_included_lose_nothing() {
    let _turn = TURN.lock().await;
    let began = Instant::now();
    let db = TestDb::create().await;
    let history = History::new();
    let server = Outboxd::start(&db.url(), free_port()).await;
    let workers = Workers::spawn(WORKERS, &Targets::new([server.url()]), &history);
    let sampler = Sampler::start(&db.pool, &history);
    let producers = produce(&db.pool, &history, EVENTS, secs(10));

    let (mut backends, mut listener_hit) = (0, 0);
    for round in 1..=5 {
        sleep(secs(2)).await;
        sampler
            .begin(format!("pg_terminate_backend of outboxd ({round})"))
            .await;
        let (terminated, listener) = db.terminate_outboxd_backends().await;
        assert!(terminated > 0, "outboxd has backends to terminate");
        backends += terminated;
        listener_hit += usize::from(listener);
        sampler.end();
    }
    println!(
        "pg_terminate_backend: {backends} outboxd backends, the LISTEN one in {listener_hit} of 5 rounds"
    );
    assert!(
        listener_hit > 0,
        "the LISTEN backend was terminated at least once"
    );
    producers.await.expect("producers");
    conclude(
        "pg_terminate_backend",
        &db,
        &history,
        workers,
        sampler,
        began,
    )
    .await;
    drop(server);
}

/// Regression: a stalled database link held a call as long as the stall
/// lasted when its client set no deadline. outboxd now gives up on an
/// unanswered statement at `--statement-timeout` (5 s) plus a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_link_answers_unavailable_within_the_statement_timeout() {
    use outboxd::grpc::pb::{GetStatsRequest, outbox_service_client::OutboxServiceClient};

    let _turn = TURN.lock().await;
    let db = TestDb::create().await;
    let proxy = Proxy::start(TestDb::upstream()).await;
    let server = Outboxd::start(&db.url_via(proxy.addr()), free_port()).await;
    let mut client = OutboxServiceClient::connect(server.url())
        .await
        .expect("a client without a deadline");
    // Warm the pool, so the call below picks up an open connection.
    client
        .get_stats(GetStatsRequest::default())
        .await
        .expect("stats before the stall");
    proxy.stall();
    let began = Instant::now();
    let answer = tokio::time::timeout(secs(30), client.get_stats(GetStatsRequest::default()))
        .await
        .expect("an answer while the link is stalled");
    let took = began.elapsed();
    proxy.resume();
    let status = answer.expect_err("no stats through a stalled link");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(took < secs(10), "answered within the limit: {took:?}");
    println!("stalled link: UNAVAILABLE after {took:?}");
    drop(server);
}
