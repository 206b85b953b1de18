//! One outboxd server per test, in process, on port 0: its arguments, its
//! start on a database of the test's own behind a cuttable proxy, its clients,
//! and its graceful stop.

use std::{
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use outboxd::{
    config::{Cli, Config},
    grpc::pb::outbox_service_client::OutboxServiceClient,
    server::Server,
};
use sqlx::PgPool;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic_health::pb::health_client::HealthClient;

use super::{Proxy, TestDb, logs::init_tracing, within};

pub type Client = OutboxServiceClient<Channel>;

/// Longest any single RPC or SQL helper may take before the test fails loudly
/// instead of hanging.
pub(super) const RPC_GUARD: Duration = Duration::from_secs(30);

/// Command-line arguments for a test server; later settings replace earlier ones.
#[derive(Debug, Clone)]
pub struct ServerArgs {
    args: Vec<(String, Option<String>)>,
    /// How the test's clients reach a server with `--tls-cert`.
    client_tls: Option<ClientTlsConfig>,
}

impl ServerArgs {
    fn new(database_url: String) -> Self {
        let mut args = Self {
            args: Vec::new(),
            client_tls: None,
        };
        args.set("--database-url", database_url)
            .set("--listen", "127.0.0.1:0")
            .set("--metrics-listen", "127.0.0.1:0")
            .set("--poll-interval", "500ms")
            .set("--health-interval", "200ms")
            .set("--db-acquire-timeout", "1s")
            .set("--drain-timeout", "5s")
            // Every test checks the claim cursor: its sweep runs often, and
            // a test server that found anything below the cursor fails its
            // test when dropped (see `Drop for TestApp`).
            .set("--claim-sweep-interval", "200ms");
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

    /// The TLS the test's clients connect with (`https`), for a server
    /// given `--tls-cert`.
    pub fn client_tls(&mut self, tls: ClientTlsConfig) -> &mut Self {
        self.client_tls = Some(tls);
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

/// The server configuration a test asks for, parsed and validated like the
/// binary does. The server it is for logs to the test writer.
pub fn config_for(
    db: &TestDb,
    database: SocketAddr,
    customize: impl FnOnce(&mut ServerArgs),
) -> Config {
    args_for(db, database, customize).config()
}

fn args_for(
    db: &TestDb,
    database: SocketAddr,
    customize: impl FnOnce(&mut ServerArgs),
) -> ServerArgs {
    init_tracing();
    let mut args = ServerArgs::new(db.url_via(database));
    customize(&mut args);
    args
}

impl ServerArgs {
    fn config(&self) -> Config {
        let argv = self.argv();
        let cli = <Cli as clap::Parser>::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("test server arguments {argv:?} do not parse: {e}"));
        cli.serve
            .validate()
            .unwrap_or_else(|e| panic!("test server arguments {argv:?} are invalid: {e}"))
    }
}

/// One running outboxd, its clients and its database.
#[derive(Debug)]
pub struct TestApp {
    pub addr: SocketAddr,
    /// Where `GET /metrics` answers.
    pub metrics_addr: SocketAddr,
    /// Where `--health-listen` answers, when given.
    pub health_addr: Option<SocketAddr>,
    /// Where `--admin-http-listen` serves the status page, when given.
    pub status_addr: Option<SocketAddr>,
    /// What clients connect with: `https` when set.
    pub client_tls: Option<ClientTlsConfig>,
    pub client: Client,
    pub health: HealthClient<Channel>,
    /// Between this server and PostgreSQL: `take_down()` is "database down".
    pub proxy: Proxy,
    /// Cancelling it starts the graceful shutdown.
    pub shutdown: CancellationToken,
    serve: Option<JoinHandle<anyhow::Result<()>>>,
    /// Events the claim sweep found below the claim cursor (must stay 0).
    pub sweep_found: Arc<AtomicU64>,
    /// Set by a test that uncovers rows below the cursor on purpose.
    pub sweep_findings_expected: bool,
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
    /// have taken down already.
    pub async fn spawn_behind(
        db: Arc<TestDb>,
        proxy: Proxy,
        customize: impl FnOnce(&mut ServerArgs),
    ) -> anyhow::Result<Self> {
        let args = args_for(&db, proxy.addr(), customize);
        let config = args.config();
        let build_cancel = CancellationToken::new();
        let server = within(
            RPC_GUARD,
            "Server::build",
            Server::build(config, &build_cancel),
        )
        .await?;
        let addr = server.local_addr()?;
        let metrics_addr = server.metrics_addr()?;
        let health_addr = server.health_addr()?;
        let status_addr = server.status_addr()?;
        let sweep_found = server.claim_sweep_findings();
        let shutdown = CancellationToken::new();
        let serve = tokio::spawn(server.serve(shutdown.clone()));
        let channel = endpoint(addr, args.client_tls.as_ref())?.connect().await?;
        Ok(Self {
            addr,
            metrics_addr,
            health_addr,
            status_addr,
            client_tls: args.client_tls,
            client: OutboxServiceClient::new(channel.clone()),
            health: HealthClient::new(channel),
            proxy,
            shutdown,
            serve: Some(serve),
            sweep_found,
            sweep_findings_expected: false,
            db,
        })
    }

    pub fn pool(&self) -> &PgPool {
        &self.db.pool
    }

    /// Where a new connection to this server goes, with the test's TLS.
    pub fn endpoint(&self) -> Endpoint {
        endpoint(self.addr, self.client_tls.as_ref()).expect("the server's endpoint")
    }

    /// A client on a connection of its own.
    pub async fn new_client(&self) -> Client {
        let channel = self
            .endpoint()
            .connect()
            .await
            .expect("connect a gRPC client");
        OutboxServiceClient::new(channel)
    }

    /// Starts the graceful shutdown and waits up to `limit` for `serve` to return.
    pub async fn stop(&mut self, limit: Duration) -> anyhow::Result<()> {
        self.shutdown.cancel();
        let serve = self.serve.take().expect("the server is stopped only once");
        within(limit, "the server's graceful shutdown", serve)
            .await
            .expect("the serve task does not panic")
    }
}

/// `http://ADDR`, or `https://ADDR` with `tls` (which names the server
/// `localhost`, the name its test certificate has).
pub fn endpoint(addr: SocketAddr, tls: Option<&ClientTlsConfig>) -> anyhow::Result<Endpoint> {
    Ok(match tls {
        None => Endpoint::from_shared(format!("http://{addr}"))?,
        Some(tls) => Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls.clone())?,
    })
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Starts the server's shutdown; the database goes with the last TestDb handle.
        self.shutdown.cancel();
        let found = self.sweep_found.load(Ordering::Relaxed);
        if !self.sweep_findings_expected && !std::thread::panicking() {
            assert_eq!(
                found, 0,
                "the claim sweep found {found} claimable event(s) below the claim cursor without a lease (see the WARN lines above)"
            );
        }
    }
}
