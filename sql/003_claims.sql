-- 003: the claims of the lock lease (docs/design.md §3-§4). Expand only:
-- relays of earlier versions keep leasing by row updates while this
-- applies, and the sweeper of this version still returns their rows.
--
-- A worker leases by locking rows in a transaction that spans the publish;
-- before it hands any row to the broker it records, in its own committed
-- row here, which rows it holds and under which transaction (xid). The
-- row is rewritten once per batch (one small write, instead of a rewrite
-- of every leased row); nothing marks it done: the transaction's commit
-- does. A claim whose transaction aborted (a crash, a stall past the
-- lease, a lost connection) is how the sweeper finds the rows whose
-- attempt must be charged.
CREATE TABLE IF NOT EXISTS {{s}}"{{n}}_claims" (
  holder      text        PRIMARY KEY,  -- host/pid/worker
  lease_id    uuid        NOT NULL,     -- names the batch in logs and status
  xid         xid8        NOT NULL,     -- the lease transaction
  ids         uuid[]      NOT NULL,     -- its rows; emptied once swept
  source      text        NOT NULL,     -- CloudEvents source it used for
                                        -- rows whose source is NULL
  leased_at   timestamptz NOT NULL,
  expires_at  timestamptz NOT NULL      -- moved by renewals; for status
);
-- Rewritten once per batch: keep its pages free for HOT updates, and let
-- autovacuum visit it often (a handful of rows, constantly updated).
ALTER TABLE {{s}}"{{n}}_claims" SET (fillfactor = 50,
  autovacuum_vacuum_threshold = 50, autovacuum_vacuum_scale_factor = 0);
