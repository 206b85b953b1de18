//! ClaimBatch: leases, batches, and what a claim may never hand out.

use std::{
    collections::{HashMap, HashSet},
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use chrono::{DateTime, Utc};
use outboxd::grpc::pb::{AckRequest, Outcome};
use serde_json::json;
use uuid::Uuid;

use crate::support::{
    OK, TestApp, claim_request, ids, insert_plain, secs, strings, time, wait_until, within,
};

/// One lease on one row, by the database clock.
#[derive(Debug, Clone)]
struct Lease {
    row: String,
    lease_id: String,
    start: DateTime<Utc>,
    expires: DateTime<Utc>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claimers_never_share_a_live_lease_and_claim_every_row() {
    const ROWS: usize = 10_000;
    const WORKERS: usize = 8;
    let app = TestApp::spawn().await;
    app.db
        .execute(
            "INSERT INTO outbox (id, aggregate_id, event_type, payload)
             SELECT gen_random_uuid(), 'agg-' || (g % 97), 'test.bulk', jsonb_build_object('n', g)
             FROM generate_series(1, 10000) AS g",
        )
        .await;
    let all: HashSet<String> = sqlx::query_scalar::<_, String>("SELECT id::text FROM outbox")
        .fetch_all(app.pool())
        .await
        .expect("read the inserted ids")
        .into_iter()
        .collect();
    assert_eq!(all.len(), ROWS);

    let leases = Arc::new(Mutex::new(Vec::<Lease>::new()));
    let settled = Arc::new(Mutex::new(Vec::<(String, Outcome)>::new()));
    let acked = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..WORKERS {
        let mut client = app.new_client().await;
        let (leases, settled, acked) = (
            Arc::clone(&leases),
            Arc::clone(&settled),
            Arc::clone(&acked),
        );
        workers.push(tokio::spawn(async move {
            // Worker 0 "crashes" on its first batch: a 1 s lease it never settles,
            // so those rows must expire and go to someone else exactly once.
            let mut crash_next = w == 0;
            let size = 25 + 25 * (w as u32 % 4);
            while acked.load(Ordering::SeqCst) < ROWS {
                let lease = if crash_next { secs(1) } else { secs(30) };
                let req = claim_request("", &format!("worker-{w}"), size, lease, secs(1));
                let batch = client
                    .claim_batch(req)
                    .await
                    .expect("ClaimBatch")
                    .into_inner();
                if batch.messages.is_empty() {
                    continue;
                }
                let expires = time(batch.lease_expires_at);
                let start = expires - chrono::Duration::from_std(lease).expect("lease fits");
                leases
                    .lock()
                    .expect("leases")
                    .extend(batch.messages.iter().map(|m| Lease {
                        row: m.id.clone(),
                        lease_id: batch.lease_id.clone(),
                        start,
                        expires,
                    }));
                if std::mem::take(&mut crash_next) {
                    continue;
                }
                let message_ids = ids(&batch);
                let results = client
                    .ack(AckRequest {
                        outbox: String::new(),
                        lease_id: batch.lease_id.clone(),
                        message_ids: message_ids.clone(),
                    })
                    .await
                    .expect("Ack")
                    .into_inner()
                    .results;
                let outcomes = crate::support::outcomes(&message_ids, &results);
                let ok = outcomes.iter().filter(|o| **o == OK).count();
                settled
                    .lock()
                    .expect("settled")
                    .extend(message_ids.into_iter().zip(outcomes));
                acked.fetch_add(ok, Ordering::SeqCst);
            }
        }));
    }
    within(Duration::from_secs(90), "the concurrent claimers", async {
        for worker in workers {
            worker.await.expect("a claimer task panicked");
        }
    })
    .await;

    // Every row acked exactly once, and no ack refused.
    let settled = settled.lock().expect("settled").clone();
    let mut acks: HashMap<&str, usize> = HashMap::new();
    for (id, outcome) in &settled {
        assert_eq!(*outcome, OK, "ack of {id} under the lease that claimed it");
        *acks.entry(id.as_str()).or_default() += 1;
    }
    assert_eq!(acks.len(), ROWS, "every row was acked");
    assert!(acks.values().all(|n| *n == 1), "no row was acked twice");
    assert!(acks.keys().all(|id| all.contains(*id)));

    // No row was held under two unexpired leases at once.
    let leases = leases.lock().expect("leases").clone();
    let mut by_row: HashMap<&str, Vec<&Lease>> = HashMap::new();
    for lease in &leases {
        by_row.entry(lease.row.as_str()).or_default().push(lease);
    }
    assert_eq!(by_row.len(), ROWS, "every row was claimed");
    let mut reclaimed = 0;
    for (row, mut held) in by_row {
        held.sort_by_key(|l| l.start);
        for pair in held.windows(2) {
            assert_ne!(pair[0].lease_id, pair[1].lease_id);
            assert!(
                pair[1].start >= pair[0].expires,
                "row {row} was claimed under {} at {} while lease {} ran until {}",
                pair[1].lease_id,
                pair[1].start,
                pair[0].lease_id,
                pair[0].expires
            );
            reclaimed += 1;
        }
    }
    let crashed = leases.len() - ROWS;
    assert!(crashed > 0, "worker 0's abandoned batch was claimed again");
    assert_eq!(
        reclaimed, crashed,
        "only the abandoned rows were claimed twice"
    );

    assert_eq!(app.count("outbox", "published_at IS NULL").await, 0);
    assert_eq!(app.count("outbox", "attempts = 2").await, crashed as i64);
    assert_eq!(
        app.count("outbox", "attempts = 1").await,
        (ROWS - crashed) as i64
    );
}

#[tokio::test]
async fn claimed_messages_carry_the_producer_columns_in_sequence_order() {
    let app = TestApp::spawn().await;
    let (first, second) = (Uuid::new_v4(), Uuid::new_v4());
    app.insert_event(
        first,
        "order-17",
        "order.created",
        json!({ "total": 12.5, "items": ["book"] }),
        json!({ "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "retries": 3 }),
    )
    .await;
    app.insert_event(
        second,
        "order-18",
        "order.paid",
        json!({ "paid": true }),
        json!({}),
    )
    .await;

    let batch = app.claim("relay-a", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&batch), strings(&[first, second]));
    assert!(
        Uuid::parse_str(&batch.lease_id).is_ok(),
        "lease id is a UUID"
    );
    assert!(batch.messages[0].sequence < batch.messages[1].sequence);

    let m = &batch.messages[0];
    assert_eq!(m.aggregate_id, "order-17");
    assert_eq!(m.event_type, "order.created");
    let payload: serde_json::Value =
        serde_json::from_slice(&m.payload).expect("payload is JSON text");
    assert_eq!(payload, json!({ "total": 12.5, "items": ["book"] }));
    assert_eq!(
        m.headers.get("traceparent").map(String::as_str),
        Some("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    );
    assert_eq!(m.headers.get("retries").map(String::as_str), Some("3"));
    assert_eq!(m.attempt, 1);
    assert!(batch.messages[1].headers.is_empty());

    let row = app.row(&m.id).await;
    assert_eq!(time(m.created_at), row.created_at);
    assert_eq!(
        row.lease_id.map(|l| l.to_string()),
        Some(batch.lease_id.clone())
    );
    assert_eq!(row.claimed_by.as_deref(), Some("relay-a"));
    assert_eq!(row.attempts, 1);
    assert_eq!(Some(time(batch.lease_expires_at)), row.locked_until);
    let left = row.lease_left.expect("leased");
    assert!(
        (25.0..=30.0).contains(&left),
        "lease runs ~30 s by the DB clock, {left}"
    );
}

#[tokio::test]
async fn max_messages_bounds_the_batch_and_an_empty_outbox_gives_an_empty_batch() {
    let app = TestApp::spawn().await;
    let empty = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert!(empty.messages.is_empty());
    assert_eq!(empty.lease_id, "", "no lease without messages");
    assert!(empty.lease_expires_at.is_none());

    let inserted = strings(&app.insert(5).await);
    let first = app.claim("w", 2, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&first), inserted[..2]);
    let rest = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&rest), inserted[2..]);
    assert_ne!(first.lease_id, rest.lease_id, "each claim is its own lease");
    assert!(app.nothing_to_claim().await);
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_with_the_next_attempt() {
    let app = TestApp::spawn().await;
    let id = app.insert(1).await[0].to_string();
    let first = app.claim("w1", 1, secs(1), Duration::ZERO).await;
    assert_eq!(first.messages[0].attempt, 1);
    assert!(
        app.nothing_to_claim().await,
        "a live lease is not handed out again"
    );

    // A long poll picks the row up once the lease runs out; no reaper involved.
    let second = app.claim("w2", 1, secs(30), secs(10)).await;
    assert_eq!(ids(&second), [id.as_str()]);
    assert_eq!(second.messages[0].attempt, 2);
    assert_ne!(second.lease_id, first.lease_id);
    let row = app.row(&id).await;
    assert!(
        row.claimed_at.expect("claimed") >= time(first.lease_expires_at),
        "reclaimed only after the first lease expired"
    );
    assert_eq!(row.claimed_by.as_deref(), Some("w2"));
    assert_eq!(row.attempts, 2);
}

#[tokio::test]
async fn rows_of_a_rolled_back_producer_transaction_never_appear() {
    let app = TestApp::spawn().await;
    let mut tx = app.pool().begin().await.expect("begin");
    for _ in 0..3 {
        insert_plain(&mut tx, Uuid::new_v4()).await;
    }
    tx.rollback().await.expect("rollback");

    let batch = app.claim("w", 10, secs(30), secs(1)).await;
    assert!(
        batch.messages.is_empty(),
        "nothing of a rollback is claimable"
    );
    assert_eq!(app.count("outbox", "true").await, 0);
}

#[tokio::test]
async fn only_committed_rows_are_claimed_while_another_producer_is_open() {
    let app = TestApp::spawn().await;
    let doomed = Uuid::new_v4();
    let mut open = app.pool().begin().await.expect("begin");
    insert_plain(&mut open, doomed).await;

    // A later transaction commits while the first is still open.
    let committed = app.insert(1).await;
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&batch), strings(&committed));

    open.rollback().await.expect("rollback");
    assert!(app.nothing_to_claim().await);
    assert!(app.row_in("outbox", &doomed.to_string()).await.is_none());
}

#[tokio::test]
async fn a_row_committed_after_a_later_one_is_still_claimed() {
    // The high-water-mark trap: `seq` is taken at insert time, so the slow
    // transaction's row has the lower seq but becomes visible last.
    let app = TestApp::spawn().await;
    let slow = Uuid::new_v4();
    let mut open = app.pool().begin().await.expect("begin");
    insert_plain(&mut open, slow).await;
    let fast = strings(&app.insert(1).await);
    let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&batch), fast);
    assert_eq!(app.ack(&batch.lease_id, &fast).await, [OK]);

    open.commit().await.expect("commit");
    let late = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(ids(&late), [slow.to_string()]);
    assert!(late.messages[0].sequence < batch.messages[0].sequence);
}

#[tokio::test]
async fn a_claim_hands_out_the_next_row_when_it_dead_letters_one_past_max_attempts() {
    let app = TestApp::spawn_with(|args| {
        args.set("--max-attempts", "1");
    })
    .await;
    let [poison, next] = <[String; 2]>::try_from(strings(&app.insert(2).await)).expect("two rows");
    let first = app.claim("crashy", 1, secs(1), Duration::ZERO).await;
    assert_eq!(ids(&first), [poison.as_str()]);
    wait_until(secs(5), "the lease has expired", async || {
        app.row(&poison)
            .await
            .lease_left
            .is_some_and(|left| left < 0.0)
    })
    .await;

    // The expired row comes first in sequence order and has had its only
    // attempt: it is dead-lettered, and the claim still returns claimable work.
    let batch = app.claim("w", 1, secs(30), Duration::ZERO).await;
    assert_eq!(
        ids(&batch),
        [next],
        "an empty batch while a row is claimable"
    );
    assert!(app.row(&poison).await.dead_lettered_at.is_some());
}
