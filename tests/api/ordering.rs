//! Per-aggregate order (`ordering=aggregate`, issue #33): an aggregate's events
//! go out one at a time, in `sequence` order, and in commit order when
//! transactions overlap; a dead-lettered head holds its aggregate under
//! `poison=block` and is stepped over under `poison=park`; leases, backoff,
//! expiries and restarts keep all of it. `ordering=none` is unchanged.

use std::{collections::HashSet, time::Duration};

use outboxd::grpc::pb::{
    ClaimBatchResponse, DiscardRequest, ListBlockedKeysRequest, NackRequest, RedriveRequest,
    outbox_admin_client::OutboxAdminClient,
};
use serde_json::json;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tonic::transport::Channel;
use uuid::Uuid;

use crate::support::{
    DEAD_LETTERED, LEASE_LOST, OK, TestApp, claim_request, gauge, ids, millis, run_outboxd, said,
    secs, wait_until, within,
};

type Admin = OutboxAdminClient<Channel>;

/// The default outbox, ordered; `options` are further `:key=value` options.
fn ordered_outbox(options: &str) -> String {
    format!("default=public.outbox:ordering=aggregate{options}")
}

/// An ordered server whose commit-order guard is probed by claims alone.
/// Gauge samples probe it too, and one taken while a test commits its events
/// could vouch for some of them and not (yet) for the rest, splitting what the
/// test expects in one claim. So the gauges are sampled once, at start, and
/// the test begins after that sample. Once a claim has returned something,
/// the guard then vouches for every event committed before the test's first
/// claim.
async fn spawn_ordered(options: &str) -> TestApp {
    let spec = ordered_outbox(options);
    let app = TestApp::spawn_with(|args| {
        args.add("--outbox", spec).set("--metrics-interval", "1h");
    })
    .await;
    first_gauge_sample(&app).await;
    app
}

async fn first_gauge_sample(app: &TestApp) {
    wait_until(EXPECTED_WITHIN, "the first gauge sample", async || {
        holdback(app).await.is_some()
    })
    .await;
}

/// One event of `aggregate` into `public.outbox` on `conn`, in whatever
/// transaction the caller holds open there; its id.
async fn insert_on(conn: &mut PgConnection, aggregate: &str) -> String {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO public.outbox (id, aggregate_id, event_type, payload) \
         VALUES ($1, $2, 'test.event', '{}')",
    )
    .bind(id)
    .bind(aggregate)
    .execute(conn)
    .await
    .expect("producer insert");
    id.to_string()
}

/// Commits one event per entry of `aggregates`, one transaction each, in
/// that order (so in `sequence` order); their ids.
async fn commit_events(app: &TestApp, aggregates: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    for aggregate in aggregates {
        let id = Uuid::new_v4();
        app.insert_event(id, aggregate, "test.event", json!({}), json!({}))
            .await;
        ids.push(id.to_string());
    }
    ids
}

/// Commits one event per entry of `aggregates`, as [`commit_events`]; their
/// ids, one per aggregate named.
async fn commit<const N: usize>(app: &TestApp, aggregates: [&str; N]) -> [String; N] {
    <[String; N]>::try_from(commit_events(app, &aggregates).await).expect("one id per event")
}

/// Acks `id` under `lease`, which must succeed, then claims at once (no
/// wait) what that ack let go.
async fn ack_and_claim(app: &TestApp, lease: &str, id: &str) -> ClaimBatchResponse {
    assert_eq!(app.ack(lease, &[id]).await, [OK]);
    app.claim("w", 10, secs(30), Duration::ZERO).await
}

/// A producer transaction left open until the test commits or rolls it back.
async fn open_tx(pool: &PgPool) -> Transaction<'static, Postgres> {
    pool.begin().await.expect("begin a producer transaction")
}

/// The aggregates of a claimed batch, in the order they came.
fn aggregates(batch: &ClaimBatchResponse) -> Vec<String> {
    batch
        .messages
        .iter()
        .map(|m| m.aggregate_id.clone())
        .collect()
}

/// A claim now that must come back empty, and one that waits `wait` for
/// something and must get nothing either.
async fn nothing_claimable(app: &TestApp, wait: Duration, why: &str) {
    let now = app.claim("probe", 100, secs(30), Duration::ZERO).await;
    assert!(now.messages.is_empty(), "{why}: claimed {:?}", now.messages);
    if !wait.is_zero() {
        let later = app.claim("probe", 100, secs(30), wait).await;
        assert!(
            later.messages.is_empty(),
            "{why}: a waiting claim got {:?}",
            later.messages
        );
    }
}

/// How long a test waits for events it expects: fresh events of an ordered
/// outbox wait for the commit-order guard, which waits for every transaction
/// open in the whole PostgreSQL server (other tests' included) to end.
const EXPECTED_WITHIN: Duration = Duration::from_secs(30);

/// Claims (long polls of up to a second each) until a claim returns
/// something, failing the test after [`EXPECTED_WITHIN`]. Once one has, the
/// guard vouches for every event committed before the first of those claims:
/// the claims after it need not wait for those.
async fn next_batch(app: &TestApp, worker: &str, max: u32, lease: Duration) -> ClaimBatchResponse {
    within(EXPECTED_WITHIN, "a claim that returns something", async {
        loop {
            let batch = app.claim(worker, max, lease, secs(1)).await;
            if !batch.messages.is_empty() {
                return batch;
            }
        }
    })
    .await
}

async fn dead_letter(app: &TestApp, lease: &str, id: &str) {
    let outcomes = app
        .nack(NackRequest {
            lease_id: lease.into(),
            message_ids: vec![id.into()],
            error: "poison".into(),
            dead_letter: true,
            ..NackRequest::default()
        })
        .await;
    assert_eq!(outcomes, [DEAD_LETTERED]);
}

async fn redrive_aggregate(admin: &mut Admin, aggregate: &str) -> u64 {
    admin
        .redrive(RedriveRequest {
            aggregate_id: aggregate.into(),
            ..RedriveRequest::default()
        })
        .await
        .unwrap_or_else(|s| panic!("Redrive failed: {s:?}"))
        .into_inner()
        .redriven
}

async fn discard(admin: &mut Admin, ids: &[&str]) -> u64 {
    admin
        .discard(DiscardRequest {
            outbox: String::new(),
            message_ids: ids.iter().map(|&id| id.to_owned()).collect(),
        })
        .await
        .unwrap_or_else(|s| panic!("Discard failed: {s:?}"))
        .into_inner()
        .discarded
}

/// Waits until the lease on row `id` has run out by the database clock.
async fn lease_expired(app: &TestApp, id: &str) {
    wait_until(secs(10), "the lease on the head has expired", async || {
        app.row(id).await.lease_left.is_some_and(|left| left < 0.0)
    })
    .await;
}

// ---- one aggregate at a time ----

#[tokio::test]
async fn a_claim_takes_one_event_per_aggregate_and_many_aggregates() {
    let app = spawn_ordered("").await;
    let names: Vec<String> = (0..20).map(|i| format!("order-{i}")).collect();
    // Two rounds: every aggregate's first event, then every aggregate's second.
    let round: Vec<&str> = names.iter().map(String::as_str).collect();
    let firsts = commit_events(&app, &round).await;
    let seconds = commit_events(&app, &round).await;

    let batch = next_batch(&app, "w", 8, secs(30)).await;
    assert_eq!(batch.messages.len(), 8, "a full batch of heads");
    let rest = app.claim("w", 100, secs(30), Duration::ZERO).await;
    let mut heads = set(&ids(&batch));
    heads.extend(ids(&rest));
    assert_eq!(
        heads,
        set(&firsts),
        "every aggregate's head, once, and no second event of any"
    );
    assert_eq!(rest.messages.len(), 12);
    nothing_claimable(&app, millis(500), "every aggregate is under a lease").await;

    assert_eq!(app.ack(&batch.lease_id, &ids(&batch)).await, [OK; 8]);
    let next = app.claim("w", 100, secs(30), Duration::ZERO).await;
    let acked = set(&aggregates(&batch));
    assert_eq!(
        set(&aggregates(&next)),
        acked,
        "exactly the aggregates whose heads were acked go on"
    );
    assert!(
        set(&ids(&next)).is_subset(&set(&seconds)),
        "with their second events"
    );
}

fn set(items: &[String]) -> HashSet<String> {
    items.iter().cloned().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_claims_never_share_an_aggregate() {
    let app = spawn_ordered("").await;
    let names: Vec<String> = (0..12).map(|i| format!("order-{i}")).collect();
    let round: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut rounds = Vec::new();
    for _ in 0..3 {
        rounds.push(commit_events(&app, &round).await);
    }
    for (r, expected) in rounds.iter().enumerate() {
        // One claim of one, which waits for the guard to vouch for every
        // event committed above; then four at once, each for up to five:
        // more room than aggregates.
        let mut batches = vec![next_batch(&app, "first", 1, secs(30)).await];
        let claims: Vec<_> = (0..4)
            .map(|w| {
                app.spawn_claim(claim_request(
                    "",
                    &format!("w{w}"),
                    5,
                    secs(30),
                    Duration::ZERO,
                ))
            })
            .collect();
        for claim in claims {
            let batch = within(secs(30), "a concurrent claim", claim)
                .await
                .expect("the claim task")
                .expect("ClaimBatch");
            batches.push(batch);
        }
        // Whatever the concurrent claims skipped, a last one picks up.
        batches.push(app.claim("last", 100, secs(30), Duration::ZERO).await);
        let mut seen_aggregates = HashSet::new();
        let mut seen_ids = HashSet::new();
        for batch in &batches {
            for m in &batch.messages {
                assert!(
                    seen_aggregates.insert(m.aggregate_id.clone()),
                    "round {r}: {} was handed out twice at once: {batches:#?}",
                    m.aggregate_id
                );
                seen_ids.insert(m.id.clone());
            }
        }
        let expected: HashSet<String> = expected.iter().cloned().collect();
        assert_eq!(
            seen_ids, expected,
            "round {r}: exactly each aggregate's head"
        );
        nothing_claimable(&app, Duration::ZERO, "every aggregate is under a lease").await;
        for batch in batches.iter().filter(|b| !b.messages.is_empty()) {
            let acked = app.ack(&batch.lease_id, &ids(batch)).await;
            assert!(acked.iter().all(|o| *o == OK), "{acked:?}");
        }
    }
    nothing_claimable(&app, Duration::ZERO, "everything was published").await;
}

#[tokio::test]
async fn the_next_event_waits_for_the_ack_of_the_leased_head() {
    let app = spawn_ordered("").await;
    let [a1, a2, b1] = commit(&app, ["A", "A", "B"]).await;
    let batch = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&batch), [a1.clone(), b1.clone()]);
    assert!(batch.messages[0].sequence < batch.messages[1].sequence);
    nothing_claimable(&app, millis(500), "A's head is leased").await;

    assert_eq!(app.ack(&batch.lease_id, &[&b1]).await, [OK]);
    nothing_claimable(&app, Duration::ZERO, "B's ack frees nothing of A").await;
    let next = ack_and_claim(&app, &batch.lease_id, &a1).await;
    assert_eq!(
        ids(&next),
        [a2.as_str()],
        "A's next event, once its head is acked"
    );
    assert_eq!(next.messages[0].attempt, 1);
}

#[tokio::test]
async fn a_nacked_head_in_backoff_holds_its_aggregate() {
    let app = spawn_ordered("").await;
    let [a1, a2] = commit(&app, ["A", "A"]).await;
    let first = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&first), [a1.as_str()]);
    assert_eq!(
        app.nack_retry(&first.lease_id, &[&a1], Some(secs(2))).await,
        [OK]
    );
    nothing_claimable(&app, millis(500), "A's head waits out its backoff").await;

    let retry = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(
        ids(&retry),
        [a1.as_str()],
        "the head again, not the next event"
    );
    assert_eq!(retry.messages[0].attempt, 2);
    let row = app.row(&a1).await;
    assert!(
        row.claimed_at.expect("claimed") >= row.available_at,
        "not before its backoff ran out"
    );
    nothing_claimable(&app, Duration::ZERO, "A's head is leased again").await;
    let next = ack_and_claim(&app, &retry.lease_id, &a1).await;
    assert_eq!(ids(&next), [a2]);
}

#[tokio::test]
async fn an_expired_lease_hands_the_head_out_again_before_the_next_event() {
    let app = spawn_ordered("").await;
    let [a1, a2] = commit(&app, ["A", "A"]).await;
    let crashed = next_batch(&app, "crashy", 10, secs(1)).await;
    assert_eq!(ids(&crashed), [a1.as_str()]);
    nothing_claimable(&app, Duration::ZERO, "A's head is leased").await;
    lease_expired(&app, &a1).await;

    let again = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&again), [a1.as_str()], "the head, not A's next event");
    assert_eq!(again.messages[0].attempt, 2);
    assert_eq!(
        app.ack(&crashed.lease_id, &[&a1]).await,
        [LEASE_LOST],
        "the expired lease is fenced"
    );
    nothing_claimable(&app, Duration::ZERO, "A's head is leased again").await;
    let next = ack_and_claim(&app, &again.lease_id, &a1).await;
    assert_eq!(ids(&next), [a2]);
}

// ---- commit order, not insert order ----

/// B's event, handed out once on a short lease before the test's
/// transactions begin: expired, it is claimable again while they are open
/// (the guard holds back fresh events only), so an empty answer about A is
/// about A and not about claims in general.
async fn control(app: &TestApp) -> String {
    let [b1] = commit(app, ["B"]).await;
    let batch = next_batch(app, "control", 10, secs(1)).await;
    assert_eq!(ids(&batch), [b1.as_str()]);
    b1
}

/// Once the control's first lease ran out: a claim gets the control again,
/// and nothing of A.
async fn only_the_control_while_t1_is_open(app: &TestApp, b1: &str) {
    lease_expired(app, b1).await;
    let batch = next_batch(app, "w", 10, secs(30)).await;
    assert_eq!(
        ids(&batch),
        [b1.to_owned()],
        "B's expired event, and not A's later event while T1 is open"
    );
    nothing_claimable(app, secs(1), "T1 is still open").await;
}

#[tokio::test]
async fn a_later_event_committed_first_waits_for_the_open_earlier_one() {
    let app = spawn_ordered("").await;
    let b1 = control(&app).await;
    let mut t1 = open_tx(app.pool()).await;
    let a1 = insert_on(&mut t1, "A").await;
    let mut t2 = open_tx(app.pool()).await;
    let a2 = insert_on(&mut t2, "A").await;
    t2.commit().await.expect("commit T2");
    only_the_control_while_t1_is_open(&app, &b1).await;

    t1.commit().await.expect("commit T1");
    let first = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&first), [a1.as_str()], "T1's event comes first");
    assert!(first.messages[0].sequence < app_sequence(&app, &a2).await);
    nothing_claimable(&app, Duration::ZERO, "T1's event is leased").await;
    let second = ack_and_claim(&app, &first.lease_id, &a1).await;
    assert_eq!(ids(&second), [a2], "then T2's");
}

#[tokio::test]
async fn a_later_event_goes_once_the_open_earlier_one_rolls_back() {
    let app = spawn_ordered("").await;
    let b1 = control(&app).await;
    let mut t1 = open_tx(app.pool()).await;
    insert_on(&mut t1, "A").await;
    let mut t2 = open_tx(app.pool()).await;
    let a2 = insert_on(&mut t2, "A").await;
    t2.commit().await.expect("commit T2");
    only_the_control_while_t1_is_open(&app, &b1).await;

    t1.rollback().await.expect("roll back T1");
    let next = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&next), [a2], "T2's event, once T1 is gone");
}

#[tokio::test]
async fn a_later_event_of_the_older_transaction_still_waits_for_the_open_earlier_one() {
    // T2 has its transaction id before T1 does, and its event the higher
    // sequence: a guard comparing each row's own transaction id with the
    // oldest running one would let T2's event go.
    let app = spawn_ordered("").await;
    app.db
        .execute("CREATE TABLE test_elsewhere (n int NOT NULL)")
        .await;
    let b1 = control(&app).await;
    let mut t2 = open_tx(app.pool()).await;
    sqlx::query("INSERT INTO test_elsewhere VALUES (1)")
        .execute(&mut *t2)
        .await
        .expect("T2 writes elsewhere first");
    let mut t1 = open_tx(app.pool()).await;
    let a1 = insert_on(&mut t1, "A").await;
    let a2 = insert_on(&mut t2, "A").await;
    t2.commit().await.expect("commit T2");
    only_the_control_while_t1_is_open(&app, &b1).await;

    t1.commit().await.expect("commit T1");
    let first = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&first), [a1.as_str()], "T1's event comes first");
    nothing_claimable(&app, Duration::ZERO, "T1's event is leased").await;
    let second = ack_and_claim(&app, &first.lease_id, &a1).await;
    assert_eq!(ids(&second), [a2], "then T2's");
}

#[tokio::test]
async fn a_later_event_waits_for_the_open_earlier_one_when_claims_looked_before_either_committed() {
    // Claims look (and probe the guard) while T1 and T2 are both open and
    // no transaction newer than T1 has ended: a snapshot's xmax is one past
    // the newest *completed* transaction id, not the first unassigned one,
    // so T1 is then in no snapshot's list of running transactions. Whether
    // some other transaction of the server ends in that moment is up to
    // other tests, so the case runs a few rounds.
    let app = spawn_ordered("").await;
    for round in 0..5 {
        let aggregate = format!("A{round}");
        let mut t1 = open_tx(app.pool()).await;
        let a1 = insert_on(&mut t1, &aggregate).await;
        let mut t2 = open_tx(app.pool()).await;
        let a2 = insert_on(&mut t2, &aggregate).await;
        nothing_claimable(&app, millis(200), "nothing is committed").await;

        t2.commit().await.expect("commit T2");
        nothing_claimable(
            &app,
            millis(500),
            &format!("round {round}: T1 is still open"),
        )
        .await;

        t1.commit().await.expect("commit T1");
        let first = next_batch(&app, "w", 10, secs(30)).await;
        assert_eq!(ids(&first), [a1.as_str()], "T1's event comes first");
        let second = ack_and_claim(&app, &first.lease_id, &a1).await;
        assert_eq!(ids(&second), [a2.as_str()], "then T2's");
        assert_eq!(app.ack(&second.lease_id, &[&a2]).await, [OK]);
    }
}

/// The idempotent producer's retry (issue #47): T2's `INSERT … ON CONFLICT
/// (id) DO NOTHING` draws its seq and waits for T1, which holds the same id,
/// without a transaction id of its own; T3 commits a later event of the
/// aggregate. When T1 rolls back, T2 goes on with an id newer than every
/// snapshot the guard paired T3's seq with: T3's event must still wait for
/// T2's, which comes first.
#[tokio::test]
async fn an_idempotent_retry_waiting_on_a_conflict_keeps_its_place_in_the_order() {
    let app = spawn_ordered("").await;
    let b1 = control(&app).await;
    let x = Uuid::new_v4();
    let insert_x = "INSERT INTO public.outbox (id, aggregate_id, event_type, payload) \
                    VALUES ($1, 'A', 'test.event', '{}') ON CONFLICT (id) DO NOTHING";
    let mut t1 = open_tx(app.pool()).await;
    sqlx::query(insert_x)
        .bind(x)
        .execute(&mut *t1)
        .await
        .expect("T1 inserts X");
    let mut t2 = open_tx(app.pool()).await;
    let retry = tokio::spawn(async move {
        let done = sqlx::query(insert_x)
            .bind(x)
            .execute(&mut *t2)
            .await
            .expect("T2 retries X");
        (t2, done.rows_affected())
    });
    let waiting = "SELECT count(*) FROM pg_stat_activity \
                   WHERE datname = current_database() AND wait_event_type = 'Lock'";
    wait_until(secs(10), "T2 waits for T1", async || {
        app.db.scalar_i64(waiting).await == 1
    })
    .await;
    let [y] = commit(&app, ["A"]).await;
    assert!(app_sequence(&app, &y).await > 0, "T3's event is committed");
    only_the_control_while_t1_is_open(&app, &b1).await;

    t1.rollback().await.expect("T1 rolls back");
    let (t2, inserted) = retry.await.expect("T2's task");
    assert_eq!(inserted, 1, "T2 inserted X once T1 was gone");
    nothing_claimable(&app, secs(1), "T2 is still open").await;
    t2.commit().await.expect("commit T2");

    let first = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(
        ids(&first),
        [x.to_string()],
        "X, drawn before Y, comes first"
    );
    let second = ack_and_claim(&app, &first.lease_id, &x.to_string()).await;
    assert_eq!(ids(&second), [y], "then Y");
}

#[tokio::test]
async fn a_writer_held_open_shows_in_the_holdback_gauge() {
    let app = TestApp::spawn_with(|args| {
        args.add("--outbox", ordered_outbox(""))
            .set("--metrics-interval", "100ms");
    })
    .await;
    let mut t1 = open_tx(app.pool()).await;
    insert_on(&mut t1, "A").await;
    let a2 = commit_events(&app, &["A"]).await;
    wait_until(
        EXPECTED_WITHIN,
        "outbox_commit_order_holdback_seconds reaches 1 s while T1 is open",
        async || holdback(&app).await.is_some_and(|v| v >= 1.0),
    )
    .await;
    nothing_claimable(&app, Duration::ZERO, "T1 is still open").await;
    t1.rollback().await.expect("roll back T1");
    let next = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&next), a2);
    wait_until(
        EXPECTED_WITHIN,
        "outbox_commit_order_holdback_seconds is back to 0",
        async || holdback(&app).await == Some(0.0),
    )
    .await;
}

/// `sequence` of row `id`, read from the table.
async fn app_sequence(app: &TestApp, id: &str) -> i64 {
    sqlx::query_scalar("SELECT seq FROM public.outbox WHERE id = $1::uuid")
        .bind(id)
        .fetch_one(app.pool())
        .await
        .expect("read a row's sequence")
}

/// `outbox_commit_order_holdback_seconds{outbox="default"}` now; `None`
/// before the first sample.
async fn holdback(app: &TestApp) -> Option<f64> {
    gauge(
        &app.scrape().await,
        "outbox_commit_order_holdback_seconds",
        "default",
    )
}

// ---- poison=block ----

#[tokio::test]
async fn a_dead_lettered_head_blocks_only_its_aggregate_until_redriven() {
    let app = spawn_ordered(":poison=block").await;
    let mut admin = app.admin().await;
    let [a1, b1, a2, b2, a3] = commit(&app, ["A", "B", "A", "B", "A"]).await;
    let batch = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&batch), [a1.clone(), b1.clone()]);
    dead_letter(&app, &batch.lease_id, &a1).await;
    let others = ack_and_claim(&app, &batch.lease_id, &b1).await;
    assert_eq!(ids(&others), [b2.as_str()], "B goes on; A is held");
    assert_eq!(app.ack(&others.lease_id, &[&b2]).await, [OK]);
    nothing_claimable(&app, millis(500), "A is blocked by its dead-lettered head").await;

    let stats = app.stats().await;
    assert_eq!(stats.blocked_keys, 1);
    assert_eq!(stats.dead_lettered, 1);
    let blocked = admin
        .list_blocked_keys(ListBlockedKeysRequest::default())
        .await
        .expect("ListBlockedKeys")
        .into_inner()
        .blocked_keys;
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(blocked[0].aggregate_id, "A");
    assert_eq!(blocked[0].head_message_id, a1);
    assert_eq!(blocked[0].held, 2, "A's second and third event wait");

    assert_eq!(redrive_aggregate(&mut admin, "A").await, 1);
    let head = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&head), [a1.as_str()], "the head comes first");
    assert_eq!(head.messages[0].attempt, 1, "its attempts start over");
    assert_eq!(head.messages[0].redrives, 1, "and it says it was redriven");
    nothing_claimable(&app, Duration::ZERO, "A's head is leased").await;
    assert_eq!(app.stats().await.blocked_keys, 0);
    assert_eq!(app.ack(&head.lease_id, &[&a1]).await, [OK]);
    for next in [a2, a3] {
        let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
        assert_eq!(ids(&batch), [next.as_str()], "then the rest of A, in order");
        assert_eq!(app.ack(&batch.lease_id, &[&next]).await, [OK]);
    }
    nothing_claimable(&app, Duration::ZERO, "all of A is published").await;
}

#[tokio::test]
async fn events_held_behind_a_blocked_head_do_not_age_the_pending_figure() {
    let app = TestApp::spawn_with(|args| {
        args.add("--outbox", ordered_outbox(":poison=block"))
            .set("--metrics-interval", "200ms");
    })
    .await;
    let [a1, _a2, b1] = commit(&app, ["A", "A", "B"]).await;
    // A's events are an hour old: the page must not fire for them.
    sqlx::query(
        "UPDATE public.outbox SET created_at = now() - interval '1 hour' WHERE aggregate_id = 'A'",
    )
    .execute(app.pool())
    .await
    .expect("age A's events");
    // The gauge sampler probes the commit-order guard too, so the two heads
    // may come in two claims.
    let mut leases = std::collections::HashMap::new();
    while leases.len() < 2 {
        let batch = next_batch(&app, "w", 10, secs(30)).await;
        for id in ids(&batch) {
            assert!(id == a1 || id == b1, "only the heads: {id}");
            leases.insert(id, batch.lease_id.clone());
        }
    }
    dead_letter(&app, &leases[&a1], &a1).await;
    // B flows: its next event is claimed and left in flight.
    assert_eq!(app.ack(&leases[&b1], &[&b1]).await, [OK]);
    let [b2] = commit(&app, ["B"]).await;
    let flowing = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&flowing), [b2.as_str()]);

    let stats = app.stats().await;
    assert_eq!((stats.pending, stats.blocked_keys), (2, 1), "{stats:?}");
    let pending_age = crate::support::seconds(stats.oldest_pending_age);
    assert!(
        pending_age < 600.0,
        "A's second event is held, not pending: {pending_age} s"
    );
    assert!(crate::support::seconds(stats.oldest_blocked_age) > 0.0);
    wait_until(
        EXPECTED_WITHIN,
        "the gauge leaves the held event out",
        async || {
            let body = app.scrape().await;
            let blocked = gauge(&body, "outbox_blocked_keys", "default");
            let age = gauge(&body, "outbox_oldest_pending_age_seconds", "default");
            blocked == Some(1.0) && age.is_some_and(|a| a < 600.0)
        },
    )
    .await;

    // Without the in-flight one, nothing pending counts at all.
    assert_eq!(app.ack(&flowing.lease_id, &[&b2]).await, [OK]);
    let stats = app.stats().await;
    assert_eq!(stats.pending, 1, "A's held event");
    assert_eq!(crate::support::seconds(stats.oldest_pending_age), 0.0);
}

#[tokio::test]
async fn discarding_a_blocked_head_lets_the_next_event_go() {
    let app = spawn_ordered("").await;
    let mut admin = app.admin().await;
    let [a1, a2] = commit(&app, ["A", "A"]).await;
    let batch = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&batch), [a1.as_str()]);
    dead_letter(&app, &batch.lease_id, &a1).await;
    nothing_claimable(
        &app,
        millis(500),
        "A is blocked: poison=block is the default",
    )
    .await;

    assert_eq!(discard(&mut admin, &[&a1]).await, 1);
    let next = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&next), [a2.as_str()], "A goes on with its next event");
    assert_eq!(app.ack(&next.lease_id, &[&a2]).await, [OK]);
    nothing_claimable(&app, millis(500), "the discarded head never comes back").await;
    let stats = app.stats().await;
    assert_eq!((stats.blocked_keys, stats.dead_lettered), (0, 0));
}

#[tokio::test]
async fn a_head_out_of_attempts_blocks_its_aggregate_under_block() {
    let app = spawn_ordered(":poison=block:max_attempts=2").await;
    let mut admin = app.admin().await;
    let [a1, a2] = commit(&app, ["A", "A"]).await;
    let first = next_batch(&app, "crashy", 1, secs(1)).await;
    assert_eq!(ids(&first), [a1.as_str()]);
    expire_twice(&app, &a1, &first).await;
    // The claim after the last attempt's lease ran out dead-letters the head
    // and hands out nothing of A; B, committed now, goes.
    let [b1] = commit(&app, ["B"]).await;
    let others = next_batch(&app, "w", 100, secs(30)).await;
    assert_eq!(ids(&others), [b1.as_str()], "B, and nothing of A");
    assert_eq!(app.ack(&others.lease_id, &[&b1]).await, [OK]);
    wait_until(secs(10), "A's head is dead-lettered", async || {
        app.row(&a1).await.dead_lettered_at.is_some()
    })
    .await;
    let row = app.row(&a1).await;
    assert_eq!(row.attempts, 2);
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("max attempts"), "last_error: {error:?}");
    nothing_claimable(&app, millis(500), "A is blocked by its dead-lettered head").await;
    assert_eq!(app.stats().await.blocked_keys, 1);

    assert_eq!(discard(&mut admin, &[&a1]).await, 1);
    let next = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&next), [a2]);
}

/// The first claim of `a1` (in `first`) and one more run out their leases.
async fn expire_twice(app: &TestApp, a1: &str, first: &ClaimBatchResponse) {
    assert_eq!(first.messages[0].attempt, 1);
    let batch = app.claim("crashy", 1, secs(1), Duration::ZERO).await;
    assert!(batch.messages.is_empty(), "A's head is leased");
    lease_expired(app, a1).await;
    // Its second attempt, on a short lease too.
    let again = next_batch(app, "crashy", 1, secs(1)).await;
    assert_eq!(ids(&again), [a1.to_owned()]);
    assert_eq!(again.messages[0].attempt, 2);
    lease_expired(app, a1).await;
}

// ---- poison=park ----

#[tokio::test]
async fn a_dead_lettered_head_is_parked_and_its_aggregate_goes_on() {
    let app = spawn_ordered(":poison=park").await;
    let mut admin = app.admin().await;
    let [a1, a2, a3] = commit(&app, ["A", "A", "A"]).await;
    let batch = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&batch), [a1.as_str()]);
    dead_letter(&app, &batch.lease_id, &a1).await;

    let next = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&next), [a2.as_str()], "A goes on past its parked head");
    assert_eq!(app.ack(&next.lease_id, &[&a2]).await, [OK]);
    let stats = app.stats().await;
    assert_eq!((stats.blocked_keys, stats.dead_lettered), (0, 1));
    let blocked = admin
        .list_blocked_keys(ListBlockedKeysRequest::default())
        .await
        .expect("ListBlockedKeys")
        .into_inner()
        .blocked_keys;
    assert!(
        blocked.is_empty(),
        "nothing is blocked under park: {blocked:?}"
    );

    // Redriven, the parked event is A's lowest pending sequence again: it
    // goes before A's third event.
    assert_eq!(redrive_aggregate(&mut admin, "A").await, 1);
    let redriven = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&redriven), [a1.as_str()]);
    assert_eq!(redriven.messages[0].attempt, 1);
    nothing_claimable(&app, Duration::ZERO, "A's redriven event is leased").await;
    let last = ack_and_claim(&app, &redriven.lease_id, &a1).await;
    assert_eq!(ids(&last), [a3]);
}

#[tokio::test]
async fn a_head_out_of_attempts_is_parked_under_park() {
    let app = spawn_ordered(":poison=park:max_attempts=2").await;
    let [a1, a2] = commit(&app, ["A", "A"]).await;
    let first = next_batch(&app, "crashy", 1, secs(1)).await;
    assert_eq!(ids(&first), [a1.as_str()]);
    expire_twice(&app, &a1, &first).await;

    let next = next_batch(&app, "w", 100, secs(30)).await;
    assert_eq!(ids(&next), [a2], "A goes on past its parked head");
    assert_eq!(next.messages[0].attempt, 1);
    let row = app.row(&a1).await;
    assert!(row.dead_lettered_at.is_some(), "the head is dead-lettered");
    assert_eq!(row.attempts, 2);
    assert_eq!(app.stats().await.blocked_keys, 0);
}

// ---- restarts ----

#[tokio::test]
async fn a_restart_keeps_a_blocked_aggregate_blocked_and_the_order() {
    let mut app = spawn_ordered("").await;
    let [a1, b1, a2, b2, a3, c1, c2] = commit(&app, ["A", "B", "A", "B", "A", "C", "C"]).await;
    let batch = next_batch(&app, "w", 10, secs(30)).await;
    assert_eq!(ids(&batch), [a1.clone(), b1.clone(), c1.clone()]);
    dead_letter(&app, &batch.lease_id, &a1).await;
    assert_eq!(app.ack(&batch.lease_id, &[&b1]).await, [OK]);
    // C's head stays leased across the restart.
    let db = app.db.clone();
    app.stop(secs(15)).await.expect("graceful stop");
    drop(app);

    let app = TestApp::spawn_on(db, |args| {
        args.add("--outbox", ordered_outbox(""))
            .set("--metrics-interval", "1h");
    })
    .await
    .expect("the second server starts");
    first_gauge_sample(&app).await;
    let mut admin = app.admin().await;
    let after = next_batch(&app, "w", 100, secs(30)).await;
    assert_eq!(
        ids(&after),
        [b2.as_str()],
        "B goes on; A stays blocked, C's head stays leased"
    );
    nothing_claimable(&app, millis(500), "A blocked, B and C leased").await;
    assert_eq!(app.stats().await.blocked_keys, 1);
    let c = ack_and_claim(&app, &batch.lease_id, &c1).await;
    assert_eq!(ids(&c), [c2]);

    assert_eq!(redrive_aggregate(&mut admin, "A").await, 1);
    for next in [a1, a2, a3] {
        let batch = next_batch(&app, "w", 10, secs(30)).await;
        assert_eq!(
            ids(&batch),
            [next.as_str()],
            "A resumes with its head, in order"
        );
        assert_eq!(app.ack(&batch.lease_id, &[&next]).await, [OK]);
    }
}

// ---- configuration ----

#[tokio::test]
async fn bad_ordering_options_exit_64_and_say_why() {
    for (bad, why) in [
        (
            "x=public.outbox:ordering=sideways",
            "ordering: expected none or aggregate",
        ),
        (
            "x=public.outbox:ordering=aggregate:poison=maybe",
            "poison: expected block or park",
        ),
        (
            "x=public.outbox:poison=park",
            "poison: only with ordering=aggregate",
        ),
        (
            "x=public.outbox:ordering=none:poison=block",
            "poison: only with ordering=aggregate",
        ),
    ] {
        for (args, env) in [
            (
                vec!["--database-url", "postgres://u@h/d", "--outbox", bad],
                vec![],
            ),
            (
                vec!["--database-url", "postgres://u@h/d"],
                vec![("OUTBOXD_OUTBOXES", bad)],
            ),
        ] {
            let output = run_outboxd(&args, &env).await;
            let said = said(&output);
            assert_eq!(output.status.code(), Some(64), "{bad} ({env:?}):\n{said}");
            assert!(said.contains(why), "{bad}: says {why:?}:\n{said}");
        }
    }
}

// ---- ordering=none ----

#[tokio::test]
async fn an_unordered_outbox_hands_out_an_aggregates_events_together() {
    for spec in [
        "default=public.outbox",
        "default=public.outbox:ordering=none",
    ] {
        let app = TestApp::spawn_with(|args| {
            args.add("--outbox", spec);
        })
        .await;
        let events = commit_events(&app, &["A", "A", "A"]).await;
        let batch = app.claim("w", 10, secs(30), Duration::ZERO).await;
        assert_eq!(ids(&batch), events, "{spec}: all of A in one claim");
    }
}
