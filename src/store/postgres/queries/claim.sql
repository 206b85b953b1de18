-- Leases up to $1 claimable rows in one autocommit statement.
-- $1 batch size, $2 lease id, $3 lease duration, $4 worker id, $5 max attempts,
-- $6 byte budget of the batch, $7 largest event handed out at all (bytes).
--
-- A row past max attempts is dead-lettered instead of handed out, so a worker
-- that crashes on a poison message cannot loop on it forever. The previous lease
-- (if it expired unsettled) comes back too, so its lease span can be closed.
--
-- Expired leases come first, oldest expiry first: they have waited longest. Each
-- part reads only its own partial index, so leases in flight cost a claim
-- nothing, and fresh rows are taken in seq order.
WITH expired AS (
    SELECT id,
           0 AS part, locked_until AS after, seq,
           payload::text AS payload_text,
           octet_length(headers::text) + octet_length(event_type)
               + octet_length(aggregate_id::text) AS other_bytes,
           lease_id   AS prev_lease_id,
           claimed_by AS prev_claimed_by,
           claimed_at AS prev_claimed_at,
           locked_until AS prev_locked_until
    FROM {table}
    WHERE published_at IS NULL
      AND dead_lettered_at IS NULL
      AND locked_until IS NOT NULL
      AND locked_until <= now()
      AND available_at <= now()
    ORDER BY locked_until
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
fresh AS (
    SELECT id,
           1 AS part, NULL::timestamptz AS after, seq,
           payload::text AS payload_text,
           octet_length(headers::text) + octet_length(event_type)
               + octet_length(aggregate_id::text) AS other_bytes,
           lease_id   AS prev_lease_id,
           claimed_by AS prev_claimed_by,
           claimed_at AS prev_claimed_at,
           locked_until AS prev_locked_until
    FROM {table}
    WHERE published_at IS NULL
      AND dead_lettered_at IS NULL
      AND locked_until IS NULL
      AND available_at <= now()
    ORDER BY seq
    LIMIT $1
    FOR UPDATE SKIP LOCKED
),
-- CTEs run only as far as they are read: fresh rows are locked only to fill
-- what the expired leases left of the batch. Every LIMIT is the plain $1 so the
-- planner knows the batch is small (an unknown limit chose a hash join over a
-- sequential scan of the whole table).
candidates AS (
    SELECT * FROM expired
    UNION ALL
    SELECT * FROM fresh
    LIMIT $1
),
-- The batch is cut to its byte budget, in the order it was read: a prefix whose
-- sizes sum to at most $6, or the first event alone when it is larger (up to
-- $7), so one big event never makes a response clients refuse. The payload is
-- turned into text once, here, and returned as measured. An event over
-- $7 is dead-lettered on sight and takes no other event with it. (Windows
-- cannot share a SELECT with FOR UPDATE, hence this extra step.)
measured AS (
    SELECT c.*, octet_length(c.payload_text) + c.other_bytes AS bytes
    FROM candidates AS c
),
sized AS (
    SELECT c.*,
           c.bytes > $7 AS oversized,
           sum(CASE WHEN c.bytes > $7 THEN 0 ELSE c.bytes + 64 END)
               OVER (ORDER BY c.part, c.after, c.seq ROWS UNBOUNDED PRECEDING) AS running,
           count(*) FILTER (WHERE c.bytes <= $7)
               OVER (ORDER BY c.part, c.after, c.seq ROWS UNBOUNDED PRECEDING) AS fitting
    FROM measured AS c
),
chosen AS (
    SELECT * FROM sized
    WHERE oversized OR running <= $6 OR fitting = 1
)
UPDATE {table} AS o
SET attempts         = CASE WHEN c.oversized OR o.attempts >= $5 THEN o.attempts ELSE o.attempts + 1 END,
    lease_id         = CASE WHEN c.oversized OR o.attempts >= $5 THEN NULL ELSE $2::uuid END,
    locked_until     = CASE WHEN c.oversized OR o.attempts >= $5 THEN NULL ELSE now() + $3::interval END,
    claimed_by       = CASE WHEN c.oversized OR o.attempts >= $5 THEN o.claimed_by ELSE $4::text END,
    claimed_at       = CASE WHEN c.oversized OR o.attempts >= $5 THEN o.claimed_at ELSE now() END,
    dead_lettered_at = CASE WHEN c.oversized OR o.attempts >= $5 THEN now() END,
    last_error       = CASE WHEN c.oversized
                            THEN format('event is %s bytes, over the %s-byte limit (--max-message-bytes); dead-lettered without delivery', c.bytes, $7)
                            WHEN o.attempts >= $5
                            THEN 'max attempts reached; last error: ' || coalesce(o.last_error, 'lease expired')
                            ELSE o.last_error END
FROM chosen AS c
WHERE o.id = c.id
RETURNING o.id,
          o.aggregate_id::text AS aggregate_id,
          o.event_type,
          c.payload_text AS payload,
          o.headers,
          o.created_at,
          o.attempts,
          o.seq,
          o.locked_until,
          o.dead_lettered_at IS NOT NULL AS dead_lettered,
          c.prev_lease_id,
          c.prev_claimed_by,
          c.prev_claimed_at,
          c.prev_locked_until
