//! A database that is read-only or in recovery, and a failover (issue #47,
//! items 6 and 7): outboxd against a hot standby answers UNAVAILABLE and
//! reports NOT_SERVING; started against one, it waits for the promotion; and
//! a failover to a synchronous standby under load loses nothing. Each runs
//! on PostgreSQL clusters of its own (`shared::cluster`).

use outboxd::grpc::pb::{
    AckRequest, ClaimBatchRequest, GetStatsRequest, outbox_service_client::OutboxServiceClient,
};
use tokio::time::{Instant, sleep};
use tonic::{Code, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

use crate::{
    harness::{
        Case, Log, Outbox, Outboxd, Targets, burst, full_form, logged_command, sweeps_found_nothing,
    },
    shared::{
        bins,
        cluster::PrivateCluster,
        net::free_port,
        wait::{holds_within, millis, secs, wait_until, within},
    },
};

/// What outboxd logs, once, while its database does not take writes.
const WAITING: &str = "does not accept writes";

async fn health(url: &str) -> Option<ServingStatus> {
    let call = async {
        let channel = Channel::from_shared(url.to_owned())
            .ok()?
            .connect()
            .await
            .ok()?;
        let mut client = HealthClient::new(channel);
        let request = HealthCheckRequest {
            service: "outbox.v1.OutboxService".into(),
        };
        let status = client.check(request).await.ok()?.into_inner().status;
        ServingStatus::try_from(status).ok()
    };
    tokio::time::timeout(secs(2), call).await.ok().flatten()
}

async fn wait_health(url: &str, wanted: ServingStatus) {
    let reached = holds_within(secs(10), millis(100), async || {
        health(url).await == Some(wanted)
    })
    .await;
    assert!(
        reached,
        "health did not become {wanted:?} within 10s (last: {:?})",
        health(url).await
    );
}

fn claim_request(max: u32) -> ClaimBatchRequest {
    ClaimBatchRequest {
        worker_id: "recovery-case".into(),
        max_messages: max,
        lease_duration: Some(secs(60).try_into().expect("fits")),
        ..ClaimBatchRequest::default()
    }
}

/// Regression (#47 item 6): a standby in recovery, or a failover in
/// progress, answered claims and acks with INTERNAL (SQLSTATE 0A000 on the
/// unlogged lease table) while health stayed SERVING. outboxd now answers
/// UNAVAILABLE, which workers retry, and reports NOT_SERVING until the
/// database takes writes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_in_recovery_answers_unavailable_and_health_is_not_serving() {
    let (case, proxy) = Case::begin_private_behind_proxy().await;
    let server = Outboxd::spawn_logged(&case.db.url(), free_port(), &[]);
    server.serving().await;
    let standby = case.cluster().standby().await;
    burst(&case.db.pool, &case.history, 20).await;
    let mut client: OutboxServiceClient<Channel> = OutboxServiceClient::connect(server.url())
        .await
        .expect("connect to outboxd");
    let batch = client
        .claim_batch(claim_request(5))
        .await
        .expect("a claim on the primary")
        .into_inner();
    assert_eq!(batch.messages.len(), 5);
    wait_health(&server.url(), ServingStatus::Serving).await;

    // The address outboxd uses now leads to a hot standby. Cutting its
    // connections makes the health check fail once at least; it must then
    // stay NOT_SERVING while the standby answers every read.
    let began = Instant::now();
    proxy.retarget(standby.addr());
    proxy.reset_connections();
    wait_health(&server.url(), ServingStatus::NotServing).await;
    let not_serving_after = began.elapsed();
    // Several health intervals (200 ms): a schedule, not a wait for anything.
    sleep(secs(2)).await;
    assert_eq!(
        health(&server.url()).await,
        Some(ServingStatus::NotServing),
        "NOT_SERVING while the database is a standby in recovery"
    );
    let mut codes = Vec::new();
    for _ in 0..5 {
        let claim = client.claim_batch(claim_request(5)).await;
        codes.push(claim.map(drop).map_err(|s| s.code()));
        let ack = client
            .ack(AckRequest {
                lease_id: batch.lease_id.clone(),
                message_ids: batch.messages.iter().map(|m| m.id.clone()).collect(),
                ..AckRequest::default()
            })
            .await;
        codes.push(ack.map(drop).map_err(|s| s.code()));
        let stats = client.get_stats(GetStatsRequest::default()).await;
        codes.push(stats.map(drop).map_err(|s| s.code()));
    }
    assert!(
        codes.iter().all(|c| *c == Err(Code::Unavailable)),
        "claims, acks and stats answer UNAVAILABLE while the database is a standby: {codes:?}"
    );
    let log = server.log();
    let flips = log.lines_with("database takes no writes: NOT_SERVING");
    assert!(
        flips.len() == 1 && flips[0].contains("recovery"),
        "the health check says once why it is NOT_SERVING:\n{}",
        log.text()
    );
    assert!(
        log.lines_with("storage unavailable")
            .iter()
            .any(|line| line.contains("standby in recovery")),
        "the failed calls' log names the likely cause:\n{}",
        log.text()
    );

    // The primary again: SERVING, and the lease still holds its rows.
    proxy.retarget(case.cluster().addr());
    proxy.reset_connections();
    wait_health(&server.url(), ServingStatus::Serving).await;
    let back_after = began.elapsed();
    let ack = within(
        secs(10),
        "an ack once the primary is back",
        client.ack(AckRequest {
            lease_id: batch.lease_id.clone(),
            message_ids: batch.messages.iter().map(|m| m.id.clone()).collect(),
            ..AckRequest::default()
        }),
    )
    .await
    .expect("the ack succeeds on the primary");
    assert_eq!(ack.into_inner().results.len(), 5);
    println!(
        "standby in recovery: {} calls, all UNAVAILABLE; NOT_SERVING after {:.2}s, SERVING again {:.2}s after the move",
        codes.len(),
        not_serving_after.as_secs_f64(),
        back_after.as_secs_f64()
    );
    drop(server);
    drop(standby);
}

/// Regression (#47 item 7): outboxd (and `outboxd migrate`) started against
/// a standby exited 1 at once (`cannot execute CREATE TABLE in a read-only
/// transaction`), so a pod restarted during a failover crash-looped. Both
/// now wait, saying why once, and go on once the standby is promoted; with
/// `--db-start-timeout` the wait ends in exit 69 naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outboxd_started_against_a_standby_waits_for_the_promotion() {
    let case = Case::begin_private().await;
    let standby = case.cluster().standby().await;
    let url = case.db.url_via(standby.addr());

    let mut server = Outboxd::spawn_logged(&url, free_port(), &[]);
    let mut migrate = logged_command(bins::outboxd())
        .args(["migrate", "--database-url", &url])
        .spawn()
        .expect("spawn outboxd migrate");
    let migrate_log = Log::collect(&mut migrate);
    let mut impatient = logged_command(bins::outboxd())
        .args([
            "migrate",
            "--database-url",
            &url,
            "--db-start-timeout",
            "2s",
        ])
        .spawn()
        .expect("spawn outboxd migrate --db-start-timeout 2s");
    let impatient_log = Log::collect(&mut impatient);

    let began = Instant::now();
    wait_until(secs(30), "outboxd says it waits for writes", async || {
        !server.log().lines_with(WAITING).is_empty() && !migrate_log.lines_with(WAITING).is_empty()
    })
    .await;
    let status = within(
        secs(30),
        "outboxd migrate --db-start-timeout 2s",
        impatient.wait(),
    )
    .await
    .expect("wait for outboxd migrate");
    assert_eq!(
        status.code(),
        Some(69),
        "gives up with EX_UNAVAILABLE: {}",
        impatient_log.text()
    );
    assert!(
        impatient_log.text().contains("recovery"),
        "the last words name the cause: {}",
        impatient_log.text()
    );
    // Outboxd polls about once a second: by now it has looked several times.
    sleep(secs(3)).await;
    assert!(
        server.exited().is_none(),
        "outboxd waits for the standby's promotion instead of exiting:\n{}",
        server.log().text()
    );
    assert!(
        migrate.try_wait().expect("ask about migrate").is_none(),
        "outboxd migrate waits too:\n{}",
        migrate_log.text()
    );
    for (who, log) in [("outboxd", server.log()), ("outboxd migrate", &migrate_log)] {
        let waiting = log.lines_with(WAITING);
        assert_eq!(
            waiting.len(),
            1,
            "{who} says once why it waits:\n{}",
            log.text()
        );
        assert!(waiting[0].contains("recovery"), "{}", waiting[0]);
    }

    // The failover: the primary goes, the standby is promoted.
    case.cluster().stop_immediate().await;
    standby.promote().await;
    let promoted = began.elapsed();
    let status = within(
        secs(30),
        "outboxd migrate after the promotion",
        migrate.wait(),
    )
    .await
    .expect("wait for outboxd migrate");
    assert!(status.success(), "migrate finished: {}", migrate_log.text());
    server.serving().await;
    let serving = began.elapsed();
    assert!(
        !server
            .log()
            .lines_with("database accepts writes")
            .is_empty(),
        "{}",
        server.log().text()
    );
    let pool = sqlx::PgPool::connect(&url)
        .await
        .expect("connect to the promoted standby");
    burst(&pool, &case.history, 3).await;
    let mut client = OutboxServiceClient::connect(server.url())
        .await
        .expect("connect to outboxd");
    let batch = within(
        secs(10),
        "a claim on the promoted standby",
        client.claim_batch(claim_request(10)),
    )
    .await
    .expect("a claim on the promoted standby")
    .into_inner();
    assert_eq!(batch.messages.len(), 3);
    pool.close().await;
    println!(
        "started against a standby: waited, promoted at {:.2}s, serving at {:.2}s",
        promoted.as_secs_f64(),
        serving.as_secs_f64()
    );
    drop(server);
}

/// A failover under load (#47, #48): the primary stops at once, the address
/// outboxd uses moves to its synchronous standby (streaming, `pg_basebackup
/// -R`) while that is still in recovery (outboxd answers UNAVAILABLE, never
/// INTERNAL), then the standby is promoted (`pg_ctl promote`). Nothing
/// committed is lost (the standby is synchronous), no row is under two live
/// leases, and what the promoted server forgot (the lease table, its epoch,
/// outboxd's last asynchronous writes) only causes redeliveries. On an
/// unordered outbox the claim cursor starts over in the promoted server's
/// epoch, and the claim sweep, every second, finds nothing below it; on an
/// ordered one each aggregate's events are first handed out in `sequence`
/// order, each after the previous one was acked. Short form: one failover;
/// `OUTBOXD_FAULTS_FULL=1`: three, over more events.
async fn a_failover_to_a_synchronous_standby_under_load_loses_nothing(outbox: Outbox) {
    let (rounds, events, spread) = if full_form() {
        (3, 9000, secs(30))
    } else {
        (1, 3000, secs(10))
    };
    let (case, proxy) = Case::begin_private_behind_proxy().await;
    let mut standby = case.cluster().synchronous_standby().await;
    let server = Outboxd::start_with(&case.db.url(), free_port(), &outbox.args()).await;
    let load = outbox.load(&case, &Targets::new([server.url()]), events, spread);

    // Every cluster stays until the end, stopped or not: dropping one removes it.
    let mut clusters: Vec<PrivateCluster> = Vec::new();
    for round in 1..=rounds {
        // The fault schedule: load, then the failover.
        sleep(secs(3)).await;
        load.sampler
            .begin_server_loss(format!("failover to a synchronous standby ({round})"))
            .await;
        match clusters.last() {
            Some(primary) => primary.stop_immediate().await,
            None => case.cluster().stop_immediate().await,
        }
        proxy.retarget(standby.addr());
        proxy.reset_connections();
        // The promotion takes a moment, during which outboxd reaches a
        // standby in recovery: a schedule, not a wait for anything.
        sleep(secs(1)).await;
        standby.promote().await;
        load.sampler.end();
        let next = if round < rounds {
            Some(standby.synchronous_standby().await)
        } else {
            None
        };
        clusters.push(standby);
        let Some(next) = next else { break };
        standby = next;
    }

    let name = format!("failover to a synchronous standby, {}", outbox.name());
    let drained = load.drain(&case).await;
    sweeps_found_nothing(&[&server], &name).await;
    let figures = drained.assess(&case, &name).await;
    let recorded = case.history.recorded();
    assert!(
        !recorded.codes.contains_key("Internal"),
        "a failover answers UNAVAILABLE, never INTERNAL: {:?}",
        recorded.codes
    );
    assert_eq!(figures.faults, rounds, "every failover happened");
    assert!(
        figures.failed_calls > 0 && figures.recoveries > 0,
        "the workers felt the failover and got through again"
    );
    if outbox == Outbox::Ordered {
        assert!(
            figures.ordered_pairs > 0,
            "the order rule compared events of one aggregate"
        );
    }
    let last = clusters.last().expect("a promoted standby");
    assert!(!last.in_recovery().await, "the last standby was promoted");
    assert_eq!(proxy.upstream(), last.addr());
    drop(server);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_to_a_synchronous_standby_under_load_on_an_ordered_outbox_loses_nothing() {
    a_failover_to_a_synchronous_standby_under_load_loses_nothing(Outbox::Ordered).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failover_to_a_synchronous_standby_under_load_on_an_unordered_outbox_skips_nothing() {
    a_failover_to_a_synchronous_standby_under_load_loses_nothing(Outbox::Unordered).await;
}
