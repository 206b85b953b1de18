-- Gives dead letters up for good: they stay dead-lettered, marked discarded,
-- until retention deletes them, and no longer hold an ordered aggregate back.
-- $1 message ids; rows not dead-lettered, or discarded already, stay as they are.
UPDATE {table} AS o
SET discarded_at = now()
WHERE o.id = ANY($1::uuid[])
  AND o.dead_lettered_at IS NOT NULL
  AND o.discarded_at IS NULL
