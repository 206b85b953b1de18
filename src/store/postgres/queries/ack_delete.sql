-- Ack for an outbox with zero retention: the row is deleted instead of marked.
-- $1 lease id, $2 message ids. A repeated ack then finds nothing (NOT_FOUND).
settled AS (
    DELETE FROM {table} AS o
    USING current AS c
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
