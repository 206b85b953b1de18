-- One probe of an ordered outbox's commit-order guard (`guard.rs`).
--
-- The epoch first: the one row of the outbox's unlogged epoch table
-- ({epoch}, `schema/leases.sql`), stamped with $2 when it is missing. Crash
-- recovery empties that table and a promoted standby starts without it, so a
-- changed or new epoch tells the guard that sequence values it read may have
-- been lost with unflushed WAL and that it must start over. Stamping in this
-- statement ties the epoch to the reads below: they cannot come from an
-- earlier life of the database than the epoch returned. It returns NULL when
-- another replica stamped the table while this statement ran (the next probe
-- reads that stamp). The INSERT takes no transaction id unless it stamps.
--
-- Then how far the table's seq sequence has gone, read after this statement's
-- snapshot was taken, and the transactions running in this database: the
-- oldest one's id (xmin) and one past the newest one's (xmax); both are the
-- snapshot's xmax when none runs. A snapshot's own xmax is one past the
-- newest *completed* transaction, so a running transaction can be at or past
-- it: the running ones are read from pg_stat_activity, which shows every
-- backend's transaction id to any role, and from pg_prepared_xacts. Only this
-- database's transactions can insert into its tables, so one elsewhere on
-- the server holds nothing back. The 32-bit ids are widened to 64 bits by
-- their signed distance from the snapshot's xmax.
--
-- And when the oldest transaction that may still insert began (oldest_start,
-- microseconds since the Unix epoch; NULL when none): one holding a
-- transaction id, or one waiting on a lock without one. The second kind is an
-- `INSERT … ON CONFLICT` that drew its seq and waits for the transaction that
-- holds the conflicting key: it takes its id only when it goes on, after
-- snapshots the guard already paired with its seq. A backend whose start is
-- hidden from this role (without pg_read_all_stats) counts from the
-- beginning of time, as does a prepared transaction. read_at is when the
-- sequence had been read (the select list is evaluated after the
-- materialized read), on the same clock.
-- $1 sequence oid, $2 a fresh epoch.
WITH stamped AS (
    INSERT INTO {epoch} (epoch)
    SELECT $2::uuid WHERE NOT EXISTS (SELECT 1 FROM {epoch} WHERE id)
    ON CONFLICT (id) DO NOTHING
    RETURNING epoch
),
snapshot AS (
    SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax
),
running AS (
    SELECT a.backend_xid::text::bigint AS xid,
           coalesce(a.xact_start, '-infinity') AS began
    FROM pg_stat_activity AS a
    WHERE a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND a.pid <> pg_backend_pid()
      AND (a.backend_xid IS NOT NULL
           OR (a.wait_event_type = 'Lock' AND a.state = 'active'))
    UNION ALL
    SELECT p.transaction::text::bigint, '-infinity'
    FROM pg_prepared_xacts AS p
    WHERE p.database = current_database()
),
widened AS (
    SELECT s.xmax,
           s.xmax + CASE WHEN d.ahead >= 2147483648 THEN d.ahead - 4294967296
                         ELSE d.ahead END AS xid
    FROM snapshot AS s
    JOIN running AS r ON r.xid IS NOT NULL
    CROSS JOIN LATERAL (
        SELECT ((r.xid - s.xmax) % 4294967296 + 4294967296) % 4294967296 AS ahead
    ) AS d
),
sequence AS MATERIALIZED (
    SELECT coalesce(pg_sequence_last_value($1::oid::regclass), 0) AS last_value
)
SELECT q.last_value,
       coalesce((SELECT min(w.xid) FROM widened AS w), s.xmax) AS xmin,
       coalesce((SELECT max(w.xid) + 1 FROM widened AS w), s.xmax) AS xmax,
       (SELECT CASE WHEN min(r.began) = '-infinity' THEN -9223372036854775807
                    ELSE (extract(epoch FROM min(r.began)) * 1000000)::bigint END
        FROM running AS r) AS oldest_start,
       (extract(epoch FROM clock_timestamp()) * 1000000)::bigint AS read_at,
       coalesce((SELECT epoch FROM stamped), (SELECT e.epoch FROM {epoch} AS e WHERE e.id)) AS epoch
FROM snapshot AS s, sequence AS q
