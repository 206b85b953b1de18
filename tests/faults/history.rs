//! The history checker, one for every case: what the workers saw (claims,
//! deliveries, settle outcomes), what the faults had under lease, and the
//! database's final state, checked against the lease rules of the README:
//!
//! - no event lost: every committed event ends published (and was delivered),
//!   or dead-lettered with a reason;
//! - never two live leases on one row: a row is claimed again only after the
//!   previous lease expired (by the database clock), was released by a nack,
//!   or was forgotten with the whole lease table (what a crash of PostgreSQL
//!   does to it: the next claim may hand the row out again, as the same attempt);
//! - no stale ack accepted: an ack accepted under lease L means nobody claimed
//!   the row after L, neither before the ack (the ack was stale) nor after it
//!   (a published row came back), unless the server itself failed just after
//!   the ack (a crash or a failover may undo outboxd's last writes, which do
//!   not wait for their WAL: a redelivery, never a loss);
//! - duplicates bounded by what was in flight: deliveries of an event never
//!   exceed its claims, and no more events were claimed twice than were under
//!   lease when a fault hit (or nacked, or held past their lease on purpose);
//! - per-aggregate order, for a case whose outbox is ordered
//!   (`ordering=aggregate`, [`check_ordered`]): each aggregate's events are
//!   first handed out in `sequence` order, each only after the previous one
//!   was acked, and a claim holds at most one event of an aggregate.
//!   Redeliveries are not first deliveries: a crash that undoes an ack hands
//!   that event out again after later ones, which the README allows.
//!
//! Times: `start`/`end` are the client's window around each call, from the
//! history's epoch; `claimed_at`/`expires_at` are the database's clock, which
//! is the only clock leases are measured by.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fmt::Write as _,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use chrono::{DateTime, Utc};

/// A settle call's answer for one message. `Unknown`: the call failed, so it
/// may or may not have been applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    AlreadyDone,
    LeaseLost,
    NotFound,
    DeadLettered,
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettleKind {
    Ack,
    Nack,
}

#[derive(Debug, Clone)]
pub struct Claim {
    pub worker: String,
    pub lease_id: String,
    /// Message id and the attempt the server handed it out as.
    pub messages: Vec<(String, u32)>,
    pub start: Duration,
    pub end: Duration,
    /// The claim statement's `now()` and the lease's expiry (database clock).
    pub claimed_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct Settle {
    pub kind: SettleKind,
    pub worker: String,
    pub lease_id: String,
    pub start: Duration,
    pub end: Duration,
    pub outcomes: Vec<(String, Outcome)>,
}

/// One publish of an event: by a worker of the test (under a lease it holds)
/// or as received from the broker (lease unknown).
#[derive(Debug, Clone)]
pub struct Delivery {
    pub message_id: String,
    pub lease_id: Option<String>,
    /// The attempt it was published as, when the broker tells (`x-outbox-attempt`).
    pub attempt: Option<u32>,
    pub at: Duration,
}

/// Everything recorded during a case.
#[derive(Debug, Clone, Default)]
pub struct Recorded {
    pub committed: HashSet<String>,
    pub claims: Vec<Claim>,
    pub settles: Vec<Settle>,
    pub deliveries: Vec<Delivery>,
    pub faults: Vec<(Duration, String)>,
    /// When a fault emptied the lease table, at some moment between the
    /// fault's beginning and its end (a crash comes a moment after the
    /// sampler recorded its beginning): leases taken before then may be
    /// followed by a live lease on the same row, and attempts count from
    /// the row's own number again.
    pub leases_lost: Vec<(Duration, Duration)>,
    /// When the server itself failed (from the fault's beginning to its end):
    /// outboxd's writes shortly before or during it may be undone.
    pub writes_lost: Vec<(Duration, Duration)>,
    /// Events of producer transactions whose commit failed: committed iff
    /// they are in the final table.
    pub in_doubt: HashSet<String>,
    /// Events under a lease while a fault was on (or nacked, or held past their
    /// lease on purpose): the ones allowed to be claimed more than once.
    pub exposed: HashSet<String>,
    /// A client call succeeding after failing: a worker got through again.
    pub recoveries: usize,
    pub failed_calls: usize,
    /// Failed calls by gRPC code.
    pub codes: BTreeMap<String, usize>,
}

/// The recorder, shared by the case's workers, producers and fault injector.
#[derive(Debug, Clone)]
pub struct History {
    epoch: Instant,
    inner: Arc<Mutex<Recorded>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
            inner: Arc::default(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Recorded> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Time since the case began.
    pub fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub fn committed(&self, ids: impl IntoIterator<Item = String>) {
        self.lock().committed.extend(ids);
    }

    /// Events whose commit failed (the server went away mid-commit): they
    /// may or may not have been committed.
    pub fn in_doubt(&self, ids: impl IntoIterator<Item = String>) {
        self.lock().in_doubt.extend(ids);
    }

    pub fn claim(&self, claim: Claim) {
        self.lock().claims.push(claim);
    }

    pub fn settle(&self, settle: Settle) {
        self.lock().settles.push(settle);
    }

    pub fn delivered(&self, message_id: String, lease_id: Option<String>, attempt: Option<u32>) {
        let at = self.now();
        self.lock().deliveries.push(Delivery {
            message_id,
            lease_id,
            attempt,
            at,
        });
    }

    pub fn fault(&self, what: impl Into<String>) {
        let at = self.now();
        self.lock().faults.push((at, what.into()));
    }

    /// A fault that empties the lease table begins.
    pub fn leases_lost(&self, what: impl Into<String>) {
        let at = self.now();
        let mut rec = self.lock();
        rec.faults.push((at, what.into()));
        rec.leases_lost.push((at, Duration::MAX));
    }

    /// The server itself fails (a crash, a failover): the lease table is
    /// lost, and so may be outboxd's last writes, until [`History::fault_over`].
    pub fn server_lost(&self, what: impl Into<String>) {
        let at = self.now();
        let mut rec = self.lock();
        rec.faults.push((at, what.into()));
        rec.leases_lost.push((at, Duration::MAX));
        rec.writes_lost.push((at, Duration::MAX));
    }

    /// The fault that began last is over.
    pub fn fault_over(&self) {
        let at = self.now();
        let mut rec = self.lock();
        let rec = &mut *rec;
        for lost in [&mut rec.leases_lost, &mut rec.writes_lost] {
            if let Some((_, end)) = lost.last_mut()
                && *end == Duration::MAX
            {
                *end = at;
            }
        }
    }

    pub fn expose(&self, ids: impl IntoIterator<Item = String>) {
        self.lock().exposed.extend(ids);
    }

    pub fn call_failed(&self, code: String) {
        let mut rec = self.lock();
        rec.failed_calls += 1;
        *rec.codes.entry(code).or_default() += 1;
    }

    pub fn recovered(&self) {
        self.lock().recoveries += 1;
    }

    pub fn recorded(&self) -> Recorded {
        self.lock().clone()
    }
}

/// A row of the outbox at the end of a case.
#[derive(Debug, Clone)]
pub struct FinalRow {
    /// Its aggregate and `seq`, for the order rule: the table is the one
    /// record of every committed event's place, handed out or not.
    pub aggregate: String,
    pub seq: i64,
    pub published: bool,
    pub dead_lettered: bool,
    pub last_error: Option<String>,
    /// Claims of the row (each claim adds one).
    pub attempts: u32,
    pub lease_id: Option<String>,
}

#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: &'static str,
    pub message_id: String,
    pub detail: String,
}

#[derive(Debug, Clone, Default)]
pub struct Figures {
    pub events: usize,
    pub deliveries: usize,
    pub duplicates: usize,
    pub claimed_twice: usize,
    pub exposed: usize,
    /// Acks refused as LEASE_LOST: stale acks the fencing turned away.
    pub fenced: usize,
    pub dead_lettered: usize,
    pub faults: usize,
    pub recoveries: usize,
    pub failed_calls: usize,
    /// The longest settle call, answered or given up: how long a fault held a client.
    pub slowest_settle: Duration,
    /// Aggregates held to the order rule, and the pairs of successive events
    /// in them it compared (both 0 unless the case is ordered).
    pub aggregates: usize,
    pub ordered_pairs: usize,
}

#[derive(Debug)]
pub struct Verdict {
    pub violations: Vec<Violation>,
    pub figures: Figures,
    /// The violations, each with its message's history in time order.
    pub report: String,
}

/// How long before a server failure outboxd's writes may still be undone by
/// it: they commit without waiting for their WAL (`synchronous_commit =
/// off`), which PostgreSQL's WAL writer flushes (and a standby receives)
/// within three `wal_writer_delay`s (600 ms by default), or sooner when a
/// producer's synchronous commit flushes it; with room for a loaded machine.
const UNDO_WINDOW: Duration = Duration::from_secs(3);

/// Whether a loss (`lost`, some moment from its beginning to its end) may
/// have come between `start` and `end`.
fn lost_between(lost: &[(Duration, Duration)], start: Duration, end: Duration) -> bool {
    lost.iter()
        .any(|(began, ended)| *began <= end && start <= *ended)
}

/// Whether the server failing (`lost`, from its beginning to its end) may
/// have undone a write made during `start..end`.
fn undone_by(lost: &[(Duration, Duration)], start: Duration, end: Duration) -> bool {
    lost.iter()
        .any(|(began, ended)| end.saturating_add(UNDO_WINDOW) >= *began && start <= *ended)
}

fn accepted(outcome: Outcome) -> bool {
    matches!(outcome, Outcome::Ok | Outcome::AlreadyDone)
}

/// A nack that may have released the row (an unknown outcome may have).
fn released(outcome: Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Ok | Outcome::DeadLettered | Outcome::Unknown
    )
}

/// Checks `rec` and the final table against the lease rules.
pub fn check(rec: &Recorded, finals: &HashMap<String, FinalRow>) -> Verdict {
    verdict(rec, finals, false)
}

/// As [`check`], and per-aggregate order: for a case whose outbox is ordered.
pub fn check_ordered(rec: &Recorded, finals: &HashMap<String, FinalRow>) -> Verdict {
    verdict(rec, finals, true)
}

fn verdict(rec: &Recorded, finals: &HashMap<String, FinalRow>, ordered: bool) -> Verdict {
    let mut violations = Vec::new();
    let mut v = |rule: &'static str, id: &str, detail: String| {
        violations.push(Violation {
            rule,
            message_id: id.to_owned(),
            detail,
        });
    };

    // A producer transaction whose commit failed committed iff its rows are there.
    let committed: HashSet<&str> = rec
        .committed
        .iter()
        .chain(rec.in_doubt.iter().filter(|id| finals.contains_key(*id)))
        .map(String::as_str)
        .collect();

    // Per message: its claims (with the attempt), settles and deliveries.
    let mut claims: HashMap<&str, Vec<(u32, &Claim)>> = HashMap::new();
    for c in &rec.claims {
        for (id, attempt) in &c.messages {
            claims.entry(id).or_default().push((*attempt, c));
        }
    }
    for list in claims.values_mut() {
        list.sort_by_key(|(attempt, c)| (*attempt, c.start));
    }
    let mut settles: HashMap<&str, Vec<(Outcome, &Settle)>> = HashMap::new();
    for s in &rec.settles {
        for (id, outcome) in &s.outcomes {
            settles.entry(id).or_default().push((*outcome, s));
        }
    }
    let mut deliveries: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in &rec.deliveries {
        deliveries.entry(&d.message_id).or_default().push(d);
    }

    // No event lost.
    for &id in &committed {
        match finals.get(id) {
            None => v("no event lost", id, "the committed row is gone".into()),
            Some(row) if row.published => {
                let got = deliveries.get(id).map_or(&[][..], Vec::as_slice);
                // The ack that published the row came from the claim that
                // holds it last: that claim's publish must have arrived.
                let under_final = got.iter().any(|d| match (&d.lease_id, d.attempt) {
                    (Some(lease), _) => Some(lease) == row.lease_id.as_ref(),
                    (None, Some(attempt)) => attempt == row.attempts,
                    (None, None) => true,
                });
                if !under_final {
                    v(
                        "no event lost",
                        id,
                        format!(
                            "published under lease {:?} (attempt {}), but never delivered under it",
                            row.lease_id, row.attempts
                        ),
                    );
                }
            }
            Some(row) if row.dead_lettered => {
                if row.last_error.as_deref().is_none_or(str::is_empty) {
                    v("no event lost", id, "dead-lettered without a reason".into());
                }
            }
            Some(_) => v(
                "no event lost",
                id,
                "neither published nor dead-lettered after the drain".into(),
            ),
        }
    }
    for id in deliveries.keys() {
        if !committed.contains(id) {
            v(
                "no event lost",
                id,
                "delivered, but no producer committed it".into(),
            );
        }
    }

    // Never two live leases on one row.
    for (id, list) in &claims {
        let nacks: Vec<&(Outcome, &Settle)> = settles
            .get(id)
            .map(|s| {
                s.iter()
                    .filter(|(o, s)| s.kind == SettleKind::Nack && released(*o))
                    .collect()
            })
            .unwrap_or_default();
        for pair in list.windows(2) {
            let ((a1, c1), (a2, c2)) = (pair[0], pair[1]);
            if c1.lease_id == c2.lease_id {
                continue;
            }
            // The lease table may have been emptied after one of the claims
            // began and before the other ended (which went first is the
            // database's call): the earlier lease may be gone.
            if lost_between(&rec.leases_lost, c1.start.min(c2.start), c1.end.max(c2.end)) {
                continue;
            }
            if a1 == a2 {
                v(
                    "never two live leases",
                    id,
                    format!(
                        "leases {} and {} both handed it out as attempt {a1}",
                        c1.lease_id, c2.lease_id
                    ),
                );
            } else if c2.claimed_at < c1.expires_at
                && !nacks.iter().any(|(_, s)| s.lease_id == c1.lease_id)
            {
                v(
                    "never two live leases",
                    id,
                    format!(
                        "lease {} claimed it at {} while lease {} (not released) was live until {}",
                        c2.lease_id, c2.claimed_at, c1.lease_id, c1.expires_at
                    ),
                );
            }
        }
    }

    // No stale ack accepted: after an ack accepted under L, no claim after
    // L's may exist, before the ack (stale) or after it (re-leased). Claims
    // are ordered by attempt, which counts them, unless the lease table may
    // have been lost between the two: the count then started over, and only
    // the clock tells which came first.
    for (id, list) in &settles {
        for (outcome, s) in list {
            if s.kind != SettleKind::Ack || !accepted(*outcome) {
                continue;
            }
            let mine = claims
                .get(id)
                .and_then(|l| l.iter().find(|(_, c)| c.lease_id == s.lease_id));
            let Some(&(attempt, mine)) = mine else {
                v(
                    "no stale ack accepted",
                    id,
                    format!(
                        "ack accepted under lease {}, which never claimed it",
                        s.lease_id
                    ),
                );
                continue;
            };
            for (later, c) in claims.get(id).into_iter().flatten() {
                if c.lease_id == s.lease_id {
                    continue;
                }
                let after = if lost_between(
                    &rec.leases_lost,
                    c.start.min(mine.start),
                    c.end.max(mine.end),
                ) {
                    c.start >= mine.end
                } else {
                    *later > attempt
                };
                if !after {
                    continue;
                }
                // The server failed just after the ack, which it may have
                // undone, and the row was claimed again once it was back.
                if undone_by(&rec.writes_lost, s.start, s.end)
                    && rec.writes_lost.iter().any(|(began, _)| c.end >= *began)
                {
                    continue;
                }
                let when = if c.end <= s.start {
                    "before the ack: a stale ack was accepted"
                } else if c.start >= s.end {
                    "after the ack: a published row was leased again"
                } else {
                    "while the ack ran"
                };
                v(
                    "no stale ack accepted",
                    id,
                    format!(
                        "ack {outcome:?} under lease {} (attempt {attempt}), yet lease {} claimed it as attempt {later} {when}",
                        s.lease_id, c.lease_id
                    ),
                );
            }
        }
    }

    // Duplicates bounded by what was in flight. Losing the lease table forgets
    // the attempts its leases counted: the row's count can then fall short of
    // its claims, and an attempt number can come round again, so the claims
    // the workers saw bound the deliveries instead.
    let forgot_attempts = !rec.leases_lost.is_empty();
    let mut claimed_twice = Vec::new();
    for (id, row) in finals {
        let delivered = deliveries.get(id.as_str()).map_or(0, Vec::len);
        let claimed = if forgot_attempts {
            (row.attempts as usize).max(claims.get(id.as_str()).map_or(0, Vec::len))
        } else {
            row.attempts as usize
        };
        if delivered > claimed {
            v(
                "duplicates bounded",
                id,
                format!("delivered {delivered} times but claimed only {claimed} times"),
            );
        }
        let mut attempts: Vec<u32> = deliveries
            .get(id.as_str())
            .into_iter()
            .flatten()
            .filter_map(|d| d.attempt)
            .collect();
        attempts.sort_unstable();
        if let Some(twice) = attempts
            .windows(2)
            .find(|w| w[0] == w[1])
            .filter(|_| !forgot_attempts)
        {
            v(
                "duplicates bounded",
                id,
                format!(
                    "published twice as attempt {}: one claim, two deliveries",
                    twice[0]
                ),
            );
        }
        if row.attempts > 1 {
            claimed_twice.push(id.as_str());
        }
    }
    // The brief's bound is a count (no more events claimed twice than were
    // under lease when a fault hit); checked per event, which implies it.
    // A server failure exposes, beside what the sampler saw under lease, what
    // was claimed or settled shortly before it: those writes may be undone.
    let undone: HashSet<&str> = rec
        .claims
        .iter()
        .filter(|c| undone_by(&rec.writes_lost, c.start, c.end))
        .flat_map(|c| c.messages.iter().map(|(id, _)| id.as_str()))
        .chain(
            rec.settles
                .iter()
                .filter(|s| undone_by(&rec.writes_lost, s.start, s.end))
                .flat_map(|s| s.outcomes.iter().map(|(id, _)| id.as_str())),
        )
        .collect();
    let mut outside: Vec<&str> = claimed_twice
        .iter()
        .copied()
        .filter(|id| !rec.exposed.contains(*id) && !undone.contains(id))
        .collect();
    outside.sort_unstable();
    for id in &outside {
        v(
            "duplicates bounded",
            id,
            format!(
                "claimed {} times, yet it was never under lease when a fault hit, nor nacked, \
                 nor held past its lease ({} events claimed more than once, {} exposed)",
                finals[*id].attempts,
                claimed_twice.len(),
                rec.exposed.len(),
            ),
        );
    }

    let (aggregates, ordered_pairs) = if ordered {
        per_aggregate_order(rec, finals, &claims, &settles, &mut v)
    } else {
        (0, 0)
    };

    let delivered_ids = deliveries.len();
    let figures = Figures {
        events: committed.len(),
        deliveries: rec.deliveries.len(),
        duplicates: rec.deliveries.len() - delivered_ids,
        claimed_twice: claimed_twice.len(),
        exposed: rec.exposed.len(),
        fenced: rec
            .settles
            .iter()
            .filter(|s| s.kind == SettleKind::Ack)
            .flat_map(|s| &s.outcomes)
            .filter(|(_, o)| *o == Outcome::LeaseLost)
            .count(),
        dead_lettered: finals.values().filter(|r| r.dead_lettered).count(),
        faults: rec.faults.len(),
        recoveries: rec.recoveries,
        failed_calls: rec.failed_calls,
        slowest_settle: rec
            .settles
            .iter()
            .map(|s| s.end.saturating_sub(s.start))
            .max()
            .unwrap_or_default(),
        aggregates,
        ordered_pairs,
    };
    let report = report(rec, finals, &violations, &claims, &settles, &deliveries);
    Verdict {
        violations,
        figures,
        report,
    }
}

/// Per-aggregate order on what the history knows: a claim's answer came
/// back at `end`, an ack was sent at `start`. An event's first delivery is
/// its earliest claim; later ones are redeliveries (an expired lease, a nack,
/// a lost lease table, an ack a crash undid) and may follow later events.
/// A first claim must not come back before the previous event's first claim
/// was sent, nor before the first ack that may have published it (answered,
/// or failed and perhaps applied) was sent: an ack a crash undid still
/// ordered what went out after it. A previous event dead-lettered (or
/// discarded) let its aggregate go on at a moment the history does not
/// record, so only the first rule holds for it. Returns the aggregates and
/// successive pairs checked.
fn per_aggregate_order(
    rec: &Recorded,
    finals: &HashMap<String, FinalRow>,
    claims: &HashMap<&str, Vec<(u32, &Claim)>>,
    settles: &HashMap<&str, Vec<(Outcome, &Settle)>>,
    v: &mut impl FnMut(&'static str, &str, String),
) -> (usize, usize) {
    const RULE: &str = "per-aggregate order";
    let mut by_aggregate: BTreeMap<&str, Vec<(i64, &str)>> = BTreeMap::new();
    for (id, row) in finals {
        by_aggregate
            .entry(row.aggregate.as_str())
            .or_default()
            .push((row.seq, id.as_str()));
    }
    let first_claim = |id: &str| -> Option<&Claim> {
        claims
            .get(id)?
            .iter()
            .map(|(_, c)| *c)
            .min_by_key(|c| (c.start, c.end))
    };
    let first_ack = |id: &str| -> Option<Duration> {
        settles
            .get(id)?
            .iter()
            .filter(|(o, s)| {
                s.kind == SettleKind::Ack
                    && matches!(o, Outcome::Ok | Outcome::AlreadyDone | Outcome::Unknown)
            })
            .map(|(_, s)| s.start)
            .min()
    };
    let mut pairs = 0;
    for (aggregate, events) in &mut by_aggregate {
        events.sort_unstable();
        for pair in events.windows(2) {
            let ((prev_seq, prev), (seq, id)) = (pair[0], pair[1]);
            let Some(first) = first_claim(id) else {
                // Never handed out: the "no event lost" rule speaks for it.
                continue;
            };
            pairs += 1;
            if let Some(before) = first_claim(prev)
                && first.end < before.start
            {
                v(
                    RULE,
                    id,
                    format!(
                        "{aggregate}: seq {seq} first handed out (lease {}, answered at {:?}) before \
                         seq {prev_seq} ({prev}) was first claimed (lease {}, sent at {:?})",
                        first.lease_id, first.end, before.lease_id, before.start
                    ),
                );
            }
            if finals[prev].dead_lettered {
                continue;
            }
            let acked = first_ack(prev);
            if acked.is_none_or(|at| first.end < at) {
                v(
                    RULE,
                    id,
                    format!(
                        "{aggregate}: seq {seq} first handed out (lease {}, answered at {:?}) before \
                         seq {prev_seq} ({prev}) was acked (first ack sent at {acked:?})",
                        first.lease_id, first.end
                    ),
                );
            }
        }
    }
    for c in &rec.claims {
        let mut held = HashSet::new();
        for (id, _) in &c.messages {
            if let Some(row) = finals.get(id)
                && !held.insert(row.aggregate.as_str())
            {
                v(
                    RULE,
                    id,
                    format!(
                        "lease {} holds two events of {}: one at a time per aggregate",
                        c.lease_id, row.aggregate
                    ),
                );
            }
        }
    }
    (by_aggregate.len(), pairs)
}

fn ms(d: Duration) -> String {
    format!("{:>9.3}s", d.as_secs_f64())
}

/// Each violation with its message's claims, deliveries and settles in time
/// order, the faults of the case and the row's final state.
fn report(
    rec: &Recorded,
    finals: &HashMap<String, FinalRow>,
    violations: &[Violation],
    claims: &HashMap<&str, Vec<(u32, &Claim)>>,
    settles: &HashMap<&str, Vec<(Outcome, &Settle)>>,
    deliveries: &HashMap<&str, Vec<&Delivery>>,
) -> String {
    let mut out = String::new();
    let mut shown = HashSet::new();
    for violation in violations {
        let id = violation.message_id.as_str();
        let _ = writeln!(
            out,
            "VIOLATION [{}] {id}: {}",
            violation.rule, violation.detail
        );
        // One history per message, and not hundreds of them.
        if !shown.insert(id) || shown.len() > 10 {
            continue;
        }
        let mut lines: Vec<(Duration, String)> = Vec::new();
        for (attempt, c) in claims.get(id).into_iter().flatten() {
            lines.push((
                c.start,
                format!(
                    "claim   [{} .. {}] lease {} attempt {attempt} by {} (db: claimed {}, expires {})",
                    ms(c.start),
                    ms(c.end),
                    c.lease_id,
                    c.worker,
                    c.claimed_at.format("%H:%M:%S%.6f"),
                    c.expires_at.format("%H:%M:%S%.6f"),
                ),
            ));
        }
        for d in deliveries.get(id).into_iter().flatten() {
            lines.push((
                d.at,
                format!(
                    "deliver  {}          lease {:?} attempt {:?}",
                    ms(d.at),
                    d.lease_id,
                    d.attempt
                ),
            ));
        }
        for (outcome, s) in settles.get(id).into_iter().flatten() {
            lines.push((
                s.start,
                format!(
                    "{:<7} [{} .. {}] lease {} by {}: {outcome:?}",
                    format!("{:?}", s.kind).to_lowercase(),
                    ms(s.start),
                    ms(s.end),
                    s.lease_id,
                    s.worker
                ),
            ));
        }
        for (at, what) in &rec.faults {
            lines.push((*at, format!("fault    {}          {what}", ms(*at))));
        }
        lines.sort_by_key(|(at, _)| *at);
        for (_, line) in lines {
            let _ = writeln!(out, "    {line}");
        }
        let _ = writeln!(
            out,
            "    final: {:?}; under lease at a fault: {}",
            finals.get(id),
            rec.exposed.contains(id)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn db(ms: i64) -> DateTime<Utc> {
        DateTime::from_timestamp_millis(1_800_000_000_000 + ms).expect("in range")
    }

    fn claim(lease: &str, id: &str, attempt: u32, start: u64, end: u64) -> Claim {
        Claim {
            worker: format!("w-{lease}"),
            lease_id: lease.into(),
            messages: vec![(id.into(), attempt)],
            start: at(start),
            end: at(end),
            claimed_at: db(start as i64),
            expires_at: db(start as i64 + 2000),
        }
    }

    fn ack(lease: &str, id: &str, outcome: Outcome, start: u64, end: u64) -> Settle {
        Settle {
            kind: SettleKind::Ack,
            worker: format!("w-{lease}"),
            lease_id: lease.into(),
            start: at(start),
            end: at(end),
            outcomes: vec![(id.into(), outcome)],
        }
    }

    fn delivery(lease: &str, id: &str, ms: u64) -> Delivery {
        Delivery {
            message_id: id.into(),
            lease_id: Some(lease.into()),
            attempt: None,
            at: at(ms),
        }
    }

    fn published(lease: &str, attempts: u32) -> FinalRow {
        FinalRow {
            aggregate: "a".into(),
            seq: 1,
            published: true,
            dead_lettered: false,
            last_error: None,
            attempts,
            lease_id: Some(lease.into()),
        }
    }

    /// Lease A claims m and lets it expire; B claims it after the expiry,
    /// publishes and acks; A's late ack is fenced off.
    fn good() -> (Recorded, HashMap<String, FinalRow>) {
        let rec = Recorded {
            committed: ["m".to_owned()].into(),
            claims: vec![claim("A", "m", 1, 0, 10), claim("B", "m", 2, 2500, 2510)],
            deliveries: vec![delivery("A", "m", 20), delivery("B", "m", 2520)],
            settles: vec![
                ack("B", "m", Outcome::Ok, 2530, 2540),
                ack("A", "m", Outcome::LeaseLost, 3000, 3010),
            ],
            exposed: ["m".to_owned()].into(),
            ..Recorded::default()
        };
        let finals = [("m".to_owned(), published("B", 2))].into();
        (rec, finals)
    }

    fn rules(verdict: &Verdict) -> Vec<&'static str> {
        verdict.violations.iter().map(|v| v.rule).collect()
    }

    #[test]
    fn a_history_that_keeps_the_rules_passes() {
        let (rec, finals) = good();
        let verdict = check(&rec, &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
        assert_eq!(verdict.figures.duplicates, 1);
        assert_eq!(verdict.figures.claimed_twice, 1);
    }

    #[test]
    fn a_stale_ack_that_was_accepted_is_reported_with_its_history() {
        let (mut rec, finals) = good();
        // A's ack, after B re-claimed the row, came back OK.
        rec.settles[1].outcomes[0].1 = Outcome::Ok;
        let verdict = check(&rec, &finals);
        assert_eq!(
            rules(&verdict),
            ["no stale ack accepted"],
            "{}",
            verdict.report
        );
        assert!(verdict.report.contains("a stale ack was accepted"));
        assert!(verdict.report.contains("claim"), "the history is printed");
        assert!(verdict.report.contains("lease B attempt 2"));
    }

    #[test]
    fn a_row_claimed_while_its_lease_was_live_is_reported() {
        let (mut rec, finals) = good();
        // B claims at 1 s, while A's lease runs until 2 s and A never nacked.
        rec.claims[1] = claim("B", "m", 2, 1000, 1010);
        let verdict = check(&rec, &finals);
        assert_eq!(
            rules(&verdict),
            ["never two live leases"],
            "{}",
            verdict.report
        );
        // A nack of A's lease releases the row early: no longer a violation.
        rec.settles.push(Settle {
            kind: SettleKind::Nack,
            ..ack("A", "m", Outcome::Ok, 500, 510)
        });
        assert!(check(&rec, &finals).violations.is_empty());
    }

    #[test]
    fn a_row_leased_again_after_the_lease_table_was_lost_is_not_a_violation() {
        let (mut rec, finals) = good();
        // B hands the row out again as attempt 1 while A's lease would run
        // until 2 s: a violation, unless the lease table was emptied between
        // A's claim and the end of B's.
        rec.claims[1] = claim("B", "m", 1, 1000, 1010);
        assert_eq!(rules(&check(&rec, &finals)), ["never two live leases"]);
        rec.leases_lost.push((at(1020), at(1020)));
        assert_eq!(
            rules(&check(&rec, &finals)),
            ["never two live leases"],
            "a loss after B's claim explains nothing"
        );
        rec.leases_lost = vec![(at(1005), at(1005))];
        let verdict = check(&rec, &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
    }

    #[test]
    fn an_ack_a_server_failure_undid_may_be_followed_by_a_claim() {
        // A's ack is accepted; then the row is claimed again by B and
        // published: a published row leased again, unless the server failed
        // just after A's ack (which it then may have undone).
        let rec = || Recorded {
            committed: ["m".to_owned()].into(),
            claims: vec![claim("A", "m", 1, 0, 10), claim("B", "m", 2, 2500, 2510)],
            deliveries: vec![delivery("A", "m", 20), delivery("B", "m", 2520)],
            settles: vec![
                ack("A", "m", Outcome::Ok, 100, 110),
                ack("B", "m", Outcome::Ok, 2530, 2540),
            ],
            ..Recorded::default()
        };
        let finals = [("m".to_owned(), published("B", 2))].into();
        assert_eq!(
            rules(&check(&rec(), &finals)),
            ["no stale ack accepted", "duplicates bounded"]
        );
        let mut failed = rec();
        failed.leases_lost.push((at(500), at(2000)));
        failed.writes_lost.push((at(500), at(2000)));
        let verdict = check(&failed, &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
        // A failure long after the ack undid nothing of it.
        let mut later = rec();
        later.leases_lost.push((at(4000), at(4050)));
        later.writes_lost.push((at(4000), at(4050)));
        later.claims[1] = claim("B", "m", 2, 5000, 5010);
        later.deliveries[1] = delivery("B", "m", 5020);
        later.settles[1] = ack("B", "m", Outcome::Ok, 5030, 5040);
        assert_eq!(
            rules(&check(&later, &finals)),
            ["no stale ack accepted", "duplicates bounded"]
        );
    }

    /// A crash comes a moment after the sampler records the fault's
    /// beginning: a claim in that moment holds a lease the crash then takes,
    /// and the next claim hands the row out as the same attempt.
    #[test]
    fn a_claim_between_a_crash_beginning_and_the_crash_may_be_handed_out_again() {
        let rec = |lost: (Duration, Duration)| Recorded {
            committed: ["m".to_owned()].into(),
            claims: vec![
                claim("A", "m", 1, 7593, 7596),
                claim("B", "m", 1, 8002, 8019),
            ],
            deliveries: vec![delivery("A", "m", 7737), delivery("B", "m", 8100)],
            settles: vec![
                ack("A", "m", Outcome::Unknown, 7737, 7741),
                ack("A", "m", Outcome::LeaseLost, 7843, 7852),
                ack("B", "m", Outcome::Ok, 8110, 8120),
            ],
            leases_lost: vec![lost],
            writes_lost: vec![lost],
            ..Recorded::default()
        };
        let finals = [("m".to_owned(), published("B", 1))].into();
        let verdict = check(&rec((at(7590), at(7700))), &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
        // Had the loss been taken as the fault's first moment alone:
        assert_eq!(
            rules(&check(&rec((at(7590), at(7590))), &finals)),
            ["never two live leases"]
        );
    }

    /// Leases expired twice (attempts 1 and 2), then a crash emptied the
    /// lease table, and C handed the row out as attempt 1 again and acked:
    /// not a stale ack, though attempt 2 was claimed before. B's ack after
    /// C's claim is stale whatever the numbers say.
    #[test]
    fn attempt_numbers_start_over_after_a_lost_lease_table() {
        let rec = Recorded {
            committed: ["m".to_owned()].into(),
            claims: vec![
                claim("A", "m", 1, 0, 10),
                claim("B", "m", 2, 2500, 2510),
                claim("C", "m", 1, 3200, 3210),
            ],
            deliveries: vec![delivery("C", "m", 3250), delivery("B", "m", 4000)],
            settles: vec![
                ack("C", "m", Outcome::Ok, 3300, 3310),
                ack("B", "m", Outcome::LeaseLost, 4000, 4010),
            ],
            leases_lost: vec![(at(3000), at(3100))],
            writes_lost: vec![(at(3000), at(3100))],
            exposed: ["m".to_owned()].into(),
            ..Recorded::default()
        };
        let finals = [("m".to_owned(), published("C", 1))].into();
        let verdict = check(&rec, &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
        let mut stale = rec.clone();
        stale.settles[1].outcomes[0].1 = Outcome::Ok;
        assert_eq!(
            rules(&check(&stale, &finals)),
            ["no stale ack accepted"],
            "{}",
            check(&stale, &finals).report
        );
    }

    #[test]
    fn an_event_in_doubt_counts_as_committed_iff_it_is_in_the_table() {
        let (mut rec, finals) = good();
        rec.committed.clear();
        rec.in_doubt = ["m".to_owned(), "never-committed".to_owned()].into();
        let verdict = check(&rec, &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
        assert_eq!(verdict.figures.events, 1);
        rec.deliveries.clear();
        assert_eq!(rules(&check(&rec, &finals)), ["no event lost"]);
    }

    #[test]
    fn an_event_never_published_or_published_without_a_delivery_is_lost() {
        let (rec, mut finals) = good();
        finals.insert(
            "m".into(),
            FinalRow {
                published: false,
                ..published("B", 2)
            },
        );
        assert_eq!(rules(&check(&rec, &finals)), ["no event lost"]);
        let (mut rec, finals) = good();
        rec.deliveries
            .retain(|d| d.lease_id.as_deref() == Some("A"));
        assert_eq!(rules(&check(&rec, &finals)), ["no event lost"]);
    }

    #[test]
    fn broker_deliveries_are_checked_by_the_attempt_they_carry() {
        let (mut rec, finals) = good();
        rec.claims.clear();
        rec.settles.clear();
        let by_broker = |attempt| Delivery {
            lease_id: None,
            attempt: Some(attempt),
            ..delivery("-", "m", 0)
        };
        rec.deliveries = vec![by_broker(1), by_broker(2)];
        assert!(check(&rec, &finals).violations.is_empty());
        // Published as attempt 2 (acked by that claim), but only attempt 1 arrived.
        rec.deliveries = vec![by_broker(1)];
        assert_eq!(rules(&check(&rec, &finals)), ["no event lost"]);
        // One claim, two publishes.
        rec.deliveries = vec![by_broker(2), by_broker(2)];
        assert_eq!(rules(&check(&rec, &finals)), ["duplicates bounded"]);
    }

    fn row(aggregate: &str, seq: i64, lease: &str, attempts: u32) -> FinalRow {
        FinalRow {
            aggregate: aggregate.into(),
            seq,
            ..published(lease, attempts)
        }
    }

    /// Aggregate `a`: m1 (seq 1) is claimed by A, published and acked; then
    /// m2 (seq 2) is claimed by B, published and acked.
    fn in_order() -> (Recorded, HashMap<String, FinalRow>) {
        let rec = Recorded {
            committed: ["m1".to_owned(), "m2".to_owned()].into(),
            claims: vec![claim("A", "m1", 1, 0, 10), claim("B", "m2", 1, 200, 210)],
            deliveries: vec![delivery("A", "m1", 20), delivery("B", "m2", 220)],
            settles: vec![
                ack("A", "m1", Outcome::Ok, 100, 110),
                ack("B", "m2", Outcome::Ok, 300, 310),
            ],
            ..Recorded::default()
        };
        let finals = [
            ("m1".to_owned(), row("a", 1, "A", 1)),
            ("m2".to_owned(), row("a", 2, "B", 1)),
        ]
        .into();
        (rec, finals)
    }

    #[test]
    fn an_ordered_history_passes_and_counts_its_aggregates() {
        let (rec, finals) = in_order();
        let verdict = check_ordered(&rec, &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
        assert_eq!(
            (verdict.figures.aggregates, verdict.figures.ordered_pairs),
            (1, 1)
        );
        let unordered = check(&rec, &finals);
        assert_eq!(
            (
                unordered.figures.aggregates,
                unordered.figures.ordered_pairs
            ),
            (0, 0),
            "an unordered case is not held to order"
        );
    }

    #[test]
    fn an_event_handed_out_before_the_previous_one_was_acked_breaks_the_order() {
        let (mut rec, finals) = in_order();
        // B got m2 at 50-60 ms, before A's ack of m1 was sent at 100 ms.
        rec.claims[1] = claim("B", "m2", 1, 50, 60);
        rec.deliveries[1] = delivery("B", "m2", 70);
        let verdict = check_ordered(&rec, &finals);
        assert_eq!(
            rules(&verdict),
            ["per-aggregate order"],
            "{}",
            verdict.report
        );
        assert!(verdict.report.contains("before seq 1 (m1) was acked"));
        assert!(
            check(&rec, &finals).violations.is_empty(),
            "opt-in: an unordered case is not held to it"
        );
        // Worse: m2 went out before m1 was even claimed (first deliveries
        // out of sequence order), which is also before m1's ack.
        rec.claims[1] = claim("B", "m2", 1, 0, 5);
        rec.claims[0] = claim("A", "m1", 1, 8, 10);
        let verdict = check_ordered(&rec, &finals);
        assert_eq!(
            rules(&verdict),
            ["per-aggregate order", "per-aggregate order"],
            "{}",
            verdict.report
        );
        assert!(
            verdict
                .report
                .contains("before seq 1 (m1) was first claimed")
        );
        // Either way it is the first delivery that counts, whatever the server
        // lost later.
        rec.leases_lost.push((at(400), at(900)));
        rec.writes_lost.push((at(400), at(900)));
        assert_eq!(rules(&check_ordered(&rec, &finals)).len(), 2);
    }

    #[test]
    fn one_claim_with_two_events_of_an_aggregate_breaks_the_order() {
        let (mut rec, finals) = in_order();
        rec.claims = vec![Claim {
            messages: vec![("m1".into(), 1), ("m2".into(), 1)],
            ..claim("A", "m1", 1, 0, 10)
        }];
        rec.deliveries[1] = delivery("A", "m2", 20);
        rec.settles = vec![Settle {
            outcomes: vec![("m1".into(), Outcome::Ok), ("m2".into(), Outcome::Ok)],
            ..ack("A", "m1", Outcome::Ok, 100, 110)
        }];
        let finals: HashMap<String, FinalRow> = finals
            .into_iter()
            .map(|(id, r)| {
                (
                    id,
                    FinalRow {
                        lease_id: Some("A".into()),
                        ..r
                    },
                )
            })
            .collect();
        let verdict = check_ordered(&rec, &finals);
        assert!(
            verdict
                .violations
                .iter()
                .any(|v| v.detail.contains("holds two events of a")),
            "{}",
            verdict.report
        );
    }

    /// A crash undoes A's ack of m1 after m2 went out: m1 is handed out
    /// again after m2 (a duplicate after a later event), then m2 again.
    /// First deliveries were in order, so that is no violation.
    #[test]
    fn a_redelivery_after_a_later_event_is_not_an_order_violation() {
        let (mut rec, _) = in_order();
        rec.leases_lost.push((at(400), at(900)));
        rec.writes_lost.push((at(400), at(900)));
        rec.claims.push(claim("C", "m1", 1, 1000, 1010));
        rec.deliveries.push(delivery("C", "m1", 1020));
        rec.settles.push(ack("C", "m1", Outcome::Ok, 1030, 1040));
        rec.claims.push(claim("D", "m2", 1, 1100, 1110));
        rec.deliveries.push(delivery("D", "m2", 1120));
        rec.settles.push(ack("D", "m2", Outcome::Ok, 1130, 1140));
        let finals = [
            ("m1".to_owned(), row("a", 1, "C", 1)),
            ("m2".to_owned(), row("a", 2, "D", 1)),
        ]
        .into();
        let verdict = check_ordered(&rec, &finals);
        assert!(verdict.violations.is_empty(), "{}", verdict.report);
        assert_eq!(verdict.figures.duplicates, 2);
    }

    #[test]
    fn duplicates_beyond_claims_or_beyond_what_was_in_flight_are_reported() {
        let (mut rec, finals) = good();
        rec.deliveries.push(delivery("B", "m", 2525));
        assert_eq!(rules(&check(&rec, &finals)), ["duplicates bounded"]);
        let (mut rec, finals) = good();
        rec.exposed.clear();
        let verdict = check(&rec, &finals);
        assert_eq!(
            rules(&verdict),
            ["duplicates bounded"],
            "{}",
            verdict.report
        );
    }
}
