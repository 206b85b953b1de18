//! Rows as the lease domain's types: the claim's batch, settle outcomes,
//! stats. Row decoding only; which rows come back is the statements' business.

use std::{
    collections::{BTreeMap, HashMap},
    time::Duration,
};

use chrono::{DateTime, Utc};
use sqlx::{Row, postgres::PgRow};
use uuid::Uuid;

use super::cursor::Walk;
use crate::{
    lease::{
        BlockedKey, ClaimedBatch, ClaimedMessage, DeadLetter, EndedLease, InspectedMessage,
        LeaseId, MessageId, MessageResult, RowState, Settle, Settled, Stats,
    },
    store::StoreError,
};

/// What a claim statement returned: the batch (its messages in sequence
/// order, the rows it dead-lettered, and the expired leases it took rows back
/// from), how many rows another claim leased first and how many it gave
/// delay rows (neither is part of the batch), and its walk for the cursor.
pub(super) struct ClaimRows {
    pub batch: ClaimedBatch,
    pub lost: usize,
    pub delayed: usize,
    pub walk: Walk,
}

pub(super) fn claimed_batch(lease_id: LeaseId, rows: Vec<PgRow>) -> Result<ClaimRows, StoreError> {
    let mut lost = 0;
    let mut delayed = 0;
    let mut walk = Walk {
        walked_to: None,
        epoch_held: false,
    };
    let mut batch = ClaimedBatch {
        lease_id,
        expires_at: None,
        messages: Vec::with_capacity(rows.len()),
        dead_lettered: Vec::new(),
        expired_leases: Vec::new(),
        too_large: Vec::new(),
    };
    for row in rows {
        // Every row carries the walk; a lone row without an id only that.
        walk = Walk {
            walked_to: row.try_get("walked_to")?,
            epoch_held: row.try_get("epoch_held")?,
        };
        let Some(id) = row.try_get::<Option<Uuid>, _>("id")? else {
            continue;
        };
        if row.try_get::<bool, _>("lost")? {
            lost += 1;
            continue;
        }
        if row.try_get::<bool, _>("delayed")? {
            delayed += 1;
            continue;
        }
        if row.try_get::<bool, _>("too_large")? {
            let bytes: i64 = row.try_get("bytes")?;
            batch
                .too_large
                .push((id, u64::try_from(bytes).unwrap_or(0)));
            continue;
        }
        let dead: bool = row.try_get("dead_lettered")?;
        if let Some(prev) = row.try_get::<Option<Uuid>, _>("prev_lease_id")? {
            let attempts: i32 = row.try_get("attempts")?;
            // A row dead-lettered by this claim kept its count; a re-claimed
            // one was incremented past the expired delivery.
            let attempt = if dead { attempts } else { attempts - 1 };
            let headers: serde_json::Value = row.try_get("headers")?;
            let expired_at: Option<DateTime<Utc>> = row.try_get("prev_locked_until")?;
            batch.expired_leases.push(EndedLease {
                message_id: id,
                lease_id: Some(prev),
                worker_id: row.try_get("prev_claimed_by")?,
                claimed_at: row.try_get("prev_claimed_at")?,
                ended_at: expired_at.unwrap_or_else(Utc::now),
                created_at: row.try_get("created_at")?,
                attempt: u32::try_from(attempt).unwrap_or(0),
                traceparent: header(&headers, "traceparent"),
                tracestate: header(&headers, "tracestate"),
                dead_lettered: dead,
            });
        }
        if dead {
            batch.dead_lettered.push(id);
            continue;
        }
        batch.expires_at = row.try_get("locked_until")?;
        batch.messages.push(claimed_message(id, &row)?);
    }
    batch.messages.sort_by_key(|m| m.sequence);
    Ok(ClaimRows {
        batch,
        lost,
        delayed,
        walk,
    })
}

/// A row of `dead_letters.sql`.
pub(super) fn dead_letter(row: &PgRow) -> Result<DeadLetter, StoreError> {
    let id: Uuid = row.try_get("id")?;
    Ok(DeadLetter {
        message: claimed_message(id, row)?,
        last_error: row
            .try_get::<Option<String>, _>("last_error")?
            .unwrap_or_default(),
        dead_lettered_at: row.try_get("dead_lettered_at")?,
    })
}

/// A row of `inspect.sql`.
pub(super) fn inspected(row: &PgRow) -> Result<InspectedMessage, StoreError> {
    let id: Uuid = row.try_get("id")?;
    Ok(InspectedMessage {
        message: claimed_message(id, row)?,
        last_error: row.try_get("last_error")?,
        available_at: row.try_get("available_at")?,
        leased_until: row.try_get("leased_until")?,
        leased_by: row.try_get("leased_by")?,
        published_at: row.try_get("published_at")?,
        dead_lettered_at: row.try_get("dead_lettered_at")?,
        discarded_at: row.try_get("discarded_at")?,
    })
}

/// A row of `blocked_keys.sql`.
pub(super) fn blocked_key(row: &PgRow) -> Result<BlockedKey, StoreError> {
    Ok(BlockedKey {
        aggregate_id: row.try_get("aggregate_id")?,
        head: row.try_get("id")?,
        blocked_since: row.try_get("since")?,
        held: u64::try_from(row.try_get::<i64, _>("held")?).unwrap_or(0),
        sequence: row.try_get("seq")?,
    })
}

fn claimed_message(id: Uuid, row: &PgRow) -> Result<ClaimedMessage, StoreError> {
    let headers: serde_json::Value = row.try_get("headers")?;
    let attempts: i32 = row.try_get("attempts")?;
    Ok(ClaimedMessage {
        id,
        aggregate_id: row.try_get("aggregate_id")?,
        event_type: row.try_get("event_type")?,
        payload: row.try_get("payload")?,
        headers: header_map(id, headers),
        created_at: row.try_get::<DateTime<Utc>, _>("created_at")?,
        attempt: u32::try_from(attempts).unwrap_or(0),
        sequence: row.try_get("seq")?,
        redrives: u32::try_from(row.try_get::<i32, _>("redrives")?).unwrap_or(0),
    })
}

pub(super) fn stats_of(row: &PgRow) -> Result<Stats, StoreError> {
    let count = |name: &str| -> Result<u64, sqlx::Error> {
        Ok(u64::try_from(row.try_get::<i64, _>(name)?).unwrap_or(0))
    };
    let age = |name: &str| -> Result<Duration, sqlx::Error> {
        Ok(Duration::from_secs_f64(
            row.try_get::<f64, _>(name)?.max(0.0),
        ))
    };
    Ok(Stats {
        pending: count("pending")?,
        in_flight: count("in_flight")?,
        dead_lettered: count("dead_lettered")?,
        oldest_pending_age: age("oldest_pending_secs")?,
        oldest_lease_age: age("oldest_lease_secs")?,
        published_retained: count("published_retained")?,
        blocked_keys: count("blocked_keys")?,
        oldest_blocked_age: age("oldest_blocked_secs")?,
        commit_order_holdback: Duration::ZERO,
        claim_cursor: 0,
        last_error: row.try_get("last_error")?,
    })
}

/// The lease a settle statement just ended on `id`.
///
/// The statement returns the two trace headers as text rather than the whole
/// `headers` document, which would be parsed as JSON for every settled row
/// only for lease spans to read those two values.
fn ended_lease(id: Uuid, lease_id: LeaseId, row: &PgRow) -> Result<EndedLease, StoreError> {
    let attempts: Option<i32> = row.try_get("attempts")?;
    let settled_at: DateTime<Utc> = row.try_get("settled_at")?;
    let created_at: Option<DateTime<Utc>> = row.try_get("created_at")?;
    Ok(EndedLease {
        message_id: id,
        lease_id: Some(lease_id.as_uuid()),
        worker_id: row.try_get("claimed_by")?,
        claimed_at: row.try_get("claimed_at")?,
        ended_at: settled_at,
        created_at: created_at.unwrap_or(settled_at),
        attempt: attempts.and_then(|a| u32::try_from(a).ok()).unwrap_or(0),
        traceparent: row.try_get("traceparent")?,
        tracestate: row.try_get("tracestate")?,
        dead_lettered: row.try_get("dead_lettered_now")?,
    })
}

fn header(headers: &serde_json::Value, name: &str) -> Option<String> {
    headers.get(name)?.as_str().map(str::to_owned)
}

/// The row's `headers` object as strings. Producers may store any JSON there;
/// non-string values are passed on as their JSON text rather than dropped. A
/// document that is not an object (an array, a string, null) has no header
/// names to pass on: the event goes out without headers, and the log says so.
fn header_map(id: Uuid, headers: serde_json::Value) -> BTreeMap<String, String> {
    match headers {
        serde_json::Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        other => {
            let kind = match other {
                serde_json::Value::Null => "null",
                serde_json::Value::Array(_) => "an array",
                serde_json::Value::String(_) => "a string",
                serde_json::Value::Number(_) => "a number",
                _ => "a boolean",
            };
            tracing::warn!(
                event_id = %id,
                headers = kind,
                "event headers are not a JSON object; handing the event out without headers"
            );
            BTreeMap::new()
        }
    }
}

/// One result per requested id, in request order, from the rows the settle
/// statement returned (ids it did not return do not exist in the outbox).
pub(super) fn settle_results(
    settle: Settle,
    lease_id: LeaseId,
    requested: &[MessageId],
    rows: &[PgRow],
) -> Result<Settled, StoreError> {
    let mut seen = HashMap::with_capacity(rows.len());
    let mut ended = Vec::new();
    for row in rows {
        let id: Uuid = row.try_get("id")?;
        let state = RowState {
            held: row.try_get("held")?,
            published: row.try_get("published")?,
            dead_lettered: row.try_get("dead_lettered")?,
        };
        let applied: bool = row.try_get("applied")?;
        let dead_now: bool = row.try_get("dead_lettered_now")?;
        seen.insert(id, (state, applied, dead_now));
        if applied {
            ended.push(ended_lease(id, lease_id, row)?);
        }
    }
    // A repeated id was settled once; every copy reports that one outcome.
    let results = requested
        .iter()
        .map(|id| {
            let (outcome, detail) = match seen.get(&id.as_uuid()) {
                Some(&(state, applied, dead_now)) => settle.outcome(Some(state), applied, dead_now),
                None => settle.outcome(None, false, false),
            };
            MessageResult {
                message_id: *id,
                outcome,
                detail: detail.to_owned(),
            }
        })
        .collect();
    Ok(Settled {
        results,
        expires_at: None,
        ended,
    })
}
