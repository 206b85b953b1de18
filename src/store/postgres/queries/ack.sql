-- The ids an ack did not settle (ack_held.sql): says why, changing nothing.
-- A row acked earlier keeps the lease it was published under, so acking it
-- again under that lease is reported as done, not as lost.
settled AS (
    SELECT NULL::uuid AS id, NULL::timestamptz AS created_at, NULL::timestamptz AS claimed_at,
           NULL::text AS claimed_by, NULL::integer AS attempts,
           NULL::text AS traceparent, NULL::text AS tracestate,
           false AS dead_lettered_now
    WHERE false
)
