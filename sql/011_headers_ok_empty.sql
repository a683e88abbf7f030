-- 011: headers_ok() answers at once for the empty object, the headers of
-- most events (the column's default). The CHECK of 005 calls it for each
-- pending row inserted, and its query over jsonb_each() starts an
-- executor on every call: about 30 us of Postgres CPU per producer
-- insert with no headers at all, more than draining the row costs a
-- table queue without history (docs/benchmark.md, "What the mark to
-- sent costs"). The answer is the same as before for every value: '{}'
-- is an object without an entry to refuse; anything else takes the
-- query as before.
--
-- Lock time: CREATE OR REPLACE FUNCTION is a catalog change; no table is
-- locked or read, and the CHECK constraints stay as they are (nothing to
-- validate again). Expand only: a relay of version 010 runs on it as before.
CREATE OR REPLACE FUNCTION {{s}}"{{n}}_headers_ok"(h jsonb) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $fn$
BEGIN
  IF h = '{}'::jsonb THEN
    RETURN true;
  END IF;
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
