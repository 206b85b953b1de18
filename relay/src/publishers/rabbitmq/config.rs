//! RabbitMQ's flags, each with an env var, and their validation. Flattened
//! into the relay's flags, so a broker's settings stay with its code.

use std::{path::PathBuf, time::Duration};

use lapin::tcp::OwnedTLSConfig;

use outbox_runtime::cli::parse_duration;

use crate::credentials::read_certificates;

/// Where RabbitMQ is: shared by the relay and `outbox-consume`.
#[derive(Debug, Clone, clap::Args)]
pub struct ConnectionArgs {
    /// RabbitMQ URL (amqp:// or amqps://). Never logged with its password.
    #[arg(
        long,
        env = "AMQP_URL",
        default_value = "amqp://guest:guest@127.0.0.1:5672/%2f",
        hide_default_value = true,
        hide_env_values = true
    )]
    pub amqp_url: String,

    /// CA certificate (PEM) trusted for an amqps:// broker, besides the
    /// system's roots: for a broker whose certificate a private CA signed.
    #[arg(long, env = "OUTBOX_RELAY_AMQP_TLS_CA", value_name = "PATH")]
    pub amqp_tls_ca: Option<PathBuf>,
}

impl ConnectionArgs {
    /// The TLS settings for the URL's connection, the CA file read and
    /// checked; the CA with an amqp:// URL is a mistake (it would be ignored).
    pub fn tls_config(&self) -> Result<OwnedTLSConfig, String> {
        let scheme = url::Url::parse(&self.amqp_url)
            .ok()
            .map(|u| u.scheme().to_owned())
            .filter(|s| matches!(s.as_str(), "amqp" | "amqps"))
            .ok_or("--amqp-url must be an amqp:// or amqps:// URL")?;
        let Some(path) = &self.amqp_tls_ca else {
            return Ok(OwnedTLSConfig::default());
        };
        if scheme != "amqps" {
            return Err("--amqp-tls-ca needs an amqps:// --amqp-url".into());
        }
        let pem = read_certificates("--amqp-tls-ca", path)?;
        // lapin skips what it cannot parse; read_certificates has parsed it all.
        let pem = String::from_utf8(pem)
            .map_err(|_| format!("--amqp-tls-ca {}: not a text PEM file", path.display()))?;
        Ok(OwnedTLSConfig {
            identity: None,
            cert_chain: Some(pem),
        })
    }
}

/// The relay's RabbitMQ flags.
#[derive(Debug, Clone, clap::Args)]
pub struct RabbitMqArgs {
    #[command(flatten)]
    pub connection: ConnectionArgs,

    /// Exchange to publish to; declared durable `topic` unless --no-declare.
    #[arg(long, env = "OUTBOX_RELAY_EXCHANGE", default_value = "outbox")]
    pub exchange: String,

    /// Do not declare the exchange (it is managed elsewhere).
    #[arg(long, env = "OUTBOX_RELAY_NO_DECLARE")]
    pub no_declare: bool,

    /// Routing key template; placeholders {event_type} and {aggregate_id}.
    #[arg(long, env = "OUTBOX_RELAY_ROUTING_KEY", default_value = "{event_type}")]
    pub routing_key: String,

    /// How long to wait for the broker's confirms of a batch before releasing it.
    #[arg(long, env = "OUTBOX_RELAY_CONFIRM_TIMEOUT", value_parser = parse_duration, default_value = "15s")]
    pub confirm_timeout: Duration,

    /// For a try-out: at each connect, declare this durable queue and bind it to
    /// the exchange with `#`, so events arrive somewhere instead of coming back
    /// unroutable. In production the consumers own their queues and bindings.
    #[arg(long, env = "OUTBOX_RELAY_BIND_QUEUE", value_name = "NAME")]
    pub bind_queue: Option<String>,
}

/// RabbitMQ's settings, validated.
#[derive(Debug, Clone)]
pub struct RabbitMqConfig {
    pub url: String,
    /// TLS for an amqps:// URL: the extra CA, if any.
    pub tls: OwnedTLSConfig,
    pub exchange: String,
    /// Declare the exchange at each new channel (not `--no-declare`).
    pub declare: bool,
    pub routing_key: RoutingKey,
    pub confirm_timeout: Duration,
    /// Declared and bound to the exchange with `#` at each connect.
    pub bind_queue: Option<String>,
}

impl RabbitMqArgs {
    pub fn validate(&self) -> Result<RabbitMqConfig, String> {
        let tls = self.connection.tls_config()?;
        if self.confirm_timeout.is_zero() {
            return Err("--confirm-timeout must be positive".into());
        }
        Ok(RabbitMqConfig {
            url: self.connection.amqp_url.clone(),
            tls,
            exchange: self.exchange.clone(),
            declare: !self.no_declare,
            routing_key: RoutingKey::parse(&self.routing_key)?,
            confirm_timeout: self.confirm_timeout,
            bind_queue: self.bind_queue.as_deref().map(queue_name).transpose()?,
        })
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
    fn passwords_are_masked() {
        assert_eq!(
            redact_url("amqp://guest:secret@host:5672/%2f"),
            "amqp://guest:redacted@host:5672/%2f"
        );
    }
}
