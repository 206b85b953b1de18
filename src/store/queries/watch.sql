-- Resolves a table's ids once at start: its oid (the key of its quiet mark) and
-- the sequence behind its seq column (what the watcher probes).
-- $1 quoted table name.
SELECT $1::regclass::oid AS relid,
       pg_get_serial_sequence($1, 'seq')::regclass::oid AS sequence
