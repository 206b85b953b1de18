-- The index set: every statement outboxd runs has its index here. `{name_idx}`
-- stands for the index's name, the table's name with that suffix (shortened
-- for a long table name); adoption builds the missing ones CONCURRENTLY, so
-- producers keep inserting while a large table is indexed.
--
-- No index reads the lease columns: lease state lives in the lease table
-- (leases.sql), so a claim changes no index here. An event costs one entry in
-- the pending index when inserted and, when acked, one in the primary key and
-- one in the published index (the new row version; no index can be skipped
-- because published_at is in the pending index's predicate).

-- Claims read pending rows in delivery order, however much history is kept.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {pending_idx} ON {table}
    (seq) WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- Retention deletes the oldest published rows in bounded batches.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {published_idx} ON {table}
    (published_at) WHERE published_at IS NOT NULL;

-- Dead letters are listed by operators and counted by GetStats.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {dead_letter_idx} ON {table}
    (dead_lettered_at) WHERE dead_lettered_at IS NOT NULL;
