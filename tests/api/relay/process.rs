//! The relay binary as a child process of a test: its command line with the
//! test defaults, what it writes (collected as it comes), its signals and its
//! exit, and the ports it listens on.

use std::{
    collections::HashSet,
    process::{ExitStatus, Stdio},
    sync::{Arc, Mutex as StdMutex, PoisonError},
    time::Duration,
};

use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::{Child, Command},
    task::JoinHandle,
};

use crate::{
    shared::{
        bins,
        rabbit::{AMQP_URL, Rabbit},
    },
    support::{TestApp, secs, wait_until},
};

/// The relay binary as a child process, killed if the test drops it, with
/// what it writes (log lines go to stdout, start-up errors to stderr)
/// collected as it comes, so the pipes never fill up.
pub struct Relay {
    child: Child,
    output: Arc<StdMutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

/// The relay's command line with the test defaults, to add flags to.
pub fn relay_command() -> Command {
    let mut cmd = Command::new(bins::relay());
    cmd.args(["--wait", "1s", "--drain-timeout", "10s"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A line as written, without the terminal colours of text logs.
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ parameters, then a final letter.
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn collect(
    stream: impl AsyncRead + Unpin + Send + 'static,
    into: Arc<StdMutex<Vec<String>>>,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            into.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(plain(&line));
        }
    })
}

impl Relay {
    pub fn start(app: &TestApp, rabbit: &Rabbit, extra: &[&str]) -> Self {
        Self::start_with_env(app, rabbit, extra, &[])
    }

    pub fn start_with_env(
        app: &TestApp,
        rabbit: &Rabbit,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        Self::start_via(app, rabbit, AMQP_URL, extra, env)
    }

    /// A relay for `app` (in plaintext unless `extra` names a `--server`)
    /// publishing over `amqp_url` to `rabbit`'s exchange with `--no-declare`, unless `extra` names an `--exchange` (which the
    /// relay then declares), and with metrics on a free port unless `extra`
    /// sets `--metrics-listen`.
    pub fn start_via(
        app: &TestApp,
        rabbit: &Rabbit,
        amqp_url: &str,
        extra: &[&str],
        env: &[(&str, String)],
    ) -> Self {
        let mut cmd = relay_command();
        if !extra.contains(&"--server") {
            cmd.args(["--server", &format!("http://{}", app.addr)]);
        }
        cmd.args(["--amqp-url", amqp_url]);
        if !extra.contains(&"--exchange") {
            cmd.args(["--exchange", &rabbit.exchange, "--no-declare"]);
        }
        if !extra.contains(&"--metrics-listen") {
            cmd.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        cmd.args(extra)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())));
        Self::spawn(cmd)
    }

    pub fn spawn(mut cmd: Command) -> Self {
        let mut child = cmd.spawn().expect("spawn outbox-relay");
        let output = Arc::new(StdMutex::new(Vec::new()));
        let stdout = child.stdout.take().expect("the relay's stdout is piped");
        let stderr = child.stderr.take().expect("the relay's stderr is piped");
        let readers = vec![
            collect(stdout, Arc::clone(&output)),
            collect(stderr, Arc::clone(&output)),
        ];
        Self {
            child,
            output,
            readers,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("the relay is running")
    }

    /// What the relay wrote so far, line by line.
    pub fn lines(&self) -> Vec<String> {
        self.output
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until the relay has written a line that `matches`, and returns it.
    pub async fn line(
        &self,
        limit: Duration,
        what: &str,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        wait_until(limit, what, async || {
            self.lines().iter().any(|l| matches(l))
        })
        .await;
        self.lines()
            .into_iter()
            .find(|l| matches(l))
            .unwrap_or_default()
    }

    /// SIGKILL: no chance to ack what it published.
    pub async fn kill9(mut self) {
        self.child.kill().await.expect("kill -9 the relay");
    }

    /// SIGTERM, then the exit status.
    pub async fn terminate(self) -> ExitStatus {
        self.terminate_with_output().await.0
    }

    /// SIGTERM, then the exit status and everything the relay wrote.
    pub async fn terminate_with_output(self) -> (ExitStatus, Vec<String>) {
        let sent = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .await
            .expect("run kill");
        assert!(sent.success(), "SIGTERM delivered");
        self.exit_within(secs(30)).await
    }

    /// The exit status once the relay exits by itself, within `limit`, and
    /// everything it wrote.
    pub async fn exit_within(mut self, limit: Duration) -> (ExitStatus, Vec<String>) {
        let status = tokio::time::timeout(limit, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("the relay did not exit within {limit:?}"))
            .expect("wait for the relay");
        // The pipes close with the process: the readers end with them.
        for reader in self.readers.drain(..) {
            let _ = reader.await;
        }
        (status, self.lines())
    }
}

/// The TCP ports process `pid` listens on (Linux: its socket inodes in
/// /proc/PID/fd matched against the LISTEN rows of /proc/PID/net/tcp{,6}).
pub fn listening_ports(pid: u32) -> Vec<u16> {
    let inodes: HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read the process's file descriptors")
        .filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            Some(
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .to_owned(),
            )
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let Ok(rows) = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")) else {
            continue;
        };
        for row in rows.lines().skip(1) {
            let fields: Vec<&str> = row.split_whitespace().collect();
            // local_address is HEXIP:HEXPORT, st 0A is LISTEN, inode is field 9.
            let (Some(local), Some(&"0A"), Some(inode)) =
                (fields.get(1), fields.get(3), fields.get(9))
            else {
                continue;
            };
            if inodes.contains(*inode)
                && let Some(port) = local
                    .rsplit(':')
                    .next()
                    .and_then(|p| u16::from_str_radix(p, 16).ok())
            {
                ports.push(port);
            }
        }
    }
    ports
}
