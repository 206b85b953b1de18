//! `outbox.v1.OutboxService`: one screen per RPC.

use std::{sync::Arc, time::Duration};

use tonic::{Request, Response, Status};

use super::{
    convert,
    pb::{self, outbox_service_server::OutboxService as Rpc},
};
use crate::{Error, lease::Limits, service::OutboxService};

/// Time kept back from a caller's deadline so a long poll's answer still arrives.
const DEADLINE_MARGIN: Duration = Duration::from_millis(200);

#[derive(Debug, Clone)]
pub struct OutboxApi {
    service: OutboxService,
    limits: Arc<Limits>,
}

impl OutboxApi {
    pub fn new(service: OutboxService, limits: Limits) -> Self {
        Self {
            service,
            limits: Arc::new(limits),
        }
    }
}

#[tonic::async_trait]
impl Rpc for OutboxApi {
    #[tracing::instrument(name = "ClaimBatch", skip_all, fields(
        outbox = %request.get_ref().outbox,
        worker_id = %request.get_ref().worker_id,
        count = tracing::field::Empty,
    ))]
    async fn claim_batch(
        &self,
        request: Request<pb::ClaimBatchRequest>,
    ) -> Result<Response<pb::ClaimBatchResponse>, Status> {
        let mut req = convert::claim(request.get_ref(), &self.limits).map_err(Error::from)?;
        if let Some(budget) = convert::client_deadline(request.metadata()) {
            req.wait = req.wait.min(budget.saturating_sub(DEADLINE_MARGIN));
        }
        let batch = self.service.claim(&req).await?;
        tracing::Span::current().record("count", batch.messages.len());
        Ok(Response::new(convert::claimed(batch)))
    }

    #[tracing::instrument(name = "Ack", skip_all, fields(
        outbox = %request.get_ref().outbox,
        lease_id = %request.get_ref().lease_id,
        count = request.get_ref().message_ids.len(),
    ))]
    async fn ack(&self, request: Request<pb::AckRequest>) -> Result<Response<pb::AckResponse>, Status> {
        let req = convert::ack(request.get_ref(), &self.limits).map_err(Error::from)?;
        let settled = self.service.ack(&req).await?;
        Ok(Response::new(pb::AckResponse {
            results: convert::results(settled),
        }))
    }

    #[tracing::instrument(name = "Nack", skip_all, fields(
        outbox = %request.get_ref().outbox,
        lease_id = %request.get_ref().lease_id,
        count = request.get_ref().message_ids.len(),
    ))]
    async fn nack(&self, request: Request<pb::NackRequest>) -> Result<Response<pb::NackResponse>, Status> {
        let req = convert::nack(request.get_ref(), &self.limits).map_err(Error::from)?;
        let settled = self.service.nack(&req).await?;
        Ok(Response::new(pb::NackResponse {
            results: convert::results(settled),
        }))
    }

    #[tracing::instrument(name = "ExtendLease", skip_all, fields(
        outbox = %request.get_ref().outbox,
        lease_id = %request.get_ref().lease_id,
        count = request.get_ref().message_ids.len(),
    ))]
    async fn extend_lease(
        &self,
        request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        let req = convert::extend(request.get_ref(), &self.limits).map_err(Error::from)?;
        let settled = self.service.extend(&req).await?;
        Ok(Response::new(pb::ExtendLeaseResponse {
            lease_expires_at: settled.expires_at.map(convert::timestamp),
            results: convert::results(settled),
        }))
    }

    #[tracing::instrument(name = "GetStats", skip_all, fields(outbox = %request.get_ref().outbox))]
    async fn get_stats(
        &self,
        request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let req = convert::stats(request.get_ref());
        let stats = self.service.stats(&req).await?;
        Ok(Response::new(convert::stats_response(stats)))
    }
}
