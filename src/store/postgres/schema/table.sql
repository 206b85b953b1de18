-- The producers' columns: what an application INSERTs in the same transaction
-- as its state change. Run only when the configured table does not exist; an
-- existing table keeps its own producer columns, of any type adoption accepts
-- (`PRODUCER_TYPES`: the classic shape has a uuid aggregate_id).
CREATE TABLE IF NOT EXISTS {table} (
    id           uuid        PRIMARY KEY,
    aggregate_id text        NOT NULL,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
)
