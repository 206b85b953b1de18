//! Integration tests: outboxd over gRPC on port 0, against real PostgreSQL, each
//! test on a database of its own (see `support`).

#[path = "../shared/mod.rs"]
mod shared;
mod support;

mod ack;
mod admin;
mod adoption;
mod auth;
mod availability;
mod claim;
mod claim_bytes;
mod ctl;
mod cursor;
mod db_roles;
mod edges;
mod extend;
mod lease_state;
mod long_poll;
mod nack;
mod observability;
mod ordering;
mod outboxes;
mod plans;
mod relay;
mod retention;
mod shutdown;
mod startup;
mod stats;
mod status_page;
mod store_conformance;
mod timeouts;
mod tls;
mod validation;
mod watchdog;
