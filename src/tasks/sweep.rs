//! The claim cursor's sweep: every `--claim-sweep-interval`, each outbox's
//! pending rows below this replica's cursor are walked in full, as claims did
//! before the cursor. A claimable row found there without a lease is a fault
//! of the cursor: it is handed out again, logged with its `seq` and counted,
//! so the counter proves the cursor right by staying 0. Lease rows of deleted
//! outbox rows go in the same pass.

use std::{
    sync::{
        Arc,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio_util::sync::CancellationToken;

use crate::{
    metrics::ServerMetrics,
    store::{OutboxStore as _, Store},
};

pub async fn sweep(
    store: impl Store,
    metrics: ServerMetrics,
    found: Arc<AtomicU64>,
    every: Duration,
    cancel: CancellationToken,
) {
    let outboxes = store.outboxes();
    let mut failing = false;
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        for outbox in &outboxes {
            let name = &outbox.spec().name;
            match outbox.sweep().await {
                Ok(swept) => {
                    if failing {
                        tracing::info!("the claim sweep works again");
                        failing = false;
                    }
                    for seq in &swept.found {
                        tracing::warn!(
                            outbox = %name,
                            seq,
                            cursor = swept.cursor,
                            "the claim sweep found a claimable event below the claim cursor without a lease: handed out again (a fault of the cursor, or of a hand in the lease table)"
                        );
                    }
                    if swept.orphans > 0 {
                        tracing::info!(
                            outbox = %name,
                            count = swept.orphans,
                            "removed lease rows whose outbox rows no longer exist"
                        );
                    }
                    metrics.swept(name, swept.found.len(), swept.orphans);
                    found.fetch_add(swept.found.len() as u64, Ordering::Relaxed);
                }
                Err(err) => {
                    if !failing {
                        tracing::warn!(outbox = %name, error = %err, "the claim sweep failed; will retry");
                        failing = true;
                    }
                }
            }
        }
    }
}
