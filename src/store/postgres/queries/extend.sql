-- $1 lease id, $2 message ids, $3 new lease duration (expiry = now() + $3).
settled AS (
    UPDATE {table} AS o
    SET locked_until = now() + $3::interval
    FROM current AS c
    WHERE o.id = c.id AND c.held AND NOT c.published AND NOT c.dead_lettered
    RETURNING o.id, o.created_at, o.claimed_at, o.claimed_by, o.attempts,
              o.headers ->> 'traceparent' AS traceparent,
              o.headers ->> 'tracestate' AS tracestate
)
SELECT c.id, c.held, c.published, c.dead_lettered,
       s.id IS NOT NULL AS applied,
       false AS dead_lettered_now,
       s.created_at, s.claimed_at, s.claimed_by, s.attempts, s.traceparent, s.tracestate,
       now() AS settled_at,
       now() + $3::interval AS expires_at
FROM current AS c
LEFT JOIN settled AS s ON s.id = c.id
