//! The service's errors: what a caller did wrong, or what is wrong with storage.
//! `grpc::status` maps them to status codes in one place.

use crate::{lease::FieldViolation, store::StoreError};

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid request: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    #[error(transparent)]
    Store(#[from] StoreError),
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
