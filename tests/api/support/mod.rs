//! The test harness: a fresh database per test, an outboxd server on port 0 that
//! reaches PostgreSQL through a cuttable proxy, gRPC clients, and helpers that
//! play producer (SQL inserts) and relay worker (RPCs).

pub mod otlp;
mod proxy;

use std::{
    future::Future,
    net::SocketAddr,
    sync::{Arc, Once},
    time::Duration,
};

use chrono::{DateTime, Utc};
use outboxd::{
    config::{Cli, Config},
    grpc::pb::{
        self, AckRequest, ClaimBatchRequest, ClaimBatchResponse, ExtendLeaseRequest,
        ExtendLeaseResponse, GetStatsRequest, GetStatsResponse, MessageResult, NackRequest,
        Outcome, outbox_service_client::OutboxServiceClient,
    },
    server::Server,
};
use serde_json::{Value, json};
use sqlx::{AssertSqlSafe, Connection, PgConnection, PgPool, postgres::PgPoolOptions};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::{Status, transport::Channel};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use url::Url;
use uuid::Uuid;

pub use proxy::Proxy;

pub type Client = OutboxServiceClient<Channel>;

/// Where tests create and drop their databases.
pub const DEFAULT_ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// Longest any single RPC or SQL helper may take before the test fails loudly
/// instead of hanging.
const RPC_GUARD: Duration = Duration::from_secs(30);

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A wire duration from seconds, negative ones included.
pub fn wire(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
    Some(prost_types::Duration { seconds, nanos })
}

/// A wire duration from a `Duration`.
pub fn dur(d: Duration) -> Option<prost_types::Duration> {
    Some(prost_types::Duration::try_from(d).expect("test durations fit a protobuf Duration"))
}

fn admin_url() -> Url {
    let raw = std::env::var("OUTBOXD_TEST_ADMIN_URL").unwrap_or_else(|_| DEFAULT_ADMIN_URL.into());
    Url::parse(&raw).expect("OUTBOXD_TEST_ADMIN_URL must be a postgres:// URL")
}

fn init_tracing() {
    use tracing_subscriber::{Layer, layer::SubscriberExt, util::SubscriberInitExt};
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        // The test writer: logs show with a failing test's output, not on every run.
        let lines = tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(filter);
        // Spans go to the in-process collector, whatever the log level.
        let spans = tracing_opentelemetry::layer()
            .with_tracer(otlp::collector().tracer.clone())
            .with_filter(tracing_subscriber::filter::LevelFilter::INFO);
        let _ = tracing_subscriber::registry()
            .with(lines)
            .with(spans)
            .try_init();
    });
}
/// Awaits `fut`, failing the test if it takes longer than `limit`.
pub async fn within<T>(limit: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {limit:?}"),
    }
}

/// Polls `condition` until it holds, failing the test after `limit`.
pub async fn wait_until(limit: Duration, what: &str, mut condition: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {limit:?} waiting until {what}");
        }
        tokio::time::sleep(millis(20)).await;
    }
}

/// A database of its own for one test, dropped when the last handle goes,
/// also when the test panics.
#[derive(Debug)]
pub struct TestDb {
    pub name: String,
    /// Direct connection to the test database, for the test's own SQL.
    pub pool: PgPool,
    url: Url,
    admin: Url,
}

impl TestDb {
    pub async fn create() -> Arc<Self> {
        init_tracing();
        let admin = admin_url();
        let name = format!("outboxd_test_{}", Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(admin.as_str())
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "cannot reach PostgreSQL at {}:{} ({e}); start it with \
                 `pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start` \
                 or point OUTBOXD_TEST_ADMIN_URL at a server",
                    admin.host_str().unwrap_or("?"),
                    admin.port().unwrap_or(5432),
                )
            });
        sqlx::query(AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&mut conn)
            .await
            .expect("create the test database");
        let _ = conn.close().await;
        let mut url = admin.clone();
        url.set_path(&name);
        let pool = PgPoolOptions::new()
            .max_connections(10)
            .connect(url.as_str())
            .await
            .expect("connect to the test database");
        Arc::new(Self {
            name,
            pool,
            url,
            admin,
        })
    }

    /// The PostgreSQL server's address, where the proxy forwards to.
    pub fn upstream(&self) -> SocketAddr {
        self.url
            .socket_addrs(|| Some(5432))
            .expect("resolve the PostgreSQL host")
            .into_iter()
            .next()
            .expect("the PostgreSQL host has an address")
    }

    /// The test database's URL, straight to PostgreSQL.
    pub fn url(&self) -> String {
        self.url.to_string()
    }

    /// The test database's URL with its host and port replaced by `addr`.
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let mut url = self.url.clone();
        url.set_host(Some(&addr.ip().to_string()))
            .expect("an IP address is a valid host");
        url.set_port(Some(addr.port()))
            .expect("a postgres URL takes a port");
        url.to_string()
    }

    pub async fn execute(&self, sql: &str) {
        sqlx::raw_sql(AssertSqlSafe(sql.to_owned()))
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("test SQL failed: {e}\n{sql}"));
    }

    pub async fn scalar_i64(&self, sql: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql.to_owned()))
            .fetch_one(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("test SQL failed: {e}\n{sql}"))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin = self.admin.to_string();
        let name = self.name.clone();
        // Drop may run inside a runtime (or while a test unwinds), so the cleanup
        // gets a thread and a runtime of its own.
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = PgConnection::connect(&admin)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::query(AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
                let _ = conn.close().await;
                Ok(())
            })
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("warning: could not drop test database {}: {e}", self.name),
            Err(_) => eprintln!("warning: dropping test database {} panicked", self.name),
        }
    }
}

/// Command-line arguments for a test server; later settings replace earlier ones.
#[derive(Debug, Clone)]
pub struct ServerArgs {
    args: Vec<(String, Option<String>)>,
}

impl ServerArgs {
    fn new(database_url: String) -> Self {
        let mut args = Self { args: Vec::new() };
        args.set("--database-url", database_url)
            .set("--listen", "127.0.0.1:0")
            .set("--metrics-listen", "127.0.0.1:0")
            .set("--poll-interval", "500ms")
            .set("--health-interval", "200ms")
            .set("--db-acquire-timeout", "1s")
            .set("--drain-timeout", "5s");
        args
    }

    /// Sets a single-valued flag, replacing any earlier value.
    pub fn set(&mut self, flag: &str, value: impl Into<String>) -> &mut Self {
        self.args.retain(|(f, _)| f != flag);
        self.add(flag, value)
    }

    /// Adds one value of a repeatable flag (`--outbox`).
    pub fn add(&mut self, flag: &str, value: impl Into<String>) -> &mut Self {
        self.args.push((flag.to_owned(), Some(value.into())));
        self
    }

    /// Adds a boolean flag (`--no-migrate`).
    pub fn flag(&mut self, flag: &str) -> &mut Self {
        self.args.push((flag.to_owned(), None));
        self
    }

    fn argv(&self) -> Vec<String> {
        let mut argv = vec!["outboxd".to_owned()];
        for (flag, value) in &self.args {
            argv.push(flag.clone());
            argv.extend(value.clone());
        }
        argv
    }
}

/// The server configuration a test asks for, parsed and validated like the binary does.
pub fn config_for(
    db: &TestDb,
    database: SocketAddr,
    customize: impl FnOnce(&mut ServerArgs),
) -> Config {
    let mut args = ServerArgs::new(db.url_via(database));
    customize(&mut args);
    let argv = args.argv();
    let cli = <Cli as clap::Parser>::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("test server arguments {argv:?} do not parse: {e}"));
    cli.serve
        .validate()
        .unwrap_or_else(|e| panic!("test server arguments {argv:?} are invalid: {e}"))
}

/// One running outboxd, its clients and its database.
#[derive(Debug)]
pub struct TestApp {
    pub addr: SocketAddr,
    /// Where `GET /metrics` answers.
    pub metrics_addr: SocketAddr,
    pub client: Client,
    pub health: HealthClient<Channel>,
    /// Between this server and PostgreSQL: `cut()` is "database down".
    pub proxy: Proxy,
    /// Cancelling it starts the graceful shutdown.
    pub shutdown: CancellationToken,
    serve: Option<JoinHandle<anyhow::Result<()>>>,
    /// Last, so the database outlives the server's connections to it.
    pub db: Arc<TestDb>,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(|_| {}).await
    }

    pub async fn spawn_with(customize: impl FnOnce(&mut ServerArgs)) -> Self {
        let db = TestDb::create().await;
        Self::spawn_on(db, customize)
            .await
            .unwrap_or_else(|e| panic!("test server did not start: {e:#}"))
    }

    /// A server on an existing database (a second replica, or a database a test
    /// prepared before the server starts).
    pub async fn spawn_on(
        db: Arc<TestDb>,
        customize: impl FnOnce(&mut ServerArgs),
    ) -> anyhow::Result<Self> {
        let proxy = Proxy::start(db.upstream()).await;
        Self::spawn_behind(db, proxy, customize).await
    }

    /// A server that reaches its database through `proxy`, which the test may
    /// have cut already.
    pub async fn spawn_behind(
        db: Arc<TestDb>,
        proxy: Proxy,
        customize: impl FnOnce(&mut ServerArgs),
    ) -> anyhow::Result<Self> {
        let config = config_for(&db, proxy.addr(), customize);
        let build_cancel = CancellationToken::new();
        let server = within(
            RPC_GUARD,
            "Server::build",
            Server::build(config, &build_cancel),
        )
        .await?;
        let addr = server.local_addr()?;
        let metrics_addr = server.metrics_addr()?;
        let shutdown = CancellationToken::new();
        let serve = tokio::spawn(server.serve(shutdown.clone()));
        let channel = Channel::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        Ok(Self {
            addr,
            metrics_addr,
            client: OutboxServiceClient::new(channel.clone()),
            health: HealthClient::new(channel),
            proxy,
            shutdown,
            serve: Some(serve),
            db,
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// A client on a connection of its own.
    pub async fn new_client(&self) -> Client {
        OutboxServiceClient::connect(format!("http://{}", self.addr))
            .await
            .expect("connect a gRPC client")
    }

    /// Starts the graceful shutdown and waits up to `limit` for `serve` to return.
    pub async fn stop(&mut self, limit: Duration) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let serve = self.serve.take().expect("the server is stopped only once");
        within(limit, "the server's graceful shutdown", serve)
            .await
            .expect("the serve task does not panic")
    }

    // ---- producer side: plain SQL, one transaction per call ----

    /// Commits `n` events to the default outbox table in one transaction.
    pub async fn insert(&self, n: usize) -> Vec<Uuid> {
        self.insert_into("public.outbox", n).await
    }

    /// Commits `n` events to `table` in one transaction; ids in insertion order.
    pub async fn insert_into(&self, table: &str, n: usize) -> Vec<Uuid> {
        let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
        let mut tx = self
            .pool()
            .begin()
            .await
            .expect("begin producer transaction");
        for (i, id) in ids.iter().enumerate() {
            let payload = json!({ "n": i });
            insert_row(
                &mut tx,
                table,
                *id,
                &format!("agg-{i}"),
                "test.event",
                &payload,
                &json!({}),
            )
            .await;
        }
        tx.commit().await.expect("commit producer transaction");
        ids
    }

    /// Commits one event with every producer column chosen by the test.
    pub async fn insert_event(
        &self,
        id: Uuid,
        aggregate: &str,
        event_type: &str,
        payload: Value,
        headers: Value,
    ) {
        let mut conn = self.pool().acquire().await.expect("producer connection");
        insert_row(
            &mut conn,
            "public.outbox",
            id,
            aggregate,
            event_type,
            &payload,
            &headers,
        )
        .await;
    }

    // ---- relay side: RPC wrappers that fail the test on an RPC error ----

    pub async fn claim(
        &self,
        worker: &str,
        max: u32,
        lease: Duration,
        wait: Duration,
    ) -> ClaimBatchResponse {
        self.claim_from("", worker, max, lease, wait).await
    }

    pub async fn claim_from(
        &self,
        outbox: &str,
        worker: &str,
        max: u32,
        lease: Duration,
        wait: Duration,
    ) -> ClaimBatchResponse {
        self.try_claim(claim_request(outbox, worker, max, lease, wait))
            .await
            .unwrap_or_else(|s| panic!("ClaimBatch failed: {s:?}"))
    }

    pub async fn try_claim(&self, req: ClaimBatchRequest) -> Result<ClaimBatchResponse, Status> {
        let wait = req.wait.map_or(Duration::ZERO, |w| {
            Duration::try_from(w).unwrap_or(Duration::ZERO)
        });
        let mut client = self.client.clone();
        within(RPC_GUARD + wait, "ClaimBatch", client.claim_batch(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Acks `ids` under `lease_id`; checks there is one result per id, in order.
    pub async fn ack(&self, lease_id: &str, ids: &[impl AsRef<str>]) -> Vec<Outcome> {
        self.ack_in("", lease_id, ids).await
    }

    pub async fn ack_in(
        &self,
        outbox: &str,
        lease_id: &str,
        ids: &[impl AsRef<str>],
    ) -> Vec<Outcome> {
        let req = AckRequest {
            outbox: outbox.into(),
            lease_id: lease_id.into(),
            message_ids: owned(ids),
        };
        let mut client = self.client.clone();
        let resp = within(RPC_GUARD, "Ack", client.ack(req))
            .await
            .unwrap_or_else(|s| panic!("Ack failed: {s:?}"));
        outcomes(ids, &resp.into_inner().results)
    }

    pub async fn nack(&self, req: NackRequest) -> Vec<Outcome> {
        let ids = req.message_ids.clone();
        let mut client = self.client.clone();
        let resp = within(RPC_GUARD, "Nack", client.nack(req))
            .await
            .unwrap_or_else(|s| panic!("Nack failed: {s:?}"));
        outcomes(&ids, &resp.into_inner().results)
    }

    /// Nack with an explicit retry delay (`None`: the outbox's backoff).
    pub async fn nack_retry(
        &self,
        lease_id: &str,
        ids: &[impl AsRef<str>],
        retry_after: Option<Duration>,
    ) -> Vec<Outcome> {
        self.nack(NackRequest {
            lease_id: lease_id.into(),
            message_ids: owned(ids),
            error: "broker said no".into(),
            retry_after: retry_after.and_then(dur),
            ..NackRequest::default()
        })
        .await
    }

    pub async fn extend(
        &self,
        lease_id: &str,
        ids: &[impl AsRef<str>],
        lease: Duration,
    ) -> ExtendLeaseResponse {
        let req = ExtendLeaseRequest {
            outbox: String::new(),
            lease_id: lease_id.into(),
            message_ids: owned(ids),
            lease_duration: dur(lease),
        };
        let mut client = self.client.clone();
        within(RPC_GUARD, "ExtendLease", client.extend_lease(req))
            .await
            .unwrap_or_else(|s| panic!("ExtendLease failed: {s:?}"))
            .into_inner()
    }

    pub async fn stats(&self) -> GetStatsResponse {
        self.stats_of("").await
    }

    pub async fn stats_of(&self, outbox: &str) -> GetStatsResponse {
        let mut client = self.client.clone();
        within(
            RPC_GUARD,
            "GetStats",
            client.get_stats(GetStatsRequest {
                outbox: outbox.into(),
            }),
        )
        .await
        .unwrap_or_else(|s| panic!("GetStats failed: {s:?}"))
        .into_inner()
    }

    /// The health service's answer for `service` ("" is the whole server).
    pub async fn health_of(&self, service: &str) -> Result<ServingStatus, Status> {
        let mut health = self.health.clone();
        let resp = within(
            RPC_GUARD,
            "Health/Check",
            health.check(HealthCheckRequest {
                service: service.into(),
            }),
        )
        .await?;
        Ok(ServingStatus::try_from(resp.into_inner().status).unwrap_or(ServingStatus::Unknown))
    }

    /// Health of both names outboxd reports, when they agree.
    pub async fn health_both(&self) -> Option<ServingStatus> {
        let all = self.health_of("").await.ok()?;
        let api = self.health_of(outboxd::server::SERVICE_NAME).await.ok()?;
        (all == api).then_some(all)
    }

    // ---- table state, read directly ----

    /// The service columns of one row of the default outbox.
    pub async fn row(&self, id: &str) -> Row {
        self.row_in("public.outbox", id)
            .await
            .unwrap_or_else(|| panic!("row {id} is not in public.outbox"))
    }

    pub async fn row_in(&self, table: &str, id: &str) -> Option<Row> {
        let id = Uuid::parse_str(id).expect("row ids are UUIDs");
        let sql = format!(
            "SELECT created_at, attempts, lease_id, claimed_by, claimed_at, published_at, dead_lettered_at, \
                    last_error, available_at, locked_until, \
                    extract(epoch FROM locked_until - now())::float8 AS lease_left \
             FROM {table} WHERE id = $1"
        );
        sqlx::query_as::<_, Row>(AssertSqlSafe(sql))
            .bind(id)
            .fetch_optional(self.pool())
            .await
            .expect("read an outbox row")
    }

    /// Every row of `table` with every column, as text: equal snapshots mean
    /// nothing changed.
    pub async fn snapshot(&self, table: &str) -> String {
        let sql = format!(
            "SELECT coalesce(jsonb_agg(to_jsonb(o) ORDER BY o.seq), '[]')::text FROM {table} AS o"
        );
        sqlx::query_scalar::<_, String>(AssertSqlSafe(sql))
            .fetch_one(self.pool())
            .await
            .expect("snapshot an outbox table")
    }

    pub async fn count(&self, table: &str, filter: &str) -> i64 {
        self.db
            .scalar_i64(&format!("SELECT count(*) FROM {table} WHERE {filter}"))
            .await
    }

    /// The database clock, the only clock leases and retries are measured by.
    pub async fn db_now(&self) -> DateTime<Utc> {
        sqlx::query_scalar::<_, DateTime<Utc>>("SELECT now()")
            .fetch_one(self.pool())
            .await
            .expect("read the database clock")
    }

    /// The backend pid of the server's LISTEN connection, if it has one.
    pub async fn listener_pid(&self) -> Option<i32> {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity
             WHERE datname = current_database() AND query ILIKE 'LISTEN%'
             ORDER BY backend_start DESC LIMIT 1",
        )
        .fetch_optional(self.pool())
        .await
        .expect("read pg_stat_activity")
    }

    /// Waits until the server listens for notifications. Tests that count
    /// wake-ups wait for this first: when the listener (re)connects it wakes
    /// every waiting claim once, since notifications may have been missed.
    pub async fn listening(&self) {
        wait_until(
            secs(10),
            "the server listens for notifications",
            async || self.listener_pid().await.is_some(),
        )
        .await;
    }

    /// Counts UPDATE statements on `table` from now on (a statement-level trigger
    /// fires even when no row changes), so a test can see how often the server
    /// ran a claim: an empty claim updates nothing but still counts.
    pub async fn count_updates(&self, table: &str) -> UpdateCounter {
        let suffix = table.replace('.', "_");
        let sequence = format!("test_updates_{suffix}");
        self.db
            .execute(&format!(
                "CREATE SEQUENCE {sequence} MINVALUE 0 START 0;
                 CREATE OR REPLACE FUNCTION test_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
                 BEGIN PERFORM nextval(TG_ARGV[0]::regclass); RETURN NULL; END $$;
                 CREATE TRIGGER test_count_updates AFTER UPDATE ON {table}
                     FOR EACH STATEMENT EXECUTE FUNCTION test_count_update('{sequence}');"
            ))
            .await;
        UpdateCounter {
            pool: self.pool().clone(),
            sequence,
        }
    }
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Starts the server's shutdown; the database goes with the last TestDb handle.
        self.shutdown.cancel();
    }
}

/// See [`TestApp::count_updates`].
#[derive(Debug)]
pub struct UpdateCounter {
    pool: PgPool,
    sequence: String,
}

impl UpdateCounter {
    /// UPDATE statements run on the table so far (sequences are not
    /// transactional, so statements still in flight count too).
    pub async fn get(&self) -> i64 {
        let sql = format!(
            "SELECT CASE WHEN is_called THEN last_value + 1 ELSE 0 END FROM {}",
            self.sequence
        );
        sqlx::query_scalar::<_, i64>(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .expect("read the update counter")
    }
}

/// The service columns of an outbox row, and the lease left by the database clock.
#[derive(Debug, Clone, sqlx::FromRow)]
pub struct Row {
    pub created_at: DateTime<Utc>,
    pub attempts: i32,
    pub lease_id: Option<Uuid>,
    pub claimed_by: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub published_at: Option<DateTime<Utc>>,
    pub dead_lettered_at: Option<DateTime<Utc>>,
    pub last_error: Option<String>,
    pub available_at: DateTime<Utc>,
    pub locked_until: Option<DateTime<Utc>>,
    /// Seconds until the lease expires (negative: expired; `None`: no lease).
    pub lease_left: Option<f64>,
}

pub async fn insert_row(
    conn: &mut PgConnection,
    table: &str,
    id: Uuid,
    aggregate: &str,
    event_type: &str,
    payload: &Value,
    headers: &Value,
) {
    let sql = format!(
        "INSERT INTO {table} (id, aggregate_id, event_type, payload, headers) VALUES ($1, $2, $3, $4, $5)"
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .bind(aggregate)
        .bind(event_type)
        .bind(payload)
        .bind(headers)
        .execute(conn)
        .await
        .expect("producer insert");
}

pub fn claim_request(
    outbox: &str,
    worker: &str,
    max: u32,
    lease: Duration,
    wait: Duration,
) -> ClaimBatchRequest {
    ClaimBatchRequest {
        outbox: outbox.into(),
        worker_id: worker.into(),
        max_messages: max,
        lease_duration: dur(lease),
        wait: dur(wait),
        acks: Vec::new(),
    }
}

/// The ids of a claimed batch, in the order they came.
pub fn ids(batch: &ClaimBatchResponse) -> Vec<String> {
    batch.messages.iter().map(|m| m.id.clone()).collect()
}

/// Message ids as the wire wants them.
pub fn owned(ids: &[impl AsRef<str>]) -> Vec<String> {
    ids.iter().map(|id| id.as_ref().to_owned()).collect()
}

pub fn strings(ids: &[Uuid]) -> Vec<String> {
    ids.iter().map(Uuid::to_string).collect()
}

/// Outcomes of a settle call, after checking they answer `requested` one by one, in order.
pub fn outcomes(requested: &[impl AsRef<str>], results: &[MessageResult]) -> Vec<Outcome> {
    let answered: Vec<&str> = results.iter().map(|r| r.message_id.as_str()).collect();
    assert_eq!(
        answered,
        requested.iter().map(AsRef::as_ref).collect::<Vec<&str>>(),
        "one result per requested id, in request order"
    );
    results
        .iter()
        .map(|r| {
            Outcome::try_from(r.outcome).unwrap_or_else(|_| panic!("unknown outcome {}", r.outcome))
        })
        .collect()
}

/// A wire timestamp as chrono time.
pub fn time(ts: Option<prost_types::Timestamp>) -> DateTime<Utc> {
    let ts = ts.expect("timestamp is set");
    DateTime::from_timestamp(
        ts.seconds,
        u32::try_from(ts.nanos).expect("nanos are non-negative"),
    )
    .expect("timestamp in range")
}

/// A wire duration as seconds.
pub fn seconds(d: Option<prost_types::Duration>) -> f64 {
    let d = d.expect("duration is set");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

pub use pb::Outcome::{
    AlreadyDone as ALREADY_DONE, DeadLettered as DEAD_LETTERED, LeaseLost as LEASE_LOST,
    NotFound as NOT_FOUND, Ok as OK,
};
