-- The settle step every Ack, Nack and ExtendLease shares, after the rows it
-- names are locked (settle_rows.sql): the statement's own change (ack.sql,
-- ack_delete.sql, nack.sql, extend.sql: an UPDATE ... FROM current AS c or a
-- DELETE ... USING current AS c) applies only to the rows still held under the
-- lease and neither published nor dead-lettered (the fence), and the result
-- classifies every named row, changed or not.
settled AS (
    {change}
    WHERE o.id = c.id AND c.held AND NOT c.published AND NOT c.dead_lettered
    RETURNING o.id, o.created_at, o.claimed_at, o.claimed_by, o.attempts,
              o.headers ->> 'traceparent' AS traceparent,
              o.headers ->> 'tracestate' AS tracestate,
              {dead_lettered_now} AS dead_lettered_now
)
SELECT c.id, c.held, c.published, c.dead_lettered,
       s.id IS NOT NULL AS applied,
       coalesce(s.dead_lettered_now, false) AS dead_lettered_now,
       s.created_at, s.claimed_at, s.claimed_by, s.attempts, s.traceparent, s.tracestate,
       now() AS settled_at{also}
FROM current AS c
LEFT JOIN settled AS s ON s.id = c.id
