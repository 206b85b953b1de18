//! The database watchdog. The outbox's worst enemy is outside outboxd: a
//! long-open transaction, an abandoned replication slot or a forgotten
//! prepared transaction holds back the xmin horizon, so vacuum cannot remove
//! the outbox's dead rows, claims slow down, and nothing else says why. Every
//! `--watchdog-interval` this samples who holds the horizon and how each
//! outbox table is kept, sets the `outbox_db_*`/`outbox_table_*` gauges,
//! keeps the findings for `GetDatabaseReport`, and logs each holder older
//! than `--xmin-warn-after` once.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
    time::Duration,
};

use arc_swap::ArcSwapOption;
use chrono::{DateTime, Utc};
use tokio_util::sync::CancellationToken;

use crate::{
    metrics::ServerMetrics,
    store::{
        PgStore,
        watchdog::{DatabaseSample, OpenTransaction, ReplicationSlot},
    },
};

/// The latest findings, shared read-only with the admin RPC (and the status
/// page): cheap to clone, a load is lock-free. Empty until the first sample.
#[derive(Debug, Clone, Default)]
pub struct DatabaseReports(Arc<ArcSwapOption<DatabaseReport>>);

impl DatabaseReports {
    pub fn latest(&self) -> Option<Arc<DatabaseReport>> {
        self.0.load_full()
    }

    fn publish(&self, report: DatabaseReport) {
        self.0.store(Some(Arc::new(report)));
    }
}

/// One sample with what follows from it.
#[derive(Debug, Clone, PartialEq)]
pub struct DatabaseReport {
    pub sample: DatabaseSample,
    /// Everything holding back the horizon, oldest first.
    pub holders: Vec<Holder>,
    /// Age of the oldest holder; zero when none.
    pub horizon_age: Duration,
    /// While an ordered outbox's commit-order guard holds events back
    /// (`outbox_commit_order_holdback_seconds` > 0): the oldest running
    /// writer of the database, the transaction the guard waits for.
    pub commit_order_cause: Option<OpenTransaction>,
    /// How long each slot has held the same xmin / catalog xmin, as far as
    /// this process has seen (slots carry no timestamp): by slot name.
    pub slot_held_for: BTreeMap<String, Duration>,
}

impl DatabaseReport {
    pub fn oldest_transaction_age(&self) -> Duration {
        self.sample
            .transactions
            .iter()
            .map(|t| t.age)
            .max()
            .unwrap_or_default()
    }

    pub fn longest_idle_in_transaction(&self) -> Duration {
        self.sample
            .transactions
            .iter()
            .filter_map(|t| t.idle_in_transaction)
            .max()
            .unwrap_or_default()
    }

    pub fn slots_holding_xmin(&self) -> usize {
        self.sample.slots.iter().filter(|s| s.holds_xmin()).count()
    }

    pub fn largest_retained_wal_bytes(&self) -> i64 {
        self.sample
            .slots
            .iter()
            .filter_map(|s| s.retained_wal_bytes)
            .max()
            .unwrap_or(0)
    }

    pub fn oldest_prepared_age(&self) -> Duration {
        self.sample
            .prepared
            .iter()
            .map(|p| p.age)
            .max()
            .unwrap_or_default()
    }
}

/// Something holding back the xmin horizon, and for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub kind: HolderKind,
    pub age: Duration,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HolderKind {
    /// Never with its query text: the pid is enough to find and end it.
    Transaction {
        pid: i32,
        application_name: String,
        state: String,
        xact_start: DateTime<Utc>,
    },
    Slot {
        name: String,
        slot_type: String,
        active: bool,
    },
    Prepared {
        gid: String,
        owner: String,
    },
}

impl Holder {
    /// Who it is across samples: a pid is reused by later backends, so a
    /// transaction is its pid and start; a slot its name; a prepared
    /// transaction its gid.
    fn key(&self) -> String {
        match &self.kind {
            HolderKind::Transaction {
                pid, xact_start, ..
            } => format!("transaction {pid} {}", xact_start.to_rfc3339()),
            HolderKind::Slot { name, .. } => format!("slot {name}"),
            HolderKind::Prepared { gid, .. } => format!("prepared {gid}"),
        }
    }

    fn warn(&self, after: Duration) {
        let age_secs = self.age.as_secs();
        let after = humantime::format_duration(after).to_string();
        match &self.kind {
            HolderKind::Transaction {
                pid,
                application_name,
                state,
                ..
            } => tracing::warn!(
                pid,
                application_name = %application_name,
                state = %state,
                age_secs,
                "a transaction has held back the xmin horizon for over {after}: vacuum cannot remove the outbox's dead rows; end it with pg_terminate_backend(pid) if it is abandoned"
            ),
            HolderKind::Slot {
                name,
                slot_type,
                active,
            } => tracing::warn!(
                slot = %name,
                slot_type = %slot_type,
                active,
                age_secs,
                "a replication slot has held back the xmin horizon for over {after}: vacuum cannot remove the outbox's dead rows; drop it with pg_drop_replication_slot if it is abandoned"
            ),
            HolderKind::Prepared { gid, owner } => tracing::warn!(
                gid = %gid,
                owner = %owner,
                age_secs,
                "a prepared transaction has held back the xmin horizon for over {after}: vacuum cannot remove the outbox's dead rows; COMMIT PREPARED or ROLLBACK PREPARED it"
            ),
        }
    }

    fn cleared(&self) {
        match &self.kind {
            HolderKind::Transaction {
                pid,
                application_name,
                ..
            } => {
                tracing::info!(pid, application_name = %application_name, "the transaction no longer holds back the xmin horizon")
            }
            HolderKind::Slot { name, .. } => {
                tracing::info!(slot = %name, "the replication slot no longer holds back the xmin horizon");
            }
            HolderKind::Prepared { gid, .. } => {
                tracing::info!(gid = %gid, "the prepared transaction no longer holds back the xmin horizon");
            }
        }
    }
}

/// Which holders were warned about, so each is logged once while it lasts.
#[derive(Debug, Default)]
struct Warnings {
    warned: HashMap<String, Holder>,
}

/// What to log after a sample.
#[derive(Debug, Default, PartialEq, Eq)]
struct Changes {
    /// Past the limit, not warned about yet.
    new: Vec<Holder>,
    /// Warned about, and now gone (or back under the limit: a slot whose
    /// xmin moved on).
    cleared: Vec<Holder>,
}

impl Warnings {
    fn update(&mut self, holders: &[Holder], after: Duration) -> Changes {
        let over: HashMap<String, &Holder> = holders
            .iter()
            .filter(|h| h.age > after)
            .map(|h| (h.key(), h))
            .collect();
        let mut changes = Changes::default();
        let mut gone: Vec<String> = self
            .warned
            .keys()
            .filter(|k| !over.contains_key(*k))
            .cloned()
            .collect();
        gone.sort();
        for key in gone {
            if let Some(holder) = self.warned.remove(&key) {
                changes.cleared.push(holder);
            }
        }
        for holder in holders.iter().filter(|h| h.age > after) {
            if let std::collections::hash_map::Entry::Vacant(entry) =
                self.warned.entry(holder.key())
            {
                entry.insert(holder.clone());
                changes.new.push(holder.clone());
            }
        }
        changes
    }
}

/// When each slot was first seen holding its current xmin / catalog xmin.
#[derive(Debug, Default)]
struct SlotClock {
    since: HashMap<String, HeldSince>,
}

/// A slot's xmin and catalog xmin, and when they were first seen.
type HeldSince = (Option<i64>, Option<i64>, DateTime<Utc>);

impl SlotClock {
    fn held_for(
        &mut self,
        slots: &[ReplicationSlot],
        now: DateTime<Utc>,
    ) -> BTreeMap<String, Duration> {
        let mut held = BTreeMap::new();
        let mut seen = HashMap::new();
        for slot in slots.iter().filter(|s| s.holds_xmin()) {
            let ids = (slot.xmin, slot.catalog_xmin);
            let since = match self.since.get(&slot.name) {
                Some((xmin, catalog, since)) if (*xmin, *catalog) == ids => *since,
                _ => now,
            };
            seen.insert(slot.name.clone(), (ids.0, ids.1, since));
            held.insert(
                slot.name.clone(),
                (now - since).to_std().unwrap_or_default(),
            );
        }
        self.since = seen;
        held
    }
}

/// The findings of one sample: every holder with its age, oldest first.
fn report(
    sample: DatabaseSample,
    slot_held_for: BTreeMap<String, Duration>,
    commit_order_held: bool,
) -> DatabaseReport {
    let mut holders: Vec<Holder> = sample
        .transactions
        .iter()
        .map(|t| Holder {
            kind: HolderKind::Transaction {
                pid: t.pid,
                application_name: t.application_name.clone(),
                state: t.state.clone(),
                xact_start: t.xact_start,
            },
            age: t.age,
        })
        .chain(
            sample
                .slots
                .iter()
                .filter(|s| s.holds_xmin())
                .map(|s| Holder {
                    kind: HolderKind::Slot {
                        name: s.name.clone(),
                        slot_type: s.slot_type.clone(),
                        active: s.active,
                    },
                    age: slot_held_for.get(&s.name).copied().unwrap_or_default(),
                }),
        )
        .chain(sample.prepared.iter().map(|p| Holder {
            kind: HolderKind::Prepared {
                gid: p.gid.clone(),
                owner: p.owner.clone(),
            },
            age: p.age,
        }))
        .collect();
    holders.sort_by_key(|h| std::cmp::Reverse(h.age));
    let horizon_age = holders.first().map(|h| h.age).unwrap_or_default();
    // Transactions come oldest first: the first writer is the oldest.
    let commit_order_cause = commit_order_held
        .then(|| sample.transactions.iter().find(|t| t.writer).cloned())
        .flatten();
    DatabaseReport {
        sample,
        holders,
        horizon_age,
        commit_order_cause,
        slot_held_for,
    }
}

/// Samples the database every `every` until `cancel`; a failed sample is
/// logged once (until one succeeds) and keeps the last findings.
pub async fn watchdog(
    store: PgStore,
    metrics: ServerMetrics,
    reports: DatabaseReports,
    every: Duration,
    warn_after: Duration,
    cancel: CancellationToken,
) {
    let mut warnings = Warnings::default();
    let mut slots = SlotClock::default();
    let mut failing = false;
    loop {
        match store.database_sample().await {
            Ok(sample) => {
                failing = false;
                let held_for = slots.held_for(&sample.slots, sample.read_at);
                let report = report(sample, held_for, metrics.commit_order_held());
                let changes = warnings.update(&report.holders, warn_after);
                for holder in &changes.new {
                    holder.warn(warn_after);
                }
                for holder in &changes.cleared {
                    holder.cleared();
                }
                metrics.set_database(&report);
                reports.publish(report);
            }
            Err(err) if !failing => {
                tracing::warn!(error = %err, "database watchdog sample failed; keeping the last findings");
                failing = true;
            }
            Err(_) => {}
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transaction(pid: i32, started: i64, age_secs: u64) -> Holder {
        Holder {
            kind: HolderKind::Transaction {
                pid,
                application_name: "app".into(),
                state: "idle in transaction".into(),
                xact_start: DateTime::from_timestamp(started, 0).expect("a time"),
            },
            age: Duration::from_secs(age_secs),
        }
    }

    fn slot(name: &str, age_secs: u64) -> Holder {
        Holder {
            kind: HolderKind::Slot {
                name: name.into(),
                slot_type: "logical".into(),
                active: false,
            },
            age: Duration::from_secs(age_secs),
        }
    }

    const AFTER: Duration = Duration::from_secs(600);

    #[test]
    fn a_holder_is_warned_about_once_and_cleared_once() {
        let mut warnings = Warnings::default();
        assert_eq!(
            warnings.update(&[transaction(7, 100, 30)], AFTER),
            Changes::default(),
            "young"
        );
        let changes = warnings.update(&[transaction(7, 100, 601)], AFTER);
        assert_eq!(changes.new, vec![transaction(7, 100, 601)]);
        assert!(changes.cleared.is_empty());
        assert_eq!(
            warnings.update(&[transaction(7, 100, 900)], AFTER),
            Changes::default(),
            "still there: not again"
        );
        let changes = warnings.update(&[], AFTER);
        assert!(changes.new.is_empty());
        assert_eq!(changes.cleared, vec![transaction(7, 100, 601)]);
        assert_eq!(
            warnings.update(&[], AFTER),
            Changes::default(),
            "cleared once"
        );
    }

    #[test]
    fn a_reused_pid_is_a_new_holder() {
        let mut warnings = Warnings::default();
        warnings.update(&[transaction(7, 100, 700)], AFTER);
        let changes = warnings.update(&[transaction(7, 5000, 700)], AFTER);
        assert_eq!(changes.new, vec![transaction(7, 5000, 700)]);
        assert_eq!(changes.cleared, vec![transaction(7, 100, 700)]);
    }

    #[test]
    fn each_kind_of_holder_is_tracked_apart() {
        let mut warnings = Warnings::default();
        let changes = warnings.update(&[transaction(7, 100, 700), slot("s", 700)], AFTER);
        assert_eq!(changes.new.len(), 2);
        // The slot moved on (its held time restarted): cleared; the
        // transaction stays warned.
        let changes = warnings.update(&[transaction(7, 100, 760), slot("s", 0)], AFTER);
        assert!(changes.new.is_empty());
        assert_eq!(changes.cleared, vec![slot("s", 700)]);
    }

    fn sample_slot(name: &str, xmin: Option<i64>) -> ReplicationSlot {
        ReplicationSlot {
            name: name.into(),
            slot_type: "physical".into(),
            active: false,
            xmin,
            catalog_xmin: None,
            xmin_age: xmin.map(|_| 10),
            catalog_xmin_age: None,
            retained_wal_bytes: Some(1),
        }
    }

    #[test]
    fn a_slot_is_held_for_as_long_as_its_xmin_stays() {
        let t0 = DateTime::from_timestamp(1000, 0).expect("a time");
        let at = |s: i64| t0 + chrono::TimeDelta::seconds(s);
        let mut clock = SlotClock::default();
        let held = clock.held_for(
            &[sample_slot("s", Some(5)), sample_slot("free", None)],
            at(0),
        );
        assert_eq!(held.get("s"), Some(&Duration::ZERO));
        assert_eq!(held.get("free"), None, "holds nothing");
        let held = clock.held_for(&[sample_slot("s", Some(5))], at(30));
        assert_eq!(held.get("s"), Some(&Duration::from_secs(30)));
        let held = clock.held_for(&[sample_slot("s", Some(9))], at(40));
        assert_eq!(held.get("s"), Some(&Duration::ZERO), "moved on");
    }
}
