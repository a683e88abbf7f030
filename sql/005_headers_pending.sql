-- outbox:no-transaction
-- 005: the headers CHECK holds pending rows only, as 004's destination
-- CHECK does. Postgres evaluates every CHECK on every UPDATE, whatever
-- columns it sets, and 001's called headers_ok() for each row each mark
-- wrote: a SQL function with a subquery is never inlined, so each call
-- started an executor, and each statement parsed its body again trying
-- to inline it. A fifth of a worker session's Postgres CPU went there
-- (docs/benchmark.md). Now a mark, which moves a row out of pending,
-- short-circuits on the status; inserts, a retry and a redrive (both put
-- rows back to pending) are checked as before, with the same SQLSTATE
-- (23514). headers_ok becomes PL/pgSQL, which the planner never tries to
-- inline, so no statement parses it.
--
-- Lock time: the new CHECK is added NOT VALID (catalog change only, under
-- migrate's lock_timeout), then the old one dropped, each in its own short
-- transaction; VALIDATE scans under SHARE UPDATE EXCLUSIVE, which lets
-- inserts, leases and marks go on. Between the two steps both CHECKs hold,
-- so no row escapes either.
CREATE OR REPLACE FUNCTION {{s}}"{{n}}_headers_ok"(h jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
BEGIN
  RETURN jsonb_typeof(h) = 'object' AND NOT EXISTS (
    SELECT 1 FROM jsonb_each(h) AS e(k, v)
    WHERE jsonb_typeof(e.v) <> 'string'
       OR e.k = ''
       OR lower(e.k) LIKE 'ce\_%'
       OR lower(e.k) LIKE 'ce-%'
       OR lower(e.k) LIKE 'cloudevents%'
       OR lower(e.k) = 'content-type');
END
$fn$
-- outbox:next
DO $do$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint
                 WHERE conrelid = '{{table}}'::regclass
                   AND conname = '{{n}}_headers_pending') THEN
    ALTER TABLE {{table}} ADD CONSTRAINT "{{n}}_headers_pending" CHECK (
      status <> 'pending' OR {{s}}"{{n}}_headers_ok"(headers)) NOT VALID;
  END IF;
END
$do$
-- outbox:next
ALTER TABLE {{table}} DROP CONSTRAINT IF EXISTS "{{n}}_headers_check"
-- outbox:next
ALTER TABLE {{table}} VALIDATE CONSTRAINT "{{n}}_headers_pending"
