-- The result every Ack, Nack and ExtendLease shares: each named row of
-- `current` (settle_rows.sql) with what the statement's own change (`settled`:
-- ack.sql, nack.sql, extend.sql) did to it.
SELECT c.id, c.held, c.published, c.dead_lettered,
       s.id IS NOT NULL AS applied,
       coalesce(s.dead_lettered_now, false) AS dead_lettered_now,
       s.created_at, s.claimed_at, s.claimed_by, s.attempts, s.traceparent, s.tracestate,
       now() AS settled_at{also}
FROM current AS c
LEFT JOIN settled AS s ON s.id = c.id
