//! outboxd's command line and environment, read once and validated before
//! anything is bound: a bad value exits with code 64 and one line saying which
//! and why (the parsing itself is `outbox_runtime::cli`, shared with the relay).

use std::{path::PathBuf, str::FromStr, time::Duration};

use clap::{Args, Parser, Subcommand};
use outbox_runtime::cli::{ListenAddr, LogArgs, parse_duration};
use sqlx::postgres::PgConnectOptions;

use crate::{
    auth::AuthSettings,
    lease::{
        BackoffPolicy, DEFAULT_MAX_CLAIM_BYTES, DEFAULT_MAX_MESSAGE_BYTES, Limits, MAX_RETRY_AFTER,
    },
    outbox::{OutboxArg, OutboxPolicy, OutboxSpec},
    store::ConnectSettings,
    tls::TlsSettings,
};

pub use outbox_runtime::cli::{EXIT_CONFIG, LogFormat, Sources, invalid_config, parse_args};

/// outboxd: fenced leases on PostgreSQL outbox rows, for relay workers in any language.
#[derive(Debug, Parser)]
#[command(name = "outboxd", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub serve: ServeArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Apply migrations and adopt the configured outbox tables, then exit.
    Migrate {
        #[command(flatten)]
        database: DatabaseArgs,
        #[command(flatten)]
        log: LogArgs,
    },
}

#[derive(Debug, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL URL (postgres://user:pass@host:port/db). Required. Never logged with its password.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,

    /// Maximum connections in the pool.
    #[arg(long, env = "OUTBOXD_DB_MAX_CONNECTIONS", default_value_t = 20)]
    pub db_max_connections: u32,

    /// How long an RPC waits for a pooled connection before failing with
    /// UNAVAILABLE; also bounds each connection attempt at start.
    #[arg(long, env = "OUTBOXD_DB_ACQUIRE_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub db_acquire_timeout: Duration,

    /// How long start-up keeps retrying a database it cannot reach (refused,
    /// timed out, starting up, out of connections) before exiting with code 69;
    /// 0 retries forever. Default: forever for the server, 2m for `outboxd
    /// migrate`. A database that refuses the role, the password or the
    /// database name exits 69 at once.
    #[arg(long, env = "OUTBOXD_DB_START_TIMEOUT", value_parser = parse_duration)]
    pub db_start_timeout: Option<Duration>,

    /// Longest any of outboxd's statements (and any lock wait in one) may run
    /// before it is cancelled and the RPC answered UNAVAILABLE; a client's
    /// shorter gRPC deadline ends it sooner. Migrations and table adoption
    /// are not bounded by it; long-poll waits are not statements.
    #[arg(long, env = "OUTBOXD_STATEMENT_TIMEOUT", value_parser = parse_duration, default_value = "5s")]
    pub statement_timeout: Duration,

    /// An outbox: NAME=SCHEMA.TABLE[:OPTION=VALUE...], options separated by
    /// ':'. Repeat the flag for more outboxes; in OUTBOXD_OUTBOXES, separate
    /// them with ','. Options (each defaults to the flag of the same name):
    /// max_attempts=N, retention=DURATION (0 deletes on ack),
    /// backoff_base=DURATION, backoff_factor=F, backoff_max=DURATION,
    /// ordering=none|aggregate (one event of an aggregate at a time, in seq
    /// order), poison=block|park (ordering=aggregate only: a dead-lettered head
    /// holds its aggregate until redriven or discarded, or lets it go on;
    /// default block). Each outbox needs a table of its own. Default:
    /// default=public.outbox.
    #[arg(
        long = "outbox",
        env = "OUTBOXD_OUTBOXES",
        value_name = "NAME=SCHEMA.TABLE[:OPTION=VALUE...]"
    )]
    pub outboxes: Vec<String>,

    /// Whether `outboxes` came from OUTBOXD_OUTBOXES (one value, outboxes
    /// separated by commas) rather than from `--outbox` flags, where a comma
    /// is a mistake: set from [`Sources`] before validating.
    #[arg(skip)]
    pub outboxes_from_env: bool,

    /// Deliveries before a message is dead-lettered (per-outbox option: max_attempts).
    #[arg(long, env = "OUTBOXD_MAX_ATTEMPTS", default_value_t = 10)]
    pub max_attempts: u32,

    /// First retry delay after a Nack without retry_after.
    #[arg(long, env = "OUTBOXD_BACKOFF_BASE", value_parser = parse_duration, default_value = "1s")]
    pub backoff_base: Duration,

    /// Growth of the retry delay per attempt.
    #[arg(long, env = "OUTBOXD_BACKOFF_FACTOR", default_value_t = 2.0)]
    pub backoff_factor: f64,

    /// Longest retry delay.
    #[arg(long, env = "OUTBOXD_BACKOFF_MAX", value_parser = parse_duration, default_value = "5m")]
    pub backoff_max: Duration,

    /// Random spread of each retry delay, as a fraction (0.2 = ±20 %).
    #[arg(long, env = "OUTBOXD_BACKOFF_JITTER", default_value_t = 0.2)]
    pub backoff_jitter: f64,

    /// How long published rows are kept; 0 deletes each row when it is acked.
    #[arg(long, env = "OUTBOXD_RETENTION", value_parser = parse_duration, default_value = "7d")]
    pub retention: Duration,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,

    #[command(flatten)]
    pub log: LogArgs,

    /// gRPC listen address: HOST:PORT, the host an IP address or a name.
    /// Default: 0.0.0.0:50051 with --auth-tokens or --allow-unauthenticated,
    /// 127.0.0.1:50051 without (an open API is reachable from this host only).
    #[arg(long, env = "OUTBOXD_LISTEN")]
    pub listen: Option<ListenAddr>,

    /// Serve the API without authorisation on a non-loopback address. Without
    /// it and without --auth-tokens, outboxd listens on loopback only.
    #[arg(long, env = "OUTBOXD_ALLOW_UNAUTHENTICATED")]
    pub allow_unauthenticated: bool,

    /// Turn on authorisation: a file of lines `NAME CREDENTIAL SCOPE...`
    /// (README, "Security"). Re-read on SIGHUP and when it changes.
    #[arg(long, env = "OUTBOXD_AUTH_TOKENS", value_name = "PATH")]
    pub auth_tokens: Option<PathBuf>,

    /// Serve gRPC over TLS with this PEM certificate chain (needs --tls-key).
    /// Re-read when the file changes, without a restart.
    #[arg(long, env = "OUTBOXD_TLS_CERT", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "OUTBOXD_TLS_KEY", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,

    /// Require client certificates signed by this PEM CA (mutual TLS).
    #[arg(long, env = "OUTBOXD_TLS_CLIENT_CA", value_name = "PATH")]
    pub tls_client_ca: Option<PathBuf>,

    /// How often the certificate and key files are checked for a change.
    #[arg(long, env = "OUTBOXD_TLS_RELOAD_INTERVAL", value_parser = parse_duration, default_value = "5s")]
    pub tls_reload_interval: Duration,

    /// A second, plaintext port that serves only `grpc.health.v1`: for probes
    /// that cannot speak TLS (Kubernetes' gRPC probes) when the API port does.
    #[arg(long, env = "OUTBOXD_HEALTH_LISTEN", value_name = "HOST:PORT")]
    pub health_listen: Option<ListenAddr>,

    /// Serve the status page (`GET /`, read-only HTML for people on call)
    /// here. Over HTTPS with the API's certificate when `--tls-cert` is
    /// given; with `--auth-tokens` it asks for an admin token. Off unless given.
    #[arg(long, env = "OUTBOXD_ADMIN_HTTP_LISTEN", value_name = "HOST:PORT")]
    pub admin_http_listen: Option<ListenAddr>,

    /// Long-polling ClaimBatch calls allowed to wait at once, over all
    /// outboxes; one more is refused with RESOURCE_EXHAUSTED at once.
    #[arg(long, env = "OUTBOXD_MAX_WAITING_CLAIMS", default_value_t = 1024)]
    pub max_waiting_claims: u32,

    /// Most connections each listener holds open at once: the API
    /// (--listen), --health-listen, --admin-http-listen and --metrics-listen,
    /// each on its own. One more is accepted and closed at once, counted in
    /// outbox_connections_refused_total{listener}. Default: the open-file
    /// limit (raised to its hard limit at start), less --db-max-connections
    /// and 64 files kept for logs, TLS files and the like, divided by the
    /// number of listeners served (at least 8): every listener full still
    /// leaves the database pool its connections.
    #[arg(long, env = "OUTBOXD_MAX_CONNECTIONS")]
    pub max_connections: Option<u32>,

    /// Largest request accepted, in bytes (gRPC's own default); a larger one
    /// is refused with RESOURCE_EXHAUSTED before it is decoded.
    #[arg(long, env = "OUTBOXD_MAX_REQUEST_BYTES", default_value_t = DEFAULT_MAX_REQUEST_BYTES)]
    pub max_request_bytes: usize,

    /// Prometheus metrics address (`GET /metrics`, no authorisation).
    /// Default: 0.0.0.0:9090 with --auth-tokens or --allow-unauthenticated,
    /// 127.0.0.1:9090 without, as for --listen: a server open to this host
    /// only does not publish its outboxes' figures to the network. The
    /// relay's default is 9091, so both run side by side with their defaults.
    #[arg(long, env = "OUTBOXD_METRICS_LISTEN")]
    pub metrics_listen: Option<ListenAddr>,

    /// How often each outbox's gauges (pending, in flight, oldest age...) are
    /// sampled, by one query per outbox. A sample reads every pending row, so
    /// with a backlog large enough that one takes over 1/20 of this, samples
    /// are spaced to keep sampling to 1/20 of the time.
    #[arg(long, env = "OUTBOXD_METRICS_INTERVAL", value_parser = parse_duration, default_value = "5s")]
    pub metrics_interval: Duration,

    /// Skip migrations and table adoption at start (a migration Job runs them);
    /// the tables are still checked.
    #[arg(long, env = "OUTBOXD_NO_MIGRATE")]
    pub no_migrate: bool,

    /// Largest batch a claim may ask for, and most ids per Ack/Nack/ExtendLease.
    #[arg(long, env = "OUTBOXD_MAX_BATCH", default_value_t = 1000)]
    pub max_batch: u32,

    /// Byte budget of a claim's response (events' payload, headers and
    /// fields): the batch is cut short to fit. Keep it under what clients
    /// accept (gRPC's default is 4 MiB).
    #[arg(long, env = "OUTBOXD_MAX_CLAIM_BYTES", default_value_t = DEFAULT_MAX_CLAIM_BYTES)]
    pub max_claim_bytes: u64,

    /// Largest event handed out at all: one over --max-claim-bytes goes out
    /// alone; one over this is dead-lettered with its size in last_error.
    /// Clients must accept responses this large.
    #[arg(long, env = "OUTBOXD_MAX_MESSAGE_BYTES", default_value_t = DEFAULT_MAX_MESSAGE_BYTES)]
    pub max_message_bytes: u64,

    /// Lease when a claim does not ask for one.
    #[arg(long, env = "OUTBOXD_DEFAULT_LEASE", value_parser = parse_duration, default_value = "30s")]
    pub default_lease: Duration,

    /// Shortest lease a client may ask for.
    #[arg(long, env = "OUTBOXD_MIN_LEASE", value_parser = parse_duration, default_value = "1s")]
    pub min_lease: Duration,

    /// Longest lease a client may ask for.
    #[arg(long, env = "OUTBOXD_MAX_LEASE", value_parser = parse_duration, default_value = "15m")]
    pub max_lease: Duration,

    /// Longest long-poll wait; longer requests are shortened to it.
    #[arg(long, env = "OUTBOXD_MAX_WAIT", value_parser = parse_duration, default_value = "20s")]
    pub max_wait: Duration,

    /// How often a long-polling claim re-checks without a wake-up: the safety
    /// net for due retries, expired leases, and for new rows when nothing
    /// probes for them (`--probe-interval 0`, or a seq the probe cannot read).
    #[arg(long, env = "OUTBOXD_POLL_INTERVAL", value_parser = parse_duration, default_value = "500ms")]
    pub poll_interval: Duration,

    /// While claimers wait and inserts keep arriving, how often the table's
    /// sequence is probed to wake them (after a second without an insert, every
    /// 20 ms; never while nobody waits). Producers pay nothing on insert. 0
    /// disables probing: waiting claimers then re-check every --poll-interval.
    #[arg(long, env = "OUTBOXD_PROBE_INTERVAL", value_parser = parse_duration, default_value = "2ms")]
    pub probe_interval: Duration,

    /// How often published rows past retention are deleted.
    #[arg(long, env = "OUTBOXD_RETENTION_INTERVAL", value_parser = parse_duration, default_value = "1m")]
    pub retention_interval: Duration,

    /// How often each outbox's claim cursor is checked by a full walk of the
    /// pending rows below it (claimable rows it passed are handed out,
    /// logged and counted in outbox_claim_sweep_found_total, which should
    /// stay 0), and lease rows whose outbox row was deleted are removed. 0
    /// disables it.
    #[arg(long, env = "OUTBOXD_CLAIM_SWEEP_INTERVAL", value_parser = parse_duration, default_value = "5m")]
    pub claim_sweep_interval: Duration,

    /// Rows deleted per retention statement (a short statement, repeated).
    #[arg(long, env = "OUTBOXD_RETENTION_BATCH", default_value_t = 1000)]
    pub retention_batch: u32,

    /// How often the database is checked for the health service.
    #[arg(long, env = "OUTBOXD_HEALTH_INTERVAL", value_parser = parse_duration, default_value = "5s")]
    pub health_interval: Duration,

    /// How often the database watchdog samples what holds back the xmin
    /// horizon (old transactions, replication slots, prepared transactions)
    /// and each outbox table's dead tuples and vacuum ages: one cheap
    /// statement over the catalogue views per interval.
    #[arg(long, env = "OUTBOXD_WATCHDOG_INTERVAL", value_parser = parse_duration, default_value = "30s")]
    pub watchdog_interval: Duration,

    /// How old the holder of the xmin horizon may grow before the watchdog
    /// logs it (once per holder, at WARN; once at INFO when it is gone).
    #[arg(long, env = "OUTBOXD_XMIN_WARN_AFTER", value_parser = parse_duration, default_value = "10m")]
    pub xmin_warn_after: Duration,

    /// How long in-flight RPCs may take to finish after SIGTERM.
    #[arg(long, env = "OUTBOXD_DRAIN_TIMEOUT", value_parser = parse_duration, default_value = "20s")]
    pub drain_timeout: Duration,
}

/// Database settings, validated.
#[derive(Debug, Clone)]
pub struct DatabaseConfig {
    pub connect: PgConnectOptions,
    /// The URL with its password masked, for logs.
    pub display_url: String,
    pub max_connections: u32,
    pub acquire_timeout: Duration,
    /// As given; `None` takes the command's default.
    pub start_timeout: Option<Duration>,
    pub statement_timeout: Duration,
    pub outboxes: Vec<OutboxSpec>,
}

impl DatabaseConfig {
    /// How start-up reaches this database: `default_wait` applies unless
    /// `--db-start-timeout` was given; zero waits forever.
    pub fn connect_settings(&self, default_wait: Option<Duration>) -> ConnectSettings {
        ConnectSettings {
            options: self.connect.clone(),
            display_url: self.display_url.clone(),
            max_connections: self.max_connections,
            acquire_timeout: self.acquire_timeout,
            give_up_after: self.start_timeout.or(default_wait).filter(|d| !d.is_zero()),
            statement_timeout: self.statement_timeout,
        }
    }
}

/// Default of `--max-request-bytes`: gRPC's usual 4 MiB.
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 4 * 1024 * 1024;

/// Server settings, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub database: DatabaseConfig,
    pub listen: ListenAddr,
    /// Authorisation, when `--auth-tokens` is given.
    pub auth: Option<AuthSettings>,
    /// The API is open to whoever reaches the port: no `--auth-tokens`.
    pub unauthenticated: bool,
    /// TLS on the API port, when `--tls-cert` is given.
    pub tls: Option<TlsSettings>,
    pub health_listen: Option<ListenAddr>,
    /// The status page, when `--admin-http-listen` is given.
    pub admin_http_listen: Option<ListenAddr>,
    pub max_waiting_claims: u32,
    /// `--max-connections`; `None` sizes it from the file limit at start.
    pub max_connections: Option<usize>,
    pub max_request_bytes: usize,
    pub metrics_listen: ListenAddr,
    pub metrics_interval: Duration,
    pub migrate: bool,
    pub limits: Limits,
    pub poll_interval: Duration,
    pub probe_interval: Duration,
    pub retention_interval: Duration,
    pub retention_batch: u32,
    /// `None`: no sweeps (`--claim-sweep-interval 0`).
    pub claim_sweep_interval: Option<Duration>,
    pub health_interval: Duration,
    pub watchdog_interval: Duration,
    pub xmin_warn_after: Duration,
    pub drain_timeout: Duration,
}

impl DatabaseArgs {
    pub fn validate(&self) -> Result<DatabaseConfig, String> {
        let url = self
            .database_url
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or("--database-url (DATABASE_URL) is required")?;
        let parsed = url::Url::parse(url)
            .ok()
            .filter(|u| matches!(u.scheme(), "postgres" | "postgresql"))
            .ok_or("--database-url must be a postgres:// URL")?;
        let display_url = redact(parsed);
        let connect = PgConnectOptions::from_str(url)
            .map_err(|_| format!("--database-url is not a valid PostgreSQL URL: {display_url}"))?
            .application_name("outboxd");
        if self.db_acquire_timeout.is_zero() {
            return Err("--db-acquire-timeout must be positive".into());
        }
        if self.statement_timeout < Duration::from_millis(100) {
            return Err("--statement-timeout must be at least 100ms".into());
        }
        if self.db_max_connections == 0 {
            return Err("--db-max-connections must be at least 1".into());
        }
        if self.max_attempts == 0 {
            return Err("--max-attempts must be at least 1".into());
        }
        if !(1.0..=10.0).contains(&self.backoff_factor) {
            return Err("--backoff-factor must be between 1 and 10".into());
        }
        if !(0.0..=1.0).contains(&self.backoff_jitter) {
            return Err("--backoff-jitter must be between 0 and 1".into());
        }
        if self.backoff_base > self.backoff_max {
            return Err("--backoff-base must not exceed --backoff-max".into());
        }
        let defaults = OutboxPolicy {
            max_attempts: self.max_attempts,
            backoff: BackoffPolicy {
                base: self.backoff_base,
                factor: self.backoff_factor,
                cap: self.backoff_max,
                jitter: self.backoff_jitter,
            },
            retention: self.retention,
        };
        let args = self.outbox_args()?;
        let mut outboxes: Vec<OutboxSpec> = Vec::with_capacity(args.len());
        for arg in &args {
            if outboxes.iter().any(|o| o.name == arg.name) {
                return Err(format!("--outbox {}: configured twice", arg.name));
            }
            // Two outboxes on one table would each hand out its rows: every
            // event published twice, and an unordered one would break the
            // ordered one's per-aggregate order.
            if let Some(other) = outboxes.iter().find(|o| o.table == arg.table) {
                return Err(format!(
                    "--outbox: outboxes {} and {} both name table {}: each outbox needs a table of its own",
                    other.name, arg.name, arg.table
                ));
            }
            let spec = arg.resolve(&defaults);
            if spec.policy.backoff.base > spec.policy.backoff.cap {
                return Err(format!(
                    "--outbox {}: backoff_base exceeds backoff_max",
                    arg.name
                ));
            }
            outboxes.push(spec);
        }
        Ok(DatabaseConfig {
            connect,
            display_url,
            max_connections: self.db_max_connections,
            acquire_timeout: self.db_acquire_timeout,
            start_timeout: self.db_start_timeout,
            statement_timeout: self.statement_timeout,
            outboxes,
        })
    }

    /// Records which of the flags came from the environment (see
    /// `outboxes_from_env`).
    pub fn note_sources(&mut self, sources: &Sources) {
        self.outboxes_from_env = sources.is_from_env("--outbox");
    }

    fn outbox_args(&self) -> Result<Vec<OutboxArg>, String> {
        if self.outboxes.is_empty() {
            return Ok(vec![OutboxArg::from_str("default=public.outbox")?]);
        }
        if self.outboxes_from_env {
            return self
                .outboxes
                .iter()
                .flat_map(|value| value.split(','))
                .map(str::trim)
                .filter(|entry| !entry.is_empty())
                .map(|entry| OutboxArg::from_str(entry).map_err(|e| format!("--outbox {e}")))
                .collect();
        }
        self.outboxes
            .iter()
            .map(|value| {
                if value.contains(',') {
                    return Err(format!(
                        "--outbox {value:?}: options are separated by ':', not ','; repeat --outbox for another outbox"
                    ));
                }
                OutboxArg::from_str(value).map_err(|e| format!("--outbox {e}"))
            })
            .collect()
    }
}

impl ServeArgs {
    pub fn validate(&self) -> Result<Config, String> {
        let database = self.database.validate()?;
        if self.max_batch == 0 {
            return Err("--max-batch must be at least 1".into());
        }
        if self.max_claim_bytes < 1024 {
            return Err("--max-claim-bytes must be at least 1024".into());
        }
        if self.max_message_bytes < self.max_claim_bytes {
            return Err("--max-message-bytes must be at least --max-claim-bytes".into());
        }
        if self.min_lease.is_zero() || self.min_lease > self.max_lease {
            return Err("--min-lease must be positive and not exceed --max-lease".into());
        }
        if self.default_lease < self.min_lease || self.default_lease > self.max_lease {
            return Err("--default-lease must lie between --min-lease and --max-lease".into());
        }
        for (flag, value) in [
            ("--poll-interval", self.poll_interval),
            ("--retention-interval", self.retention_interval),
            ("--health-interval", self.health_interval),
            ("--metrics-interval", self.metrics_interval),
            ("--watchdog-interval", self.watchdog_interval),
        ] {
            if value.is_zero() {
                return Err(format!("{flag} must be positive"));
            }
        }
        if self.retention_batch == 0 {
            return Err("--retention-batch must be at least 1".into());
        }
        if self.max_waiting_claims == 0 {
            return Err("--max-waiting-claims must be at least 1".into());
        }
        if self.max_connections == Some(0) {
            return Err("--max-connections must be at least 1".into());
        }
        if self.max_request_bytes < 1024 {
            return Err("--max-request-bytes must be at least 1024".into());
        }
        let tls = self.tls_settings()?;
        let auth = match &self.auth_tokens {
            Some(path) => {
                let auth = AuthSettings {
                    tokens_file: path.clone(),
                };
                auth.check()?;
                Some(auth)
            }
            None => None,
        };
        let listen = self.listen_addr(auth.is_some())?;
        let admin_http_listen = self.admin_http_listen(auth.is_some())?;
        let metrics_listen = self.metrics_listen_addr(auth.is_some());
        Ok(Config {
            database,
            listen,
            unauthenticated: auth.is_none(),
            auth,
            tls,
            health_listen: self.health_listen.clone(),
            admin_http_listen,
            max_waiting_claims: self.max_waiting_claims,
            max_connections: self.max_connections.map(|n| n as usize),
            max_request_bytes: self.max_request_bytes,
            metrics_listen,
            metrics_interval: self.metrics_interval,
            migrate: !self.no_migrate,
            limits: Limits {
                max_batch: self.max_batch,
                default_lease: self.default_lease,
                min_lease: self.min_lease,
                max_lease: self.max_lease,
                max_wait: self.max_wait,
                max_claim_bytes: self.max_claim_bytes,
                max_message_bytes: self.max_message_bytes,
                max_retry_after: MAX_RETRY_AFTER,
            },
            poll_interval: self.poll_interval,
            probe_interval: self.probe_interval,
            retention_interval: self.retention_interval,
            retention_batch: self.retention_batch,
            claim_sweep_interval: (!self.claim_sweep_interval.is_zero())
                .then_some(self.claim_sweep_interval),
            health_interval: self.health_interval,
            watchdog_interval: self.watchdog_interval,
            xmin_warn_after: self.xmin_warn_after,
            drain_timeout: self.drain_timeout,
        })
    }
}

impl ServeArgs {
    /// The API's address. Without authorisation it must be loopback unless
    /// the operator says otherwise: an open API on a network lets anyone ack
    /// (lose) events.
    fn listen_addr(&self, authorised: bool) -> Result<ListenAddr, String> {
        let open = authorised || self.allow_unauthenticated;
        let listen = match &self.listen {
            Some(listen) => listen.clone(),
            None if open => ListenAddr::Ip(([0, 0, 0, 0], 50051).into()),
            None => ListenAddr::Ip(([127, 0, 0, 1], 50051).into()),
        };
        if !open && !is_loopback(&listen) {
            return Err(format!(
                "--listen {listen} is not a loopback address and there is no --auth-tokens: anyone who reaches the port could ack events without publishing them; give --auth-tokens, or --allow-unauthenticated to serve openly"
            ));
        }
        Ok(listen)
    }

    /// An explicit address is the operator's choice (metrics are read-only);
    /// only the default follows the API's rule.
    fn metrics_listen_addr(&self, authorised: bool) -> ListenAddr {
        match &self.metrics_listen {
            Some(listen) => listen.clone(),
            None if authorised || self.allow_unauthenticated => {
                ListenAddr::Ip(([0, 0, 0, 0], 9090).into())
            }
            None => ListenAddr::Ip(([127, 0, 0, 1], 9090).into()),
        }
    }

    /// The status page shows pids and application names of the database's
    /// sessions: the same rule as the API keeps it off networks when open.
    fn admin_http_listen(&self, authorised: bool) -> Result<Option<ListenAddr>, String> {
        match &self.admin_http_listen {
            Some(listen) if !authorised && !self.allow_unauthenticated && !is_loopback(listen) => {
                Err(format!(
                    "--admin-http-listen {listen} is not a loopback address and there is no --auth-tokens: anyone who reaches the port could read the status page; give --auth-tokens, or --allow-unauthenticated to serve openly"
                ))
            }
            listen => Ok(listen.clone()),
        }
    }

    fn tls_settings(&self) -> Result<Option<TlsSettings>, String> {
        let (cert, key) = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => (cert.clone(), key.clone()),
            (None, None) if self.tls_client_ca.is_some() => {
                return Err("--tls-client-ca needs --tls-cert and --tls-key".into());
            }
            (None, None) => return Ok(None),
            (Some(_), None) => return Err("--tls-cert needs --tls-key".into()),
            (None, Some(_)) => return Err("--tls-key needs --tls-cert".into()),
        };
        if self.tls_reload_interval.is_zero() {
            return Err("--tls-reload-interval must be positive".into());
        }
        let tls = TlsSettings {
            cert,
            key,
            client_ca: self.tls_client_ca.clone(),
            reload_interval: self.tls_reload_interval,
        };
        tls.check()?;
        Ok(Some(tls))
    }
}

/// Whether only this host can reach the address: a loopback IP, or the name
/// `localhost`. Any other name might resolve to a routable address.
fn is_loopback(listen: &ListenAddr) -> bool {
    match listen {
        ListenAddr::Ip(addr) => addr.ip().is_loopback(),
        ListenAddr::Name { host, .. } => {
            host.eq_ignore_ascii_case("localhost") || host.eq_ignore_ascii_case("localhost.")
        }
    }
}

/// outboxd's limits with every flag at its default, for unit tests elsewhere:
/// the flags are where defaults are defined.
#[cfg(test)]
pub(crate) fn default_limits() -> Limits {
    let cli = Cli::try_parse_from(["outboxd", "--database-url", "postgres://db/app"])
        .expect("the default flags parse");
    cli.serve
        .validate()
        .expect("the default flags are valid")
        .limits
}

/// Masks the password so the URL can be logged.
fn redact(mut url: url::Url) -> String {
    if url.password().is_some() {
        let _ = url.set_password(Some("redacted"));
    }
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> Result<Config, String> {
        let mut argv = vec!["outboxd"];
        argv.extend_from_slice(args);
        let cli = Cli::try_parse_from(argv).map_err(|e| e.to_string())?;
        cli.serve.validate()
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let config = serve(&["--database-url", "postgres://u:secret@db:5432/app"]).expect("valid");
        assert_eq!(config.listen, "127.0.0.1:50051".parse().expect("addr"));
        assert!(config.unauthenticated);
        assert_eq!(config.max_waiting_claims, 1024);
        assert_eq!(config.max_request_bytes, 4 * 1024 * 1024);
        assert_eq!(config.limits.max_batch, 1000);
        assert_eq!(config.limits.default_lease, Duration::from_secs(30));
        assert_eq!(config.limits.max_wait, Duration::from_secs(20));
        assert_eq!(config.poll_interval, Duration::from_millis(500));
        assert_eq!(config.database.outboxes.len(), 1);
        let default = &config.database.outboxes[0];
        assert_eq!(
            (default.name.as_str(), default.table.to_string()),
            ("default", "public.outbox".into())
        );
        assert_eq!(default.policy.max_attempts, 10);
        assert_eq!(default.policy.retention, Duration::from_secs(7 * 24 * 3600));
        assert!(config.migrate);
        assert_eq!(config.watchdog_interval, Duration::from_secs(30));
        assert_eq!(config.xmin_warn_after, Duration::from_secs(600));
    }

    #[test]
    fn the_watchdog_interval_must_be_positive() {
        let url = "postgres://u@db/app";
        let err = serve(&["--database-url", url, "--watchdog-interval", "0"]).expect_err("zero");
        assert!(err.contains("--watchdog-interval"), "{err}");
        let config =
            serve(&["--database-url", url, "--watchdog-interval", "200ms"]).expect("valid");
        assert_eq!(config.watchdog_interval, Duration::from_millis(200));
    }

    #[test]
    fn an_open_api_listens_on_loopback_unless_allowed() {
        let url = "postgres://localhost/app";
        let open = serve(&["--database-url", url, "--allow-unauthenticated"]).expect("valid");
        assert_eq!(open.listen, "0.0.0.0:50051".parse().expect("addr"));
        assert_eq!(open.metrics_listen, "0.0.0.0:9090".parse().expect("addr"));
        assert!(open.unauthenticated);
        let local = serve(&["--database-url", url]).expect("valid");
        assert_eq!(
            local.metrics_listen,
            "127.0.0.1:9090".parse().expect("addr"),
            "an open server publishes its metrics to this host only"
        );
        let chosen = serve(&["--database-url", url, "--metrics-listen", "0.0.0.0:9100"])
            .expect("an explicit metrics address is the operator's choice");
        assert_eq!(chosen.metrics_listen, "0.0.0.0:9100".parse().expect("addr"));
        for local in ["127.0.0.1:7000", "[::1]:7000", "localhost:7000"] {
            assert!(serve(&["--database-url", url, "--listen", local]).is_ok());
        }
        for public in ["0.0.0.0:7000", "10.1.2.3:7000", "[::]:7000", "outboxd:7000"] {
            let err = serve(&["--database-url", url, "--listen", public]).expect_err(public);
            assert!(err.contains("--auth-tokens"), "{err}");
            assert!(
                serve(&[
                    "--database-url",
                    url,
                    "--listen",
                    public,
                    "--allow-unauthenticated"
                ])
                .is_ok()
            );
        }
    }

    #[test]
    fn tls_flags_come_in_pairs() {
        let url = "postgres://localhost/app";
        let err = serve(&["--database-url", url, "--tls-cert", "/c.pem"]).expect_err("no key");
        assert!(err.contains("--tls-key"), "{err}");
        let err = serve(&["--database-url", url, "--tls-key", "/k.pem"]).expect_err("no cert");
        assert!(err.contains("--tls-cert"), "{err}");
        let err = serve(&["--database-url", url, "--tls-client-ca", "/ca.pem"]).expect_err("ca");
        assert!(err.contains("--tls-cert"), "{err}");
        assert!(serve(&["--database-url", url, "--max-waiting-claims", "0"]).is_err());
    }

    #[test]
    fn the_password_never_reaches_the_display_url() {
        let config = serve(&["--database-url", "postgres://u:secret@db/app"]).expect("valid");
        assert!(!config.database.display_url.contains("secret"));
        assert!(config.database.display_url.contains("redacted"));
    }

    #[test]
    fn invalid_values_are_refused_with_a_reason() {
        let url = "postgres://localhost/app";
        assert!(serve(&[]).expect_err("no url").contains("--database-url"));
        assert!(serve(&["--database-url", "mysql://x/y"]).is_err());
        assert!(serve(&["--database-url", url, "--max-batch", "0"]).is_err());
        assert!(serve(&["--database-url", url, "--default-lease", "1h"]).is_err());
        assert!(
            serve(&[
                "--database-url",
                url,
                "--outbox",
                "a=public.x",
                "--outbox",
                "a=public.y"
            ])
            .is_err()
        );
        assert!(serve(&["--database-url", url, "--poll-interval", "0"]).is_err());
        assert!(serve(&["--database-url", url, "--outbox", "bad"]).is_err());
        assert_eq!(
            serve(&["--database-url", url, "--max-connections", "0"]).expect_err("zero"),
            "--max-connections must be at least 1"
        );
        assert_eq!(
            serve(&["--database-url", url, "--max-connections", "300"])
                .expect("valid")
                .max_connections,
            Some(300)
        );
    }

    #[test]
    fn several_outboxes_with_per_outbox_policy() {
        let config = serve(&[
            "--database-url",
            "postgres://localhost/app",
            "--outbox",
            "default=public.outbox",
            "--outbox",
            "orders=sales.outbox:max_attempts=3:retention=0",
        ])
        .expect("valid");
        let orders = &config.database.outboxes[1];
        assert_eq!(orders.policy.max_attempts, 3);
        assert!(orders.policy.retention.is_zero());
    }

    #[test]
    fn a_comma_in_an_outbox_flag_is_refused_but_the_variable_splits_on_it() {
        let url = "postgres://localhost/app";
        let err = serve(&[
            "--database-url",
            url,
            "--outbox",
            "orders=public.orders:max_attempts=3,retention=0",
        ])
        .expect_err("a comma on the flag");
        assert!(err.contains("options are separated by ':'"), "{err}");

        let mut cli = Cli::try_parse_from(["outboxd", "--database-url", url]).expect("parses");
        cli.serve.database.outboxes =
            vec!["default=public.outbox, orders=sales.outbox:max_attempts=3".into()];
        cli.serve.database.outboxes_from_env = true;
        let config = cli.serve.validate().expect("the variable splits on commas");
        let names: Vec<_> = config
            .database
            .outboxes
            .iter()
            .map(|o| o.name.as_str())
            .collect();
        assert_eq!(names, ["default", "orders"]);
        assert_eq!(config.database.outboxes[1].policy.max_attempts, 3);
    }

    #[test]
    fn two_outboxes_on_one_table_are_refused_naming_both() {
        let url = "postgres://localhost/app";
        for (a, b) in [
            (
                "default=public.outbox",
                "orders=public.outbox:ordering=aggregate",
            ),
            // An unqualified table is in `public`: the same table.
            ("default=outbox", "orders=public.outbox:ordering=aggregate"),
        ] {
            let err = serve(&["--database-url", url, "--outbox", a, "--outbox", b])
                .expect_err("one table, two outboxes");
            assert_eq!(
                err,
                "--outbox: outboxes default and orders both name table public.outbox: each outbox needs a table of its own"
            );
        }
        serve(&[
            "--database-url",
            url,
            "--outbox",
            "default=public.outbox",
            "--outbox",
            "orders=sales.outbox",
        ])
        .expect("two tables");
    }

    fn sources(argv: &[&str], env: &[&str]) -> Sources {
        let argv: Vec<std::ffi::OsString> = argv.iter().map(Into::into).collect();
        Sources::read(&<Cli as clap::CommandFactory>::command(), &argv, |var| {
            env.iter().any(|e| var == *e)
        })
    }

    #[test]
    fn an_error_names_the_variable_a_value_came_from() {
        let from_env = sources(&["outboxd"], &["OUTBOXD_MAX_BATCH", "OUTBOXD_MIN_LEASE"]);
        assert_eq!(
            from_env.explain("--max-batch must be at least 1"),
            "OUTBOXD_MAX_BATCH (--max-batch) must be at least 1"
        );
        assert_eq!(
            from_env.explain("invalid value 'x' for '--max-batch <MAX_BATCH>': bad"),
            "invalid value 'x' for 'OUTBOXD_MAX_BATCH (--max-batch)': bad"
        );
        assert_eq!(
            from_env.explain("--min-lease must not exceed --max-lease"),
            "OUTBOXD_MIN_LEASE (--min-lease) must not exceed --max-lease"
        );
        // A flag on the command line wins over the variable, and is named as typed.
        for argv in [
            &["outboxd", "--max-batch", "0"][..],
            &["outboxd", "--max-batch=0"],
        ] {
            let typed = sources(argv, &["OUTBOXD_MAX_BATCH"]);
            assert_eq!(
                typed.explain("--max-batch must be at least 1"),
                "--max-batch must be at least 1"
            );
        }
        // `migrate`'s flags too.
        let migrate = sources(&["outboxd", "migrate"], &["OUTBOXD_DB_MAX_CONNECTIONS"]);
        assert!(
            migrate
                .explain("--db-max-connections must be at least 1")
                .starts_with("OUTBOXD_DB_MAX_CONNECTIONS")
        );
    }
}
