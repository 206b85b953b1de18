-- The producers' columns: what an application INSERTs in the same transaction
-- as its state change. Run only when the configured table does not exist; an
-- existing table keeps its own producer columns, of any type adoption accepts
-- (`PRODUCER_TYPES`: the classic shape has a uuid aggregate_id).
--
-- fillfactor 45 leaves room on each page for every row's ack to write its
-- new version there: an update that stays on its page logs only the bytes it
-- changed, needs no extra record to lock the old version while a new page is
-- found, and never lands on an old page that then costs a full-page image
-- (once vacuumed, pages of retained rows have room, and at fillfactor 70 the
-- acks that did not fit went there: 1.16x the classic relay's WAL per event
-- on a table with history, bench/results/ANALYSIS.md section 24; at 45,
-- 0.77-0.79x fresh and with history). Pending rows take about 1.7 times the
-- pages until acked (`FILLFACTOR` in schema/mod.rs).
CREATE TABLE IF NOT EXISTS {table} (
    id           uuid        PRIMARY KEY,
    aggregate_id text        NOT NULL,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 45)
