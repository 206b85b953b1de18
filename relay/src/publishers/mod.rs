//! The publish side of the relay, behind two traits so the worker loop knows
//! no broker: a [`Broker`] (the process's connection, shared by every slot)
//! hands each in-flight slot its own [`Publisher`].
//!
//! A new broker is a module beside `rabbitmq/` implementing both traits, a
//! variant of [`crate::config::BrokerConfig`] with its flags, and its arm in
//! [`crate::run`]; the conformance suite (`conformance.rs`) then runs against
//! it unchanged.

#[cfg(test)]
pub(crate) mod conformance;
pub mod rabbitmq;

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

/// The process's link to one broker, shared by every slot: one connection,
/// reconnected on demand, and the place a slot's publisher comes from.
pub trait Broker: Send + Sync + 'static {
    type Publisher: Publisher;

    /// Where messages go (RabbitMQ: the exchange), for logs and metrics.
    fn destination(&self) -> &str;

    /// A publisher for one slot.
    fn publisher(&self) -> Self::Publisher;
}

/// One in-flight slot's publisher. Each slot owns one, so a broker channel error
/// in one batch cannot fail another slot's batch. `Sync` because the slot's
/// task, which may move between threads, borrows its worker across awaits.
pub trait Publisher: Send + Sync + 'static {
    /// Resolves when messages can be published now, connecting if needed; an
    /// error means "not now" and the caller backs off before claiming anything.
    fn ready(&mut self) -> impl Future<Output = Result<(), String>> + Send;

    /// Publishes a batch with confirms, pipelined: every message is sent before
    /// any confirm is awaited. One delivery per message, in order.
    fn publish(&mut self, batch: &[OutboxMessage]) -> impl Future<Output = Vec<Delivery>> + Send;
}
