//! `outbox.v1.OutboxAdmin`: operators' calls, one screen each, in the shape of
//! `handler`: parse (`request`), call the service, shape the answer
//! (`response`), errors as statuses (`status`).

use std::{future::Future, sync::Arc};

use tokio::time::Instant;
use tonic::{Request, Response, Status};
use tracing::{Instrument, Span};

use super::{
    guard::admit,
    observe,
    pb::{self, outbox_admin_server::OutboxAdmin as Rpc},
    request::Parse,
};
use crate::{
    Error,
    auth::{Access, Admitted, Authorizer, Caller},
    lease::{Limits, OutboxName},
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
        self.observed_as(method, Access::Admin, request, outbox, |admitted| {
            work(admitted.caller())
        })
        .await
    }

    /// [`AdminApi::observed`] with the access the call needs; `work` gets
    /// the admitted caller, to ask what else it may see.
    async fn observed_as<T, R, F>(
        &self,
        method: &'static str,
        access: Access,
        request: &Request<T>,
        outbox: &str,
        work: impl FnOnce(Admitted) -> F,
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
            let admitted = admit(&self.auth, &self.metrics, method, access, outbox, request)?;
            work(admitted).await
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
        // About the database, not one outbox: any admin scope will do. Each
        // outbox table's upkeep goes only to its admins, as on the status page.
        self.observed_as(
            "GetDatabaseReport",
            Access::AnyAdmin,
            &request,
            "",
            |admitted| async move {
                let report = self.service.database_report()?;
                let mut reply = pb::GetDatabaseReportResponse::from(report.as_ref());
                reply.tables.retain(|table| sees(&admitted, &table.outbox));
                Ok(Response::new(reply))
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

    /// Names no outbox: any admin scope may call it. It lists the outboxes
    /// the caller holds an admin scope for (those every OutboxAdmin call
    /// takes from it, as the status page shows them) and counts the rest,
    /// so `outboxctl stats` asks only about outboxes it may read and says
    /// how many it may not.
    async fn list_outboxes(
        &self,
        request: Request<pb::ListOutboxesRequest>,
    ) -> Result<Response<pb::ListOutboxesResponse>, Status> {
        self.observed_as(
            "ListOutboxes",
            Access::AnyAdmin,
            &request,
            "",
            |admitted| async move {
                let all = self.service.outboxes();
                let outboxes: Vec<pb::OutboxInfo> = all
                    .iter()
                    .filter(|spec| sees(&admitted, &spec.name))
                    .map(Into::into)
                    .collect();
                let hidden = u32::try_from(all.len() - outboxes.len()).unwrap_or(u32::MAX);
                Ok(Response::new(pb::ListOutboxesResponse { outboxes, hidden }))
            },
        )
        .await
    }
}

/// Whether `admitted` may see the configured outbox `name`: an admin scope
/// for it, as every OutboxAdmin call about one outbox needs.
fn sees(admitted: &Admitted, name: &str) -> bool {
    admitted.may(Access::Admin, &OutboxName::from_wire(name))
}
