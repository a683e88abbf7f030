-- Roles for the outbox, least privilege (docs/design.md §2). Run with psql
-- as the table's owner after `outbox-relay migrate`, naming your roles:
--
--   psql -v app_role=orders_app -v relay_role=outbox_relay \
--        -v schema=public -v table=outbox_events -f sql/grants.sql
--
-- The application inserts events (directly or through the helpers); the
-- relay reads, updates and deletes them; migrations run as the owner (the
-- DDL role). Repeat after a migration that adds a table.

GRANT USAGE ON SCHEMA :"schema" TO :"app_role", :"relay_role";

-- Application: INSERT only, plus the producer helpers. SELECT on the id
-- column alone is what ON CONFLICT (id) DO NOTHING (the idempotent helper)
-- needs; the rows' contents stay unreadable to the application.
GRANT INSERT, SELECT (id) ON :"schema".:"table" TO :"app_role";
SELECT format('GRANT EXECUTE ON FUNCTION %I.%I(%s) TO %I', :'schema', p.proname,
              pg_get_function_identity_arguments(p.oid), :'app_role')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = :'schema'
  AND p.proname IN (:'table' || '_enqueue', :'table' || '_enqueue_json', :'table' || '_uuidv7')
\gexec
-- Both: the headers' CHECK calls this function on every insert, and on
-- every update of a row's headers or status back to pending (the relay's
-- retries and redrives), where EXECUTE was revoked from PUBLIC.
SELECT format('GRANT EXECUTE ON FUNCTION %I.%I(%s) TO %I, %I', :'schema', p.proname,
              pg_get_function_identity_arguments(p.oid), :'app_role', :'relay_role')
FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
WHERE n.nspname = :'schema' AND p.proname = :'table' || '_headers_ok'
\gexec

-- Relay: SELECT, UPDATE, DELETE on the table; its side tables (replica
-- registry, operator pauses, schema version, contract steps) for status
-- and pause.
GRANT SELECT, UPDATE, DELETE ON :"schema".:"table" TO :"relay_role";
-- A table partitioned by `migrate --partition`: the cleaner reads and
-- deletes the default partition's finished rows by its own name, which
-- takes privileges on it (the day partitions are the relay's own).
SELECT format('GRANT SELECT, UPDATE, DELETE ON %I.%I TO %I', :'schema', c.relname, :'relay_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :'schema' AND c.relkind = 'r' AND c.relispartition
  AND c.relname = :'table' || '_default'
\gexec
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.%I TO %I', :'schema', c.relname, :'relay_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :'schema' AND c.relkind = 'r'
  AND c.relname IN (:'table' || '_replicas', :'table' || '_control', :'table' || '_blocked_keys',
                    :'table' || '_key_heads', :'table' || '_claims')
\gexec
SELECT format('GRANT SELECT ON %I.%I TO %I', :'schema', c.relname, :'relay_role')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = :'schema' AND c.relkind = 'r'
  AND c.relname IN (:'table' || '_schema_version', :'table' || '_contract')
\gexec
-- Relay: reading seq's sequence (not drawing from it), which ordered mode
-- checks against the table's rows at every connect (docs/design.md §6).
SELECT format('GRANT SELECT ON SEQUENCE %s TO %I',
              pg_get_serial_sequence(format('%I.%I', :'schema', :'table'), 'seq'), :'relay_role')
\gexec

-- Not granted here, since only a superuser (or a role holding it with
-- ADMIN OPTION) may: pg_read_all_stats lets the relay see how long another
-- role's session has held the xmin horizon (outbox_xmin_horizon_age_seconds
-- and its alert; without it that age reads 0). As a superuser:
--   GRANT pg_read_all_stats TO outbox_relay;
