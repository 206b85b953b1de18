//! What the page shows, read when it is loaded: each outbox's figures (the
//! same reads as GetStats and ListBlockedKeys) with the time they were read,
//! and the watchdog's latest findings with the time of its sample.

use std::{sync::Arc, time::Duration};

use chrono::{DateTime, Utc};

use crate::{
    lease::{BlockedKey, BlockedKeysRequest, OutboxName, PageRequest, Stats},
    metrics::ServerMetrics,
    outbox::OutboxSpec,
    service::AdminService,
    tasks::watchdog::DatabaseReport,
};

/// Blocked keys listed per outbox; the count says how many there are in all.
pub const BLOCKED_KEYS_SHOWN: u32 = 20;

#[derive(Debug)]
pub struct View {
    pub rendered_at: DateTime<Utc>,
    pub outboxes: Vec<OutboxView>,
    /// Configured outboxes the caller has no admin scope for (not named).
    pub hidden: usize,
    pub database: Option<Arc<DatabaseReport>>,
}

#[derive(Debug)]
pub struct OutboxView {
    pub spec: OutboxSpec,
    /// When the figures were read: after the read, by this server's clock.
    pub read_at: DateTime<Utc>,
    /// The error is shown in place of the figures, never the whole page.
    pub stats: Result<Stats, String>,
    /// The commit-order guard's holdback at the last gauge sample (every
    /// `--metrics-interval`): reading it probes the guard, which GetStats
    /// does not do.
    pub holdback: Duration,
    pub blocked: Result<Vec<BlockedKey>, String>,
}

/// Reads every outbox `visible` admits, all at once.
pub async fn gather(
    admin: &AdminService,
    metrics: &ServerMetrics,
    visible: impl Fn(&str) -> bool,
) -> View {
    let specs = admin.outboxes();
    let total = specs.len();
    let reads = specs
        .into_iter()
        .filter(|spec| visible(&spec.name))
        .map(|spec| async move {
            let stats = admin.stats(&spec.name).await.map_err(|e| e.to_string());
            // Only ordered outboxes under `poison=block` have blocked keys.
            let blocked = if spec.ordering.blocks() {
                let request = BlockedKeysRequest {
                    outbox: OutboxName::from_wire(&spec.name),
                    page: PageRequest {
                        size: BLOCKED_KEYS_SHOWN,
                        after: None,
                    },
                };
                admin
                    .blocked_keys(&request)
                    .await
                    .map(|page| page.items)
                    .map_err(|e| e.to_string())
            } else {
                Ok(Vec::new())
            };
            OutboxView {
                holdback: metrics.sampled_holdback(&spec.name),
                spec,
                read_at: Utc::now(),
                stats,
                blocked,
            }
        });
    let outboxes = futures::future::join_all(reads).await;
    View {
        rendered_at: Utc::now(),
        hidden: total - outboxes.len(),
        outboxes,
        database: admin.latest_database_report(),
    }
}
