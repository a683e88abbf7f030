-- Runbook queries for outbox-relay (docs/design.md §9; docs/runbook.md
-- says which alert each section answers). Read-only unless a line says
-- otherwise, and every statement that would change something is commented
-- out. Run them with psql as a role that can read the outbox table and
-- pg_stat_activity in full (pg_monitor, or a superuser).
--
-- The table is the default public outbox_events. For another one, replace
-- every "outbox_events" (its side tables share the prefix), for example:
--   sed 's/outbox_events/app.orders_outbox/g' sql/runbook.sql | psql -X "$URL"
-- `outbox-relay status` shows most of this at once; these are the pieces
-- to dig further.

\echo '== 1. Backlog growing: rows by state, due now, oldest, throughput'
SELECT status, count(*) AS rows,
       count(*) FILTER (WHERE status = 'pending' AND next_attempt_at <= now()) AS due_now,
       min(created_at) AS oldest_created
FROM outbox_events
-- OR, not IN: each status's partial index serves its side (a BitmapOr);
-- IN reads the whole table, history included.
WHERE (status = 'pending' OR status = 'in_flight')
GROUP BY status;

-- Events sent per minute over the last 10 minutes (the drain rate to
-- compare with the producers' insert rate).
SELECT date_trunc('minute', finished_at) AS minute, count(*) AS sent
FROM outbox_events
WHERE status = 'sent' AND finished_at > now() - interval '10 minutes'
GROUP BY 1 ORDER BY 1;

-- Where the backlog goes: one slow or paused destination, or one type.
SELECT coalesce(exchange, '(default)') AS destination, type, count(*) AS pending,
       min(created_at) AS oldest_created
FROM outbox_events
WHERE status = 'pending'
GROUP BY 1, 2 ORDER BY pending DESC LIMIT 20;

-- Operator pauses in force ('*' stops all leasing). Lift one with
-- `outbox-relay resume [--destination D]`.
SELECT destination, paused_at, now() - paused_at AS paused_for, paused_by, reason
FROM outbox_events_control ORDER BY paused_at;

\echo '== 2. Oldest pending old: is it waiting for a relay, backing off, or stuck behind a key?'
SELECT id, type, coalesce(exchange, '(default)') AS destination, partition_key,
       now() - created_at AS age, next_attempt_at - now() AS due_in,
       attempts, max_attempts, suspect, left(last_error, 200) AS last_error
FROM outbox_events
WHERE status = 'pending'
ORDER BY created_at LIMIT 20;

\echo '== 3. Lease latency rising: bloat and what holds back vacuum'
-- Dead tuples the lease has to step over, and when vacuum last ran.
SELECT relname, n_live_tup, n_dead_tup, last_vacuum, last_autovacuum,
       autovacuum_count, pg_size_pretty(pg_total_relation_size(relid)) AS size
FROM pg_stat_user_tables
WHERE relid = 'outbox_events'::regclass;

-- The oldest snapshots holding back this database. Vacuum cannot remove
-- any row of its tables that died after the oldest of these began. A
-- session that has written holds the horizon by its transaction id even
-- between statements, with no snapshot, and does so from any database
-- (every snapshot here counts its transaction as running); a snapshot of
-- another database's session holds back nothing here. Replication slots,
-- walsenders (no database) and prepared transactions count everywhere.
SELECT 'session' AS kind, pid::text AS who, application_name, usename, state,
       CASE WHEN datname = current_database() OR datid IS NULL
            THEN greatest(age(backend_xmin), age(backend_xid))
            ELSE age(backend_xid) END AS xmin_age,
       now() - xact_start AS xact_age,
       now() - state_change AS in_state_for, left(query, 200) AS query
FROM pg_stat_activity
WHERE pid <> pg_backend_pid()
  AND (backend_xid IS NOT NULL OR (backend_xmin IS NOT NULL
       AND (datname = current_database() OR datid IS NULL)))
UNION ALL
SELECT 'replication slot', slot_name, slot_type, NULL,
       CASE WHEN active THEN 'active' ELSE 'INACTIVE' END,
       age(xmin), NULL, NULL, NULL
FROM pg_replication_slots WHERE xmin IS NOT NULL
UNION ALL
SELECT 'prepared transaction', gid, NULL, owner, 'prepared',
       age(transaction), now() - prepared, NULL, NULL
FROM pg_prepared_xacts
ORDER BY xmin_age DESC NULLS LAST LIMIT 10;

-- Ending the culprit (after checking with its owner):
--   SELECT pg_terminate_backend(<pid>);            -- a session
--   ROLLBACK PREPARED '<gid>';                     -- a prepared transaction
--   SELECT pg_drop_replication_slot('<slot>');     -- an abandoned slot
-- Then vacuum the table at once instead of waiting for autovacuum:
--   VACUUM (VERBOSE) outbox_events;

-- Sessions waiting on a lock, and who blocks them (DDL on the outbox table
-- queues every lease behind it).
SELECT pid, application_name, wait_event_type, wait_event,
       pg_blocking_pids(pid) AS blocked_by, now() - query_start AS waiting_for,
       left(query, 200) AS query
FROM pg_stat_activity
WHERE cardinality(pg_blocking_pids(pid)) > 0;

\echo '== 4. Lost leases: who holds rows, and are the holders alive?'
-- The replica registry: silent for more than 15 s means dead.
SELECT id, version, state, started_at, last_seen_at,
       last_seen_at > now() - interval '15 seconds' AS alive
FROM outbox_events_replicas ORDER BY last_seen_at DESC;

-- In-flight rows by holder (leased_by up to its second '/' is the
-- registry id). A lease is a row lock held by the worker's open
-- transaction, recorded in outbox_events_claims (the rows still say
-- pending; a claim's holder is leased_by, then '#' and the lease
-- transaction's id); rows a relay of an older version leased say in_flight.
WITH f AS (
  SELECT regexp_replace(c.holder, '#[0-9]+$', '') AS leased_by, c.leased_at, c.expires_at AS lease_expires_at
  FROM outbox_events_claims c, unnest(c.ids) AS u(id)
  -- (a claim copied from another cluster may hold an xid this one has not
  -- reached, which pg_xact_status() refuses: docs/runbook.md, restores)
  WHERE CASE WHEN c.xid < (SELECT pg_snapshot_xmax(pg_current_snapshot()))
        THEN pg_xact_status(c.xid) END = 'in progress'
  UNION ALL
  SELECT leased_by, leased_at, lease_expires_at
  FROM outbox_events WHERE status = 'in_flight')
SELECT split_part(f.leased_by, '/', 1) || '/' || split_part(f.leased_by, '/', 2) AS holder,
       coalesce(bool_or(r.last_seen_at > now() - interval '15 seconds'), false) AS holder_alive,
       count(*) AS rows,
       count(*) FILTER (WHERE f.lease_expires_at < now()) AS expired,
       min(f.lease_expires_at) - now() AS next_expiry,
       max(now() - f.leased_at) AS longest_held
FROM f
LEFT JOIN outbox_events_replicas r
  ON r.id = split_part(f.leased_by, '/', 1) || '/' || split_part(f.leased_by, '/', 2)
GROUP BY 1 ORDER BY rows DESC;

-- Rows that came back from a lost lease (crash suspects) and rows
-- leased many times: a relay dies on them, or leases end before the
-- broker answers (OUTBOX_LEASE_TIMEOUT too short for the publish deadline).
SELECT id, type, status, attempts, max_attempts, suspect, leased_by,
       left(last_error, 200) AS last_error
FROM outbox_events
WHERE (status = 'pending' OR status = 'in_flight') AND (suspect OR attempts >= 3)
ORDER BY attempts DESC LIMIT 20;

\echo '== 5. Failed rows: by type, with the latest error'
SELECT type, count(*) AS failed, max(finished_at) AS last_failed,
       (SELECT left(x.last_error, 300) FROM outbox_events x
        WHERE x.status = 'failed' AND x.type = f.type
        ORDER BY x.finished_at DESC LIMIT 1) AS latest_error
FROM outbox_events f
WHERE status = 'failed'
GROUP BY type ORDER BY failed DESC;

-- The latest failures one by one.
SELECT id, type, coalesce(exchange, '(default)') AS destination, routing_key,
       attempts, max_attempts, finished_at, left(last_error, 300) AS last_error
FROM outbox_events
WHERE status = 'failed'
ORDER BY finished_at DESC LIMIT 20;
-- Once the cause is fixed:
--   outbox-relay redrive --type <type> --dry-run
--   outbox-relay redrive --type <type>          (or --id <uuid> ..., --since 2h)

\echo '== 6. Blocked keys (ordered delivery with OUTBOX_ORDERING_ON_FAILURE=block)'
SELECT b.partition_key, b.blocked_at, now() - b.blocked_at AS blocked_for,
       left(b.reason, 200) AS reason, b.blocking_id, e.type, e.status,
       (SELECT count(*) FROM outbox_events w
        WHERE w.partition_key = b.partition_key AND w.status = 'pending'
          AND w.seq > coalesce(e.seq, -1)) AS waiting  -- rows before the blocking one still go
FROM outbox_events_blocked_keys b
LEFT JOIN outbox_events e ON e.id = b.blocking_id
ORDER BY b.blocked_at;
-- Resolve each key once its failed row is understood:
--   outbox-relay unblock --key <key> --skip      (give up on the row)
--   outbox-relay unblock --key <key> --redrive   (retry it, then the rest)

\echo '== 7. No sweep cluster-wide: expired leases waiting, and who holds the sweep lock'
-- (leases whose transaction ended without committing, and rows of older
-- relays whose lease expired)
SELECT (SELECT coalesce(sum(cardinality(ids)), 0) FROM outbox_events_claims
        WHERE cardinality(ids) > 0 AND CASE WHEN xid <
          (SELECT pg_snapshot_xmax(pg_current_snapshot()))
          THEN pg_xact_status(xid) END = 'aborted')
       + count(*) AS expired_leases,
       min(lease_expires_at) AS oldest_expiry
FROM outbox_events
WHERE status = 'in_flight' AND lease_expires_at < now();

-- The sweeper takes transaction-level advisory lock (0x6f620002 =
-- 1868693506, hashtext of the table name) per batch; a session holding it
-- for long stops every replica's sweep.
SELECT l.pid, a.application_name, a.state, now() - a.xact_start AS xact_age,
       left(a.query, 200) AS query
FROM pg_locks l JOIN pg_stat_activity a USING (pid)
WHERE l.locktype = 'advisory' AND l.classid = 1868693506
  AND l.objid = hashtext('outbox_events')::oid;
