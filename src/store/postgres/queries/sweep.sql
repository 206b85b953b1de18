-- The claim cursor's check, run every --claim-sweep-interval: the full walk a
-- claim no longer makes. $1 this replica's cursor, $2 the epoch it holds for.
--
-- Every pending row at or below the cursor should have a lease row (a lease,
-- expired or not, or a delay row): `passed` are those that have none, which
-- only a fault in the cursor's reasoning (or an operator's hand in the lease
-- table) can leave. Each gets a delay row due at once (or at its
-- available_at), so the next claim hands it out through the expiry index, and
-- comes back with its seq to be logged and counted. Nothing is read past the
-- cursor, and nothing when the epoch changed (the cursor is void then).
--
-- `orphans` are lease rows whose outbox row is gone (deleted by hand): no
-- claim or settle ever meets them again, so they would stay forever. A lease
-- row is written only for a row its statement saw, so one this snapshot sees
-- has its outbox row visible here unless that row was deleted.
WITH passed AS (
    SELECT o.id, o.seq, o.available_at, o.attempts, o.aggregate_id
    FROM {table} AS o
    WHERE o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
      AND o.seq <= coalesce((SELECT $1::bigint FROM {epoch} AS e
                             WHERE e.id AND e.epoch = $2::uuid), 0)
      AND NOT EXISTS (SELECT 1 FROM {leases} AS l WHERE l.id = o.id OFFSET 0)
),
handed AS (
    INSERT INTO {leases} AS l (id, lease_id, locked_until, claimed_by, claimed_at, attempts,
                               aggregate_id, delayed)
    SELECT c.id, gen_random_uuid(), greatest(now(), c.available_at), '', now(), c.attempts,
           {lease_aggregate}, true
    FROM passed AS c
    ON CONFLICT (id) DO NOTHING
    RETURNING l.id
),
orphans AS (
    DELETE FROM {leases} AS l
    WHERE NOT EXISTS (SELECT 1 FROM {table} AS o WHERE o.id = l.id)
    RETURNING l.id
)
SELECT coalesce((SELECT array_agg(p.seq ORDER BY p.seq)
                 FROM passed AS p JOIN handed AS h ON h.id = p.id), ARRAY[]::bigint[]) AS found,
       (SELECT count(*) FROM orphans) AS orphans
