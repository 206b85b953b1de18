//! The composition root: what outboxd runs (the gRPC server and the named
//! background tasks of [`crate::tasks`]) and the order in which it stops
//! ([`Running::stop`]). Start-up and its exit codes are [`start`].

mod header_deadline;
mod start;

pub use start::{
    DDL_LOCK_TIMEOUT, EXIT_DATABASE, MIGRATE_START_TIMEOUT, MIGRATOR, StartError, migrate,
};

use std::{
    net::SocketAddr,
    sync::{Arc, atomic::AtomicU64},
    time::Duration,
};

use anyhow::Context;
use futures::TryStreamExt as _;
use outbox_runtime::cli::ListenAddr;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::sync::CancellationToken;
use tonic::server::NamedService;
use tonic_health::{ServingStatus, server::HealthReporter};

use crate::{
    auth::{self, Authorizer},
    config::Config,
    connections::{self, CappedListener},
    grpc::{
        AdminApi, OutboxApi,
        pb::{
            self, outbox_admin_server::OutboxAdminServer,
            outbox_service_server::OutboxServiceServer,
        },
    },
    metrics::{self, Metrics, ServerMetrics},
    service::{AdminService, OutboxService, Outboxes},
    status,
    store::{self, AdoptMode, PgStore, Store},
    tasks::{
        Supervisor, gauges, health, retention, sweep,
        watchdog::{self, DatabaseReports},
    },
    tls::{self, ServerTls},
    watch,
};
use header_deadline::HeaderDeadline;

/// The health-service name readiness probes ask about.
pub const SERVICE_NAME: &str = <OutboxServiceServer<OutboxApi> as NamedService>::NAME;
/// The operators' service, on the same port.
pub const ADMIN_SERVICE_NAME: &str = <OutboxAdminServer<AdminApi> as NamedService>::NAME;

/// A server whose database is ready and whose ports are bound, not yet serving.
pub struct Server {
    config: Config,
    store: PgStore,
    listener: TcpListener,
    metrics_listener: TcpListener,
    /// `--health-listen`: health only, in plaintext, for probes.
    health_listener: Option<TcpListener>,
    /// `--admin-http-listen`: the status page.
    status_listener: Option<TcpListener>,
    /// TLS on the API port (`--tls-cert`).
    tls: Option<ServerTls>,
    /// Connections each listener holds open at once (`--max-connections`).
    max_connections: usize,
    /// The database watchdog's latest findings.
    reports: DatabaseReports,
    /// Events the claim sweep found below a claim cursor, all outboxes.
    sweep_found: Arc<AtomicU64>,
}

impl Server {
    /// Raises the open-file limit, reads the TLS files and binds the
    /// listeners first, so a bad file or a port in use fails before any
    /// connection or migration; then waits for the database (see
    /// `store::connect`), migrates unless told not to, and checks the tables.
    pub async fn build(config: Config, cancel: &CancellationToken) -> Result<Self, StartError> {
        let file_limit = connections::raise_file_limit();
        // Checked at validation already; read again in case they changed since.
        let tls = config
            .tls
            .as_ref()
            .map(ServerTls::new)
            .transpose()
            .map_err(StartError::Config)?;
        let listener = config
            .listen
            .bind("--listen (OUTBOXD_LISTEN)")
            .await
            .map_err(StartError::Listen)?;
        let metrics_listener = config
            .metrics_listen
            .bind("--metrics-listen (OUTBOXD_METRICS_LISTEN)")
            .await
            .map_err(StartError::Listen)?;
        let health_listener = bind_optional(
            &config.health_listen,
            "--health-listen (OUTBOXD_HEALTH_LISTEN)",
        )
        .await?;
        let status_listener = bind_optional(
            &config.admin_http_listen,
            "--admin-http-listen (OUTBOXD_ADMIN_HTTP_LISTEN)",
        )
        .await?;
        let listeners =
            2 + usize::from(health_listener.is_some()) + usize::from(status_listener.is_some());
        let max_connections = max_connections(&config, file_limit, listeners);
        let db = &config.database;
        let pool = store::connect(&db.connect_settings(None), cancel).await?;
        let prepare = async {
            let mode = if config.migrate {
                start::run_migrations(db, &pool).await?;
                AdoptMode::Create
            } else {
                AdoptMode::Verify
            };
            PgStore::open(pool.clone(), &db.outboxes, mode)
                .await
                .map_err(|e| start::start_store_error(db, "preparing outbox tables", e))
        };
        let store = tokio::select! {
            store = prepare => store?,
            () = cancel.cancelled() => return Err(StartError::Interrupted),
        }
        .with_statement_timeout(db.statement_timeout);
        Ok(Self {
            config,
            store,
            listener,
            metrics_listener,
            health_listener,
            status_listener,
            tls,
            max_connections,
            reports: DatabaseReports::default(),
            sweep_found: Arc::default(),
        })
    }

    /// The database watchdog's latest findings (who holds the xmin horizon,
    /// each outbox table's upkeep), for whatever shows them beside the
    /// admin RPC; empty until the first sample once serving.
    pub fn database_reports(&self) -> DatabaseReports {
        self.reports.clone()
    }

    /// How many events the claim sweep has found below a claim cursor so
    /// far, over all outboxes (`outbox_claim_sweep_found_total` summed): 0
    /// while the cursor is right.
    pub fn claim_sweep_findings(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.sweep_found)
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn metrics_addr(&self) -> std::io::Result<SocketAddr> {
        self.metrics_listener.local_addr()
    }

    /// Where `--health-listen` answers, when given.
    pub fn health_addr(&self) -> std::io::Result<Option<SocketAddr>> {
        self.health_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
    }

    /// Where `--admin-http-listen` serves the status page, when given.
    pub fn status_addr(&self) -> std::io::Result<Option<SocketAddr>> {
        self.status_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()
    }

    /// Serves until `shutdown`, then stops in the order [`Running::stop`] gives.
    pub async fn serve(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let Self {
            config,
            store,
            listener,
            metrics_listener,
            health_listener,
            status_listener,
            tls,
            max_connections,
            reports,
            sweep_found,
        } = self;
        let addr = listener.local_addr()?;
        let authorizer = authorizer(&config, addr)?;
        let outboxes = Outboxes::new(store.outboxes());
        let (health, health_service) = tonic_health::server::health_reporter();
        health::set_health(&health, ServingStatus::Serving).await;
        let metrics = Metrics::new("outboxd")?;
        let server_metrics = ServerMetrics::new(&metrics);
        let capped =
            |listener, name| CappedListener::new(listener, name, max_connections, &server_metrics);

        // What runs beside the gRPC server.
        let tasks = Supervisor::new();
        let stop = tasks.stop_token();
        tasks.spawn(
            "metrics endpoint",
            metrics::serve(
                capped(metrics_listener, "metrics"),
                metrics.clone(),
                stop.clone(),
            ),
        );
        if let Some(listener) = health_listener {
            // Stops with the tasks, after the drain: probes see NOT_SERVING
            // while RPCs drain rather than a refused connection.
            tasks.spawn(
                "health listener",
                serve_health(
                    health_service.clone(),
                    capped(listener, "health"),
                    stop.clone(),
                ),
            );
        }
        if let Some(tls) = &tls {
            tls.log_serving();
            tasks.spawn("tls reload", tls.clone().reload(stop.clone()));
        }
        tasks.spawn(
            "gauges",
            gauges::sample_gauges(
                store.clone(),
                server_metrics.clone(),
                config.metrics_interval,
                stop.clone(),
            ),
        );
        tasks.spawn(
            "database watchdog",
            watchdog::watchdog(
                store.clone(),
                server_metrics.clone(),
                reports.clone(),
                config.watchdog_interval,
                config.xmin_warn_after,
                stop.clone(),
            ),
        );
        for outbox in outboxes.iter().cloned() {
            tasks.spawn(
                format!("sequence watcher {}", outbox.name()),
                watch::watch(outbox, config.probe_interval, stop.clone()),
            );
        }
        // Stops at shutdown, before the rest, so nothing sets SERVING again
        // while in-flight RPCs drain.
        tasks.spawn_until(
            "health check",
            shutdown.clone(),
            health::check_health(
                store.clone(),
                health.clone(),
                config.health_interval,
                shutdown.clone(),
            ),
        );
        tasks.spawn(
            "retention",
            retention::retention(
                store.clone(),
                config.retention_interval,
                config.retention_batch,
                stop.clone(),
            ),
        );

        if let Some(every) = config.claim_sweep_interval {
            tasks.spawn(
                "claim sweep",
                sweep::sweep(
                    store.clone(),
                    server_metrics.clone(),
                    sweep_found,
                    every,
                    stop.clone(),
                ),
            );
        }

        if let Some(reload) =
            authorizer.reloader(auth::RELOAD_POLL, server_metrics.clone(), stop.clone())?
        {
            tasks.spawn("auth tokens reload", reload);
        }

        let admin_service = AdminService::new(outboxes.clone(), reports);
        if let Some(listener) = status_listener {
            let page = status::StatusPage {
                admin: admin_service.clone(),
                authorizer: authorizer.clone(),
                metrics: server_metrics.clone(),
            };
            tracing::info!(addr = %listener.local_addr()?, tls = tls.is_some(), "status page at /");
            tasks.spawn(
                "status page",
                status::serve(
                    capped(listener, "status_page"),
                    tls.clone(),
                    page,
                    stop.clone(),
                ),
            );
        }
        let admin = AdminApi::new(
            admin_service,
            config.limits.clone(),
            server_metrics.clone(),
            authorizer.clone(),
        );
        let service = OutboxService::new(
            outboxes,
            config.poll_interval,
            shutdown.clone(),
            server_metrics.clone(),
            config.max_waiting_claims,
        );
        let listener = capped(listener, "api");
        let api = OutboxApi::new(service, config.limits.clone(), server_metrics, authorizer);
        let stop_accepting = CancellationToken::new();
        let grpc = spawn_grpc(
            api,
            admin,
            health_service,
            listener,
            tls.as_ref().map(ServerTls::acceptor),
            config.max_request_bytes,
            stop_accepting.clone(),
        )?;
        tracing::info!(%addr, outboxes = ?store.specs().map(|s| s.name.as_str()).collect::<Vec<_>>(), "serving");

        let mut running = Running {
            grpc,
            stop_accepting,
            health,
            tasks,
            store,
            metrics,
            drain_timeout: config.drain_timeout,
        };
        let early = tokio::select! {
            () = shutdown.cancelled() => None,
            res = &mut running.grpc => Some(res),
        };
        if let Some(res) = early {
            running.tasks.stop(TASK_STOP_TIMEOUT).await;
            res.context("gRPC server task")?.context("gRPC server")?;
            anyhow::bail!("gRPC server stopped unexpectedly");
        }
        running.stop().await
    }
}

/// `--max-connections`, or its default for this file limit, pool and number
/// of listeners; logged, with a warning when an explicit one leaves the pool
/// too few files.
fn max_connections(config: &Config, file_limit: Option<u64>, listeners: usize) -> usize {
    let pool = config.database.max_connections;
    let max = config
        .max_connections
        .unwrap_or_else(|| connections::default_max_connections(file_limit, pool, listeners));
    tracing::info!(
        max_connections = max,
        listeners,
        file_limit = ?file_limit,
        pool,
        "connections per listener"
    );
    if !connections::fits(file_limit, pool, listeners, max) {
        tracing::warn!(
            max_connections = max,
            listeners,
            file_limit = ?file_limit,
            pool,
            reserve = connections::FILE_RESERVE,
            "--max-connections on every listener exceeds the open-file limit less the pool: idle connections can leave the database pool without files"
        );
    }
    max
}

/// Binds a listener that is off unless its flag is given.
async fn bind_optional(
    addr: &Option<ListenAddr>,
    flag: &str,
) -> Result<Option<TcpListener>, StartError> {
    match addr {
        Some(addr) => Ok(Some(addr.bind(flag).await.map_err(StartError::Listen)?)),
        None => Ok(None),
    }
}

/// The API's authorisation, and the one line at start that says who may call it.
fn authorizer(config: &Config, addr: SocketAddr) -> anyhow::Result<Authorizer> {
    let Some(settings) = &config.auth else {
        if addr.ip().is_loopback() {
            tracing::info!(%addr, "no --auth-tokens: the API is open, on loopback only");
        } else {
            tracing::warn!(
                %addr,
                "no --auth-tokens and --allow-unauthenticated: anyone who reaches the port can ack events without publishing them"
            );
        }
        return Ok(Authorizer::open());
    };
    // Read again (validation read it too): the file is the one in force now.
    let authorizer = Authorizer::load(settings).map_err(anyhow::Error::msg)?;
    tracing::info!(
        file = %settings.tokens_file.display(),
        identities = authorizer.identities().unwrap_or(0),
        "authorisation on"
    );
    Ok(authorizer)
}

/// How long background tasks get to stop, and the meters to flush.
const TASK_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A serving outboxd: what has to stop, and in which order.
struct Running {
    grpc: JoinHandle<Result<(), tonic::transport::Error>>,
    stop_accepting: CancellationToken,
    health: HealthReporter,
    tasks: Supervisor,
    store: PgStore,
    metrics: Metrics,
    drain_timeout: Duration,
}

impl Running {
    /// The one place that says how outboxd stops, each step bounded:
    /// 1. health NOT_SERVING, so load balancers and relays go elsewhere
    ///    (long polls already ended when `shutdown` was cancelled);
    /// 2. stop accepting, and give in-flight RPCs the drain timeout;
    /// 3. stop the background tasks;
    /// 4. close the pool, then flush the meters.
    async fn stop(self) -> anyhow::Result<()> {
        let Self {
            mut grpc,
            stop_accepting,
            health,
            tasks,
            store,
            metrics,
            drain_timeout,
        } = self;
        health::set_health(&health, ServingStatus::NotServing).await;
        stop_accepting.cancel();
        match tokio::time::timeout(drain_timeout, &mut grpc).await {
            Ok(res) => res.context("gRPC server task")?.context("gRPC server")?,
            Err(_) => {
                tracing::warn!(timeout = ?drain_timeout, "drain timed out; dropping remaining RPCs");
                grpc.abort();
            }
        }
        tasks.stop(TASK_STOP_TIMEOUT).await;
        store.pool().close().await;
        metrics.shutdown(TASK_STOP_TIMEOUT).await;
        tracing::info!("stopped");
        Ok(())
    }
}

/// The most request-header bytes (HPACK-decoded, as SETTINGS_MAX_HEADER_LIST_SIZE
/// counts them) a gRPC port takes: a token, a deadline and a trace context
/// take a few hundred. hyper uses 16 KiB today but h2's own default is
/// 16 MiB, so it is pinned here. h2 (0.4) answers a header block over it
/// with GOAWAY and ends the connection at once, whether one header is longer
/// than the limit or many add up to more (the fault suite's `door` cases);
/// a block that never ends is [`header_deadline`]'s.
const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// Serves the gRPC services on one port until `stop_accepting`: outboxd's
/// API and its admin service (requests up to `max_request_bytes`, each
/// authorised in its handler), health, and reflection (both versions, for old
/// and new grpcurl), the last two open to all: probes carry no credentials.
/// Over TLS with `tls`. Each connection is under the listener's cap and the
/// header deadline.
fn spawn_grpc<H>(
    api: OutboxApi,
    admin: AdminApi,
    health_service: H,
    listener: CappedListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    max_request_bytes: usize,
    stop_accepting: CancellationToken,
) -> anyhow::Result<JoinHandle<Result<(), tonic::transport::Error>>>
where
    H: tonic::server::NamedService
        + tower::Service<
            tonic::codegen::http::Request<tonic::body::Body>,
            Response = tonic::codegen::http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Clone
        + Send
        + Sync
        + 'static,
    H::Future: Send + 'static,
{
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let router = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(10)))
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .layer(tower::util::MapResponseLayer::new(client_mistakes))
        .add_service(health_service)
        .add_service(reflection().build_v1()?)
        .add_service(reflection().build_v1alpha()?)
        .add_service(OutboxServiceServer::new(api).max_decoding_message_size(max_request_bytes))
        .add_service(OutboxAdminServer::new(admin).max_decoding_message_size(max_request_bytes));
    let stopped = stop_accepting.cancelled_owned();
    Ok(match tls {
        None => tokio::spawn(router.serve_with_incoming_shutdown(
            listener.incoming().map_ok(HeaderDeadline::new),
            stopped,
        )),
        Some(acceptor) => tokio::spawn(router.serve_with_incoming_shutdown(
            tls::incoming(listener, acceptor).map_ok(HeaderDeadline::new),
            stopped,
        )),
    })
}

/// `--health-listen`: `grpc.health.v1` alone, in plaintext, with the API
/// port's statuses, for probes that cannot speak TLS.
async fn serve_health<T: tonic_health::pb::health_server::Health>(
    health_service: tonic_health::pb::health_server::HealthServer<T>,
    listener: CappedListener,
    stop: CancellationToken,
) {
    let served = tonic::transport::Server::builder()
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
        .add_service(health_service)
        .serve_with_incoming_shutdown(
            listener.incoming().map_ok(HeaderDeadline::new),
            stop.cancelled_owned(),
        )
        .await;
    if let Err(error) = served {
        tracing::error!(%error, "the health listener failed");
    }
}

/// Statuses tonic gives a request it cannot read, turned into what they are: a
/// client's mistake. A request over `--max-request-bytes` is OUT_OF_RANGE in
/// tonic; gRPC's convention, and what clients look for, is RESOURCE_EXHAUSTED,
/// and the message names the flag. Bytes that do not decode (a wrong wire type,
/// a string that is not UTF-8) are INTERNAL in tonic-prost; they become
/// INVALID_ARGUMENT with the decoder's reason. Both are refused before any
/// handler runs, so the headers-only reply is the place to fix them.
fn client_mistakes<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let headers = response.headers_mut();
    let (Some(status), Some(message)) = (headers.get("grpc-status"), headers.get("grpc-message"))
    else {
        return response;
    };
    let message = percent_encoding::percent_decode(message.as_bytes())
        .decode_utf8_lossy()
        .into_owned();
    let fixed = if status == "11" && message.contains("message length too large") {
        Some((
            "8",
            format!("request too large: {message} (--max-request-bytes)"),
        ))
    } else if status == "13" && message.starts_with("failed to decode Protobuf message") {
        Some(("3", format!("invalid request: {message}")))
    } else {
        None
    };
    if let Some((code, message)) = fixed {
        let encoded =
            percent_encoding::utf8_percent_encode(&message, GRPC_MESSAGE_ESCAPED).to_string();
        if let Ok(value) = tonic::codegen::http::HeaderValue::from_str(&encoded) {
            headers.insert(
                "grpc-status",
                tonic::codegen::http::HeaderValue::from_static(code),
            );
            headers.insert("grpc-message", value);
        }
    }
    response
}

/// What gRPC's `grpc-message` header must percent-encode: '%' and anything
/// outside printable ASCII.
const GRPC_MESSAGE_ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::CONTROLS.add(b'%');
