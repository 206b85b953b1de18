-- The columns outboxd owns. Adoption adds only the missing ones, one
-- `ADD COLUMN IF NOT EXISTS` line of this statement each, in one ALTER TABLE.
ALTER TABLE {table}
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
    ADD COLUMN IF NOT EXISTS dead_lettered_at timestamptz,
    -- An operator gave the dead-lettered event up (OutboxAdmin.Discard): it is
    -- never delivered, and retention deletes it like a published one.
    ADD COLUMN IF NOT EXISTS discarded_at     timestamptz,
    -- How many times an operator redrove the event out of the dead letters:
    -- `attempts` starts again at a redrive, so consumers learn from this (the
    -- x-outbox-redriven header) that a publication is a re-publication.
    ADD COLUMN IF NOT EXISTS redrives         integer     NOT NULL DEFAULT 0
