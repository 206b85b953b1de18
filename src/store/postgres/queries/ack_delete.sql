-- Ack for an outbox with zero retention: the row is deleted instead of marked.
-- $1 lease id, $2 message ids. A repeated ack then finds nothing (NOT_FOUND).
DELETE FROM {table} AS o
USING current AS c
