-- One probe of an ordered outbox's commit-order guard (`guard.rs`): how far the
-- table's seq sequence has gone, read after this statement's snapshot was
-- taken; that snapshot's first unassigned transaction id (xmax); and the
-- oldest transaction id still running in this database (xmin; the xmax when
-- none runs). Only this database's transactions can insert into its tables,
-- so a long transaction elsewhere on the server holds nothing back.
-- pg_stat_activity shows every backend's transaction id to any role. Its
-- 32-bit ids are widened to the snapshot's 64-bit ones by their distance
-- below xmax. No table access. $1 sequence oid.
WITH snapshot AS (
    SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax
),
running AS (
    SELECT a.backend_xid::text::bigint AS xid
    FROM pg_stat_activity AS a
    WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND a.backend_xid IS NOT NULL
    UNION ALL
    SELECT p.transaction::text::bigint
    FROM pg_prepared_xacts AS p
    WHERE p.database = current_database()
)
SELECT coalesce(pg_sequence_last_value($1::oid::regclass), 0) AS last_value,
       s.xmax,
       coalesce(min(s.xmax - ((s.xmax - r.xid) % 4294967296 + 4294967296) % 4294967296),
                s.xmax) AS xmin
FROM snapshot AS s
LEFT JOIN running AS r ON true
GROUP BY s.xmax
