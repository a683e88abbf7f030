/* SPDX-License-Identifier: MIT */
/*
 * The statements of the operator commands (redrive and replay, unblock,
 * the pauses the workers read, the schema version) and the failing of
 * the rows the destination CHECK refuses, one builder each; statements.c
 * collects them with the statements of the lease (statements_lease.c),
 * its marks and the sweeper. The shapes are
 * those of docs/design.md §6 and §10, each for a measured reason given
 * there: read it before changing one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* Rows the destination CHECK of migration 004 refuses: pending ones (and
 * rows of the row lease a sweep would return to pending) whose exchange or
 * routing key holds a control character. Only old rows can: the CHECK
 * refuses every new one. */
#define REFUSED_ROW                                                            \
	"(coalesce(%s.exchange, '') ~ '[\\x01-\\x1f\\x7f]' OR "                \
	"coalesce(%s.routing_key, '') ~ '[\\x01-\\x1f\\x7f]')"

/* The rows of the table (or its alias) named q that its destination
 * CHECK refuses as pending, where the table has that CHECK (a table made
 * by hand may not): one failed a redrive batch's whole statement. */
static char *refused_of(const struct store *s, const char *q)
{
	char *bad = store_asprintf(REFUSED_ROW, q, q);
	char *sql = bad ? store_asprintf("(%s AND EXISTS (SELECT 1 FROM "
					 "pg_constraint WHERE conrelid = "
					 "'%s'::regclass AND conname = "
					 "'%s_destination_text'))",
					 bad, s->table.quoted, s->table.name)
			: NULL;
	free(bad);
	return sql;
}

/* Redrive and replay: by ids, type and a finished_at range, the table
 * (or its alias) named q; the rows its destination CHECK refuses
 * (refused_of()) left out, unless all. */
static char *redrive_where_of(const struct store *s, const char *q,
			      const char *status, bool all)
{
	char *refused = refused_of(s, q);
	char *where =
	    refused ? store_asprintf(
			  "%1$s.status = '%2$s' AND ($1::uuid[] IS NULL OR "
			  "%1$s.id = ANY($1::uuid[])) AND ($2::text IS NULL OR "
			  "%1$s.type = $2) AND %1$s.finished_at >= "
			  "coalesce($3::timestamptz, '-infinity') AND "
			  "%1$s.finished_at < coalesce($4::timestamptz, "
			  "'infinity')%3$s%4$s",
			  q, status, all ? "" : " AND NOT ", all ? "" : refused)
		    : NULL;
	free(refused);
	return where;
}

static char *redrive_where(const struct store *s, const char *status)
{
	return redrive_where_of(s, s->table.quoted, status, false);
}

/*
 * Ordered mode: the redriven rows take their place in their key's seq
 * order again. The key's first pending row after them, the one row of the
 * key a lease could be taking now (any later one has it in front), is
 * locked NOWAIT and written (head = false, which also demotes it for
 * relays that still lease heads): a lease whose statement read the key
 * before this commits then finds that row in a newer version than it read
 * and leaves it (statements_lease.c, the key lock's version check), and
 * the next lease finds the redriven row first. The rows behind it are not
 * touched. A later row held by a lease (being published now) fails the
 * lock with 55P03 and the batch changes nothing: redriving behind it would
 * deliver it first. A next row that a lease's commit changed between the
 * statement's snapshot and the lock (failed, or deleted as sent without
 * history) is passed over by the lock, not refused: the statement returns
 * how many it wanted and did not lock, and the caller refuses the batch
 * then. Rows whose key has a later row sent or in flight are
 * the caller's to refuse: it checks before the first batch, and again for
 * the returned ids inside each batch's transaction (the statement itself
 * would scan every sent row of the table for that).
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
	    "wanted AS MATERIALIZED (SELECT (SELECT o.id FROM %s o WHERE "
	    "o.partition_key = k.partition_key AND o.seq > k.seq AND "
	    "o.status = 'pending' ORDER BY o.seq LIMIT 1) AS id FROM (SELECT "
	    "partition_key, min(seq) AS seq FROM r WHERE partition_key IS "
	    "NOT NULL GROUP BY partition_key) k), "
	    "later AS MATERIALIZED (SELECT x.id FROM %s x WHERE x.id = "
	    "ANY(ARRAY(SELECT id FROM wanted)) AND x.status = 'pending' FOR "
	    "NO KEY UPDATE NOWAIT), "
	    "demoted AS (UPDATE %s AS d SET head = false WHERE d.id = "
	    "ANY(ARRAY(SELECT id FROM later)) RETURNING 1) "
	    "UPDATE %s AS t SET status = 'pending', attempts = 0, "
	    "next_attempt_at = now(), finished_at = NULL, suspect = false, "
	    "head = NULL%s WHERE t.id = ANY(ARRAY(SELECT id FROM r)) AND "
	    "t.status = '%s' RETURNING t.id::text, (SELECT count(id) FROM "
	    "wanted) - (SELECT count(*) FROM later)",
	    T, where, REDRIVE_BATCH, T, T, T, T, rewritten(s), status);
}

static char *sql_redrive(const struct store *s, const char *status)
{
	const char *T = s->table.quoted;
	char *where = redrive_where(s, status);
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

/* The range's rows to redrive, and those passed over (refused_of()): one
 * read of the range for both. */
static char *sql_count(const struct store *s, const char *status)
{
	const char *T = s->table.quoted;
	char *where = redrive_where_of(s, T, status, true);
	char *refused = refused_of(s, T);
	char *sql = where && refused
			? store_asprintf("SELECT count(*) FILTER (WHERE NOT "
					 "%1$s)::text, count(*) FILTER (WHERE "
					 "%1$s)::text FROM %2$s WHERE %3$s",
					 refused, T, where)
			: NULL;
	free(where);
	free(refused);
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

/* The matching sent rows' first finished_at and one past their last, in
 * microseconds since 2000-01-01 (empty when none): the span redrive's
 * slices cover (redrive.c). */
char *sql_span_sent(const struct store *s)
{
	char *where = redrive_where(s, "sent");
	char *sql =
	    where
		? store_asprintf("SELECT (extract(epoch FROM min(finished_at)) "
				 "* 1000000 - 946684800000000)::bigint::text, "
				 "(extract(epoch FROM max(finished_at)) * "
				 "1000000 - 946684799999999)::bigint::text "
				 "FROM %s WHERE %s",
				 s->table.quoted, where)
		: NULL;
	free(where);
	return sql;
}

char *sql_control(const struct store *s)
{
	char control[160];
	table_derived(&s->table, "_control", control, sizeof(control));
	return store_asprintf("SELECT destination FROM %s ORDER BY destination",
			      control);
}

/*
 * Fails, with the reason, up to 1000 rows the table's destination CHECK
 * would refuse, while that CHECK is NOT VALID (migration 004 leaves it so
 * when old pending rows break it; Postgres then still checks it on every
 * update that leaves a row pending, and one such row would fail each
 * mark, settle and sweep that touched it, with every other row
 * of the statement). The one-time filter on pg_constraint skips the scan
 * once the CHECK is valid: no pending row can break it then. Ordered
 * mode under block: a failed row blocks its key, and the key's rows
 * before it still go (statements_lease.c). Run once per ordered
 * session and on the error path (store_fail_refused).
 */
char *sql_fail_refused(const struct store *s)
{
	const char *T = s->table.quoted;
	char *bad = store_asprintf(REFUSED_ROW, "t", "t");
	char *tail = NULL;
	if (!s->opt.ordered || !s->opt.block_on_failure)
		tail = strdup("");
	else
		tail = store_block_tail(s, "true");
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
		      "t.partition_key, t.seq, t.last_error) "
		      "%sSELECT count(*)::text FROM done",
		      T, bad, T, s->table.name, T, s->table.name, tail)
		: NULL;
	free(bad);
	free(tail);
	return sql;
}

/* Redrive in ordered mode: matching keyed rows whose key already went
 * further (a later row sent or in flight), and apart those that finished
 * longer ago than sent rows are kept ($5, milliseconds): a later row of
 * their key may have been sent and deleted since, unseen. The status is
 * written in, not a parameter: a partitioned table's indexes of finished
 * rows each serve one status (migrate_terminal.c), and only a plan that
 * knows which can pick its index. */
static char *sql_redrive_check(const struct store *s, const char *status)
{
	const char *T = s->table.quoted;
	char *where = redrive_where_of(s, "r", status, false);
	char *sql =
	    where
		? store_asprintf(
		      "SELECT count(*) FILTER (WHERE c.later)::text, count(*) "
		      "FILTER (WHERE NOT c.later AND c.gone)::text FROM "
		      "(SELECT EXISTS (SELECT 1 FROM %s x WHERE "
		      "x.partition_key = r.partition_key AND x.seq > r.seq AND "
		      "x.status IN ('sent', 'in_flight')) AS later, "
		      "r.finished_at < now() - $5::bigint * interval '1 "
		      "millisecond' AS gone FROM %s r WHERE %s AND "
		      "r.partition_key IS NOT NULL) c",
		      T, T, where)
		: NULL;
	free(where);
	return sql;
}

char *sql_redrive_check_sent(const struct store *s)
{
	return sql_redrive_check(s, "sent");
}

char *sql_redrive_check_failed(const struct store *s)
{
	return sql_redrive_check(s, "failed");
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
