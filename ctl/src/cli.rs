//! The command line: a contract for scripts, so names, flags and their
//! environment variables only ever grow. clap's own errors exit 2.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(
    name = "outboxctl",
    version,
    about = "Operate outboxd: health, stats, dead letters, blocked aggregates, redrive and discard",
    after_help = "Exit codes: 0 ok, 1 the server refused the call (health: a service is not SERVING), 2 usage, 3 cannot connect."
)]
pub struct Cli {
    /// outboxd's gRPC address; https:// checks its certificate against
    /// --tls-ca, or the system's roots without it.
    #[arg(
        long,
        global = true,
        env = "OUTBOXCTL_SERVER",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,

    /// A file holding the bearer token sent on every call (outboxd's
    /// --auth-tokens); surrounding whitespace is trimmed.
    #[arg(long, global = true, env = "OUTBOXCTL_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,

    /// The CA certificate (PEM) that outboxd's certificate must chain to;
    /// without it, the system's roots (or the bundle SSL_CERT_FILE names).
    #[arg(long, global = true, env = "OUTBOXCTL_TLS_CA")]
    pub tls_ca: Option<PathBuf>,

    /// A client certificate (PEM) for mutual TLS; needs --tls-key.
    #[arg(long, global = true, env = "OUTBOXCTL_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The client certificate's private key (PEM); needs --tls-cert.
    #[arg(long, global = true, env = "OUTBOXCTL_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,

    /// `table` for people, `json` for scripts (one document per command).
    #[arg(long, global = true, env = "OUTBOXCTL_OUTPUT", value_enum, default_value_t = Output::Table)]
    pub output: Output,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Asks grpc.health.v1 about each service: exits 0 when every one is
    /// SERVING, 1 when one is not. Health needs no token, so this also serves
    /// as a probe from a shell-less image (the chart's `helm test` pod).
    Health {
        /// A health-service name to check (repeat, or comma-separate, for
        /// more); "" is the server as a whole, outbox.v1.OutboxService follows
        /// the database.
        #[arg(
            long = "service",
            env = "OUTBOXCTL_SERVICE",
            value_delimiter = ',',
            default_values = ["", "outbox.v1.OutboxService"]
        )]
        services: Vec<String>,
    },
    /// GetStats of one outbox, or of every configured outbox.
    Stats {
        /// Only this outbox; every configured one when left out.
        #[arg(long, env = "OUTBOXCTL_OUTBOX")]
        outbox: Option<String>,
    },
    /// Dead-lettered events (not discarded).
    #[command(subcommand)]
    DeadLetters(DeadLetters),
    /// Aggregates held back behind a dead-lettered head (ordered, poison=block).
    #[command(subcommand)]
    BlockedKeys(BlockedKeys),
    /// One event, whatever its state.
    Inspect {
        #[command(flatten)]
        outbox: OutboxArg,
        /// The event id (a UUID).
        #[arg(value_parser = uuid)]
        id: String,
    },
    /// Makes dead-lettered events deliverable again.
    Redrive {
        #[command(flatten)]
        outbox: OutboxArg,
        #[command(flatten)]
        select: RedriveSelect,
        #[command(flatten)]
        confirm: Confirm,
    },
    /// Gives dead-lettered events up for good.
    Discard {
        #[command(flatten)]
        outbox: OutboxArg,
        /// An event id (repeat, or comma-separate, for more).
        #[arg(long = "id", env = "OUTBOXCTL_ID", required = true, value_delimiter = ',', value_parser = uuid)]
        ids: Vec<String>,
        #[command(flatten)]
        confirm: Confirm,
    },
}

#[derive(Debug, Subcommand)]
pub enum DeadLetters {
    /// Lists them in sequence order.
    List {
        #[command(flatten)]
        outbox: OutboxArg,
        /// Only this aggregate's.
        #[arg(long, env = "OUTBOXCTL_AGGREGATE")]
        aggregate: Option<String>,
        #[command(flatten)]
        limit: Limit,
    },
}

#[derive(Debug, Subcommand)]
pub enum BlockedKeys {
    /// Lists them in the order of their heads.
    List {
        #[command(flatten)]
        outbox: OutboxArg,
        #[command(flatten)]
        limit: Limit,
    },
}

#[derive(Debug, Args)]
pub struct OutboxArg {
    /// The configured outbox.
    #[arg(long = "outbox", env = "OUTBOXCTL_OUTBOX", default_value = "default")]
    pub name: String,
}

#[derive(Debug, Args)]
pub struct Limit {
    /// At most this many (the server's page limit is 1000).
    #[arg(long, env = "OUTBOXCTL_LIMIT", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub limit: u32,
}

/// Exactly one selector, as RedriveRequest wants.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
pub struct RedriveSelect {
    /// An event id (repeat, or comma-separate, for more).
    #[arg(long = "id", env = "OUTBOXCTL_ID", value_delimiter = ',', value_parser = uuid)]
    pub ids: Vec<String>,
    /// Every dead letter of this aggregate.
    #[arg(long, env = "OUTBOXCTL_AGGREGATE")]
    pub aggregate: Option<String>,
    /// Every dead letter of the outbox.
    #[arg(long, env = "OUTBOXCTL_ALL")]
    pub all: bool,
}

#[derive(Debug, Args)]
pub struct Confirm {
    /// Do it without asking: needed when stdin is not a terminal.
    #[arg(long, short = 'y', env = "OUTBOXCTL_YES")]
    pub yes: bool,
}

/// A UUID in its hyphenated text form, checked here so that a typo is a
/// usage error (exit 2) rather than a refused call.
fn uuid(raw: &str) -> Result<String, String> {
    let ok = raw.len() == 36
        && raw.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    if ok {
        Ok(raw.to_ascii_lowercase())
    } else {
        Err(format!(
            "{raw:?} is not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn health_checks_the_server_and_the_api_unless_told_otherwise() {
        let services =
            |args: &[&str]| match Cli::try_parse_from([&["outboxctl", "health"], args].concat()) {
                Ok(Cli {
                    command: Command::Health { services },
                    ..
                }) => services,
                other => panic!("not a health command: {other:?}"),
            };
        assert_eq!(services(&[]), ["", "outbox.v1.OutboxService"]);
        assert_eq!(services(&["--service", ""]), [""]);
        assert_eq!(services(&["--service", "a,b"]), ["a", "b"]);
    }

    #[test]
    fn redrive_takes_exactly_one_selector() {
        let parse = |args: &[&str]| Cli::try_parse_from([&["outboxctl", "redrive"], args].concat());
        assert!(parse(&["--all"]).is_ok());
        assert!(parse(&[]).is_err());
        assert!(parse(&["--all", "--aggregate", "a"]).is_err());
        assert!(parse(&["--id", "not-a-uuid"]).is_err());
    }

    #[test]
    fn limits_outside_the_servers_page_are_usage_errors() {
        let parse =
            |n: &str| Cli::try_parse_from(["outboxctl", "dead-letters", "list", "--limit", n]);
        assert!(parse("0").is_err() && parse("1001").is_err() && parse("x").is_err());
        assert!(parse("1000").is_ok());
    }
}
