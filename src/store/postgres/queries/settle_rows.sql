-- The rows a settle call names, locked in id order (so two settles of
-- overlapping ids cannot deadlock) and read at their latest committed version:
-- the outcome is decided on what the row is now, not on the statement snapshot.
-- $1 lease id, $2 message ids. {filter} selects by id, or by lease for ExtendLease
-- without ids.
WITH current AS (
    SELECT id,
           lease_id IS NOT DISTINCT FROM $1::uuid AS held,
           published_at IS NOT NULL AS published,
           dead_lettered_at IS NOT NULL AS dead_lettered
    FROM {table}
    WHERE {filter}
    ORDER BY id
    FOR UPDATE
),
