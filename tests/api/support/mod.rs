//! The api suite's harness, by job:
//!
//! - [`app`]: an outboxd server on port 0 (`TestApp`) that reaches its own
//!   database through a cuttable proxy, built from command-line arguments;
//! - [`rpc`]: the relay worker's side, RPCs that fail the test on an error,
//!   request builders and outcome helpers;
//! - [`rows`]: the producer's side and the table's state, read directly;
//! - [`metrics`]: the server's `/metrics`, scraped;
//! - [`run`]: the binary run to completion, for its exit code and output;
//! - [`cluster`]: a PostgreSQL server of a test's own, for settings the shared one lacks;
//! - [`pki`]: certificates made in the test, for TLS;
//! - [`http`]: HTTP/1.1 requests to the status page;
//! - [`logs`]: where the server's logs and spans go;
//! - [`otlp`]: an in-process OTLP collector for the spans.
//!
//! Per-test databases, the proxy and the waiting helpers are `crate::shared`'s,
//! one copy for both suites.

mod app;
mod http;
mod logs;
mod metrics;
pub mod otlp;
pub mod pki;
mod rows;
mod rpc;
mod run;

pub use crate::shared::{
    db::TestDb,
    proxy::Proxy,
    wait::{millis, secs, wait_until, within},
};
pub use app::{ServerArgs, TestApp, config_for, endpoint};
pub use http::{Reply, http};
pub use metrics::gauge;
pub use rows::{insert_plain, insert_row, open_transaction};
pub use rpc::{
    ALREADY_DONE, DEAD_LETTERED, LEASE_LOST, NOT_FOUND, OK, assert_invalid, assert_not_found,
    claim_request, dur, ids, outcomes, seconds, strings, time, wire,
};
pub use run::{Outboxd, run_outboxd, said};
