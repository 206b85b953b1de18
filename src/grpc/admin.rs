//! `outbox.v1.OutboxAdmin`: operators' calls, one screen each, in the shape of
//! `handler`: parse (`request`), call the service, shape the answer
//! (`response`), errors as statuses (`status`).

use std::{future::Future, sync::Arc};

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};

use super::{
    guard::authorize,
    observe,
    pb::{self, outbox_admin_server::OutboxAdmin as Rpc},
    request::Parse,
};
use crate::{
    Error,
    auth::{Access, Authorizer, Caller},
    lease::Limits,
    metrics::ServerMetrics,
    service::AdminService,
};

const SERVICE: &str = "outbox.v1.OutboxAdmin";

#[derive(Debug, Clone)]
pub struct AdminApi {
    service: AdminService,
    limits: Arc<Limits>,
    metrics: ServerMetrics,
    auth: Authorizer,
}

impl AdminApi {
    pub fn new(
        service: AdminService,
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

    /// Runs a handler inside its server span (with the outbox it names) once
    /// the caller may use the admin service on that outbox, and records how
    /// it ended. `work` gets the caller, for the audit lines.
    async fn observed<T, R, F>(
        &self,
        method: &'static str,
        request: &Request<T>,
        outbox: &str,
        work: impl FnOnce(Caller) -> F,
    ) -> Result<R, Status>
    where
        F: Future<Output = Result<R, Status>>,
    {
        self.observed_as(method, Access::Admin, request, outbox, work)
            .await
    }

    /// [`AdminApi::observed`] with the access the call needs.
    async fn observed_as<T, R, F>(
        &self,
        method: &'static str,
        access: Access,
        request: &Request<T>,
        outbox: &str,
        work: impl FnOnce(Caller) -> F,
    ) -> Result<R, Status>
    where
        F: Future<Output = Result<R, Status>>,
    {
        let span: Span = observe::service_span(SERVICE, method, request);
        if access != Access::AnyAdmin {
            span.record("outbox", outbox);
        }
        let started = Instant::now();
        let result = async {
            let caller = authorize(&self.auth, &self.metrics, method, access, outbox, request)?;
            work(caller).await
        }
        .instrument(span.clone())
        .await;
        observe::finish(&span, &self.metrics, method, started, &result);
        result
    }
}

#[tonic::async_trait]
impl Rpc for AdminApi {
    async fn list_dead_letters(
        &self,
        request: Request<pb::ListDeadLettersRequest>,
    ) -> Result<Response<pb::ListDeadLettersResponse>, Status> {
        let wire = request.get_ref();
        self.observed("ListDeadLetters", &request, &wire.outbox, |_| async {
            let req = wire.parse(&self.limits).map_err(Error::from)?;
            let page = self.service.dead_letters(&req).await?;
            Ok(Response::new(page.into()))
        })
        .await
    }

    async fn list_blocked_keys(
        &self,
        request: Request<pb::ListBlockedKeysRequest>,
    ) -> Result<Response<pb::ListBlockedKeysResponse>, Status> {
        let wire = request.get_ref();
        self.observed("ListBlockedKeys", &request, &wire.outbox, |_| async {
            let req = wire.parse(&self.limits).map_err(Error::from)?;
            let page = self.service.blocked_keys(&req).await?;
            Ok(Response::new(page.into()))
        })
        .await
    }

    async fn redrive(
        &self,
        request: Request<pb::RedriveRequest>,
    ) -> Result<Response<pb::RedriveResponse>, Status> {
        let wire = request.get_ref();
        self.observed("Redrive", &request, &wire.outbox, |caller| async move {
            let req = wire.parse(&self.limits).map_err(Error::from)?;
            let redriven = self.service.redrive(&req, caller.name()).await?;
            Ok(Response::new(pb::RedriveResponse { redriven }))
        })
        .await
    }

    async fn discard(
        &self,
        request: Request<pb::DiscardRequest>,
    ) -> Result<Response<pb::DiscardResponse>, Status> {
        let wire = request.get_ref();
        self.observed("Discard", &request, &wire.outbox, |caller| async move {
            let req = wire.parse(&self.limits).map_err(Error::from)?;
            let discarded = self.service.discard(&req, caller.name()).await?;
            Ok(Response::new(pb::DiscardResponse { discarded }))
        })
        .await
    }

    async fn get_database_report(
        &self,
        request: Request<pb::GetDatabaseReportRequest>,
    ) -> Result<Response<pb::GetDatabaseReportResponse>, Status> {
        // About the database, not one outbox: any admin scope will do.
        self.observed_as(
            "GetDatabaseReport",
            Access::AnyAdmin,
            &request,
            "",
            |_| async {
                let report = self.service.database_report()?;
                Ok(Response::new(report.as_ref().into()))
            },
        )
        .await
    }

    async fn inspect_message(
        &self,
        request: Request<pb::InspectMessageRequest>,
    ) -> Result<Response<pb::InspectMessageResponse>, Status> {
        let wire = request.get_ref();
        self.observed("InspectMessage", &request, &wire.outbox, |_| async {
            let req = wire.parse(&self.limits).map_err(Error::from)?;
            let message = self.service.inspect(&req).await?;
            Ok(Response::new(message.into()))
        })
        .await
    }

    /// Names no outbox, and what it reveals (names, tables) is configuration:
    /// any admin scope may read it.
    async fn list_outboxes(
        &self,
        request: Request<pb::ListOutboxesRequest>,
    ) -> Result<Response<pb::ListOutboxesResponse>, Status> {
        self.observed_as("ListOutboxes", Access::AnyAdmin, &request, "", |_| async {
            let outboxes = self.service.outboxes().iter().map(Into::into).collect();
            Ok(Response::new(pb::ListOutboxesResponse { outboxes }))
        })
        .await
    }
}
