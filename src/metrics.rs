//! outboxd's metrics: every name defined once here. The endpoint and exporters
//! are `outbox_runtime::metrics`.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use tokio::sync::Semaphore;

use opentelemetry::{
    KeyValue,
    metrics::{AsyncInstrument, Counter, Histogram, Meter, ObservableGauge},
};

use outbox_runtime::metrics::{AGE_BUCKETS, BATCH_BUCKETS, LATENCY_BUCKETS};

use crate::{lease::Stats, tasks::watchdog::DatabaseReport};

pub use outbox_runtime::metrics::{Metrics, serve};

/// outboxd's instruments. Counters and histograms carry an `outbox` label.
#[derive(Debug, Clone)]
pub struct ServerMetrics {
    claimed: Counter<u64>,
    acked: Counter<u64>,
    nacked: Counter<u64>,
    dead_lettered: Counter<u64>,
    lease_expired: Counter<u64>,
    lease_lost: Counter<u64>,
    empty_claims: Counter<u64>,
    sweep_found: Counter<u64>,
    sweeps: Counter<u64>,
    orphan_leases: Counter<u64>,
    too_large_for_client: Counter<u64>,
    waiting_claims_refused: Counter<u64>,
    auth_refusals: Counter<u64>,
    auth_reloads: Counter<u64>,
    connections_refused: Counter<u64>,
    listeners: Arc<Mutex<Vec<ListenerPermits>>>,
    rpc_duration: Histogram<f64>,
    claim_batch_size: Histogram<u64>,
    commit_to_ack: Histogram<f64>,
    gauges: Arc<Mutex<BTreeMap<String, Stats>>>,
    database: Arc<Mutex<DatabaseGauges>>,
    _observers: Arc<Vec<ObservableGauge<f64>>>,
}

/// A capped listener's name, cap and permits (see `connections`), for
/// `outbox_open_connections`.
type ListenerPermits = (&'static str, usize, Arc<Semaphore>);

/// A gauge read at each collection from the latest sample in `state` (set by
/// a sampling task, so a scrape never queries the database).
fn observed<T: Send + 'static>(
    meter: &Meter,
    name: &'static str,
    unit: &'static str,
    help: &'static str,
    state: &Arc<Mutex<T>>,
    report: impl Fn(&T, &dyn AsyncInstrument<f64>) + Send + Sync + 'static,
) -> ObservableGauge<f64> {
    let state = Arc::clone(state);
    meter
        .f64_observable_gauge(name)
        .with_description(help)
        .with_unit(unit)
        .with_callback(move |observer| {
            let snapshot = state.lock().unwrap_or_else(|p| p.into_inner());
            report(&snapshot, observer);
        })
        .build()
}

/// The database watchdog's latest values: the database's (no label) and
/// each outbox table's. Empty until the first sample, so nothing is exported
/// before there is something to say.
#[derive(Debug, Default)]
struct DatabaseGauges {
    database: Option<[f64; DATABASE_GAUGES]>,
    tables: BTreeMap<String, [Option<f64>; TABLE_GAUGES]>,
}

const DATABASE_GAUGES: usize = 7;
const TABLE_GAUGES: usize = 6;

impl ServerMetrics {
    pub fn new(metrics: &Metrics) -> Self {
        let meter = metrics.meter("outboxd");
        let counter = |name: &'static str, help: &'static str| {
            meter.u64_counter(name).with_description(help).build()
        };
        let gauges: Arc<Mutex<BTreeMap<String, Stats>>> = Arc::default();
        let gauge = |name: &'static str,
                     unit: &'static str,
                     help: &'static str,
                     read: fn(&Stats) -> f64| {
            observed(
                &meter,
                name,
                unit,
                help,
                &gauges,
                move |snapshot, observer| {
                    for (outbox, stats) in snapshot {
                        observer.observe(read(stats), &[KeyValue::new("outbox", outbox.clone())]);
                    }
                },
            )
        };
        let mut observers = vec![
            gauge(
                "outbox_pending_messages",
                "{message}",
                "Unpublished, not dead-lettered messages.",
                |s| s.pending as f64,
            ),
            gauge(
                "outbox_in_flight_messages",
                "{message}",
                "Messages under an unexpired lease.",
                |s| s.in_flight as f64,
            ),
            gauge(
                "outbox_dead_lettered_messages",
                "{message}",
                "Dead-lettered messages awaiting an operator.",
                |s| s.dead_lettered as f64,
            ),
            gauge(
                "outbox_oldest_pending_age_seconds",
                "s",
                "Age of the oldest claimable or leased unpublished message (not counting those held behind a blocked aggregate's head), by the database clock. Alert on this.",
                |s| s.oldest_pending_age.as_secs_f64(),
            ),
            gauge(
                "outbox_oldest_lease_age_seconds",
                "s",
                "Age of the oldest unexpired lease, by the database clock.",
                |s| s.oldest_lease_age.as_secs_f64(),
            ),
            gauge(
                "outbox_blocked_keys",
                "{aggregate}",
                "Aggregates held back behind a dead-lettered event (ordered outboxes, poison=block) until an operator redrives or discards it. Alert when above zero.",
                |s| s.blocked_keys as f64,
            ),
            gauge(
                "outbox_oldest_blocked_key_age_seconds",
                "s",
                "How long the longest-blocked aggregate has been blocked, by the database clock.",
                |s| s.oldest_blocked_age.as_secs_f64(),
            ),
            gauge(
                "outbox_commit_order_holdback_seconds",
                "s",
                "How long the commit-order guard has been waiting for transactions of the database that were open when newer events committed: an ordered outbox holds those events back, an unordered one holds its claim cursor (claims then walk the leases taken since). A long-open transaction shows here.",
                |s| s.commit_order_holdback.as_secs_f64(),
            ),
            gauge(
                "outbox_claim_cursor",
                "{seq}",
                "This replica's claim cursor (unordered outboxes): every pending event at or below this seq is leased, delayed or settled, and claims read from here.",
                |s| s.claim_cursor as f64,
            ),
        ];
        let listeners: Arc<Mutex<Vec<ListenerPermits>>> = Arc::default();
        observers.push(observed(
            &meter,
            "outbox_open_connections",
            "{connection}",
            "Connections a listener holds open (api, health, status_page, metrics); at --max-connections it refuses more.",
            &listeners,
            |listeners, observer| {
                for (name, max, permits) in listeners {
                    let open = max.saturating_sub(permits.available_permits());
                    observer.observe(open as f64, &[KeyValue::new("listener", *name)]);
                }
            },
        ));
        let database: Arc<Mutex<DatabaseGauges>> = Arc::default();
        let db_gauge = |name: &'static str, unit: &'static str, help: &'static str, at: usize| {
            observed(
                &meter,
                name,
                unit,
                help,
                &database,
                move |snapshot, observer| {
                    if let Some(values) = &snapshot.database {
                        observer.observe(values[at], &[]);
                    }
                },
            )
        };
        let table_gauge =
            |name: &'static str, unit: &'static str, help: &'static str, at: usize| {
                observed(
                    &meter,
                    name,
                    unit,
                    help,
                    &database,
                    move |snapshot, observer| {
                        for (outbox, values) in &snapshot.tables {
                            if let Some(value) = values[at] {
                                observer.observe(value, &[KeyValue::new("outbox", outbox.clone())]);
                            }
                        }
                    },
                )
            };
        observers.extend([
            db_gauge(
                "outbox_db_xmin_horizon_age_seconds",
                "s",
                "Age of the oldest holder of the database's xmin horizon (transaction, replication slot or prepared transaction); 0 when none. While it grows, vacuum cannot remove dead outbox rows. Alert on this.",
                0,
            ),
            db_gauge(
                "outbox_db_oldest_transaction_age_seconds",
                "s",
                "Age of the oldest transaction of the database that holds a transaction id or a snapshot.",
                1,
            ),
            db_gauge(
                "outbox_db_idle_in_transaction_seconds",
                "s",
                "How long the longest idle-in-transaction session of the database has been idle.",
                2,
            ),
            db_gauge(
                "outbox_db_replication_slots_holding_xmin",
                "{slot}",
                "Replication slots (physical ones, and this database's logical ones) with an xmin or catalog_xmin set.",
                3,
            ),
            db_gauge(
                "outbox_db_replication_slot_retained_wal_bytes",
                "By",
                "WAL kept for the replication slot that keeps the most.",
                4,
            ),
            db_gauge(
                "outbox_db_prepared_transactions",
                "{transaction}",
                "Prepared (two-phase) transactions of the database; each holds the xmin horizon until committed or rolled back.",
                5,
            ),
            db_gauge(
                "outbox_db_oldest_prepared_transaction_age_seconds",
                "s",
                "Age of the oldest prepared transaction of the database; 0 when none.",
                6,
            ),
            table_gauge(
                "outbox_table_dead_tuples",
                "{tuple}",
                "Dead tuples in the outbox table (pg_stat_user_tables, updated asynchronously).",
                0,
            ),
            table_gauge(
                "outbox_table_live_tuples",
                "{tuple}",
                "Live tuples in the outbox table (pg_stat_user_tables estimate).",
                1,
            ),
            table_gauge(
                "outbox_table_last_autovacuum_age_seconds",
                "s",
                "Since the later of the outbox table's last autovacuum and last manual vacuum; absent while it was never vacuumed.",
                2,
            ),
            table_gauge(
                "outbox_table_last_autoanalyze_age_seconds",
                "s",
                "Since the later of the outbox table's last autoanalyze and last manual analyze; absent while it was never analyzed.",
                3,
            ),
            table_gauge(
                "outbox_table_size_bytes",
                "By",
                "The outbox table's size (pg_table_size: heap, TOAST, free space and visibility maps).",
                4,
            ),
            table_gauge(
                "outbox_table_index_size_bytes",
                "By",
                "The outbox table's indexes' size (pg_indexes_size).",
                5,
            ),
        ]);
        Self {
            claimed: counter(
                "outbox_messages_claimed_total",
                "Messages handed out under a lease.",
            ),
            acked: counter("outbox_messages_acked_total", "Messages acked (published)."),
            nacked: counter(
                "outbox_messages_nacked_total",
                "Messages released for a retry by a nack.",
            ),
            dead_lettered: counter(
                "outbox_messages_dead_lettered_total",
                "Messages dead-lettered (by nack or on reaching max attempts).",
            ),
            lease_expired: counter(
                "outbox_leases_expired_total",
                "Leases that ran out unsettled, counted when their message was re-claimed.",
            ),
            lease_lost: counter(
                "outbox_lease_lost_total",
                "Settle attempts refused because the message was no longer under that lease (stale acks).",
            ),
            empty_claims: counter(
                "outbox_empty_claims_total",
                "Claim statements that found nothing claimable (long-poll re-checks included).",
            ),
            sweep_found: counter(
                "outbox_claim_sweep_found_total",
                "Claimable events a sweep (--claim-sweep-interval) found below the claim cursor without a lease, and handed out again. Each one is a fault of the cursor (or a hand in the lease table): it should stay 0; alert when it moves.",
            ),
            sweeps: counter(
                "outbox_claim_sweeps_total",
                "Sweeps of the claim cursor completed.",
            ),
            orphan_leases: counter(
                "outbox_orphan_leases_removed_total",
                "Lease rows a sweep removed because their outbox row no longer exists (rows deleted by hand).",
            ),
            too_large_for_client: counter(
                "outbox_events_too_large_for_client_total",
                "Events a claim passed over because they exceed the client's max_response_bytes (left for a client that can receive them; counted at each claim that passes one).",
            ),
            waiting_claims_refused: counter(
                "outbox_waiting_claims_refused_total",
                "Long-polling claims refused with RESOURCE_EXHAUSTED because --max-waiting-claims were waiting already.",
            ),
            auth_refusals: counter(
                "outbox_auth_refusals_total",
                "Calls refused by authorisation, by method and code (Unauthenticated: no or unknown credential; PermissionDenied: no scope for that outbox).",
            ),
            auth_reloads: counter(
                "outbox_auth_reloads_total",
                "Reads of a changed (or SIGHUP'd) --auth-tokens file, by result: ok, invalid, unreadable. Any but ok leaves the previous version in force: alert on it.",
            ),
            connections_refused: counter(
                "outbox_connections_refused_total",
                "Connections a listener closed at once because it held --max-connections already, by listener (api, health, status_page, metrics).",
            ),
            listeners,
            rpc_duration: meter
                .f64_histogram("outbox_rpc_duration_seconds")
                .with_description("gRPC handling time by method and status code.")
                .with_unit("s")
                .with_boundaries(LATENCY_BUCKETS.to_vec())
                .build(),
            claim_batch_size: meter
                .u64_histogram("outbox_claim_batch_size")
                .with_description("Messages per non-empty claim.")
                .with_boundaries(BATCH_BUCKETS.to_vec())
                .build(),
            commit_to_ack: meter
                .f64_histogram("outbox_commit_to_ack_seconds")
                .with_description("From created_at to the ack, by the database clock.")
                .with_unit("s")
                .with_boundaries(AGE_BUCKETS.to_vec())
                .build(),
            gauges,
            database,
            _observers: Arc::new(observers),
        }
    }

    pub fn rpc(&self, method: &'static str, code: tonic::Code, seconds: f64) {
        let attrs = [
            KeyValue::new("method", method),
            KeyValue::new("code", format!("{code:?}")),
        ];
        self.rpc_duration.record(seconds, &attrs);
    }

    /// A call refused by authorisation; labels never carry a credential.
    pub fn auth_refused(&self, method: &'static str, code: tonic::Code) {
        let attrs = [
            KeyValue::new("method", method),
            KeyValue::new("code", format!("{code:?}")),
        ];
        self.auth_refusals.add(1, &attrs);
    }

    /// A re-read of the tokens file: `ok`, `invalid` or `unreadable`.
    pub fn auth_reloaded(&self, result: &'static str) {
        self.auth_reloads.add(1, &[KeyValue::new("result", result)]);
    }

    /// A connection closed at once at `listener`'s cap.
    pub fn connection_refused(&self, listener: &'static str) {
        self.connections_refused
            .add(1, &[KeyValue::new("listener", listener)]);
    }

    /// Reports `listener`'s open connections (`max` less its free permits).
    pub fn watch_connections(&self, listener: &'static str, max: usize, permits: Arc<Semaphore>) {
        let mut listeners = self.listeners.lock().unwrap_or_else(|p| p.into_inner());
        listeners.retain(|(name, _, _)| *name != listener);
        listeners.push((listener, max, permits));
    }

    pub fn waiting_claim_refused(&self, outbox: &str) {
        self.add(&self.waiting_claims_refused, outbox, 1);
    }

    pub fn claimed(&self, outbox: &str, messages: usize) {
        let attrs = [KeyValue::new("outbox", outbox.to_owned())];
        if messages == 0 {
            self.empty_claims.add(1, &attrs);
        } else {
            self.claimed.add(messages as u64, &attrs);
            self.claim_batch_size.record(messages as u64, &attrs);
        }
    }

    pub fn acked(&self, outbox: &str, n: usize) {
        self.add(&self.acked, outbox, n);
    }

    pub fn nacked(&self, outbox: &str, n: usize) {
        self.add(&self.nacked, outbox, n);
    }

    pub fn too_large_for_client(&self, outbox: &str, n: usize) {
        self.add(&self.too_large_for_client, outbox, n);
    }

    pub fn dead_lettered(&self, outbox: &str, n: usize) {
        self.add(&self.dead_lettered, outbox, n);
    }

    /// One sweep done: every series is written, zeros too, so a dashboard
    /// (and a test) tells "swept, found nothing" from "never swept".
    pub fn swept(&self, outbox: &str, found: usize, orphans: u64) {
        let attrs = [KeyValue::new("outbox", outbox.to_owned())];
        self.sweeps.add(1, &attrs);
        self.sweep_found.add(found as u64, &attrs);
        self.orphan_leases.add(orphans, &attrs);
    }

    pub fn leases_expired(&self, outbox: &str, n: usize) {
        self.add(&self.lease_expired, outbox, n);
    }

    pub fn lease_lost(&self, outbox: &str, n: usize) {
        self.add(&self.lease_lost, outbox, n);
    }

    /// One observation per acked message; the label is built once per call.
    pub fn commit_to_ack(&self, outbox: &str, seconds: impl IntoIterator<Item = f64>) {
        let labels = [KeyValue::new("outbox", outbox.to_owned())];
        for s in seconds {
            self.commit_to_ack.record(s.max(0.0), &labels);
        }
    }

    /// The latest sample of an outbox's gauges.
    pub fn set_gauges(&self, outbox: &str, stats: Stats) {
        let mut gauges = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        gauges.insert(outbox.to_owned(), stats);
    }

    /// How long `outbox`'s commit-order guard was holding events back at the
    /// last gauge sample (GetStats does not probe the guard); zero before one.
    pub fn sampled_holdback(&self, outbox: &str) -> std::time::Duration {
        let gauges = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        gauges
            .get(outbox)
            .map(|s| s.commit_order_holdback)
            .unwrap_or_default()
    }

    /// Whether an ordered outbox's commit-order guard held events back at
    /// the last gauge sample.
    pub fn commit_order_held(&self) -> bool {
        let gauges = self.gauges.lock().unwrap_or_else(|p| p.into_inner());
        gauges.values().any(|s| !s.commit_order_holdback.is_zero())
    }

    /// The latest findings of the database watchdog.
    pub fn set_database(&self, report: &DatabaseReport) {
        let secs = |d: std::time::Duration| d.as_secs_f64();
        let database = [
            secs(report.horizon_age),
            secs(report.oldest_transaction_age()),
            secs(report.longest_idle_in_transaction()),
            report.slots_holding_xmin() as f64,
            report.largest_retained_wal_bytes() as f64,
            report.sample.prepared_count as f64,
            secs(report.oldest_prepared_age()),
        ];
        let tables = report
            .sample
            .tables
            .iter()
            .map(|t| {
                let values = [
                    Some(t.dead_tuples as f64),
                    Some(t.live_tuples as f64),
                    t.since_vacuum.map(secs),
                    t.since_analyze.map(secs),
                    Some(t.table_bytes as f64),
                    Some(t.index_bytes as f64),
                ];
                (t.outbox.clone(), values)
            })
            .collect();
        let mut gauges = self.database.lock().unwrap_or_else(|p| p.into_inner());
        *gauges = DatabaseGauges {
            database: Some(database),
            tables,
        };
    }

    fn add(&self, counter: &Counter<u64>, outbox: &str, n: usize) {
        if n > 0 {
            counter.add(n as u64, &[KeyValue::new("outbox", outbox.to_owned())]);
        }
    }
}
