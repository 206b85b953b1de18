-- The canonical outbox table, its indexes and its wake-up trigger.
--
-- Producers INSERT id, aggregate_id, event_type, payload, headers and created_at
-- in the same transaction as their state change; every other column belongs to
-- outboxd. A pre-existing `outbox` table of the classic shape (uuid aggregate_id,
-- no lease columns) is adopted: only what is missing is added.

CREATE TABLE IF NOT EXISTS outbox (
    id           uuid        PRIMARY KEY,
    aggregate_id text        NOT NULL,
    event_type   text        NOT NULL,
    payload      jsonb       NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

ALTER TABLE outbox
    ADD COLUMN IF NOT EXISTS headers          jsonb       NOT NULL DEFAULT '{}',
    -- Stable delivery order. Never a high-water mark: identity values are taken
    -- at insert time, not commit time, so "everything after the last seq seen"
    -- would skip rows of transactions that commit late.
    ADD COLUMN IF NOT EXISTS seq              bigint      GENERATED ALWAYS AS IDENTITY,
    ADD COLUMN IF NOT EXISTS published_at     timestamptz,
    ADD COLUMN IF NOT EXISTS attempts         integer     NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS available_at     timestamptz NOT NULL DEFAULT now(),
    ADD COLUMN IF NOT EXISTS locked_until     timestamptz,
    ADD COLUMN IF NOT EXISTS lease_id         uuid,
    ADD COLUMN IF NOT EXISTS claimed_by       text,
    ADD COLUMN IF NOT EXISTS claimed_at       timestamptz,
    ADD COLUMN IF NOT EXISTS last_error       text,
    ADD COLUMN IF NOT EXISTS dead_lettered_at timestamptz;

-- Pending rows only: claims stay cheap however much history the table retains.
CREATE INDEX IF NOT EXISTS outbox_pending_idx
    ON outbox (seq) WHERE published_at IS NULL AND dead_lettered_at IS NULL;

-- ExtendLease without ids finds a lease's rows here.
CREATE INDEX IF NOT EXISTS outbox_lease_idx
    ON outbox (lease_id) WHERE lease_id IS NOT NULL AND published_at IS NULL;

-- Retention deletes the oldest published rows in bounded batches.
CREATE INDEX IF NOT EXISTS outbox_published_idx
    ON outbox (published_at) WHERE published_at IS NOT NULL;

-- Dead letters are listed by operators and counted by GetStats.
CREATE INDEX IF NOT EXISTS outbox_dead_letter_idx
    ON outbox (dead_lettered_at) WHERE dead_lettered_at IS NOT NULL;

-- Wakes long-polling claimers: NOTIFY is delivered when the inserting transaction
-- commits, never for a rollback. The payload names the table and how many rows the
-- statement inserted, so outboxd wakes as many waiters as there is work for.
CREATE OR REPLACE FUNCTION outboxd_notify() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    inserted bigint;
BEGIN
    SELECT count(*) INTO inserted FROM outboxd_new_rows;
    IF inserted > 0 THEN
        PERFORM pg_notify('outboxd', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || ' ' || inserted);
    END IF;
    RETURN NULL;
END
$$;

CREATE OR REPLACE TRIGGER outboxd_notify
    AFTER INSERT ON outbox
    REFERENCING NEW TABLE AS outboxd_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outboxd_notify();
