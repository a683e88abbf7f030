/* SPDX-License-Identifier: MIT */
/*
 * The statements of the operator commands (redrive and replay, unblock,
 * the pauses the workers read, the schema version) and of ordered mode's
 * head keeping (classification, repair, failing the rows the destination
 * CHECK refuses), one builder each; statements.c collects them with the
 * statements of the lease, its marks and the sweeper. The shapes are
 * those of docs/design.md §6 and §10, each for a measured reason given
 * there: read it before changing one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* Redrive and replay: by ids, type and a finished_at range. */
static char *redrive_where(const char *status)
{
	return store_asprintf(
	    "status = '%s' AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[])) "
	    "AND ($2::text IS NULL OR type = $2) AND finished_at >= "
	    "coalesce($3::timestamptz, '-infinity') AND finished_at < "
	    "coalesce($4::timestamptz, 'infinity')",
	    status);
}

/*
 * Ordered mode: the redriven rows take their place in their
 * key's seq order again. The key's first pending row after them, the one
 * row of the key that could be head (any later one has it in front), is
 * locked NOWAIT and demoted if it is head, so the redriven row, classified
 * next, is the key's only head and goes first. Locking that row keeps a
 * classification from making it head meanwhile; the rows behind it, left
 * unclassified (sql_classify), are not touched. A later row held by a lease
 * (being published now) fails the lock with 55P03 and the batch changes
 * nothing: redriving behind it would deliver it first, and demoting it is not
 * possible while it is held. Rows whose key has a later row sent or in flight
 * are the caller's to refuse: it checks before the first batch, and again for
 * the returned ids inside each batch's transaction (the statement itself would
 * scan every sent row of the table for that).
 */
/* A row made pending again from outside the relay is written anew: its
 * written_by names this transaction, so the lease's late scan finds it
 * once it commits, wherever its next_attempt_at lies (statements.c, $6).
 * A table made by hand may lack the column (rows then wait for a rescan). */
static const char *rewritten(const struct store *s)
{
	return s->written_missing ? "" : ", written_by = pg_current_xact_id()";
}

static char *sql_redrive_ordered(const struct store *s, const char *status,
				 const char *where)
{
	const char *T = s->table.quoted;
	return store_asprintf(
	    "WITH r AS MATERIALIZED (SELECT id, partition_key, seq FROM %s "
	    "WHERE %s ORDER BY finished_at LIMIT %d FOR NO KEY UPDATE SKIP "
	    "LOCKED), "
	    "later AS MATERIALIZED (SELECT x.id FROM %s x WHERE x.id = "
	    "ANY(ARRAY(SELECT (SELECT o.id FROM %s o WHERE o.partition_key "
	    "= k.partition_key AND o.seq > k.seq AND o.status = 'pending' "
	    "ORDER BY o.seq LIMIT 1) FROM (SELECT partition_key, min(seq) "
	    "AS seq FROM r WHERE partition_key IS NOT NULL GROUP BY "
	    "partition_key) k)) AND x.status = 'pending' FOR NO KEY UPDATE "
	    "NOWAIT), "
	    "demoted AS (UPDATE %s AS d SET head = false WHERE d.id = "
	    "ANY(ARRAY(SELECT id FROM later)) AND d.head RETURNING 1) "
	    "UPDATE %s AS t SET status = 'pending', attempts = 0, "
	    "next_attempt_at = now(), finished_at = NULL, suspect = false, "
	    "head = NULL%s WHERE t.id = ANY(ARRAY(SELECT id FROM r)) AND "
	    "t.status = '%s' RETURNING t.id::text",
	    T, where, REDRIVE_BATCH, T, T, T, T, rewritten(s), status);
}

static char *sql_redrive(const struct store *s, const char *status)
{
	const char *T = s->table.quoted;
	char *where = redrive_where(status);
	if (where && s->opt.ordered) {
		char *sql = sql_redrive_ordered(s, status, where);
		free(where);
		return sql;
	}
	char *sql =
	    where ? store_asprintf("WITH r AS MATERIALIZED (SELECT id FROM %s "
				   "WHERE %s ORDER BY finished_at LIMIT %d FOR "
				   "NO KEY UPDATE SKIP LOCKED) UPDATE %s AS t "
				   "SET status = 'pending', attempts = 0, "
				   "next_attempt_at = now(), finished_at = "
				   "NULL, suspect = false, head = NULL%s "
				   "WHERE t.id = ANY(ARRAY(SELECT id FROM r)) "
				   "AND t.status = '%s'",
				   T, where, REDRIVE_BATCH, T, rewritten(s),
				   status)
		  : NULL;
	free(where);
	return sql;
}

char *sql_redrive_failed(const struct store *s)
{
	return sql_redrive(s, "failed");
}

char *sql_redrive_sent(const struct store *s)
{
	return sql_redrive(s, "sent");
}

static char *sql_count(const struct store *s, const char *status)
{
	char *where = redrive_where(status);
	char *sql = where ? store_asprintf("SELECT count(*)::text FROM %s "
					   "WHERE %s",
					   s->table.quoted, where)
			  : NULL;
	free(where);
	return sql;
}

char *sql_count_failed(const struct store *s)
{
	return sql_count(s, "failed");
}

char *sql_count_sent(const struct store *s)
{
	return sql_count(s, "sent");
}

char *sql_control(const struct store *s)
{
	char control[160];
	table_derived(&s->table, "_control", control, sizeof(control));
	return store_asprintf("SELECT destination FROM %s ORDER BY destination",
			      control);
}

/* Rows the destination CHECK of migration 004 refuses: pending ones (and
 * rows of the row lease a sweep would return to pending) whose exchange or
 * routing key holds a control character. Only old rows can: the CHECK
 * refuses every new one. */
#define REFUSED_ROW                                                            \
	"(coalesce(%s.exchange, '') ~ '[\\x01-\\x1f\\x7f]' OR "                \
	"%s.routing_key ~ '[\\x01-\\x1f\\x7f]')"

/*
 * Fails, with the reason, up to 1000 rows the table's destination CHECK
 * would refuse, while that CHECK is NOT VALID (migration 004 leaves it so
 * when old pending rows break it; Postgres then still checks it on every
 * update that leaves a row pending, and one such row would fail each
 * classification, settle and sweep that touched it, with every other row
 * of the statement). The one-time filter on pg_constraint skips the scan
 * once the CHECK is valid: no pending row can break it then. Ordered
 * mode: a failed head hands its key's marker on past such rows (skip) or
 * blocks its key (block); a failed row that was not head blocks its key
 * under block (the head out now is delivered, the marker stops there, see
 * order_tail), and under skip changes nothing for its key. Run once per
 * session and on the error path (store_fail_refused).
 */
char *sql_fail_refused(const struct store *s)
{
	const char *T = s->table.quoted;
	char *bad = store_asprintf(REFUSED_ROW, "t", "t");
	char *ok_next = store_asprintf("NOT " REFUSED_ROW, "o", "o");
	char *tail = NULL;
	if (!s->opt.ordered)
		tail = strdup("");
	else if (s->opt.block_on_failure)
		tail = store_asprintf(
		    ", blocked AS (INSERT INTO %s (partition_key, "
		    "blocking_id, reason) SELECT d.partition_key, d.id, "
		    "d.last_error FROM done d WHERE d.partition_key IS NOT "
		    "NULL ORDER BY d.seq ON CONFLICT (partition_key) DO "
		    "NOTHING RETURNING 1) ",
		    s->blocked);
	else if (ok_next)
		tail = store_asprintf(
		    ", promoted AS (UPDATE %s AS p SET head = true WHERE p.id "
		    "= ANY(ARRAY(SELECT (SELECT o.id FROM %s o WHERE "
		    "o.partition_key = d.partition_key AND o.seq > d.seq AND "
		    "o.status = 'pending' AND %s ORDER BY o.seq LIMIT 1) FROM "
		    "done d WHERE d.partition_key IS NOT NULL AND d.head)) "
		    "RETURNING 1) ",
		    T, T, ok_next);
	char *sql =
	    bad && tail
		? store_asprintf(
		      "WITH bad AS MATERIALIZED (SELECT t.id FROM %s t WHERE "
		      "(t.status = 'pending' OR (t.status = 'in_flight' AND "
		      "t.lease_expires_at < now())) AND %s AND EXISTS (SELECT "
		      "1 FROM pg_constraint WHERE conrelid = '%s'::regclass "
		      "AND conname = '%s_destination_text' AND NOT "
		      "convalidated) ORDER BY t.seq LIMIT 1000 FOR NO KEY "
		      "UPDATE SKIP LOCKED), "
		      "done AS (UPDATE %s AS t SET status = 'failed', "
		      "finished_at = statement_timestamp(), suspect = false, "
		      "last_error = 'refused by the table''s CHECK "
		      "%s_destination_text: ' || CASE WHEN "
		      "coalesce(t.exchange, '') ~ '[\\x01-\\x1f\\x7f]' THEN "
		      "'exchange' ELSE 'routing_key' END || ' contains a "
		      "control character (a row written before migration "
		      "004)' WHERE t.id = ANY(ARRAY(SELECT id FROM bad)) AND "
		      "t.status IN ('pending', 'in_flight') RETURNING t.id, "
		      "t.partition_key, t.seq, t.last_error, t.head) "
		      "%sSELECT count(*)::text FROM done",
		      T, bad, T, s->table.name, T, s->table.name, tail)
		: NULL;
	free(bad);
	free(ok_next);
	free(tail);
	return sql;
}

/*
 * Ordered mode's classification (docs/design.md §6): the keyed rows not
 * classified yet that head their key (no older row of the key unfinished,
 * the key not blocked) become head. The others are left as they are, not
 * written: a key's next row becomes head when the mark that finishes its
 * predecessor hands it the marker, or, if a race left the key with no
 * head, by the sweeper's repair. So this statement reads each row once:
 * "next" takes the rows after $1, the seq this session's walk has reached;
 * "late" takes the rows whose writer the previous classification's
 * snapshot ($2; NULL: none) could not see, the rows committed behind the
 * walk since (a producer transaction that began before a row it follows
 * in seq, a redrive), from the index of writers from that snapshot's
 * xmin (every writer when that xmin is past the cluster's xmax: a
 * restored database). Only heads are locked, SKIP LOCKED as before: a
 * redrive holds a key's later rows while it puts an older one back, and
 * a head another classification holds is that one's to make. Returns
 * the heads made, and what the store keeps for the next call (lease.c,
 * store_classify): how far the walk got, whether the late scan stopped at
 * its limit, and this snapshot.
 */
char *sql_classify(const struct store *s)
{
	const char *T = s->table.quoted;
	const int n = CLASSIFY_BATCH;
	/* $2's xmin, or every writer when it is past the cluster's xmax. */
	const char *restored = "pg_snapshot_xmin($2::pg_snapshot) > "
			       "pg_snapshot_xmax(pg_current_snapshot())";
	char *late =
	    s->written_missing
		? store_asprintf("late AS MATERIALIZED (SELECT NULL::uuid AS "
				 "id, NULL::bigint AS seq, NULL::text AS "
				 "partition_key WHERE $2::pg_snapshot IS NOT "
				 "NULL AND false), ")
		: store_asprintf(
		      "late AS MATERIALIZED (SELECT id, seq, partition_key "
		      "FROM %s WHERE status = 'pending' AND written_by >= "
		      "(CASE WHEN %s THEN '0'::xid8 ELSE "
		      "pg_snapshot_xmin($2::pg_snapshot) END) AND (NOT "
		      "pg_visible_in_snapshot(written_by, $2::pg_snapshot) OR "
		      "%s) AND head IS NULL AND partition_key IS NOT NULL "
		      "ORDER BY written_by LIMIT %d), ",
		      T, restored, restored, n);
	char *sql =
	    late ? store_asprintf(
		       "WITH next AS MATERIALIZED (SELECT id, seq, "
		       "partition_key FROM %s WHERE status = 'pending' AND "
		       "head IS NULL AND partition_key IS NOT NULL AND seq > "
		       "$1::int8 ORDER BY seq LIMIT %d), %s"
		       "heads AS MATERIALIZED (SELECT f.id FROM (SELECT * "
		       "FROM next UNION SELECT * FROM late) f WHERE NOT "
		       "EXISTS (SELECT 1 FROM %s o WHERE o.partition_key = "
		       "f.partition_key AND o.seq < f.seq AND o.status IN "
		       "('pending', 'in_flight')) AND NOT EXISTS (SELECT 1 "
		       "FROM %s b WHERE b.partition_key = f.partition_key)), "
		       "locked AS MATERIALIZED (SELECT t.id FROM %s t WHERE "
		       "t.id = ANY(ARRAY(SELECT id FROM heads)) AND t.status "
		       "= 'pending' AND t.head IS NULL FOR NO KEY UPDATE SKIP "
		       "LOCKED), "
		       "made AS (UPDATE %s AS t SET head = true WHERE t.id = "
		       "ANY(ARRAY(SELECT id FROM locked)) RETURNING 1) "
		       "SELECT (SELECT count(*) FROM made), (SELECT count(*) "
		       "FROM next), (SELECT max(seq) FROM next), (SELECT "
		       "count(*) FROM late), pg_current_snapshot()::text",
		       T, n, late, T, s->blocked, T, T)
		 : NULL;
	free(late);
	return sql;
}

/* The sweeper's repair: a mark that raced an insert, or a classification
 * that raced a mark, can leave a key whose oldest live row is not head
 * (demoted, or never made head: rows behind a head stay unclassified).
 * It skips from key to key along key_idx from $1 (inclusive; '' is the
 * first key), reading only each key's first live row, and stops after
 * $2 keys: rows behind a head are never read, so a sweep costs one index
 * descent per key, and at most $2 of them however many keys the table
 * holds (docs/design.md §6, "The head repair walks keys, not rows").
 * Returns the heads made, the keys walked and the last key walked, where
 * the next walk goes on when this one stopped at $2 (lease.c). */
char *sql_repair(const struct store *s)
{
	const char *T = s->table.quoted;
	return store_asprintf(
	    "WITH RECURSIVE first AS ((SELECT partition_key, id, status, head, "
	    "1 AS n FROM %s WHERE status IN ('pending', 'in_flight') AND "
	    "partition_key IS NOT NULL AND partition_key >= $1::text ORDER BY "
	    "partition_key, seq LIMIT 1) "
	    "UNION ALL SELECT x.partition_key, x.id, x.status, x.head, f.n + "
	    "1 FROM first f CROSS JOIN LATERAL (SELECT o.partition_key, o.id, "
	    "o.status, o.head FROM %s o WHERE o.status IN ('pending', "
	    "'in_flight') AND o.partition_key IS NOT NULL AND o.partition_key "
	    "> f.partition_key ORDER BY o.partition_key, o.seq LIMIT 1) x "
	    "WHERE f.n < $2::int), "
	    "stuck AS MATERIALIZED (SELECT f.id FROM first f WHERE f.status = "
	    "'pending' AND f.head IS NOT true AND NOT EXISTS (SELECT 1 FROM %s "
	    "b WHERE b.partition_key = f.partition_key)), "
	    "made AS (UPDATE %s AS t SET head = true WHERE t.id = "
	    "ANY(ARRAY(SELECT id FROM stuck)) AND t.status = 'pending' "
	    "RETURNING 1) "
	    "SELECT (SELECT count(*) FROM made), (SELECT count(*) FROM first), "
	    "(SELECT partition_key FROM first ORDER BY n DESC LIMIT 1)",
	    T, T, s->blocked, T);
}

/* Redrive in ordered mode: rows whose key already went further. */
char *sql_redrive_check(const struct store *s)
{
	const char *T = s->table.quoted;
	return store_asprintf(
	    "SELECT count(*)::text FROM %s r WHERE r.status = ANY($5::text[]) "
	    "AND ($1::uuid[] IS NULL OR r.id = ANY($1::uuid[])) AND ($2::text "
	    "IS NULL OR r.type = $2) AND r.finished_at >= "
	    "coalesce($3::timestamptz, '-infinity') AND r.finished_at < "
	    "coalesce($4::timestamptz, 'infinity') AND r.partition_key IS "
	    "NOT NULL AND EXISTS (SELECT 1 FROM %s x WHERE x.partition_key "
	    "= r.partition_key AND x.seq > r.seq AND x.status IN ('sent', "
	    "'in_flight'))",
	    T, T);
}

/* The same inside a redrive batch's transaction, for the rows it just
 * redrove ($1): a later row sent since the check above. */
char *sql_redrive_recheck(const struct store *s)
{
	const char *T = s->table.quoted;
	return store_asprintf(
	    "SELECT count(*)::text FROM %s r WHERE r.id = ANY($1::uuid[]) "
	    "AND r.partition_key IS NOT NULL AND EXISTS (SELECT 1 FROM %s x "
	    "WHERE x.partition_key = r.partition_key AND x.seq > r.seq AND "
	    "x.status IN ('sent', 'in_flight'))",
	    T, T);
}

char *sql_unblock(const struct store *s)
{
	return store_asprintf("DELETE FROM %s WHERE partition_key = $1 "
			      "RETURNING blocking_id::text",
			      s->blocked);
}

char *sql_unblock_skip(const struct store *s)
{
	const char *T = s->table.quoted;
	return store_asprintf(
	    "UPDATE %s AS t SET head = true WHERE t.id = (SELECT o.id FROM "
	    "%s o WHERE o.partition_key = $1 AND o.status = 'pending' ORDER "
	    "BY o.seq LIMIT 1)",
	    T, T);
}

char *sql_unblock_redrive(const struct store *s)
{
	return store_asprintf(
	    "UPDATE %s SET status = 'pending', attempts = 0, "
	    "next_attempt_at = now(), finished_at = NULL, suspect = false, "
	    "head = true%s WHERE id = $1::uuid AND status = 'failed'",
	    s->table.quoted, rewritten(s));
}

char *sql_version(const struct store *s)
{
	char version[160];
	table_derived(&s->table, "_schema_version", version, sizeof(version));
	return store_asprintf("SELECT coalesce(max(version), 0)::text FROM %s",
			      version);
}
