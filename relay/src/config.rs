//! The relay's flags, each with an env var, validated before anything connects.

use std::{path::PathBuf, str::FromStr, time::Duration};

use clap::Parser;

use outbox_runtime::cli::{ListenAddr, LogArgs, parse_duration};
use outboxd::client::ClientTls;

use crate::credentials::{TokenFile, read_certificates, read_private_key};

pub use crate::publishers::rabbitmq::RabbitMqArgs;
use crate::publishers::rabbitmq::RabbitMqConfig;

/// outbox-relay: claims from outboxd, publishes to RabbitMQ with confirms, acks.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, long_about = None)]
pub struct RelayArgs {
    /// outboxd gRPC endpoint.
    #[arg(long, env = "OUTBOX_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,

    /// File holding the bearer token sent to outboxd on every call
    /// (`authorization: Bearer <token>`), for an outboxd run with
    /// --auth-tokens. Surrounding whitespace is trimmed; the file is re-read
    /// every few seconds, so a rotated token is used without a restart.
    #[arg(long, env = "OUTBOX_RELAY_TOKEN_FILE", value_name = "PATH")]
    pub token_file: Option<PathBuf>,

    /// outboxd's CA certificate (PEM), to check its certificate. Without
    /// it, an https:// --server is checked against the system's roots (or
    /// the PEM bundle SSL_CERT_FILE names), as for a publicly signed one.
    #[arg(long, env = "OUTBOX_RELAY_TLS_CA", value_name = "PATH")]
    pub tls_ca: Option<PathBuf>,

    /// Client certificate (PEM) shown to outboxd for mutual TLS; needs --tls-key.
    #[arg(long, env = "OUTBOX_RELAY_TLS_CERT", value_name = "PATH")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "OUTBOX_RELAY_TLS_KEY", value_name = "PATH")]
    pub tls_key: Option<PathBuf>,

    /// Outbox to relay.
    #[arg(long, env = "OUTBOX_RELAY_OUTBOX", default_value = "default")]
    pub outbox: String,

    /// Messages claimed per batch.
    #[arg(long, env = "OUTBOX_RELAY_BATCH_SIZE", default_value_t = 100)]
    pub batch_size: u32,

    /// Lease asked for each batch; extended while publishing runs past half of it.
    #[arg(long, env = "OUTBOX_RELAY_LEASE", value_parser = parse_duration, default_value = "30s")]
    pub lease: Duration,

    /// In-flight batches per process.
    #[arg(long, env = "OUTBOX_RELAY_CONCURRENCY", default_value_t = 4)]
    pub concurrency: usize,

    /// While a slot publishes a full batch, claim its next batch (without
    /// waiting) so the claim round trip is off the critical path. The batch
    /// claimed ahead is published only after the current one is confirmed.
    #[arg(
        long,
        env = "OUTBOX_RELAY_CLAIM_AHEAD",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub claim_ahead: bool,

    /// Send a batch's acks with the slot's next claim instead of as an Ack call
    /// of their own: one call per batch instead of two. A server that ignores
    /// them (older than this field) is detected at the first claim, and the
    /// relay falls back to Ack calls.
    #[arg(
        long,
        env = "OUTBOX_RELAY_ACK_WITH_CLAIM",
        default_value_t = true,
        action = clap::ArgAction::Set,
        value_name = "BOOL"
    )]
    pub ack_with_claim: bool,

    /// Recorded on claimed rows. Default: host name and process id.
    #[arg(long, env = "OUTBOX_RELAY_WORKER_ID")]
    pub worker_id: Option<String>,

    /// Long-poll wait per claim when the outbox is empty.
    #[arg(long, env = "OUTBOX_RELAY_WAIT", value_parser = parse_duration, default_value = "20s")]
    pub wait: Duration,

    /// After SIGTERM, how long in-flight batches may take to publish and ack.
    #[arg(long, env = "OUTBOX_RELAY_DRAIN_TIMEOUT", value_parser = parse_duration, default_value = "20s")]
    pub drain_timeout: Duration,

    /// Prometheus metrics address (`GET /metrics`), HOST:PORT, or `off` to bind
    /// nothing. Not outboxd's 9090, so both start side by side with defaults.
    #[arg(
        long,
        env = "OUTBOX_RELAY_METRICS_LISTEN",
        default_value = "0.0.0.0:9091",
        value_name = "HOST:PORT|off"
    )]
    pub metrics_listen: MetricsListen,

    /// The broker: RabbitMQ, the one there is so far.
    #[command(flatten)]
    pub rabbitmq: RabbitMqArgs,

    #[command(flatten)]
    pub log: LogArgs,
}

/// Where the metrics endpoint listens, if anywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsListen {
    Off,
    At(ListenAddr),
}

impl FromStr for MetricsListen {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "off" {
            Ok(Self::Off)
        } else {
            s.parse().map(Self::At)
        }
    }
}

/// Which broker the relay publishes to, and its settings: a new broker is a
/// variant here (with its flags in [`RelayArgs`]) and a module in
/// `publishers/`.
#[derive(Debug, Clone)]
pub enum BrokerConfig {
    RabbitMq(RabbitMqConfig),
}

/// The relay's settings, validated.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub server: String,
    /// TLS to outboxd, for an https:// server.
    pub tls: Option<ClientTls>,
    /// The bearer token and the file it is re-read from.
    pub token: Option<TokenFile>,
    pub outbox: String,
    pub broker: BrokerConfig,
    pub batch_size: u32,
    pub lease: Duration,
    pub concurrency: usize,
    pub claim_ahead: bool,
    pub ack_with_claim: bool,
    pub worker_id: String,
    pub wait: Duration,
    pub drain_timeout: Duration,
    pub metrics_listen: MetricsListen,
}

impl RelayArgs {
    pub fn validate(&self) -> Result<RelayConfig, String> {
        // Checked here so a typo exits 64; the channel takes the text as given.
        let server = url::Url::parse(&self.server)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                format!(
                    "--server {:?} must be an http:// or https:// URL",
                    self.server
                )
            })?;
        let tls = self.client_tls(server.scheme() == "https")?;
        let broker = BrokerConfig::RabbitMq(self.rabbitmq.validate()?);
        if !(1..=10_000).contains(&self.batch_size) {
            return Err("--batch-size must be between 1 and 10000".into());
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err("--concurrency must be between 1 and 1024".into());
        }
        if self.lease < Duration::from_secs(1) {
            return Err("--lease must be at least 1s".into());
        }
        let worker_id = match &self.worker_id {
            Some(id) if !id.trim().is_empty() && id.chars().count() <= 200 => id.clone(),
            Some(_) => return Err("--worker-id must be 1-200 characters".into()),
            None => format!(
                "{}-{}",
                gethostname::gethostname().to_string_lossy(),
                std::process::id()
            ),
        };
        let token = self
            .token_file
            .as_deref()
            .map(TokenFile::open)
            .transpose()?;
        Ok(RelayConfig {
            server: self.server.clone(),
            tls,
            token,
            outbox: self.outbox.clone(),
            broker,
            batch_size: self.batch_size,
            lease: self.lease,
            concurrency: self.concurrency,
            claim_ahead: self.claim_ahead,
            ack_with_claim: self.ack_with_claim,
            worker_id,
            wait: self.wait,
            drain_timeout: self.drain_timeout,
            metrics_listen: self.metrics_listen.clone(),
        })
    }
}

impl RelayArgs {
    /// The TLS files, read and checked: an https:// server trusts --tls-ca,
    /// or the system's roots without it; an http:// one takes no TLS flag,
    /// and the client certificate comes with its key.
    fn client_tls(&self, https: bool) -> Result<Option<ClientTls>, String> {
        let flags = [
            ("--tls-ca", &self.tls_ca),
            ("--tls-cert", &self.tls_cert),
            ("--tls-key", &self.tls_key),
        ];
        if !https {
            return match flags.iter().find(|(_, path)| path.is_some()) {
                Some((flag, _)) => Err(format!(
                    "{flag} needs an https:// --server, not {:?}",
                    self.server
                )),
                None => Ok(None),
            };
        }
        let tls = match &self.tls_ca {
            Some(path) => ClientTls::new(read_certificates("--tls-ca", path)?),
            None => ClientTls::system_roots(),
        };
        match (&self.tls_cert, &self.tls_key) {
            (None, None) => Ok(Some(tls)),
            (Some(cert), Some(key)) => Ok(Some(tls.with_identity(
                read_certificates("--tls-cert", cert)?,
                read_private_key("--tls-key", key)?,
            ))),
            (Some(_), None) => Err("--tls-cert needs --tls-key".into()),
            (None, Some(_)) => Err("--tls-key needs --tls-cert".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credentials::tests::Scratch;

    #[test]
    fn defaults_match_the_documented_ones() {
        let args = RelayArgs::try_parse_from(["outbox-relay"]).expect("parses");
        let config = args.validate().expect("valid");
        assert_eq!(config.server, "http://127.0.0.1:50051");
        assert_eq!(config.outbox, "default");
        let rabbitmq = rabbitmq(&config);
        assert_eq!(rabbitmq.exchange, "outbox");
        assert!(rabbitmq.declare);
        assert_eq!(rabbitmq.confirm_timeout, Duration::from_secs(15));
        assert_eq!(config.batch_size, 100);
        assert_eq!(config.lease, Duration::from_secs(30));
        assert_eq!(config.concurrency, 4);
        assert!(config.claim_ahead);
        assert!(config.ack_with_claim);
        assert_eq!(
            config.metrics_listen,
            MetricsListen::At("0.0.0.0:9091".parse().expect("addr")),
            "not outboxd's 9090"
        );
        assert_eq!(rabbitmq.bind_queue, None);
        let off = RelayArgs::try_parse_from([
            "outbox-relay",
            "--claim-ahead",
            "false",
            "--ack-with-claim",
            "false",
        ])
        .expect("parses")
        .validate()
        .expect("valid");
        assert!(!off.claim_ahead);
        assert!(!off.ack_with_claim);
        assert!(
            config
                .worker_id
                .ends_with(&format!("-{}", std::process::id()))
        );
    }

    fn rabbitmq(config: &RelayConfig) -> &RabbitMqConfig {
        let BrokerConfig::RabbitMq(rabbitmq) = &config.broker;
        rabbitmq
    }

    fn relay(args: &[&str]) -> Result<RelayConfig, String> {
        let argv = std::iter::once("outbox-relay").chain(args.iter().copied());
        RelayArgs::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn the_metrics_listener_can_be_off_or_on_a_host_name() {
        let off = relay(&["--metrics-listen", "off"]).expect("valid");
        assert_eq!(off.metrics_listen, MetricsListen::Off);
        let named = relay(&["--metrics-listen", "localhost:9191"]).expect("valid");
        assert_eq!(
            named.metrics_listen,
            MetricsListen::At("localhost:9191".parse().expect("addr"))
        );
        let v6 = relay(&["--metrics-listen", "[::1]:9191"]).expect("valid");
        assert_eq!(
            v6.metrics_listen,
            MetricsListen::At("[::1]:9191".parse().expect("addr"))
        );
        for bad in ["9091", "Off", "localhost", "host:99999", "bad host:1"] {
            let err = relay(&["--metrics-listen", bad]).expect_err(bad);
            assert!(err.contains("--metrics-listen"), "{bad}: {err}");
        }
    }

    #[test]
    fn bind_queue_names_the_broker_would_refuse_are_refused() {
        let max = "q".repeat(255);
        for good in ["quickstart", "amq", "amqp.events", max.as_str()] {
            let config = relay(&["--bind-queue", good]).expect(good);
            assert_eq!(rabbitmq(&config).bind_queue.as_deref(), Some(good));
        }
        let long = "q".repeat(256);
        for (bad, why) in [
            ("", "empty"),
            (long.as_str(), "at most 255 bytes"),
            ("amq.events", "reserved"),
        ] {
            let err = relay(&["--bind-queue", bad]).expect_err(bad);
            assert!(err.contains("--bind-queue") && err.contains(why), "{err}");
        }
        // Bytes, not characters: 128 two-byte characters are 256 bytes.
        assert!(relay(&["--bind-queue", &"é".repeat(128)]).is_err());
    }

    /// A CA, a client certificate and its key, and a token, in `dir`.
    fn tls_files(dir: &Scratch) -> [String; 4] {
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("rcgen");
        let cert = dir.file("cert.pem", made.cert.pem().as_bytes());
        let key = dir.file("key.pem", made.signing_key.serialize_pem().as_bytes());
        let token = dir.file("token", b"t0ken\n");
        [&cert, &cert, &key, &token].map(|p| p.to_str().expect("utf-8").to_owned())
    }

    #[test]
    fn tls_flags_need_an_https_server_and_come_with_what_they_need() {
        let dir = Scratch::new("config-tls");
        let [ca, cert, key, _] = tls_files(&dir);
        let https = "https://outboxd:50051";
        let config = relay(&["--server", https, "--tls-ca", &ca]).expect("valid");
        assert!(config.tls.is_some());
        // A publicly signed outboxd needs no CA file: the system's roots.
        let system = relay(&["--server", https]).expect("valid");
        assert!(
            format!("{:?}", system.tls).contains("system_roots: true"),
            "{system:?}"
        );
        let mutual_system = ["--server", https, "--tls-cert", &cert, "--tls-key", &key];
        assert!(relay(&mutual_system).expect("valid").tls.is_some());
        let mutual = [
            "--server",
            https,
            "--tls-ca",
            &ca,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
        ];
        assert!(relay(&mutual).expect("valid").tls.is_some());
        assert!(
            relay(&[]).expect("valid").tls.is_none(),
            "http:// is plaintext"
        );
        for (args, says) in [
            (vec!["--tls-ca", &ca], "--tls-ca needs an https:// --server"),
            (
                vec!["--tls-cert", &cert, "--tls-key", &key],
                "--tls-cert needs an https://",
            ),
            (vec!["--tls-key", &key], "--tls-key needs an https://"),
            (
                vec!["--server", https, "--tls-ca", &ca, "--tls-cert", &cert],
                "--tls-cert needs --tls-key",
            ),
            (
                vec!["--server", https, "--tls-cert", &cert],
                "--tls-cert needs --tls-key",
            ),
            (
                vec!["--server", https, "--tls-ca", &ca, "--tls-key", &key],
                "--tls-key needs --tls-cert",
            ),
            (vec!["--server", https, "--tls-ca", &key], "--tls-ca"),
            (
                vec![
                    "--server",
                    https,
                    "--tls-ca",
                    &ca,
                    "--tls-cert",
                    &cert,
                    "--tls-key",
                    &ca,
                ],
                "no PEM private key",
            ),
            (
                vec!["--server", https, "--tls-ca", "/nonexistent/ca.pem"],
                "/nonexistent/ca.pem",
            ),
        ] {
            let err = relay(&args).expect_err(says);
            assert!(err.contains(says) && !err.contains('\n'), "{args:?}: {err}");
        }
    }

    #[test]
    fn the_token_file_is_read_at_start_and_must_not_be_empty() {
        let dir = Scratch::new("config-token");
        let [.., token] = tls_files(&dir);
        let config = relay(&["--token-file", &token]).expect("valid");
        let file = config.token.as_ref().expect("token file");
        assert!(file.token.is("t0ken"), "trimmed");
        let empty = dir.file("empty", b"\n");
        let empty = empty.to_str().expect("utf-8");
        for (path, says) in [
            (empty, "empty"),
            ("/nonexistent/token", "/nonexistent/token"),
        ] {
            let err = relay(&["--token-file", path]).expect_err(says);
            assert!(
                err.starts_with("--token-file") && err.contains(says),
                "{err}"
            );
        }
        assert!(
            !format!("{config:?}").contains("t0ken"),
            "Debug shows no token"
        );
    }

    #[test]
    fn an_amqp_ca_needs_an_amqps_url() {
        let dir = Scratch::new("config-amqp");
        let [ca, .., token] = tls_files(&dir);
        let amqps = "amqps://guest:guest@rabbitmq:5671/%2f";
        let config = relay(&["--amqp-url", amqps, "--amqp-tls-ca", &ca]).expect("valid");
        assert!(
            rabbitmq(&config)
                .tls
                .cert_chain
                .as_deref()
                .is_some_and(|pem| pem.contains("BEGIN CERTIFICATE"))
        );
        let system_roots = relay(&["--amqp-url", amqps]).expect("system roots");
        assert!(rabbitmq(&system_roots).tls.cert_chain.is_none());
        let err = relay(&["--amqp-tls-ca", &ca]).expect_err("amqp://");
        assert!(err.contains("--amqp-tls-ca needs an amqps://"), "{err}");
        let err = relay(&["--amqp-url", amqps, "--amqp-tls-ca", &token]).expect_err("not PEM");
        assert!(
            err.starts_with("--amqp-tls-ca") && err.contains("no PEM certificate"),
            "{err}"
        );
    }
}
