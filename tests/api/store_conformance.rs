//! The store's behaviour, written once against its traits (`OutboxStore`,
//! `Arrivals`, `AdminStore`): every backend runs the same cases, each on a
//! database of its own. A new backend implements `Backend` and adds one line to the list at
//! the bottom.

use std::{sync::Arc, time::Duration};

use outboxd::{
    lease::{
        AckRequest, ClaimRequest, ClaimedBatch, DEFAULT_MAX_CLAIM_BYTES, DEFAULT_MAX_MESSAGE_BYTES,
        ExtendRequest, LeaseId, MessageId, NackRequest, OutboxName, Outcome, PageRequest,
        RedriveSelector, Settled, WorkerId,
    },
    outbox::{Ordering, OutboxPolicy, OutboxSpec, Poison, TableRef},
    store::{self, AdminStore, AdoptMode, Arrivals, ConnectSettings, OutboxStore, PgStore, Store},
};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::support::{TestDb, millis, secs, wait_until};

/// A storage backend under test.
trait Backend {
    type Store: Store;

    /// A store serving `specs` on `db`, its tables ready.
    async fn open(db: &TestDb, specs: &[OutboxSpec]) -> Self::Store;

    /// Does to the lease state of `public.outbox` what a crash of the backend
    /// (or a failover) may do to it. A backend whose leases survive a crash
    /// does nothing here.
    async fn lose_lease_state(db: &TestDb);
}

struct Postgres;

impl Backend for Postgres {
    type Store = PgStore;

    async fn open(db: &TestDb, specs: &[OutboxSpec]) -> PgStore {
        let settings = ConnectSettings {
            options: db.url().parse().expect("a postgres URL"),
            display_url: db.url(),
            max_connections: 8,
            acquire_timeout: secs(5),
            give_up_after: Some(secs(10)),
            statement_timeout: secs(5),
        };
        let pool = store::connect(&settings, &CancellationToken::new())
            .await
            .expect("connect to the test database");
        outboxd::server::MIGRATOR
            .run(&pool)
            .await
            .expect("migrate the test database");
        PgStore::open(pool, specs, AdoptMode::Create)
            .await
            .expect("open the store")
            .with_statement_timeout(secs(5))
    }

    /// The lease table is unlogged: PostgreSQL empties it when it recovers
    /// from a crash, and a promoted replica starts without its rows.
    async fn lose_lease_state(db: &TestDb) {
        db.execute("TRUNCATE public.outbox_leases").await;
    }
}

/// A test database and its store's one outbox (`public.outbox`).
struct Fixture<S: Store> {
    db: Arc<TestDb>,
    outbox: S::Outbox,
}

async fn fixture<B: Backend>(policy: OutboxPolicy) -> Fixture<B::Store> {
    ordered_fixture::<B>(policy, Ordering::None).await
}

async fn ordered_fixture<B: Backend>(
    policy: OutboxPolicy,
    ordering: Ordering,
) -> Fixture<B::Store> {
    let db = TestDb::create().await;
    let spec = OutboxSpec {
        name: OutboxName::DEFAULT.to_owned(),
        table: table(),
        policy,
        ordering,
    };
    let store = B::open(&db, &[spec]).await;
    let outbox = store.outboxes().remove(0);
    Fixture { db, outbox }
}

fn table() -> TableRef {
    TableRef::new("public", "outbox").expect("a valid table name")
}

/// outboxd's default policy, read from its flags (where defaults live).
fn default_policy() -> OutboxPolicy {
    use clap::Parser as _;
    let cli =
        outboxd::config::Cli::try_parse_from(["outboxd", "--database-url", "postgres://db/app"])
            .expect("the default flags parse");
    let config = cli.serve.validate().expect("the default flags are valid");
    config.database.outboxes[0].policy.clone()
}

fn policy(max_attempts: u32, retention: Duration) -> OutboxPolicy {
    OutboxPolicy {
        max_attempts,
        retention,
        ..default_policy()
    }
}

/// The producer's side: one INSERT of `n` events, committed. Returns their
/// ids in insert order.
async fn produce(db: &TestDb, n: usize) -> Vec<Uuid> {
    let ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload) \
         SELECT id, 'order-1', 'order.created', '{}' FROM unnest($1::uuid[]) WITH ORDINALITY AS t(id, n) \
         ORDER BY n",
    )
    .bind(&ids)
    .execute(&db.pool)
    .await
    .expect("insert events");
    ids
}

/// One committed INSERT of an event per aggregate named, in that order.
async fn produce_for(db: &TestDb, aggregates: &[&str]) -> Vec<Uuid> {
    let ids: Vec<Uuid> = aggregates.iter().map(|_| Uuid::new_v4()).collect();
    sqlx::query(
        "INSERT INTO outbox (id, aggregate_id, event_type, payload) \
         SELECT id, aggregate, 'order.changed', '{}' \
         FROM unnest($1::uuid[], $2::text[]) WITH ORDINALITY AS t(id, aggregate, n) ORDER BY n",
    )
    .bind(&ids)
    .bind(aggregates)
    .execute(&db.pool)
    .await
    .expect("insert events");
    ids
}

fn page(size: u32, after: Option<i64>) -> PageRequest {
    PageRequest { size, after }
}

fn claim(max_messages: u32, lease: Duration) -> ClaimRequest {
    ClaimRequest {
        outbox: OutboxName::from_wire(""),
        worker_id: WorkerId::parse("conformance").expect("a valid worker id"),
        max_messages,
        lease,
        wait: Duration::ZERO,
        max_bytes: DEFAULT_MAX_CLAIM_BYTES,
        max_event_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
        acks: Vec::new(),
    }
}

fn message_ids(ids: &[Uuid]) -> Vec<MessageId> {
    ids.iter().copied().map(MessageId::from).collect()
}

fn ack(lease_id: LeaseId, ids: &[Uuid]) -> AckRequest {
    AckRequest {
        outbox: OutboxName::from_wire(""),
        lease_id,
        message_ids: message_ids(ids),
    }
}

fn nack(lease_id: LeaseId, ids: &[Uuid], retry_after: Option<Duration>) -> NackRequest {
    NackRequest {
        outbox: OutboxName::from_wire(""),
        lease_id,
        message_ids: message_ids(ids),
        error: "the broker refused it".to_owned(),
        retry_after,
        dead_letter: false,
    }
}

fn extend(lease_id: LeaseId, ids: &[Uuid], lease: Duration) -> ExtendRequest {
    ExtendRequest {
        outbox: OutboxName::from_wire(""),
        lease_id,
        message_ids: message_ids(ids),
        lease,
    }
}

fn ids_of(batch: &ClaimedBatch) -> Vec<Uuid> {
    batch.messages.iter().map(|m| m.id).collect()
}

fn outcomes(settled: &Settled) -> Vec<Outcome> {
    settled.results.iter().map(|r| r.outcome).collect()
}

/// Claims until a claim hands out something, for rows whose lease or backoff
/// runs out by the store's clock.
async fn claim_when_due<O: OutboxStore>(
    outbox: &O,
    what: &str,
    req: &ClaimRequest,
) -> ClaimedBatch {
    let mut batch = None;
    wait_until(secs(15), what, async || {
        let claimed = outbox.claim(req).await.expect("claim");
        let found = !claimed.messages.is_empty();
        batch = Some(claimed);
        found
    })
    .await;
    batch.expect("claimed")
}

mod cases {
    use super::*;

    pub async fn leases_lost_in_a_crash_fence_their_settles_and_free_their_rows<B: Backend>() {
        let f = fixture::<B>(default_policy()).await;
        let ids = produce(&f.db, 3).await;
        let first = f.outbox.claim(&claim(2, secs(60))).await.expect("claim");
        assert_eq!(ids_of(&first), ids[..2]);

        B::lose_lease_state(&f.db).await;

        let leased: Vec<Uuid> = ids_of(&first);
        let refused = f
            .outbox
            .ack(&ack(first.lease_id, &leased))
            .await
            .expect("ack");
        let lost = Outcome::LeaseLost;
        assert!(outcomes(&refused).iter().all(|o| *o == lost), "{refused:?}");
        let extended = f
            .outbox
            .extend(&extend(first.lease_id, &leased, secs(60)))
            .await
            .expect("extend");
        assert!(outcomes(&extended).iter().all(|o| *o == lost));

        let again = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        assert_eq!(
            ids_of(&again),
            ids,
            "every row is claimable again, in order"
        );
        let acked = f.outbox.ack(&ack(again.lease_id, &ids)).await.expect("ack");
        assert!(outcomes(&acked).iter().all(|o| *o == Outcome::Ok));
        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!((stats.pending, stats.in_flight), (0, 0));
    }

    pub async fn the_probed_sequence_moves_with_every_insert_committed_or_not<B: Backend>() {
        let f = fixture::<B>(default_policy()).await;
        assert!(f.outbox.probeable());
        let start = f.outbox.sequence().await.expect("probe");
        produce(&f.db, 2).await;
        let committed = f.outbox.sequence().await.expect("probe");
        assert!(committed >= start + 2, "{start} -> {committed}");

        let mut tx = f.db.pool.begin().await.expect("begin");
        sqlx::query(
            "INSERT INTO outbox (id, aggregate_id, event_type, payload) VALUES ($1, 'a', 'e', '{}')",
        )
        .bind(Uuid::new_v4())
        .execute(&mut *tx)
        .await
        .expect("insert");
        let uncommitted = f.outbox.sequence().await.expect("probe");
        assert!(
            uncommitted > committed,
            "an insert moves it before its commit"
        );
        tx.rollback().await.expect("rollback");
        assert_eq!(
            f.outbox.sequence().await.expect("probe"),
            uncommitted,
            "a rollback does not move it back"
        );
    }

    pub async fn claim_hands_out_rows_in_sequence_order_and_fences_them_from_a_second_claim<
        B: Backend,
    >() {
        let f = fixture::<B>(default_policy()).await;
        let ids = produce(&f.db, 5).await;

        let first = f.outbox.claim(&claim(3, secs(60))).await.expect("claim");
        assert_eq!(ids_of(&first), ids[..3], "the oldest rows, in insert order");
        assert!(
            first
                .messages
                .windows(2)
                .all(|m| m[0].sequence < m[1].sequence)
        );
        assert!(first.messages.iter().all(|m| m.attempt == 1));
        assert!(first.expires_at.is_some());

        let second = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        assert_eq!(
            ids_of(&second),
            ids[3..],
            "only the rows the first lease does not hold"
        );
        assert_ne!(second.lease_id, first.lease_id);

        let third = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        assert!(third.messages.is_empty() && third.expires_at.is_none());
    }

    pub async fn an_ack_under_a_lost_lease_is_refused_and_changes_nothing<B: Backend>() {
        let f = fixture::<B>(default_policy()).await;
        let ids = produce(&f.db, 1).await;
        let lost = f.outbox.claim(&claim(1, millis(200))).await.expect("claim");
        assert_eq!(ids_of(&lost), ids);

        let held = claim_when_due(
            &f.outbox,
            "the expired lease's row is claimed again",
            &claim(1, secs(60)),
        )
        .await;
        assert_eq!(ids_of(&held), ids);
        assert_eq!(held.messages[0].attempt, 2);
        assert_eq!(
            held.expired_leases
                .iter()
                .map(|l| l.lease_id)
                .collect::<Vec<_>>(),
            [Some(lost.lease_id.as_uuid())],
            "the claim reports the lease it took the row from"
        );

        let refused = f.outbox.ack(&ack(lost.lease_id, &ids)).await.expect("ack");
        assert_eq!(outcomes(&refused), [Outcome::LeaseLost]);
        assert!(refused.ended.is_empty());
        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.in_flight, stats.published_retained),
            (1, 1, 0)
        );

        let acked = f.outbox.ack(&ack(held.lease_id, &ids)).await.expect("ack");
        assert_eq!(outcomes(&acked), [Outcome::Ok]);
        let again = f.outbox.ack(&ack(held.lease_id, &ids)).await.expect("ack");
        assert_eq!(outcomes(&again), [Outcome::AlreadyDone]);
        let unknown = f
            .outbox
            .ack(&ack(held.lease_id, &[Uuid::new_v4()]))
            .await
            .expect("ack");
        assert_eq!(outcomes(&unknown), [Outcome::NotFound]);
    }

    pub async fn a_nack_retries_after_its_delay_and_dead_letters_at_max_attempts<B: Backend>() {
        let f = fixture::<B>(policy(3, secs(3600))).await;
        let ids = produce(&f.db, 1).await;

        let first = f.outbox.claim(&claim(1, secs(60))).await.expect("claim");
        let nacked = f
            .outbox
            .nack(&nack(first.lease_id, &ids, Some(secs(2))))
            .await
            .expect("nack");
        assert_eq!(outcomes(&nacked), [Outcome::Ok]);
        let early = f.outbox.claim(&claim(1, secs(60))).await.expect("claim");
        assert!(early.messages.is_empty(), "the row waits out its delay");
        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!((stats.pending, stats.in_flight), (1, 0));

        let second = claim_when_due(&f.outbox, "the nacked row is due", &claim(1, secs(60))).await;
        assert_eq!(
            (ids_of(&second), second.messages[0].attempt),
            (ids.clone(), 2)
        );
        let nacked = f
            .outbox
            .nack(&nack(second.lease_id, &ids, Some(Duration::ZERO)))
            .await
            .expect("nack");
        assert_eq!(outcomes(&nacked), [Outcome::Ok]);

        let third = claim_when_due(&f.outbox, "the row is due at once", &claim(1, secs(60))).await;
        assert_eq!(third.messages[0].attempt, 3);
        let last = f
            .outbox
            .nack(&nack(third.lease_id, &ids, Some(Duration::ZERO)))
            .await
            .expect("nack");
        assert_eq!(
            outcomes(&last),
            [Outcome::DeadLettered],
            "the third of three attempts"
        );
        assert!(last.ended.iter().all(|l| l.dead_lettered));

        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!((stats.pending, stats.dead_lettered), (0, 1));
        let none = f.outbox.claim(&claim(1, secs(60))).await.expect("claim");
        assert!(
            none.messages.is_empty(),
            "a dead letter is never handed out"
        );
    }

    pub async fn extend_moves_the_expiry_of_rows_still_under_the_lease<B: Backend>() {
        let f = fixture::<B>(default_policy()).await;
        let ids = produce(&f.db, 2).await;
        let batch = f.outbox.claim(&claim(2, secs(2))).await.expect("claim");
        let claimed_until = batch.expires_at.expect("an expiry");

        let extended = f
            .outbox
            .extend(&extend(batch.lease_id, &ids[..1], secs(60)))
            .await
            .expect("extend");
        assert_eq!(outcomes(&extended), [Outcome::Ok]);
        let until = extended.expires_at.expect("a new expiry");
        assert!(
            until - claimed_until > chrono::Duration::seconds(50),
            "{claimed_until} → {until}"
        );

        let all = f
            .outbox
            .extend(&extend(batch.lease_id, &[], secs(120)))
            .await
            .expect("extend");
        assert_eq!(
            outcomes(&all),
            [Outcome::Ok, Outcome::Ok],
            "no ids: every row under the lease"
        );
        assert!(all.expires_at.expect("a new expiry") > until);

        let stranger = f
            .outbox
            .extend(&extend(LeaseId::generate(), &ids, secs(60)))
            .await
            .expect("extend");
        assert_eq!(
            outcomes(&stranger),
            [Outcome::LeaseLost, Outcome::LeaseLost]
        );
        assert!(stranger.expires_at.is_none());
        let unknown = f
            .outbox
            .extend(&extend(batch.lease_id, &[Uuid::new_v4()], secs(60)))
            .await
            .expect("extend");
        assert_eq!(outcomes(&unknown), [Outcome::NotFound]);
    }

    pub async fn stats_count_pending_in_flight_dead_and_retained_rows<B: Backend>() {
        let f = fixture::<B>(default_policy()).await;
        let ids = produce(&f.db, 4).await;
        let batch = f.outbox.claim(&claim(2, secs(60))).await.expect("claim");
        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.in_flight, stats.dead_lettered),
            (4, 2, 0)
        );

        let mut dead = nack(batch.lease_id, &ids[..1], None);
        dead.dead_letter = true;
        assert_eq!(
            outcomes(&f.outbox.nack(&dead).await.expect("nack")),
            [Outcome::DeadLettered]
        );
        assert_eq!(
            outcomes(
                &f.outbox
                    .ack(&ack(batch.lease_id, &ids[1..2]))
                    .await
                    .expect("ack")
            ),
            [Outcome::Ok]
        );

        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!(
            (
                stats.pending,
                stats.in_flight,
                stats.dead_lettered,
                stats.published_retained
            ),
            (2, 0, 1, 1)
        );
        let gauges = f.outbox.gauges().await.expect("gauges");
        assert_eq!(
            (
                gauges.pending,
                gauges.in_flight,
                gauges.dead_lettered,
                gauges.published_retained
            ),
            (2, 0, 1, 0),
            "gauges leave retained history uncounted"
        );
    }

    pub async fn inspect_reads_one_event_in_each_state_and_none_for_an_unknown_id<B: Backend>() {
        use outboxd::lease::MessageState;
        let f = fixture::<B>(default_policy()).await;
        let ids = produce(&f.db, 3).await;
        let state = |m: &Option<outboxd::lease::InspectedMessage>| m.as_ref().map(|m| m.state());
        let id = MessageId::from;
        let seen = f.outbox.inspect(id(ids[0])).await.expect("inspect");
        assert_eq!(state(&seen), Some(MessageState::Pending));
        let seen = seen.expect("the event");
        assert_eq!((seen.message.id, seen.message.attempt), (ids[0], 0));

        let batch = f.outbox.claim(&claim(2, secs(60))).await.expect("claim");
        let leased = f.outbox.inspect(id(ids[0])).await.expect("inspect");
        assert_eq!(state(&leased), Some(MessageState::Leased));
        let leased = leased.expect("the event");
        assert!(leased.leased_until.is_some() && leased.leased_by.is_some());
        assert_eq!(leased.message.attempt, 1, "one delivery");

        let mut dead = nack(batch.lease_id, &ids[..1], None);
        dead.dead_letter = true;
        dead.error = "poison".into();
        f.outbox.nack(&dead).await.expect("nack");
        f.outbox
            .ack(&ack(batch.lease_id, &ids[1..2]))
            .await
            .expect("ack");
        let dead = f.outbox.inspect(id(ids[0])).await.expect("inspect");
        assert_eq!(state(&dead), Some(MessageState::DeadLettered));
        assert_eq!(dead.and_then(|d| d.last_error).as_deref(), Some("poison"));
        let published = f.outbox.inspect(id(ids[1])).await.expect("inspect");
        assert_eq!(state(&published), Some(MessageState::Published));
        assert_eq!(
            f.outbox
                .discard(&message_ids(&ids[..1]))
                .await
                .expect("discard"),
            1
        );
        let discarded = f.outbox.inspect(id(ids[0])).await.expect("inspect");
        assert_eq!(state(&discarded), Some(MessageState::Discarded));
        assert_eq!(
            state(&f.outbox.inspect(id(ids[2])).await.expect("inspect")),
            Some(MessageState::Pending)
        );
        assert!(
            f.outbox
                .inspect(id(Uuid::new_v4()))
                .await
                .expect("inspect")
                .is_none()
        );
    }

    pub async fn retention_purges_only_published_rows_older_than_the_retention<B: Backend>() {
        let f = fixture::<B>(policy(10, secs(2))).await;
        let ids = produce(&f.db, 3).await;
        let batch = f.outbox.claim(&claim(2, secs(60))).await.expect("claim");
        f.outbox
            .ack(&ack(batch.lease_id, &ids[..1]))
            .await
            .expect("ack");
        let mut dead = nack(batch.lease_id, &ids[1..2], None);
        dead.dead_letter = true;
        f.outbox.nack(&dead).await.expect("nack");

        wait_until(
            secs(15),
            "the published row outlives its retention and is purged",
            async || {
                f.outbox.purge_published(100).await.expect("purge");
                f.outbox.stats().await.expect("stats").published_retained == 0
            },
        )
        .await;
        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!(
            (stats.pending, stats.dead_lettered),
            (1, 1),
            "pending and dead rows stay"
        );

        let young = f.outbox.claim(&claim(1, secs(60))).await.expect("claim");
        f.outbox
            .ack(&ack(young.lease_id, &ids[2..]))
            .await
            .expect("ack");
        assert_eq!(
            f.outbox.purge_published(100).await.expect("purge"),
            0,
            "younger than retention"
        );
        assert_eq!(f.outbox.stats().await.expect("stats").published_retained, 1);

        // A dead letter given up is kept like history, then purged.
        assert_eq!(
            f.outbox
                .discard(&message_ids(&ids[1..2]))
                .await
                .expect("discard"),
            1
        );
        wait_until(
            secs(15),
            "the discarded row outlives its retention and is purged",
            async || {
                f.outbox.purge_published(100).await.expect("purge");
                f.db.scalar_i64(&format!(
                    "SELECT count(*) FROM outbox WHERE id = '{}'",
                    ids[1]
                ))
                .await
                    == 0
            },
        )
        .await;
    }
}

/// Per-aggregate order and the operators' calls (`AdminStore`).
mod ordered_cases {
    use super::*;

    pub async fn an_ordered_outbox_hands_out_each_aggregates_head_alone<B: Backend>() {
        let f = ordered_fixture::<B>(default_policy(), Ordering::Aggregate(Poison::Block)).await;
        let ids = produce_for(&f.db, &["a", "a", "b", "a", "b"]).await;
        let first = claim_when_due(&f.outbox, "the heads", &claim(10, secs(60))).await;
        assert_eq!(
            ids_of(&first),
            [ids[0], ids[2]],
            "one event per aggregate, its first"
        );
        let none = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        assert!(none.messages.is_empty(), "both aggregates are leased");

        f.outbox
            .ack(&ack(first.lease_id, &ids[..1]))
            .await
            .expect("ack");
        let next = claim_when_due(&f.outbox, "a's second", &claim(10, secs(60))).await;
        assert_eq!(ids_of(&next), [ids[1]]);

        // b's head waits out a backoff: b's next event waits with it.
        let held = f
            .outbox
            .nack(&nack(first.lease_id, &ids[2..3], Some(secs(60))))
            .await
            .expect("nack");
        assert_eq!(outcomes(&held), [Outcome::Ok]);
        let none = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        assert!(none.messages.is_empty(), "{:?}", ids_of(&none));
    }

    pub async fn an_expired_head_comes_back_before_its_aggregates_next<B: Backend>() {
        let f = ordered_fixture::<B>(default_policy(), Ordering::Aggregate(Poison::Block)).await;
        let ids = produce_for(&f.db, &["a", "a"]).await;
        let first = claim_when_due(&f.outbox, "a's head", &claim(10, secs(1))).await;
        assert_eq!(ids_of(&first), [ids[0]]);
        let again = claim_when_due(&f.outbox, "the expired head", &claim(10, secs(60))).await;
        assert_eq!(ids_of(&again), [ids[0]], "the head again, alone");
        assert_eq!(again.messages[0].attempt, 2);
        assert_eq!(again.expired_leases.len(), 1);
    }

    pub async fn a_dead_lettered_head_blocks_its_aggregate_until_redriven_or_discarded<
        B: Backend,
    >() {
        let f = ordered_fixture::<B>(default_policy(), Ordering::Aggregate(Poison::Block)).await;
        let ids = produce_for(&f.db, &["a", "a", "b"]).await;
        let first = claim_when_due(&f.outbox, "the heads", &claim(10, secs(60))).await;
        assert_eq!(ids_of(&first), [ids[0], ids[2]]);
        let mut dead = nack(first.lease_id, &ids[..1], None);
        dead.dead_letter = true;
        f.outbox.nack(&dead).await.expect("nack");
        f.outbox
            .ack(&ack(first.lease_id, &ids[2..]))
            .await
            .expect("ack");
        let none = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        assert!(
            none.messages.is_empty(),
            "a is blocked: {:?}",
            ids_of(&none)
        );

        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!((stats.blocked_keys, stats.dead_lettered), (1, 1));
        let blocked = f
            .outbox
            .blocked_keys(page(10, None))
            .await
            .expect("blocked");
        assert_eq!(blocked.items.len(), 1);
        assert_eq!(
            (
                blocked.items[0].aggregate_id.as_str(),
                blocked.items[0].head,
                blocked.items[0].held
            ),
            ("a", ids[0], 1)
        );
        assert_eq!(blocked.next, None);

        let redriven = f
            .outbox
            .redrive(&RedriveSelector::Aggregate("a".into()))
            .await
            .expect("redrive");
        assert_eq!(redriven, 1);
        let head = claim_when_due(&f.outbox, "the redriven head", &claim(10, secs(60))).await;
        assert_eq!(
            ids_of(&head),
            [ids[0]],
            "the head first, not the event behind it"
        );
        assert_eq!(head.messages[0].attempt, 1, "attempts start again");

        let mut dead = nack(head.lease_id, &ids[..1], None);
        dead.dead_letter = true;
        f.outbox.nack(&dead).await.expect("nack");
        assert_eq!(
            f.outbox
                .discard(&message_ids(&ids[1..2]))
                .await
                .expect("discard"),
            0,
            "only dead letters are discarded"
        );
        assert_eq!(
            f.outbox
                .discard(&message_ids(&ids[..1]))
                .await
                .expect("discard"),
            1
        );
        let next = claim_when_due(&f.outbox, "the event behind", &claim(10, secs(60))).await;
        assert_eq!(ids_of(&next), [ids[1]]);
        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!((stats.blocked_keys, stats.dead_lettered), (0, 0));
        assert!(
            f.outbox
                .dead_letters(None, page(10, None))
                .await
                .expect("list")
                .items
                .is_empty(),
            "a discarded event is no longer a dead letter"
        );
    }

    pub async fn under_park_a_dead_lettered_head_lets_its_aggregate_go_on<B: Backend>() {
        let f =
            ordered_fixture::<B>(policy(1, secs(3600)), Ordering::Aggregate(Poison::Park)).await;
        let ids = produce_for(&f.db, &["a", "a"]).await;
        claim_when_due(&f.outbox, "a's head", &claim(10, secs(1))).await;
        // Its one attempt expires: the next claim parks it and goes on.
        let next = claim_when_due(&f.outbox, "a's next event", &claim(10, secs(60))).await;
        assert_eq!(ids_of(&next), [ids[1]]);
        let stats = f.outbox.stats().await.expect("stats");
        assert_eq!((stats.blocked_keys, stats.dead_lettered), (0, 1));
        assert!(
            f.outbox
                .blocked_keys(page(10, None))
                .await
                .expect("blocked")
                .items
                .is_empty()
        );
    }

    pub async fn dead_letters_page_in_sequence_order_and_redrive_by_id_or_all<B: Backend>() {
        let f = fixture::<B>(default_policy()).await;
        let ids = produce_for(&f.db, &["a", "b", "a", "c", "a"]).await;
        let batch = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        let mut dead = nack(batch.lease_id, &ids, None);
        dead.dead_letter = true;
        f.outbox.nack(&dead).await.expect("nack");

        let mut seen = Vec::new();
        let mut after = None;
        let mut pages = 0;
        loop {
            let got = f
                .outbox
                .dead_letters(None, page(2, after))
                .await
                .expect("list");
            pages += 1;
            assert!(got.items.len() <= 2);
            seen.extend(got.items.iter().map(|d| d.message.id));
            assert!(
                got.items
                    .iter()
                    .all(|d| d.last_error == "the broker refused it")
            );
            match got.next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        assert_eq!(seen, ids, "every dead letter once, in sequence order");
        assert_eq!(pages, 3);
        let of_a = f
            .outbox
            .dead_letters(Some("a"), page(10, None))
            .await
            .expect("list");
        let of_a: Vec<Uuid> = of_a.items.iter().map(|d| d.message.id).collect();
        assert_eq!(of_a, [ids[0], ids[2], ids[4]]);

        let two = RedriveSelector::Ids(message_ids(&[ids[1], ids[3]]));
        assert_eq!(f.outbox.redrive(&two).await.expect("redrive"), 2);
        assert_eq!(
            f.outbox.redrive(&two).await.expect("again"),
            0,
            "no longer dead"
        );
        let again = f.outbox.claim(&claim(10, secs(60))).await.expect("claim");
        assert_eq!(ids_of(&again), [ids[1], ids[3]]);
        assert!(again.messages.iter().all(|m| m.attempt == 1));
        assert_eq!(
            f.outbox.redrive(&RedriveSelector::All).await.expect("all"),
            3
        );
        assert_eq!(f.outbox.stats().await.expect("stats").dead_lettered, 0);
    }
}

/// The cases, as tests of one backend.
macro_rules! conformance {
    ($backend:ty) => {
        conformance!($backend:
            claim_hands_out_rows_in_sequence_order_and_fences_them_from_a_second_claim,
            an_ack_under_a_lost_lease_is_refused_and_changes_nothing,
            a_nack_retries_after_its_delay_and_dead_letters_at_max_attempts,
            extend_moves_the_expiry_of_rows_still_under_the_lease,
            stats_count_pending_in_flight_dead_and_retained_rows,
            retention_purges_only_published_rows_older_than_the_retention,
            leases_lost_in_a_crash_fence_their_settles_and_free_their_rows,
            the_probed_sequence_moves_with_every_insert_committed_or_not,
            inspect_reads_one_event_in_each_state_and_none_for_an_unknown_id,
        );
        conformance!(@ordered $backend:
            an_ordered_outbox_hands_out_each_aggregates_head_alone,
            an_expired_head_comes_back_before_its_aggregates_next,
            a_dead_lettered_head_blocks_its_aggregate_until_redriven_or_discarded,
            under_park_a_dead_lettered_head_lets_its_aggregate_go_on,
            dead_letters_page_in_sequence_order_and_redrive_by_id_or_all,
        );
    };
    (@ordered $backend:ty: $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                super::ordered_cases::$case::<$backend>().await;
            }
        )+
    };
    ($backend:ty: $($case:ident),+ $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                super::cases::$case::<$backend>().await;
            }
        )+
    };
}

mod postgres {
    conformance!(super::Postgres);
}
