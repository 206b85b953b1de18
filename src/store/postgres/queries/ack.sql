-- $1 lease id, $2 message ids. Succeeds iff the row still carries the lease, also
-- after the lease expired as long as nobody re-claimed the row: the publish
-- happened, and refusing would only cause a duplicate.
settled AS (
    UPDATE {table} AS o
    SET published_at = now(),
        locked_until = NULL
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
       now() AS settled_at
FROM current AS c
LEFT JOIN settled AS s ON s.id = c.id
