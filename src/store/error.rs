//! Storage failures, in the terms the API cares about; each backend sorts its
//! own errors into them (PostgreSQL's by SQLSTATE, in `postgres::error`).

/// What went wrong in storage, in the terms the API cares about.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("unknown outbox {0:?}")]
    UnknownOutbox(String),
    /// The database cannot be reached or refuses work for now; retrying later may succeed.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A table does not have the shape outboxd needs (and may not be changed).
    #[error("{0}")]
    Schema(String),
    /// The database refuses outboxd for good: a wrong role or password, a
    /// database or schema that does not exist, a missing privilege. Retrying
    /// cannot help until an operator acts, so start-up fails at once.
    #[error("{0}")]
    Refused(String),
    #[error("database error: {0}")]
    Internal(String),
}
