-- One pass over the pending rows, read through the pending index, with their
-- leases, plus the history counts.
-- {published_retained} counts published rows for GetStats; the metrics sampler,
-- which runs every few seconds, skips that scan of the retained history, and
-- the last error (LAST_ERROR in statements.rs: the newest dead letter's error,
-- through the dead-letter index, else that of the pending event whose retry is
-- due last).
-- The blocked step lists the heads that block their aggregate (ordered outboxes under
-- poison=block; nothing otherwise): dead-lettered, not discarded, with no
-- earlier unsettled event of their aggregate. Dead letters are few, and each is
-- checked by one probe of the aggregate index.
-- Ages are by the database clock. A row waiting out a nack backoff is not
-- counted in the oldest pending age: nothing is stuck while it waits. Nor is
-- one held behind its aggregate's blocked head: that is the blocked age's
-- business, and counting it here would page "nothing is relayed" while every
-- other aggregate flows.
WITH pending AS (
    SELECT o.created_at, o.available_at,
           -- A delay row is no lease: the event waits for its retry.
           CASE WHEN NOT l.delayed THEN l.locked_until END AS locked_until,
           l.claimed_at,
           o.aggregate_id::text AS aggregate_id, o.seq
    FROM {table} AS o
    LEFT JOIN {leases} AS l ON l.id = o.id
    WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL
),
blocked AS (
    {blocked}
)
SELECT count(*) AS pending,
       count(*) FILTER (WHERE locked_until > now()) AS in_flight,
       coalesce(extract(epoch FROM now() - min(created_at)
           FILTER (WHERE (available_at <= now() OR locked_until > now())
                     AND NOT EXISTS (SELECT 1 FROM blocked AS b
                                     WHERE b.aggregate_id = pending.aggregate_id
                                       AND b.seq < pending.seq))), 0)::float8
           AS oldest_pending_secs,
       coalesce(extract(epoch FROM now() - min(claimed_at)
           FILTER (WHERE locked_until > now())), 0)::float8 AS oldest_lease_secs,
       (SELECT count(*) FROM {table}
        WHERE dead_lettered_at IS NOT NULL AND discarded_at IS NULL) AS dead_lettered,
       {published_retained} AS published_retained,
       (SELECT count(*) FROM blocked) AS blocked_keys,
       coalesce((SELECT extract(epoch FROM now() - min(since)) FROM blocked), 0)::float8
           AS oldest_blocked_secs,
       {last_error} AS last_error
FROM pending
