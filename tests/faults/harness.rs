//! The fault suite's harness: a database of its own per case, outboxd as real
//! child processes (so kill -9 is real), producers that commit events straight
//! into the case's database, workers that claim, "publish" (record), ack and
//! sometimes nack over gRPC, a sampler of what is under lease while a fault is
//! on, and the end of every case: drain, read the final table, check.

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::Duration,
};

use chrono::{DateTime, TimeDelta, Utc};
use outboxd::grpc::pb::{
    self, AckRequest, ClaimBatchRequest, GetStatsRequest, MessageResult, NackRequest,
    outbox_service_client::OutboxServiceClient,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use sqlx::PgPool;
use tokio::{
    process::{Child, Command},
    task::JoinHandle,
    time::{Instant, sleep},
};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status, transport::Channel};
use uuid::Uuid;

use crate::{
    history::{self, Claim, Figures, FinalRow, History, Settle, SettleKind},
    shared::{
        bins,
        db::TestDb,
        wait::{millis, secs, wait_until},
    },
};

/// The workers' lease: short, so leases lost to a fault come back within the case.
pub const LEASE: Duration = Duration::from_secs(2);
const WAIT: Duration = Duration::from_secs(1);
const BATCH: u32 = 50;
/// Workers in a case's load.
const WORKERS: usize = 4;
/// A claim's deadline: its long-poll plus room for a slow statement.
const CLAIM_DEADLINE: Duration = Duration::from_secs(4);
const SETTLE_DEADLINE: Duration = Duration::from_secs(3);
/// How long a worker keeps retrying one settle call before leaving its rows
/// to lease expiry, as a worker that gave up would.
const SETTLE_PATIENCE: Duration = Duration::from_secs(20);
/// After a fault ends, how long the sampler keeps recording what is under
/// lease: calls that hung on the fault finish (or are given up) by then.
const AFTERMATH: Duration = Duration::from_millis(2500);

/// What the cases read from their database, beyond what every test can.
impl TestDb {
    /// Events neither published nor dead-lettered.
    pub async fn pending(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await
        .expect("count pending events")
    }

    pub async fn published(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .fetch_one(&self.pool)
            .await
            .expect("count published events")
    }

    /// Terminates every outboxd backend of this database (the LISTEN one
    /// included), nobody else's; returns how many, and whether the listener was one.
    pub async fn terminate_outboxd_backends(&self) -> (i64, bool) {
        sqlx::query_as(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)),
                    coalesce(bool_or(query ILIKE 'LISTEN%'), false)
             FROM pg_stat_activity
             WHERE datname = current_database()
               AND application_name = 'outboxd'
               AND pid <> pg_backend_pid()",
        )
        .fetch_one(&self.pool)
        .await
        .expect("terminate outboxd's backends")
    }

    /// The table at the end of the case.
    pub async fn finals(&self) -> HashMap<String, FinalRow> {
        type Columns = (String, bool, bool, Option<String>, i32, Option<String>);
        let rows: Vec<Columns> = sqlx::query_as(
            "SELECT id::text, published_at IS NOT NULL, dead_lettered_at IS NOT NULL,
                    last_error, attempts, lease_id::text
             FROM outbox",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read the final table");
        rows.into_iter()
            .map(
                |(id, published, dead_lettered, last_error, attempts, lease_id)| {
                    let row = FinalRow {
                        published,
                        dead_lettered,
                        last_error,
                        attempts: u32::try_from(attempts).expect("attempts are never negative"),
                        lease_id,
                    };
                    (id, row)
                },
            )
            .collect()
    }
}

/// Cases take turns: each has the machine to itself.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// One case: its turn on the machine, its database, its history, its clock.
pub struct Case {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    pub began: Instant,
    pub db: Arc<TestDb>,
    pub history: History,
}

impl Case {
    /// Waits for the case's turn, then gives it a database of its own.
    pub async fn begin() -> Self {
        let turn = TURN.lock().await;
        Self {
            _turn: turn,
            began: Instant::now(),
            db: TestDb::create().await,
            history: History::new(),
        }
    }

    /// Workers on `targets`, the sampler, and producers committing `events`
    /// over `spread`: the load the faults hit.
    pub fn load(&self, targets: &Targets, events: usize, spread: Duration) -> Load {
        Load {
            workers: Workers::spawn(WORKERS, targets, &self.history),
            sampler: Sampler::start(&self.db.pool, &self.history),
            producers: produce(&self.db.pool, &self.history, events, spread),
        }
    }
}

/// A case's running load; see [`Case::load`].
pub struct Load {
    pub workers: Workers,
    pub sampler: Sampler,
    producers: JoinHandle<()>,
}

impl Load {
    /// The end of a case under load: the producers finish, the outbox drains,
    /// the workers and the sampler stop, and the history is checked against
    /// the final table.
    pub async fn conclude(self, case: &Case, name: &str) -> Figures {
        self.producers.await.expect("producers");
        drained(&case.db, self.sampler, Some(self.workers)).await;
        assess(case, name).await
    }
}

/// A child process of a case: it logs errors only, to the test's stderr, and
/// is killed when dropped.
pub fn child_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    command
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    command
}

/// outboxd as a child process, killed when dropped.
#[derive(Debug)]
pub struct Outboxd {
    child: Child,
    pub addr: SocketAddr,
}

impl Outboxd {
    /// Starts outboxd on `port` against `database_url` and waits until it serves.
    pub async fn start(database_url: &str, port: u16) -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let child = child_command(bins::outboxd())
            .args(["--database-url", database_url])
            .args(["--listen", &addr.to_string()])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .args(["--poll-interval", "200ms"])
            .args(["--health-interval", "200ms"])
            .args(["--db-acquire-timeout", "1s"])
            .args(["--drain-timeout", "2s"])
            .spawn()
            .expect("spawn outboxd");
        let server = Self { child, addr };
        server.serving().await;
        server
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits until a GetStats answers: the database is reached and migrated.
    async fn serving(&self) {
        let url = self.url();
        wait_until(secs(60), "outboxd serves", async || {
            let Ok(mut client) = OutboxServiceClient::connect(url.clone()).await else {
                return false;
            };
            client.get_stats(GetStatsRequest::default()).await.is_ok()
        })
        .await;
    }

    /// SIGKILL: no drain, no goodbye to PostgreSQL or the clients.
    pub async fn kill9(mut self) {
        self.child.kill().await.expect("kill -9 outboxd");
    }
}

/// The outboxd addresses workers spread over; a worker whose server fails it
/// moves on to the next one.
#[derive(Debug, Clone, Default)]
pub struct Targets(Arc<Mutex<Vec<String>>>);

impl Targets {
    pub fn new(urls: impl IntoIterator<Item = String>) -> Self {
        Self(Arc::new(Mutex::new(urls.into_iter().collect())))
    }

    fn pick(&self, n: usize) -> String {
        let urls = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        urls[n % urls.len()].clone()
    }
}

/// A worker's connection: the target it uses and whether its last call failed.
struct Conn {
    targets: Targets,
    pick: usize,
    client: OutboxServiceClient<Channel>,
    failing: bool,
    history: History,
}

impl Conn {
    fn new(targets: Targets, pick: usize, history: History) -> Self {
        let client = connect_lazy(&targets.pick(pick));
        Self {
            targets,
            pick,
            client,
            failing: false,
            history,
        }
    }

    fn succeeded(&mut self) {
        if std::mem::take(&mut self.failing) {
            self.history.recovered();
        }
    }

    /// After a failed call: a fresh connection to the next target.
    async fn failed(&mut self, status: &Status) {
        let code = status.code();
        assert!(
            !matches!(
                code,
                Code::InvalidArgument
                    | Code::NotFound
                    | Code::OutOfRange
                    | Code::PermissionDenied
                    | Code::Unauthenticated
                    | Code::Unimplemented
            ),
            "a well-formed call was refused: {status:?}"
        );
        self.history.call_failed(format!("{code:?}"));
        self.failing = true;
        self.pick += 1;
        self.client = connect_lazy(&self.targets.pick(self.pick));
        // A worker's back-off before its next call, as a real one would.
        sleep(millis(100)).await;
    }
}

fn connect_lazy(url: &str) -> OutboxServiceClient<Channel> {
    let channel = Channel::from_shared(url.to_owned())
        .expect("a valid URL")
        .connect_timeout(millis(500))
        .connect_lazy();
    OutboxServiceClient::new(channel)
}

/// A request with a gRPC deadline, which the client also enforces itself.
async fn call<T>(
    deadline: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(deadline + millis(200), fut).await {
        Ok(result) => result.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded("the client gave up")),
    }
}

fn request<T>(msg: T, deadline: Duration) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.set_timeout(deadline);
    req
}

fn outcomes(ids: &[String], results: &[MessageResult]) -> Vec<(String, history::Outcome)> {
    assert_eq!(
        results.iter().map(|r| &r.message_id).collect::<Vec<_>>(),
        ids.iter().collect::<Vec<_>>(),
        "one result per id, in request order"
    );
    results
        .iter()
        .map(|r| {
            let outcome = match pb::Outcome::try_from(r.outcome) {
                Ok(pb::Outcome::Ok) => history::Outcome::Ok,
                Ok(pb::Outcome::AlreadyDone) => history::Outcome::AlreadyDone,
                Ok(pb::Outcome::LeaseLost) => history::Outcome::LeaseLost,
                Ok(pb::Outcome::NotFound) => history::Outcome::NotFound,
                Ok(pb::Outcome::DeadLettered) => history::Outcome::DeadLettered,
                _ => panic!("outcome {} for {}", r.outcome, r.message_id),
            };
            (r.message_id.clone(), outcome)
        })
        .collect()
}

fn db_time(ts: Option<prost_types::Timestamp>) -> DateTime<Utc> {
    let ts = ts.expect("a claim with messages has an expiry");
    DateTime::from_timestamp(ts.seconds, u32::try_from(ts.nanos).expect("nanos >= 0"))
        .expect("a timestamp in range")
}

/// The case's workers; `stop` ends them after their current batch.
pub struct Workers {
    stop: CancellationToken,
    handles: Vec<JoinHandle<()>>,
}

impl Workers {
    pub fn spawn(n: usize, targets: &Targets, history: &History) -> Self {
        let stop = CancellationToken::new();
        let handles = (0..n)
            .map(|i| {
                let conn = Conn::new(targets.clone(), i, history.clone());
                tokio::spawn(work(format!("worker-{i}"), conn, stop.clone(), i as u64))
            })
            .collect();
        Self { stop, handles }
    }

    pub async fn stop(self) {
        self.stop.cancel();
        for handle in self.handles {
            handle.await.expect("a worker panicked");
        }
    }
}

/// Claim, publish (record), then ack the batch; now and then nack one message
/// (the broker refused it) or hold the batch past its lease (a slow publish).
async fn work(name: String, mut conn: Conn, stop: CancellationToken, seed: u64) {
    let history = conn.history.clone();
    let mut rng = StdRng::seed_from_u64(seed);
    while !stop.is_cancelled() {
        let req = ClaimBatchRequest {
            outbox: String::new(),
            worker_id: name.clone(),
            max_messages: BATCH,
            lease_duration: Some(LEASE.try_into().expect("fits")),
            wait: Some(WAIT.try_into().expect("fits")),
            acks: Vec::new(),
        };
        let start = history.now();
        let result = call(
            CLAIM_DEADLINE,
            conn.client.claim_batch(request(req, CLAIM_DEADLINE)),
        )
        .await;
        let end = history.now();
        let batch = match result {
            Ok(batch) => {
                conn.succeeded();
                batch
            }
            Err(status) => {
                conn.failed(&status).await;
                continue;
            }
        };
        if batch.messages.is_empty() {
            continue;
        }
        let expires_at = db_time(batch.lease_expires_at);
        let lease_id = batch.lease_id.clone();
        history.claim(Claim {
            worker: name.clone(),
            lease_id: lease_id.clone(),
            messages: batch
                .messages
                .iter()
                .map(|m| (m.id.clone(), m.attempt))
                .collect(),
            start,
            end,
            claimed_at: expires_at - TimeDelta::from_std(LEASE).expect("fits"),
            expires_at,
        });
        let mut ids: Vec<String> = batch.messages.iter().map(|m| m.id.clone()).collect();
        if rng.random_bool(0.03) {
            // A publish slower than the lease: the rows may go to someone else
            // (expired leases are claimed again at the next poll, within 200 ms),
            // and this worker's ack lands while they may hold them.
            history.expose(ids.clone());
            // The slow publish itself: a schedule, not a wait for anything.
            sleep(LEASE + millis(150)).await;
        } else {
            // The broker's confirms take this long: a schedule, not a wait.
            sleep(millis(rng.random_range(10..150))).await;
        }
        let refused: Vec<String> = if rng.random_bool(0.05) {
            ids.drain(..1).collect()
        } else {
            Vec::new()
        };
        for id in &ids {
            history.delivered(id.clone(), Some(lease_id.clone()), None);
        }
        if !refused.is_empty() {
            history.expose(refused.clone());
            settle(&mut conn, &name, SettleKind::Nack, &lease_id, refused).await;
        }
        if !ids.is_empty() {
            settle(&mut conn, &name, SettleKind::Ack, &lease_id, ids).await;
        }
    }
}

/// One settle call, repeated on failure (a repeated ack is ALREADY_DONE)
/// for up to `SETTLE_PATIENCE`; every try is recorded.
async fn settle(conn: &mut Conn, worker: &str, kind: SettleKind, lease_id: &str, ids: Vec<String>) {
    let history = conn.history.clone();
    let give_up = Instant::now() + SETTLE_PATIENCE;
    loop {
        let start = history.now();
        let result = match kind {
            SettleKind::Ack => {
                let req = AckRequest {
                    outbox: String::new(),
                    lease_id: lease_id.into(),
                    message_ids: ids.clone(),
                };
                call(
                    SETTLE_DEADLINE,
                    conn.client.ack(request(req, SETTLE_DEADLINE)),
                )
                .await
                .map(|r| r.results)
            }
            SettleKind::Nack => {
                let req = NackRequest {
                    outbox: String::new(),
                    lease_id: lease_id.into(),
                    message_ids: ids.clone(),
                    error: "the broker refused it".into(),
                    retry_after: Some(millis(100).try_into().expect("fits")),
                    dead_letter: false,
                };
                call(
                    SETTLE_DEADLINE,
                    conn.client.nack(request(req, SETTLE_DEADLINE)),
                )
                .await
                .map(|r| r.results)
            }
        };
        let end = history.now();
        let outcomes = match &result {
            Ok(results) => outcomes(&ids, results),
            Err(_) => ids
                .iter()
                .map(|id| (id.clone(), history::Outcome::Unknown))
                .collect(),
        };
        history.settle(Settle {
            kind,
            worker: worker.into(),
            lease_id: lease_id.into(),
            start,
            end,
            outcomes,
        });
        match result {
            Ok(_) => {
                conn.succeeded();
                return;
            }
            Err(status) => conn.failed(&status).await,
        }
        if Instant::now() >= give_up {
            return;
        }
    }
}

/// Producers: `tasks` tasks commit `total` events between them in transactions
/// of ten, spread over `spread`; every seventh transaction rolls back.
pub fn produce(pool: &PgPool, history: &History, total: usize, spread: Duration) -> JoinHandle<()> {
    const TASKS: usize = 4;
    const PER_TX: usize = 10;
    let txs = total.div_ceil(TASKS * PER_TX);
    let pause = spread / u32::try_from(txs).expect("a modest size");
    let handles: Vec<JoinHandle<()>> = (0..TASKS)
        .map(|task| {
            let (pool, history) = (pool.clone(), history.clone());
            tokio::spawn(async move {
                let mut committed = 0;
                let mut t = 0;
                while committed < txs {
                    t += 1;
                    let ids: Vec<Uuid> = (0..PER_TX).map(|_| Uuid::new_v4()).collect();
                    let mut tx = pool.begin().await.expect("begin");
                    sqlx::query(
                        "INSERT INTO outbox (id, aggregate_id, event_type, payload)
                         SELECT id, 'agg-' || $2 || '-' || n, 'fault.test', jsonb_build_object('n', n)
                         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)",
                    )
                    .bind(&ids)
                    .bind(task.to_string())
                    .execute(&mut *tx)
                    .await
                    .expect("insert events");
                    if t % 7 == 0 {
                        tx.rollback().await.expect("rollback");
                    } else {
                        tx.commit().await.expect("commit");
                        history.committed(ids.iter().map(Uuid::to_string));
                        committed += 1;
                    }
                    // The producers' pace: `total` events spread over `spread`.
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

/// Commits `n` events in one transaction: a backlog that appears at once.
pub async fn burst(pool: &PgPool, history: &History, n: usize) {
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload)
         SELECT id, 'burst-' || n, 'fault.test', jsonb_build_object('n', n)
         FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n)",
    )
    .bind(&ids)
    .execute(pool)
    .await
    .expect("insert a burst");
    history.committed(ids.iter().map(Uuid::to_string));
}

/// Records what is under a live lease while a fault is on and for a while
/// after it: those events may be claimed again, the others may not.
pub struct Sampler {
    until: Arc<Mutex<Option<Instant>>>,
    stop: CancellationToken,
    task: JoinHandle<()>,
    pool: PgPool,
    history: History,
}

/// Adds the rows under a live lease to the exposed ones.
async fn sample(pool: &PgPool, history: &History) {
    let leased: Vec<String> = sqlx::query_scalar(
        "SELECT id::text FROM outbox
         WHERE published_at IS NULL AND dead_lettered_at IS NULL AND locked_until > now()",
    )
    .fetch_all(pool)
    .await
    .expect("sample the leased rows");
    history.expose(leased);
}

fn until(m: &Mutex<Option<Instant>>) -> MutexGuard<'_, Option<Instant>> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sampler {
    pub fn start(pool: &PgPool, history: &History) -> Self {
        let until_at = Arc::new(Mutex::new(None::<Instant>));
        let stop = CancellationToken::new();
        let task = {
            let (pool, history, until_at, stop) = (
                pool.clone(),
                history.clone(),
                Arc::clone(&until_at),
                stop.clone(),
            );
            tokio::spawn(async move {
                while !stop.is_cancelled() {
                    if until(&until_at).is_some_and(|t| Instant::now() < t) {
                        sample(&pool, &history).await;
                    }
                    // The sampling period.
                    sleep(millis(100)).await;
                }
            })
        };
        Self {
            until: until_at,
            stop,
            task,
            pool: pool.clone(),
            history: history.clone(),
        }
    }

    /// A fault begins: what is under lease now, and from now on, is exposed.
    pub async fn begin(&self, what: impl Into<String>) {
        self.history.fault(what);
        sample(&self.pool, &self.history).await;
        *until(&self.until) = Some(Instant::now() + secs(3600));
    }

    /// The fault is over: keep sampling through its aftermath.
    pub fn end(&self) {
        *until(&self.until) = Some(Instant::now() + AFTERMATH);
    }

    pub async fn stop(self) {
        let left = until(&self.until).map(|t| t.saturating_duration_since(Instant::now()));
        // A window: the last fault's aftermath is sampled to its end.
        sleep(left.unwrap_or_default()).await;
        self.stop.cancel();
        self.task.await.expect("the sampler panicked");
    }
}

/// Waits until every committed event is settled, then stops the sampler and the workers.
pub async fn drained(db: &TestDb, sampler: Sampler, workers: Option<Workers>) {
    wait_until(secs(120), "every committed event is settled", async || {
        db.pending().await == 0
    })
    .await;
    sampler.stop().await;
    if let Some(workers) = workers {
        workers.stop().await;
    }
}

/// Checks the history against the final table and prints the case's figures.
pub async fn assess(case: &Case, name: &str) -> Figures {
    let finals = case.db.finals().await;
    let recorded = case.history.recorded();
    let verdict = history::check(&recorded, &finals);
    let f = &verdict.figures;
    let codes: &BTreeMap<String, usize> = &recorded.codes;
    println!(
        "fault case {name}: {} events, {} deliveries, {} duplicates, {} claimed more than once \
         (bound: {} under lease at a fault), {} stale acks fenced, {} dead-lettered, {} faults injected, {} recoveries \
         ({} failed calls {codes:?}, slowest settle {:.2}s), {:.1}s",
        f.events,
        f.deliveries,
        f.duplicates,
        f.claimed_twice,
        f.exposed,
        f.fenced,
        f.dead_lettered,
        f.faults,
        f.recoveries,
        f.failed_calls,
        f.slowest_settle.as_secs_f64(),
        case.began.elapsed().as_secs_f64()
    );
    assert!(
        verdict.violations.is_empty(),
        "fault case {name}: {} violations\n{}",
        verdict.violations.len(),
        verdict.report
    );
    verdict.figures
}
