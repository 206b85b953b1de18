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

/// One clause per reason: fields refused for the same reason, one after the
/// other, share a clause (`a, b and c must not be set together`), so the
/// message does not repeat itself.
fn describe(violations: &[FieldViolation]) -> String {
    violations
        .chunk_by(|a, b| a.description == b.description)
        .map(|same| {
            let fields: Vec<&str> = same.iter().map(|v| v.field.as_str()).collect();
            let named = match fields.split_last() {
                Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
                _ => fields.concat(),
            };
            let description = same[0].description.as_str();
            // "a and b is required" reads wrong: the verb agrees with several.
            match description.strip_prefix("is ") {
                Some(rest) if same.len() > 1 => format!("{named} are {rest}"),
                _ => format!("{named} {description}"),
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
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
}
