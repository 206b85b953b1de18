//! outboxd: outbox-as-a-service.
//!
//! Applications INSERT events into an outbox table in the same transaction as
//! their state change. outboxd hands out *leases* on unpublished rows over gRPC
//! (`outbox.v1.OutboxService`); relay workers in any language publish them and
//! ack. Every call is one short autocommit statement and the database clock is
//! the only lease clock, so any number of stateless replicas can serve one database.
//!
//! The client side is always built: [`pb`] (the generated `outbox.v1` types and
//! client), [`client`] and [`backoff`]. A Rust worker depends on
//! `outboxd = { default-features = false }` and gets nothing else.
//!
//! The server (feature `server`, on by default), layers pointing inward:
//! - [`lease`]: the rules (ids, limits, backoff, outcomes), no I/O;
//! - [`store`]: all SQL, per configured outbox;
//! - [`service`], [`wakeup`] and [`watch`]: the use cases, and long-poll
//!   wake-ups from probes of the table's sequence while claimers wait;
//! - [`grpc`]: validation, conversions and the one status mapping;
//! - [`server`]: the composition root, with [`config`], [`telemetry`] and [`metrics`];
//!   [`connections`] caps what each of its listeners holds open.

pub mod backoff;
pub mod client;

/// Generated `outbox.v1` types, client and server.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("outbox.v1");

    /// The compiled proto, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/outbox_descriptor.bin"));
}

#[cfg(feature = "server")]
pub mod auth;
#[cfg(feature = "server")]
pub mod config;
#[cfg(feature = "server")]
pub mod connections;
#[cfg(feature = "server")]
mod error;
#[cfg(feature = "server")]
pub mod grpc;
#[cfg(feature = "server")]
pub mod lease;
#[cfg(feature = "server")]
pub mod metrics;
#[cfg(feature = "server")]
pub mod outbox;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "server")]
pub mod service;
#[cfg(feature = "server")]
pub mod status;
#[cfg(feature = "server")]
pub mod store;
#[cfg(feature = "server")]
pub mod tasks;
#[cfg(feature = "server")]
pub mod telemetry;
#[cfg(feature = "server")]
pub mod tls;
#[cfg(feature = "server")]
pub mod wakeup;
#[cfg(feature = "server")]
pub mod watch;

#[cfg(feature = "server")]
pub use error::{Error, FieldViolation};
