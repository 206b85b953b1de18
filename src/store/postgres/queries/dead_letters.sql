-- One page of dead letters in seq order: after seq $1, at most $3, only
-- aggregate $2 (as text) when given. Discarded ones are no longer listed.
SELECT o.id, o.aggregate_id::text AS aggregate_id, o.event_type,
       o.payload::text AS payload, o.headers, o.created_at, o.attempts, o.seq, o.redrives,
       o.last_error, o.dead_lettered_at
FROM {table} AS o
WHERE o.dead_lettered_at IS NOT NULL
  AND o.discarded_at IS NULL
  AND o.seq > $1
  AND ($2::text IS NULL OR o.aggregate_id::text = $2::text)
ORDER BY o.seq
LIMIT $3
