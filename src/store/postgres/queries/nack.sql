-- $1 lease id, $2 message ids, $3 error, $4 retry delay in seconds (NULL: use the
-- backoff schedule), $5 backoff schedule (seconds, index = attempt), $6 dead-letter
-- now, $7 max attempts. Releases the lease; the row is claimable again after its
-- delay, or dead-lettered when it has had its last attempt.
UPDATE {table} AS o
SET lease_id         = NULL,
    locked_until     = NULL,
    last_error       = $3::text,
    dead_lettered_at = CASE WHEN $6::bool OR o.attempts >= $7::int THEN now() END,
    available_at     = CASE WHEN $6::bool OR o.attempts >= $7::int THEN o.available_at
                            ELSE now() + make_interval(secs => coalesce(
                                $4::float8,
                                ($5::float8[])[greatest(1, least(o.attempts, cardinality($5::float8[])))]))
                       END
FROM current AS c
