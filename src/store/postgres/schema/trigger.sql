-- Wakes long-polling claimers when an insert commits (never for a rollback).
-- The function, shared by every outbox table, is the migrations' (it reads
-- the quiet marks that let producers skip NOTIFY while outboxd probes).
CREATE OR REPLACE TRIGGER outboxd_notify AFTER INSERT ON {table}
    REFERENCING NEW TABLE AS outboxd_new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION outboxd_notify()
