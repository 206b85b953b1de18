//! The gRPC front, every wire concern of the server: `request` checks wire
//! requests against the limits, naming bad fields as on the wire; `response`
//! shapes results; `status` maps errors to status codes, with
//! `google.rpc.BadRequest` details; `handler` strings them together per RPC
//! of OutboxService, `admin` per RPC of OutboxAdmin, each first asking
//! `guard` whether the caller may.

mod admin;
mod guard;
mod handler;
mod observe;
mod request;
mod response;
mod status;

pub use admin::AdminApi;
pub use handler::OutboxApi;

pub use crate::pb;
