-- outbox:no-transaction
-- 007: the transaction that wrote each pending row, so a lease finds rows
-- committed late without walking the pending index from its start
-- (docs/design.md §4, "A held snapshot").
--
-- A lease's due scan starts at its session's scan floor; a row whose
-- next_attempt_at lies below it (a producer transaction that began before
-- the floor's rows and committed after them) was found only by a rescan
-- from the start of the index, and under a held snapshot (a pg_dump, a
-- report) that walks the entry of every row finished since the snapshot
-- was taken. written_by is the id of the transaction that made the row
-- pending from outside the relay: the producer's insert, or a redrive.
-- Every row a lease could not see is written by a transaction at or above
-- the xmin of that lease's snapshot, so the next lease reads the index
-- below from there: the rows of the last moments, whatever the hold's
-- length. Rows written before this migration have no written_by; they
-- are found by the rescans, as before, and are not in the index (which
-- its predicate also keeps out of statements that count pending rows).
--
-- Lock time: the column is added without a default, then given one; both
-- are catalog changes (no row is rewritten), each under migrate's
-- lock_timeout. The index is built CONCURRENTLY. Expand only: relays of
-- version 006 keep running beside it and never read the column.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS written_by xid8
-- outbox:next
ALTER TABLE {{table}} ALTER COLUMN written_by SET DEFAULT pg_current_xact_id()
-- outbox:next
CREATE INDEX CONCURRENTLY IF NOT EXISTS "{{n}}_written_idx"
  ON {{table}} (written_by, next_attempt_at)
  WHERE status = 'pending' AND written_by IS NOT NULL
