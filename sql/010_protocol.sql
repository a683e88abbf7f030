-- 010: the protocol each relay speaks, and the contract steps that need it
-- (docs/design.md §11, "Contract steps wait for the relays' protocol").
--
-- Migrations only expand: a relay of the previous version keeps running
-- beside them during a rolling upgrade. What older relays need and newer
-- ones do not (an index only the head marker's classification read; a
-- table shape the naming by bare ctid cannot work on) can go only once no
-- such relay is left, which the version text of the registry does not
-- tell. So each relay now records the protocol it speaks in the registry
-- at every heartbeat (NULL: a relay older than this migration), and
-- `outbox-relay migrate --contract` runs a contract step only when every
-- relay seen alive speaks the protocol the step needs, recording the step
-- here first; a relay refuses a table whose contract steps need a newer
-- protocol than its own.
--
-- Lock time: a nullable column without a default is a catalog change
-- under migrate's lock_timeout; the contract table is new. Expand only:
-- relays of version 009 never read either.
ALTER TABLE {{s}}"{{n}}_replicas" ADD COLUMN IF NOT EXISTS protocol integer;
CREATE TABLE IF NOT EXISTS {{s}}"{{n}}_contract" (
  step       text        PRIMARY KEY,
  protocol   integer     NOT NULL,
  applied_at timestamptz NOT NULL DEFAULT now(),
  applied_by text        NOT NULL DEFAULT current_user
);
