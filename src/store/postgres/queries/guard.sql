-- One probe of an ordered outbox's commit-order guard (`guard.rs`): how far the
-- table's seq sequence has gone, read after this statement's snapshot was
-- taken, and the transactions running in this database: the oldest one's id
-- (xmin) and one past the newest one's (xmax); both are the snapshot's xmax
-- when none runs. A snapshot's own xmax is one past the newest *completed*
-- transaction, so a running transaction can be at or past it: the running
-- ones are read from pg_stat_activity, which shows every backend's
-- transaction id to any role, and from pg_prepared_xacts. Only this
-- database's transactions can insert into its tables, so one elsewhere on
-- the server holds nothing back. The 32-bit ids are widened to 64 bits by
-- their signed distance from the snapshot's xmax. No table access.
-- $1 sequence oid.
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
),
widened AS (
    SELECT s.xmax,
           s.xmax + CASE WHEN d.ahead >= 2147483648 THEN d.ahead - 4294967296
                         ELSE d.ahead END AS xid
    FROM snapshot AS s
    JOIN running AS r ON true
    CROSS JOIN LATERAL (
        SELECT ((r.xid - s.xmax) % 4294967296 + 4294967296) % 4294967296 AS ahead
    ) AS d
)
SELECT coalesce(pg_sequence_last_value($1::oid::regclass), 0) AS last_value,
       coalesce((SELECT min(w.xid) FROM widened AS w), s.xmax) AS xmin,
       coalesce((SELECT max(w.xid) + 1 FROM widened AS w), s.xmax) AS xmax
FROM snapshot AS s
