//! The arrivals feed: one connection LISTENing on the channel the outbox
//! trigger notifies, `schema.table N` when an insert of N rows commits.
//! PostgreSQL delivers a notification at commit, never for a rollback. While
//! the connection is down nothing is announced (claimers fall back to polling);
//! once it is back, the feed reports that announcements may have been lost.

use std::time::Duration;

use sqlx::{PgPool, postgres::PgListener};

use crate::{
    outbox::TableRef,
    store::{Arrival, ArrivalFeed, StoreError},
};

/// The channel the outbox trigger notifies.
const CHANNEL: &str = "outboxd";

/// The LISTEN connection, reconnecting with backoff when it fails.
#[derive(Debug)]
pub struct PgFeed {
    pool: PgPool,
    listener: Option<PgListener>,
    /// Whether "listening" was logged for the current connection.
    announced: bool,
    /// Whether a failure to connect was logged (once, not at every retry).
    down: bool,
    backoff: Duration,
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const LAST_BACKOFF: Duration = Duration::from_secs(5);

impl PgFeed {
    /// Connects and LISTENs before returning, so that no claim can wait
    /// before announcements are received.
    pub(super) async fn connect(pool: &PgPool) -> Result<Self, StoreError> {
        let listener = connect(pool).await?;
        Ok(Self {
            pool: pool.clone(),
            listener: Some(listener),
            announced: false,
            down: false,
            backoff: FIRST_BACKOFF,
        })
    }

    /// The connection, reconnected if it failed. `Err(())` after a reconnect,
    /// when announcements may have been lost in between.
    async fn listener(&mut self) -> Result<&mut PgListener, ()> {
        let mut reconnected = false;
        while self.listener.is_none() {
            match connect(&self.pool).await {
                Ok(listener) => {
                    self.listener = Some(listener);
                    reconnected = true;
                }
                Err(err) => {
                    if !self.down {
                        tracing::warn!(error = %err, "notification listener cannot connect; polling only");
                        self.down = true;
                    }
                    tokio::time::sleep(self.backoff).await;
                    self.backoff = (self.backoff * 2).min(LAST_BACKOFF);
                }
            }
        }
        if !self.announced {
            tracing::info!(channel = CHANNEL, "listening for outbox notifications");
            self.announced = true;
            self.backoff = FIRST_BACKOFF;
        }
        match &mut self.listener {
            Some(listener) if !reconnected => Ok(listener),
            _ => Err(()),
        }
    }
}

impl ArrivalFeed for PgFeed {
    async fn next(&mut self) -> Arrival {
        loop {
            let Ok(listener) = self.listener().await else {
                // Notifications sent while no connection listened are gone.
                return Arrival::Lost;
            };
            match listener.try_recv().await {
                Ok(Some(notification)) => match parse_payload(notification.payload()) {
                    Some((table, rows)) => return Arrival::Inserted { table, rows },
                    None => {
                        tracing::debug!(payload = notification.payload(), "ignoring notification")
                    }
                },
                Ok(None) => {
                    // sqlx reconnects on the next call; notifications in between are lost.
                    tracing::warn!("notification listener lost its connection; reconnecting");
                    return Arrival::Lost;
                }
                Err(err) => {
                    tracing::warn!(error = %err, "notification listener failed; polling only until it reconnects");
                    self.down = true;
                    self.listener = None;
                    self.announced = false;
                }
            }
        }
    }
}

async fn connect(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Parses a trigger payload: `schema.table rows`.
fn parse_payload(payload: &str) -> Option<(TableRef, u64)> {
    let (table, rows) = payload.rsplit_once(' ')?;
    let (schema, table) = table.split_once('.')?;
    Some((TableRef::new(schema, table).ok()?, rows.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_parse() {
        let (table, rows) = parse_payload("public.outbox 12").expect("valid");
        assert_eq!(table.to_string(), "public.outbox");
        assert_eq!(rows, 12);
        assert!(parse_payload("public.outbox").is_none());
        assert!(parse_payload("Bad.Table 1").is_none());
    }
}
