//! The fault suite: outboxd (and the relay) as real processes under load while
//! faults hit them, every case on a database of its own and checked by the
//! same history checker (`history`). Cases run one at a time: they measure
//! recoveries on a small machine, and each prints one line of figures
//! (`cargo test --test faults -- --nocapture` shows them).
#![allow(clippy::print_stdout)]

mod clusters;
mod crash;
mod cursor;
mod door;
mod harness;
mod history;
mod ordering;
mod recovery;
mod relay;
#[path = "../shared/mod.rs"]
mod shared;
mod timeouts;

use harness::{Case, Outboxd, SWEEP_EVERY_SECOND, Targets};
use shared::{
    net::free_port,
    proxy::Proxy,
    wait::{millis, secs},
};
use tokio::time::{Instant, sleep};

const EVENTS: usize = 3000;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outboxd_killed_9_and_restarted_loses_nothing_and_accepts_no_stale_ack() {
    let case = Case::begin().await;
    let port = free_port();
    let mut server = Outboxd::start_with(&case.db.url(), port, &SWEEP_EVERY_SECOND).await;
    let load = case.load(&Targets::new([server.url()]), EVENTS, secs(10));

    for round in 1..=4 {
        // The fault schedule: 2 s of load between kills, 500 ms down after each.
        sleep(secs(2)).await;
        load.sampler
            .begin(format!("kill -9 outboxd ({round})"))
            .await;
        server.kill9().await;
        sleep(millis(500)).await;
        server = Outboxd::start_with(&case.db.url(), port, &SWEEP_EVERY_SECOND).await;
        load.sampler.end();
    }
    // Whether a worker's ack outlives its lease here depends on how fast
    // outboxd comes back; the checker refuses any stale ack that was accepted,
    // and the lease-loss case below sends stale acks on every run.
    load.conclude(&case, "kill -9 outboxd", &[&server]).await;
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_one_killed_9_workers_move_to_the_live_one() {
    let case = Case::begin().await;
    let ports = [free_port(), free_port()];
    let first = Outboxd::start_with(&case.db.url(), ports[0], &SWEEP_EVERY_SECOND).await;
    let second = Outboxd::start_with(&case.db.url(), ports[1], &SWEEP_EVERY_SECOND).await;
    // Workers 0 and 2 start on the first replica, 1 and 3 on the second.
    let load = case.load(&Targets::new([first.url(), second.url()]), EVENTS, secs(10));

    // The fault schedule: 3 s of load, the second replica down for 3 s, 2 s
    // of load on both, then the first replica goes for good.
    sleep(secs(3)).await;
    load.sampler.begin("kill -9 the second replica").await;
    second.kill9().await;
    load.sampler.end();
    sleep(secs(3)).await;
    let second = Outboxd::start_with(&case.db.url(), ports[1], &SWEEP_EVERY_SECOND).await;
    sleep(secs(2)).await;
    load.sampler.begin("kill -9 the first replica").await;
    first.kill9().await;
    load.sampler.end();

    let figures = load
        .conclude(&case, "two replicas, one killed", &[&second])
        .await;
    assert!(
        figures.recoveries > 0,
        "workers whose replica died succeeded again on the live one"
    );
    drop(second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn database_connections_cut_and_stalled_lose_nothing() {
    let case = Case::begin().await;
    let proxy = Proxy::start(case.db.upstream()).await;
    let server = Outboxd::start_with(
        &case.db.url_via(proxy.addr()),
        free_port(),
        &SWEEP_EVERY_SECOND,
    )
    .await;
    let load = case.load(&Targets::new([server.url()]), EVENTS, secs(12));

    for round in 1..=3 {
        // The fault schedule: 2 s of load, a reset, 1 s of load, a 3 s stall.
        sleep(secs(2)).await;
        load.sampler
            .begin(format!("cut outboxd's database connections ({round})"))
            .await;
        proxy.reset_connections();
        load.sampler.end();
        sleep(secs(1)).await;
        load.sampler
            .begin(format!("stall outboxd's database connections 3s ({round})"))
            .await;
        proxy.stall();
        sleep(secs(3)).await;
        proxy.resume();
        load.sampler.end();
    }
    load.conclude(&case, "cut and stalled", &[&server]).await;
    drop(server);
}

/// Lease state lives in an unlogged table, which PostgreSQL empties when it
/// recovers from a crash and which a replica promoted by failover starts
/// without. Emptying it under load (what a crash does to it, on a database
/// other tests share) must lose no event: every leased row is claimable again,
/// and the acks of the leases that vanished are fenced.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lease_state_lost_as_in_a_crash_loses_nothing_and_fences_every_stale_ack() {
    let case = Case::begin().await;
    let server = Outboxd::start_with(&case.db.url(), free_port(), &SWEEP_EVERY_SECOND).await;
    let load = case.load(&Targets::new([server.url()]), EVENTS, secs(10));

    for round in 1..=4 {
        // The fault schedule: 2 s of load between losses.
        sleep(secs(2)).await;
        load.sampler
            .begin_lease_loss(format!("lease table emptied ({round})"))
            .await;
        // A crash empties every unlogged table: the epoch goes with the leases.
        case.db
            .execute("TRUNCATE outbox_leases, outbox_epoch")
            .await;
        load.sampler.end();
    }
    let figures = load.conclude(&case, "lease state lost", &[&server]).await;
    assert!(
        figures.fenced > 0,
        "acks of vanished leases were sent, and fenced"
    );
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn outboxd_backends_terminated_lose_nothing() {
    let case = Case::begin().await;
    let server = Outboxd::start_with(&case.db.url(), free_port(), &SWEEP_EVERY_SECOND).await;
    let load = case.load(&Targets::new([server.url()]), EVENTS, secs(10));

    let mut backends = 0;
    for round in 1..=5 {
        // The fault schedule: 2 s of load between terminations.
        sleep(secs(2)).await;
        load.sampler
            .begin(format!("pg_terminate_backend of outboxd ({round})"))
            .await;
        let terminated = case.db.terminate_outboxd_backends().await;
        assert!(terminated > 0, "outboxd has backends to terminate");
        backends += terminated;
        load.sampler.end();
    }
    println!("pg_terminate_backend: {backends} outboxd backends in 5 rounds");
    load.conclude(&case, "pg_terminate_backend", &[&server])
        .await;
    drop(server);
}

/// Regression: a stalled database link held a call as long as the stall
/// lasted when its client set no deadline. outboxd now gives up on an
/// unanswered statement at `--statement-timeout` (5 s) plus a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_link_answers_unavailable_within_the_statement_timeout() {
    use outboxd::grpc::pb::{GetStatsRequest, outbox_service_client::OutboxServiceClient};

    let case = Case::begin().await;
    let proxy = Proxy::start(case.db.upstream()).await;
    let server = Outboxd::start(&case.db.url_via(proxy.addr()), free_port()).await;
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
