//! The publish side of the relay, behind a trait so the worker loop can be
//! driven without a broker.

use std::future::Future;

use outboxd::pb::OutboxMessage;

/// What became of one published message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The broker confirmed it: safe to ack.
    Confirmed,
    /// The broker refused it (nack, or returned as unroutable): nack with the
    /// reason, and let the outbox's backoff and max attempts decide.
    Rejected(String),
    /// It may not have reached the broker (connection lost, confirm timed out):
    /// release it for a prompt retry.
    Failed(String),
}

/// One in-flight slot's publisher. Each slot owns one, so a broker channel error
/// in one batch cannot fail another slot's batch.
pub trait Publisher: Send + 'static {
    /// Resolves when messages can be published now, connecting if needed; an
    /// error means "not now" and the caller backs off before claiming anything.
    fn ready(&mut self) -> impl Future<Output = Result<(), String>> + Send;

    /// Publishes a batch with confirms, pipelined: every message is sent before
    /// any confirm is awaited. One delivery per message, in order.
    fn publish(&mut self, batch: &[OutboxMessage]) -> impl Future<Output = Vec<Delivery>> + Send;
}
