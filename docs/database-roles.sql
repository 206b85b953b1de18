-- outboxd's two database roles: outboxd_migrator runs `outboxd migrate` (DDL),
-- outboxd_runtime runs the servers with --no-migrate (rows only). Run this once,
-- in outboxd's database, as a superuser (or your managed database's admin role),
-- before the first `outboxd migrate`. Choose your own passwords; for an outbox
-- table in another schema than public, repeat the schema's lines for it.

-- DDL: creates the outbox tables, their indexes and lease tables, and the
-- migrations' bookkeeping, and owns them.
CREATE ROLE outboxd_migrator LOGIN PASSWORD 'change-me-migrator';
GRANT USAGE, CREATE ON SCHEMA public TO outboxd_migrator;

-- Runtime: no DDL at all. Claims, acks, nacks, extends, the admin calls and
-- retention read and write rows of the outbox tables and of their lease tables
-- (a claim inserts lease rows), and read each table's seq sequence. Default
-- privileges give that on every table and sequence outboxd_migrator creates,
-- now and in later migrations.
CREATE ROLE outboxd_runtime LOGIN PASSWORD 'change-me-runtime';
GRANT USAGE ON SCHEMA public TO outboxd_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE outboxd_migrator IN SCHEMA public
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO outboxd_runtime;
ALTER DEFAULT PRIVILEGES FOR ROLE outboxd_migrator IN SCHEMA public
    GRANT SELECT ON SEQUENCES TO outboxd_runtime;
-- The database watchdog (GetDatabaseReport, the status page, the outbox_db_*
-- gauges) sees other roles' open transactions only with this; it never reads
-- their query texts.
GRANT pg_read_all_stats TO outboxd_runtime;
