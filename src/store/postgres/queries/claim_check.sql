-- The second statement of a claim's transaction, on a newer snapshot. The
-- claim chose its rows on its own snapshot, so a row settled by a transaction
-- that committed meanwhile (acked, nacked or deleted under a lease that had
-- expired) may have been leased again. Such leases are dropped here and their
-- rows left out of the batch. A settle that commits later cannot slip past:
-- every settle goes through the row's lease row, which this transaction holds
-- until it commits, and then finds it under another lease.
-- $1 lease id. now() is the transaction's time, the same as the claim's.
DELETE FROM {leases} AS l
WHERE l.lease_id = $1::uuid
  AND NOT EXISTS (
      SELECT 1 FROM {table} AS o
      WHERE o.id = l.id
        AND o.published_at IS NULL
        AND o.dead_lettered_at IS NULL
        AND o.available_at <= now())
RETURNING l.id
