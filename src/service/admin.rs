//! OutboxAdmin's use cases: read what is dead-lettered or blocked, redrive or
//! discard. Each resolves its outbox first, like the lease calls; the calls
//! that change rows say what they changed in the log, for the audit trail.

use crate::{
    Error,
    lease::{
        BlockedKey, BlockedKeysRequest, DeadLetter, DeadLettersRequest, DiscardRequest,
        InspectRequest, InspectedMessage, Page, RedriveRequest, RedriveSelector, Stats,
    },
    outbox::OutboxSpec,
    store::{AdminStore, OutboxStore, PgOutbox, StoreError},
    tasks::watchdog::{DatabaseReport, DatabaseReports},
};

use super::Outboxes;

#[derive(Debug, Clone)]
pub struct AdminService<S = PgOutbox> {
    outboxes: Outboxes<S>,
    reports: DatabaseReports,
}

impl<S: OutboxStore + AdminStore> AdminService<S> {
    pub fn new(outboxes: Outboxes<S>, reports: DatabaseReports) -> Self {
        Self { outboxes, reports }
    }

    /// The database watchdog's latest findings; UNAVAILABLE before its first
    /// sample (or while every sample fails from the start).
    pub fn database_report(&self) -> Result<std::sync::Arc<DatabaseReport>, Error> {
        self.latest_database_report().ok_or_else(|| {
            StoreError::Unavailable(
                "the database watchdog has no sample yet: retry after --watchdog-interval".into(),
            )
            .into()
        })
    }

    /// The latest findings, if any, for pages that show their absence.
    pub fn latest_database_report(&self) -> Option<std::sync::Arc<DatabaseReport>> {
        self.reports.latest()
    }

    /// An outbox's figures, as GetStats reads them (for the status page).
    pub async fn stats(&self, outbox: &str) -> Result<Stats, Error> {
        let outbox = self.outboxes.get(outbox)?;
        Ok(outbox.store.stats().await?)
    }

    pub async fn dead_letters(&self, req: &DeadLettersRequest) -> Result<Page<DeadLetter>, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        Ok(outbox
            .store
            .dead_letters(req.aggregate_id.as_deref(), req.page)
            .await?)
    }

    pub async fn blocked_keys(&self, req: &BlockedKeysRequest) -> Result<Page<BlockedKey>, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        Ok(outbox.store.blocked_keys(req.page).await?)
    }

    /// `caller` is who asked (the tokens file's NAME, or `anonymous`), for the audit line.
    pub async fn redrive(&self, req: &RedriveRequest, caller: &str) -> Result<u64, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        let redriven = outbox.store.redrive(&req.selector).await?;
        let selected = match &req.selector {
            RedriveSelector::Ids(ids) => format!("{} ids", ids.len()),
            RedriveSelector::Aggregate(aggregate) => format!("aggregate {aggregate:?}"),
            RedriveSelector::All => "all".to_owned(),
        };
        tracing::info!(
            caller,
            outbox = outbox.name(),
            selected,
            redriven,
            "redrive: dead letters made deliverable again"
        );
        if redriven > 0 {
            // Redriven rows are claimable now: waiting claimers need not wait
            // for the next insert to notice.
            outbox.waiters.notify(redriven);
        }
        Ok(redriven)
    }

    /// `caller` as for [`AdminService::redrive`].
    pub async fn discard(&self, req: &DiscardRequest, caller: &str) -> Result<u64, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        let discarded = outbox.store.discard(&req.message_ids).await?;
        let ids: Vec<String> = req.message_ids.iter().map(ToString::to_string).collect();
        tracing::info!(caller, outbox = outbox.name(), ids = ?ids, discarded, "discard: dead letters given up for good");
        if discarded > 0 && outbox.store.spec().ordering.blocks() {
            // The events behind a discarded head are claimable now.
            outbox.waiters.notify(discarded);
        }
        Ok(discarded)
    }

    /// One event and its state; an id the outbox does not hold is NOT_FOUND.
    pub async fn inspect(&self, req: &InspectRequest) -> Result<InspectedMessage, Error> {
        let outbox = self.outboxes.get(req.outbox.as_str())?;
        outbox
            .store
            .inspect(req.message_id)
            .await?
            .ok_or(Error::MessageNotFound(req.message_id.to_string()))
    }

    /// The configured outboxes, in configuration order.
    pub fn outboxes(&self) -> Vec<OutboxSpec> {
        self.outboxes
            .iter()
            .map(|o| o.store.spec().clone())
            .collect()
    }
}
