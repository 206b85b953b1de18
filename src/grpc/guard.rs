//! Authorisation at the door of every RPC, before its request is parsed or
//! anything touched, and each refusal counted by method and code.

use tonic::{Request, Status};

use crate::{
    auth::{Access, Admitted, Authorizer, Caller},
    lease::OutboxName,
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
    admit(auth, metrics, method, access, wire_outbox, request).map(|admitted| admitted.caller())
}

/// [`authorize`] that keeps the admitted caller, for a call that then
/// answers only about the outboxes it may see (ListOutboxes).
pub(super) fn admit<T>(
    auth: &Authorizer,
    metrics: &ServerMetrics,
    method: &'static str,
    access: Access,
    wire_outbox: &str,
    request: &Request<T>,
) -> Result<Admitted, Status> {
    auth.admit_request(request)
        .and_then(|admitted| {
            admitted.require(access, &OutboxName::from_wire(wire_outbox))?;
            Ok(admitted)
        })
        .inspect_err(|status| metrics.auth_refused(method, status.code()))
}
