-- The database watchdog's sample (`tasks/watchdog.rs`): five short reads of
-- the catalogue views, no table access; each statement ends with a line `;`.
-- Never a query text: it may carry personal data.
--
-- 1. The database clock the ages are measured by.
SELECT now() AS read_at
;
-- 2. This database's transactions that hold back the xmin horizon: they hold
-- a transaction id (they wrote) or a snapshot. The sampling backend itself is
-- left out, and so are autovacuum workers (a vacuum's snapshot holds back no
-- other vacuum) and parallel workers (their leader is listed). Oldest first,
-- bounded.
SELECT a.pid,
       coalesce(a.application_name, '') AS application_name,
       coalesce(a.state, '') AS state,
       a.xact_start,
       greatest(extract(epoch FROM now() - a.xact_start), 0)::float8 AS age_secs,
       CASE WHEN a.state LIKE 'idle in transaction%'
            THEN greatest(extract(epoch FROM now() - a.state_change), 0)::float8
       END AS idle_secs,
       a.backend_xid IS NOT NULL AS writer
FROM pg_stat_activity AS a
WHERE a.datname = current_database()
  AND (a.backend_xid IS NOT NULL OR a.backend_xmin IS NOT NULL)
  AND a.xact_start IS NOT NULL
  AND a.pid <> pg_backend_pid()
  AND a.backend_type NOT IN ('autovacuum worker', 'parallel worker')
ORDER BY a.xact_start
LIMIT 50
;
-- 3. Replication slots: every physical one (they hold the whole cluster) and
-- this database's logical ones. Ages in transactions; the WAL they keep from
-- the current position (the replay position on a standby).
SELECT s.slot_name::text AS slot_name,
       s.slot_type,
       s.active,
       s.xmin::text::int8 AS xmin,
       s.catalog_xmin::text::int8 AS catalog_xmin,
       age(s.xmin)::int8 AS xmin_age,
       age(s.catalog_xmin)::int8 AS catalog_xmin_age,
       ((CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()
              ELSE pg_current_wal_lsn() END) - s.restart_lsn)::int8 AS retained_wal_bytes
FROM pg_replication_slots AS s
WHERE s.slot_type = 'physical' OR s.database = current_database()
ORDER BY s.slot_name
LIMIT 50
;
-- 4. This database's prepared transactions, oldest first, bounded, with how
-- many there are.
SELECT p.gid,
       p.owner::text AS owner,
       p.prepared,
       greatest(extract(epoch FROM now() - p.prepared), 0)::float8 AS age_secs,
       count(*) OVER () AS total
FROM pg_prepared_xacts AS p
WHERE p.database = current_database()
ORDER BY p.prepared
LIMIT 50
;
-- 5. Each outbox table's upkeep. $1 the quoted table names, $2 the outbox
-- names, in the same order.
SELECT t.outbox,
       coalesce(s.n_dead_tup, 0) AS dead_tuples,
       coalesce(s.n_live_tup, 0) AS live_tuples,
       extract(epoch FROM now() - greatest(s.last_autovacuum, s.last_vacuum))::float8
           AS vacuum_age_secs,
       extract(epoch FROM now() - greatest(s.last_autoanalyze, s.last_analyze))::float8
           AS analyze_age_secs,
       pg_table_size(c.oid) AS table_bytes,
       pg_indexes_size(c.oid) AS index_bytes
FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS t(name, outbox, n)
JOIN pg_class AS c ON c.oid = to_regclass(t.name)
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
ORDER BY t.n
;
