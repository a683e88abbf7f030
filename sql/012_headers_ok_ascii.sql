-- 012: headers_ok() accepts without a query the headers producers
-- usually write, string values under names it allows (traceparent,
-- tracestate, a tenant). Since 011 only the empty object skipped the
-- query over jsonb_each(), which starts an executor on every call, each
-- producer insert with headers. jsonb_path_exists() is a function call
-- in a PL/pgSQL simple expression: no executor, its regular expression
-- compiled once per session. Measured (docs/benchmark.md, "What the mark
-- to sent costs"): 21 us less Postgres CPU for an insert with two
-- headers.
--
-- The answer is the same as before for every value: the jsonpath only
-- accepts, and only where 005's query accepts; anything it does not
-- accept (a refusal, a non-object) takes that query as before. 005
-- refuses a value not a string, an empty key, a key whose lower() begins
-- with ce_, ce- or cloudevents or is content-type. The jsonpath matches
-- each of those letters as [cC] and the like, without a case-folding
-- flag (whose rules are not lower()'s): in Unicode's case mappings, as
-- glibc and ICU apply them in every locale, lower() turns no character
-- but the letter itself and its capital into one of those letters, "-"
-- or "_" (the non-ASCII characters with an ASCII lower case are the
-- Kelvin sign and the dotted capital I, giving k and i; Turkish turns I
-- into a dotless i). test_checks_and_migrations checks that on every
-- code point for the database's collation, C.utf8 and ICU's.
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
  IF jsonb_typeof(h) = 'object' AND NOT jsonb_path_exists(h,
       '$.keyvalue() ? (@.value.type() != "string" || @.key like_regex
        "^$|^([cC][eE][_-]|[cC][lL][oO][uU][dD][eE][vV][eE][nN][tT][sS]|[cC][oO][nN][tT][eE][nN][tT]-[tT][yY][pP][eE]$)")') THEN
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
