-- ack_held.sql for an outbox with zero retention: the rows are deleted.
-- $1 lease id, $2 message ids.
DELETE FROM {table} AS o
WHERE o.id = ANY($2::uuid[])
  AND o.lease_id = $1::uuid
  AND o.published_at IS NULL
  AND o.dead_lettered_at IS NULL
RETURNING o.id, true AS held, false AS published, false AS dead_lettered,
          true AS applied, false AS dead_lettered_now,
          o.created_at, o.claimed_at, o.claimed_by, o.attempts, o.headers,
          now() AS settled_at
