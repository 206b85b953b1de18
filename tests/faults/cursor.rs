//! The claim cursor of an unordered outbox (#48) under faults: a fresh claim
//! reads the pending rows from a cursor, below which every pending row is
//! leased, delayed, published or dead-lettered. A cursor that passed a row
//! still to be delivered would skip it: the cases below hit every way one
//! could (a producer transaction that commits a low `seq` late, replicas
//! that each keep a cursor of their own and die, nacks and producers'
//! future `available_at`), and each asserts, beside the history checker's
//! rules, that every event came when it should and that the claim sweep
//! (`--claim-sweep-interval`), a full walk below the cursor, found nothing
//! there. The crash and the failover of PostgreSQL under load on an
//! unordered outbox are in `crash.rs` and `recovery.rs`, beside their
//! ordered forms.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use chrono::{DateTime, TimeDelta, Utc};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sqlx::{PgPool, postgres::PgPoolOptions};
use tokio::{task::JoinHandle, time::sleep};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    harness::{
        Case, Conn, Outboxd, SWEEP_EVERY_SECOND, Sampler, Scrape, Targets, Workers, assess, burst,
        drained, full_form, sweeps_found_nothing,
    },
    history::{History, SettleKind},
    shared::{
        net::free_port,
        wait::{holds_within, millis, poll_until, secs, wait_until},
    },
};

/// How long after its commit a late event may take to be handed out: far
/// more than a claim's round trip under this load, far less than any sweep
/// interval that could deliver it instead.
const LATE_BOUND: Duration = Duration::from_secs(5);

/// The pending rows at or below `cursor` without a lease row: what the
/// claim sweep looks for. Every one is a row the cursor passed while it was
/// still to be delivered; read in one snapshot, it is empty while the cursor
/// is right (an ack, or a last nack, settles the row and drops its lease in
/// one statement).
async fn uncovered(pool: &PgPool, cursor: i64) -> Vec<i64> {
    sqlx::query_scalar(
        "SELECT o.seq FROM outbox AS o
         WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL AND o.seq <= $1
           AND NOT EXISTS (SELECT 1 FROM outbox_leases AS l WHERE l.id = o.id)
         ORDER BY o.seq",
    )
    .bind(cursor)
    .fetch_all(pool)
    .await
    .expect("read the rows below the claim cursor")
}

/// The first few of `seqs`, and how many there are.
fn some(seqs: &[i64]) -> String {
    format!(
        "{} seqs, the first {:?}",
        seqs.len(),
        &seqs[..seqs.len().min(20)]
    )
}

/// This replica's claim cursor (`outbox_claim_cursor`), as last sampled.
fn cursor_of(page: &Scrape) -> i64 {
    let cursor = page
        .of_outbox("outbox_claim_cursor", "default")
        .unwrap_or_else(|| panic!("outbox_claim_cursor is exported:\n{}", page.text()));
    // A gauge of a seq: an integer, exact in an f64 at these sizes.
    #[allow(clippy::cast_possible_truncation)]
    let cursor = cursor as i64;
    cursor
}

/// Producers that keep committing until `stop`: `tasks` tasks, each a
/// transaction of one to three events every 20–60 ms, held open up to 10
/// ms; every seventh rolls back, leaving a gap in `seq` the cursor must
/// step over.
fn steady(
    pool: &PgPool,
    history: &History,
    tasks: usize,
    stop: &CancellationToken,
) -> JoinHandle<()> {
    let handles: Vec<JoinHandle<()>> = (0..tasks)
        .map(|task| {
            let (pool, history, stop) = (pool.clone(), history.clone(), stop.clone());
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(4800 + task as u64);
                let mut t = 0;
                while !stop.is_cancelled() {
                    t += 1;
                    let ids: Vec<Uuid> = (0..rng.random_range(1..=3))
                        .map(|_| Uuid::new_v4())
                        .collect();
                    // Nothing fails this case's database: an error is the
                    // case ending (its database dropped after a failure),
                    // and a case that lacks producers says so by waiting
                    // in vain for events past the late one.
                    let Ok(mut tx) = pool.begin().await else {
                        return;
                    };
                    let inserted = sqlx::query(
                        "INSERT INTO outbox (id, aggregate_id, event_type, payload)
                         SELECT id, $2 || '-' || n, 'fault.test', jsonb_build_object('n', n)
                         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)",
                    )
                    .bind(&ids)
                    .bind(format!("steady-{task}-{t}"))
                    .execute(&mut *tx)
                    .await;
                    if inserted.is_err() {
                        return;
                    }
                    // Held open while others insert and commit: a schedule.
                    sleep(millis(rng.random_range(0..10))).await;
                    if t % 7 == 0 {
                        let _ = tx.rollback().await;
                    } else if tx.commit().await.is_ok() {
                        history.committed(ids.iter().map(Uuid::to_string));
                    } else {
                        return;
                    }
                    // The producers' pace.
                    sleep(millis(rng.random_range(20..60))).await;
                }
            })
        })
        .collect();
    tokio::spawn(async move {
        for handle in handles {
            handle.await.expect("a producer panicked");
        }
    })
}

/// One late commit: its event, its `seq`, and when the commit returned (the
/// history's clock).
struct Late {
    id: String,
    seq: i64,
    committed: Duration,
}

/// The late commit (#48): in each round a producer transaction inserts an
/// event, drawing a low `seq`, and stays open while 16 producers commit
/// higher ones and 4 workers claim and ack at least 50 of them; then it
/// commits. Its event must be handed out at the next claim after the
/// commit, by the cursor and not by a sweep: the sweep runs every 10
/// minutes here, and every late event must be claimed within 5 s of its
/// commit. While the transaction is open, this replica's cursor must stay
/// below its `seq` (the commit-order guard's safe `seq` holds it); after
/// each round no pending row at or below the cursor is without a lease (the
/// sweep's own check, made by the case). Short form: 10 rounds;
/// `OUTBOXD_FAULTS_FULL=1`: 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_late_commit_below_the_claim_cursor_is_handed_out_at_the_next_claim() {
    let rounds = if full_form() { 50 } else { 10 };
    let case = Case::begin().await;
    let server = Outboxd::start_with(
        &case.db.url(),
        free_port(),
        &[
            "--claim-sweep-interval",
            "10m",
            // The cursor gauge, fresh: it is sampled with the other gauges.
            "--metrics-interval",
            "200ms",
        ],
    )
    .await;
    // Producers of their own: 16 of them, more than the case's pool holds.
    let pool = PgPoolOptions::new()
        .max_connections(24)
        .connect(&case.db.url())
        .await
        .expect("the producers' pool");
    let workers = Workers::spawn(4, &Targets::new([server.url()]), &case.history);
    let sampler = Sampler::start(&case.db.pool, &case.history);
    let stop = CancellationToken::new();
    let producers = steady(&pool, &case.history, 16, &stop);

    let mut lates = Vec::new();
    let mut held_cursors = Vec::new();
    let mut rng = StdRng::seed_from_u64(48);
    for round in 1..=rounds {
        let id = Uuid::new_v4();
        let mut late = pool.begin().await.expect("begin the late transaction");
        let seq: i64 = sqlx::query_scalar(
            "INSERT INTO outbox (id, aggregate_id, event_type, payload)
             VALUES ($1, 'late', 'fault.test', '{}') RETURNING seq",
        )
        .bind(id)
        .fetch_one(&mut *late)
        .await
        .expect("insert the late event");
        case.history
            .fault(format!("late commit of seq {seq} ({round})"));
        wait_until(
            secs(30),
            "higher seqs are inserted, claimed and acked while the late transaction is open",
            async || {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FROM outbox WHERE seq > $1 AND published_at IS NOT NULL",
                )
                .bind(seq)
                .fetch_one(&case.db.pool)
                .await
                .expect("count the published rows past the late one")
                    >= 50
            },
        )
        .await;
        // Two gauge samples after the 50 acks: the cursor as claims left it
        // while the transaction is still open.
        sleep(millis(450)).await;
        let held = cursor_of(&server.scrape().await);
        assert!(
            held < seq,
            "round {round}: the claim cursor is at {held}, past seq {seq} of a transaction \
             still open: the late event would be skipped"
        );
        held_cursors.push((seq, held));
        late.commit().await.expect("commit the late transaction");
        let committed = case.history.now();
        case.history.committed([id.to_string()]);

        let claimed = holds_within(LATE_BOUND, millis(10), async || {
            sqlx::query_scalar::<_, bool>(
                "SELECT EXISTS (SELECT 1 FROM outbox_leases WHERE id = $1 AND NOT delayed)
                     OR EXISTS (SELECT 1 FROM outbox WHERE id = $1 AND published_at IS NOT NULL)",
            )
            .bind(id)
            .fetch_one(&case.db.pool)
            .await
            .expect("look for the late event's lease")
        })
        .await;
        if !claimed {
            let page = server.scrape().await;
            panic!(
                "round {round}: the late event (seq {seq}) was not handed out within \
                 {LATE_BOUND:?} of its commit; claim cursor {}, pending rows without a lease \
                 below it: {}",
                cursor_of(&page),
                some(&uncovered(&case.db.pool, cursor_of(&page)).await)
            );
        }
        let cursor = cursor_of(&server.scrape().await);
        let passed = uncovered(&case.db.pool, cursor).await;
        assert!(
            passed.is_empty(),
            "round {round}: pending rows at or below the claim cursor ({cursor}) have no \
             lease: {}",
            some(&passed)
        );
        lates.push(Late {
            id: id.to_string(),
            seq,
            committed,
        });
        // Rounds apart: a schedule.
        sleep(millis(rng.random_range(0..200))).await;
    }
    stop.cancel();
    producers.await.expect("producers");
    drained(&case.db, sampler, Some(workers)).await;

    // Each late event's first claim, from the history: how long after its
    // commit it came, and how many claims answered after the commit with
    // room to spare (fewer than a full batch) without it.
    let recorded = case.history.recorded();
    let mut waits = Vec::new();
    let mut passed_over = 0;
    for late in &lates {
        let first = recorded
            .claims
            .iter()
            .filter(|c| c.messages.iter().any(|(id, _)| *id == late.id))
            .min_by_key(|c| c.end)
            .unwrap_or_else(|| panic!("the late event seq {} was claimed", late.seq));
        let wait = first.end.saturating_sub(late.committed);
        assert!(
            wait <= LATE_BOUND,
            "the late event seq {} came {wait:?} after its commit",
            late.seq
        );
        passed_over += recorded
            .claims
            .iter()
            .filter(|c| c.start > late.committed && c.end < first.start && c.messages.len() < 50)
            .count();
        waits.push(wait);
    }
    waits.sort_unstable();
    let final_cursor = cursor_of(&server.scrape().await);
    println!(
        "late commit: {rounds} rounds, each handed out {:.0} ms (median) / {:.0} ms (max) \
         after its commit; {passed_over} claims with room answered without it in between; \
         (open seq, cursor held below it) {held_cursors:?}; cursor {final_cursor} at the end",
        waits[waits.len() / 2].as_secs_f64() * 1000.0,
        waits.last().expect("rounds").as_secs_f64() * 1000.0,
    );
    let figures = assess(&case, "late commit").await;
    assert_eq!(figures.faults, rounds, "every late commit happened");
    assert!(
        lates.iter().all(|l| final_cursor > l.seq),
        "the cursor moved past every late event once it was settled (at {final_cursor})"
    );
    // The sweep ran no pass in this case (its interval is 10 minutes, so
    // that only the cursor could deliver the late events): its counter says
    // so, and the case's own check after each round stood in for it.
    let found = server
        .scrape()
        .await
        .of_outbox("outbox_claim_sweep_found_total", "default")
        .unwrap_or(0.0);
    assert!(found == 0.0, "no sweep ran, none found anything: {found}");
    drop(server);
    pool.close().await;
}

/// Three replicas of outboxd on one database, each with a claim cursor of
/// its own, under load, killed with `kill -9` one at a time, each kill
/// mid-drain of a backlog (2 000 events committed at once): from three
/// replicas to two, then from two to one. The workers move to the live
/// ones, which finish each drain: the leases of a killed replica expire and
/// are claimed again through the lease table's expiry index, never skipped
/// by a survivor's cursor. No sweep of a replica found anything below its
/// cursor, read just before each kill and, for the last one, after the
/// drain. (The case of two replicas with one killed and restarted under
/// load is `two_replicas_one_killed_9_workers_move_to_the_live_one`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_each_with_its_cursor_killed_9_one_at_a_time_mid_drain_skip_nothing() {
    /// Events committed at once before each kill.
    const BACKLOG: usize = 2000;
    let (events, spread) = if full_form() {
        (9000, secs(20))
    } else {
        (3000, secs(10))
    };
    let case = Case::begin().await;
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(Outboxd::start_with(&case.db.url(), free_port(), &SWEEP_EVERY_SECOND).await);
    }
    let targets = Targets::new(servers.iter().map(Outboxd::url));
    let load = case.load(&targets, events, spread);

    let mut kills = Vec::new();
    for _ in 0..2 {
        // The fault schedule: 3 s of load, then a backlog appears at once,
        // and once the replicas are draining it one of them goes for good.
        sleep(secs(3)).await;
        let before = case.db.published().await;
        burst(&case.db.pool, &case.history, BACKLOG).await;
        poll_until(
            secs(30),
            millis(5),
            "the replicas drain part of the backlog",
            async || case.db.published().await >= before + 200,
        )
        .await;
        for server in &servers {
            let found = server
                .scrape()
                .await
                .of_outbox("outbox_claim_sweep_found_total", "default")
                .unwrap_or(0.0);
            assert!(
                found == 0.0,
                "a sweep of outboxd {} found {found} claimable events below its cursor",
                server.addr
            );
        }
        let pending = case.db.pending().await;
        let in_flight = case
            .db
            .scalar_i64("SELECT count(*) FROM outbox_leases")
            .await;
        let live = servers.len();
        load.sampler
            .begin(format!("kill -9 one of {live} replicas"))
            .await;
        servers.remove(0).kill9().await;
        load.sampler.end();
        assert!(
            pending >= 500 && in_flight > 0,
            "the kill came mid-drain: {pending} pending, {in_flight} lease rows"
        );
        kills.push(format!(
            "{live} replicas to {}: {pending} pending, {in_flight} lease rows",
            live - 1
        ));
    }

    let name = "replicas killed one at a time";
    let survivors: Vec<&Outboxd> = servers.iter().collect();
    let figures = load.conclude(&case, name, &survivors).await;
    assert_eq!(figures.faults, 2, "both kills happened");
    assert!(
        figures.failed_calls > 0 && figures.recoveries > 0,
        "workers whose replica died succeeded again on a live one"
    );
    println!("{name}: at the kills, {}", kills.join("; "));
}

/// When each event may be handed out, by the database's clock: a
/// producer's `available_at`, and each accepted nack's retry.
#[derive(Debug, Default)]
struct Due {
    /// Event id → its `available_at` as the producer inserted it, for the
    /// events whose producer set one in the future.
    future: HashMap<String, DateTime<Utc>>,
    /// Event id → its nacks: (lease id, sent, answered, retry after).
    nacks: HashMap<String, Vec<Nacked>>,
}

#[derive(Debug, Clone)]
struct Nacked {
    lease_id: String,
    sent: DateTime<Utc>,
    answered: DateTime<Utc>,
    retry: Duration,
}

type Dues = Arc<Mutex<Due>>;

fn dues(d: &Dues) -> std::sync::MutexGuard<'_, Due> {
    d.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Producers for the delays case: 4 tasks commit `total` events over
/// `spread` in transactions of one to five; each event has a one-in-three
/// chance of an `available_at` 0–3 s in the future.
fn produce_delayed(
    pool: &PgPool,
    history: &History,
    due: &Dues,
    total: usize,
    spread: Duration,
) -> JoinHandle<()> {
    const TASKS: usize = 4;
    let per_task = total.div_ceil(TASKS);
    let pause = spread / u32::try_from(per_task.div_ceil(3)).expect("a modest size");
    let handles: Vec<JoinHandle<()>> = (0..TASKS)
        .map(|task| {
            let (pool, history, due) = (pool.clone(), history.clone(), Arc::clone(due));
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(4840 + task as u64);
                let mut committed = 0;
                let mut t = 0;
                while committed < per_task {
                    t += 1;
                    let n = rng.random_range(1..=5).min(per_task - committed);
                    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
                    // Milliseconds ahead, or none (available at once).
                    let ahead: Vec<Option<i64>> = (0..n)
                        .map(|_| {
                            rng.random_bool(1.0 / 3.0)
                                .then(|| rng.random_range(0..3000))
                        })
                        .collect();
                    let mut tx = pool.begin().await.expect("begin a producer transaction");
                    let rows: Vec<(Uuid, DateTime<Utc>, bool)> = sqlx::query_as(
                        "INSERT INTO outbox (id, aggregate_id, event_type, payload, available_at)
                         SELECT id, $3 || '-' || n, 'fault.test', jsonb_build_object('n', n),
                                now() + coalesce(ms, 0) * interval '1 millisecond'
                         FROM unnest($1::uuid[], $2::int8[]) WITH ORDINALITY AS t(id, ms, n)
                         RETURNING id, available_at, available_at > now()",
                    )
                    .bind(&ids)
                    .bind(&ahead)
                    .bind(format!("delayed-{task}-{t}"))
                    .fetch_all(&mut *tx)
                    .await
                    .expect("insert events");
                    // Held open a moment: a schedule.
                    sleep(millis(rng.random_range(0..20))).await;
                    if t % 7 == 0 {
                        tx.rollback().await.expect("roll back");
                    } else {
                        tx.commit().await.expect("commit");
                        let mut due = dues(&due);
                        for (id, at, future) in rows {
                            if future {
                                due.future.insert(id.to_string(), at);
                            }
                        }
                        drop(due);
                        history.committed(ids.iter().map(Uuid::to_string));
                        committed += n;
                    }
                    // The producers' pace.
                    sleep(pause).await;
                }
            })
        })
        .collect();
    tokio::spawn(async move {
        for handle in handles {
            handle.await.expect("a producer panicked");
        }
    })
}

/// The database's clock now.
async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .expect("read the database's clock")
}

/// A worker of the delays case: claims, "publishes" (records) and acks,
/// and nacks each message with a one-in-eight chance, asking for a retry
/// 100 ms to 1.5 s later; every nack is recorded with its times.
async fn delaying_worker(
    name: String,
    mut conn: Conn,
    (history, pool, due): (History, PgPool, Dues),
    seed: u64,
    stop: CancellationToken,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.is_cancelled() {
        let Some(batch) = conn.claim(&name).await else {
            continue;
        };
        let lease_id = batch.lease_id.clone();
        // The broker's confirms take this long: a schedule.
        sleep(millis(rng.random_range(10..100))).await;
        let (refused, acked): (Vec<String>, Vec<String>) = batch
            .messages
            .iter()
            .map(|m| m.id.clone())
            .partition(|_| rng.random_bool(0.125));
        for id in &acked {
            history.delivered(id.clone(), Some(lease_id.clone()), None);
        }
        if !refused.is_empty() {
            history.expose(refused.clone());
            let retry = millis(rng.random_range(100..1500));
            // The database's clock, which leases and retries are measured
            // by, read just before the nack is sent and just after it is
            // answered: the nack statement's now() lies between the two.
            let sent = db_now(&pool).await;
            conn.nack_after(&name, &lease_id, refused.clone(), retry)
                .await;
            let answered = db_now(&pool).await;
            let mut due = dues(&due);
            for id in refused {
                due.nacks.entry(id).or_default().push(Nacked {
                    lease_id: lease_id.clone(),
                    sent,
                    answered,
                    retry,
                });
            }
        }
        if !acked.is_empty() {
            conn.settle(&name, SettleKind::Ack, &lease_id, acked).await;
        }
    }
}

/// Nacks with backoff and events whose producers set a future
/// `available_at`, mixed into a drain: both leave an event pending below
/// the cursor under a delay row, and each must come back when its delay
/// ends, never before (by the database clock: no claim of an event before
/// its `available_at`, no claim after an accepted nack before the retry it
/// asked for) and not much after (within 5 s), with nothing for the sweep
/// to find. The case also asserts that delay rows were there to test: some
/// were sampled in the lease table, and nacks were accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nacks_with_backoff_and_future_available_at_come_back_when_due_and_never_before() {
    let (events, spread) = if full_form() {
        (9000, secs(30))
    } else {
        (3000, secs(10))
    };
    let case = Case::begin().await;
    let server = Outboxd::start_with(&case.db.url(), free_port(), &SWEEP_EVERY_SECOND).await;
    let targets = Targets::new([server.url()]);
    let due: Dues = Arc::default();
    let history = case.history.clone();
    let workers = Workers::start((0..4).map(|i| {
        let conn = Conn::new(targets.clone(), i, history.clone());
        let shared = (history.clone(), case.db.pool.clone(), Arc::clone(&due));
        move |stop| delaying_worker(format!("worker-{i}"), conn, shared, 4848 + i as u64, stop)
    }));
    let sampler = Sampler::start(&case.db.pool, &case.history);
    let producers = produce_delayed(&case.db.pool, &case.history, &due, events, spread);

    // How many delay rows the lease table held at once, sampled.
    let stop = CancellationToken::new();
    let delays = {
        let (pool, stop) = (case.db.pool.clone(), stop.clone());
        tokio::spawn(async move {
            let mut most = 0;
            while !stop.is_cancelled() {
                let n: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox_leases WHERE delayed")
                    .fetch_one(&pool)
                    .await
                    .expect("count delay rows");
                most = most.max(n);
                // The sampling period.
                sleep(millis(100)).await;
            }
            most
        })
    };
    producers.await.expect("producers");
    drained(&case.db, sampler, Some(workers)).await;
    stop.cancel();
    let most_delayed = delays.await.expect("the delay sampler");
    sweeps_found_nothing(&[&server], "nacks and future available_at").await;

    // Every claim against what it had to wait for.
    let recorded = case.history.recorded();
    let due = std::mem::take(&mut *dues(&due));
    let bound = TimeDelta::from_std(LATE_BOUND).expect("fits");
    let mut claims: HashMap<&str, Vec<(DateTime<Utc>, &str)>> = HashMap::new();
    for c in &recorded.claims {
        for (id, _) in &c.messages {
            claims
                .entry(id.as_str())
                .or_default()
                .push((c.claimed_at, c.lease_id.as_str()));
        }
    }
    for list in claims.values_mut() {
        list.sort();
    }
    let mut problems = Vec::new();
    let mut late_by = TimeDelta::zero();
    for (id, at) in &due.future {
        let Some(&(first, _)) = claims.get(id.as_str()).and_then(|l| l.first()) else {
            problems.push(format!("{id}: due at {at}, never claimed"));
            continue;
        };
        if first < *at {
            problems.push(format!(
                "{id}: claimed at {first}, before its available_at {at}"
            ));
        }
        late_by = late_by.max(first - *at);
    }
    let mut accepted = 0;
    let mut retry_late_by = TimeDelta::zero();
    for (id, nacks) in &due.nacks {
        let list = claims.get(id.as_str()).map_or(&[][..], Vec::as_slice);
        for nack in nacks {
            let outcome = recorded
                .settles
                .iter()
                .filter(|s| s.kind == SettleKind::Nack && s.lease_id == nack.lease_id)
                .flat_map(|s| s.outcomes.iter())
                .find(|(m, _)| m == id)
                .map(|(_, o)| *o);
            if outcome != Some(crate::history::Outcome::Ok) {
                continue;
            }
            accepted += 1;
            let retry = TimeDelta::from_std(nack.retry).expect("fits");
            let Some(i) = list.iter().position(|(_, l)| *l == nack.lease_id) else {
                problems.push(format!(
                    "{id}: nacked under lease {}, which never claimed it",
                    nack.lease_id
                ));
                continue;
            };
            let Some(&(next, _)) = list.get(i + 1) else {
                problems.push(format!(
                    "{id}: nacked (retry after {retry}), never claimed again"
                ));
                continue;
            };
            // The nack's statement ran after it was sent and before it
            // was answered: its retry time lies between these two.
            if next < nack.sent + retry {
                problems.push(format!(
                    "{id}: claimed again at {next}, before the retry its nack asked for \
                     ({retry} after {})",
                    nack.sent
                ));
            }
            retry_late_by = retry_late_by.max(next - (nack.answered + retry));
        }
    }
    assert!(
        problems.is_empty(),
        "{} events were handed out before they were due, or never:\n{}",
        problems.len(),
        problems.join("\n")
    );
    assert!(
        late_by <= bound && retry_late_by <= bound,
        "every delayed event came within {LATE_BOUND:?} of its time: an available_at {late_by} \
         late, a retry {retry_late_by} late"
    );
    let figures = assess(&case, "nacks and future available_at").await;
    assert!(
        !due.future.is_empty() && accepted > 0 && most_delayed > 0,
        "the delays happened: {} events due in the future, {accepted} nacks accepted, \
         at most {most_delayed} delay rows at once",
        due.future.len()
    );
    println!(
        "nacks and future available_at: {} events due later (latest handed out {:.0} ms after \
         its time), {accepted} nacks accepted (latest retry {:.0} ms after its time), up to \
         {most_delayed} delay rows at once, {} events in all",
        due.future.len(),
        late_by.num_milliseconds(),
        retry_late_by.num_milliseconds(),
        figures.events,
    );
    drop(server);
}
