-- The index set: every statement outboxd runs has its index here. `{name_idx}`
-- stands for the index's name, the table's name with that suffix (shortened
-- for a long table name); adoption builds the missing ones CONCURRENTLY, so
-- producers keep inserting while a large table is indexed.
--
-- Pending rows are split by lease so that a claim never walks past rows it
-- cannot take: fresh and released rows in delivery order, leased rows by
-- expiry (a claim reads only the expired ones). One pending index in seq order
-- made every claim heap-fetch every lease in flight ahead of the first free row.
-- Each event still costs the same index writes: a row moves from the first to
-- the second when claimed and leaves both when settled.

CREATE INDEX CONCURRENTLY IF NOT EXISTS {unleased_idx} ON {table}
    (seq) WHERE published_at IS NULL AND dead_lettered_at IS NULL AND locked_until IS NULL;

CREATE INDEX CONCURRENTLY IF NOT EXISTS {leased_idx} ON {table}
    (locked_until) WHERE published_at IS NULL AND dead_lettered_at IS NULL AND locked_until IS NOT NULL;

-- ExtendLease without ids finds a lease's rows here.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {lease_idx} ON {table}
    (lease_id) WHERE lease_id IS NOT NULL AND published_at IS NULL;

-- Retention deletes the oldest published rows in bounded batches.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {published_idx} ON {table}
    (published_at) WHERE published_at IS NOT NULL;

-- Dead letters are listed by operators and counted by GetStats.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {dead_letter_idx} ON {table}
    (dead_lettered_at) WHERE dead_lettered_at IS NOT NULL;
