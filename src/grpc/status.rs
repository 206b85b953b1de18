//! The one mapping from service errors to gRPC status codes.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{Error, store::StoreError};

/// How much of an unknown outbox name a NOT_FOUND message repeats.
const MAX_ECHOED_CHARS: usize = 64;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        match err {
            Error::InvalidArgument(violations) => {
                let mut details = ErrorDetails::new();
                for v in &violations {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                Status::with_error_details(Code::InvalidArgument, message, details)
            }
            Error::TooManyWaiting(_) => Status::resource_exhausted(message),
            Error::MessageNotFound(_) => Status::not_found(message),
            Error::LeaseHoldsNothing(_) => Status::failed_precondition(message),
            Error::Store(StoreError::UnknownOutbox(name)) => {
                // The name is the client's: echo a bounded part of it, so an
                // absurd one cannot make the reply itself too large.
                let shown: String = name.chars().take(MAX_ECHOED_CHARS).collect();
                let more = if shown.len() < name.len() { "…" } else { "" };
                Status::not_found(format!(
                    "outbox {shown:?}{more} is not configured on this server"
                ))
            }
            Error::Store(StoreError::Unavailable(cause)) => {
                tracing::warn!(error = %cause, "storage unavailable");
                Status::unavailable("database unavailable; retry with backoff")
            }
            Error::Store(StoreError::Refused(cause)) => {
                // A rotated password or a revoked grant: the operator's to
                // fix, and the hint is for them, not for the client.
                tracing::error!(error = %cause, "the database refuses outboxd");
                Status::unavailable("database unavailable; retry with backoff")
            }
            Error::Store(err @ StoreError::Schema(_)) => {
                tracing::error!(error = %err, "outbox table is not usable");
                Status::failed_precondition(err.to_string())
            }
            Error::Store(StoreError::Internal(cause)) => {
                tracing::error!(error = %cause, "storage error");
                Status::internal("internal storage error")
            }
        }
    }
}
