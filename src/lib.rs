//! outboxd: outbox-as-a-service.
//!
//! Applications INSERT events into an outbox table in the same transaction as
//! their state change. outboxd hands out *leases* on unpublished rows over gRPC
//! (`outbox.v1.OutboxService`); relay workers in any language publish them and
//! ack. Every call is one short autocommit statement and the database clock is
//! the only lease clock, so any number of stateless replicas can serve one database.
//!
//! Layers, dependencies pointing inward:
//! - [`lease`]: the rules (ids, limits, backoff, outcomes), no I/O;
//! - [`store`]: all SQL, per configured outbox;
//! - [`service`], [`wakeup`] and [`watch`]: the use cases, and long-poll fan-out
//!   from NOTIFY or, while inserts keep arriving, from the table's sequence;
//! - [`grpc`]: validation, conversions and the one status mapping;
//! - [`server`]: the composition root, with [`config`], [`shutdown`], [`telemetry`].

pub mod config;
mod error;
pub mod grpc;
pub mod lease;
pub mod metrics;
pub mod outbox;
pub mod relay;
pub mod server;
pub mod service;
pub mod shutdown;
pub mod store;
pub mod telemetry;
pub mod wakeup;
pub mod watch;

pub use error::Error;
