-- $1 lease id, $2 message ids, $3 error, $4 retry delay in seconds (NULL: use the
-- backoff schedule), $5 backoff schedule (seconds, index = attempt), $6 dead-letter
-- now, $7 max attempts. Releases the lease (its lease row goes, the fence as in
-- ack_held.sql); the row is claimable again after its delay, or dead-lettered
-- when it has had its last attempt. The count of attempts is written to the row.
released AS (
    DELETE FROM {leases} AS l
    USING current AS c
    WHERE l.id = c.id AND l.lease_id = $1::uuid
      AND NOT c.published AND NOT c.dead_lettered
    RETURNING l.id, l.attempts, l.claimed_by, l.claimed_at
),
settled AS (
    UPDATE {table} AS o
    SET lease_id         = NULL,
        locked_until     = NULL,
        attempts         = r.attempts,
        last_error       = $3::text,
        dead_lettered_at = CASE WHEN $6::bool OR r.attempts >= $7::int THEN now() END,
        available_at     = CASE WHEN $6::bool OR r.attempts >= $7::int THEN o.available_at
                                ELSE now() + make_interval(secs => coalesce(
                                    $4::float8,
                                    ($5::float8[])[greatest(1, least(r.attempts, cardinality($5::float8[])))]))
                           END
    FROM released AS r
    WHERE o.id = r.id
      AND o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
    RETURNING o.id, o.created_at, r.claimed_at, r.claimed_by, r.attempts,
              o.headers ->> 'traceparent' AS traceparent,
              o.headers ->> 'tracestate' AS tracestate,
              o.dead_lettered_at IS NOT NULL AS dead_lettered_now
)
