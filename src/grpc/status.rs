//! The one mapping from service errors to gRPC status codes.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::{Error, error::MAX_NAMED_VIOLATIONS, store::StoreError};

/// How much of an unknown outbox name a NOT_FOUND message repeats.
const MAX_ECHOED_CHARS: usize = 64;

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let message = err.to_string();
        match err {
            Error::InvalidArgument(violations) => {
                // Bounded like the message (see MAX_NAMED_VIOLATIONS): the
                // first few, then one entry for the request as a whole
                // (an empty field) that counts the rest.
                let mut details = ErrorDetails::new();
                for v in violations.iter().take(MAX_NAMED_VIOLATIONS) {
                    details.add_bad_request_violation(v.field.clone(), v.description.clone());
                }
                if let Some(unnamed @ 1..) = violations.len().checked_sub(MAX_NAMED_VIOLATIONS) {
                    details.add_bad_request_violation(
                        "",
                        format!("{unnamed} more refused fields are not listed"),
                    );
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FieldViolation;

    #[test]
    fn a_refusal_of_a_thousand_ids_stays_small() {
        let violations = (0..1000)
            .map(|i| FieldViolation::new(format!("message_ids[{i}]"), "must be a UUID"))
            .collect();
        let status = Status::from(Error::InvalidArgument(violations));
        assert_eq!(status.code(), Code::InvalidArgument);
        assert!(status.message().len() < 300, "{}", status.message());
        assert!(
            status.details().len() < 1024,
            "{} bytes",
            status.details().len()
        );
        let listed = status
            .get_details_bad_request()
            .expect("bad request details");
        let fields: Vec<String> = listed
            .field_violations
            .iter()
            .map(|v| v.field.clone())
            .collect();
        let expected: Vec<String> = (0..10)
            .map(|i| format!("message_ids[{i}]"))
            .chain([String::new()])
            .collect();
        assert_eq!(fields, expected);
        assert_eq!(
            listed.field_violations[10].description,
            "990 more refused fields are not listed"
        );
    }
}
