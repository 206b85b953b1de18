//! Whole-machine CPU over a run, by component. On two shared cores a drain is
//! bounded by what every process together spends per event, not only by the
//! relay: this is what lets the report say which design costs the machine more,
//! and whether the machine was saturated at all.

use std::collections::HashMap;

use anyhow::Context as _;
use procfs::{CurrentSI as _, KernelStats, process::all_processes};

/// Who used the CPU, told apart by process name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Component {
    /// Every PostgreSQL process: backends, WAL writer, checkpointer, autovacuum.
    Postgres,
    /// The Erlang VM running RabbitMQ.
    RabbitMq,
    Outboxd,
    Relay,
    /// This harness: producers, the consumer, the classic relay's workers.
    Harness,
}

impl Component {
    pub const ALL: [Self; 5] = [
        Self::Postgres,
        Self::RabbitMq,
        Self::Outboxd,
        Self::Relay,
        Self::Harness,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Self::Postgres => "PostgreSQL",
            Self::RabbitMq => "RabbitMQ",
            Self::Outboxd => "outboxd",
            Self::Relay => "outbox-relay",
            Self::Harness => "harness",
        }
    }

    fn of(comm: &str) -> Option<Self> {
        match comm {
            "postgres" => Some(Self::Postgres),
            "beam.smp" | "erl_child_setup" | "inet_gethost" | "epmd" => Some(Self::RabbitMq),
            "outboxd" => Some(Self::Outboxd),
            "outbox-relay" => Some(Self::Relay),
            "outbox-bench" => Some(Self::Harness),
            _ => None,
        }
    }
}

/// Clock ticks at one instant: the machine's, and each known process's own
/// plus what its exited children left it (autovacuum workers, for PostgreSQL).
#[derive(Debug, Clone)]
pub struct Snapshot {
    busy: u64,
    total: u64,
    procs: HashMap<i32, (Component, u64)>,
}

/// CPU seconds between two snapshots.
#[derive(Debug, Clone, Default)]
pub struct MachineCpu {
    /// Busy CPU seconds of the whole machine (user, nice, system, irq, softirq).
    pub busy_secs: f64,
    /// Busy time over everything the cores could have done (steal excluded).
    pub busy_share: f64,
    pub by: Vec<(Component, f64)>,
}

impl MachineCpu {
    pub fn of(&self, c: Component) -> f64 {
        self.by
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0.0, |(_, s)| *s)
    }

    /// Busy time no listed component accounts for (the kernel's own threads,
    /// other tenants of the machine).
    pub fn other(&self) -> f64 {
        (self.busy_secs - self.by.iter().map(|(_, s)| s).sum::<f64>()).max(0.0)
    }
}

impl Snapshot {
    pub fn take() -> anyhow::Result<Self> {
        let stats = KernelStats::current().context("reading /proc/stat")?;
        let t = &stats.total;
        let busy = t.user + t.nice + t.system + t.irq.unwrap_or(0) + t.softirq.unwrap_or(0);
        let total = busy + t.idle + t.iowait.unwrap_or(0);
        let mut procs = HashMap::new();
        for p in all_processes().context("listing /proc")?.flatten() {
            // A process may exit between listing and reading: skip it.
            let Ok(stat) = p.stat() else { continue };
            let Some(component) = Component::of(&stat.comm) else {
                continue;
            };
            let children = u64::try_from(stat.cutime + stat.cstime).unwrap_or(0);
            procs.insert(stat.pid, (component, stat.utime + stat.stime + children));
        }
        Ok(Self { busy, total, procs })
    }

    /// What happened since `earlier`. A process that started in between counts
    /// from zero; one that exited in between is lost, unless its parent reaped
    /// it (PostgreSQL's backends and workers are children of the postmaster).
    pub fn since(&self, earlier: &Self) -> MachineCpu {
        let tick = procfs::ticks_per_second() as f64;
        let mut by: HashMap<Component, u64> = HashMap::new();
        for (pid, (component, ticks)) in &self.procs {
            let before = earlier.procs.get(pid).map_or(0, |(_, t)| *t);
            *by.entry(*component).or_default() += ticks.saturating_sub(before);
        }
        let busy = self.busy.saturating_sub(earlier.busy);
        let total = self.total.saturating_sub(earlier.total);
        MachineCpu {
            busy_secs: busy as f64 / tick,
            busy_share: if total == 0 {
                0.0
            } else {
                busy as f64 / total as f64
            },
            by: Component::ALL
                .iter()
                .map(|c| (*c, by.get(c).copied().unwrap_or(0) as f64 / tick))
                .collect(),
        }
    }
}
