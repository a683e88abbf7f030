-- outbox:no-transaction
-- 006: claims the lease can read without visiting every claim ever
-- written (docs/design.md §4, "A held snapshot"). Expand only: relays of
-- version 005 keep running while this applies, and beside relays of this
-- version.
--
-- A worker wrote its claim over its previous one, one row per holder. While
-- a snapshot holds the xmin horizon, every rewrite leaves a version nobody
-- can remove, and each lease read them all: 10 minutes into a held
-- snapshot at 1,000 events/s a lease visited some 2,000 pages of claims,
-- and the holder's primary key held one entry per page of versions, each
-- checked by every rewrite. Relays of this version write each claim as a
-- new row (holder "host/pid/worker#xid", unique) and delete the previous
-- one in the same statement; written_by is the transaction that wrote it.
-- A lease reads only claims written at or after its session's claim floor:
-- a transaction id below which every claim is settled (design.md §4), so
-- the index below takes it straight to the handful of claims of the last
-- moments. Rows of relays of version 005 have no written_by and are read
-- as before.
--
-- Lock time: the column is nullable without a default (a catalog change,
-- under migrate's lock_timeout); the index is built CONCURRENTLY.
ALTER TABLE {{s}}"{{n}}_claims" ADD COLUMN IF NOT EXISTS written_by xid8
-- outbox:next
CREATE INDEX CONCURRENTLY IF NOT EXISTS "{{n}}_claims_written_idx"
  ON {{s}}"{{n}}_claims" (written_by)
