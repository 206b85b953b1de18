//! The operator's API, `outbox.v1.OutboxAdmin` (#33): dead letters listed and
//! paged, the keys an ordered outbox holds back behind a dead-lettered head,
//! Redrive and Discard on ordered and unordered outboxes, the stats and gauges
//! of blocked keys, and bad requests refused without changing anything.

use std::{
    collections::{BTreeMap, HashSet},
    fmt::Debug,
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};
use outboxd::grpc::pb::{
    ListBlockedKeysRequest, ListBlockedKeysResponse, ListDeadLettersRequest,
    ListDeadLettersResponse, NackRequest, OutboxMessage, RedriveRequest,
};
use serde_json::{Value, json};
use sqlx::AssertSqlSafe;
use tonic::Status;
use tonic_health::pb::health_check_response::ServingStatus;
use uuid::Uuid;

use crate::support::{
    DEAD_LETTERED, OK, ServerArgs, TestApp, TestDb, assert_invalid, assert_not_found,
    claim_request, dur, gauge, ids as batch_ids, millis, seconds, secs, strings, time, wait_until,
    within,
};

/// An ordered outbox under the default poison policy (block).
const ORDERED: &str = "orders";
const ORDERED_TABLE: &str = "public.orders_outbox";
/// An ordered outbox under poison=park.
const PARKED: &str = "parked";
const PARKED_TABLE: &str = "public.parked_outbox";
const DEFAULT_TABLE: &str = "public.outbox";

/// The default outbox (unordered) beside an ordered one of each poison policy.
fn with_ordered(args: &mut ServerArgs) {
    args.add("--outbox", "default=public.outbox")
        .add("--outbox", "orders=public.orders_outbox:ordering=aggregate")
        .add(
            "--outbox",
            "parked=public.parked_outbox:ordering=aggregate:poison=park",
        );
}

async fn spawn_ordered() -> TestApp {
    TestApp::spawn_with(with_ordered).await
}

// ---- the producer's and the table's side ----

/// Commits one event of `aggregate` to `table`, in a transaction of its own
/// (so sequence order is commit order); its id.
async fn produce(app: &TestApp, table: &str, aggregate: &str) -> String {
    let id = Uuid::new_v4();
    let sql = format!(
        "INSERT INTO {table} (id, aggregate_id, event_type, payload) VALUES ($1, $2, 'test.event', $3)"
    );
    sqlx::query(AssertSqlSafe(sql))
        .bind(id)
        .bind(aggregate)
        .bind(json!({ "aggregate": aggregate }))
        .execute(app.pool())
        .await
        .expect("insert an event");
    id.to_string()
}

/// Commits one event per aggregate named, in that order; their ids.
async fn produce_all(app: &TestApp, table: &str, aggregates: &[&str]) -> Vec<String> {
    let mut ids = Vec::new();
    for aggregate in aggregates {
        ids.push(produce(app, table, aggregate).await);
    }
    ids
}

async fn seq_of(app: &TestApp, table: &str, id: &str) -> i64 {
    app.db
        .scalar_i64(&format!("SELECT seq FROM {table} WHERE id = '{id}'"))
        .await
}

async fn is_discarded(app: &TestApp, table: &str, id: &str) -> bool {
    app.count(table, &format!("id = '{id}' AND discarded_at IS NOT NULL"))
        .await
        == 1
}

/// Every column of one row and of its lease, as text: equal means untouched.
async fn row_state(app: &TestApp, table: &str, id: &str) -> String {
    let sql = format!(
        "SELECT (SELECT to_jsonb(o) FROM {table} AS o WHERE o.id = $1)::text \
                || coalesce((SELECT to_jsonb(l) FROM {table}_leases AS l WHERE l.id = $1)::text, '')"
    );
    sqlx::query_scalar::<_, String>(AssertSqlSafe(sql))
        .bind(Uuid::parse_str(id).expect("a UUID"))
        .fetch_one(app.pool())
        .await
        .expect("read a row's state")
}

async fn dead_lettered_at(app: &TestApp, table: &str, id: &str) -> DateTime<Utc> {
    app.row_in(table, id)
        .await
        .expect("the row exists")
        .dead_lettered_at
        .expect("the row is dead-lettered")
}

// ---- the worker's side ----

/// A claimed event and the lease it came under.
#[derive(Debug, Clone)]
struct Claimed {
    lease: String,
    message: OutboxMessage,
}

/// Claims from `outbox` until `n` events are leased, waiting (long polls, up
/// to 20 s) for whatever the commit-order guard still holds back; fails if more
/// than `n` come. In the order they came.
async fn claim_exactly(app: &TestApp, outbox: &str, n: usize) -> Vec<Claimed> {
    let started = Instant::now();
    let max = u32::try_from(n + 10).expect("a small batch");
    let mut got: Vec<Claimed> = Vec::new();
    while got.len() < n {
        assert!(
            started.elapsed() < secs(20),
            "only {} of {n} events became claimable from {outbox}: {got:?}",
            got.len()
        );
        let batch = app
            .claim_from(outbox, "w-admin", max, secs(300), millis(500))
            .await;
        got.extend(batch.messages.into_iter().map(|message| Claimed {
            lease: batch.lease_id.clone(),
            message,
        }));
    }
    assert_eq!(
        got.len(),
        n,
        "more events than expected were claimable from {outbox}: {got:?}"
    );
    got
}

/// The ids of claimed events, in the order they came.
fn claimed_ids(claimed: &[Claimed]) -> Vec<String> {
    claimed.iter().map(|c| c.message.id.clone()).collect()
}

/// Whether a claim now, with no wait, gets nothing from `outbox`.
async fn nothing_claimable(app: &TestApp, outbox: &str) -> bool {
    app.claim_from(outbox, "w-probe", 100, secs(30), Duration::ZERO)
        .await
        .messages
        .is_empty()
}

/// Dead-letters claimed events (Nack with dead_letter), one Nack per lease.
async fn dead_letter(app: &TestApp, outbox: &str, claimed: &[Claimed], error: &str) {
    let mut by_lease: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in claimed {
        by_lease
            .entry(c.lease.as_str())
            .or_default()
            .push(c.message.id.clone());
    }
    for (lease, ids) in by_lease {
        let n = ids.len();
        let outcomes = app
            .nack(NackRequest {
                outbox: outbox.into(),
                lease_id: lease.into(),
                message_ids: ids,
                error: error.into(),
                dead_letter: true,
                ..NackRequest::default()
            })
            .await;
        assert_eq!(outcomes, vec![DEAD_LETTERED; n], "dead-lettered");
    }
}

/// Acks claimed events, one Ack per event.
async fn ack_all(app: &TestApp, outbox: &str, claimed: &[Claimed]) {
    for c in claimed {
        assert_eq!(
            app.ack_in(outbox, &c.lease, &[&c.message.id]).await,
            [OK],
            "acked {}",
            c.message.id
        );
    }
}

/// Claims the `n` events `outbox` has to give and dead-letters them all.
async fn claim_and_dead_letter(app: &TestApp, outbox: &str, n: usize) -> Vec<Claimed> {
    let claimed = claim_exactly(app, outbox, n).await;
    dead_letter(app, outbox, &claimed, "poison").await;
    claimed
}

/// Claims exactly the next event of an ordered outbox, checks it is `id`, acks it.
async fn deliver_next(app: &TestApp, outbox: &str, id: &str) -> OutboxMessage {
    let claimed = claim_exactly(app, outbox, 1).await;
    assert_eq!(claimed_ids(&claimed), [id], "the next event of {outbox}");
    ack_all(app, outbox, &claimed).await;
    claimed[0].message.clone()
}

// ---- the operator's side ----

fn dead_letters(outbox: &str) -> ListDeadLettersRequest {
    ListDeadLettersRequest {
        outbox: outbox.into(),
        ..ListDeadLettersRequest::default()
    }
}

fn blocked_keys(outbox: &str) -> ListBlockedKeysRequest {
    ListBlockedKeysRequest {
        outbox: outbox.into(),
        ..ListBlockedKeysRequest::default()
    }
}

fn redrive_ids(outbox: &str, ids: &[impl AsRef<str>]) -> RedriveRequest {
    RedriveRequest {
        outbox: outbox.into(),
        message_ids: ids.iter().map(|id| id.as_ref().to_owned()).collect(),
        ..RedriveRequest::default()
    }
}

fn redrive_aggregate(outbox: &str, aggregate: &str) -> RedriveRequest {
    RedriveRequest {
        outbox: outbox.into(),
        aggregate_id: aggregate.into(),
        ..RedriveRequest::default()
    }
}

fn redrive_all(outbox: &str) -> RedriveRequest {
    RedriveRequest {
        outbox: outbox.into(),
        all: true,
        ..RedriveRequest::default()
    }
}

fn listed(page: &ListDeadLettersResponse) -> Vec<String> {
    page.dead_letters
        .iter()
        .map(|d| {
            d.message
                .as_ref()
                .expect("a dead letter has its message")
                .id
                .clone()
        })
        .collect()
}

async fn all_dead_letters(app: &TestApp, outbox: &str) -> Vec<String> {
    let page = app.list_dead_letters(dead_letters(outbox)).await;
    assert!(page.next_page_token.is_empty(), "one page: {page:?}");
    listed(&page)
}

/// (aggregate, head, held) of each blocked key, in the order listed.
fn blocked(page: &ListBlockedKeysResponse) -> Vec<(String, String, u64)> {
    page.blocked_keys
        .iter()
        .map(|k| (k.aggregate_id.clone(), k.head_message_id.clone(), k.held))
        .collect()
}

/// Pages through a list from the page `first_token` names: each page's items
/// and the token it ended with. Fails on a chain that does not end.
async fn pages<T: Debug>(
    first_token: String,
    mut page: impl AsyncFnMut(String) -> (Vec<T>, String),
) -> Vec<(Vec<T>, String)> {
    let mut pages = Vec::new();
    let mut token = first_token;
    loop {
        let (items, next) = page(token).await;
        pages.push((items, next.clone()));
        if next.is_empty() {
            return pages;
        }
        assert!(pages.len() < 50, "the page tokens never end: {pages:?}");
        token = next;
    }
}

/// Pages through ListDeadLetters from the first page, like [`pages`].
async fn dead_letter_pages(
    app: &TestApp,
    first: ListDeadLettersRequest,
) -> Vec<(Vec<String>, String)> {
    pages(first.page_token.clone(), async |page_token| {
        let req = ListDeadLettersRequest {
            page_token,
            ..first.clone()
        };
        let page = app.list_dead_letters(req).await;
        (listed(&page), page.next_page_token)
    })
    .await
}

/// Pages through ListBlockedKeys from the first page, like [`pages`].
async fn blocked_key_pages(
    app: &TestApp,
    first: ListBlockedKeysRequest,
) -> Vec<(Vec<(String, String, u64)>, String)> {
    pages(first.page_token.clone(), async |page_token| {
        let req = ListBlockedKeysRequest {
            page_token,
            ..first.clone()
        };
        let page = app.list_blocked_keys(req).await;
        (blocked(&page), page.next_page_token)
    })
    .await
}

/// Checks a chain of pages: tokens that differ, each page no larger than
/// `page_size`, every page before the last one full, and the items, in
/// order, exactly `expected` (none twice, none missing). A full page may be
/// followed by an empty last one.
#[track_caller]
fn assert_paged<T: Debug + PartialEq + Clone>(
    pages: &[(Vec<T>, String)],
    page_size: usize,
    expected: &[T],
) {
    let tokens: Vec<&str> = pages.iter().map(|(_, t)| t.as_str()).collect();
    let distinct: HashSet<&str> = tokens.iter().copied().collect();
    assert_eq!(distinct.len(), tokens.len(), "tokens repeat: {tokens:?}");
    let (last, before) = pages.split_last().expect("at least one page");
    assert!(last.1.is_empty(), "the last page has no next token");
    for (items, token) in before {
        assert!(!token.is_empty(), "a page before the last has a next token");
        assert_eq!(items.len(), page_size, "a page before the last is full");
    }
    assert!(last.0.len() <= page_size, "the last page is not oversized");
    let all: Vec<T> = pages.iter().flat_map(|(items, _)| items.clone()).collect();
    assert_eq!(all, expected, "every item once, in order, over {pages:?}");
}

// ---- ListDeadLetters ----

#[tokio::test]
async fn dead_letters_are_listed_in_sequence_order_with_their_fields() {
    let app = TestApp::spawn().await;
    let events = [
        (
            "order-1",
            "order.created",
            json!({ "total": 10 }),
            json!({ "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01" }),
        ),
        (
            "order-2",
            "order.paid",
            json!({ "total": 20, "lines": [1, 2] }),
            json!({}),
        ),
        (
            "order-3",
            "order.shipped",
            json!("a string"),
            json!({ "k": "v" }),
        ),
    ];
    let mut dead = Vec::new();
    for (aggregate, event_type, payload, headers) in &events {
        let id = Uuid::new_v4();
        app.insert_event(id, aggregate, event_type, payload.clone(), headers.clone())
            .await;
        dead.push(id.to_string());
    }
    // One more that is published, one that is pending: neither is listed.
    let published = app.insert(1).await.remove(0).to_string();
    let claimed = claim_exactly(&app, "", 4).await;
    let mut expected = dead.clone();
    expected.push(published);
    assert_eq!(claimed_ids(&claimed), expected);
    ack_all(&app, "", &claimed[3..]).await;
    app.insert(1).await;
    // Dead-lettered last first: the list follows sequence, not dead-letter time.
    for i in [2, 0, 1] {
        dead_letter(&app, "", &claimed[i..=i], &format!("error {i}")).await;
    }

    let page = app.list_dead_letters(dead_letters("")).await;
    assert_eq!(listed(&page), dead, "in sequence order");
    assert!(page.next_page_token.is_empty(), "one page");
    assert_eq!(
        listed(&app.list_dead_letters(dead_letters("default")).await),
        dead,
        "the empty name is the default outbox"
    );
    for (i, letter) in page.dead_letters.iter().enumerate() {
        let (aggregate, event_type, payload, headers) = &events[i];
        let message = letter.message.as_ref().expect("the message");
        let row = app.row(&message.id).await;
        assert_eq!(message.aggregate_id, *aggregate);
        assert_eq!(message.event_type, *event_type);
        let stored: Value =
            serde_json::from_slice(&message.payload).expect("the payload is JSON text");
        assert_eq!(&stored, payload);
        let expected_headers: BTreeMap<String, String> =
            serde_json::from_value(headers.clone()).expect("string headers");
        let got_headers: BTreeMap<String, String> = message.headers.clone().into_iter().collect();
        assert_eq!(got_headers, expected_headers);
        assert_eq!(
            message.sequence,
            seq_of(&app, DEFAULT_TABLE, &message.id).await
        );
        assert_eq!(message.attempt, 1, "the row's count of attempts");
        assert_eq!(time(message.created_at), row.created_at);
        assert_eq!(letter.last_error, format!("error {i}"));
        assert_eq!(
            time(letter.dead_lettered_at),
            row.dead_lettered_at.expect("dead-lettered")
        );
    }
}

#[tokio::test]
async fn dead_letters_are_filtered_by_aggregate_as_text() {
    let app = TestApp::spawn().await;
    let ids = produce_all(
        &app,
        DEFAULT_TABLE,
        &["order-1", "order-10", "order-1", "order-2", "ORDER-1"],
    )
    .await;
    claim_and_dead_letter(&app, "", 5).await;
    // A pending event of the aggregate is not a dead letter.
    produce(&app, DEFAULT_TABLE, "order-1").await;

    let only = async |aggregate: &str| {
        let page = app
            .list_dead_letters(ListDeadLettersRequest {
                aggregate_id: aggregate.into(),
                ..dead_letters("")
            })
            .await;
        assert!(page.next_page_token.is_empty(), "one page");
        listed(&page)
    };
    assert_eq!(only("order-1").await, [ids[0].as_str(), &ids[2]]);
    assert_eq!(only("order-10").await, [ids[1].as_str()]);
    assert_eq!(only("order-2").await, [ids[3].as_str()]);
    assert_eq!(only("ORDER-1").await, [ids[4].as_str()]);
    assert!(only("order-3").await.is_empty());
    assert!(only("order-%").await.is_empty(), "no pattern matching");

    // The filter holds across pages.
    let pages = dead_letter_pages(
        &app,
        ListDeadLettersRequest {
            aggregate_id: "order-1".into(),
            page_size: 1,
            ..dead_letters("")
        },
    )
    .await;
    assert_paged(&pages, 1, &[ids[0].clone(), ids[2].clone()]);
}

#[tokio::test]
async fn dead_letters_page_in_sequence_order_without_gaps_or_repeats() {
    let app = TestApp::spawn().await;
    let ids = app.insert(5).await;
    claim_and_dead_letter(&app, "", 5).await;

    let first = ListDeadLettersRequest {
        page_size: 2,
        ..dead_letters("")
    };
    let pages = dead_letter_pages(&app, first.clone()).await;
    assert_paged(&pages, 2, &strings(&ids));
    assert_eq!(
        pages
            .iter()
            .map(|(items, _)| items.len())
            .collect::<Vec<_>>(),
        [2, 2, 1]
    );

    // A token asked again gives the same page.
    let again = app
        .list_dead_letters(ListDeadLettersRequest {
            page_token: pages[0].1.clone(),
            ..first
        })
        .await;
    assert_eq!(listed(&again), pages[1].0);
}

#[tokio::test]
async fn a_page_token_resumes_after_the_last_dead_letter_seen_when_earlier_ones_leave() {
    // The operator's loop: list a page, redrive or discard what is on it, ask
    // for the next page. Nothing after the page may be skipped.
    let app = TestApp::spawn().await;
    let ids = strings(&app.insert(6).await);
    claim_and_dead_letter(&app, "", 6).await;

    let first = app
        .list_dead_letters(ListDeadLettersRequest {
            page_size: 2,
            ..dead_letters("")
        })
        .await;
    assert_eq!(listed(&first), ids[..2]);
    assert_eq!(app.discard("", &ids[..1]).await, 1);
    assert_eq!(app.redrive(redrive_ids("", &ids[1..2])).await, 1);

    let pages = dead_letter_pages(
        &app,
        ListDeadLettersRequest {
            page_size: 2,
            page_token: first.next_page_token,
            ..dead_letters("")
        },
    )
    .await;
    assert_paged(&pages, 2, &ids[2..]);
}

#[tokio::test]
async fn page_size_zero_is_a_page_of_one_hundred() {
    let app = TestApp::spawn().await;
    let ids = strings(&app.insert(101).await);
    claim_and_dead_letter(&app, "", 101).await;

    let pages = dead_letter_pages(&app, dead_letters("")).await;
    assert_paged(&pages, 100, &ids);
    assert_eq!(pages.len(), 2, "100 then 1");
}

#[tokio::test]
async fn dead_letters_of_an_ordered_outbox_are_listed_too() {
    let app = spawn_ordered().await;
    let ids = produce_all(&app, ORDERED_TABLE, &["b", "a", "b"]).await;
    let claimed = claim_and_dead_letter(&app, ORDERED, 2).await;
    let mut heads = claimed_ids(&claimed);
    heads.sort_by_key(|id| ids.iter().position(|i| i == id));
    assert_eq!(heads, ids[..2], "the heads of b and a");
    assert_eq!(all_dead_letters(&app, ORDERED).await, ids[..2]);
    assert!(
        all_dead_letters(&app, "").await.is_empty(),
        "the default outbox has none"
    );
}

// ---- ListBlockedKeys ----

#[tokio::test]
async fn blocked_keys_name_their_head_when_it_was_dead_lettered_and_what_it_holds() {
    let app = spawn_ordered().await;
    let ids = produce_all(
        &app,
        ORDERED_TABLE,
        &["zeta", "alpha", "calm", "zeta", "alpha", "zeta"],
    )
    .await;
    let (zeta, alpha, calm) = (&ids[0], &ids[1], &ids[2]);
    let heads = claim_exactly(&app, ORDERED, 3).await;
    let mut by_id: BTreeMap<String, Claimed> = heads
        .into_iter()
        .map(|c| (c.message.id.clone(), c))
        .collect();
    assert_eq!(
        by_id.keys().collect::<HashSet<_>>(),
        HashSet::from([zeta, alpha, calm]),
        "one head per aggregate"
    );
    dead_letter(&app, ORDERED, &[by_id[alpha].clone()], "alpha failed").await;
    dead_letter(&app, ORDERED, &[by_id[zeta].clone()], "zeta failed").await;
    ack_all(&app, ORDERED, &[by_id.remove(calm).expect("calm's head")]).await;

    let page = app.list_blocked_keys(blocked_keys(ORDERED)).await;
    assert!(page.next_page_token.is_empty(), "one page");
    assert_eq!(
        blocked(&page),
        [
            ("zeta".to_owned(), zeta.clone(), 2),
            ("alpha".to_owned(), alpha.clone(), 1)
        ],
        "in the order of their heads' sequence"
    );
    for key in &page.blocked_keys {
        assert_eq!(
            time(key.blocked_since),
            dead_lettered_at(&app, ORDERED_TABLE, &key.head_message_id).await,
            "blocked since its head was dead-lettered"
        );
    }
    let stats = app.stats_of(ORDERED).await;
    assert_eq!(stats.blocked_keys, 2);
    assert_eq!(stats.dead_lettered, 2);

    // The held events stay held; another aggregate goes on.
    assert!(
        nothing_claimable(&app, ORDERED).await,
        "zeta and alpha held"
    );
    let next = produce(&app, ORDERED_TABLE, "calm").await;
    deliver_next(&app, ORDERED, &next).await;
    assert!(nothing_claimable(&app, ORDERED).await, "still held");
    assert_eq!(
        blocked(&app.list_blocked_keys(blocked_keys(ORDERED)).await).len(),
        2
    );
}

#[tokio::test]
async fn blocked_keys_page_in_head_order() {
    let app = spawn_ordered().await;
    let keys = ["k4", "k2", "k0", "k3", "k1"];
    let heads = produce_all(&app, ORDERED_TABLE, &keys).await;
    // One held event each, and two for the last key.
    produce_all(&app, ORDERED_TABLE, &keys).await;
    produce(&app, ORDERED_TABLE, "k1").await;
    claim_and_dead_letter(&app, ORDERED, 5).await;

    let expected: Vec<(String, String, u64)> = keys
        .iter()
        .zip(&heads)
        .map(|(k, h)| (k.to_string(), h.clone(), if *k == "k1" { 2 } else { 1 }))
        .collect();
    let pages = blocked_key_pages(
        &app,
        ListBlockedKeysRequest {
            page_size: 2,
            ..blocked_keys(ORDERED)
        },
    )
    .await;
    assert_paged(&pages, 2, &expected);
    assert_eq!(
        pages
            .iter()
            .map(|(items, _)| items.len())
            .collect::<Vec<_>>(),
        [2, 2, 1]
    );
    let all = app.list_blocked_keys(blocked_keys(ORDERED)).await;
    assert_eq!(blocked(&all), expected, "page_size 0: all of them at once");
    assert!(all.next_page_token.is_empty());
}

#[tokio::test]
async fn no_keys_are_blocked_on_unordered_or_parking_outboxes() {
    let app = spawn_ordered().await;
    produce_all(&app, DEFAULT_TABLE, &["a", "a"]).await;
    claim_and_dead_letter(&app, "", 2).await;
    let parked = produce_all(&app, PARKED_TABLE, &["a", "a"]).await;
    let head = claim_and_dead_letter(&app, PARKED, 1).await;
    assert_eq!(claimed_ids(&head), parked[..1]);

    for outbox in ["", PARKED] {
        let page = app.list_blocked_keys(blocked_keys(outbox)).await;
        assert!(page.blocked_keys.is_empty(), "{outbox:?}: {page:?}");
        assert!(page.next_page_token.is_empty());
        let stats = app.stats_of(outbox).await;
        assert_eq!(stats.blocked_keys, 0, "{outbox:?}");
        assert_eq!(blocked_age(&stats), 0.0, "{outbox:?}");
    }
    assert_eq!(app.stats_of("").await.dead_lettered, 2);
    assert_eq!(app.stats_of(PARKED).await.dead_lettered, 1);
    // Parked: the aggregate went on with its next event.
    deliver_next(&app, PARKED, &parked[1]).await;
    assert_eq!(all_dead_letters(&app, PARKED).await, parked[..1]);
}

// ---- Redrive ----

#[tokio::test]
async fn redrive_by_ids_requeues_only_dead_letters_with_attempts_reset_and_sequence_kept() {
    let app = TestApp::spawn().await;
    let ids = strings(&app.insert(5).await);
    let (dead, done) = (&ids[..4], &ids[4]);
    // Two deliveries each before they are dead-lettered.
    let first = claim_exactly(&app, "", 5).await;
    ack_all(&app, "", &first[4..]).await;
    for c in &first[..4] {
        assert_eq!(
            app.nack_retry(&c.lease, &[&c.message.id], Some(Duration::ZERO))
                .await,
            [OK]
        );
    }
    let second = claim_exactly(&app, "", 4).await;
    assert!(second.iter().all(|c| c.message.attempt == 2));
    dead_letter(&app, "", &second, "poison").await;
    let leased = strings(&app.insert(1).await).remove(0);
    assert_eq!(
        claimed_ids(&claim_exactly(&app, "", 1).await),
        [leased.as_str()]
    );
    let pending = strings(&app.insert(1).await).remove(0);

    let sequences: Vec<i64> = {
        let mut s = Vec::new();
        for id in dead {
            s.push(seq_of(&app, DEFAULT_TABLE, id).await);
        }
        s
    };
    let untouched = [&dead[1], &dead[3], done, &pending, &leased];
    let mut before = Vec::new();
    for id in untouched {
        before.push(row_state(&app, DEFAULT_TABLE, id).await);
    }

    let redriven = app
        .redrive(redrive_ids(
            "",
            &[
                dead[0].clone(),
                dead[2].clone(),
                done.clone(),
                pending.clone(),
                leased.clone(),
                Uuid::new_v4().to_string(),
            ],
        ))
        .await;
    assert_eq!(redriven, 2, "only the dead letters count");

    let now = app.db_now().await;
    for (i, id) in [(0, &dead[0]), (2, &dead[2])] {
        let row = app.row(id).await;
        assert_eq!(row.dead_lettered_at, None, "{id} is no dead letter now");
        assert_eq!(row.row_attempts, 0, "{id}'s attempts are reset");
        assert!(row.available_at <= now, "{id} is available now");
        assert_eq!(seq_of(&app, DEFAULT_TABLE, id).await, sequences[i]);
    }
    for (id, state) in untouched.iter().zip(&before) {
        assert_eq!(
            &row_state(&app, DEFAULT_TABLE, id).await,
            state,
            "{id} untouched"
        );
    }
    assert_eq!(
        all_dead_letters(&app, "").await,
        [dead[1].clone(), dead[3].clone()]
    );
    assert_eq!(app.stats().await.dead_lettered, 2);

    // Delivered again in sequence order, as first deliveries.
    let again = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch_ids(&again), [dead[0].as_str(), &dead[2], &pending]);
    for (m, i) in again.messages.iter().zip([0, 2]) {
        assert_eq!(m.attempt, 1, "{} is a first delivery again", m.id);
        assert_eq!(m.sequence, sequences[i], "{} keeps its sequence", m.id);
    }
}

#[tokio::test]
async fn redrive_by_aggregate_or_all_requeues_those_dead_letters() {
    let app = TestApp::spawn().await;
    let ids = produce_all(&app, DEFAULT_TABLE, &["x", "y", "x", "z", "xx"]).await;
    claim_and_dead_letter(&app, "", 5).await;

    assert_eq!(app.redrive(redrive_aggregate("", "x")).await, 2);
    assert_eq!(
        all_dead_letters(&app, "").await,
        [ids[1].clone(), ids[3].clone(), ids[4].clone()]
    );
    assert_eq!(app.redrive(redrive_aggregate("", "nobody")).await, 0);
    assert_eq!(app.redrive(redrive_aggregate("", "x")).await, 0, "once");
    let x = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch_ids(&x), [ids[0].as_str(), &ids[2]]);

    assert_eq!(app.redrive(redrive_all("")).await, 3);
    assert!(all_dead_letters(&app, "").await.is_empty());
    assert_eq!(app.stats().await.dead_lettered, 0);
    assert_eq!(app.redrive(redrive_all("")).await, 0, "none left");
    let rest = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch_ids(&rest), [ids[1].as_str(), &ids[3], &ids[4]]);
    assert!(rest.messages.iter().all(|m| m.attempt == 1));
}

#[tokio::test]
async fn redrive_resumes_a_blocked_aggregate_with_its_head_first() {
    let app = spawn_ordered().await;
    let ids = produce_all(&app, ORDERED_TABLE, &["a", "b", "a", "b", "a"]).await;
    let (a, b) = ([&ids[0], &ids[2], &ids[4]], [&ids[1], &ids[3]]);
    let heads = claim_and_dead_letter(&app, ORDERED, 2).await;
    let head_of_a = heads
        .iter()
        .find(|c| c.message.id == *a[0])
        .expect("a's head was claimed")
        .message
        .clone();
    assert_eq!(app.stats_of(ORDERED).await.blocked_keys, 2);

    assert_eq!(app.redrive(redrive_aggregate(ORDERED, "a")).await, 1);
    assert_eq!(
        blocked(&app.list_blocked_keys(blocked_keys(ORDERED)).await),
        [("b".to_owned(), b[0].to_string(), 1)]
    );
    let again = deliver_next(&app, ORDERED, a[0]).await;
    assert_eq!(again.attempt, 1, "attempts were reset");
    assert_eq!(again.sequence, head_of_a.sequence, "same sequence");
    deliver_next(&app, ORDERED, a[1]).await;
    deliver_next(&app, ORDERED, a[2]).await;
    assert!(nothing_claimable(&app, ORDERED).await, "b is still held");

    assert_eq!(app.redrive(redrive_all(ORDERED)).await, 1);
    assert!(
        app.list_blocked_keys(blocked_keys(ORDERED))
            .await
            .blocked_keys
            .is_empty()
    );
    let stats = app.stats_of(ORDERED).await;
    assert_eq!(stats.blocked_keys, 0);
    assert_eq!(stats.dead_lettered, 0);
    deliver_next(&app, ORDERED, b[0]).await;
    deliver_next(&app, ORDERED, b[1]).await;
}

#[tokio::test]
async fn redrive_by_ids_unblocks_an_ordered_aggregate() {
    let app = spawn_ordered().await;
    let ids = produce_all(&app, ORDERED_TABLE, &["a", "a"]).await;
    claim_and_dead_letter(&app, ORDERED, 1).await;
    // The held event is no dead letter: naming it redrives nothing.
    assert_eq!(app.redrive(redrive_ids(ORDERED, &ids[1..])).await, 0);
    assert_eq!(app.stats_of(ORDERED).await.blocked_keys, 1);
    assert_eq!(app.redrive(redrive_ids(ORDERED, &ids)).await, 1);
    deliver_next(&app, ORDERED, &ids[0]).await;
    deliver_next(&app, ORDERED, &ids[1]).await;
}

#[tokio::test]
async fn a_redriven_event_waits_while_a_later_event_of_its_aggregate_is_leased() {
    // Under poison=park the aggregate went on past its parked head; redriving
    // the head makes it the head again, but never while a later event of the
    // aggregate is out under a live lease.
    let app = spawn_ordered().await;
    let ids = produce_all(&app, PARKED_TABLE, &["a", "a"]).await;
    let parked = claim_and_dead_letter(&app, PARKED, 1).await;
    assert_eq!(claimed_ids(&parked), ids[..1]);
    let out = claim_exactly(&app, PARKED, 1).await;
    assert_eq!(claimed_ids(&out), ids[1..]);

    assert_eq!(app.redrive(redrive_ids(PARKED, &ids[..1])).await, 1);
    assert!(
        nothing_claimable(&app, PARKED).await,
        "the redriven head waits for the leased event"
    );
    ack_all(&app, PARKED, &out).await;
    let again = deliver_next(&app, PARKED, &ids[0]).await;
    assert_eq!(again.attempt, 1);
}

// ---- Discard ----

#[tokio::test]
async fn discarded_dead_letters_are_never_delivered_again() {
    let app = TestApp::spawn().await;
    let ids = strings(&app.insert(3).await);
    claim_and_dead_letter(&app, "", 3).await;
    let pending = strings(&app.insert(1).await).remove(0);
    let pending_before = row_state(&app, DEFAULT_TABLE, &pending).await;
    let kept_before = row_state(&app, DEFAULT_TABLE, &ids[2]).await;
    assert_eq!(app.stats().await.dead_lettered, 3);

    let discarded = app
        .discard(
            "",
            &[
                ids[0].clone(),
                ids[1].clone(),
                pending.clone(),
                Uuid::new_v4().to_string(),
            ],
        )
        .await;
    assert_eq!(discarded, 2, "only the dead letters count");
    assert!(is_discarded(&app, DEFAULT_TABLE, &ids[0]).await);
    assert!(is_discarded(&app, DEFAULT_TABLE, &ids[1]).await);
    assert_eq!(
        row_state(&app, DEFAULT_TABLE, &pending).await,
        pending_before
    );
    assert_eq!(row_state(&app, DEFAULT_TABLE, &ids[2]).await, kept_before);
    assert_eq!(all_dead_letters(&app, "").await, ids[2..]);
    let stats = app.stats().await;
    assert_eq!(stats.dead_lettered, 1, "discarded ones are not counted");
    assert_eq!(stats.pending, 1, "nor pending");

    // Gone for good: not again, not by Redrive.
    assert_eq!(app.discard("", &ids[..1]).await, 0, "already discarded");
    assert_eq!(app.redrive(redrive_ids("", &ids[..2])).await, 0);
    assert_eq!(app.redrive(redrive_all("")).await, 1, "the one kept");
    assert!(!is_discarded(&app, DEFAULT_TABLE, &ids[2]).await);
    let rest = app.claim("w", 10, secs(30), Duration::ZERO).await;
    assert_eq!(batch_ids(&rest), [ids[2].as_str(), &pending]);
    assert!(all_dead_letters(&app, "").await.is_empty());
    assert_eq!(app.stats().await.dead_lettered, 0);
}

#[tokio::test]
async fn discard_resumes_a_blocked_aggregate_with_its_next_event() {
    let app = spawn_ordered().await;
    let ids = produce_all(&app, ORDERED_TABLE, &["a", "a", "a"]).await;
    claim_and_dead_letter(&app, ORDERED, 1).await;
    assert_eq!(
        blocked(&app.list_blocked_keys(blocked_keys(ORDERED)).await),
        [("a".to_owned(), ids[0].clone(), 2)]
    );
    // A held event is no dead letter: naming it discards nothing.
    assert_eq!(app.discard(ORDERED, &ids[1..2]).await, 0);

    assert_eq!(app.discard(ORDERED, &ids[..1]).await, 1);
    assert!(
        app.list_blocked_keys(blocked_keys(ORDERED))
            .await
            .blocked_keys
            .is_empty()
    );
    let stats = app.stats_of(ORDERED).await;
    assert_eq!((stats.blocked_keys, stats.dead_lettered), (0, 0));
    deliver_next(&app, ORDERED, &ids[1]).await;
    deliver_next(&app, ORDERED, &ids[2]).await;
    assert!(
        nothing_claimable(&app, ORDERED).await,
        "the head never comes back"
    );
    assert!(all_dead_letters(&app, ORDERED).await.is_empty());
}

#[tokio::test]
async fn discarded_dead_letters_go_with_retention_and_others_stay() {
    let app = TestApp::spawn_with(|args| {
        args.set("--retention", "1s")
            .set("--retention-interval", "200ms");
    })
    .await;
    let ids = strings(&app.insert(2).await);
    claim_and_dead_letter(&app, "", 2).await;
    assert_eq!(app.discard("", &ids[..1]).await, 1);
    wait_until(
        secs(10),
        "retention deletes the discarded row",
        async || app.row_in(DEFAULT_TABLE, &ids[0]).await.is_none(),
    )
    .await;
    assert!(
        app.row_in(DEFAULT_TABLE, &ids[1]).await.is_some(),
        "a dead letter not discarded is kept"
    );
    assert_eq!(all_dead_letters(&app, "").await, ids[1..]);
}

// ---- with the rest of outboxd: max attempts, other outboxes, waiting claims ----

#[tokio::test]
async fn a_head_nacked_at_max_attempts_blocks_and_is_listed_with_its_attempts() {
    let app = TestApp::spawn_with(|args| {
        args.add(
            "--outbox",
            "orders=public.orders_outbox:ordering=aggregate:max_attempts=2",
        );
    })
    .await;
    let ids = produce_all(&app, ORDERED_TABLE, &["a", "a"]).await;
    // The nack of the last attempt dead-letters the head.
    for (attempt, outcome) in [(1, OK), (2, DEAD_LETTERED)] {
        let claimed = claim_exactly(&app, ORDERED, 1).await;
        assert_eq!(claimed_ids(&claimed), ids[..1], "the head, again");
        assert_eq!(claimed[0].message.attempt, attempt);
        let outcomes = app
            .nack(NackRequest {
                outbox: ORDERED.into(),
                lease_id: claimed[0].lease.clone(),
                message_ids: claimed_ids(&claimed),
                error: "broker said no".into(),
                retry_after: dur(Duration::ZERO),
                ..NackRequest::default()
            })
            .await;
        assert_eq!(outcomes, [outcome], "attempt {attempt}");
    }
    assert_eq!(app.stats_of(ORDERED).await.dead_lettered, 1);

    let page = app.list_dead_letters(dead_letters(ORDERED)).await;
    assert_eq!(listed(&page), ids[..1]);
    let letter = &page.dead_letters[0];
    assert_eq!(letter.message.as_ref().expect("message").attempt, 2);
    assert!(
        letter.last_error.contains("broker said no"),
        "the last error: {:?}",
        letter.last_error
    );
    assert_eq!(
        blocked(&app.list_blocked_keys(blocked_keys(ORDERED)).await),
        [("a".to_owned(), ids[0].clone(), 1)]
    );
    assert!(
        nothing_claimable(&app, ORDERED).await,
        "the next event is held"
    );

    assert_eq!(app.redrive(redrive_ids(ORDERED, &ids[..1])).await, 1);
    let again = deliver_next(&app, ORDERED, &ids[0]).await;
    assert_eq!(again.attempt, 1, "a fresh count of attempts");
    deliver_next(&app, ORDERED, &ids[1]).await;
}

#[tokio::test]
async fn admin_calls_reach_only_the_outbox_they_name() {
    let app = spawn_ordered().await;
    let plain = produce_all(&app, DEFAULT_TABLE, &["a", "b"]).await;
    claim_and_dead_letter(&app, "", 2).await;
    let ordered = produce_all(&app, ORDERED_TABLE, &["a", "b"]).await;
    claim_and_dead_letter(&app, ORDERED, 2).await;
    let before = app.snapshot("outbox").await;

    // Ids and aggregates of the default outbox mean nothing in the ordered one.
    assert_eq!(app.discard(ORDERED, &plain).await, 0);
    assert_eq!(app.redrive(redrive_ids(ORDERED, &plain)).await, 0);
    assert_eq!(app.snapshot("outbox").await, before);
    assert_eq!(app.redrive(redrive_aggregate(ORDERED, "a")).await, 1);
    assert_eq!(app.redrive(redrive_all(ORDERED)).await, 1);
    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "the default outbox untouched"
    );
    assert_eq!(all_dead_letters(&app, "").await, plain);
    assert!(all_dead_letters(&app, ORDERED).await.is_empty());
    assert_eq!(app.stats().await.dead_lettered, 2);

    let mut delivered = claimed_ids(&claim_exactly(&app, ORDERED, 2).await);
    delivered.sort_by_key(|id| ordered.iter().position(|o| o == id));
    assert_eq!(delivered, ordered);
}

/// A claim on `outbox` that waits (up to 15 s), started once it has looked
/// and found nothing; a poll interval of 30 s means only a wake-up answers it early.
async fn waiting_claim(
    app: &TestApp,
    outbox: &str,
    table: &str,
) -> tokio::task::JoinHandle<Result<outboxd::grpc::pb::ClaimBatchResponse, Status>> {
    let claims = app.count_claims(table).await;
    let waiter = app.spawn_claim(claim_request(outbox, "w-wait", 10, secs(60), secs(15)));
    wait_until(secs(5), "the claim has looked and waits", async || {
        claims.get().await >= 1
    })
    .await;
    assert!(!waiter.is_finished(), "nothing to claim yet");
    waiter
}

#[tokio::test]
async fn redrive_and_discard_wake_a_waiting_claim() {
    let app = TestApp::spawn_with(|args| {
        with_ordered(args);
        args.set("--poll-interval", "30s")
            .set("--health-interval", "1m");
    })
    .await;
    let plain = strings(&app.insert(1).await);
    claim_and_dead_letter(&app, "", 1).await;
    let ordered = produce_all(&app, ORDERED_TABLE, &["a", "a"]).await;
    claim_and_dead_letter(&app, ORDERED, 1).await;

    let waiter = waiting_claim(&app, "", DEFAULT_TABLE).await;
    let started = Instant::now();
    assert_eq!(app.redrive(redrive_all("")).await, 1);
    let batch = within(secs(5), "the claim woken by Redrive", waiter)
        .await
        .expect("waiter task")
        .expect("ClaimBatch");
    assert_eq!(
        batch_ids(&batch),
        plain,
        "answered {:?} after Redrive",
        started.elapsed()
    );

    let waiter = waiting_claim(&app, ORDERED, ORDERED_TABLE).await;
    assert_eq!(app.discard(ORDERED, &ordered[..1]).await, 1);
    let batch = within(secs(5), "the claim woken by Discard", waiter)
        .await
        .expect("waiter task")
        .expect("ClaimBatch");
    assert_eq!(
        batch_ids(&batch),
        ordered[1..],
        "the event behind the discarded head"
    );
}

// ---- bad requests ----

/// The default outbox with two dead letters, a pending event and a leased
/// one, so a request that slipped through validation would change something:
/// (app, the dead letters' ids, a snapshot of the table).
async fn app_with_dead_letters() -> (TestApp, Vec<String>, String) {
    let app = TestApp::spawn().await;
    let dead = strings(&app.insert(2).await);
    claim_and_dead_letter(&app, "", 2).await;
    app.insert(2).await;
    app.claim("w", 1, secs(300), Duration::ZERO).await;
    let before = app.snapshot("outbox").await;
    (app, dead, before)
}

/// `ids` and a thousand more: over the limit of ids in one request.
fn too_many(ids: &[String]) -> Vec<String> {
    ids.iter()
        .cloned()
        .chain((0..1000).map(|_| Uuid::new_v4().to_string()))
        .collect()
}

fn too_long() -> [String; 2] {
    // Bytes, not characters: 513 two-byte characters are 1026 bytes.
    ["x".repeat(1025), "é".repeat(513)]
}

#[tokio::test]
async fn malformed_redrive_requests_are_refused_and_change_nothing() {
    let (app, dead, before) = app_with_dead_letters().await;
    let dead_ids = || dead.clone();

    for none in [
        RedriveRequest::default(),
        RedriveRequest {
            outbox: "default".into(),
            all: false,
            aggregate_id: String::new(),
            message_ids: Vec::new(),
        },
    ] {
        assert_invalid(app.try_redrive(none).await, &["message_ids"]);
    }
    let two_or_three = [
        (
            RedriveRequest {
                message_ids: dead_ids(),
                aggregate_id: "agg-0".into(),
                ..RedriveRequest::default()
            },
            &["message_ids", "aggregate_id"][..],
        ),
        (
            RedriveRequest {
                message_ids: dead_ids(),
                all: true,
                ..RedriveRequest::default()
            },
            &["message_ids", "all"][..],
        ),
        (
            RedriveRequest {
                aggregate_id: "agg-0".into(),
                all: true,
                ..RedriveRequest::default()
            },
            &["aggregate_id", "all"][..],
        ),
        (
            RedriveRequest {
                message_ids: dead_ids(),
                aggregate_id: "agg-0".into(),
                all: true,
                ..RedriveRequest::default()
            },
            &["message_ids", "aggregate_id", "all"][..],
        ),
    ];
    for (req, fields) in two_or_three {
        let result = app.try_redrive(req).await;
        // One sentence: the conflict is said once, not once per field.
        let message = result.as_ref().err().map(|s| s.message().to_owned());
        assert!(
            message
                .as_deref()
                .is_some_and(|m| m.matches("exactly one").count() == 1),
            "{message:?}"
        );
        assert_invalid(result, fields);
    }
    assert_invalid(
        app.try_redrive(redrive_ids("", &[dead[0].as_str(), "not-a-uuid"]))
            .await,
        &["message_ids[1]"],
    );
    assert_invalid(
        app.try_redrive(redrive_ids("", &[dead[0].as_str(), ""]))
            .await,
        &["message_ids[1]"],
    );
    let too_many = too_many(&dead);
    assert_invalid(
        app.try_redrive(redrive_ids("", &too_many)).await,
        &["message_ids"],
    );
    for aggregate in too_long() {
        assert_invalid(
            app.try_redrive(redrive_aggregate("", &aggregate)).await,
            &["aggregate_id"],
        );
    }

    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "refused redrives changed nothing"
    );
}

#[tokio::test]
async fn malformed_discard_requests_are_refused_and_change_nothing() {
    let (app, dead, before) = app_with_dead_letters().await;
    assert_invalid(app.try_discard("", &[] as &[&str]).await, &["message_ids"]);
    assert_invalid(
        app.try_discard("", &[dead[0].as_str(), "nope"]).await,
        &["message_ids[1]"],
    );
    let too_many = too_many(&dead);
    assert_invalid(app.try_discard("", &too_many).await, &["message_ids"]);

    assert_eq!(
        app.snapshot("outbox").await,
        before,
        "refused discards changed nothing"
    );
}

#[tokio::test]
async fn malformed_list_requests_are_refused_and_change_nothing() {
    let (app, dead, before) = app_with_dead_letters().await;
    let list = async |req: ListDeadLettersRequest| app.try_list_dead_letters(req).await;
    assert_invalid(
        list(ListDeadLettersRequest {
            page_size: 1001,
            ..dead_letters("")
        })
        .await,
        &["page_size"],
    );
    for token in ["garbage", "AAAA", "%%%", "\u{1F4A9}"] {
        assert_invalid(
            list(ListDeadLettersRequest {
                page_token: token.into(),
                ..dead_letters("")
            })
            .await,
            &["page_token"],
        );
    }
    for aggregate in too_long() {
        assert_invalid(
            list(ListDeadLettersRequest {
                aggregate_id: aggregate,
                ..dead_letters("")
            })
            .await,
            &["aggregate_id"],
        );
    }
    let blocked = async |req: ListBlockedKeysRequest| app.try_list_blocked_keys(req).await;
    assert_invalid(
        blocked(ListBlockedKeysRequest {
            page_size: 1001,
            ..blocked_keys("")
        })
        .await,
        &["page_size"],
    );
    for token in ["garbage", "AAAA"] {
        assert_invalid(
            blocked(ListBlockedKeysRequest {
                page_token: token.into(),
                ..blocked_keys("")
            })
            .await,
            &["page_token"],
        );
    }

    // The limits themselves are allowed.
    let at_limit = app
        .list_dead_letters(ListDeadLettersRequest {
            page_size: 1000,
            ..dead_letters("")
        })
        .await;
    assert_eq!(listed(&at_limit), dead);
    for aggregate in ["x".repeat(1024), "é".repeat(512)] {
        let page = app
            .list_dead_letters(ListDeadLettersRequest {
                aggregate_id: aggregate,
                ..dead_letters("")
            })
            .await;
        assert!(page.dead_letters.is_empty());
    }
    app.list_blocked_keys(ListBlockedKeysRequest {
        page_size: 1000,
        ..blocked_keys("")
    })
    .await;
    assert_eq!(app.snapshot("outbox").await, before);
}

#[tokio::test]
async fn an_unknown_outbox_is_not_found_for_every_admin_rpc() {
    let (app, dead, before) = app_with_dead_letters().await;
    assert_not_found(
        app.try_list_dead_letters(dead_letters("nope")).await,
        "ListDeadLetters",
    );
    assert_not_found(
        app.try_list_blocked_keys(blocked_keys("nope")).await,
        "ListBlockedKeys",
    );
    for req in [
        redrive_ids("nope", &dead),
        redrive_aggregate("nope", "agg-0"),
        redrive_all("nope"),
    ] {
        assert_not_found(app.try_redrive(req).await, "Redrive");
    }
    assert_not_found(app.try_discard("nope", &dead).await, "Discard");
    assert_eq!(app.snapshot("outbox").await, before);
}

// ---- GetStats and the gauges ----

/// `oldest_blocked_age` in seconds; unset reads as zero, as proto3 readers do.
fn blocked_age(stats: &outboxd::grpc::pb::GetStatsResponse) -> f64 {
    stats
        .oldest_blocked_age
        .map_or(0.0, |age| seconds(Some(age)))
}

/// Two blocked aggregates of the ordered outbox, `a` blocked for ten minutes
/// (by the database clock) and `b` just now; each holds one event.
async fn two_blocked_keys(app: &TestApp) -> Vec<String> {
    let ids = produce_all(app, ORDERED_TABLE, &["a", "b", "a", "b"]).await;
    claim_and_dead_letter(app, ORDERED, 2).await;
    app.db
        .execute(&format!(
            "UPDATE {ORDERED_TABLE} SET dead_lettered_at = now() - interval '10 minutes' \
             WHERE id = '{}'",
            ids[0]
        ))
        .await;
    ids
}

#[tokio::test]
async fn stats_count_blocked_keys_and_the_age_of_the_oldest() {
    let app = spawn_ordered().await;
    let ids = two_blocked_keys(&app).await;
    let stats = app.stats_of(ORDERED).await;
    assert_eq!(stats.blocked_keys, 2);
    let age = blocked_age(&stats);
    assert!((600.0..630.0).contains(&age), "blocked ~10 min ago: {age}");
    let keys = app.list_blocked_keys(blocked_keys(ORDERED)).await;
    assert_eq!(
        time(keys.blocked_keys[0].blocked_since),
        dead_lettered_at(&app, ORDERED_TABLE, &ids[0]).await
    );

    assert_eq!(app.discard(ORDERED, &ids[..1]).await, 1);
    let stats = app.stats_of(ORDERED).await;
    assert_eq!(stats.blocked_keys, 1);
    let age = blocked_age(&stats);
    assert!(age < 60.0, "only b is blocked, since just now: {age}");

    assert_eq!(app.redrive(redrive_all(ORDERED)).await, 1);
    let stats = app.stats_of(ORDERED).await;
    assert_eq!(stats.blocked_keys, 0);
    assert_eq!(blocked_age(&stats), 0.0, "0 when nothing is blocked");

    // Dead letters of an unordered outbox block nothing.
    app.insert(1).await;
    claim_and_dead_letter(&app, "", 1).await;
    let stats = app.stats().await;
    assert_eq!((stats.dead_lettered, stats.blocked_keys), (1, 0));
    assert_eq!(blocked_age(&stats), 0.0);
}

async fn gauge_reaches(
    app: &TestApp,
    name: &str,
    outbox: &str,
    what: &str,
    check: impl Fn(f64) -> bool,
) {
    wait_until(secs(10), what, async || {
        gauge(&app.scrape().await, name, outbox).is_some_and(&check)
    })
    .await;
}

const GAUGES: [&str; 3] = [
    "outbox_blocked_keys",
    "outbox_oldest_blocked_key_age_seconds",
    "outbox_commit_order_holdback_seconds",
];

#[tokio::test]
async fn blocked_keys_and_their_age_are_gauges_per_outbox() {
    let app = TestApp::spawn_with(|args| {
        with_ordered(args);
        args.set("--metrics-interval", "100ms");
    })
    .await;
    two_blocked_keys(&app).await;
    gauge_reaches(
        &app,
        "outbox_blocked_keys",
        ORDERED,
        "two blocked keys",
        |v| v == 2.0,
    )
    .await;
    gauge_reaches(
        &app,
        "outbox_oldest_blocked_key_age_seconds",
        ORDERED,
        "blocked ~10 min ago",
        |v| (600.0..630.0).contains(&v),
    )
    .await;

    let body = app.scrape().await;
    for name in GAUGES {
        assert!(
            body.contains(&format!("# TYPE {name} gauge")),
            "{name} is a gauge"
        );
        for outbox in ["default", ORDERED, PARKED] {
            assert!(
                gauge(&body, name, outbox).is_some(),
                "{name}{{outbox={outbox:?}}} is exposed"
            );
        }
    }
    for name in GAUGES {
        assert_eq!(gauge(&body, name, "default"), Some(0.0), "{name} unordered");
    }
    assert_eq!(gauge(&body, "outbox_blocked_keys", PARKED), Some(0.0));

    assert_eq!(app.redrive(redrive_all(ORDERED)).await, 2);
    gauge_reaches(&app, "outbox_blocked_keys", ORDERED, "none blocked", |v| {
        v == 0.0
    })
    .await;
    gauge_reaches(
        &app,
        "outbox_oldest_blocked_key_age_seconds",
        ORDERED,
        "no age",
        |v| v == 0.0,
    )
    .await;
}

#[tokio::test]
async fn a_long_open_writer_shows_as_commit_order_holdback() {
    let app = TestApp::spawn_with(|args| {
        with_ordered(args);
        args.set("--metrics-interval", "100ms");
    })
    .await;
    // A transaction with an xid, open while an ordered event commits: the
    // event may not be handed out before it ends.
    let mut writer = app.pool().begin().await.expect("begin a writer");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *writer)
        .await
        .expect("take an xid");
    let event = produce(&app, ORDERED_TABLE, "a").await;
    gauge_reaches(
        &app,
        "outbox_commit_order_holdback_seconds",
        ORDERED,
        "the holdback grows past 0.5 s",
        |v| v > 0.5,
    )
    .await;
    assert!(
        nothing_claimable(&app, ORDERED).await,
        "the event waits for the writer"
    );
    assert_eq!(
        gauge(
            &app.scrape().await,
            "outbox_commit_order_holdback_seconds",
            "default"
        ),
        Some(0.0),
        "unordered outboxes hold nothing back"
    );

    writer.commit().await.expect("the writer ends");
    // Back to zero with no claim to move the guard on: the gauge is no stale alarm.
    gauge_reaches(
        &app,
        "outbox_commit_order_holdback_seconds",
        ORDERED,
        "the holdback is over",
        |v| v == 0.0,
    )
    .await;
    deliver_next(&app, ORDERED, &event).await;
}

#[tokio::test]
async fn a_long_open_writer_in_another_database_holds_nothing_back() {
    let app = spawn_ordered().await;
    let elsewhere = TestDb::create().await;
    let mut writer = elsewhere.pool.begin().await.expect("begin a writer");
    sqlx::query("SELECT pg_current_xact_id()")
        .execute(&mut *writer)
        .await
        .expect("take an xid");
    let event = produce(&app, ORDERED_TABLE, "a").await;
    deliver_next(&app, ORDERED, &event).await;
    writer.rollback().await.expect("the writer ends");
}

// ---- reflection ----

#[tokio::test]
async fn reflection_lists_and_describes_the_admin_service_and_health_names_it() {
    use prost::Message as _;
    use tonic_reflection::pb::v1::{
        ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
        server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
    };

    let app = TestApp::spawn().await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", app.addr))
        .expect("a URI")
        .connect()
        .await
        .expect("connect a reflection client");
    let mut client = ServerReflectionClient::new(channel);
    let ask = |request: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::iter([
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(
                "outbox.v1.OutboxAdmin".into(),
            )),
        ]))
        .await
        .expect("ServerReflectionInfo")
        .into_inner();

    let listed = answers.message().await.expect("an answer").expect("a list");
    let Some(MessageResponse::ListServicesResponse(list)) = listed.message_response else {
        panic!("not a service list: {listed:?}");
    };
    let names: Vec<&str> = list.service.iter().map(|s| s.name.as_str()).collect();
    assert!(names.contains(&"outbox.v1.OutboxAdmin"), "{names:?}");
    assert!(names.contains(&"outbox.v1.OutboxService"), "{names:?}");

    let file = answers.message().await.expect("an answer").expect("a file");
    let Some(MessageResponse::FileDescriptorResponse(files)) = file.message_response else {
        panic!("not a file descriptor: {file:?}");
    };
    let admin = files
        .file_descriptor_proto
        .iter()
        .map(|bytes| prost_types::FileDescriptorProto::decode(bytes.as_slice()).expect("a file"))
        .flat_map(|f| f.service)
        .find(|s| s.name() == "OutboxAdmin")
        .expect("the file defines OutboxAdmin");
    let methods: Vec<&str> = admin.method.iter().map(|m| m.name()).collect();
    assert_eq!(
        methods,
        [
            "ListDeadLetters",
            "ListBlockedKeys",
            "Redrive",
            "Discard",
            "GetDatabaseReport",
            "InspectMessage",
            "ListOutboxes"
        ]
    );

    assert_eq!(
        app.health_of("outbox.v1.OutboxAdmin")
            .await
            .expect("Health/Check"),
        ServingStatus::Serving,
        "health answers for the admin service like for the API"
    );
}

// ---- InspectMessage and ListOutboxes (#35) ----

fn inspect(outbox: &str, id: &str) -> outboxd::grpc::pb::InspectMessageRequest {
    outboxd::grpc::pb::InspectMessageRequest {
        outbox: outbox.into(),
        message_id: id.into(),
    }
}

#[tokio::test]
async fn inspect_follows_an_event_from_pending_through_leased_to_dead_lettered_and_published() {
    let app = spawn_ordered().await;
    let mut admin = app.admin().await;
    let id = produce(&app, DEFAULT_TABLE, "agg-1").await;
    let state = |r: &outboxd::grpc::pb::InspectMessageResponse| r.state.clone();

    let pending = admin
        .inspect_message(inspect("", &id))
        .await
        .expect("inspect")
        .into_inner();
    assert_eq!(state(&pending), "pending");
    let m = pending.message.clone().expect("the event");
    assert_eq!(
        (
            m.id.as_str(),
            m.aggregate_id.as_str(),
            m.event_type.as_str()
        ),
        (id.as_str(), "agg-1", "test.event")
    );
    assert_eq!(m.attempt, 0, "not delivered yet");
    assert!(pending.leased_until.is_none() && pending.published_at.is_none());
    assert!(pending.available_at.is_some() && m.created_at.is_some());

    let claimed = claim_exactly(&app, "default", 1).await;
    let leased = admin
        .inspect_message(inspect("default", &id))
        .await
        .expect("inspect")
        .into_inner();
    assert_eq!(state(&leased), "leased");
    assert!(leased.leased_until.is_some(), "{leased:?}");
    assert_eq!(leased.leased_by, "w-admin");
    assert_eq!(leased.message.expect("event").attempt, 1);

    dead_letter(&app, "default", &claimed, "boom").await;
    let dead = admin
        .inspect_message(inspect("default", &id))
        .await
        .expect("inspect")
        .into_inner();
    assert_eq!(state(&dead), "dead_lettered");
    assert_eq!(dead.last_error, "boom");
    assert!(dead.dead_lettered_at.is_some() && dead.leased_until.is_none());

    admin
        .redrive(redrive_ids("default", &[&id]))
        .await
        .expect("redrive");
    let again = claim_exactly(&app, "default", 1).await;
    ack_all(&app, "default", &again).await;
    let published = admin
        .inspect_message(inspect("default", &id))
        .await
        .expect("inspect")
        .into_inner();
    assert_eq!(state(&published), "published");
    assert!(published.published_at.is_some() && published.dead_lettered_at.is_none());
}

#[tokio::test]
async fn inspect_shows_a_discarded_event_as_discarded() {
    let app = spawn_ordered().await;
    let mut admin = app.admin().await;
    let id = produce(&app, DEFAULT_TABLE, "agg-1").await;
    claim_and_dead_letter(&app, "default", 1).await;
    let discarded = admin
        .discard(outboxd::grpc::pb::DiscardRequest {
            outbox: "default".into(),
            message_ids: vec![id.clone()],
        })
        .await
        .expect("discard")
        .into_inner();
    assert_eq!(discarded.discarded, 1);
    let r = admin
        .inspect_message(inspect("default", &id))
        .await
        .expect("inspect")
        .into_inner();
    assert_eq!(r.state, "discarded");
    assert!(r.discarded_at.is_some());
}

#[tokio::test]
async fn inspect_refuses_a_bad_id_and_an_unknown_outbox_or_id() {
    let app = spawn_ordered().await;
    let mut admin = app.admin().await;
    for bad in ["", "not-a-uuid"] {
        assert_invalid(
            admin.inspect_message(inspect("default", bad)).await,
            &["message_id"],
        );
    }
    let id = Uuid::new_v4().to_string();
    assert_not_found(
        admin.inspect_message(inspect("nope", &id)).await,
        "InspectMessage",
    );
    let status = admin
        .inspect_message(inspect("default", &id))
        .await
        .expect_err("no such id");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
    assert!(status.message().contains(&id), "names the id: {status:?}");
    // An event of another outbox is not this outbox's.
    let other = produce(&app, ORDERED_TABLE, "agg-1").await;
    let status = admin
        .inspect_message(inspect("default", &other))
        .await
        .expect_err("another outbox's");
    assert_eq!(status.code(), tonic::Code::NotFound, "{status:?}");
}

#[tokio::test]
async fn list_outboxes_names_each_outbox_with_its_table_and_policy_in_configuration_order() {
    let app = spawn_ordered().await;
    let listed = app
        .admin()
        .await
        .list_outboxes(outboxd::grpc::pb::ListOutboxesRequest {})
        .await
        .expect("list")
        .into_inner()
        .outboxes;
    let got: Vec<(&str, &str, &str, &str)> = listed
        .iter()
        .map(|o| {
            (
                o.name.as_str(),
                o.table.as_str(),
                o.ordering.as_str(),
                o.poison.as_str(),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("default", DEFAULT_TABLE, "none", ""),
            (ORDERED, ORDERED_TABLE, "aggregate", "block"),
            (PARKED, PARKED_TABLE, "aggregate", "park"),
        ]
    );
}

#[tokio::test]
async fn inspect_and_list_outboxes_need_an_admin_token_when_auth_is_on() {
    let admin_token = format!("{}", Uuid::new_v4().simple());
    let relay_token = format!("{}", Uuid::new_v4().simple());
    let orders_token = format!("{}", Uuid::new_v4().simple());
    let dir = std::env::temp_dir().join(format!("outboxd-admin-{}", Uuid::new_v4()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    let file = dir.join("tokens");
    let line = |name: &str, token: &str, scope: &str| {
        format!(
            "{name} sha256:{} {scope}\n",
            hex::encode(outboxd::auth::token_digest(token))
        )
    };
    std::fs::write(
        &file,
        line("ops", &admin_token, "admin:*")
            + line("relay", &relay_token, "relay:*").as_str()
            + line("orders-ops", &orders_token, "admin:orders").as_str(),
    )
    .expect("write the tokens file");
    let app = TestApp::spawn_with(|args| {
        args.set("--auth-tokens", file.to_str().expect("UTF-8 path"));
    })
    .await;
    let id = produce(&app, DEFAULT_TABLE, "agg-1").await;
    let mut admin = app.admin().await;
    let with = |token: Option<&str>, message| {
        let mut request = tonic::Request::new(message);
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII"),
            );
        }
        request
    };
    for token in [None, Some(relay_token.as_str())] {
        let code = admin
            .inspect_message(with(token, inspect("default", &id)))
            .await
            .expect_err("refused")
            .code();
        assert!(
            matches!(
                code,
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ),
            "{code:?}"
        );
        let mut request = tonic::Request::new(outboxd::grpc::pb::ListOutboxesRequest {});
        if let Some(token) = token {
            request.metadata_mut().insert(
                "authorization",
                format!("Bearer {token}").parse().expect("ASCII"),
            );
        }
        let code = admin
            .list_outboxes(request)
            .await
            .expect_err("refused")
            .code();
        assert!(
            matches!(
                code,
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ),
            "{code:?}"
        );
    }
    let r = admin
        .inspect_message(with(Some(&admin_token), inspect("default", &id)))
        .await
        .expect("allowed");
    assert_eq!(r.into_inner().state, "pending");
    let mut request = tonic::Request::new(outboxd::grpc::pb::ListOutboxesRequest {});
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {admin_token}").parse().expect("ASCII"),
    );
    assert_eq!(
        admin
            .list_outboxes(request)
            .await
            .expect("allowed")
            .into_inner()
            .outboxes
            .len(),
        1
    );
    // Any admin scope lists the outboxes: they are configuration, not one outbox's.
    let mut request = tonic::Request::new(outboxd::grpc::pb::ListOutboxesRequest {});
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {orders_token}").parse().expect("ASCII"),
    );
    assert!(
        admin.list_outboxes(request).await.is_ok(),
        "admin:orders lists the outboxes"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Bearer TOKEN` on `message`.
fn with_token<T>(token: &str, message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        "authorization",
        format!("Bearer {token}").parse().expect("ASCII"),
    );
    request
}

/// ListOutboxes and the database report show an operator only the outboxes
/// it holds an admin scope for (a relay scope lists none), count the rest,
/// and a caller with no admin scope at all is refused without naming an
/// outbox it never named (#46).
#[tokio::test]
async fn list_outboxes_and_the_database_report_show_only_the_callers_admin_outboxes() {
    use outboxd::grpc::pb::{GetDatabaseReportRequest, ListOutboxesRequest};
    let dir = crate::support::pki::TempDir::new();
    let [orders_ops, ops, relay] = [(); 3].map(|()| format!("{}", Uuid::new_v4().simple()));
    let line = |name: &str, token: &str, scopes: &str| {
        format!(
            "{name} sha256:{} {scopes}\n",
            hex::encode(outboxd::auth::token_digest(token))
        )
    };
    let tokens = dir.write(
        "tokens",
        [
            line(
                "orders-ops",
                &orders_ops,
                &format!("admin:{ORDERED} relay:default"),
            ),
            line("ops", &ops, "admin:*"),
            line("relay", &relay, "relay:*"),
        ]
        .concat(),
    );
    let app = TestApp::spawn_with(|args| {
        with_ordered(args);
        args.set("--auth-tokens", tokens.as_str())
            .set("--watchdog-interval", "200ms");
    })
    .await;
    let mut admin = app.admin().await;
    let listed = |reply: outboxd::grpc::pb::ListOutboxesResponse| {
        let names: Vec<String> = reply.outboxes.into_iter().map(|o| o.name).collect();
        (names, reply.hidden)
    };
    let some = admin
        .list_outboxes(with_token(&orders_ops, ListOutboxesRequest {}))
        .await
        .expect("an admin scope for one outbox");
    assert_eq!(listed(some.into_inner()), (vec![ORDERED.to_owned()], 2));
    let all = admin
        .list_outboxes(with_token(&ops, ListOutboxesRequest {}))
        .await
        .expect("admin:*");
    assert_eq!(
        listed(all.into_inner()),
        (vec!["default".into(), ORDERED.into(), PARKED.into()], 0)
    );

    // No admin scope: refused, without naming the `default` it did not ask about.
    let refused = admin
        .list_outboxes(with_token(&relay, ListOutboxesRequest {}))
        .await
        .expect_err("relay:* only");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(
        refused.message(),
        r#""relay" has no admin scope for any outbox, which this call needs"#
    );
    let refused = admin
        .get_database_report(with_token(&relay, GetDatabaseReportRequest {}))
        .await
        .expect_err("relay:* only");
    assert!(!refused.message().contains("default"), "{refused:?}");

    // The report's outbox tables: the caller's only.
    let mut report = None;
    wait_until(secs(30), "the watchdog's first sample", async || {
        report = admin
            .get_database_report(with_token(&orders_ops, GetDatabaseReportRequest {}))
            .await
            .ok()
            .map(tonic::Response::into_inner);
        report.is_some()
    })
    .await;
    let report = report.expect("sampled");
    let tables: Vec<&str> = report.tables.iter().map(|t| t.outbox.as_str()).collect();
    assert_eq!(tables, [ORDERED], "{report:?}");
}
