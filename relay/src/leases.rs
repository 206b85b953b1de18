//! The lease side of the relay: outboxd's gRPC API, behind a trait so the worker
//! loop can be unit-tested without a server.

use std::{future::Future, time::Duration};

use opentelemetry::{global, propagation::Injector};
use tonic::{
    Request, Status,
    metadata::{MetadataKey, MetadataMap, MetadataValue},
};
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use outbox_runtime::telemetry;
use outboxd::{
    client::{self, AuthClient, ClientTls, Credentials},
    pb,
};

use crate::credentials::TokenFile;

pub trait Leases: Clone + Send + Sync + 'static {
    fn claim(
        &self,
        req: pb::ClaimBatchRequest,
    ) -> impl Future<Output = Result<pb::ClaimBatchResponse, Status>> + Send;
    fn ack(
        &self,
        req: pb::AckRequest,
    ) -> impl Future<Output = Result<pb::AckResponse, Status>> + Send;
    fn nack(
        &self,
        req: pb::NackRequest,
    ) -> impl Future<Output = Result<pb::NackResponse, Status>> + Send;
    fn extend(
        &self,
        req: pb::ExtendLeaseRequest,
    ) -> impl Future<Output = Result<pb::ExtendLeaseResponse, Status>> + Send;
}

/// outboxd over gRPC. The channel reconnects by itself; every call carries a
/// deadline, so a silently dead connection costs one timeout, not a hang.
#[derive(Debug, Clone)]
pub struct GrpcLeases {
    client: AuthClient,
    call_timeout: Duration,
}

impl GrpcLeases {
    /// Every call carries the token of `token`, as it is when the call is made.
    pub fn connect_lazy(
        server: &str,
        tls: Option<&ClientTls>,
        token: Option<&TokenFile>,
    ) -> Result<Self, String> {
        let credentials = token.map_or_else(Credentials::none, |file| {
            Credentials::bearer(file.token.clone())
        });
        Ok(Self {
            client: client::connect_lazy_with(server, tls, credentials)
                .map_err(|e| format!("--server {e}"))?,
            call_timeout: Duration::from_secs(10),
        })
    }

    /// One RPC under a client span whose context travels in the request
    /// metadata, so outboxd's server span continues the relay's trace.
    async fn call<T, R, F, Fut>(
        &self,
        method: &'static str,
        message: T,
        extra: Duration,
        rpc: F,
    ) -> Result<R, Status>
    where
        F: FnOnce(AuthClient, Request<T>) -> Fut,
        Fut: Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let span = telemetry::rpc_span("client", method);
        let mut request = Request::new(message);
        request.set_timeout(self.call_timeout + extra);
        let context = span.context();
        global::get_text_map_propagator(|p| {
            p.inject_context(&context, &mut MetadataInjector(request.metadata_mut()))
        });
        let result = rpc(self.client.clone(), request)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(_) => span.record("rpc.response.status_code", "OK"),
            Err(status) => {
                span.record("otel.status_code", "ERROR");
                span.record(
                    "rpc.response.status_code",
                    telemetry::grpc_code_name(status.code()),
                )
            }
        };
        result.map(tonic::Response::into_inner)
    }
}

/// Writes W3C trace context into gRPC request metadata.
struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

fn wait_of(req: &pb::ClaimBatchRequest) -> Duration {
    req.wait
        .map(|w| Duration::new(w.seconds.max(0) as u64, w.nanos.max(0) as u32))
        .unwrap_or_default()
}

impl Leases for GrpcLeases {
    async fn claim(&self, req: pb::ClaimBatchRequest) -> Result<pb::ClaimBatchResponse, Status> {
        let wait = wait_of(&req);
        self.call("ClaimBatch", req, wait, |mut c, r| async move {
            c.claim_batch(r).await
        })
        .await
    }

    async fn ack(&self, req: pb::AckRequest) -> Result<pb::AckResponse, Status> {
        self.call("Ack", req, Duration::ZERO, |mut c, r| async move {
            c.ack(r).await
        })
        .await
    }

    async fn nack(&self, req: pb::NackRequest) -> Result<pb::NackResponse, Status> {
        self.call("Nack", req, Duration::ZERO, |mut c, r| async move {
            c.nack(r).await
        })
        .await
    }

    async fn extend(&self, req: pb::ExtendLeaseRequest) -> Result<pb::ExtendLeaseResponse, Status> {
        self.call("ExtendLease", req, Duration::ZERO, |mut c, r| async move {
            c.extend_lease(r).await
        })
        .await
    }
}

#[cfg(test)]
#[path = "leases_tests.rs"]
mod tests;
