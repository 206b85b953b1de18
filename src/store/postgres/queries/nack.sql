-- $1 lease id, $2 message ids, $3 error, $4 retry delay in seconds (NULL: use the
-- backoff schedule), $5 backoff schedule (seconds, index = attempt), $6 dead-letter
-- now, $7 max attempts. Ends the lease (fenced by the lease row as in
-- ack_held.sql); the row is claimable again after its delay, or dead-lettered
-- when it has had its last attempt. The count of attempts is written to the row.
-- Not the last attempt: the lease row stays, as a delay row until the retry
-- (a fresh lease id nobody holds fences the nacked lease's later settles), so
-- the event never sits unleased below a claim cursor and comes back through
-- the expiry index. The last attempt, or a nack that dead-letters: it goes.
retry AS (
    SELECT c.id,
           now() + make_interval(secs => coalesce(
               $4::float8,
               ($5::float8[])[greatest(1, least(l.attempts, cardinality($5::float8[])))])) AS at
    FROM current AS c
    JOIN {leases} AS l ON l.id = c.id
),
released AS (
    DELETE FROM {leases} AS l
    USING current AS c
    WHERE l.id = c.id AND l.lease_id = $1::uuid
      AND NOT c.published AND NOT c.dead_lettered
      AND ($6::bool OR l.attempts >= $7::int)
    RETURNING l.id, l.attempts, l.claimed_by, l.claimed_at
),
delayed AS (
    UPDATE {leases} AS l
    SET lease_id     = gen_random_uuid(),
        locked_until = t.at,
        delayed      = true
    FROM current AS c, retry AS t
    WHERE l.id = c.id AND t.id = c.id AND l.lease_id = $1::uuid
      AND NOT c.published AND NOT c.dead_lettered
      AND NOT ($6::bool OR l.attempts >= $7::int)
    RETURNING l.id, l.attempts, l.claimed_by, l.claimed_at, l.locked_until AS retry_at
),
ended AS (
    SELECT id, attempts, claimed_by, claimed_at, NULL::timestamptz AS retry_at FROM released
    UNION ALL
    SELECT id, attempts, claimed_by, claimed_at, retry_at FROM delayed
),
settled AS (
    UPDATE {table} AS o
    SET lease_id         = NULL,
        locked_until     = NULL,
        attempts         = r.attempts,
        last_error       = $3::text,
        dead_lettered_at = CASE WHEN r.retry_at IS NULL THEN now() END,
        available_at     = coalesce(r.retry_at, o.available_at)
    FROM ended AS r
    WHERE o.id = r.id
      AND o.published_at IS NULL
      AND o.dead_lettered_at IS NULL
    RETURNING o.id, o.created_at, r.claimed_at, r.claimed_by, r.attempts,
              o.headers ->> 'traceparent' AS traceparent,
              o.headers ->> 'tracestate' AS tracestate,
              o.dead_lettered_at IS NOT NULL AS dead_lettered_now
)
