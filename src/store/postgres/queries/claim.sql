-- Leases up to $1 claimable rows in one autocommit statement. It writes the
-- lease table only ({leases}, unlogged): no WAL, no index of the outbox table
-- changes, no outbox row is locked. The outbox row is written only to
-- dead-letter it.
--
-- The lease row is the fence. An expired lease is taken over by locking its
-- lease row (SKIP LOCKED), so a settle of it in progress or committed meanwhile
-- is never overtaken. A fresh row is taken by inserting its lease row; a
-- concurrent claim's insert makes this one skip the row. One case is left to
-- at-least-once: if, while this statement runs, another claim leases a fresh
-- row and its worker publishes and settles it (a whole claim, publish, confirm
-- and ack inside this one statement), the row can be handed out once more; its
-- ack then answers LEASE_LOST ("already published") and nothing is lost.
-- Closing that window would cost every claim a second statement and a
-- transaction around the two.
-- $1 batch size, $2 lease id, $3 lease duration, $4 worker id, $5 max attempts,
-- $6 byte budget of the batch, $7 largest event handed out at all (bytes),
-- $8 largest event this client can receive (bytes, at most $7).
--
-- A row past max attempts is dead-lettered instead of handed out, so a worker
-- that crashes on a poison message cannot loop on it forever. The previous lease
-- (if it expired unsettled) comes back too, so its lease span can be closed.
-- `delivered` is how many deliveries the row had: its expired lease's count,
-- else the row's own (written at its last ack, nack or dead-lettering).
--
-- Expired leases come first, oldest expiry first: they have waited longest.
-- Delay rows (a nack's backoff, a future available_at, a redrive: see
-- `schema/leases.sql`) come back the same way when they are due. Fresh rows
-- are taken in seq order from the claim cursor on, past the rows under a
-- lease.
--
-- The claim cursor ($10) is a seq below which every pending row is leased,
-- delayed, settled or dead-lettered, so the walk starts there instead of at
-- the lowest pending row and steps over only the leases taken since (the
-- caller keeps it: `cursor.rs`). It is used only while the outbox's epoch is
-- still $11: crash recovery and failover empty the epoch table with the
-- lease table, and then the walk starts from the beginning. A fresh row not
-- yet due (its producer set a future available_at) is not handed out but
-- given a delay row, so the cursor can pass it. The last row (`walked_to`)
-- says how far the rows this claim read are all covered now: the seq before
-- the first one it left unleased (too large for this client, or cut by the
-- byte budget), else the last one it read, or the end when the walk ran out
-- of rows; NULL when it read no fresh row.
--
-- The ORDER placeholders below (expired_order, fresh_order) are empty for an
-- unordered outbox. For an ordered one (`ordering=aggregate`, see
-- `statements.rs`) they keep every row but its aggregate's head out, and every
-- aggregate already under a live lease. Fresh rows are at or below $9: for
-- an ordered outbox the seq up to which no transaction that could still
-- insert a lower one is open (the commit-order guard, `guard.rs`), for an
-- unordered one the largest bigint. The lease row records the event's
-- aggregate for an ordered outbox, NULL otherwise (lease_aggregate).
WITH expired AS (
    SELECT o.id,
           0 AS part, l.locked_until AS after, o.seq,
           o.aggregate_id::text AS aggregate_id, o.event_type, o.headers, o.created_at,
           o.redrives,
           o.payload::text AS payload_text,
           octet_length(o.headers::text) + octet_length(o.event_type)
               + octet_length(o.aggregate_id::text) AS other_bytes,
           true AS due, o.available_at,
           l.attempts     AS delivered,
           -- A delay row ended no delivery: no lease to close.
           CASE WHEN NOT l.delayed THEN l.lease_id END     AS prev_lease_id,
           CASE WHEN NOT l.delayed THEN l.claimed_by END   AS prev_claimed_by,
           CASE WHEN NOT l.delayed THEN l.claimed_at END   AS prev_claimed_at,
           CASE WHEN NOT l.delayed THEN l.locked_until END AS prev_locked_until
    FROM {leases} AS l
    -- Driven by the expiry index, one probe of the primary key per expired
    -- lease: as a plain join, a plan made before the table had statistics
    -- walked every pending row and probed the lease table for each. The
    -- filters stay outside (OFFSET 0 keeps them there), so the probe can
    -- only be the primary key's.
    CROSS JOIN LATERAL (SELECT o.* FROM {table} AS o WHERE o.id = l.id OFFSET 0) AS o
    WHERE l.locked_until <= now()
      AND o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
      AND o.available_at <= now()
      {expired_order}
    ORDER BY l.locked_until
    LIMIT $1
    FOR UPDATE OF l SKIP LOCKED
),
fresh AS (
    SELECT o.id,
           1 AS part, NULL::timestamptz AS after, o.seq,
           o.aggregate_id::text AS aggregate_id, o.event_type, o.headers, o.created_at,
           o.redrives,
           o.payload::text AS payload_text,
           octet_length(o.headers::text) + octet_length(o.event_type)
               + octet_length(o.aggregate_id::text) AS other_bytes,
           o.available_at <= now() AS due, o.available_at,
           o.attempts           AS delivered,
           NULL::uuid           AS prev_lease_id,
           NULL::text           AS prev_claimed_by,
           NULL::timestamptz    AS prev_claimed_at,
           NULL::timestamptz    AS prev_locked_until
    FROM {table} AS o
    WHERE o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
      AND o.seq > coalesce((SELECT $10::bigint FROM {epoch} AS e
                            WHERE e.id AND e.epoch = $11::uuid), 0)
      AND o.seq <= $9::bigint
      -- One index probe per row walked (OFFSET 0 keeps it a subplan): as a
      -- join, a plan made while the lease table was small compared every
      -- row with every lease, and a drain at batch 1000 × 4 fell to an
      -- eighth of its rate.
      AND NOT EXISTS (SELECT 1 FROM {leases} AS l WHERE l.id = o.id OFFSET 0)
      {fresh_order}
    ORDER BY o.seq
    LIMIT $1
),
-- CTEs run only as far as they are read: fresh rows are read only to fill
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
-- $8), so one big event never makes a response clients refuse. The payload is
-- turned into text once, here, and returned as measured. An event over
-- $7 is dead-lettered on sight and takes no other event with it. An event
-- over $8 but not $7 is too large for this client only: it is left as it is
-- (no lease, no attempt used) for a client that can receive it, and comes
-- back marked `too_large` so the server can say so. (Windows cannot share a
-- SELECT with FOR UPDATE, hence this extra step.)
measured AS (
    SELECT c.*, octet_length(c.payload_text) + c.other_bytes AS bytes
    FROM candidates AS c
),
sized AS (
    SELECT c.*,
           c.due AND c.bytes > $7 AS oversized,
           c.due AND c.bytes > $8 AND c.bytes <= $7 AS too_large,
           sum(CASE WHEN c.bytes > $8 OR NOT c.due THEN 0 ELSE c.bytes + 64 END)
               OVER (ORDER BY c.part, c.after, c.seq ROWS UNBOUNDED PRECEDING) AS running,
           count(*) FILTER (WHERE c.bytes <= $8 AND c.due)
               OVER (ORDER BY c.part, c.after, c.seq ROWS UNBOUNDED PRECEDING) AS fitting
    FROM measured AS c
),
picked AS (
    SELECT s.*, s.oversized OR s.too_large OR s.running <= $6 OR s.fitting = 1 AS picked
    FROM sized AS s
),
chosen AS (
    SELECT p.*, p.due AND NOT p.too_large AND (p.oversized OR p.delivered >= $5) AS dead
    FROM picked AS p
    WHERE p.picked
),
-- How far this claim's fresh rows are covered (see the top): computed over
-- every row read, chosen or not.
walked AS (
    SELECT CASE WHEN min(p.seq) FILTER (WHERE p.part = 1 AND (NOT p.picked OR p.too_large)) IS NOT NULL
                THEN min(p.seq) FILTER (WHERE p.part = 1 AND (NOT p.picked OR p.too_large)) - 1
                WHEN count(*) < $1 THEN 9223372036854775807
                ELSE max(p.seq) FILTER (WHERE p.part = 1)
           END AS walked_to,
           EXISTS (SELECT 1 FROM {epoch} AS e WHERE e.id AND e.epoch = $11::uuid) AS epoch_held
    FROM picked AS p
),
renewed AS (
    UPDATE {leases} AS l
    SET lease_id     = $2::uuid,
        locked_until = now() + $3::interval,
        claimed_by   = $4::text,
        claimed_at   = now(),
        attempts     = c.delivered + 1,
        delayed      = false
    FROM chosen AS c
    WHERE l.id = c.id AND c.part = 0 AND NOT c.dead AND NOT c.too_large
    RETURNING l.id, l.attempts, l.locked_until
),
-- A fresh row another claim leased after this statement's snapshot is left to
-- it (the insert waits for that claim's transaction, then skips the row).
-- One not yet due gets a delay row until its available_at, under a lease id
-- nobody holds, and counts no delivery.
taken AS (
    INSERT INTO {leases} AS l (id, lease_id, locked_until, claimed_by, claimed_at, attempts,
                               aggregate_id, delayed)
    SELECT c.id,
           CASE WHEN c.due THEN $2::uuid ELSE gen_random_uuid() END,
           CASE WHEN c.due THEN now() + $3::interval ELSE c.available_at END,
           CASE WHEN c.due THEN $4::text ELSE '' END,
           now(),
           c.delivered + CASE WHEN c.due THEN 1 ELSE 0 END,
           {lease_aggregate},
           NOT c.due
    FROM chosen AS c
    WHERE c.part = 1 AND NOT c.dead AND NOT c.too_large
    ON CONFLICT (id) DO NOTHING
    RETURNING l.id, l.attempts, l.locked_until, l.delayed
),
released AS (
    DELETE FROM {leases} AS l
    USING chosen AS c
    WHERE l.id = c.id AND c.part = 0 AND c.dead
),
buried AS (
    UPDATE {table} AS o
    SET attempts         = c.delivered,
        dead_lettered_at = now(),
        lease_id         = NULL,
        locked_until     = NULL,
        last_error       = CASE WHEN c.oversized
                                THEN format('event is %s bytes, over the %s-byte limit (--max-message-bytes); dead-lettered without delivery', c.bytes, $7)
                                ELSE 'max attempts reached; last error: ' || coalesce(o.last_error, 'lease expired')
                           END
    FROM chosen AS c
    -- The ids as an array, so the plan probes the primary key for each
    -- (whatever the table's statistics say) rather than walk the table.
    WHERE o.id = ANY (ARRAY(SELECT d.id FROM chosen AS d WHERE d.dead))
      AND o.id = c.id AND c.dead
      AND o.published_at IS NULL AND o.dead_lettered_at IS NULL
    RETURNING o.id, o.attempts
),
outcome AS (
    SELECT id, attempts, locked_until, false AS dead_lettered, false AS delayed FROM renewed
    UNION ALL
    SELECT id, attempts, locked_until, false AS dead_lettered, delayed FROM taken
    UNION ALL
    SELECT id, attempts, NULL::timestamptz AS locked_until, true AS dead_lettered,
           false AS delayed
    FROM buried
)
-- Every chosen row comes back; `lost` marks a fresh one another claim leased
-- first, so the caller can tell a batch cut short by a concurrent claim from a
-- table with nothing more to give; `too_large` one left for another client;
-- `delayed` one given a delay row. Each row carries the walk's outcome, and
-- when nothing was chosen one row with a NULL id carries it alone.
SELECT c.id,
       w.walked_to,
       w.epoch_held,
       coalesce(r.delayed, false) AS delayed,
       r.id IS NULL AND NOT c.too_large AS lost,
       c.too_large,
       c.bytes::bigint AS bytes,
       c.redrives,
       c.aggregate_id,
       c.event_type,
       c.payload_text AS payload,
       c.headers,
       c.created_at,
       r.attempts,
       c.seq,
       r.locked_until,
       coalesce(r.dead_lettered, false) AS dead_lettered,
       c.prev_lease_id,
       c.prev_claimed_by,
       c.prev_claimed_at,
       c.prev_locked_until
FROM walked AS w
LEFT JOIN (chosen AS c LEFT JOIN outcome AS r ON r.id = c.id) ON true
