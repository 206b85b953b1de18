//! The gRPC front: each RPC converts its request, calls the service, converts the
//! result. Validation lives in the conversions; status codes in `status`.

mod convert;
mod handler;
mod observe;
mod status;

pub use handler::OutboxApi;

pub use crate::pb;
