-- The rows a settle call names, classified on the statement's snapshot: held
-- (its lease row carries lease $1, or, once settled, the row was published
-- under it), published, dead-lettered. Nothing is locked here: the settle's
-- own change re-checks the lease row at its latest version, and only what it
-- changed counts as applied. $1 lease id, $2 message ids. {filter} selects by
-- id, or by lease for ExtendLease without ids.
WITH current AS (
    SELECT o.id,
           coalesce(l.lease_id, o.lease_id) IS NOT DISTINCT FROM $1::uuid AS held,
           o.published_at IS NOT NULL AS published,
           o.dead_lettered_at IS NOT NULL AS dead_lettered
    FROM {table} AS o
    LEFT JOIN {leases} AS l ON l.id = o.id
    WHERE {filter}
),
