-- Resolves a table's ids once at start: its oid (the key of its quiet mark) and
-- the sequence behind its seq column (what the watcher probes). No sequence when
-- seq is not an identity/serial column, or when the sequence caches values
-- (CACHE > 1): then inserts need not move what the probe reads.
-- $1 quoted table name.
SELECT $1::regclass::oid AS relid, s.seqrelid AS sequence
FROM (SELECT pg_get_serial_sequence($1, 'seq')::regclass::oid AS oid) AS serial
LEFT JOIN pg_sequence AS s ON s.seqrelid = serial.oid AND s.seqcache = 1
