//! The real `outbox-relay` killed -9 mid-drain and restarted, publishing to a
//! queue of the case's own; the checker reads the deliveries off the broker.

use tokio::{process::Child, time::sleep};

use crate::{
    harness::{
        Case, Outboxd, SWEEP_EVERY_SECOND, Sampler, assess, burst, child_command, drained,
        sweeps_found_nothing,
    },
    shared::{
        bins,
        net::free_port,
        rabbit::{AMQP_URL, Rabbit},
        wait::{millis, poll_until, secs, wait_until},
    },
};

const BATCH: usize = 100;
const CONCURRENCY: usize = 4;

/// The relay as a child process, killed when dropped.
struct Relay(Child);

impl Relay {
    fn start(server: &Outboxd, rabbit: &Rabbit) -> Self {
        let child = child_command(bins::relay())
            .args(["--server", &server.url()])
            .args(["--amqp-url", AMQP_URL])
            .args(["--exchange", &rabbit.exchange, "--no-declare"])
            .args(["--metrics-listen", "off"])
            .args(["--lease", "2s"])
            .args(["--batch-size", &BATCH.to_string()])
            .args(["--concurrency", &CONCURRENCY.to_string()])
            .args(["--wait", "1s", "--drain-timeout", "5s"])
            .spawn()
            .expect("spawn outbox-relay");
        Self(child)
    }

    async fn kill9(mut self) {
        self.0.kill().await.expect("kill -9 the relay");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_relay_killed_9_mid_drain_loses_nothing_after_restarts() {
    let case = Case::begin().await;
    let (db, history) = (&case.db, &case.history);
    let server = Outboxd::start_with(&db.url(), free_port(), &SWEEP_EVERY_SECOND).await;
    let rabbit = Rabbit::bound("#").await;
    let sampler = Sampler::start(&db.pool, history);
    let mut relay = Relay::start(&server, &rabbit);
    let mut mid_drain = 0;
    // Each round commits a burst and kills the relay once it has published
    // part of it: mid-drain, with batches claimed, published and not yet acked.
    for round in 1..=3 {
        wait_until(secs(60), "the previous burst is drained", async || {
            db.pending().await == 0
        })
        .await;
        let before = db.published().await;
        burst(&db.pool, history, 1000).await;
        // Looked at often: the kill should land early in the burst's drain.
        poll_until(
            secs(60),
            millis(5),
            "the relay publishes part of the burst",
            async || db.published().await >= before + 100,
        )
        .await;
        sampler
            .begin(format!("kill -9 outbox-relay ({round})"))
            .await;
        relay.kill9().await;
        let at_kill = db.published().await;
        mid_drain += usize::from(at_kill < before + 1000);
        // The fault's schedule: the relay stays down for 300 ms.
        sleep(millis(300)).await;
        relay = Relay::start(&server, &rabbit);
        sampler.end();
        wait_until(secs(60), "the restarted relay publishes", async || {
            db.published().await > at_kill || db.pending().await == 0
        })
        .await;
        if db.published().await > at_kill {
            history.recovered();
        }
        println!(
            "kill -9 outbox-relay ({round}): {} of the burst's 1000 published at the kill",
            at_kill - before
        );
    }
    assert!(
        mid_drain > 0,
        "no kill landed mid-drain: the relay published every burst whole first"
    );
    drained(db, sampler, None).await;
    relay.kill9().await;
    for message in rabbit.drain().await {
        let attempt = message
            .headers
            .get("x-outbox-attempt")
            .map(|a| a.parse().expect("x-outbox-attempt is a number"));
        history.delivered(message.message_id, None, attempt);
    }
    sweeps_found_nothing(&[&server], "kill -9 outbox-relay").await;
    let figures = assess(&case, "kill -9 outbox-relay").await;
    // The README's promise: a crash redelivers at most two batches per slot.
    let per_kill = 2 * CONCURRENCY * BATCH;
    assert!(
        figures.duplicates <= figures.faults * per_kill,
        "{} duplicates after {} kills: more than {per_kill} per kill",
        figures.duplicates,
        figures.faults
    );
    drop(server);
}
