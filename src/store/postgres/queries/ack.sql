-- $1 lease id, $2 message ids. Succeeds iff the row still carries the lease, also
-- after the lease expired as long as nobody re-claimed the row: the publish
-- happened, and refusing would only cause a duplicate.
UPDATE {table} AS o
SET published_at = now(),
    locked_until = NULL
FROM current AS c
