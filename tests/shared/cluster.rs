//! PostgreSQL clusters of a test's own, for faults that hit the server itself
//! (a crash, a failover) and so can never touch the shared one: `initdb` into
//! a fresh directory under the system's temporary directory, on a free port,
//! reached on 127.0.0.1 only, with a standby made by `pg_basebackup -R`.
//! Dropping one stops it at once (`pg_ctl stop -m immediate`) and removes its
//! directory.
//!
//! PostgreSQL refuses to run as root, so when the tests do, its programs run
//! as the `postgres` user, who then owns the directory.

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Output,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use sqlx::{Connection, PgConnection};
use tokio::{process::Command, time::Instant};
use url::Url;

use super::{db::TestDb, net::free_port};

/// How long a start, a recovery or a promotion may take before the test
/// fails: generous, for a loaded two-core machine.
const LIMIT: Duration = Duration::from_secs(60);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(50);
/// The server log's last lines shown when something fails.
const LOG_TAIL: usize = 30;

/// Settings every private cluster starts with, in `postgresql.conf` (a
/// standby's copy gets them too): what crash and failover tests need, and
/// production's durability (`fsync = on`, unlike the API suite's throwaway
/// servers), since a crash must lose exactly what it loses in production.
const SETTINGS: &str = "
listen_addresses = '127.0.0.1'
fsync = on
wal_level = replica
max_wal_senders = 5
wal_keep_size = '64MB'
hot_standby = on
max_connections = 100
shared_buffers = '32MB'
log_line_prefix = '%m [%p] '
";

/// A PostgreSQL cluster of the test's own; see the module's comment.
#[derive(Debug)]
pub struct PrivateCluster {
    bin: PathBuf,
    /// The temporary directory: `data`, `socket` and `server.log` inside.
    dir: PathBuf,
    port: u16,
    /// The name a standby streams under (its `application_name`), which
    /// `synchronous_standby_names` on its primary names.
    name: String,
    /// In recovery: a standby not yet promoted.
    standby: AtomicBool,
}

impl PrivateCluster {
    /// A fresh primary, started and accepting connections.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// As [`PrivateCluster::start`], with further settings (`name = value`,
    /// as in `postgresql.conf`; they win over the defaults above).
    pub async fn start_with(settings: &[&str]) -> Self {
        let dir = temp_dir().await;
        let bin = server_bin();
        let cluster = Self {
            bin,
            dir,
            port: free_port(),
            name: "primary".into(),
            standby: AtomicBool::new(false),
        };
        cluster
            .run(
                cluster
                    .program("initdb")
                    .args([
                        "--auth=trust",
                        "--username=postgres",
                        "--encoding=UTF8",
                        "--no-instructions",
                    ])
                    .arg("-D")
                    .arg(cluster.data()),
                "initdb",
            )
            .await;
        let mut conf = SETTINGS.to_owned();
        for setting in settings {
            conf.push_str(setting);
            conf.push('\n');
        }
        cluster.configure(&conf);
        cluster.pg_ctl_start().await;
        cluster.wait_ready().await;
        cluster
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where it listens, for a proxy in front of it.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Its maintenance database (`postgres`), as superuser `postgres`.
    pub fn admin_url(&self) -> Url {
        Url::parse(&format!(
            "postgres://postgres@127.0.0.1:{}/postgres",
            self.port
        ))
        .expect("a postgres URL")
    }

    /// A database of a test's own on this cluster, which goes with the
    /// cluster rather than being dropped.
    pub async fn create_db(&self) -> Arc<TestDb> {
        TestDb::create_on_private(self.admin_url()).await
    }

    /// Whether it is still a standby in recovery (by what this handle did:
    /// made by `standby`, not yet promoted).
    pub fn is_standby(&self) -> bool {
        self.standby.load(Ordering::SeqCst)
    }

    /// A crash: SIGQUIT to the postmaster, which ends every backend at once
    /// without a checkpoint (as `pg_ctl stop -m immediate` does), so the next
    /// start recovers from the WAL and empties every unlogged table. Returns
    /// once the postmaster is gone.
    pub async fn crash(&self) {
        let pid = self.postmaster_pid().unwrap_or_else(|| {
            panic!(
                "crash: no postmaster.pid in {}: the server is not running\n{}",
                self.data().display(),
                self.log_tail()
            )
        });
        self.run(
            Command::new("kill").args(["-QUIT", &pid.to_string()]),
            "kill -QUIT the postmaster",
        )
        .await;
        let gone = wait_for(LIMIT, async || !alive(pid)).await;
        assert!(
            gone,
            "the postmaster (pid {pid}) still runs {LIMIT:?} after SIGQUIT\n{}",
            self.log_tail()
        );
    }

    /// `pg_ctl stop -m immediate`: what `crash` does, by pg_ctl.
    pub async fn stop_immediate(&self) {
        self.run(
            self.pg_ctl().args(["-m", "immediate", "-w", "stop"]),
            "pg_ctl stop -m immediate",
        )
        .await;
    }

    /// Starts it again on the same port and directory after a crash or stop,
    /// and waits until it accepts connections and (a primary) has finished
    /// crash recovery.
    pub async fn start_again(&self) {
        self.pg_ctl_start().await;
        self.wait_ready().await;
    }

    /// A hot standby of this cluster (`pg_basebackup -R`), on a free port of
    /// its own, started and streaming; asynchronous.
    pub async fn standby(&self) -> Self {
        self.make_standby(false).await
    }

    /// As [`PrivateCluster::standby`], and this cluster's synchronous standby
    /// (`synchronous_standby_names` names it): a commit here returns once the
    /// standby has its WAL, so a promotion loses no committed transaction.
    /// Commits here wait for ever while it is down.
    pub async fn synchronous_standby(&self) -> Self {
        self.make_standby(true).await
    }

    async fn make_standby(&self, synchronous: bool) -> Self {
        let dir = temp_dir().await;
        let port = free_port();
        let name = format!("standby_{port}");
        let standby = Self {
            bin: self.bin.clone(),
            dir,
            port,
            name: name.clone(),
            standby: AtomicBool::new(true),
        };
        let source = format!(
            "host=127.0.0.1 port={} user=postgres application_name={name}",
            self.port
        );
        standby
            .run(
                standby
                    .program("pg_basebackup")
                    .arg("-D")
                    .arg(standby.data())
                    .args(["-R", "-X", "stream", "-c", "fast", "-d", &source]),
                "pg_basebackup",
            )
            .await;
        // Its own port and socket; and never a synchronous standby of its own,
        // whatever the primary's settings: once promoted, it would wait for
        // ever on every commit.
        standby.configure("synchronous_standby_names = ''\n");
        standby.strip_auto_conf("synchronous_standby_names");
        standby.pg_ctl_start().await;
        standby.wait_ready().await;
        if synchronous {
            let mut conn = self.connect().await;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "ALTER SYSTEM SET synchronous_standby_names = '\"{name}\"'"
            )))
            .execute(&mut conn)
            .await
            .expect("set synchronous_standby_names");
            sqlx::query("SELECT pg_reload_conf()")
                .execute(&mut conn)
                .await
                .expect("reload the configuration");
        }
        let wanted = if synchronous { "sync" } else { "async" };
        let streaming = wait_for(LIMIT, async || {
            let Ok(mut conn) = PgConnection::connect(self.admin_url().as_str()).await else {
                return false;
            };
            let state: Option<(String, String)> = sqlx::query_as(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1",
            )
            .bind(&name)
            .fetch_optional(&mut conn)
            .await
            .ok()
            .flatten();
            let _ = conn.close().await;
            state.is_some_and(|(state, sync)| state == "streaming" && sync == wanted)
        })
        .await;
        assert!(
            streaming,
            "standby {name} is not streaming ({wanted}) after {LIMIT:?}\nprimary's log:\n{}\nstandby's log:\n{}",
            self.log_tail(),
            standby.log_tail()
        );
        standby
    }

    /// Promotes a standby (`pg_ctl promote -w`) and waits until it accepts
    /// writes (`pg_is_in_recovery()` is false).
    pub async fn promote(&self) {
        self.run(
            self.pg_ctl().args(["-w", "-t", "60", "promote"]),
            "pg_ctl promote",
        )
        .await;
        self.standby.store(false, Ordering::SeqCst);
        self.wait_ready().await;
    }

    /// Whether the server is in recovery (a standby), asked over a connection.
    pub async fn in_recovery(&self) -> bool {
        let mut conn = self.connect().await;
        let recovering = sqlx::query_scalar("SELECT pg_is_in_recovery()")
            .fetch_one(&mut conn)
            .await
            .expect("ask pg_is_in_recovery()");
        let _ = conn.close().await;
        recovering
    }

    /// The server log's last lines, for a failure's message.
    pub fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..].join("\n")
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn socket_dir(&self) -> PathBuf {
        self.dir.join("socket")
    }

    /// Appends `settings` and this cluster's own port and socket directory
    /// to `postgresql.conf` (the last value of a setting wins).
    fn configure(&self, settings: &str) {
        use std::io::Write as _;
        let path = self.data().join("postgresql.conf");
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
        write!(
            file,
            "\n# outboxd's fault tests\n{settings}\nport = {}\nunix_socket_directories = '{}'\n",
            self.port,
            self.socket_dir().display()
        )
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// Removes `setting` from `postgresql.auto.conf` (ALTER SYSTEM's file,
    /// which a base backup copies).
    fn strip_auto_conf(&self, setting: &str) {
        let path = self.data().join("postgresql.auto.conf");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return;
        };
        let kept: String = text
            .lines()
            .filter(|line| !line.trim_start().starts_with(setting))
            .map(|line| format!("{line}\n"))
            .collect();
        std::fs::write(&path, kept).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    fn program(&self, name: &str) -> Command {
        Command::from(self.std_program(name))
    }

    /// One of the server's programs, run as the server's user.
    fn std_program(&self, name: &str) -> std::process::Command {
        let mut command = as_server_user(&self.bin.join(name));
        // Somewhere the server's user may be, so its programs do not warn.
        command.current_dir(&self.dir);
        command
    }

    fn pg_ctl(&self) -> Command {
        let mut command = self.program("pg_ctl");
        command.arg("-D").arg(self.data());
        command
    }

    async fn pg_ctl_start(&self) {
        let mut command = self.pg_ctl();
        command
            .args(["-w", "-t", "60", "-l"])
            .arg(self.dir.join("server.log"))
            .arg("start");
        self.run(&mut command, "pg_ctl start").await;
    }

    /// Runs `command` to its end; fails the test with its output and the
    /// server log when it fails.
    async fn run(&self, command: &mut Command, what: &str) -> Output {
        let output = command
            .output()
            .await
            .unwrap_or_else(|e| panic!("{what}: cannot run {command:?}: {e}"));
        assert!(
            output.status.success(),
            "{what} failed ({}): {}{}\nserver log ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            self.dir.join("server.log").display(),
            self.log_tail()
        );
        output
    }

    /// A connection to the maintenance database, retried until the server
    /// accepts one.
    async fn connect(&self) -> PgConnection {
        let url = self.admin_url();
        let deadline = Instant::now() + LIMIT;
        loop {
            match PgConnection::connect(url.as_str()).await {
                Ok(conn) => return conn,
                Err(e) if Instant::now() >= deadline => panic!(
                    "no connection to the private cluster on port {} within {LIMIT:?}: {e}\n{}",
                    self.port,
                    self.log_tail()
                ),
                Err(_) => tokio::time::sleep(POLL).await,
            }
        }
    }

    /// Waits until it accepts connections and, unless it is a standby, until
    /// recovery has ended (it accepts writes).
    async fn wait_ready(&self) {
        let primary = !self.is_standby();
        let ready = wait_for(LIMIT, async || {
            let Ok(mut conn) = PgConnection::connect(self.admin_url().as_str()).await else {
                return false;
            };
            let recovering: Result<bool, _> = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut conn)
                .await;
            let _ = conn.close().await;
            recovering.is_ok_and(|recovering| recovering != primary)
        })
        .await;
        assert!(
            ready,
            "the private cluster on port {} is not ready ({}) after {LIMIT:?}\n{}",
            self.port,
            if primary {
                "accepting writes"
            } else {
                "a hot standby"
            },
            self.log_tail()
        );
    }

    fn postmaster_pid(&self) -> Option<u32> {
        let pidfile = std::fs::read_to_string(self.data().join("postmaster.pid")).ok()?;
        pidfile.lines().next()?.trim().parse().ok()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        // Blocking, and fine so: an immediate stop takes milliseconds.
        let mut stop = self.std_program("pg_ctl");
        stop.arg("-D")
            .arg(self.data())
            .args(["-m", "immediate", "-w", "stop"]);
        // Fails harmlessly when the server is not running (crashed, stopped).
        let _ = stop.output();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!(
                "warning: could not remove the private cluster's directory {}: {e}",
                self.dir.display()
            );
        }
    }
}

/// Polls `condition` every `POLL` until it holds (true) or `limit` passed (false).
async fn wait_for(limit: Duration, condition: impl AsyncFnMut() -> bool) -> bool {
    super::wait::holds_within(limit, POLL, condition).await
}

/// Whether process `pid` runs. A postmaster that exited stays a zombie when
/// nobody reaps it (a container's init may not), so a zombie counts as gone.
fn alive(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses.
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim_start());
    !matches!(state.and_then(|s| s.chars().next()), Some('Z' | 'X') | None)
}

/// A fresh directory for a cluster, with a `socket` directory inside, both
/// owned by the user its programs run as.
async fn temp_dir() -> PathBuf {
    let template = std::env::temp_dir().join("outboxd-pg-XXXXXX");
    let mut command = Command::from(as_server_user(Path::new("sh")));
    let output = command
        .args([
            "-c",
            r#"dir=$(mktemp -d "$1") && mkdir "$dir/socket" && echo "$dir""#,
            "sh",
        ])
        .arg(&template)
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .unwrap_or_else(|e| panic!("cannot run mktemp as the server's user: {e}"));
    assert!(
        output.status.success(),
        "mktemp -d {} failed: {}",
        template.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

/// `program` as the `postgres` user when the tests run as root, which
/// PostgreSQL refuses to run as; as the tests' user otherwise.
fn as_server_user(program: &Path) -> std::process::Command {
    if is_root() {
        let mut command = std::process::Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(program);
        command
    } else {
        std::process::Command::new(program)
    }
}

/// The newest installed server's programs (Debian keeps them per version
/// under /usr/lib/postgresql), or `OUTBOXD_TEST_PG_BINDIR`.
fn server_bin() -> PathBuf {
    if let Some(dir) = std::env::var_os("OUTBOXD_TEST_PG_BINDIR") {
        return PathBuf::from(dir);
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<u32> = std::fs::read_dir(root)
        .unwrap_or_else(|e| {
            panic!(
                "no PostgreSQL server under {} ({e}); install one, or point \
                 OUTBOXD_TEST_PG_BINDIR at the directory with initdb and pg_ctl",
                root.display()
            )
        })
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|version: &u32| root.join(version.to_string()).join("bin/initdb").is_file())
        .collect();
    versions.sort_unstable();
    let version = versions
        .last()
        .unwrap_or_else(|| panic!("no PostgreSQL version with initdb under {}", root.display()));
    root.join(version.to_string()).join("bin")
}

/// Whether the tests run as root: /proc/self belongs to the process's user.
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}
