-- Resolves once at start the sequence behind a table's seq column: what the
-- watcher probes. No sequence when seq is not an identity/serial column, or
-- when the sequence caches values (CACHE > 1): then inserts need not move what
-- the probe reads. $1 quoted table name.
SELECT s.seqrelid AS sequence
FROM (SELECT pg_get_serial_sequence($1, 'seq')::regclass::oid AS oid) AS serial
LEFT JOIN pg_sequence AS s ON s.seqrelid = serial.oid AND s.seqcache = 1
