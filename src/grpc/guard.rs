//! Authorisation at the door of every RPC, before its request is parsed or
//! anything touched, and each refusal counted by method and code.

use tonic::{Request, Status};

use crate::{
    auth::{Access, Authorizer, Caller},
    metrics::ServerMetrics,
};

pub(super) fn authorize<T>(
    auth: &Authorizer,
    metrics: &ServerMetrics,
    method: &'static str,
    access: Access,
    wire_outbox: &str,
    request: &Request<T>,
) -> Result<Caller, Status> {
    auth.check(access, wire_outbox, request)
        .inspect_err(|status| metrics.auth_refused(method, status.code()))
}
