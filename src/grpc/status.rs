//! The one mapping from service errors to gRPC status codes.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{Error, store::StoreError};

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
            Error::Store(StoreError::UnknownOutbox(name)) => {
                Status::not_found(format!("outbox {name:?} is not configured on this server"))
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
