-- $1 lease id, $2 message ids, $3 new lease duration (expiry = now() + $3).
-- Moves the expiry in the lease table only: no WAL, nothing in the outbox table.
settled AS (
    UPDATE {leases} AS l
    SET locked_until = now() + $3::interval
    FROM current AS c, {table} AS o
    WHERE l.id = c.id AND o.id = c.id
      AND l.lease_id = $1::uuid
      AND NOT c.published AND NOT c.dead_lettered
    RETURNING l.id, o.created_at, l.claimed_at, l.claimed_by, l.attempts,
              o.headers ->> 'traceparent' AS traceparent,
              o.headers ->> 'tracestate' AS tracestate,
              false AS dead_lettered_now
)
