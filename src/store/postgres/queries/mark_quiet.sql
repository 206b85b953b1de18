-- Tells the table's trigger to skip NOTIFY for $2 seconds: this outboxd probes
-- the sequence itself meanwhile. greatest(): another replica's longer mark stands.
-- $1 table oid, $2 seconds.
INSERT INTO outboxd_quiet (relid, quiet_until)
VALUES ($1, clock_timestamp() + make_interval(secs => $2))
ON CONFLICT (relid) DO UPDATE
    SET quiet_until = greatest(outboxd_quiet.quiet_until, excluded.quiet_until)
