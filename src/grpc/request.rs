//! Wire requests to the service's requests (parse, don't validate). Every bad
//! field is reported, each under its wire name (`message_ids[3]`,
//! `acks[0].lease_id`), so a client fixes them all in one round trip (the
//! refusal names the first ten and counts the rest: see
//! `error::MAX_NAMED_VIOLATIONS`).
//!
//! One conversion per request. Those that are checked take the server's
//! [`Limits`] (defaults, bounds, caps), which `TryFrom` has no room for, hence
//! [`Parse`]; GetStats cannot fail and needs no limits, so it is a `From`.

use std::time::Duration;

use tonic::metadata::MetadataMap;

use super::pb;
use crate::{
    FieldViolation,
    lease::{
        AckRequest, BlockedKeysRequest, ClaimRequest, DEFAULT_PAGE_SIZE, DeadLettersRequest,
        DiscardRequest, ExtendRequest, InspectRequest, LeaseId, Limits, MAX_AGGREGATE_ID_BYTES,
        MAX_CARRIED_ACKS, MAX_PAGE_SIZE, MIN_RESPONSE_BYTES, MessageId, NackRequest, OutboxName,
        PageRequest, RedriveRequest, RedriveSelector, StatsRequest, WorkerId, clean_error,
    },
};

/// Time kept back from a caller's deadline so a long poll's answer still arrives.
const DEADLINE_MARGIN: Duration = Duration::from_millis(200);

/// A wire request checked against the server's limits into the service's request.
pub trait Parse {
    type Request;
    fn parse(&self, limits: &Limits) -> Result<Self::Request, Vec<FieldViolation>>;
}

impl Parse for pb::ClaimBatchRequest {
    type Request = ClaimRequest;

    fn parse(&self, limits: &Limits) -> Result<ClaimRequest, Vec<FieldViolation>> {
        let outbox = OutboxName::from_wire(&self.outbox);
        let mut check = Check::default();
        let worker_id = check.field("worker_id", WorkerId::parse(&self.worker_id));
        let max = limits.max_batch;
        let max_messages = if (1..=max).contains(&self.max_messages) {
            Some(self.max_messages)
        } else {
            check.refuse("max_messages", format!("must be between 1 and {max}"));
            None
        };
        let lease = check.lease("lease_duration", self.lease_duration, limits);
        let wait = check
            .duration("wait", self.wait)
            .map(|w| w.unwrap_or_default().min(limits.max_wait));
        if self.max_response_bytes != 0 && self.max_response_bytes < MIN_RESPONSE_BYTES {
            check.refuse(
                "max_response_bytes",
                format!("must be 0 (the server's limits) or at least {MIN_RESPONSE_BYTES}"),
            );
        }
        // After the claim's own fields: every bad field at once, the claim's first.
        let acks = check.carried(&outbox, &self.acks, limits);
        let carried_ids = acks.iter().map(|a| a.message_ids.len()).sum();
        check.finish(|| {
            let max_messages = max_messages?;
            let budget = limits.claim_budget(self.max_response_bytes, max_messages, carried_ids);
            Some(ClaimRequest {
                outbox,
                worker_id: worker_id?,
                max_messages,
                lease: lease?,
                wait: wait?,
                max_bytes: budget.batch_bytes,
                max_event_bytes: budget.event_bytes,
                max_message_bytes: limits.max_message_bytes,
                acks,
            })
        })
    }
}

impl Parse for pb::AckRequest {
    type Request = AckRequest;

    fn parse(&self, limits: &Limits) -> Result<AckRequest, Vec<FieldViolation>> {
        let outbox = OutboxName::from_wire(&self.outbox);
        let mut check = Check::default();
        let ack = check.ack(outbox, &self.lease_id, &self.message_ids, limits);
        check.finish(|| ack)
    }
}

impl Parse for pb::NackRequest {
    type Request = NackRequest;

    fn parse(&self, limits: &Limits) -> Result<NackRequest, Vec<FieldViolation>> {
        let mut check = Check::default();
        let (lease_id, message_ids) = check.settle(&self.lease_id, &self.message_ids, true, limits);
        let retry_after = match check.duration("retry_after", self.retry_after) {
            Some(Some(d)) if d > limits.max_retry_after => {
                let why = format!(
                    "must be at most {}",
                    humantime::format_duration(limits.max_retry_after)
                );
                check.refuse("retry_after", why);
                None
            }
            other => other,
        };
        check.finish(|| {
            Some(NackRequest {
                outbox: OutboxName::from_wire(&self.outbox),
                lease_id: lease_id?,
                message_ids,
                error: clean_error(&self.error),
                retry_after: retry_after?,
                dead_letter: self.dead_letter,
            })
        })
    }
}

impl Parse for pb::ExtendLeaseRequest {
    type Request = ExtendRequest;

    fn parse(&self, limits: &Limits) -> Result<ExtendRequest, Vec<FieldViolation>> {
        let mut check = Check::default();
        let (lease_id, message_ids) =
            check.settle(&self.lease_id, &self.message_ids, false, limits);
        let lease = check.lease("lease_duration", self.lease_duration, limits);
        check.finish(|| {
            Some(ExtendRequest {
                outbox: OutboxName::from_wire(&self.outbox),
                lease_id: lease_id?,
                message_ids,
                lease: lease?,
            })
        })
    }
}

impl Parse for pb::ListDeadLettersRequest {
    type Request = DeadLettersRequest;

    fn parse(&self, _: &Limits) -> Result<DeadLettersRequest, Vec<FieldViolation>> {
        let mut check = Check::default();
        let page = check.page(self.page_size, &self.page_token);
        let aggregate_id = check.aggregate(&self.aggregate_id);
        check.finish(|| {
            Some(DeadLettersRequest {
                outbox: OutboxName::from_wire(&self.outbox),
                aggregate_id: aggregate_id?,
                page: page?,
            })
        })
    }
}

impl Parse for pb::ListBlockedKeysRequest {
    type Request = BlockedKeysRequest;

    fn parse(&self, _: &Limits) -> Result<BlockedKeysRequest, Vec<FieldViolation>> {
        let mut check = Check::default();
        let page = check.page(self.page_size, &self.page_token);
        check.finish(|| {
            Some(BlockedKeysRequest {
                outbox: OutboxName::from_wire(&self.outbox),
                page: page?,
            })
        })
    }
}

impl Parse for pb::RedriveRequest {
    type Request = RedriveRequest;

    /// Exactly one selector; with more than one, each one set is named (in
    /// one sentence: the violations share their description).
    fn parse(&self, limits: &Limits) -> Result<RedriveRequest, Vec<FieldViolation>> {
        const NONE: &str =
            "is empty, as is aggregate_id, and all is false: a redrive takes exactly one selector";
        const SEVERAL: &str = "must not be set together: a redrive takes exactly one selector";
        let mut check = Check::default();
        let set: Vec<&str> = [
            ("message_ids", !self.message_ids.is_empty()),
            ("aggregate_id", !self.aggregate_id.is_empty()),
            ("all", self.all),
        ]
        .into_iter()
        .filter_map(|(name, set)| set.then_some(name))
        .collect();
        let selector = match set.as_slice() {
            [] => {
                check.refuse("message_ids", NONE);
                None
            }
            ["message_ids"] => Some(RedriveSelector::Ids(check.ids(
                &self.message_ids,
                true,
                limits,
            ))),
            ["aggregate_id"] => check
                .aggregate(&self.aggregate_id)
                .flatten()
                .map(RedriveSelector::Aggregate),
            ["all"] => Some(RedriveSelector::All),
            several => {
                for name in several {
                    check.refuse(name, SEVERAL);
                }
                None
            }
        };
        check.finish(|| {
            Some(RedriveRequest {
                outbox: OutboxName::from_wire(&self.outbox),
                selector: selector?,
            })
        })
    }
}

impl Parse for pb::DiscardRequest {
    type Request = DiscardRequest;

    fn parse(&self, limits: &Limits) -> Result<DiscardRequest, Vec<FieldViolation>> {
        let mut check = Check::default();
        let message_ids = check.ids(&self.message_ids, true, limits);
        check.finish(|| {
            Some(DiscardRequest {
                outbox: OutboxName::from_wire(&self.outbox),
                message_ids,
            })
        })
    }
}

impl Parse for pb::InspectMessageRequest {
    type Request = InspectRequest;

    fn parse(&self, _: &Limits) -> Result<InspectRequest, Vec<FieldViolation>> {
        let mut check = Check::default();
        let message_id = check.field("message_id", MessageId::parse(&self.message_id));
        check.finish(|| {
            Some(InspectRequest {
                outbox: OutboxName::from_wire(&self.outbox),
                message_id: message_id?,
            })
        })
    }
}

/// The position a list response hands out as `next_page_token`: opaque to
/// clients, versioned so its form can change.
pub fn page_token(after: i64) -> String {
    format!("{PAGE_TOKEN_PREFIX}{after}")
}

const PAGE_TOKEN_PREFIX: &str = "p1.";

impl From<&pb::GetStatsRequest> for StatsRequest {
    fn from(req: &pb::GetStatsRequest) -> Self {
        Self {
            outbox: OutboxName::from_wire(&req.outbox),
        }
    }
}

/// A ClaimBatch's wait, shortened to end in time for its answer to reach a
/// caller that sent a deadline.
pub fn within_deadline(wait: Duration, metadata: &MetadataMap) -> Duration {
    match client_deadline(metadata) {
        Some(budget) => wait.min(budget.saturating_sub(DEADLINE_MARGIN)),
        None => wait,
    }
}

/// The caller's deadline from `grpc-timeout` (`<digits><unit>`, unit one of
/// H M S m u n).
fn client_deadline(metadata: &MetadataMap) -> Option<Duration> {
    let raw = metadata.get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = raw.split_at(raw.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// Collects violations while fields are parsed one by one.
#[derive(Default)]
struct Check(Vec<FieldViolation>);

impl Check {
    fn refuse(&mut self, name: &str, why: impl Into<String>) {
        self.0.push(FieldViolation::new(name, why));
    }

    fn field<T>(&mut self, name: &str, parsed: Result<T, &str>) -> Option<T> {
        parsed.map_err(|why| self.refuse(name, why)).ok()
    }

    /// An optional `google.protobuf.Duration`: `Some(None)` when unset.
    fn duration(
        &mut self,
        name: &str,
        raw: Option<prost_types::Duration>,
    ) -> Option<Option<Duration>> {
        let Some(raw) = raw else {
            return Some(None);
        };
        // Checked before prost-types converts: it would carry out-of-range
        // nanos into the seconds (the proto allows only 0..1e9 for a positive
        // duration), and its error for a negative one overflows (a panic in
        // debug builds) at `i64::MIN` seconds.
        let valid = raw.seconds >= 0 && (0..1_000_000_000).contains(&raw.nanos);
        let parsed = valid.then(|| Duration::try_from(raw).ok()).flatten();
        self.field(
            name,
            parsed.map(Some).ok_or("must be a non-negative duration"),
        )
    }

    fn lease(
        &mut self,
        name: &str,
        raw: Option<prost_types::Duration>,
        limits: &Limits,
    ) -> Option<Duration> {
        let lease = self.duration(name, raw)?.unwrap_or(limits.default_lease);
        if !(limits.min_lease..=limits.max_lease).contains(&lease) {
            let why = format!(
                "must be between {} and {}",
                humantime::format_duration(limits.min_lease),
                humantime::format_duration(limits.max_lease)
            );
            self.refuse(name, why);
            return None;
        }
        Some(lease)
    }

    fn ids(&mut self, raw: &[String], required: bool, limits: &Limits) -> Vec<MessageId> {
        if required && raw.is_empty() {
            self.refuse("message_ids", "at least one id is required");
        }
        if raw.len() > limits.max_batch as usize {
            let why = format!("at most {} ids per call", limits.max_batch);
            self.refuse("message_ids", why);
            return Vec::new();
        }
        raw.iter()
            .enumerate()
            .filter_map(|(i, id)| self.field(&format!("message_ids[{i}]"), MessageId::parse(id)))
            .collect()
    }

    /// The lease and ids a settle call names (Ack, Nack, ExtendLease); ids are
    /// `required` but for ExtendLease, where none means all.
    fn settle(
        &mut self,
        lease_id: &str,
        message_ids: &[String],
        required: bool,
        limits: &Limits,
    ) -> (Option<LeaseId>, Vec<MessageId>) {
        let lease_id = self.field("lease_id", LeaseId::parse(lease_id));
        (lease_id, self.ids(message_ids, required, limits))
    }

    /// An Ack's fields, as an Ack and as the acks a ClaimBatch carries.
    fn ack(
        &mut self,
        outbox: OutboxName,
        lease_id: &str,
        message_ids: &[String],
        limits: &Limits,
    ) -> Option<AckRequest> {
        let (lease_id, message_ids) = self.settle(lease_id, message_ids, true, limits);
        Some(AckRequest {
            outbox,
            lease_id: lease_id?,
            message_ids,
        })
    }

    /// The acks a ClaimBatch carries, each checked as an Ack is, its
    /// violations named under `acks[i]` (`acks[0].lease_id`).
    fn carried(
        &mut self,
        outbox: &OutboxName,
        acks: &[pb::LeaseAck],
        limits: &Limits,
    ) -> Vec<AckRequest> {
        if acks.len() > MAX_CARRIED_ACKS {
            self.refuse(
                "acks",
                format!("at most {MAX_CARRIED_ACKS} leases per call"),
            );
            return Vec::new();
        }
        let mut parsed = Vec::with_capacity(acks.len());
        for (i, ack) in acks.iter().enumerate() {
            let mut one = Check::default();
            parsed.extend(one.ack(outbox.clone(), &ack.lease_id, &ack.message_ids, limits));
            self.0.extend(one.0.into_iter().map(|v| FieldViolation {
                field: format!("acks[{i}].{}", v.field),
                description: v.description,
            }));
        }
        parsed
    }

    /// A list call's page: its size (0 = the default) and where it starts.
    fn page(&mut self, size: u32, token: &str) -> Option<PageRequest> {
        let size = match size {
            0 => Some(DEFAULT_PAGE_SIZE),
            1..=MAX_PAGE_SIZE => Some(size),
            _ => {
                self.refuse("page_size", format!("must be at most {MAX_PAGE_SIZE}"));
                None
            }
        };
        let after = if token.is_empty() {
            Some(None)
        } else {
            let parsed = token
                .strip_prefix(PAGE_TOKEN_PREFIX)
                .and_then(|seq| seq.parse::<i64>().ok());
            self.field(
                "page_token",
                parsed
                    .map(Some)
                    .ok_or("not a page token this server handed out"),
            )
        };
        Some(PageRequest {
            size: size?,
            after: after?,
        })
    }

    /// An optional aggregate id: `Some(None)` when empty.
    fn aggregate(&mut self, raw: &str) -> Option<Option<String>> {
        if raw.len() > MAX_AGGREGATE_ID_BYTES {
            self.refuse(
                "aggregate_id",
                format!("must be at most {MAX_AGGREGATE_ID_BYTES} bytes"),
            );
            return None;
        }
        Some((!raw.is_empty()).then(|| raw.to_owned()))
    }

    fn finish<T>(self, build: impl FnOnce() -> Option<T>) -> Result<T, Vec<FieldViolation>> {
        match (self.0.is_empty(), build()) {
            (true, Some(request)) => Ok(request),
            _ => Err(self.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::default_limits;
    use crate::lease::MAX_ERROR_CHARS;

    const ID: &str = "6f1c2b0e-8a4b-4c3e-9d1f-0a2b3c4d5e6f";

    fn fields(violations: Vec<FieldViolation>) -> Vec<String> {
        violations.into_iter().map(|v| v.field).collect()
    }

    fn secs(seconds: i64, nanos: i32) -> Option<prost_types::Duration> {
        Some(prost_types::Duration { seconds, nanos })
    }

    fn claim(worker_id: &str, max_messages: u32) -> pb::ClaimBatchRequest {
        pb::ClaimBatchRequest {
            worker_id: worker_id.to_owned(),
            max_messages,
            ..Default::default()
        }
    }

    fn ack(lease_id: &str, ids: &[&str]) -> pb::AckRequest {
        pb::AckRequest {
            lease_id: lease_id.to_owned(),
            message_ids: ids.iter().map(|id| (*id).to_owned()).collect(),
            ..Default::default()
        }
    }

    fn nack(error: &str, retry_after: Option<prost_types::Duration>) -> pb::NackRequest {
        pb::NackRequest {
            lease_id: ID.to_owned(),
            message_ids: vec![ID.to_owned()],
            error: error.to_owned(),
            retry_after,
            ..Default::default()
        }
    }

    fn lease_ack(lease_id: &str, ids: &[&str]) -> pb::LeaseAck {
        let ack = ack(lease_id, ids);
        pb::LeaseAck {
            lease_id: ack.lease_id,
            message_ids: ack.message_ids,
        }
    }

    #[test]
    fn claim_defaults_apply_when_unset() {
        let limits = default_limits();
        let req = claim("w1", 10).parse(&limits).expect("valid");
        assert_eq!(req.outbox.as_str(), "default");
        assert_eq!(req.lease, limits.default_lease);
        assert_eq!(req.wait, Duration::ZERO);
        assert_eq!(req.max_bytes, limits.max_claim_bytes);
        assert!(req.acks.is_empty());
    }

    #[test]
    fn claim_reports_every_bad_field() {
        let limits = default_limits();
        let bad = pb::ClaimBatchRequest {
            lease_duration: secs(0, 5),
            wait: secs(-1, 0),
            ..claim("", 0)
        };
        assert_eq!(
            fields(bad.parse(&limits).expect_err("invalid")),
            ["worker_id", "max_messages", "lease_duration", "wait"]
        );
        let bad = pb::ClaimBatchRequest {
            lease_duration: secs(901, 0),
            ..claim("w", 1001)
        };
        assert_eq!(
            fields(bad.parse(&limits).expect_err("invalid")),
            ["max_messages", "lease_duration"]
        );
        let bad = pb::ClaimBatchRequest {
            lease_duration: secs(1, 1_000_000_000),
            ..claim("w", 1)
        };
        assert_eq!(
            fields(bad.parse(&limits).expect_err("invalid nanos")),
            ["lease_duration"]
        );
    }

    #[test]
    fn durations_prost_would_normalise_are_still_refused() {
        let limits = default_limits();
        // (2, -5) and (0, 2e9) normalise to valid durations; the wire refuses
        // them. prost-types panics on i64::MIN seconds: never reached.
        for raw in [
            secs(2, -5),
            secs(0, 2_000_000_000),
            secs(-1, 5),
            secs(i64::MIN, 0),
        ] {
            let bad = pb::ClaimBatchRequest {
                wait: raw,
                ..claim("w", 1)
            };
            let err = bad.parse(&limits).expect_err("refused");
            assert_eq!(
                err,
                [FieldViolation::new(
                    "wait",
                    "must be a non-negative duration"
                )]
            );
        }
        let ok = pb::ClaimBatchRequest {
            wait: secs(1, 999_999_999),
            ..claim("w", 1)
        };
        let wait = ok.parse(&limits).expect("valid").wait;
        assert_eq!(wait, Duration::new(1, 999_999_999));
    }

    #[test]
    fn long_waits_are_capped_not_refused() {
        let limits = default_limits();
        let req = pb::ClaimBatchRequest {
            wait: secs(3600, 0),
            ..claim("w", 1)
        };
        assert_eq!(req.parse(&limits).expect("valid").wait, limits.max_wait);
    }

    #[test]
    fn lease_bounds_are_inclusive() {
        let limits = default_limits();
        let with_lease = |seconds, nanos| pb::ClaimBatchRequest {
            lease_duration: secs(seconds, nanos),
            ..claim("w", 1)
        };
        assert!(with_lease(1, 0).parse(&limits).is_ok());
        assert!(with_lease(900, 0).parse(&limits).is_ok());
        let err = with_lease(0, 999_999_999)
            .parse(&limits)
            .expect_err("short");
        assert_eq!(err[0].description, "must be between 1s and 15m");
    }

    #[test]
    fn settle_ids_are_checked_one_by_one() {
        let limits = default_limits();
        let err = ack("bad", &[ID, "nope"])
            .parse(&limits)
            .expect_err("invalid");
        assert_eq!(fields(err), ["lease_id", "message_ids[1]"]);
        let err = ack(ID, &[]).parse(&limits).expect_err("empty ids");
        assert_eq!(fields(err), ["message_ids"]);
        let extend = pb::ExtendLeaseRequest {
            lease_id: ID.to_owned(),
            ..Default::default()
        };
        assert!(extend.parse(&limits).is_ok());
    }

    #[test]
    fn carried_acks_are_checked_and_named_under_acks() {
        let limits = default_limits();
        let bad = pb::ClaimBatchRequest {
            acks: vec![
                lease_ack(ID, &[ID]),
                lease_ack("x", &["nope"]),
                lease_ack(ID, &[]),
            ],
            ..claim("", 1)
        };
        assert_eq!(
            fields(bad.parse(&limits).expect_err("invalid")),
            [
                "worker_id",
                "acks[1].lease_id",
                "acks[1].message_ids[0]",
                "acks[2].message_ids"
            ]
        );
        let good = pb::ClaimBatchRequest {
            outbox: "orders".to_owned(),
            acks: vec![lease_ack(ID, &[ID])],
            ..claim("w", 1)
        };
        let acks = good.parse(&limits).expect("valid").acks;
        assert_eq!(acks.len(), 1);
        assert_eq!(acks[0].outbox.as_str(), "orders");
        let many = pb::ClaimBatchRequest {
            acks: vec![lease_ack(ID, &[ID]); MAX_CARRIED_ACKS + 1],
            ..claim("w", 1)
        };
        assert_eq!(fields(many.parse(&limits).expect_err("too many")), ["acks"]);
    }

    #[test]
    fn too_many_ids_are_refused() {
        let limits = Limits {
            max_batch: 2,
            ..default_limits()
        };
        let err = ack(ID, &[ID; 3]).parse(&limits).expect_err("too many");
        assert_eq!(fields(err), ["message_ids"]);
    }

    #[test]
    fn nack_cleans_its_error_and_bounds_retry_after() {
        let limits = default_limits();
        let req = nack("bad\0 thing", None).parse(&limits).expect("valid");
        assert_eq!(req.error, "bad thing");
        assert_eq!(req.retry_after, None);
        let long = "x".repeat(MAX_ERROR_CHARS + 10);
        let req = pb::NackRequest {
            dead_letter: true,
            ..nack(&long, secs(5, 0))
        };
        let req = req.parse(&limits).expect("valid");
        assert_eq!(req.error.chars().count(), MAX_ERROR_CHARS + 1);
        assert_eq!(req.retry_after, Some(Duration::from_secs(5)));
        assert!(req.dead_letter);
        let err = nack("", secs(8 * 24 * 3600, 0))
            .parse(&limits)
            .expect_err("too long");
        assert_eq!(fields(err), ["retry_after"]);
    }

    #[test]
    fn stats_names_the_default_outbox_when_unset() {
        let req = StatsRequest::from(&pb::GetStatsRequest::default());
        assert_eq!(req.outbox.as_str(), "default");
    }

    #[test]
    fn grpc_timeout_header_parses() {
        let mut md = MetadataMap::new();
        assert_eq!(client_deadline(&md), None);
        md.insert("grpc-timeout", "1500m".parse().expect("ascii"));
        assert_eq!(client_deadline(&md), Some(Duration::from_millis(1500)));
        md.insert("grpc-timeout", "2S".parse().expect("ascii"));
        assert_eq!(client_deadline(&md), Some(Duration::from_secs(2)));
        md.insert("grpc-timeout", "x".parse().expect("ascii"));
        assert_eq!(client_deadline(&md), None);
    }

    #[test]
    fn long_polls_end_before_the_callers_deadline() {
        let mut md = MetadataMap::new();
        let wait = Duration::from_secs(20);
        assert_eq!(within_deadline(wait, &md), wait);
        md.insert("grpc-timeout", "5S".parse().expect("ascii"));
        assert_eq!(within_deadline(wait, &md), Duration::from_millis(4800));
        md.insert("grpc-timeout", "100m".parse().expect("ascii"));
        assert_eq!(within_deadline(wait, &md), Duration::ZERO);
    }

    #[test]
    fn redrive_takes_exactly_one_selector_and_names_each_conflict() {
        let limits = default_limits();
        let none = pb::RedriveRequest::default();
        assert_eq!(
            fields(none.parse(&limits).expect_err("none")),
            ["message_ids"]
        );
        let three = pb::RedriveRequest {
            message_ids: vec![ID.into()],
            aggregate_id: "a".into(),
            all: true,
            ..Default::default()
        };
        assert_eq!(
            fields(three.parse(&limits).expect_err("three")),
            ["message_ids", "aggregate_id", "all"]
        );
        // One sentence each, never the same reason once per field.
        let said = |request: &pb::RedriveRequest| {
            crate::Error::from(request.parse(&limits).expect_err("refused")).to_string()
        };
        assert_eq!(
            said(&three),
            "invalid request: message_ids, aggregate_id and all must not be set together: \
             a redrive takes exactly one selector"
        );
        assert_eq!(
            said(&none),
            "invalid request: message_ids is empty, as is aggregate_id, and all is false: \
             a redrive takes exactly one selector"
        );
        let bad_id = pb::RedriveRequest {
            message_ids: vec![ID.into(), "nope".into()],
            ..Default::default()
        };
        assert_eq!(
            fields(bad_id.parse(&limits).expect_err("bad id")),
            ["message_ids[1]"]
        );
        let all = pb::RedriveRequest {
            all: true,
            ..Default::default()
        };
        assert_eq!(
            all.parse(&limits).expect("all").selector,
            RedriveSelector::All
        );
        let aggregate = pb::RedriveRequest {
            aggregate_id: "order-7".into(),
            ..Default::default()
        };
        assert_eq!(
            aggregate.parse(&limits).expect("aggregate").selector,
            RedriveSelector::Aggregate("order-7".into())
        );
    }

    #[test]
    fn pages_have_bounds_and_tokens_round_trip() {
        let limits = default_limits();
        let first = pb::ListDeadLettersRequest::default()
            .parse(&limits)
            .expect("defaults");
        assert_eq!(
            first.page,
            PageRequest {
                size: DEFAULT_PAGE_SIZE,
                after: None
            }
        );
        let next = pb::ListBlockedKeysRequest {
            page_size: MAX_PAGE_SIZE,
            page_token: page_token(-42),
            ..Default::default()
        }
        .parse(&limits)
        .expect("a token we made");
        assert_eq!(next.page.after, Some(-42));
        let bad = pb::ListDeadLettersRequest {
            page_size: MAX_PAGE_SIZE + 1,
            page_token: "42".into(),
            aggregate_id: "x".repeat(MAX_AGGREGATE_ID_BYTES + 1),
            ..Default::default()
        };
        assert_eq!(
            fields(bad.parse(&limits).expect_err("bad")),
            ["page_size", "page_token", "aggregate_id"]
        );
        let discard = pb::DiscardRequest::default();
        assert_eq!(
            fields(discard.parse(&limits).expect_err("empty")),
            ["message_ids"]
        );
    }
}
