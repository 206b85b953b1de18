//! The service's errors: what a caller did wrong, or what is wrong with storage.
//! `grpc::status` maps them to status codes in one place.

use crate::store::StoreError;

/// An argument the service refuses: which one, under the caller's name for it
/// (`message_ids[3]`), and why. [`Error::InvalidArgument`] carries them.
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

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An event id the outbox does not hold: never written, or deleted since
    /// (retention, or an ack under zero retention).
    #[error("message {0} is not in this outbox")]
    MessageNotFound(String),
    /// ExtendLease without ids on a lease that holds nothing: the batch was
    /// lost to expiry and claimed again (or the id was never a lease), so the
    /// worker should stop publishing it rather than believe it still holds it.
    #[error("lease {0} holds no messages: it expired and was claimed again, or never existed")]
    LeaseHoldsNothing(String),
    /// A long poll refused because `--max-waiting-claims` others wait already:
    /// each holds a connection and memory, so past the bound it is shed.
    #[error(
        "too many claims are waiting already (--max-waiting-claims {0}): retry after a backoff, or claim without waiting"
    )]
    TooManyWaiting(u32),
}

impl From<Vec<FieldViolation>> for Error {
    fn from(violations: Vec<FieldViolation>) -> Self {
        Self::InvalidArgument(violations)
    }
}

/// How many refused fields a refusal names, in its message and in its
/// details; the rest are counted. A request may carry `--max-batch` ids (and
/// a claim more in its carried acks), and a refusal naming each bad one
/// outgrew the 16 KiB of response metadata a gRPC client accepts by default,
/// which then saw RESOURCE_EXHAUSTED instead of the reason. Ten is more than
/// any request has fields of its own, so only a long list is cut short.
pub const MAX_NAMED_VIOLATIONS: usize = 10;

/// One clause per reason: fields refused for the same reason, one after the
/// other, share a clause (`a, b and c must not be set together`), so the
/// message does not repeat itself. Only the first [`MAX_NAMED_VIOLATIONS`]
/// fields are named; the last clause counts those after them refused for the
/// same reason (`message_ids[0], … message_ids[9] and 990 more must be a
/// UUID`), and a last clause any others.
fn describe(violations: &[FieldViolation]) -> String {
    let named = &violations[..violations.len().min(MAX_NAMED_VIOLATIONS)];
    let mut unnamed = &violations[named.len()..];
    let groups: Vec<&[FieldViolation]> = named
        .chunk_by(|a, b| a.description == b.description)
        .collect();
    let mut clauses = Vec::with_capacity(groups.len() + 1);
    for (i, same) in groups.iter().enumerate() {
        let description = same[0].description.as_str();
        let more = if i + 1 == groups.len() {
            let alike = unnamed
                .iter()
                .take_while(|v| v.description == description)
                .count();
            unnamed = &unnamed[alike..];
            alike
        } else {
            0
        };
        let fields: Vec<&str> = same.iter().map(|v| v.field.as_str()).collect();
        let named = match (fields.split_last(), more) {
            (Some(_), 1..) => format!("{} and {more} more", fields.join(", ")),
            (Some((last, rest)), 0) if !rest.is_empty() => {
                format!("{} and {last}", rest.join(", "))
            }
            _ => fields.concat(),
        };
        // "a and b is required" reads wrong: the verb agrees with several.
        clauses.push(match description.strip_prefix("is ") {
            Some(rest) if same.len() + more > 1 => format!("{named} are {rest}"),
            _ => format!("{named} {description}"),
        });
    }
    match unnamed.len() {
        0 => {}
        1 => clauses.push("1 more field is refused".to_owned()),
        n => clauses.push(format!("{n} more fields are refused")),
    }
    clauses.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_refused_for_one_reason_share_one_clause() {
        let v = |field: &str, why: &str| FieldViolation::new(field, why);
        let err = Error::InvalidArgument(vec![
            v("a", "must not be set together"),
            v("b", "must not be set together"),
            v("c", "must not be set together"),
            v("lease_id", "is required"),
            v("x", "must not be set together"),
        ]);
        assert_eq!(
            err.to_string(),
            "invalid request: a, b and c must not be set together; lease_id is required; \
             x must not be set together"
        );
        let both = Error::InvalidArgument(vec![
            v("acks[0].lease_id", "is required"),
            v("acks[1].lease_id", "is required"),
        ]);
        assert_eq!(
            both.to_string(),
            "invalid request: acks[0].lease_id and acks[1].lease_id are required"
        );
    }

    #[test]
    fn a_refusal_names_the_first_few_fields_and_counts_the_rest() {
        let bad_ids = |n: usize| -> Vec<FieldViolation> {
            (0..n)
                .map(|i| FieldViolation::new(format!("message_ids[{i}]"), "must be a UUID"))
                .collect()
        };
        let many = Error::InvalidArgument(bad_ids(1000)).to_string();
        assert_eq!(
            many,
            "invalid request: message_ids[0], message_ids[1], message_ids[2], message_ids[3], \
             message_ids[4], message_ids[5], message_ids[6], message_ids[7], message_ids[8], \
             message_ids[9] and 990 more must be a UUID"
        );
        let eleven = Error::InvalidArgument(bad_ids(11)).to_string();
        assert!(
            eleven.ends_with("message_ids[9] and 1 more must be a UUID"),
            "{eleven}"
        );
        let ten = Error::InvalidArgument(bad_ids(10)).to_string();
        assert!(
            ten.ends_with("message_ids[8] and message_ids[9] must be a UUID"),
            "{ten}"
        );

        let mut mixed = vec![FieldViolation::new("lease_id", "is required")];
        mixed.extend(bad_ids(3));
        mixed.extend(
            (0..8).map(|i| FieldViolation::new(format!("acks[{i}].lease_id"), "is required")),
        );
        mixed.extend(bad_ids(2));
        assert_eq!(
            Error::InvalidArgument(mixed).to_string(),
            "invalid request: lease_id is required; message_ids[0], message_ids[1] and \
             message_ids[2] must be a UUID; acks[0].lease_id, acks[1].lease_id, \
             acks[2].lease_id, acks[3].lease_id, acks[4].lease_id, acks[5].lease_id and 2 more \
             are required; 2 more fields are refused"
        );
    }
}
