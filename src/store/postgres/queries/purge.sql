-- Retention: deletes at most $2 published rows older than $1, oldest first,
-- and at most $2 dead letters discarded longer than $1 ago. Small batches keep
-- each statement short. No row lock before the delete (a lock would be one
-- more WAL record per row): a replica purging the same rows at the same time
-- waits for this delete and then finds them gone.
DELETE FROM {table} AS o
WHERE o.id IN (
    (SELECT id
     FROM {table}
     WHERE published_at IS NOT NULL AND published_at < now() - $1::interval
     ORDER BY published_at
     LIMIT $2)
    UNION ALL
    (SELECT id
     FROM {table}
     WHERE dead_lettered_at IS NOT NULL AND discarded_at < now() - $1::interval
     LIMIT $2))
