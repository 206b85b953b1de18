-- One page of blocked aggregates in the order of their heads' seq, after
-- seq $1, at most $2; `held` counts the events waiting behind each head.
WITH heads AS (
    {blocked}
)
SELECT h.id, h.aggregate_id, h.seq, h.since,
       (SELECT count(*) FROM {table} AS w
        WHERE w.aggregate_id = h.aggregate_key
          AND w.seq > h.seq
          AND w.published_at IS NULL
          AND w.discarded_at IS NULL) AS held
FROM heads AS h
WHERE h.seq > $1
ORDER BY h.seq
LIMIT $2
