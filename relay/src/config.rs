//! The relay's flags, each with an env var, validated before anything connects.

use std::{str::FromStr, time::Duration};

use clap::Parser;

use outbox_runtime::cli::{ListenAddr, LogArgs, parse_duration};

/// outbox-relay: claims from outboxd, publishes to RabbitMQ with confirms, acks.
#[derive(Debug, Parser)]
#[command(name = "outbox-relay", version, about, long_about = None)]
pub struct RelayArgs {
    /// outboxd gRPC endpoint.
    #[arg(long, env = "OUTBOX_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,

    /// Outbox to relay.
    #[arg(long, env = "OUTBOX_RELAY_OUTBOX", default_value = "default")]
    pub outbox: String,

    #[command(flatten)]
    pub broker: BrokerArgs,

    /// Exchange to publish to; declared durable `topic` unless --no-declare.
    #[arg(long, env = "OUTBOX_RELAY_EXCHANGE", default_value = "outbox")]
    pub exchange: String,

    /// Do not declare the exchange (it is managed elsewhere).
    #[arg(long, env = "OUTBOX_RELAY_NO_DECLARE")]
    pub no_declare: bool,

    /// Routing key template; placeholders {event_type} and {aggregate_id}.
    #[arg(long, env = "OUTBOX_RELAY_ROUTING_KEY", default_value = "{event_type}")]
    pub routing_key: String,

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

    /// How long to wait for the broker's confirms of a batch before releasing it.
    #[arg(long, env = "OUTBOX_RELAY_CONFIRM_TIMEOUT", value_parser = parse_duration, default_value = "15s")]
    pub confirm_timeout: Duration,

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

    /// For a try-out: at each connect, declare this durable queue and bind it to
    /// the exchange with `#`, so events arrive somewhere instead of coming back
    /// unroutable. In production the consumers own their queues and bindings.
    #[arg(long, env = "OUTBOX_RELAY_BIND_QUEUE", value_name = "NAME")]
    pub bind_queue: Option<String>,

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

/// The longest queue name AMQP 0-9-1 carries (a short string).
const MAX_QUEUE_NAME: usize = 255;

/// A queue name the broker will accept for a declare: RabbitMQ refuses names
/// in the reserved `amq.` namespace, and an empty name would declare a
/// server-named queue nobody could find again.
fn queue_name(name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("--bind-queue must not be empty".into());
    }
    if name.len() > MAX_QUEUE_NAME {
        return Err(format!(
            "--bind-queue must be at most {MAX_QUEUE_NAME} bytes, not {}",
            name.len()
        ));
    }
    if name.starts_with("amq.") {
        return Err(format!(
            "--bind-queue {name:?}: names starting with \"amq.\" are reserved by the broker"
        ));
    }
    Ok(name.to_owned())
}

/// Where RabbitMQ is: shared by the relay and `outbox-consume`.
#[derive(Debug, Clone, clap::Args)]
pub struct BrokerArgs {
    /// RabbitMQ URL (amqp:// or amqps://). Never logged with its password.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_default_value = true,
        hide_env_values = true
    )]
    pub amqp_url: String,
}

/// A parsed routing-key template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingKey(Vec<Part>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    EventType,
    AggregateId,
}

impl RoutingKey {
    pub fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(start) = rest.find('{') {
            if start > 0 {
                parts.push(Part::Text(rest[..start].to_owned()));
            }
            let end = rest[start..]
                .find('}')
                .ok_or_else(|| format!("routing key {template:?}: unclosed '{{'"))?;
            parts.push(match &rest[start + 1..start + end] {
                "event_type" => Part::EventType,
                "aggregate_id" => Part::AggregateId,
                other => {
                    return Err(format!(
                        "routing key {template:?}: unknown placeholder {{{other}}} (use {{event_type}} or {{aggregate_id}})"
                    ));
                }
            });
            rest = &rest[start + end + 1..];
        }
        if rest.contains('}') {
            return Err(format!("routing key {template:?}: stray '}}'"));
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Self(parts))
    }

    pub fn render(&self, event_type: &str, aggregate_id: &str) -> String {
        self.0
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.as_str(),
                Part::EventType => event_type,
                Part::AggregateId => aggregate_id,
            })
            .collect()
    }
}

/// The relay's settings, validated.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    pub server: String,
    pub outbox: String,
    pub amqp_url: String,
    pub exchange: String,
    pub declare: bool,
    pub routing_key: RoutingKey,
    pub batch_size: u32,
    pub lease: Duration,
    pub concurrency: usize,
    pub claim_ahead: bool,
    pub ack_with_claim: bool,
    pub worker_id: String,
    pub confirm_timeout: Duration,
    pub wait: Duration,
    pub drain_timeout: Duration,
    pub metrics_listen: MetricsListen,
    /// Declared and bound to the exchange with `#` at each connect.
    pub bind_queue: Option<String>,
}

impl RelayArgs {
    pub fn validate(&self) -> Result<RelayConfig, String> {
        let server = url::Url::parse(&self.server)
            .ok()
            .filter(|u| matches!(u.scheme(), "http" | "https"))
            .ok_or_else(|| {
                format!(
                    "--server {:?} must be an http:// or https:// URL",
                    self.server
                )
            })?;
        let amqp = url::Url::parse(&self.broker.amqp_url)
            .ok()
            .filter(|u| matches!(u.scheme(), "amqp" | "amqps"))
            .ok_or("--amqp-url must be an amqp:// or amqps:// URL")?;
        drop(amqp);
        if !(1..=10_000).contains(&self.batch_size) {
            return Err("--batch-size must be between 1 and 10000".into());
        }
        if !(1..=1024).contains(&self.concurrency) {
            return Err("--concurrency must be between 1 and 1024".into());
        }
        if self.lease < Duration::from_secs(1) {
            return Err("--lease must be at least 1s".into());
        }
        if self.confirm_timeout.is_zero() {
            return Err("--confirm-timeout must be positive".into());
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
        Ok(RelayConfig {
            server: {
                drop(server);
                self.server.clone()
            },
            outbox: self.outbox.clone(),
            amqp_url: self.broker.amqp_url.clone(),
            exchange: self.exchange.clone(),
            declare: !self.no_declare,
            routing_key: RoutingKey::parse(&self.routing_key)?,
            batch_size: self.batch_size,
            lease: self.lease,
            concurrency: self.concurrency,
            claim_ahead: self.claim_ahead,
            ack_with_claim: self.ack_with_claim,
            worker_id,
            confirm_timeout: self.confirm_timeout,
            wait: self.wait,
            drain_timeout: self.drain_timeout,
            metrics_listen: self.metrics_listen.clone(),
            bind_queue: self.bind_queue.as_deref().map(queue_name).transpose()?,
        })
    }
}

/// The URL with its password masked, for logs.
pub fn redact_url(raw: &str) -> String {
    match url::Url::parse(raw) {
        Ok(mut url) => {
            if url.password().is_some() {
                let _ = url.set_password(Some("redacted"));
            }
            url.to_string()
        }
        Err(_) => "<invalid url>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routing_key_templates() {
        let key = RoutingKey::parse("{event_type}").expect("valid");
        assert_eq!(key.render("order.created", "a1"), "order.created");
        let key = RoutingKey::parse("orders.{aggregate_id}.{event_type}!").expect("valid");
        assert_eq!(key.render("created", "42"), "orders.42.created!");
        assert_eq!(
            RoutingKey::parse("fixed").expect("valid").render("x", "y"),
            "fixed"
        );
        for bad in ["{event", "{nope}", "a}b"] {
            assert!(RoutingKey::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_match_the_documented_ones() {
        let args = RelayArgs::try_parse_from(["outbox-relay"]).expect("parses");
        let config = args.validate().expect("valid");
        assert_eq!(config.server, "http://127.0.0.1:50051");
        assert_eq!(config.outbox, "default");
        assert_eq!(config.exchange, "outbox");
        assert!(config.declare);
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
        assert_eq!(config.bind_queue, None);
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
            assert_eq!(config.bind_queue.as_deref(), Some(good));
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

    #[test]
    fn passwords_are_masked() {
        assert_eq!(
            redact_url("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:redacted@host:5672/%2f"
        );
    }
}
