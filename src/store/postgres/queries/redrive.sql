-- Makes dead letters deliverable again, with a fresh count of attempts (and
-- one more redrive counted) and their own seq, so an ordered aggregate resumes with its head. Only rows
-- still dead-lettered and not discarded change. {selector} picks them: by id
-- ($1 uuid[]), by aggregate ($1 as text), or all.
UPDATE {table} AS o
SET dead_lettered_at = NULL,
    attempts         = 0,
    redrives         = o.redrives + 1,
    available_at     = now(),
    lease_id         = NULL,
    locked_until     = NULL
WHERE o.dead_lettered_at IS NOT NULL
  AND o.discarded_at IS NULL
  AND {selector}
