//! Issue #34, what the trust boundary costs: the same figures with the API
//! over TLS and a bearer token (`--tls-cert`, `--tls-key`, `--auth-tokens`;
//! the relay with `https://`, `--tls-ca`, `--token-file`) against plaintext
//! without authorisation, measured in one run, the two alternating. No
//! target: the report gives the ratios and what dominates them.
//!
//! - Claim→ack: `ClaimBatch` then `Ack` of what it returned, timed as one
//!   pair, from two outboxd processes serving one table (one plaintext, one
//!   TLS + token) in turn, at batch sizes 1 and 100; and each outboxd's CPU
//!   seconds over those pairs. Also the first call on a new connection (TCP,
//!   the TLS handshake when there is one, HTTP/2, one `GetStats`).
//! - Drain: the drain's backlog by outboxd + outbox-relay, plaintext and
//!   TLS + token, at the drain's batch sizes and worker counts.

use std::{
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use outboxd::pb::{self, outbox_service_client::OutboxServiceClient};
use sha2::Digest as _;
use tonic::{
    metadata::{Ascii, MetadataValue},
    service::interceptor::InterceptedService,
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint},
};

use crate::{
    Plan, db,
    procs::{self, Proc, Secure},
    report::Check,
    scenarios::{self, Ctx, DrainRun, OutboxdTable, Results},
    stats,
};

/// Untimed pairs (and connections) per side before the timed ones.
const WARM_UP: usize = 3;

/// The batch sizes of the claim→ack pairs: the call's fixed cost, and the
/// cost with a batch's worth of payload to encrypt.
pub const PAIR_BATCHES: [u32; 2] = [1, 100];

/// The API as served: plaintext and open, or TLS with a bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Plain,
    Secure,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Self::Plain => "plaintext",
            Self::Secure => "TLS + token",
        }
    }

    fn tag(self) -> &'static str {
        match self {
            Self::Plain => "plain",
            Self::Secure => "tls",
        }
    }

    /// Both, the first alternating with `k`.
    fn in_turn(k: usize) -> [Self; 2] {
        if k.is_multiple_of(2) {
            [Self::Plain, Self::Secure]
        } else {
            [Self::Secure, Self::Plain]
        }
    }
}

/// Timed claim→ack pairs of one batch size, per mode.
#[derive(Debug, Clone)]
pub struct PairCase {
    pub batch: u32,
    pub plain_ms: Vec<f64>,
    pub secure_ms: Vec<f64>,
    /// Each outboxd's CPU seconds over this case's timed pairs, per pair.
    pub plain_cpu_us: f64,
    pub secure_cpu_us: f64,
    /// Time inside each outboxd's `ClaimBatch` and `Ack` handlers (its
    /// `outbox_rpc_duration_seconds` sums: the authorisation check and the
    /// statements, not TLS, HTTP/2 or protobuf), per timed pair.
    pub plain_handler_us: f64,
    pub secure_handler_us: f64,
}

impl PairCase {
    /// TLS + token over plaintext at quantile `q`.
    pub fn ratio(&self, q: f64) -> f64 {
        stats::quantile(&self.secure_ms, q) / stats::quantile(&self.plain_ms, q)
    }
}

#[derive(Debug, Clone)]
pub struct SecureDrainCase {
    pub batch: u32,
    pub workers: u32,
    pub plain: Vec<DrainRun>,
    pub secure: Vec<DrainRun>,
}

impl SecureDrainCase {
    /// TLS + token over plaintext of `f`, per repetition.
    pub fn paired(&self, f: impl Fn(&DrainRun) -> f64) -> Vec<f64> {
        self.secure
            .iter()
            .zip(&self.plain)
            .map(|(s, p)| f(s) / f(p))
            .collect()
    }
}

#[derive(Debug, Clone, Default)]
pub struct Security {
    pub pairs: Vec<PairCase>,
    /// New connection to the first answer, milliseconds.
    pub connect_plain_ms: Vec<f64>,
    pub connect_secure_ms: Vec<f64>,
    /// New connection until the channel is up (TCP, and the TLS handshake
    /// when there is one), before any call, milliseconds.
    pub transport_plain_ms: Vec<f64>,
    pub transport_secure_ms: Vec<f64>,
    pub drains: Vec<SecureDrainCase>,
}

/// Progress steps of the scenarios `plan` runs here.
pub fn steps(plan: &Plan) -> u64 {
    let mut n = 0;
    if plan.secure_pairs || plan.secure_drain {
        n += 1;
    }
    if plan.secure_pairs {
        n += 1 + PAIR_BATCHES.len() as u64;
    }
    if plan.secure_drain {
        n += plan.reps as u64 * 2 * (plan.batch_sizes.len() * plan.workers.len()) as u64;
    }
    n
}

pub async fn run(ctx: &Ctx, plan: &Plan, results: &mut Results) -> anyhow::Result<()> {
    if !(plan.secure_pairs || plan.secure_drain) {
        return Ok(());
    }
    ctx.progress
        .doing("security: certificates, a token, and the database");
    let secure = make_files(&ctx.log_dir.join("security"))?;
    db::create_database(&ctx.admin, &ctx.db_security).await?;
    ctx.migrate(&ctx.db_security).await?;
    ctx.progress.done_step();
    let mut security = Security::default();
    if plan.secure_pairs {
        pairs(ctx, plan, &secure, &mut security).await?;
    }
    if plan.secure_drain {
        drains(ctx, plan, &secure, &mut security).await?;
    }
    results.security = Some(security);
    Ok(())
}

/// A CA, a certificate for `localhost` and 127.0.0.1 signed by it, a random
/// token and the tokens file granting it `relay:*` and `admin:*`, in `dir`.
fn make_files(dir: &Path) -> anyhow::Result<Secure> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "outbox-bench CA");
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate()?;
    let server_params =
        CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
    let server_cert = server_params.signed_by(&server_key, &issuer)?;
    let token = uuid::Uuid::new_v4().simple().to_string();
    let digest = hex::encode(sha2::Sha256::digest(token.as_bytes()));
    let secure = Secure {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
        tokens: dir.join("tokens"),
        token_file: dir.join("token"),
    };
    for (path, content) in [
        (&secure.ca, ca_cert.pem()),
        (&secure.cert, server_cert.pem()),
        (&secure.key, server_key.serialize_pem()),
        (
            &secure.tokens,
            format!("# outbox-bench\nbench sha256:{digest} relay:* admin:*\n"),
        ),
        (&secure.token_file, format!("{token}\n")),
    ] {
        std::fs::write(path, content).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(secure)
}

/// Adds the bearer token, when there is one, to every call.
#[derive(Clone)]
struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

type Client = OutboxServiceClient<InterceptedService<Channel, Bearer>>;

/// A new connection to outboxd at `addr` as `mode` needs it, and the time to
/// its first answer (a `GetStats`).
/// Also the time until the channel was up, before the first call.
async fn connect(
    addr: SocketAddr,
    mode: Mode,
    secure: &Secure,
) -> anyhow::Result<(Client, f64, f64)> {
    let (endpoint, bearer) = match mode {
        Mode::Plain => (
            Endpoint::from_shared(format!("http://{addr}"))?,
            Bearer(None),
        ),
        Mode::Secure => {
            let ca = std::fs::read_to_string(&secure.ca).context("reading the bench CA")?;
            let token = std::fs::read_to_string(&secure.token_file).context("reading the token")?;
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(ca))
                .domain_name("localhost");
            let endpoint = Endpoint::from_shared(format!("https://{addr}"))?.tls_config(tls)?;
            let value = format!("Bearer {}", token.trim())
                .parse()
                .context("the token as a header")?;
            (endpoint, Bearer(Some(value)))
        }
    };
    // Timed from here: reading the CA and token files and building the client's
    // TLS configuration are set-up, not the connection.
    let started = Instant::now();
    let channel = endpoint
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to outboxd ({})", mode.label()))?;
    let connected = started.elapsed().as_secs_f64() * 1000.0;
    let mut client = OutboxServiceClient::with_interceptor(channel, bearer);
    client
        .get_stats(pb::GetStatsRequest {
            outbox: "default".into(),
        })
        .await
        .with_context(|| format!("GetStats ({})", mode.label()))?;
    Ok((client, connected, started.elapsed().as_secs_f64() * 1000.0))
}

/// Two outboxd on the security database, plaintext and TLS + token.
async fn start_both(ctx: &Ctx, secure: &Secure) -> anyhow::Result<[(Proc, SocketAddr); 2]> {
    let url = ctx.url(&ctx.db_security)?;
    let mut started = Vec::new();
    for mode in [Mode::Plain, Mode::Secure] {
        let secured = (mode == Mode::Secure).then_some(secure);
        let (proc, addr) = procs::start_outboxd_secured(
            &ctx.bins,
            &url,
            &ctx.log_dir,
            &format!("pairs-{}", mode.tag()),
            &[],
            secured,
        )
        .await?;
        ctx.record(&proc.cmdline).await;
        started.push((proc, addr));
    }
    let secure_side = started.pop().context("two outboxd")?;
    let plain_side = started.pop().context("two outboxd")?;
    Ok([plain_side, secure_side])
}

async fn pairs(
    ctx: &Ctx,
    plan: &Plan,
    secure: &Secure,
    security: &mut Security,
) -> anyhow::Result<()> {
    let rounds = plan.secure_claims + WARM_UP;
    let events: u64 = PAIR_BATCHES
        .iter()
        .map(|&b| u64::from(b) * rounds as u64 * 2)
        .sum();
    ctx.progress.doing(format!(
        "security: {events} pending events, outboxd plaintext and over TLS + token"
    ));
    let servers = start_both(ctx, secure).await?;
    let addr = |mode: Mode| servers[usize::from(mode == Mode::Secure)].1;
    // New connections, in turn; the first few warm up. Measured on the empty
    // table: the first answer is a `GetStats`, whose counts read the whole
    // table, so with the pairs' backlog there it timed that count (≈ 40 ms),
    // not the connection.
    for k in 0..WARM_UP + plan.secure_claims.min(50) {
        for mode in Mode::in_turn(k) {
            let (_, connected, ms) = connect(addr(mode), mode, secure).await?;
            if k >= WARM_UP {
                match mode {
                    Mode::Plain => {
                        security.connect_plain_ms.push(ms);
                        security.transport_plain_ms.push(connected);
                    }
                    Mode::Secure => {
                        security.connect_secure_ms.push(ms);
                        security.transport_secure_ms.push(connected);
                    }
                }
            }
        }
    }
    scenarios::prepare_backlog_in(
        ctx,
        &ctx.db_security,
        "public",
        db::Shape::Outboxd,
        events,
        db::AGGREGATES,
    )
    .await?;
    ctx.progress.done_step();
    let mut clients = Vec::new();
    for mode in [Mode::Plain, Mode::Secure] {
        clients.push(connect(addr(mode), mode, secure).await?.0);
    }
    for batch in PAIR_BATCHES {
        ctx.progress.doing(format!(
            "security: {} claim→ack pairs of {batch} per side, in turn",
            plan.secure_claims
        ));
        let mut case = PairCase {
            batch,
            plain_ms: Vec::new(),
            secure_ms: Vec::new(),
            plain_cpu_us: f64::NAN,
            secure_cpu_us: f64::NAN,
            plain_handler_us: f64::NAN,
            secure_handler_us: f64::NAN,
        };
        let mut cpu_before = [0.0; 2];
        let mut handler_before = [f64::NAN; 2];
        for k in 0..rounds {
            if k == WARM_UP {
                // Scraped before the CPU is read: rendering /metrics is not a pair's cost.
                handler_before = [
                    handler_secs(&servers[0].0).await,
                    handler_secs(&servers[1].0).await,
                ];
                cpu_before = [servers[0].0.usage().cpu_secs, servers[1].0.usage().cpu_secs];
            }
            for mode in Mode::in_turn(k) {
                let side = usize::from(mode == Mode::Secure);
                let ms = claim_ack(&mut clients[side], batch).await?;
                if k >= WARM_UP {
                    match mode {
                        Mode::Plain => case.plain_ms.push(ms),
                        Mode::Secure => case.secure_ms.push(ms),
                    }
                }
            }
        }
        let per_pair = |side: usize| {
            (servers[side].0.usage().cpu_secs - cpu_before[side]) * 1e6 / plan.secure_claims as f64
        };
        case.plain_cpu_us = per_pair(0);
        case.secure_cpu_us = per_pair(1);
        for side in 0..2 {
            let us = (handler_secs(&servers[side].0).await - handler_before[side]) * 1e6
                / plan.secure_claims as f64;
            if side == 0 {
                case.plain_handler_us = us;
            } else {
                case.secure_handler_us = us;
            }
        }
        ctx.progress.log(format!(
            "claim→ack of {batch}: p50 {:.2} / {:.2} ms, p99 {:.2} / {:.2} ms (plaintext / TLS + token), outboxd CPU {:.0} / {:.0} µs per pair, in handlers {:.0} / {:.0} µs per pair",
            stats::quantile(&case.plain_ms, 0.5),
            stats::quantile(&case.secure_ms, 0.5),
            stats::quantile(&case.plain_ms, 0.99),
            stats::quantile(&case.secure_ms, 0.99),
            case.plain_cpu_us,
            case.secure_cpu_us,
            case.plain_handler_us,
            case.secure_handler_us,
        ));
        security.pairs.push(case);
        ctx.progress.done_step();
    }
    drop(clients);
    for (proc, _) in servers {
        proc.stop(Duration::from_secs(10)).await?;
    }
    Ok(())
}

/// Seconds outboxd has spent inside its `ClaimBatch` and `Ack` handlers so far
/// (NaN when its metrics endpoint does not answer).
async fn handler_secs(proc: &Proc) -> f64 {
    let Some(addr) = proc.metrics else {
        return f64::NAN;
    };
    let Ok(scrape) = crate::scrape::fetch(addr).await else {
        return f64::NAN;
    };
    ["ClaimBatch", "Ack"]
        .iter()
        .map(|m| crate::scrape::histogram(&scrape, "outbox_rpc_duration_seconds", "method", m).0)
        .sum()
}

/// One `ClaimBatch(batch)` and the `Ack` of what it returned, timed together;
/// the claim must return the whole batch.
async fn claim_ack(client: &mut Client, batch: u32) -> anyhow::Result<f64> {
    let started = Instant::now();
    let claimed = tokio::time::timeout(
        Duration::from_secs(30),
        client.claim_batch(pb::ClaimBatchRequest {
            outbox: "default".into(),
            worker_id: "outbox-bench".into(),
            max_messages: batch,
            lease_duration: Some(prost_types::Duration {
                seconds: 60,
                nanos: 0,
            }),
            wait: None,
            acks: Vec::new(),
            max_response_bytes: 0,
        }),
    )
    .await
    .context("ClaimBatch timed out")?
    .context("ClaimBatch")?
    .into_inner();
    anyhow::ensure!(
        claimed.messages.len() == batch as usize,
        "security: a claim of {batch} returned {} events",
        claimed.messages.len()
    );
    tokio::time::timeout(
        Duration::from_secs(30),
        client.ack(pb::AckRequest {
            outbox: "default".into(),
            lease_id: claimed.lease_id,
            message_ids: claimed.messages.into_iter().map(|m| m.id).collect(),
        }),
    )
    .await
    .context("Ack timed out")?
    .context("Ack")?;
    Ok(started.elapsed().as_secs_f64() * 1000.0)
}

async fn drains(
    ctx: &Ctx,
    plan: &Plan,
    secure: &Secure,
    security: &mut Security,
) -> anyhow::Result<()> {
    let mut cases: Vec<SecureDrainCase> = Vec::new();
    for &batch in &plan.batch_sizes {
        for &workers in &plan.workers {
            cases.push(SecureDrainCase {
                batch,
                workers,
                plain: Vec::new(),
                secure: Vec::new(),
            });
        }
    }
    let n = plan.events;
    for rep in 0..plan.reps {
        for case in &mut cases {
            let (batch, workers) = (case.batch, case.workers);
            for mode in Mode::in_turn(rep) {
                ctx.progress.doing(format!(
                    "rep {}/{}: drain {n}, {}, batch {batch}, {workers} worker(s)",
                    rep + 1,
                    plan.reps,
                    mode.label(),
                ));
                let table = OutboxdTable {
                    db_name: &ctx.db_security,
                    schema: "public",
                    outbox: None,
                    aggregates: db::AGGREGATES,
                    tag: mode.tag(),
                    secure: (mode == Mode::Secure).then_some(secure),
                };
                let run = scenarios::retried(ctx, "security drain run", || {
                    scenarios::drain_outboxd_on(
                        ctx,
                        &table,
                        n,
                        batch,
                        workers,
                        scenarios::drain_budget(n),
                    )
                })
                .await?;
                ctx.progress.log(format!(
                    "rep {} drain {} b{batch} w{workers}: {:.0} ev/s, outboxd {:.2} CPU s, relay {:.2} CPU s",
                    rep + 1,
                    mode.label(),
                    run.events_per_sec,
                    run.outboxd.cpu_secs,
                    run.relay.cpu_secs,
                ));
                match mode {
                    Mode::Plain => case.plain.push(run),
                    Mode::Secure => case.secure.push(run),
                }
                ctx.progress.done_step();
            }
        }
    }
    security.drains = cases;
    Ok(())
}

/// CPU seconds per 100 000 events of one process in a drain.
fn per100k(run: &DrainRun, cpu: impl Fn(&DrainRun) -> f64) -> f64 {
    cpu(run) * 100_000.0 / (run.events_per_sec * run.secs).max(1.0)
}

fn mean(v: &[f64]) -> f64 {
    v.iter().sum::<f64>() / v.len().max(1) as f64
}

fn median(runs: &[DrainRun], f: impl Fn(&DrainRun) -> f64) -> f64 {
    stats::Spread::of(&runs.iter().map(f).collect::<Vec<_>>()).median
}

/// The targets table's rows: ratios with no target.
pub fn checks(sec: &Security) -> Vec<Check> {
    let mut out = Vec::new();
    for case in &sec.pairs {
        out.push(Check {
            target: format!(
                "claim→ack of {} over TLS + token ÷ plaintext, p50 / p99",
                case.batch
            ),
            measured: format!("{:.2}× / {:.2}×", case.ratio(0.5), case.ratio(0.99)),
            pass: None,
            no_target: true,
        });
    }
    for case in &sec.drains {
        out.push(Check {
            target: format!(
                "drain over TLS + token ÷ plaintext (batch {} × {})",
                case.batch, case.workers
            ),
            measured: format!(
                "{}×",
                stats::Spread::of(&case.paired(|x| x.events_per_sec)).show(2)
            ),
            pass: None,
            no_target: true,
        });
    }
    out
}

pub fn section(s: &mut String, sec: &Security) {
    let _ = writeln!(s, "## The cost of TLS and a token (#34)\n");
    let _ = writeln!(
        s,
        "outboxd serving its API over TLS (`--tls-cert`, `--tls-key`, an ECDSA P-256 certificate from a CA made \
         for the run) with authorisation on (`--auth-tokens`, one `sha256:` line with `relay:* admin:*`), against \
         the same outboxd in plaintext with no authorisation, in the same run, the two alternating. Clients send \
         `authorization: Bearer <token>` and verify the certificate against the CA. No target: the ratios say \
         what the trust boundary costs.\n"
    );
    if !sec.pairs.is_empty() {
        let _ = writeln!(
            s,
            "### Claim→ack\n\n`ClaimBatch(n)` and the `Ack` of its events, timed together, on one long-lived \
             connection per side; two outboxd processes serve one table, taken from in turn. CPU is each \
             outboxd's user + system seconds over the timed pairs, per pair. In handlers is the time inside \
             outboxd's `ClaimBatch` and `Ack` handlers per pair (the sums of its `outbox_rpc_duration_seconds`: \
             the token check and the statements, not TLS, HTTP/2 or protobuf); the rest of a pair's wall \
             time is the transport, both ends' gRPC stacks and the harness.\n"
        );
        let _ = writeln!(
            s,
            "| batch | pairs | p50 ms plaintext / TLS + token | ratio | p99 ms plaintext / TLS + token | ratio | mean ms plaintext / TLS + token | outboxd CPU µs per pair | in handlers µs per pair |\n\
             | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
        );
        for c in &sec.pairs {
            let _ = writeln!(
                s,
                "| {} | {} | {:.2} / {:.2} | {:.2}× | {:.2} / {:.2} | {:.2}× | {:.2} / {:.2} | {:.0} / {:.0} | {:.0} / {:.0} |",
                c.batch,
                c.plain_ms.len(),
                stats::quantile(&c.plain_ms, 0.5),
                stats::quantile(&c.secure_ms, 0.5),
                c.ratio(0.5),
                stats::quantile(&c.plain_ms, 0.99),
                stats::quantile(&c.secure_ms, 0.99),
                c.ratio(0.99),
                mean(&c.plain_ms),
                mean(&c.secure_ms),
                c.plain_cpu_us,
                c.secure_cpu_us,
                c.plain_handler_us,
                c.secure_handler_us,
            );
        }
        let _ = writeln!(
            s,
            "\nA new connection to its first answer (TCP, the TLS handshake, HTTP/2, one `GetStats` on the \
             empty table), {} each: plaintext p50 {:.2} ms, TLS + token p50 {:.2} ms; of which until the channel \
             is up (TCP, the TLS handshake), before any call: plaintext p50 {:.2} ms, TLS + token p50 {:.2} ms.\n",
            sec.connect_plain_ms.len(),
            stats::quantile(&sec.connect_plain_ms, 0.5),
            stats::quantile(&sec.connect_secure_ms, 0.5),
            stats::quantile(&sec.transport_plain_ms, 0.5),
            stats::quantile(&sec.transport_secure_ms, 0.5),
        );
    }
    if !sec.drains.is_empty() {
        let _ = writeln!(
            s,
            "### Drain\n\nThe drain's backlog by outboxd + outbox-relay (`--server https://localhost:PORT --tls-ca \
             --token-file` on the TLS side). CPU columns are seconds per 100 000 events, plaintext / TLS + token, \
             medians.\n"
        );
        let _ = writeln!(
            s,
            "| batch | workers | plaintext ev/s | TLS + token ev/s | ratio | outboxd CPU s | relay CPU s |\n\
             | --- | --- | --- | --- | --- | --- | --- |"
        );
        for c in &sec.drains {
            let rate = |runs: &[DrainRun]| {
                stats::Spread::of(&runs.iter().map(|x| x.events_per_sec).collect::<Vec<_>>())
                    .show(0)
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {}× | {:.2} / {:.2} | {:.2} / {:.2} |",
                c.batch,
                c.workers,
                rate(&c.plain),
                rate(&c.secure),
                stats::Spread::of(&c.paired(|x| x.events_per_sec)).show(2),
                median(&c.plain, |x| per100k(x, |r| r.outboxd.cpu_secs)),
                median(&c.secure, |x| per100k(x, |r| r.outboxd.cpu_secs)),
                median(&c.plain, |x| per100k(x, |r| r.relay.cpu_secs)),
                median(&c.secure, |x| per100k(x, |r| r.relay.cpu_secs)),
            );
        }
        s.push('\n');
    }
}
