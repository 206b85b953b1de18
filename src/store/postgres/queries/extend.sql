-- $1 lease id, $2 message ids, $3 new lease duration (expiry = now() + $3).
UPDATE {table} AS o
SET locked_until = now() + $3::interval
FROM current AS c
