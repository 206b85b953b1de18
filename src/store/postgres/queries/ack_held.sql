-- Ack's common case in one statement: the named rows whose lease row still
-- carries lease $1 lose it, and their outbox rows are marked published. The
-- lease row is the fence: a claim that took the row over after the lease
-- expired holds or has changed it, so under READ COMMITTED the delete re-checks
-- it at its latest version and simply skips it; the caller classifies such ids
-- with ack.sql. The row's count of attempts, its last lease and its worker are
-- written with published_at: the one write of the outbox row an event costs.
-- Returns the columns of the other settle statements. $1 lease id, $2 message ids.
-- {settle} marks the rows published, or deletes them under zero retention.
WITH held AS (
    DELETE FROM {leases} AS l
    WHERE l.id = ANY($2::uuid[])
      AND l.lease_id = $1::uuid
    RETURNING l.id, l.attempts, l.claimed_by, l.claimed_at
)
{settle}
WHERE o.id = h.id
  AND o.published_at IS NULL
  AND o.dead_lettered_at IS NULL
RETURNING o.id, true AS held, false AS published, false AS dead_lettered,
          true AS applied, false AS dead_lettered_now,
          o.created_at, h.claimed_at, h.claimed_by, h.attempts,
          o.headers ->> 'traceparent' AS traceparent,
          o.headers ->> 'tracestate' AS tracestate,
          now() AS settled_at
