-- Retention: deletes at most $2 published rows older than $1, oldest first. Small
-- batches keep each statement short; SKIP LOCKED never waits on a settle.
WITH doomed AS (
    SELECT id
    FROM {table}
    WHERE published_at IS NOT NULL AND published_at < now() - $1::interval
    ORDER BY published_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {table} AS o
USING doomed AS d
WHERE o.id = d.id
