-- The last value handed out by a table's seq sequence: moves with every insert,
-- committed or not, and costs no table access. $1 sequence oid.
SELECT coalesce(pg_sequence_last_value($1::oid::regclass), 0) AS last_value
