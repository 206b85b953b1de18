//! The lease side of the relay: outboxd's gRPC API, behind a trait so the worker
//! loop can be unit-tested without a server.

use std::{future::Future, time::Duration};

use tonic::{Request, Status, transport::Channel};

use crate::grpc::pb::{self, outbox_service_client::OutboxServiceClient};

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
    client: OutboxServiceClient<Channel>,
    call_timeout: Duration,
}

impl GrpcLeases {
    pub fn connect_lazy(server: &str) -> Result<Self, String> {
        let channel = Channel::from_shared(server.to_owned())
            .map_err(|e| format!("--server {server:?}: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true)
            .connect_lazy();
        Ok(Self {
            client: OutboxServiceClient::new(channel),
            call_timeout: Duration::from_secs(10),
        })
    }

    fn request<T>(&self, message: T, extra: Duration) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.call_timeout + extra);
        request
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
        let request = self.request(req, wait);
        Ok(self.client.clone().claim_batch(request).await?.into_inner())
    }

    async fn ack(&self, req: pb::AckRequest) -> Result<pb::AckResponse, Status> {
        let request = self.request(req, Duration::ZERO);
        Ok(self.client.clone().ack(request).await?.into_inner())
    }

    async fn nack(&self, req: pb::NackRequest) -> Result<pb::NackResponse, Status> {
        let request = self.request(req, Duration::ZERO);
        Ok(self.client.clone().nack(request).await?.into_inner())
    }

    async fn extend(&self, req: pb::ExtendLeaseRequest) -> Result<pb::ExtendLeaseResponse, Status> {
        let request = self.request(req, Duration::ZERO);
        Ok(self
            .client
            .clone()
            .extend_lease(request)
            .await?
            .into_inner())
    }
}
