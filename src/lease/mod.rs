//! The lease rules, free of tonic and sqlx: identifiers, request limits, the
//! validated requests, the retry backoff, and how a settle attempt on one row
//! turns into an outcome.
//!
//! `grpc` parses wire requests into these types and `store` executes them, so the
//! rules are decided here once and unit-tested without a database.

mod admin;
mod batch;
mod ids;
mod limits;
mod outcome;
mod request;

pub use crate::backoff::BackoffPolicy;
pub use admin::{
    BlockedKey, BlockedKeysRequest, DEFAULT_PAGE_SIZE, DeadLetter, DeadLettersRequest,
    DiscardRequest, InspectRequest, InspectedMessage, MAX_AGGREGATE_ID_BYTES, MAX_PAGE_SIZE,
    MessageState, Page, PageRequest, RedriveRequest, RedriveSelector,
};
pub use batch::{ClaimedBatch, ClaimedMessage, EndedLease, Settled, Stats};
pub use ids::{LeaseId, MessageId, OutboxName, WorkerId};
pub use limits::{
    ClaimBudget, DEFAULT_MAX_CLAIM_BYTES, DEFAULT_MAX_MESSAGE_BYTES, Limits, MAX_CARRIED_ACKS,
    MAX_ERROR_CHARS, MAX_RETRY_AFTER, MIN_RESPONSE_BYTES,
};
pub use outcome::{MessageResult, Outcome, RowState, Settle};
pub use request::{
    AckRequest, ClaimRequest, ExtendRequest, NackRequest, StatsRequest, clean_error,
};
