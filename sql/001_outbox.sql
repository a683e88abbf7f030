-- 001: the outbox table and everything it needs (docs/design.md §2).
--
-- Applied by `outbox-relay migrate`, which replaces the placeholders:
--   {{table}}  the quoted, possibly schema-qualified table ("app"."outbox_events")
--   {{s}}      the quoted schema followed by a dot, or nothing
--   {{n}}      the bare table name (validated: letters, digits, underscore),
--              used inside quotes for derived names ("{{n}}_pending_idx")
--   {{lit}}    the table as an SQL string literal ('app.outbox_events')
-- Every column lives here: adding one to a big live table later is expensive.

-- Time-ordered UUIDs (version 7): the first 48 bits are the Unix time in
-- milliseconds, so new ids land at the right edge of the primary key index
-- instead of all over it.
CREATE OR REPLACE FUNCTION {{s}}"{{n}}_uuidv7"() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL SAFE AS $fn$
  SELECT encode(
    set_bit(set_bit(
      overlay(uuid_send(gen_random_uuid())
              PLACING substring(int8send((extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
              FROM 1 FOR 6),
      52, 1), 53, 1), 'hex')::uuid
$fn$;

-- Headers are transport headers with string values. Names the relay writes
-- itself are refused so a producer cannot spoof CloudEvents attributes.
CREATE OR REPLACE FUNCTION {{s}}"{{n}}_headers_ok"(h jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
  SELECT jsonb_typeof(h) = 'object' AND NOT EXISTS (
    SELECT 1 FROM jsonb_each(h) AS e(k, v)
    WHERE jsonb_typeof(e.v) <> 'string'
       OR e.k = ''
       OR lower(e.k) LIKE 'ce\_%'
       OR lower(e.k) LIKE 'ce-%'
       OR lower(e.k) LIKE 'cloudevents%'
       OR lower(e.k) = 'content-type')
$fn$;

CREATE TABLE IF NOT EXISTS {{table}} (
  id               uuid        PRIMARY KEY DEFAULT {{s}}"{{n}}_uuidv7"(),
  -- CACHE 1: a per-session cache would hand out numbers out of commit order
  -- across sessions, and seq is the only meaning of "older".
  seq              bigint      GENERATED ALWAYS AS IDENTITY (CACHE 1) NOT NULL,
  type             text        NOT NULL CHECK (type <> ''),
  source           text        CHECK (source <> ''),
  subject          text,
  content_type     text        NOT NULL DEFAULT 'application/json' CHECK (content_type <> ''),
  exchange         text,
  routing_key      text        NOT NULL DEFAULT '',
  partition_key    text,
  payload          bytea       NOT NULL,
  headers          jsonb       NOT NULL DEFAULT '{}'
                               CHECK ({{s}}"{{n}}_headers_ok"(headers)),
  status           text        NOT NULL DEFAULT 'pending'
                               CHECK (status IN ('pending', 'in_flight', 'sent', 'failed')),
  attempts         integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  max_attempts     integer     NOT NULL DEFAULT 10 CHECK (max_attempts BETWEEN 1 AND 1000),
  last_error       text        CHECK (octet_length(last_error) <= 1100),
  next_attempt_at  timestamptz NOT NULL DEFAULT now(),
  created_at       timestamptz NOT NULL DEFAULT now(),
  lease_id         uuid,
  leased_at        timestamptz,
  lease_expires_at timestamptz,
  leased_by        text,
  finished_at      timestamptz,
  suspect          boolean     NOT NULL DEFAULT false,
  CONSTRAINT "{{n}}_in_flight_leased" CHECK (
    status <> 'in_flight'
    OR (lease_id IS NOT NULL AND leased_at IS NOT NULL AND lease_expires_at IS NOT NULL)),
  CONSTRAINT "{{n}}_terminal_finished" CHECK (
    status NOT IN ('sent', 'failed') OR finished_at IS NOT NULL)
);

-- Partial indexes keep every hot query sized by live work, not history.
-- Lease: due pending rows in (next_attempt_at, seq) order.
CREATE INDEX IF NOT EXISTS "{{n}}_pending_idx"
  ON {{table}} (next_attempt_at, seq) WHERE status = 'pending';
-- Lease: crash suspects, one per batch; tiny, so finding none costs nothing.
CREATE INDEX IF NOT EXISTS "{{n}}_suspect_idx"
  ON {{table}} (next_attempt_at, seq) WHERE status = 'pending' AND suspect;
-- Sweep: expired leases.
CREATE INDEX IF NOT EXISTS "{{n}}_in_flight_idx"
  ON {{table}} (lease_expires_at) WHERE status = 'in_flight';
-- Clean: terminal rows by status and finished_at (keyset cursor).
CREATE INDEX IF NOT EXISTS "{{n}}_terminal_idx"
  ON {{table}} (status, finished_at) WHERE status IN ('sent', 'failed');

-- A queue table turns over its whole live set constantly; the default 20 %
-- scale factors would let millions of dead tuples pile up on a big table
-- before autovacuum starts. Absolute thresholds keep it vacuumed by churn.
-- fillfactor stays at 100 here: every status change touches an indexed
-- column (status, next_attempt_at, lease_expires_at, finished_at), so no
-- update is HOT. (008 sets it to 70 all the same: a new version on its old
-- version's page is logged smaller.)
ALTER TABLE {{table}} SET (
  autovacuum_vacuum_scale_factor = 0,
  autovacuum_vacuum_threshold = 10000,
  autovacuum_vacuum_insert_scale_factor = 0,
  autovacuum_vacuum_insert_threshold = 10000,
  autovacuum_analyze_scale_factor = 0,
  autovacuum_analyze_threshold = 10000,
  autovacuum_vacuum_cost_delay = 1
);

-- The producer helper. For a non-null partition key it first takes a
-- transaction-level advisory lock on the key, so producers of one key
-- serialize and seq follows their commit order. With a deterministic p_id a
-- retried producer transaction inserts nothing the second time (for as long
-- as the first row is retained). Returns the row's id.
CREATE OR REPLACE FUNCTION {{s}}"{{n}}_enqueue"(
  p_type          text,
  p_payload       bytea,
  p_partition_key text    DEFAULT NULL,
  p_exchange      text    DEFAULT NULL,
  p_routing_key   text    DEFAULT '',
  p_headers       jsonb   DEFAULT '{}',
  p_subject       text    DEFAULT NULL,
  p_content_type  text    DEFAULT 'application/json',
  p_id            uuid    DEFAULT NULL,
  p_source        text    DEFAULT NULL,
  p_max_attempts  integer DEFAULT 10)
RETURNS uuid LANGUAGE plpgsql AS $fn$
DECLARE
  v_id uuid := coalesce(p_id, {{s}}"{{n}}_uuidv7"());
BEGIN
  IF p_partition_key IS NOT NULL THEN
    PERFORM pg_advisory_xact_lock(
      hashtextextended({{lit}} || chr(31) || p_partition_key, 0));
  END IF;
  INSERT INTO {{table}} (id, type, payload, partition_key, exchange,
                         routing_key, headers, subject, content_type,
                         source, max_attempts)
  VALUES (v_id, p_type, p_payload, p_partition_key, p_exchange,
          coalesce(p_routing_key, ''), coalesce(p_headers, '{}'), p_subject,
          coalesce(p_content_type, 'application/json'), p_source,
          coalesce(p_max_attempts, 10))
  ON CONFLICT (id) DO NOTHING;
  RETURN v_id;
END
$fn$;

-- The same with a jsonb payload, stored as its UTF-8 text.
CREATE OR REPLACE FUNCTION {{s}}"{{n}}_enqueue_json"(
  p_type          text,
  p_payload       jsonb,
  p_partition_key text  DEFAULT NULL,
  p_exchange      text  DEFAULT NULL,
  p_routing_key   text  DEFAULT '',
  p_headers       jsonb DEFAULT '{}',
  p_subject       text  DEFAULT NULL,
  p_id            uuid  DEFAULT NULL)
RETURNS uuid LANGUAGE sql AS $fn$
  SELECT {{s}}"{{n}}_enqueue"(p_type, convert_to(p_payload::text, 'UTF8'),
                              p_partition_key, p_exchange, p_routing_key,
                              p_headers, p_subject, 'application/json', p_id)
$fn$;

-- One row per relay process, upserted every few seconds; `status` shows
-- replicas whose last_seen_at is old as dead.
CREATE TABLE IF NOT EXISTS {{s}}"{{n}}_replicas" (
  id           text        PRIMARY KEY,   -- host/pod + pid
  version      text        NOT NULL,
  started_at   timestamptz NOT NULL DEFAULT now(),
  last_seen_at timestamptz NOT NULL DEFAULT now(),
  state        text        NOT NULL DEFAULT 'alive'
                           CHECK (state IN ('alive', 'draining'))
);

-- Pauses every replica reads each tick: destination '*' stops all leasing,
-- any other value stops leasing rows bound for that exchange or topic.
CREATE TABLE IF NOT EXISTS {{s}}"{{n}}_control" (
  destination text        PRIMARY KEY,
  paused_at   timestamptz NOT NULL DEFAULT now(),
  paused_by   text,
  reason      text
);
