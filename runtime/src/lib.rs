//! outbox-runtime: what every outbox binary does the same way as a process.
//!
//! - [`cli`]: flag parsing that exits 64 with one line naming the flag or its
//!   environment variable, listen addresses, the log format, durations;
//! - [`telemetry`]: logs and OpenTelemetry traces;
//! - [`metrics`]: the meter provider and the `/metrics` endpoint;
//! - [`http`]: serving a router over HTTP/1.1 with a header-read timeout;
//! - [`shutdown`]: the signals that start a graceful stop.

pub mod cli;
pub mod http;
pub mod metrics;
pub mod shutdown;
pub mod telemetry;
