//! Test code both suites use (`tests/api` and `tests/faults`), one copy of it:
//! per-test databases, PostgreSQL clusters of a test's own (crashed, failed
//! over), the cuttable TCP proxy, waiting for a condition, where the binaries
//! are, and RabbitMQ exchanges and queues of a test's own.
//!
//! Each suite includes it with `#[path = "../shared/mod.rs"] mod shared;` and
//! uses a part of it, so what one suite leaves unused is not a warning.
#![allow(dead_code)]

pub mod bins;
pub mod cluster;
pub mod db;
pub mod net;
pub mod proxy;
pub mod rabbit;
pub mod wait;
