-- The index an ordered outbox (`ordering=aggregate`) adds to the index set:
-- the events of one aggregate that still count for its order, in sequence
-- order. A claim probes it once per row it considers (is an earlier event of
-- this aggregate still unsettled?), and the admin calls find blocked heads and
-- what waits behind them through it. Unordered outboxes do without it, so
-- their producers do not pay for its upkeep.
CREATE INDEX CONCURRENTLY IF NOT EXISTS {aggregate_idx} ON {table}
    (aggregate_id, seq) WHERE published_at IS NULL AND discarded_at IS NULL;
