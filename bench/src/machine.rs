//! The machine and versions the figures were taken on.

use std::process::Command;

use crate::Args;
use crate::cpu::Component;

#[derive(Debug, Clone, Default)]
pub struct Machine {
    pub cores: usize,
    pub memory_gib: f64,
    pub cpu_model: String,
    pub kernel: String,
    pub load_before: String,
    pub postgres: String,
    pub rabbitmq: String,
    pub rustc: String,
    pub git_commit: String,
    pub command: String,
    /// Which CPUs the harness, PostgreSQL and RabbitMQ may run on: a run
    /// with the broker pinned (`scripts/bench-broker-core`) must say so.
    pub cpu_layout: String,
}

fn output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or("").trim().to_owned()
}

pub async fn describe(args: &Args) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu_model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).trim().to_owned())
        .unwrap_or_else(|| "unknown".into());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_gib = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let postgres = match crate::db::connect(&args.database_url).await {
        Ok(mut conn) => sqlx::query_scalar::<_, String>("SELECT version()")
            .fetch_one(&mut conn)
            .await
            .unwrap_or_else(|_| "unknown".into()),
        Err(_) => "unknown".into(),
    };
    let rabbitmq = output("rabbitmqctl", &["version"])
        .map(|v| format!("RabbitMQ {}", first_line(&v)))
        .unwrap_or_else(|| "RabbitMQ (version not readable: rabbitmqctl unavailable)".into());
    let dirty = output("git", &["status", "--porcelain", "--untracked-files=no"]).is_some();
    Machine {
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        memory_gib,
        cpu_model,
        kernel: output("uname", &["-sr"]).unwrap_or_default(),
        load_before: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        postgres,
        rabbitmq,
        rustc: output("rustc", &["--version"]).unwrap_or_else(|| "unknown".into()),
        git_commit: output("git", &["rev-parse", "--short=12", "HEAD"])
            .map(|c| {
                if dirty {
                    format!("{c} (with uncommitted changes)")
                } else {
                    c
                }
            })
            .unwrap_or_else(|| "unknown".into()),
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cpu_layout: cpu_layout(),
    }
}

/// The CPUs each side of the run may use, as procfs reads them from
/// `Cpus_allowed_list`: the harness (outboxd and the relay inherit its mask),
/// PostgreSQL's postmaster (its backends inherit that) and RabbitMQ's Erlang VM.
fn cpu_layout() -> String {
    use procfs::process::{Process, all_processes};

    let allowed = |process: procfs::ProcResult<Process>| {
        process
            .and_then(|p| p.status())
            .ok()
            .and_then(|s| s.cpus_allowed_list)
            .map_or_else(
                || "unknown".to_owned(),
                |ranges| {
                    ranges
                        .iter()
                        .map(|&(a, b)| {
                            if a == b {
                                a.to_string()
                            } else {
                                format!("{a}-{b}")
                            }
                        })
                        .collect::<Vec<_>>()
                        .join(",")
                },
            )
    };
    let mut comm = std::collections::HashMap::new();
    if let Ok(procs) = all_processes() {
        for stat in procs.flatten().filter_map(|p| p.stat().ok()) {
            comm.insert(stat.pid, (stat.comm, stat.ppid));
        }
    }
    // The first process of that name whose parent is not one too: the
    // postmaster rather than a backend.
    let find = |name: &str| {
        comm.iter()
            .filter(|(_, (c, ppid))| c == name && comm.get(ppid).is_none_or(|(p, _)| p != name))
            .map(|(pid, _)| *pid)
            .min()
            .map_or_else(|| "not found".to_owned(), |pid| allowed(Process::new(pid)))
    };
    format!(
        "harness, outboxd and outbox-relay: {}; {}: {}; {}: {}",
        allowed(Process::myself()),
        Component::Postgres.label(),
        find("postgres"),
        Component::RabbitMq.label(),
        find("beam.smp")
    )
}
