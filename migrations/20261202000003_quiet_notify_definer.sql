-- The trigger reads the quiet mark as its owner, not as the inserting role: a
-- producer needs neither USAGE on outboxd's schema nor SELECT on the mark, as
-- before the mark existed. search_path is pinned, as for any SECURITY DEFINER
-- function; the body names the mark table with its schema.

REVOKE SELECT ON outboxd_quiet FROM PUBLIC;

DO $migration$
BEGIN
    EXECUTE format($function$
        CREATE OR REPLACE FUNCTION outboxd_notify() RETURNS trigger
        LANGUAGE plpgsql
        SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $body$
        DECLARE
            inserted bigint;
        BEGIN
            IF EXISTS (SELECT 1 FROM %I.outboxd_quiet
                       WHERE relid = TG_RELID AND quiet_until > clock_timestamp()) THEN
                RETURN NULL;
            END IF;
            SELECT count(*) INTO inserted FROM outboxd_new_rows;
            IF inserted > 0 THEN
                PERFORM pg_notify('outboxd', TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME || ' ' || inserted);
            END IF;
            RETURN NULL;
        END
        $body$
    $function$, current_schema());
END
$migration$;
