-- Lease state, one row per leased outbox row, kept apart from the outbox table:
-- UNLOGGED, so a claim or an ExtendLease writes no WAL and changes no index of
-- the outbox table. Losing it is harmless: PostgreSQL empties an unlogged
-- table after a crash, and a replica promoted by failover starts with it empty;
-- every row is then claimable again (at-least-once), and an ack under a lease
-- that is gone is fenced as LEASE_LOST.
--
-- attempts counts deliveries, this lease's included, since the outbox row's
-- own count was last written (ack, nack and dead-lettering copy it there).
CREATE UNLOGGED TABLE IF NOT EXISTS {leases} (
    id           uuid        PRIMARY KEY,
    lease_id     uuid        NOT NULL,
    locked_until timestamptz NOT NULL,
    claimed_by   text        NOT NULL,
    claimed_at   timestamptz NOT NULL,
    attempts     integer     NOT NULL,
    -- Ordered outboxes only (NULL otherwise): the leased event's aggregate,
    -- so a claim sees in one probe whether an aggregate is under a live lease.
    aggregate_id text,
    -- A delay row, not a delivery: the event waits here until locked_until
    -- (a nack's backoff, a producer's future available_at, a redrive) and
    -- is then taken back like an expired lease. It keeps the event below
    -- the claim cursor (`claim.sql`) from being passed over unleased.
    delayed      boolean     NOT NULL DEFAULT false
);

-- Ack, Nack and ExtendLease find a lease's rows here.
CREATE INDEX IF NOT EXISTS {leases_lease_idx} ON {leases} (lease_id);

-- A claim takes expired leases first, oldest expiry first.
CREATE INDEX IF NOT EXISTS {leases_expiry_idx} ON {leases} (locked_until);

-- An ordered claim asks whether the aggregate already holds a lease. The lease
-- tables of earlier releases lack the column: adoption adds it first.
CREATE INDEX IF NOT EXISTS {leases_aggregate_idx} ON {leases} (aggregate_id)
    WHERE aggregate_id IS NOT NULL;

-- The outbox's epoch: one row, stamped by outboxd's commit-order probe
-- (`queries/guard.sql`). UNLOGGED for what crash recovery does to it: it
-- empties the table, as a promoted standby starts without it, and that is
-- how outboxd learns that the database lost sequence values it had read and
-- drops what it derived from them.
CREATE UNLOGGED TABLE IF NOT EXISTS {epoch} (
    id         boolean     PRIMARY KEY DEFAULT true CHECK (id),
    epoch      uuid        NOT NULL,
    stamped_at timestamptz NOT NULL DEFAULT now()
);
