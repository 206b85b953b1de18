//! Retention: published rows past each outbox's retention are deleted in
//! short batches, so no statement holds locks or bloats WAL for long.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::store::{OutboxStore as _, Store};

/// Deletes published rows past each outbox's retention, in short batches.
pub async fn retention(store: impl Store, every: Duration, batch: u32, cancel: CancellationToken) {
    let outboxes = store.outboxes();
    let mut failing = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        for outbox in &outboxes {
            let name = &outbox.spec().name;
            let mut deleted = 0u64;
            loop {
                if cancel.is_cancelled() {
                    return;
                }
                match outbox.purge_published(batch).await {
                    Ok(n) => {
                        deleted += n;
                        if failing {
                            tracing::info!("retention works again");
                            failing = false;
                        }
                        if n < u64::from(batch) {
                            break;
                        }
                    }
                    Err(err) => {
                        if !failing {
                            tracing::warn!(outbox = %name, error = %err, "retention failed; will retry");
                            failing = true;
                        }
                        break;
                    }
                }
            }
            if deleted > 0 {
                tracing::info!(outbox = %name, count = deleted, "deleted published rows past retention");
            }
        }
    }
}
