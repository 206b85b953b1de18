-- Ack's common case in one statement: the named rows that still carry lease $1,
-- marked published without locking them first. Under READ COMMITTED a row
-- changed meanwhile (re-claimed after expiry, settled by a retry) is re-checked
-- at its latest version before it is updated, so a row that lost the lease is
-- simply not returned; the caller classifies such ids with the full ack.
-- Returns the columns of the full ack. $1 lease id, $2 message ids.
-- {settle} marks the rows published, or deletes them under zero retention.
{settle}
WHERE o.id = ANY($2::uuid[])
  AND o.lease_id = $1::uuid
  AND o.published_at IS NULL
  AND o.dead_lettered_at IS NULL
RETURNING o.id, true AS held, false AS published, false AS dead_lettered,
          true AS applied, false AS dead_lettered_now,
          o.created_at, o.claimed_at, o.claimed_by, o.attempts,
          o.headers ->> 'traceparent' AS traceparent,
          o.headers ->> 'tracestate' AS tracestate,
          now() AS settled_at
