//! Per-aggregate order end to end (issue #33): four workers claim from an
//! ordered outbox and publish to RabbitMQ with publisher confirms, refusing a
//! message now and then (a nack), sitting on a batch past its lease now and
//! then (it expires and goes to someone else), while producers commit
//! overlapping transactions over a few hundred aggregates and outboxd is
//! killed and restarted once. A consumer reads the queue: every aggregate's
//! events, first deliveries, arrive in `sequence` order. The history checker
//! holds the run to the lease rules and to per-aggregate order as the workers
//! saw it as well.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use lapin::{
    BasicProperties, Connection, ConnectionProperties,
    options::{BasicPublishOptions, ConfirmSelectOptions},
    types::{AMQPValue, FieldTable},
};
use outboxd::grpc::pb::{ClaimBatchResponse, OutboxMessage};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sqlx::PgPool;
use tokio::{task::JoinHandle, time::sleep};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{
    harness::{Case, Conn, LEASE, Outboxd, Sampler, Targets, Workers, assess_ordered, drained},
    history::{self, History, Recorded, SettleKind},
    shared::{
        net::free_port,
        rabbit::{AMQP_URL, Rabbit},
        wait::{millis, poll_until, secs},
    },
};

const EVENTS: usize = 3000;
const AGGREGATES: usize = 300;
const WORKERS: usize = 4;
/// The producers' pace: `EVENTS` committed over about this long.
const SPREAD: Duration = Duration::from_secs(12);
/// Far above what the random nacks and expiries add up to: nothing is
/// dead-lettered, so every event must arrive.
const OUTBOX: [&str; 2] = [
    "--outbox",
    "default=public.outbox:ordering=aggregate:max_attempts=100",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn four_workers_through_nacks_expiries_and_a_restart_deliver_each_aggregate_in_order() {
    let case = Case::begin().await;
    let (db, history) = (&case.db, &case.history);
    let port = free_port();
    let mut server = Outboxd::start_with(&db.url(), port, &OUTBOX).await;
    let rabbit = Rabbit::bound("#").await;
    let sampler = Sampler::start(&db.pool, history);
    let tally = Arc::new(Tally::default());
    let workers = spawn_workers(&server.url(), &rabbit.exchange, history, &tally).await;
    let commits = Commits::default();
    let producers = produce(&db.pool, history, &commits);

    // The fault: once a third of the events are out, kill -9 and restart.
    poll_until(
        secs(60),
        millis(20),
        "a third of the events are published",
        async || db.published().await >= i64::try_from(EVENTS / 3).expect("small"),
    )
    .await;
    sampler.begin("kill -9 outboxd").await;
    server.kill9().await;
    let at_restart = db.published().await;
    server = Outboxd::start_with(&db.url(), port, &OUTBOX).await;
    sampler.end();

    producers.await.expect("the producers panicked");
    drained(db, sampler, None).await;
    workers.stop().await;
    let received = rabbit.drain().await;
    for message in &received {
        let attempt = message
            .headers
            .get("x-outbox-attempt")
            .map(|a| a.parse().expect("x-outbox-attempt is a number"));
        history.delivered(message.message_id.clone(), None, attempt);
    }
    // The lease rules, as in every fault case, and per-aggregate order as the
    // workers saw it (their claims and acks); the broker's side follows.
    let figures = assess_ordered(&case, "ordered, nacks, expiries and a restart").await;

    let rows = rows(&db.pool).await;
    let recorded = history.recorded();
    assert_eq!(recorded.committed.len(), EVENTS, "the producers' total");
    let arrived: Vec<&str> = received.iter().map(|m| m.message_id.as_str()).collect();
    let order = first_deliveries_in_order(&arrived, &rows);
    let early = handed_out_before_the_events_ahead(&recorded, &rows);
    let mixed = batches_sharing_an_aggregate(&recorded, &rows);

    let nacked = accepted_nacks(&recorded);
    let abandoned = tally.abandoned();
    let reclaimed = abandoned
        .iter()
        .filter(|(id, attempt)| claimed_later(&recorded, id, *attempt))
        .count();
    let widest = recorded
        .claims
        .iter()
        .map(|c| c.messages.len())
        .max()
        .unwrap_or(0);
    println!(
        "ordered fault case: {} events over {AGGREGATES} aggregates, {} received ({} duplicates), \
         {nacked} nacks, {} batches sat on past the lease ({reclaimed} of their {} events claimed again), \
         {at_restart} published at the restart, {} recoveries, widest batch {widest}, {:.1}s",
        recorded.committed.len(),
        received.len(),
        received.len().saturating_sub(rows.len()),
        tally.sat_on(),
        abandoned.len(),
        figures.recoveries,
        case.began.elapsed().as_secs_f64(),
    );

    let mut offending: Vec<&str> = order
        .iter()
        .chain(&early)
        .chain(&mixed)
        .map(|p| p.0)
        .collect();
    offending.sort_unstable();
    offending.dedup();
    assert!(
        offending.is_empty(),
        "first deliveries out of sequence order:\n{}\n\
         events handed out before an event ahead of them was acked:\n{}\n\
         claims with two events of one aggregate:\n{}\n\
         what happened to those aggregates:\n{}",
        lines(&order),
        lines(&early),
        lines(&mixed),
        offending
            .iter()
            .take(5)
            .map(|a| timeline(
                a,
                &recorded,
                &rows,
                &commits.lock().unwrap_or_else(PoisonError::into_inner),
                &arrived
            ))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The run did what it claims to test.
    assert!(nacked > 0, "no nack was accepted");
    assert!(
        tally.sat_on() > 0,
        "no worker sat on a batch past its lease"
    );
    assert_eq!(
        reclaimed,
        abandoned.len(),
        "every event of a batch sat on past its lease was claimed again: {abandoned:?}"
    );
    assert!(
        at_restart < i64::try_from(EVENTS).expect("small"),
        "the restart came after the run: {at_restart} published"
    );
    let restarted_at = recorded.faults.first().expect("the restart is recorded").0;
    let claims_after = recorded
        .claims
        .iter()
        .filter(|c| c.start > restarted_at)
        .count();
    assert!(
        claims_after > 0,
        "no events were handed out by the restarted outboxd"
    );
    assert!(
        widest > 1,
        "no claim held more than one aggregate: no parallelism tested"
    );
    drop(server);
}

/// Every committed event's aggregate and sequence, by id.
async fn rows(pool: &PgPool) -> HashMap<String, (String, i64)> {
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT id::text, aggregate_id, seq FROM outbox")
            .fetch_all(pool)
            .await
            .expect("read the outbox");
    rows.into_iter()
        .map(|(id, aggregate, seq)| (id, (aggregate, seq)))
        .collect()
}

/// Problems found, each with the aggregate it is about.
type Problems<'a> = Vec<(&'a str, String)>;

fn lines(problems: &Problems<'_>) -> String {
    if problems.is_empty() {
        return "  none".into();
    }
    problems
        .iter()
        .map(|(_, p)| format!("  {p}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Aggregates whose first deliveries (in the queue's order) are not in
/// `sequence` order, and events that never arrived.
fn first_deliveries_in_order<'a>(
    arrived: &[&'a str],
    rows: &'a HashMap<String, (String, i64)>,
) -> Problems<'a> {
    let mut seen = HashSet::new();
    let mut firsts: BTreeMap<&str, Vec<(i64, &str)>> = BTreeMap::new();
    for id in arrived {
        if seen.insert(*id) {
            let (aggregate, seq) = rows
                .get(*id)
                .unwrap_or_else(|| panic!("{id} arrived but is not in the table"));
            firsts.entry(aggregate).or_default().push((*seq, id));
        }
    }
    let mut problems: Problems<'a> = rows
        .iter()
        .filter(|(id, _)| !seen.contains(id.as_str()))
        .map(|(id, (aggregate, seq))| {
            (
                aggregate.as_str(),
                format!("{id} ({aggregate}, seq {seq}) never arrived"),
            )
        })
        .collect();
    for (aggregate, list) in firsts {
        if list.windows(2).any(|w| w[0].0 > w[1].0) {
            let seqs: Vec<i64> = list.iter().map(|(seq, _)| *seq).collect();
            problems.push((
                aggregate,
                format!("{aggregate}: first deliveries by sequence {seqs:?}"),
            ));
        }
    }
    problems
}

/// Claims that handed out an event while an event of its aggregate with a
/// lower sequence could not have been published yet: the claim's answer
/// came back before any ack of that event had been sent.
fn handed_out_before_the_events_ahead<'a>(
    rec: &Recorded,
    rows: &'a HashMap<String, (String, i64)>,
) -> Problems<'a> {
    // The earliest start of an ack that may have published each event.
    let mut published_from: HashMap<&str, Duration> = HashMap::new();
    for s in rec.settles.iter().filter(|s| s.kind == SettleKind::Ack) {
        for (id, outcome) in &s.outcomes {
            if matches!(
                outcome,
                history::Outcome::Ok | history::Outcome::AlreadyDone | history::Outcome::Unknown
            ) {
                let at = published_from.entry(id).or_insert(s.start);
                *at = (*at).min(s.start);
            }
        }
    }
    let mut by_aggregate: HashMap<&str, Vec<(i64, &str)>> = HashMap::new();
    for (id, (aggregate, seq)) in rows {
        by_aggregate.entry(aggregate).or_default().push((*seq, id));
    }
    let mut problems = Vec::new();
    for claim in &rec.claims {
        for (id, attempt) in &claim.messages {
            let (aggregate, seq) = &rows[id];
            for (ahead_seq, ahead) in &by_aggregate[aggregate.as_str()] {
                if ahead_seq >= seq {
                    continue;
                }
                let acked = published_from.get(ahead).copied();
                if acked.is_none_or(|at| claim.end < at) {
                    problems.push((aggregate.as_str(), format!(
                        "{aggregate}: lease {} got {id} (seq {seq}, attempt {attempt}) at {:?}, \
                         before {ahead} (seq {ahead_seq}) was acked (first ack sent at {acked:?})",
                        claim.lease_id, claim.end
                    )));
                }
            }
        }
    }
    problems
}

fn batches_sharing_an_aggregate<'a>(
    rec: &Recorded,
    rows: &'a HashMap<String, (String, i64)>,
) -> Problems<'a> {
    let mut problems = Vec::new();
    for c in &rec.claims {
        let mut aggregates = HashSet::new();
        for (id, _) in &c.messages {
            let aggregate = rows[id].0.as_str();
            if !aggregates.insert(aggregate) {
                problems.push((
                    aggregate,
                    format!("lease {} holds two of {aggregate}", c.lease_id),
                ));
            }
        }
    }
    problems
}

/// Everything recorded about `aggregate`'s events, in time order: commits,
/// claims, settles, faults, and the order its events arrived in.
fn timeline(
    aggregate: &str,
    rec: &Recorded,
    rows: &HashMap<String, (String, i64)>,
    commits: &HashMap<String, (Duration, Duration)>,
    arrived: &[&str],
) -> String {
    let seq = |id: &str| {
        rows.get(id)
            .filter(|(a, _)| a == aggregate)
            .map(|(_, s)| *s)
    };
    let mut entries: Vec<(Duration, String)> = Vec::new();
    for (id, (inserted, committed)) in commits {
        if let Some(seq) = seq(id) {
            entries.push((
                *inserted,
                format!("seq {seq} inserted (its transaction began before)"),
            ));
            entries.push((*committed, format!("seq {seq} committed")));
        }
    }
    for c in &rec.claims {
        for (id, attempt) in &c.messages {
            if let Some(seq) = seq(id) {
                entries.push((
                    c.end,
                    format!(
                        "seq {seq} claimed as attempt {attempt} by {} under {} (call began {:?}; db {} .. {})",
                        c.worker, c.lease_id, c.start, c.claimed_at, c.expires_at
                    ),
                ));
            }
        }
    }
    for s in &rec.settles {
        for (id, outcome) in &s.outcomes {
            if let Some(seq) = seq(id) {
                entries.push((
                    s.start,
                    format!(
                        "seq {seq} {:?} by {} under {} -> {outcome:?} (answered {:?})",
                        s.kind, s.worker, s.lease_id, s.end
                    ),
                ));
            }
        }
    }
    for (at, what) in &rec.faults {
        entries.push((*at, format!("fault: {what}")));
    }
    entries.sort_by_key(|(at, _)| *at);
    let arrivals: Vec<String> = arrived
        .iter()
        .filter_map(|id| seq(id))
        .map(|s| s.to_string())
        .collect();
    let mut out = format!("{aggregate}:\n");
    for (at, what) in entries {
        out.push_str(&format!("  {:>9.3}s {what}\n", at.as_secs_f64()));
    }
    out.push_str(&format!("  arrived, by sequence: {}\n", arrivals.join(" ")));
    out
}

fn accepted_nacks(rec: &Recorded) -> usize {
    rec.settles
        .iter()
        .filter(|s| s.kind == SettleKind::Nack)
        .flat_map(|s| &s.outcomes)
        .filter(|(_, o)| *o == history::Outcome::Ok)
        .count()
}

fn claimed_later(rec: &Recorded, id: &str, attempt: u32) -> bool {
    rec.claims
        .iter()
        .flat_map(|c| &c.messages)
        .any(|(claimed, a)| claimed == id && *a > attempt)
}

// ---- producers ----

/// Four producers commit `EVENTS` events between them over `SPREAD`, in
/// transactions of one to five events of random aggregates, each held open a
/// moment, so transactions that write one aggregate overlap and commit out
/// of `sequence` order; every seventh transaction rolls back.
/// When each committed event was inserted and committed, by the history's clock.
type Commits = Arc<Mutex<HashMap<String, (Duration, Duration)>>>;

fn produce(pool: &PgPool, history: &History, commits: &Commits) -> JoinHandle<()> {
    const TASKS: usize = 4;
    let per_task = EVENTS / TASKS;
    // Three events a transaction on average.
    let pause = SPREAD / u32::try_from(per_task / 3).expect("a modest size");
    let handles: Vec<JoinHandle<()>> = (0..TASKS)
        .map(|task| {
            let (pool, history, commits) = (pool.clone(), history.clone(), Arc::clone(commits));
            tokio::spawn(async move {
                let mut rng = StdRng::seed_from_u64(1000 + task as u64);
                let mut committed = 0;
                let mut t = 0;
                while committed < per_task {
                    t += 1;
                    let n = rng.random_range(1..=5).min(per_task - committed);
                    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
                    let aggregates: Vec<String> = (0..n)
                        .map(|_| format!("agg-{:03}", rng.random_range(0..AGGREGATES)))
                        .collect();
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query(
                        "INSERT INTO outbox (id, aggregate_id, event_type, payload)
                         SELECT id, aggregate, 'order.test', jsonb_build_object('n', n)
                         FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS t(id, aggregate, n)",
                    )
                    .bind(&ids)
                    .bind(&aggregates)
                    .execute(&mut *tx)
                    .await
                    .expect("insert events");
                    let inserted = history.now();
                    // Held open while others insert and commit: a schedule.
                    sleep(millis(rng.random_range(0..40))).await;
                    if t % 7 == 0 {
                        tx.rollback().await.expect("rollback");
                    } else {
                        tx.commit().await.expect("commit");
                        let at = history.now();
                        commits
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .extend(ids.iter().map(|id| (id.to_string(), (inserted, at))));
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

// ---- workers ----

/// What the workers did on purpose, for the checks that the run did it.
#[derive(Debug, Default)]
struct Tally {
    inner: Mutex<TallyInner>,
}

#[derive(Debug, Default)]
struct TallyInner {
    sat_on: usize,
    /// Events of batches sat on past their lease, with the attempt they were
    /// handed out as.
    abandoned: Vec<(String, u32)>,
}

impl Tally {
    fn sat_on_batch(&self, batch: &ClaimBatchResponse) {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        inner.sat_on += 1;
        inner
            .abandoned
            .extend(batch.messages.iter().map(|m| (m.id.clone(), m.attempt)));
    }

    fn sat_on(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sat_on
    }

    fn abandoned(&self) -> Vec<(String, u32)> {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .abandoned
            .clone()
    }
}

/// The ordered case's workers, on the one outboxd (the harness's claims and
/// settles, with the harness's short lease: a batch sat on past it goes to
/// another worker within the case), each publishing to RabbitMQ.
async fn spawn_workers(
    url: &str,
    exchange: &str,
    history: &History,
    tally: &Arc<Tally>,
) -> Workers {
    let mut workers = Vec::new();
    for i in 0..WORKERS {
        workers.push(Worker {
            name: format!("ordered-{i}"),
            conn: Conn::new(Targets::new([url.to_owned()]), 0, history.clone()),
            broker: Broker::connect(exchange).await,
            history: history.clone(),
            tally: Arc::clone(tally),
            rng: StdRng::seed_from_u64(i as u64),
        });
    }
    Workers::start(workers.into_iter().map(|w| move |stop| w.run(stop)))
}

/// A worker's own connection to RabbitMQ, with a channel in confirm mode.
struct Broker {
    _conn: Connection,
    channel: lapin::Channel,
    exchange: String,
}

impl Broker {
    async fn connect(exchange: &str) -> Self {
        let conn = Connection::connect(AMQP_URL, ConnectionProperties::default())
            .await
            .expect("RabbitMQ at 127.0.0.1:5672 (scripts/test starts it)");
        let channel = conn.create_channel().await.expect("a channel");
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("confirm mode");
        Self {
            _conn: conn,
            channel,
            exchange: exchange.to_owned(),
        }
    }

    /// Publishes `messages` and waits for the broker's confirms; the ids it
    /// confirmed, and the ones it did not.
    async fn publish(&self, messages: &[&OutboxMessage]) -> (Vec<String>, Vec<String>) {
        let mut sent = Vec::new();
        for m in messages {
            let mut headers = FieldTable::default();
            headers.insert(
                "x-outbox-attempt".into(),
                AMQPValue::LongLongInt(i64::from(m.attempt)),
            );
            headers.insert(
                "x-outbox-sequence".into(),
                AMQPValue::LongLongInt(m.sequence),
            );
            let props = BasicProperties::default()
                .with_message_id(m.id.as_str().into())
                .with_delivery_mode(2)
                .with_headers(headers);
            let confirm = self
                .channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    m.aggregate_id.as_str().into(),
                    BasicPublishOptions {
                        mandatory: true,
                        ..BasicPublishOptions::default()
                    },
                    &m.payload,
                    props,
                )
                .await;
            sent.push((m.id.clone(), confirm));
        }
        let (mut confirmed, mut refused) = (Vec::new(), Vec::new());
        for (id, confirm) in sent {
            let ok = match confirm {
                Ok(confirm) => matches!(
                    tokio::time::timeout(secs(5), confirm).await,
                    Ok(Ok(lapin::Confirmation::Ack(None)))
                ),
                Err(_) => false,
            };
            if ok {
                confirmed.push(id);
            } else {
                refused.push(id);
            }
        }
        (confirmed, refused)
    }
}

struct Worker {
    name: String,
    conn: Conn,
    broker: Broker,
    history: History,
    tally: Arc<Tally>,
    rng: StdRng,
}

impl Worker {
    /// Claim, publish with confirms, ack; now and then the broker refuses a
    /// message (nacked, for a retry) or the worker sits on its batch past
    /// the lease and drops it (a stalled worker: someone else delivers it).
    async fn run(mut self, stop: CancellationToken) {
        let mut batches = 0u32;
        while !stop.is_cancelled() {
            let Some(batch) = self.conn.claim(&self.name).await else {
                continue;
            };
            batches += 1;
            // Every worker's third batch, and one in fifty after that.
            if batches == 3 || self.rng.random_bool(0.02) {
                self.tally.sat_on_batch(&batch);
                self.history
                    .expose(batch.messages.iter().map(|m| m.id.clone()));
                // Stalled past the lease: a schedule, not a wait for anything.
                sleep(LEASE + millis(300)).await;
                continue;
            }
            // The broker refuses one in twenty, and the first of every
            // worker's second batch.
            let (mut refuse, mut publish) = (Vec::new(), Vec::new());
            for (i, m) in batch.messages.iter().enumerate() {
                if (batches == 2 && i == 0) || self.rng.random_bool(0.05) {
                    refuse.push(m.id.clone());
                } else {
                    publish.push(m);
                }
            }
            let (confirmed, unconfirmed) = self.broker.publish(&publish).await;
            refuse.extend(unconfirmed);
            if !refuse.is_empty() {
                self.history.expose(refuse.clone());
                self.conn
                    .settle(&self.name, SettleKind::Nack, &batch.lease_id, refuse)
                    .await;
            }
            if !confirmed.is_empty() {
                self.conn
                    .settle(&self.name, SettleKind::Ack, &batch.lease_id, confirmed)
                    .await;
            }
        }
    }
}
