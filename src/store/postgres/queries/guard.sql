-- One probe of an ordered outbox's commit-order guard (`guard.rs`): how far the
-- table's seq sequence has gone, read after this statement's snapshot was
-- taken, and that snapshot's oldest running and first unassigned transaction
-- ids. No table access. $1 sequence oid.
SELECT coalesce(pg_sequence_last_value($1::oid::regclass), 0) AS last_value,
       pg_snapshot_xmin(s)::text::bigint AS xmin,
       pg_snapshot_xmax(s)::text::bigint AS xmax
FROM pg_current_snapshot() AS s
