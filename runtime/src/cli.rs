//! What every outbox binary's command line shares: parsing that exits 64 with
//! one line naming the flag (or the environment variable it came from), listen
//! addresses, the log format, durations.

use std::{str::FromStr, time::Duration};

use clap::{Args, Parser, ValueEnum};

/// Exit code for a configuration error (EX_USAGE from sysexits.h).
pub const EXIT_CONFIG: i32 = 64;

/// Parses the command line the way both binaries do: `--help` and `--version`
/// print and exit 0; anything invalid prints one line and exits 64, before
/// anything is bound or connected. The returned [`Sources`] lets later errors
/// name the environment variable a value came from.
pub fn parse_args<T: Parser>(binary: &str) -> Result<(T, Sources), std::process::ExitCode> {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let sources = Sources::read(&T::command(), &argv, |var| std::env::var_os(var).is_some());
    match T::try_parse_from(&argv) {
        Ok(parsed) => Ok((parsed, sources)),
        Err(err) if !err.use_stderr() => {
            let _ = err.print();
            Err(std::process::ExitCode::SUCCESS)
        }
        Err(err) => {
            let rendered = err.to_string();
            let line = rendered.lines().next().unwrap_or("invalid arguments");
            eprintln!(
                "{binary}: {}",
                sources.explain(line.trim_start_matches("error: "))
            );
            Err(config_exit())
        }
    }
}

/// Reports an invalid configuration and gives the exit code for it.
pub fn invalid_config(binary: &str, sources: &Sources, reason: &str) -> std::process::ExitCode {
    eprintln!(
        "{binary}: invalid configuration: {}",
        sources.explain(reason)
    );
    config_exit()
}

/// The flags whose value came from an environment variable (set, and the flag
/// not given): an error about such a value names the variable the user set,
/// not a flag they never typed.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `(--flag, VARIABLE)` pairs.
    from_env: Vec<(String, String)>,
}

impl Sources {
    /// Which flags of `command` took their value from the environment.
    pub fn read(
        command: &clap::Command,
        argv: &[std::ffi::OsString],
        is_set: impl Fn(&std::ffi::OsStr) -> bool + Copy,
    ) -> Self {
        let mut from_env = Vec::new();
        collect_env_sources(command, argv, is_set, &mut from_env);
        from_env.sort();
        from_env.dedup();
        Self { from_env }
    }

    /// Whether `flag` (`--name`) took its value from its environment variable.
    pub fn is_from_env(&self, flag: &str) -> bool {
        self.from_env.iter().any(|(f, _)| f == flag)
    }

    /// `reason` with each `--flag` whose value came from the environment
    /// written as `VARIABLE (--flag)`, dropping clap's `<VALUE>` placeholder.
    pub fn explain(&self, reason: &str) -> String {
        let mut out = String::with_capacity(reason.len());
        let mut rest = reason;
        while let Some(start) = rest.find("--") {
            out.push_str(&rest[..start]);
            let tail = &rest[start..];
            let len = 2 + tail[2..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(tail.len() - 2);
            let flag = &tail[..len];
            let mut after = &tail[len..];
            match self.from_env.iter().find(|(f, _)| f == flag) {
                Some((_, var)) => {
                    out.push_str(&format!("{var} ({flag})"));
                    // clap renders the flag as `--flag <VALUE>`.
                    if let Some((_, rest)) = after
                        .strip_prefix(" <")
                        .and_then(|placeholder| placeholder.split_once('>'))
                    {
                        after = rest;
                    }
                }
                None => out.push_str(flag),
            }
            rest = after;
        }
        out.push_str(rest);
        out
    }
}

fn collect_env_sources(
    command: &clap::Command,
    argv: &[std::ffi::OsString],
    is_set: impl Fn(&std::ffi::OsStr) -> bool + Copy,
    out: &mut Vec<(String, String)>,
) {
    for arg in command.get_arguments() {
        let (Some(long), Some(var)) = (arg.get_long(), arg.get_env()) else {
            continue;
        };
        let flag = format!("--{long}");
        let typed = argv.iter().any(|a| {
            a.to_str().is_some_and(|a| {
                a == flag
                    || a.strip_prefix(flag.as_str())
                        .is_some_and(|r| r.starts_with('='))
            })
        });
        if !typed && is_set(var) {
            out.push((flag, var.to_string_lossy().into_owned()));
        }
    }
    for sub in command.get_subcommands() {
        collect_env_sources(sub, argv, is_set, out);
    }
}

fn config_exit() -> std::process::ExitCode {
    std::process::ExitCode::from(EXIT_CONFIG as u8)
}

/// A listen address as given: `HOST:PORT`, where HOST is an IP literal
/// (`[::1]` for IPv6) or a name resolved when binding (`localhost:50051`).
/// Only the form is checked while parsing; resolving waits for the bind, so a
/// bad value is still refused before anything connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListenAddr {
    /// Kept whole, so an IPv6 scope id survives.
    Ip(std::net::SocketAddr),
    Name {
        host: String,
        port: u16,
    },
}

impl ListenAddr {
    pub fn port(&self) -> u16 {
        match self {
            Self::Ip(addr) => addr.port(),
            Self::Name { port, .. } => *port,
        }
    }

    /// Binds the address, or the first address a name resolves to that
    /// accepts the bind. A port in use ends the search there: listening on
    /// another address of the name instead (`::1` for a taken 127.0.0.1)
    /// would hide the clash. The error names `what` (the flag, and its
    /// environment variable) and, for a port in use, says what to do.
    pub async fn bind(&self, what: &str) -> Result<tokio::net::TcpListener, String> {
        let addrs: Vec<std::net::SocketAddr> = match self {
            Self::Ip(addr) => vec![*addr],
            Self::Name { host, port } => tokio::net::lookup_host((host.as_str(), *port))
                .await
                .map_err(|e| format!("{what} {self}: cannot resolve {host:?}: {e}"))?
                .collect(),
        };
        let mut last = None;
        for addr in addrs {
            match tokio::net::TcpListener::bind(addr).await {
                Ok(listener) => return Ok(listener),
                Err(err) if err.kind() == std::io::ErrorKind::AddrInUse => {
                    return Err(format!(
                        "{what} {self}: address {addr} already in use (is another outboxd or relay running?); choose another port"
                    ));
                }
                Err(err) => last = Some((addr, err)),
            }
        }
        Err(match last {
            Some((addr, err)) => format!("{what} {self}: cannot listen on {addr}: {err}"),
            None => format!("{what} {self}: the name resolves to no address"),
        })
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ip(addr) => write!(f, "{addr}"),
            Self::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(addr) = s.parse::<std::net::SocketAddr>() {
            return Ok(Self::Ip(addr));
        }
        let (host, port) = s.rsplit_once(':').ok_or_else(|| {
            format!("{s:?} is not HOST:PORT (for example 0.0.0.0:50051 or localhost:50051)")
        })?;
        let port: u16 = port
            .parse()
            .map_err(|_| format!("{s:?}: port {port:?} is not a number from 0 to 65535"))?;
        // A fully qualified name may end in a dot.
        let name = host.strip_suffix('.').unwrap_or(host);
        let valid_name = !name.is_empty()
            && name.len() <= 253
            && name.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            });
        if !valid_name {
            return Err(format!(
                "{s:?}: {host:?} is neither an IP address nor a host name (IPv6 goes in brackets: [::1]:50051)"
            ));
        }
        Ok(Self::Name {
            host: host.to_owned(),
            port,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log line format; the level filter comes from RUST_LOG (default `info`).
    #[arg(long, env = "OUTBOXD_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// Durations in configuration: humantime (`500ms`, `30s`, `7d`), or a bare `0`.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    if raw == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(raw).map_err(|e| format!("invalid duration {raw:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_ip_literals_and_host_names() {
        for (given, shown) in [
            ("0.0.0.0:50051", "0.0.0.0:50051"),
            ("[::1]:9090", "[::1]:9090"),
            ("localhost:0", "localhost:0"),
            ("localhost.:0", "localhost.:0"),
            ("[fe80::1%2]:5", "[fe80::1%2]:5"),
            ("outboxd.default.svc:50051", "outboxd.default.svc:50051"),
        ] {
            let addr: ListenAddr = given.parse().unwrap_or_else(|e| panic!("{given}: {e}"));
            assert_eq!(addr.to_string(), shown);
        }
        for bad in [
            "localhost",
            "localhost:http",
            ":50051",
            "a b:1",
            "host:70000",
            "[::1]",
        ] {
            assert!(bad.parse::<ListenAddr>().is_err(), "{bad} accepted");
        }
    }
}
