-- One event by id, whatever its state. The lease table keeps an expired lease
-- until a claim takes the row back: it still counts the delivery it made, but
-- only an unexpired one says the event is held (a delay row never does: the
-- event waits for a retry). $1 the event id.
SELECT o.id, o.aggregate_id::text AS aggregate_id, o.event_type,
       o.payload::text AS payload, o.headers, o.created_at,
       greatest(o.attempts, coalesce(l.attempts, 0)) AS attempts, o.seq, o.redrives,
       o.last_error, o.available_at, o.published_at, o.dead_lettered_at, o.discarded_at,
       CASE WHEN l.locked_until > now() AND NOT l.delayed THEN l.locked_until END AS leased_until,
       CASE WHEN l.locked_until > now() AND NOT l.delayed THEN l.claimed_by END AS leased_by
FROM {table} AS o
LEFT JOIN {leases} AS l ON l.id = o.id
WHERE o.id = $1::uuid
