-- The heads that hold their aggregate back (ordered outboxes under
-- poison=block): dead-lettered, not discarded, with no earlier event of their
-- aggregate still unsettled. Read through the dead-letter index (dead letters
-- are few), each checked by one probe of the aggregate index.
SELECT d.id, d.aggregate_id AS aggregate_key, d.aggregate_id::text AS aggregate_id,
       d.seq, d.dead_lettered_at AS since
FROM {table} AS d
WHERE d.dead_lettered_at IS NOT NULL
  AND d.discarded_at IS NULL
  AND NOT EXISTS (
      SELECT 1 FROM {table} AS p
      WHERE p.aggregate_id = d.aggregate_id
        AND p.seq < d.seq
        AND p.published_at IS NULL
        AND p.discarded_at IS NULL)
