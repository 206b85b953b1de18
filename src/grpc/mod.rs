//! The gRPC front: each RPC converts its request, calls the service, converts the
//! result. Validation lives in the conversions; status codes in `status`.

mod convert;
mod handler;
mod observe;
mod status;

pub use handler::OutboxApi;

/// Generated `outbox.v1` types, client and server.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("outbox.v1");

    /// The compiled proto, served by gRPC reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/outbox_descriptor.bin"));
}
