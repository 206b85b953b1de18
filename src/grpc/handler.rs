//! `outbox.v1.OutboxService`: one screen per RPC. Each parses its request
//! (`request`), calls the service, builds its response (`response`); errors
//! become statuses in `status`.

use std::{future::Future, sync::Arc};

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};

use super::{
    guard::authorize,
    observe,
    pb::{self, outbox_service_server::OutboxService as Rpc},
    request::{Parse, within_deadline},
};
use crate::{
    Error,
    auth::{Access, Authorizer},
    lease::{Limits, StatsRequest},
    metrics::ServerMetrics,
    service::OutboxService,
};

#[derive(Debug, Clone)]
pub struct OutboxApi {
    service: OutboxService,
    limits: Arc<Limits>,
    metrics: ServerMetrics,
    auth: Authorizer,
}

impl OutboxApi {
    pub fn new(
        service: OutboxService,
        limits: Limits,
        metrics: ServerMetrics,
        auth: Authorizer,
    ) -> Self {
        Self {
            service,
            limits: Arc::new(limits),
            metrics,
            auth,
        }
    }

    /// The caller's right to `access` the outbox the request names; first in
    /// every handler, so a refused call changes nothing.
    fn authorize<T>(
        &self,
        method: &'static str,
        access: Access,
        outbox: &str,
        request: &Request<T>,
    ) -> Result<(), Status> {
        authorize(&self.auth, &self.metrics, method, access, outbox, request).map(drop)
    }

    /// Runs a handler inside its server span and records how it ended.
    async fn observed<R>(
        &self,
        method: &'static str,
        span: Span,
        work: impl Future<Output = Result<R, Status>>,
    ) -> Result<R, Status> {
        let started = Instant::now();
        let result = work.instrument(span.clone()).await;
        observe::finish(&span, &self.metrics, method, started, &result);
        result
    }
}

#[tonic::async_trait]
impl Rpc for OutboxApi {
    async fn claim_batch(
        &self,
        request: Request<pb::ClaimBatchRequest>,
    ) -> Result<Response<pb::ClaimBatchResponse>, Status> {
        let span = observe::server_span("ClaimBatch", &request);
        span.record("outbox", request.get_ref().outbox.as_str());
        span.record("worker_id", request.get_ref().worker_id.as_str());
        self.observed("ClaimBatch", span.clone(), async {
            let outbox = &request.get_ref().outbox;
            self.authorize("ClaimBatch", Access::Relay, outbox, &request)?;
            let mut req = request.get_ref().parse(&self.limits).map_err(Error::from)?;
            req.wait = within_deadline(req.wait, request.metadata());
            if !req.acks.is_empty() {
                span.record(
                    "acked",
                    req.acks.iter().map(|a| a.message_ids.len()).sum::<usize>(),
                );
            }
            let (acked, batch) = self.service.claim_with_acks(&req).await?;
            span.record("batch_size", batch.messages.len());
            if !batch.messages.is_empty() {
                span.record("lease_id", batch.lease_id.to_string());
            }
            Ok(Response::new((acked, batch).into()))
        })
        .await
    }

    async fn ack(
        &self,
        request: Request<pb::AckRequest>,
    ) -> Result<Response<pb::AckResponse>, Status> {
        let span = settle_span("Ack", &request, |r| {
            (&r.outbox, &r.lease_id, r.message_ids.len())
        });
        self.observed("Ack", span, async {
            let outbox = &request.get_ref().outbox;
            self.authorize("Ack", Access::Relay, outbox, &request)?;
            let req = request.get_ref().parse(&self.limits).map_err(Error::from)?;
            let settled = self.service.ack(&req).await?;
            Ok(Response::new(settled.into()))
        })
        .await
    }

    async fn nack(
        &self,
        request: Request<pb::NackRequest>,
    ) -> Result<Response<pb::NackResponse>, Status> {
        let span = settle_span("Nack", &request, |r| {
            (&r.outbox, &r.lease_id, r.message_ids.len())
        });
        self.observed("Nack", span, async {
            let outbox = &request.get_ref().outbox;
            self.authorize("Nack", Access::Relay, outbox, &request)?;
            let req = request.get_ref().parse(&self.limits).map_err(Error::from)?;
            let settled = self.service.nack(&req).await?;
            Ok(Response::new(settled.into()))
        })
        .await
    }

    async fn extend_lease(
        &self,
        request: Request<pb::ExtendLeaseRequest>,
    ) -> Result<Response<pb::ExtendLeaseResponse>, Status> {
        let span = settle_span("ExtendLease", &request, |r| {
            (&r.outbox, &r.lease_id, r.message_ids.len())
        });
        self.observed("ExtendLease", span, async {
            let outbox = &request.get_ref().outbox;
            self.authorize("ExtendLease", Access::Relay, outbox, &request)?;
            let req = request.get_ref().parse(&self.limits).map_err(Error::from)?;
            let settled = self.service.extend(&req).await?;
            Ok(Response::new(settled.into()))
        })
        .await
    }

    async fn get_stats(
        &self,
        request: Request<pb::GetStatsRequest>,
    ) -> Result<Response<pb::GetStatsResponse>, Status> {
        let span = observe::server_span("GetStats", &request);
        span.record("outbox", request.get_ref().outbox.as_str());
        self.observed("GetStats", span, async {
            let outbox = &request.get_ref().outbox;
            self.authorize("GetStats", Access::Stats, outbox, &request)?;
            let req = StatsRequest::from(request.get_ref());
            let stats = self.service.stats(&req).await?;
            Ok(Response::new(stats.into()))
        })
        .await
    }
}

/// The span of a settle call, with the outbox, lease and batch size it names.
fn settle_span<T>(
    method: &'static str,
    request: &Request<T>,
    fields: impl Fn(&T) -> (&String, &String, usize),
) -> Span {
    let span = observe::server_span(method, request);
    let (outbox, lease_id, count) = fields(request.get_ref());
    span.record("outbox", outbox.as_str());
    span.record("lease_id", lease_id.as_str());
    span.record("batch_size", count);
    span
}
