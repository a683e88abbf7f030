-- outbox:no-transaction
-- 004: no control characters in exchange and routing_key (docs/security.md):
-- they reach broker frames and the relay's log lines. Expand only: relays
-- of version 003 keep running while this applies.
--
-- Lock time on a big table: the CHECK is added NOT VALID, which takes the
-- table's ACCESS EXCLUSIVE lock only for the catalog change (no scan), in
-- its own short transaction under migrate's lock_timeout, retried while the
-- application holds the table; from then on every insert and update is
-- checked. VALIDATE then scans the existing rows under SHARE UPDATE
-- EXCLUSIVE, which lets inserts, leases and marks go on.
--
-- Only pending rows are held to it: a row already leased, sent or failed
-- before this migration may still carry such a value, and the relay's own
-- updates of it (the lease, the mark that fails it, a sweep) must not be
-- refused, or one old row would stop a whole batch. The encoder fails such
-- rows with the reason (section 10 of docs/design.md). When old pending
-- rows violate it, VALIDATE is skipped with a warning and the constraint
-- stays NOT VALID: still enforced for every new row, and those old rows
-- fail in the encoder instead; every later `migrate` tries VALIDATE again
-- (src/store/migrate.c), so it becomes valid once they are failed.
DO $do$
BEGIN
  IF NOT EXISTS (SELECT 1 FROM pg_constraint
                 WHERE conrelid = '{{table}}'::regclass
                   AND conname = '{{n}}_destination_text') THEN
    ALTER TABLE {{table}} ADD CONSTRAINT "{{n}}_destination_text" CHECK (
      status <> 'pending'
      OR (coalesce(exchange, '') !~ '[\x01-\x1f\x7f]'
          AND routing_key !~ '[\x01-\x1f\x7f]')) NOT VALID;
  END IF;
END
$do$
-- outbox:next
DO $do$
BEGIN
  ALTER TABLE {{table}} VALIDATE CONSTRAINT "{{n}}_destination_text";
EXCEPTION WHEN check_violation THEN
  RAISE WARNING 'pending rows hold control characters in exchange or routing_key: constraint % left NOT VALID', '{{n}}_destination_text';
END
$do$
