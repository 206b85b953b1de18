-- The producers' columns: what an application INSERTs in the same transaction
-- as its state change. Run only when the configured table does not exist; an
-- existing table keeps its own producer columns, of any type adoption accepts
-- (`PRODUCER_TYPES`: the classic shape has a uuid aggregate_id).
--
-- fillfactor 70 leaves room on each page for the ack's new row version: an
-- update that stays on its page logs only the bytes it changed, and needs no
-- extra record to lock the old version while a new page is found. Measured on
-- a drain, it cut WAL per event by about 14 % (`FILLFACTOR` in schema/mod.rs).
CREATE TABLE IF NOT EXISTS {table} (
    id           uuid        PRIMARY KEY,
    aggregate_id text        NOT NULL,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 70)
