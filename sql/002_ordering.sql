-- outbox:no-transaction
-- 002: ordered delivery per partition key (docs/design.md §6) and the
-- NOTIFY wake-up function (§7). Expand only: relays of version 001
-- keep running while this applies. Indexes are built CONCURRENTLY, so no
-- statement here blocks the application's inserts for long; every
-- statement is idempotent, so a run cut short is completed by the next.
--
-- The per-key head marker: in ordered mode a keyed pending row may be
-- leased only while head is true, and at most one row per key is head.
-- NULL means "not classified yet" (a fresh insert); the lease classifies
-- fresh rows, the marks move the marker to the next row of the key in the
-- statement that finishes the head, and the sweeper repairs keys left
-- without a head by a mark racing an insert.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS head boolean
-- outbox:next
-- Keys stopped by a failed head row under OUTBOX_ORDERING_ON_FAILURE=block,
-- until `outbox-relay unblock`. The cleaner never deletes a blocking row.
CREATE TABLE IF NOT EXISTS {{s}}"{{n}}_blocked_keys" (
  partition_key text        PRIMARY KEY,
  blocking_id   uuid        NOT NULL,
  blocked_at    timestamptz NOT NULL DEFAULT now(),
  reason        text
)
-- outbox:next
-- Ordered lease: due unkeyed rows and key heads only, so a hot key's
-- blocked rows are never read.
CREATE INDEX CONCURRENTLY IF NOT EXISTS "{{n}}_ordered_idx"
  ON {{table}} (next_attempt_at, seq)
  WHERE status = 'pending' AND (partition_key IS NULL OR head)
-- outbox:next
-- Fresh keyed rows waiting to be classified.
CREATE INDEX CONCURRENTLY IF NOT EXISTS "{{n}}_unclassified_idx"
  ON {{table}} (seq)
  WHERE status = 'pending' AND head IS NULL AND partition_key IS NOT NULL
-- outbox:next
-- Live rows by key: "is there an older unfinished row" and "the next row".
CREATE INDEX CONCURRENTLY IF NOT EXISTS "{{n}}_key_idx"
  ON {{table}} (partition_key, seq)
  WHERE status IN ('pending', 'in_flight') AND partition_key IS NOT NULL
-- outbox:next
-- NOTIFY once per inserting statement (not per row): each NOTIFY takes a
-- cluster-wide lock at commit, so fewer is cheaper. The trigger using it is
-- created by `outbox-relay migrate` when OUTBOX_LISTEN=on. The channel
-- placeholder is filled in by the relay, which also LISTENs on it; it is
-- named after a hash of the schema-qualified table, so outbox tables of the
-- same name in other schemas do not wake each other's relays.
CREATE OR REPLACE FUNCTION {{s}}"{{n}}_notify"() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
  PERFORM pg_notify({{channel}}, '');
  RETURN NULL;
END
$fn$
