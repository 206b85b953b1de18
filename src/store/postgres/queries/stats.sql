-- One pass over the pending rows, read through the pending index, with their
-- leases, plus the history counts.
-- {published_retained} counts published rows for GetStats; the metrics sampler,
-- which runs every few seconds, skips that scan of the retained history.
-- Ages are by the database clock. A row waiting out a nack backoff is not
-- counted in the oldest pending age: nothing is stuck while it waits.
WITH pending AS (
    SELECT o.created_at, o.available_at, l.locked_until, l.claimed_at
    FROM {table} AS o
    LEFT JOIN {leases} AS l ON l.id = o.id
    WHERE o.published_at IS NULL AND o.dead_lettered_at IS NULL
)
SELECT count(*) AS pending,
       count(*) FILTER (WHERE locked_until > now()) AS in_flight,
       coalesce(extract(epoch FROM now() - min(created_at)
           FILTER (WHERE available_at <= now() OR locked_until > now())), 0)::float8
           AS oldest_pending_secs,
       coalesce(extract(epoch FROM now() - min(claimed_at)
           FILTER (WHERE locked_until > now())), 0)::float8 AS oldest_lease_secs,
       (SELECT count(*) FROM {table} WHERE dead_lettered_at IS NOT NULL) AS dead_lettered,
       {published_retained} AS published_retained
FROM pending
