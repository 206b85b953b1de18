//! The fault suite's harness: a database of its own per case, outboxd as real
//! child processes (so kill -9 is real), producers that commit events straight
//! into the case's database, workers that claim, "publish" (record), ack and
//! sometimes nack over gRPC, a sampler of what is under lease while a fault is
//! on, and the end of every case: drain, read the final table, check.

mod metrics;
mod producers;
mod sampler;
mod workers;

use std::{
    collections::{BTreeMap, HashMap},
    net::SocketAddr,
    process::Stdio,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use outboxd::grpc::pb::{GetStatsRequest, outbox_service_client::OutboxServiceClient};
use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::{Child, Command},
    task::JoinHandle,
    time::Instant,
};

use crate::{
    history::{self, Figures, FinalRow, History},
    shared::{
        bins,
        cluster::PrivateCluster,
        db::TestDb,
        net::free_port,
        proxy::Proxy,
        wait::{secs, wait_until},
    },
};
pub use metrics::{Scrape, http_get};
pub use producers::{burst, produce, produce_shared};
pub use sampler::Sampler;
pub use workers::{Conn, LEASE, Targets, Workers};

/// Workers in a case's load.
const WORKERS: usize = 4;

/// The ordered outbox of a case under [`Case::load_ordered`]. Attempts are
/// far above what nacks, expiries and crashes add up to: a dead-lettered head
/// would block its aggregate (`poison=block`) and the case would never drain.
pub const ORDERED: [&str; 2] = [
    "--outbox",
    "default=public.outbox:ordering=aggregate:max_attempts=100",
];

/// Aggregates the producers of [`Case::load_ordered`] write: few enough that
/// overlapping transactions often write the same one, enough that four
/// workers, one event per aggregate at a time, keep up with the producers.
const ORDERED_AGGREGATES: usize = 100;

/// What the cases read from their database, beyond what every test can.
impl TestDb {
    /// Events neither published nor dead-lettered.
    pub async fn pending(&self) -> i64 {
        self.try_pending().await.expect("count pending events")
    }

    /// As [`TestDb::pending`], or the error: the server may be coming back
    /// from a fault of its own.
    pub async fn try_pending(&self) -> Result<i64, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT count(*) FROM outbox WHERE published_at IS NULL AND dead_lettered_at IS NULL",
        )
        .fetch_one(&self.pool)
        .await
    }

    pub async fn published(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM outbox WHERE published_at IS NOT NULL")
            .fetch_one(&self.pool)
            .await
            .expect("count published events")
    }

    /// Terminates every outboxd backend of this database, nobody else's;
    /// returns how many.
    pub async fn terminate_outboxd_backends(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
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
        type Columns = (
            String,
            String,
            i64,
            bool,
            bool,
            Option<String>,
            i32,
            Option<String>,
        );
        let rows: Vec<Columns> = sqlx::query_as(
            "SELECT id::text, aggregate_id, seq, published_at IS NOT NULL,
                    dead_lettered_at IS NOT NULL, last_error, attempts, lease_id::text
             FROM outbox",
        )
        .fetch_all(&self.pool)
        .await
        .expect("read the final table");
        rows.into_iter()
            .map(
                |(id, aggregate, seq, published, dead_lettered, last_error, attempts, lease_id)| {
                    let row = FinalRow {
                        aggregate,
                        seq,
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

/// Whether the fault suite runs in its full form (`OUTBOXD_FAULTS_FULL=1`):
/// cases that support it run more rounds of their fault over more events.
/// The short form, the default and CI's, keeps every case under a minute.
pub fn full_form() -> bool {
    std::env::var("OUTBOXD_FAULTS_FULL").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// Cases take turns: each has the machine to itself.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Waits for a turn on the machine, for a test that is not a [`Case`].
pub async fn turn() -> tokio::sync::MutexGuard<'static, ()> {
    TURN.lock().await
}

/// One case: its turn on the machine, its database, its history, its clock.
pub struct Case {
    _turn: tokio::sync::MutexGuard<'static, ()>,
    pub began: Instant,
    pub db: Arc<TestDb>,
    pub history: History,
    /// The server under `db` when it is the case's own; last, so it stops
    /// after everything that uses it.
    cluster: Option<PrivateCluster>,
}

impl Case {
    /// Waits for the case's turn, then gives it a database of its own on the
    /// shared server.
    pub async fn begin() -> Self {
        let turn = TURN.lock().await;
        Self {
            _turn: turn,
            began: Instant::now(),
            db: TestDb::create().await,
            history: History::new(),
            cluster: None,
        }
    }

    /// As [`Case::begin`], on a PostgreSQL cluster of the case's own
    /// ([`Case::cluster`]), for faults that hit the server itself (a crash):
    /// the case's own connections (producers, sampler, the final read) reach
    /// it straight, and come back when it does.
    pub async fn begin_private() -> Self {
        let turn = TURN.lock().await;
        let cluster = PrivateCluster::start().await;
        Self {
            _turn: turn,
            began: Instant::now(),
            db: cluster.create_db().await,
            history: History::new(),
            cluster: Some(cluster),
        }
    }

    /// As [`Case::begin_private`], with the case's database reached through
    /// the returned proxy (`db.url()` is the proxy's), for a failover: the
    /// proxy is the address that moves to the promoted standby
    /// ([`Proxy::retarget`]), and the case's own connections follow it as
    /// outboxd's do.
    pub async fn begin_private_behind_proxy() -> (Self, Proxy) {
        let turn = TURN.lock().await;
        let cluster = PrivateCluster::start().await;
        let proxy = Proxy::start(cluster.addr()).await;
        let mut admin = cluster.admin_url();
        admin
            .set_port(Some(proxy.addr().port()))
            .expect("a postgres URL takes a port");
        let case = Self {
            _turn: turn,
            began: Instant::now(),
            db: TestDb::create_on_private(admin).await,
            history: History::new(),
            cluster: Some(cluster),
        };
        (case, proxy)
    }

    /// The case's own PostgreSQL cluster (the primary it began on).
    pub fn cluster(&self) -> &PrivateCluster {
        self.cluster
            .as_ref()
            .expect("a case begun on a private cluster (Case::begin_private)")
    }

    /// Workers on `targets`, the sampler, and producers committing `events`
    /// over `spread`: the load the faults hit.
    pub fn load(&self, targets: &Targets, events: usize, spread: Duration) -> Load {
        Load {
            workers: Workers::spawn(WORKERS, targets, &self.history),
            sampler: Sampler::start(&self.db.pool, &self.history),
            producers: produce(&self.db.pool, &self.history, events, spread),
            ordered: false,
        }
    }

    /// As [`Case::load`], for outboxd serving the [`ORDERED`] outbox: the
    /// producers share aggregates ([`produce_shared`]), and the checker holds
    /// the case to per-aggregate order as well.
    pub fn load_ordered(&self, targets: &Targets, events: usize, spread: Duration) -> Load {
        Load {
            workers: Workers::spawn(WORKERS, targets, &self.history),
            sampler: Sampler::start(&self.db.pool, &self.history),
            producers: produce_shared(
                &self.db.pool,
                &self.history,
                events,
                spread,
                ORDERED_AGGREGATES,
            ),
            ordered: true,
        }
    }
}

/// The outbox a case's outboxd serves, for a case that runs on both kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outbox {
    /// The default outbox: claims read fresh rows from the claim cursor.
    Unordered,
    /// [`ORDERED`]: claims hand out each aggregate's events in order.
    Ordered,
}

impl Outbox {
    /// outboxd's arguments for it, with the claim sweep every second.
    pub fn args(self) -> Vec<&'static str> {
        let mut args = SWEEP_EVERY_SECOND.to_vec();
        if self == Self::Ordered {
            args.extend(ORDERED);
        }
        args
    }

    /// [`Case::load`] or [`Case::load_ordered`].
    pub fn load(self, case: &Case, targets: &Targets, events: usize, spread: Duration) -> Load {
        match self {
            Self::Unordered => case.load(targets, events, spread),
            Self::Ordered => case.load_ordered(targets, events, spread),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Unordered => "unordered",
            Self::Ordered => "ordered",
        }
    }
}

/// A case's running load; see [`Case::load`].
pub struct Load {
    pub workers: Workers,
    pub sampler: Sampler,
    producers: JoinHandle<()>,
    /// Checked for per-aggregate order too ([`Case::load_ordered`]).
    ordered: bool,
}

impl Load {
    /// The end of a case under load: the producers finish, the outbox
    /// drains, the workers and the sampler stop, the outboxd replicas still
    /// up (`servers`, under [`SWEEP_EVERY_SECOND`]) show that no sweep found
    /// a claimable event below their claim cursors
    /// ([`sweeps_found_nothing`]), and the history is checked against the
    /// final table.
    pub async fn conclude(self, case: &Case, name: &str, servers: &[&Outboxd]) -> Figures {
        let drained = self.drain(case).await;
        sweeps_found_nothing(servers, name).await;
        drained.assess(case, name).await
    }

    /// The first half of [`Load::conclude`], for a case that reads the
    /// drained table before the checker has its say.
    pub async fn drain(self, case: &Case) -> Drained {
        self.producers.await.expect("producers");
        drained(&case.db, self.sampler, Some(self.workers)).await;
        Drained {
            ordered: self.ordered,
        }
    }
}

/// A load that has drained: its history is ready for the checker.
pub struct Drained {
    ordered: bool,
}

impl Drained {
    /// The second half of [`Load::conclude`].
    pub async fn assess(self, case: &Case, name: &str) -> Figures {
        judge(case, name, self.ordered).await
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

/// As [`child_command`], logging at INFO to pipes that [`Log::collect`] reads.
pub fn logged_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = child_command(program);
    command
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// A child's output, kept as it comes, for a case that reads its log.
#[derive(Debug, Clone, Default)]
pub struct Log(Arc<Mutex<String>>);

impl Log {
    /// Collects the piped stdout and stderr of `child` (see [`logged_command`]).
    pub fn collect(child: &mut Child) -> Self {
        let log = Self::default();
        if let Some(out) = child.stdout.take() {
            log.read(out);
        }
        if let Some(err) = child.stderr.take() {
            log.read(err);
        }
        log
    }

    fn read(&self, stream: impl AsyncRead + Unpin + Send + 'static) {
        let into = Arc::clone(&self.0);
        tokio::spawn(async move {
            let mut lines = BufReader::new(stream).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                let mut text = into.lock().unwrap_or_else(PoisonError::into_inner);
                text.push_str(&line);
                text.push('\n');
            }
        });
    }

    pub fn text(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The lines so far that contain `part`.
    pub fn lines_with(&self, part: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|line| line.contains(part))
            .map(str::to_owned)
            .collect()
    }
}

/// outboxd as a child process, killed when dropped.
#[derive(Debug)]
pub struct Outboxd {
    child: Child,
    pub addr: SocketAddr,
    /// Where its `/metrics` answers (`--metrics-listen`).
    pub metrics: SocketAddr,
    /// Its output, when started with [`Outboxd::spawn_logged`].
    log: Option<Log>,
}

impl Outboxd {
    /// Starts outboxd on `port` against `database_url` and waits until it serves.
    pub async fn start(database_url: &str, port: u16) -> Self {
        Self::start_with(database_url, port, &[]).await
    }

    /// As [`Outboxd::start`], with further arguments (`--outbox ...`; a
    /// `--metrics-listen` of the case's replaces the harness's free port).
    pub async fn start_with(database_url: &str, port: u16, extra: &[&str]) -> Self {
        Self::spawn(child_command(bins::outboxd()), database_url, port, extra).await
    }

    /// As [`Outboxd::start_with`], under `ulimit -n files`: the soft and the
    /// hard limit both, so outboxd cannot raise its way out of it.
    pub async fn start_limited(database_url: &str, port: u16, files: u32, extra: &[&str]) -> Self {
        let mut command = child_command("bash");
        command
            .args(["-c", r#"ulimit -n "$0" && exec "$@""#, &files.to_string()])
            .arg(bins::outboxd());
        Self::spawn(command, database_url, port, extra).await
    }

    async fn spawn(command: Command, database_url: &str, port: u16, extra: &[&str]) -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let (mut command, metrics) = Self::args(command, database_url, addr, extra);
        let child = command.spawn().expect("spawn outboxd");
        let server = Self {
            child,
            addr,
            metrics,
            log: None,
        };
        server.serving().await;
        server
    }

    /// Starts outboxd without waiting for it to serve, its log (INFO and up)
    /// kept in [`Outboxd::log`]: for a case about how it starts.
    pub fn spawn_logged(database_url: &str, port: u16, extra: &[&str]) -> Self {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let (mut command, metrics) =
            Self::args(logged_command(bins::outboxd()), database_url, addr, extra);
        let mut child = command.spawn().expect("spawn outboxd");
        let log = Log::collect(&mut child);
        Self {
            child,
            addr,
            metrics,
            log: Some(log),
        }
    }

    /// The command line, and where its `/metrics` will answer.
    fn args(
        mut command: Command,
        database_url: &str,
        addr: SocketAddr,
        extra: &[&str],
    ) -> (Command, SocketAddr) {
        let given = extra
            .iter()
            .position(|a| *a == "--metrics-listen")
            .and_then(|i| extra.get(i + 1));
        let metrics = match given {
            Some(listen) => listen.parse().unwrap_or_else(|e| {
                panic!("a case's --metrics-listen is an address: {listen:?} ({e})")
            }),
            None => {
                let metrics = SocketAddr::from(([127, 0, 0, 1], free_port()));
                command.args(["--metrics-listen", &metrics.to_string()]);
                metrics
            }
        };
        command
            .args(["--database-url", database_url])
            .args(["--listen", &addr.to_string()])
            .args(["--poll-interval", "200ms"])
            .args(["--health-interval", "200ms"])
            .args(["--db-acquire-timeout", "1s"])
            .args(["--drain-timeout", "2s"])
            .args(extra);
        (command, metrics)
    }

    /// One scrape of its `/metrics`.
    pub async fn scrape(&self) -> Scrape {
        Scrape::of(self.metrics).await
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Its output; only for one started with [`Outboxd::spawn_logged`].
    pub fn log(&self) -> &Log {
        self.log
            .as_ref()
            .expect("an outboxd started with Outboxd::spawn_logged")
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("ask whether outboxd exited")
    }

    /// Waits until a GetStats answers: the database is reached and migrated.
    /// Each try is bounded: outboxd listens before it serves, so a call made
    /// while it waits for its database is accepted and left unanswered.
    pub async fn serving(&self) {
        let url = self.url();
        wait_until(secs(60), "outboxd serves", async || {
            let call = async {
                let mut client = OutboxServiceClient::connect(url.clone()).await.ok()?;
                client.get_stats(GetStatsRequest::default()).await.ok()
            };
            matches!(tokio::time::timeout(secs(2), call).await, Ok(Some(_)))
        })
        .await;
    }

    /// SIGKILL: no drain, no goodbye to PostgreSQL or the clients.
    pub async fn kill9(mut self) {
        self.child.kill().await.expect("kill -9 outboxd");
    }
}

/// The claim cursor's sweep every second (`--claim-sweep-interval 1s`):
/// a case that runs it asserts with [`sweeps_found_nothing`] that no sweep
/// found a claimable event the cursor had passed.
pub const SWEEP_EVERY_SECOND: [&str; 2] = ["--claim-sweep-interval", "1s"];

/// What the sweeps of one replica did over a case.
#[derive(Debug, Clone, Copy)]
pub struct Sweeps {
    /// Sweeps completed (`outbox_claim_sweeps_total`).
    pub done: f64,
    /// The replica's claim cursor at the end (`outbox_claim_cursor`).
    pub cursor: f64,
}

/// After a drain: waits until every one of `servers` (outboxd under
/// [`SWEEP_EVERY_SECOND`], serving outbox `default`) has completed two more
/// sweeps than it had now, so that one of them began after the drain ended,
/// then asserts that no sweep of any of them ever found a claimable event
/// below its claim cursor: the cursor skipped nothing, or the sweep would
/// have handed it out and counted it. Returns each replica's figures.
pub async fn sweeps_found_nothing(servers: &[&Outboxd], case: &str) -> Vec<Sweeps> {
    const SWEEPS: &str = "outbox_claim_sweeps_total";
    const FOUND: &str = "outbox_claim_sweep_found_total";
    let mut figures = Vec::new();
    for server in servers {
        let at_drain = server
            .scrape()
            .await
            .of_outbox(SWEEPS, "default")
            .unwrap_or(0.0);
        let mut last = None;
        wait_until(
            secs(30),
            &format!(
                "outboxd {} completes a sweep begun after the drain",
                server.addr
            ),
            async || {
                let page = server.scrape().await;
                let done = page.of_outbox(SWEEPS, "default").unwrap_or(0.0) >= at_drain + 2.0;
                last = Some(page);
                done
            },
        )
        .await;
        let page = last.expect("scraped");
        let found = page
            .of_outbox(FOUND, "default")
            .unwrap_or_else(|| panic!("{FOUND} is written at every sweep:\n{}", page.text()));
        let sweeps = Sweeps {
            done: page.of_outbox(SWEEPS, "default").unwrap_or(0.0),
            cursor: page
                .of_outbox("outbox_claim_cursor", "default")
                .unwrap_or(0.0),
        };
        assert!(
            found == 0.0,
            "fault case {case}: the sweep of outboxd {} found {found} claimable events below \
             its claim cursor ({} sweeps, cursor at {}): the cursor skipped them",
            server.addr,
            sweeps.done,
            sweeps.cursor
        );
        figures.push(sweeps);
    }
    println!(
        "fault case {case}: sweeps {:?}, found 0",
        figures
            .iter()
            .map(|s| format!("{} (cursor {})", s.done, s.cursor))
            .collect::<Vec<_>>()
    );
    figures
}

/// Waits until every committed event is settled, then stops the sampler and the workers.
pub async fn drained(db: &TestDb, sampler: Sampler, workers: Option<Workers>) {
    wait_until(secs(120), "every committed event is settled", async || {
        // An error is a server still coming back from a fault: ask again.
        db.try_pending().await.is_ok_and(|n| n == 0)
    })
    .await;
    sampler.stop().await;
    if let Some(workers) = workers {
        workers.stop().await;
    }
}

/// Checks the history against the final table and prints the case's figures.
pub async fn assess(case: &Case, name: &str) -> Figures {
    judge(case, name, false).await
}

/// As [`assess`], with per-aggregate order: for a case on an ordered outbox.
pub async fn assess_ordered(case: &Case, name: &str) -> Figures {
    judge(case, name, true).await
}

async fn judge(case: &Case, name: &str, ordered: bool) -> Figures {
    let finals = case.db.finals().await;
    let recorded = case.history.recorded();
    let verdict = if ordered {
        history::check_ordered(&recorded, &finals)
    } else {
        history::check(&recorded, &finals)
    };
    let f = &verdict.figures;
    let codes: &BTreeMap<String, usize> = &recorded.codes;
    let order = if ordered {
        format!(
            ", {} aggregates in order ({} successive pairs)",
            f.aggregates, f.ordered_pairs
        )
    } else {
        String::new()
    };
    println!(
        "fault case {name}: {} events, {} deliveries, {} duplicates, {} claimed more than once \
         (bound: {} under lease at a fault), {} stale acks fenced, {} dead-lettered, {} faults injected, {} recoveries \
         ({} failed calls {codes:?}, slowest settle {:.2}s){order}, {:.1}s",
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
