//! The real outboxd binary: run to completion, for what it does before (or
//! instead of) serving (exit codes and what it says), or serving, for what
//! only a process has (signals, its log as an operator reads it).

use std::{
    process::{Output, Stdio},
    sync::{Arc, Mutex},
};

use tokio::{
    io::{AsyncBufReadExt, AsyncRead, BufReader},
    process::{Child, Command},
};

use super::{TestDb, millis, secs, within};
use crate::shared::{bins, net::free_port, wait::holds_within};

/// The binary, with `OUTBOXD_*` and `DATABASE_URL` from the caller's
/// environment removed so only the test's settings apply, logging at INFO.
fn outboxd_command() -> Command {
    let mut command = Command::new(bins::outboxd());
    for (key, _) in std::env::vars() {
        if key.starts_with("OUTBOXD_") || key == "DATABASE_URL" {
            command.env_remove(key);
        }
    }
    command.env("RUST_LOG", "info").kill_on_drop(true);
    command
}

/// Runs the real binary to completion (bounded) with the given arguments and
/// extra environment.
pub async fn run_outboxd(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = outboxd_command();
    command.args(args).envs(env.iter().copied());
    within(secs(60), "outboxd exits by itself", command.output())
        .await
        .expect("run outboxd")
}

/// The real binary, serving on `db`, its output collected as it comes.
#[derive(Debug)]
pub struct Outboxd {
    pub child: Child,
    output: Arc<Mutex<String>>,
    /// Where clients reach its API (loopback).
    pub addr: String,
}

impl Outboxd {
    /// Serving on loopback, once it has said so.
    pub async fn start(db: &TestDb, extra: &[&str]) -> Self {
        Self::start_on(db, "127.0.0.1", extra).await
    }

    /// Listening on `host` (the clients reach it on loopback).
    pub async fn start_on(db: &TestDb, host: &str, extra: &[&str]) -> Self {
        let port = free_port();
        let url = db.url();
        let mut command = outboxd_command();
        command
            .args(["--database-url", &url, "--metrics-listen", "127.0.0.1:0"])
            .args(["--listen", &format!("{host}:{port}")])
            .args(extra)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("start outboxd");
        let output = Arc::new(Mutex::new(String::new()));
        collect(child.stdout.take().expect("stdout"), Arc::clone(&output));
        collect(child.stderr.take().expect("stderr"), Arc::clone(&output));
        let server = Self {
            child,
            output,
            addr: format!("127.0.0.1:{port}"),
        };
        server.wait_said(&["serving"]).await;
        server
    }

    /// Everything it has written so far.
    pub fn said(&self) -> String {
        self.output.lock().expect("output").clone()
    }

    /// Its lines that have every one of `parts`.
    pub fn lines_with(&self, parts: &[&str]) -> Vec<String> {
        self.said()
            .lines()
            .filter(|l| parts.iter().all(|p| l.contains(p)))
            .map(str::to_owned)
            .collect()
    }

    /// Waits until one line of the output has every one of `parts`.
    pub async fn wait_said(&self, parts: &[&str]) {
        let found = holds_within(secs(30), millis(20), async || {
            !self.lines_with(parts).is_empty()
        })
        .await;
        assert!(
            found,
            "outboxd said no line with {parts:?}:\n{}",
            self.said()
        );
    }

    /// `kill -NAME` (HUP, TERM).
    pub fn signal(&self, name: &str) {
        let pid = self.child.id().expect("outboxd runs").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} {pid}");
    }
}

fn collect(stream: impl AsyncRead + Unpin + Send + 'static, into: Arc<Mutex<String>>) {
    tokio::spawn(async move {
        let mut lines = BufReader::new(stream).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let mut text = into.lock().expect("output");
            text.push_str(&line);
            text.push('\n');
        }
    });
}

/// The log and error output together: start-up failures are logged (stdout),
/// configuration errors printed before logging starts (stderr).
pub fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}
