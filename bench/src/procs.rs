//! The real `outboxd` and `outbox-relay` binaries as child processes, with their
//! CPU time and peak RSS read from /proc.

use std::{
    fs::File,
    net::{SocketAddr, TcpListener},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use anyhow::{Context as _, bail};

#[derive(Debug, Clone)]
pub struct Binaries {
    pub outboxd: PathBuf,
    pub relay: PathBuf,
}

impl Binaries {
    pub fn find(dir: &Path) -> anyhow::Result<Self> {
        let outboxd = dir.join("outboxd");
        let relay = dir.join("outbox-relay");
        for bin in [&outboxd, &relay] {
            if !bin.is_file() {
                bail!(
                    "{} not found; build it first with `cargo build --release --bins` (or pass --bin-dir)",
                    bin.display()
                );
            }
        }
        Ok(Self { outboxd, relay })
    }
}

/// A free loopback port (bound, then released for the child to take).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free port")?;
    Ok(listener.local_addr().context("local address")?.port())
}

/// CPU seconds (user + system) and peak resident set size.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    pub cpu_secs: f64,
    pub peak_rss_mib: f64,
}

fn usage_of(pid: u32) -> anyhow::Result<Usage> {
    let process =
        procfs::process::Process::new(i32::try_from(pid)?).context("opening /proc/PID")?;
    let stat = process.stat().context("reading /proc/PID/stat")?;
    let status = process.status().context("reading /proc/PID/status")?;
    Ok(Usage {
        cpu_secs: (stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64,
        peak_rss_mib: status.vmhwm.unwrap_or(0) as f64 / 1024.0,
    })
}

#[derive(Debug)]
pub struct Proc {
    pub name: String,
    pub cmdline: String,
    /// Where its Prometheus endpoint listens.
    pub metrics: Option<SocketAddr>,
    child: Child,
    log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, bin: &Path, args: &[String], log_dir: &Path) -> anyhow::Result<Self> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone().context("log file handle")?;
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .env("RUST_LOG", "warn");
        for var in [
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "DATABASE_URL",
            "AMQP_URL",
        ] {
            cmd.env_remove(var);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let cmdline = std::iter::once(bin.display().to_string())
            .chain(args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        Ok(Self {
            name: name.to_owned(),
            cmdline,
            metrics: None,
            child,
            log,
        })
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(5)..].join("\n")
    }

    /// Fails if the process has already exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait().context("checking a child")? {
            bail!(
                "{} exited early ({status}):\n{}",
                self.name,
                self.log_tail()
            );
        }
        Ok(())
    }

    /// Waits until the process accepts TCP connections on `addr`.
    /// Waits until outboxd answers its health check with SERVING. It binds
    /// its port before reaching the database and migrating, so a port that
    /// accepts connections is not yet a server that answers.
    pub async fn wait_serving(
        &mut self,
        addr: SocketAddr,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        use tonic_health::pb::{
            HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
            .connect_timeout(Duration::from_secs(1))
            .timeout(Duration::from_secs(1));
        loop {
            self.check_alive()?;
            if let Ok(channel) = endpoint.connect().await {
                let answer = HealthClient::new(channel)
                    .check(HealthCheckRequest::default())
                    .await;
                if answer.is_ok_and(|a| a.into_inner().status == ServingStatus::Serving as i32) {
                    return Ok(());
                }
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        bail!(
            "{} not serving on {addr} after {timeout:?}:\n{}",
            self.name,
            self.log_tail()
        )
    }

    pub fn usage(&self) -> Usage {
        usage_of(self.child.id()).unwrap_or_default()
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<()> {
        if self.child.try_wait().context("checking a child")?.is_some() {
            return Ok(());
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = tokio::time::Instant::now() + grace;
        for _ in 0..100_000 {
            if self
                .child
                .try_wait()
                .context("waiting for a child")?
                .is_some()
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Ok(())
    }
}

impl Drop for Proc {
    /// A process the harness lost track of (an error path) never outlives it.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// outboxd on fresh loopback ports, ready to serve.
pub async fn start_outboxd(
    bins: &Binaries,
    db_url: &str,
    log_dir: &Path,
    tag: &str,
) -> anyhow::Result<(Proc, SocketAddr)> {
    start_outboxd_with(bins, db_url, log_dir, tag, &[]).await
}

/// outboxd with further arguments (e.g. more `--outbox` tables).
pub async fn start_outboxd_with(
    bins: &Binaries,
    db_url: &str,
    log_dir: &Path,
    tag: &str,
    extra: &[&str],
) -> anyhow::Result<(Proc, SocketAddr)> {
    start_outboxd_secured(bins, db_url, log_dir, tag, extra, None).await
}

/// The files of the API's trust boundary (issue #34): outboxd serves TLS with
/// `cert`/`key` and authorises by `tokens`; the relay trusts `ca` and sends
/// the token in `token_file`.
#[derive(Debug, Clone)]
pub struct Secure {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub tokens: PathBuf,
    pub token_file: PathBuf,
}

/// outboxd, over TLS with authorisation when `secure` is given; readiness is
/// then asked on its plaintext `--health-listen` port.
pub async fn start_outboxd_secured(
    bins: &Binaries,
    db_url: &str,
    log_dir: &Path,
    tag: &str,
    extra: &[&str],
    secure: Option<&Secure>,
) -> anyhow::Result<(Proc, SocketAddr)> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut health = addr;
    let mut args = vec![
        "--database-url".to_owned(),
        db_url.to_owned(),
        "--listen".to_owned(),
        addr.to_string(),
        "--metrics-listen".to_owned(),
        metrics.to_string(),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    if let Some(secure) = secure {
        health = format!("127.0.0.1:{}", free_port()?).parse()?;
        for (flag, path) in [
            ("--tls-cert", &secure.cert),
            ("--tls-key", &secure.key),
            ("--auth-tokens", &secure.tokens),
        ] {
            args.push(flag.to_owned());
            args.push(path.display().to_string());
        }
        args.push("--health-listen".to_owned());
        args.push(health.to_string());
    }
    let mut proc = Proc::spawn(&format!("outboxd-{tag}"), &bins.outboxd, &args, log_dir)?;
    proc.metrics = Some(metrics);
    proc.wait_serving(health, Duration::from_secs(60)).await?;
    Ok((proc, addr))
}

pub struct RelayOpts<'a> {
    pub server: SocketAddr,
    pub amqp_url: &'a str,
    pub exchange: &'a str,
    pub batch: u32,
    pub concurrency: u32,
    /// TLS to outboxd (by the name `localhost`) and a bearer token.
    pub secure: Option<&'a Secure>,
}

pub fn start_relay(
    bins: &Binaries,
    o: &RelayOpts<'_>,
    log_dir: &Path,
    tag: &str,
) -> anyhow::Result<Proc> {
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let server = match o.secure {
        Some(_) => format!("https://localhost:{}", o.server.port()),
        None => format!("http://{}", o.server),
    };
    let mut args = vec![
        "--server".to_owned(),
        server,
        "--amqp-url".to_owned(),
        o.amqp_url.to_owned(),
        "--exchange".to_owned(),
        o.exchange.to_owned(),
        "--no-declare".to_owned(),
        "--batch-size".to_owned(),
        o.batch.to_string(),
        "--concurrency".to_owned(),
        o.concurrency.to_string(),
        "--worker-id".to_owned(),
        "outbox-bench-relay".to_owned(),
        "--metrics-listen".to_owned(),
        metrics.to_string(),
    ];
    if let Some(secure) = o.secure {
        for (flag, path) in [
            ("--tls-ca", &secure.ca),
            ("--token-file", &secure.token_file),
        ] {
            args.push(flag.to_owned());
            args.push(path.display().to_string());
        }
    }
    let mut proc = Proc::spawn(&format!("relay-{tag}"), &bins.relay, &args, log_dir)?;
    proc.metrics = Some(metrics);
    Ok(proc)
}
