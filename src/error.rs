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

fn describe(violations: &[FieldViolation]) -> String {
    violations
        .iter()
        .map(|v| format!("{} {}", v.field, v.description))
        .collect::<Vec<_>>()
        .join("; ")
}
