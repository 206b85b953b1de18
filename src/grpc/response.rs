//! The service's results shaped for the wire: one `From` per response.

use chrono::{DateTime, Utc};

use super::pb;
use super::request::page_token;
use crate::{
    lease::{
        BlockedKey, ClaimedBatch, ClaimedMessage, DeadLetter, InspectedMessage, MessageResult,
        Outcome, Page, Settled, Stats,
    },
    outbox::{Ordering, OutboxSpec, Poison},
    store::watchdog::{OpenTransaction, PreparedTransaction, TableHealth},
    tasks::watchdog::DatabaseReport,
};

/// What ClaimBatch answers: the outcomes of the acks it carried, and the batch
/// (no lease id, expiry or messages when nothing was claimed).
impl From<(Vec<MessageResult>, ClaimedBatch)> for pb::ClaimBatchResponse {
    fn from((acked, batch): (Vec<MessageResult>, ClaimedBatch)) -> Self {
        let ack_results = results(acked);
        if batch.messages.is_empty() {
            return Self {
                ack_results,
                ..Default::default()
            };
        }
        Self {
            lease_id: batch.lease_id.to_string(),
            lease_expires_at: batch.expires_at.map(timestamp),
            messages: batch.messages.into_iter().map(Into::into).collect(),
            ack_results,
        }
    }
}

impl From<ClaimedMessage> for pb::OutboxMessage {
    fn from(m: ClaimedMessage) -> Self {
        Self {
            id: m.id.to_string(),
            aggregate_id: m.aggregate_id,
            event_type: m.event_type,
            payload: m.payload.into_bytes(),
            headers: m.headers.into_iter().collect(),
            created_at: Some(timestamp(m.created_at)),
            attempt: m.attempt,
            sequence: m.sequence,
            redrives: m.redrives,
        }
    }
}

impl From<Settled> for pb::AckResponse {
    fn from(settled: Settled) -> Self {
        Self {
            results: results(settled.results),
        }
    }
}

impl From<Settled> for pb::NackResponse {
    fn from(settled: Settled) -> Self {
        Self {
            results: results(settled.results),
        }
    }
}

impl From<Settled> for pb::ExtendLeaseResponse {
    fn from(settled: Settled) -> Self {
        Self {
            lease_expires_at: settled.expires_at.map(timestamp),
            results: results(settled.results),
        }
    }
}

impl From<Stats> for pb::GetStatsResponse {
    fn from(s: Stats) -> Self {
        Self {
            pending: s.pending,
            in_flight: s.in_flight,
            dead_lettered: s.dead_lettered,
            oldest_pending_age: Some(duration(s.oldest_pending_age)),
            published_retained: s.published_retained,
            blocked_keys: s.blocked_keys,
            oldest_blocked_age: Some(duration(s.oldest_blocked_age)),
            last_error: s.last_error.unwrap_or_default(),
        }
    }
}

impl From<Page<DeadLetter>> for pb::ListDeadLettersResponse {
    fn from(page: Page<DeadLetter>) -> Self {
        Self {
            dead_letters: page
                .items
                .into_iter()
                .map(|d| pb::DeadLetter {
                    message: Some(d.message.into()),
                    last_error: d.last_error,
                    dead_lettered_at: Some(timestamp(d.dead_lettered_at)),
                })
                .collect(),
            next_page_token: page.next.map(page_token).unwrap_or_default(),
        }
    }
}

impl From<Page<BlockedKey>> for pb::ListBlockedKeysResponse {
    fn from(page: Page<BlockedKey>) -> Self {
        Self {
            blocked_keys: page
                .items
                .into_iter()
                .map(|k| pb::BlockedKey {
                    aggregate_id: k.aggregate_id,
                    head_message_id: k.head.to_string(),
                    blocked_since: Some(timestamp(k.blocked_since)),
                    held: k.held,
                })
                .collect(),
            next_page_token: page.next.map(page_token).unwrap_or_default(),
        }
    }
}

impl From<InspectedMessage> for pb::InspectMessageResponse {
    fn from(m: InspectedMessage) -> Self {
        let state = m.state().as_str().to_owned();
        Self {
            message: Some(m.message.into()),
            last_error: m.last_error.unwrap_or_default(),
            leased_until: m.leased_until.map(timestamp),
            leased_by: m.leased_by.unwrap_or_default(),
            published_at: m.published_at.map(timestamp),
            dead_lettered_at: m.dead_lettered_at.map(timestamp),
            discarded_at: m.discarded_at.map(timestamp),
            available_at: Some(timestamp(m.available_at)),
            state,
        }
    }
}

impl From<&OutboxSpec> for pb::OutboxInfo {
    fn from(spec: &OutboxSpec) -> Self {
        let (ordering, poison) = match spec.ordering {
            Ordering::None => ("none", ""),
            Ordering::Aggregate(Poison::Block) => ("aggregate", "block"),
            Ordering::Aggregate(Poison::Park) => ("aggregate", "park"),
        };
        Self {
            name: spec.name.clone(),
            table: spec.table.to_string(),
            ordering: ordering.to_owned(),
            poison: poison.to_owned(),
        }
    }
}

impl From<MessageResult> for pb::MessageResult {
    fn from(r: MessageResult) -> Self {
        Self {
            message_id: r.message_id.to_string(),
            outcome: pb::Outcome::from(r.outcome).into(),
            detail: r.detail,
        }
    }
}

impl From<Outcome> for pb::Outcome {
    fn from(outcome: Outcome) -> Self {
        match outcome {
            Outcome::Ok => Self::Ok,
            Outcome::AlreadyDone => Self::AlreadyDone,
            Outcome::LeaseLost => Self::LeaseLost,
            Outcome::NotFound => Self::NotFound,
            Outcome::DeadLettered => Self::DeadLettered,
        }
    }
}

/// GetDatabaseReport: the watchdog's findings as they are, never a query text.
impl From<&DatabaseReport> for pb::GetDatabaseReportResponse {
    fn from(report: &DatabaseReport) -> Self {
        let sample = &report.sample;
        Self {
            read_at: Some(timestamp(sample.read_at)),
            xmin_horizon_age: Some(duration(report.horizon_age)),
            transactions: sample.transactions.iter().map(Into::into).collect(),
            replication_slots: sample
                .slots
                .iter()
                .map(|s| pb::DatabaseReplicationSlot {
                    name: s.name.clone(),
                    slot_type: s.slot_type.clone(),
                    active: s.active,
                    xmin_age: s.xmin_age,
                    catalog_xmin_age: s.catalog_xmin_age,
                    retained_wal_bytes: s.retained_wal_bytes,
                    held_for: report.slot_held_for.get(&s.name).copied().map(duration),
                })
                .collect(),
            prepared_transactions: sample.prepared.iter().map(Into::into).collect(),
            prepared_transaction_count: sample.prepared_count,
            tables: sample.tables.iter().map(Into::into).collect(),
            commit_order_cause: report.commit_order_cause.as_ref().map(Into::into),
        }
    }
}

impl From<&OpenTransaction> for pb::DatabaseTransaction {
    fn from(t: &OpenTransaction) -> Self {
        Self {
            pid: t.pid,
            application_name: t.application_name.clone(),
            state: t.state.clone(),
            xact_start: Some(timestamp(t.xact_start)),
            age: Some(duration(t.age)),
            idle_in_transaction: t.idle_in_transaction.map(duration),
            writer: t.writer,
        }
    }
}

impl From<&PreparedTransaction> for pb::DatabasePreparedTransaction {
    fn from(p: &PreparedTransaction) -> Self {
        Self {
            gid: p.gid.clone(),
            owner: p.owner.clone(),
            prepared: Some(timestamp(p.prepared)),
            age: Some(duration(p.age)),
        }
    }
}

impl From<&TableHealth> for pb::OutboxTableHealth {
    fn from(t: &TableHealth) -> Self {
        Self {
            outbox: t.outbox.clone(),
            dead_tuples: t.dead_tuples,
            live_tuples: t.live_tuples,
            since_vacuum: t.since_vacuum.map(duration),
            since_analyze: t.since_analyze.map(duration),
            table_bytes: t.table_bytes,
            index_bytes: t.index_bytes,
        }
    }
}

fn results(results: Vec<MessageResult>) -> Vec<pb::MessageResult> {
    results.into_iter().map(Into::into).collect()
}

fn timestamp(t: DateTime<Utc>) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: t.timestamp(),
        nanos: i32::try_from(t.timestamp_subsec_nanos()).unwrap_or(0),
    }
}

/// prost-types' conversion; an age beyond `i64::MAX` seconds (none is) saturates.
fn duration(d: std::time::Duration) -> prost_types::Duration {
    d.try_into().unwrap_or(prost_types::Duration {
        seconds: i64::MAX,
        nanos: 999_999_999,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::time::Duration;

    use crate::lease::{LeaseId, MessageId};

    fn result(outcome: Outcome) -> MessageResult {
        MessageResult {
            message_id: MessageId::from(uuid::Uuid::nil()),
            outcome,
            detail: "why".to_owned(),
        }
    }

    #[test]
    fn an_empty_claim_names_no_lease() {
        let batch = ClaimedBatch {
            lease_id: LeaseId::generate(),
            expires_at: Some(Utc::now()),
            messages: Vec::new(),
            dead_lettered: Vec::new(),
            expired_leases: Vec::new(),
            too_large: Vec::new(),
        };
        let response = pb::ClaimBatchResponse::from((vec![result(Outcome::Ok)], batch));
        assert_eq!(response.lease_id, "");
        assert_eq!(response.lease_expires_at, None);
        assert_eq!(response.ack_results.len(), 1);
    }

    #[test]
    fn outcomes_keep_their_wire_values() {
        let r = pb::MessageResult::from(result(Outcome::DeadLettered));
        assert_eq!(r.outcome, pb::Outcome::DeadLettered as i32);
        assert_eq!(r.message_id, uuid::Uuid::nil().to_string());
        assert_eq!(r.detail, "why");
    }

    #[test]
    fn durations_go_out_as_seconds_and_nanos() {
        let d = duration(Duration::new(90, 5));
        assert_eq!((d.seconds, d.nanos), (90, 5));
        let d = duration(Duration::MAX);
        assert_eq!(d.seconds, i64::MAX);
    }
}
