-- Makes dead letters deliverable again, with a fresh count of attempts (and
-- one more redrive counted) and their own seq, so an ordered aggregate resumes with its head. Only rows
-- still dead-lettered and not discarded change. {selector} picks them: by id
-- ($1 uuid[]), by aggregate ($1 as text), or all. Each gets a delay row that
-- is due at once: it sits below the claim cursor (`claim.sql`), and claims
-- take it back through the expiry index. Counts the rows redriven.
WITH redriven AS (
UPDATE {table} AS o
SET dead_lettered_at = NULL,
    attempts         = 0,
    redrives         = o.redrives + 1,
    available_at     = now(),
    lease_id         = NULL,
    locked_until     = NULL
WHERE o.dead_lettered_at IS NOT NULL
  AND o.discarded_at IS NULL
  AND {selector}
RETURNING o.id, o.aggregate_id
)
INSERT INTO {leases} AS l (id, lease_id, locked_until, claimed_by, claimed_at, attempts,
                           aggregate_id, delayed)
SELECT c.id, gen_random_uuid(), now(), '', now(), 0, {lease_aggregate}, true
FROM redriven AS c
ON CONFLICT (id) DO UPDATE
SET lease_id = excluded.lease_id, locked_until = excluded.locked_until,
    claimed_by = excluded.claimed_by, claimed_at = excluded.claimed_at,
    attempts = excluded.attempts, delayed = true
