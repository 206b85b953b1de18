//! Requests as the service understands them, parsed from wire values against the
//! server's limits. Every bad field is reported, each under its wire name, so a
//! client fixes them all in one round trip.

use std::time::Duration;

use super::{LeaseId, Limits, MAX_CARRIED_ACKS, MAX_ERROR_CHARS, MessageId, OutboxName, WorkerId};

/// A bad request field, named as on the wire (`message_ids[3]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldViolation {
    pub field: String,
    pub description: String,
}

impl FieldViolation {
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            description: description.into(),
        }
    }
}

/// A `google.protobuf.Duration` as it arrived: seconds and nanos, unchecked.
pub type WireDuration = (i64, i32);

#[derive(Debug, Clone)]
pub struct ClaimRequest {
    pub outbox: OutboxName,
    pub worker_id: WorkerId,
    pub max_messages: u32,
    pub lease: Duration,
    pub wait: Duration,
    /// The batch's byte budget and the largest event handed out (see [`Limits`]).
    pub max_bytes: u64,
    pub max_message_bytes: u64,
    /// Acks of earlier batches, applied before the claim (see [`AckRequest::parse_carried`]).
    pub acks: Vec<AckRequest>,
}

#[derive(Debug, Clone)]
pub struct AckRequest {
    pub outbox: OutboxName,
    pub lease_id: LeaseId,
    pub message_ids: Vec<MessageId>,
}

#[derive(Debug, Clone)]
pub struct NackRequest {
    pub outbox: OutboxName,
    pub lease_id: LeaseId,
    pub message_ids: Vec<MessageId>,
    pub error: String,
    /// `None`: the outbox's backoff policy decides.
    pub retry_after: Option<Duration>,
    pub dead_letter: bool,
}

#[derive(Debug, Clone)]
pub struct ExtendRequest {
    pub outbox: OutboxName,
    pub lease_id: LeaseId,
    /// Empty: every message still held under the lease.
    pub message_ids: Vec<MessageId>,
    pub lease: Duration,
}

#[derive(Debug, Clone)]
pub struct StatsRequest {
    pub outbox: OutboxName,
}

/// Collects violations while fields are parsed one by one.
#[derive(Default)]
struct Check(Vec<FieldViolation>);

impl Check {
    fn field<T>(&mut self, name: &str, parsed: Result<T, &str>) -> Option<T> {
        parsed
            .map_err(|why| self.0.push(FieldViolation::new(name, why)))
            .ok()
    }

    fn duration(&mut self, name: &str, raw: Option<WireDuration>) -> Option<Option<Duration>> {
        match raw {
            None => Some(None),
            Some((secs, nanos)) => {
                let valid = (0..1_000_000_000).contains(&nanos) && secs >= 0;
                self.field(
                    name,
                    if valid {
                        Ok(Some(Duration::new(secs as u64, nanos as u32)))
                    } else {
                        Err("must be a non-negative duration")
                    },
                )
            }
        }
    }

    fn lease(
        &mut self,
        name: &str,
        raw: Option<WireDuration>,
        limits: &Limits,
    ) -> Option<Duration> {
        let lease = self.duration(name, raw)?.unwrap_or(limits.default_lease);
        if lease < limits.min_lease || lease > limits.max_lease {
            let why = format!(
                "must be between {} and {}",
                humantime::format_duration(limits.min_lease),
                humantime::format_duration(limits.max_lease)
            );
            self.0.push(FieldViolation::new(name, why));
            return None;
        }
        Some(lease)
    }

    fn ids(&mut self, raw: &[String], required: bool, limits: &Limits) -> Vec<MessageId> {
        if required && raw.is_empty() {
            self.0.push(FieldViolation::new(
                "message_ids",
                "at least one id is required",
            ));
        }
        if raw.len() > limits.max_batch as usize {
            self.0.push(FieldViolation::new(
                "message_ids",
                format!("at most {} ids per call", limits.max_batch),
            ));
            return Vec::new();
        }
        raw.iter()
            .enumerate()
            .filter_map(|(i, id)| self.field(&format!("message_ids[{i}]"), MessageId::parse(id)))
            .collect()
    }

    fn finish<T>(self, build: impl FnOnce() -> Option<T>) -> Result<T, Vec<FieldViolation>> {
        match (self.0.is_empty(), build()) {
            (true, Some(request)) => Ok(request),
            _ => Err(self.0),
        }
    }
}

impl ClaimRequest {
    pub fn parse(
        outbox: &str,
        worker_id: &str,
        max_messages: u32,
        lease: Option<WireDuration>,
        wait: Option<WireDuration>,
        limits: &Limits,
    ) -> Result<Self, Vec<FieldViolation>> {
        let mut check = Check::default();
        let worker_id = check.field("worker_id", WorkerId::parse(worker_id));
        let max = limits.max_batch;
        let max_messages = if (1..=max).contains(&max_messages) {
            Some(max_messages)
        } else {
            let why = format!("must be between 1 and {max}");
            check.0.push(FieldViolation::new("max_messages", why));
            None
        };
        let lease = check.lease("lease_duration", lease, limits);
        let wait = check
            .duration("wait", wait)
            .map(|w| w.unwrap_or_default().min(limits.max_wait));
        check.finish(|| {
            Some(Self {
                outbox: OutboxName::from_wire(outbox),
                worker_id: worker_id?,
                max_messages: max_messages?,
                lease: lease?,
                wait: wait?,
                max_bytes: limits.max_claim_bytes,
                max_message_bytes: limits.max_message_bytes,
                acks: Vec::new(),
            })
        })
    }
}

impl AckRequest {
    pub fn parse(
        outbox: &str,
        lease_id: &str,
        message_ids: &[String],
        limits: &Limits,
    ) -> Result<Self, Vec<FieldViolation>> {
        let mut check = Check::default();
        let lease_id = check.field("lease_id", LeaseId::parse(lease_id));
        let message_ids = check.ids(message_ids, true, limits);
        check.finish(|| {
            Some(Self {
                outbox: OutboxName::from_wire(outbox),
                lease_id: lease_id?,
                message_ids,
            })
        })
    }

    /// The acks a ClaimBatch carries, as `(lease_id, message_ids)`: each checked
    /// as an Ack is, its violations named under `acks[i]` (`acks[0].lease_id`).
    pub fn parse_carried<'a>(
        outbox: &str,
        acks: impl ExactSizeIterator<Item = (&'a str, &'a [String])>,
        limits: &Limits,
    ) -> Result<Vec<Self>, Vec<FieldViolation>> {
        if acks.len() > MAX_CARRIED_ACKS {
            let why = format!("at most {MAX_CARRIED_ACKS} leases per call");
            return Err(vec![FieldViolation::new("acks", why)]);
        }
        let mut parsed = Vec::with_capacity(acks.len());
        let mut violations = Vec::new();
        for (i, (lease_id, message_ids)) in acks.enumerate() {
            match Self::parse(outbox, lease_id, message_ids, limits) {
                Ok(ack) => parsed.push(ack),
                Err(bad) => violations.extend(bad.into_iter().map(|v| FieldViolation {
                    field: format!("acks[{i}].{}", v.field),
                    description: v.description,
                })),
            }
        }
        if violations.is_empty() {
            Ok(parsed)
        } else {
            Err(violations)
        }
    }
}

impl NackRequest {
    pub fn parse(
        outbox: &str,
        lease_id: &str,
        message_ids: &[String],
        error: &str,
        retry_after: Option<WireDuration>,
        dead_letter: bool,
        limits: &Limits,
    ) -> Result<Self, Vec<FieldViolation>> {
        let mut check = Check::default();
        let lease_id = check.field("lease_id", LeaseId::parse(lease_id));
        let message_ids = check.ids(message_ids, true, limits);
        let retry_after = match check.duration("retry_after", retry_after) {
            Some(Some(d)) if d > limits.max_retry_after => {
                let why = format!(
                    "must be at most {}",
                    humantime::format_duration(limits.max_retry_after)
                );
                check.0.push(FieldViolation::new("retry_after", why));
                None
            }
            other => other,
        };
        check.finish(|| {
            Some(Self {
                outbox: OutboxName::from_wire(outbox),
                lease_id: lease_id?,
                message_ids,
                error: clean_error(error),
                retry_after: retry_after?,
                dead_letter,
            })
        })
    }
}

impl ExtendRequest {
    pub fn parse(
        outbox: &str,
        lease_id: &str,
        message_ids: &[String],
        lease: Option<WireDuration>,
        limits: &Limits,
    ) -> Result<Self, Vec<FieldViolation>> {
        let mut check = Check::default();
        let lease_id = check.field("lease_id", LeaseId::parse(lease_id));
        let message_ids = check.ids(message_ids, false, limits);
        let lease = check.lease("lease_duration", lease, limits);
        check.finish(|| {
            Some(Self {
                outbox: OutboxName::from_wire(outbox),
                lease_id: lease_id?,
                message_ids,
                lease: lease?,
            })
        })
    }
}

impl StatsRequest {
    pub fn parse(outbox: &str) -> Self {
        Self {
            outbox: OutboxName::from_wire(outbox),
        }
    }
}

/// PostgreSQL text cannot hold NUL; a worker's error string must never turn a
/// Nack into a storage error.
fn clean_error(raw: &str) -> String {
    let mut error: String = raw
        .chars()
        .filter(|c| *c != '\0')
        .take(MAX_ERROR_CHARS)
        .collect();
    if raw.chars().count() > MAX_ERROR_CHARS {
        error.push('…');
    }
    error
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "6f1c2b0e-8a4b-4c3e-9d1f-0a2b3c4d5e6f";

    fn fields(violations: Vec<FieldViolation>) -> Vec<String> {
        violations.into_iter().map(|v| v.field).collect()
    }

    #[test]
    fn claim_defaults_apply_when_unset() {
        let limits = Limits::default();
        let req = ClaimRequest::parse("", "w1", 10, None, None, &limits).expect("valid");
        assert_eq!(req.outbox.as_str(), "default");
        assert_eq!(req.lease, limits.default_lease);
        assert_eq!(req.wait, Duration::ZERO);
    }

    #[test]
    fn claim_reports_every_bad_field() {
        let limits = Limits::default();
        let err = ClaimRequest::parse("", "", 0, Some((0, 5)), Some((-1, 0)), &limits)
            .expect_err("invalid");
        assert_eq!(
            fields(err),
            ["worker_id", "max_messages", "lease_duration", "wait"]
        );
        let err =
            ClaimRequest::parse("", "w", 1001, Some((901, 0)), None, &limits).expect_err("invalid");
        assert_eq!(fields(err), ["max_messages", "lease_duration"]);
        let err = ClaimRequest::parse("", "w", 1, Some((1, 1_000_000_000)), None, &limits)
            .expect_err("invalid nanos");
        assert_eq!(fields(err), ["lease_duration"]);
    }

    #[test]
    fn long_waits_are_capped_not_refused() {
        let limits = Limits::default();
        let req = ClaimRequest::parse("", "w", 1, None, Some((3600, 0)), &limits).expect("valid");
        assert_eq!(req.wait, limits.max_wait);
    }

    #[test]
    fn lease_bounds_are_inclusive() {
        let limits = Limits::default();
        assert!(ClaimRequest::parse("", "w", 1, Some((1, 0)), None, &limits).is_ok());
        assert!(ClaimRequest::parse("", "w", 1, Some((900, 0)), None, &limits).is_ok());
        assert!(ClaimRequest::parse("", "w", 1, Some((0, 999_999_999)), None, &limits).is_err());
    }

    #[test]
    fn settle_ids_are_checked_one_by_one() {
        let limits = Limits::default();
        let ids = vec![ID.to_owned(), "nope".to_owned()];
        let err = AckRequest::parse("", "bad", &ids, &limits).expect_err("invalid");
        assert_eq!(fields(err), ["lease_id", "message_ids[1]"]);
        let err = AckRequest::parse("", ID, &[], &limits).expect_err("empty ids");
        assert_eq!(fields(err), ["message_ids"]);
        assert!(ExtendRequest::parse("", ID, &[], None, &limits).is_ok());
    }

    #[test]
    fn carried_acks_are_checked_and_named_under_acks() {
        let limits = Limits::default();
        let good = vec![ID.to_owned()];
        let bad = vec!["nope".to_owned()];
        let acks = [(ID, good.as_slice()), ("x", bad.as_slice()), (ID, &[][..])];
        let err =
            AckRequest::parse_carried("orders", acks.into_iter(), &limits).expect_err("invalid");
        assert_eq!(
            fields(err),
            [
                "acks[1].lease_id",
                "acks[1].message_ids[0]",
                "acks[2].message_ids"
            ]
        );
        let ok = AckRequest::parse_carried("orders", [(ID, good.as_slice())].into_iter(), &limits)
            .expect("valid");
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].outbox.as_str(), "orders");
        let many = vec![(ID, good.as_slice()); MAX_CARRIED_ACKS + 1];
        let err = AckRequest::parse_carried("", many.into_iter(), &limits).expect_err("too many");
        assert_eq!(fields(err), ["acks"]);
    }

    #[test]
    fn too_many_ids_are_refused() {
        let limits = Limits {
            max_batch: 2,
            ..Limits::default()
        };
        let ids = vec![ID.to_owned(); 3];
        let err = AckRequest::parse("", ID, &ids, &limits).expect_err("too many");
        assert_eq!(fields(err), ["message_ids"]);
    }

    #[test]
    fn nack_cleans_its_error_and_bounds_retry_after() {
        let limits = Limits::default();
        let ids = vec![ID.to_owned()];
        let req =
            NackRequest::parse("", ID, &ids, "bad\0 thing", None, false, &limits).expect("valid");
        assert_eq!(req.error, "bad thing");
        assert_eq!(req.retry_after, None);
        let long = "x".repeat(MAX_ERROR_CHARS + 10);
        let req =
            NackRequest::parse("", ID, &ids, &long, Some((5, 0)), true, &limits).expect("valid");
        assert_eq!(req.error.chars().count(), MAX_ERROR_CHARS + 1);
        assert_eq!(req.retry_after, Some(Duration::from_secs(5)));
        let err = NackRequest::parse("", ID, &ids, "", Some((8 * 24 * 3600, 0)), false, &limits)
            .expect_err("too long");
        assert_eq!(fields(err), ["retry_after"]);
    }
}
