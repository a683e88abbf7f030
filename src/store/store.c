/* SPDX-License-Identifier: MIT */
/*
 * Every SQL statement the relay runs against the outbox table. Read
 * postgres-queue-pitfalls before changing one: the shapes below are the
 * contract's (sections 3, 4, 7) for measured reasons.
 */
#include "store.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "config/config.h"
#include "locks.h"
#include "migrate.h"
#include "pgconn.h"

enum stmt {
	ST_LEASE,
	ST_RENEW,
	ST_SENT,
	ST_RETRY,
	ST_TRANSPORT,
	ST_FAILED,
	ST_RELEASE,
	ST_RECHECK,
	ST_SWEEP,
	ST_CLEAN_SENT,
	ST_CLEAN_FAILED,
	ST_NEXT_DUE,
	ST_REDRIVE_FAILED,
	ST_REDRIVE_SENT,
	ST_COUNT_FAILED,
	ST_COUNT_SENT,
	ST_CONTROL,
	ST_CLASSIFY,
	ST_REPAIR,
	ST_REDRIVE_CHECK,
	ST_UNBLOCK,
	ST_UNBLOCK_SKIP,
	ST_UNBLOCK_REDRIVE,
	ST_VERSION,
	ST_COUNT
};

static const char *const stmt_names[ST_COUNT] = {
    "outbox_lease",	   "outbox_renew",	     "outbox_sent",
    "outbox_retry",	   "outbox_transport",	     "outbox_failed",
    "outbox_release",	   "outbox_recheck",	     "outbox_sweep",
    "outbox_clean_sent",   "outbox_clean_failed",    "outbox_next_due",
    "outbox_redrive_f",	   "outbox_redrive_s",	     "outbox_count_f",
    "outbox_count_s",	   "outbox_control",	     "outbox_classify",
    "outbox_repair",	   "outbox_redrive_check",   "outbox_unblock",
    "outbox_unblock_skip", "outbox_unblock_redrive", "outbox_version",
};

/* Internal: a serialization failure or deadlock; run the statement again. */
#define STORE_RETRY_STATEMENT (-3)

#define SWEEP_BATCH 500
#define REDRIVE_BATCH 1000
#define MARK_TRIES 3

struct store {
	struct store_options opt;
	struct outbox_table table;
	char *conninfo;
	char *app_name;
	char *leased_by;
	char *ce_source;
	char *extra_sql;
	char blocked[160]; /* the blocked-keys table, quoted */
	PGconn *conn;
	char *sql[ST_COUNT];
	bool prepared[ST_COUNT];
};

/* Rows of the lease's RETURNING list, in order. */
enum lease_col {
	LC_ID,
	LC_SEQ,
	LC_TYPE,
	LC_SOURCE,
	LC_SUBJECT,
	LC_CONTENT_TYPE,
	LC_EXCHANGE,
	LC_ROUTING_KEY,
	LC_PARTITION_KEY,
	LC_PAYLOAD,
	LC_HEADERS,
	LC_TIME,
	LC_CREATED_US,
	LC_ATTEMPTS,
	LC_MAX_ATTEMPTS,
	LC_LEASE_ID,
};

static char *xasprintf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

static char *xasprintf(const char *fmt, ...)
{
	char *out = NULL;
	va_list ap;
	va_start(ap, fmt);
	if (vasprintf(&out, fmt, ap) < 0)
		out = NULL;
	va_end(ap);
	return out;
}

/* The backoff of section 3 as an SQL expression over t.attempts: the
 * exponent is capped at 20 so no attempt count overflows an interval, and
 * each row gets +-20 % jitter so a failed batch does not return as one. */
static char *backoff_sql(const struct store_options *o)
{
	return xasprintf("now() + least(%lld::float8 * power(%.6f::float8, "
			 "least(greatest(t.attempts - 1, 0), 20)), "
			 "%lld::float8) * (0.8 + 0.4 * random()) "
			 "* interval '1 millisecond'",
			 (long long)o->backoff_base_ms, o->backoff_factor,
			 (long long)o->backoff_max_ms);
}

/*
 * Ordered mode: CTEs appended to a mark whose "done" CTE returns the rows
 * it finished. A row that became sent (or, under skip, failed) hands its
 * key's head marker to the key's next pending row, in the same statement;
 * under block a failed row records its key as blocked instead. Empty in
 * unordered mode.
 */
static char *order_tail(const struct store *s, bool may_fail)
{
	if (!s->opt.ordered)
		return strdup("");
	const char *T = s->table.quoted;
	const char *promote_when = !may_fail ? "d.status = 'sent'"
				   : s->opt.block_on_failure
				       ? "d.status = 'sent'"
				       : "d.status IN ('sent', 'failed')";
	char *promote = xasprintf(
	    ", promoted AS (UPDATE %s AS p SET head = true WHERE p.id = "
	    "ANY(ARRAY(SELECT (SELECT o.id FROM %s o WHERE o.partition_key "
	    "= d.partition_key AND o.seq > d.seq AND o.status = 'pending' "
	    "ORDER BY o.seq LIMIT 1) FROM done d WHERE d.partition_key IS "
	    "NOT NULL AND %s)) RETURNING 1) ",
	    T, T, promote_when);
	if (!promote || !may_fail || !s->opt.block_on_failure)
		return promote;
	char *both = xasprintf(
	    "%s, blocked AS (INSERT INTO %s (partition_key, blocking_id, "
	    "reason) SELECT d.partition_key, d.id, d.last_error FROM done d "
	    "WHERE d.partition_key IS NOT NULL AND d.status = 'failed' ON "
	    "CONFLICT (partition_key) DO NOTHING RETURNING 1) ",
	    promote, s->blocked);
	free(promote);
	return both;
}

static int build_statements(struct store *s)
{
	const char *T = s->table.quoted;
	const struct store_options *o = &s->opt;
	int n = o->batch_size;
	char *backoff = backoff_sql(o);
	char *tail_sent = NULL, *tail_fail = NULL;
	if (!backoff)
		return -1;
	/* Rows bound for a paused destination (or destination + routing
	 * key) are not leased; $3 is the paused list, $4 the default. */
	/* Ordered mode leases unkeyed rows and key heads only: the partial
	 * index of 002 holds nothing else, so a hot key's blocked rows are
	 * never read. */
	const char *not_paused =
	    o->ordered ? "(partition_key IS NULL OR head) AND NOT "
			 "(coalesce(exchange, $4) = ANY($3::text[]) OR "
			 "coalesce(exchange, $4) || chr(31) || routing_key = "
			 "ANY($3::text[]))"
		       : "NOT (coalesce(exchange, $4) = ANY($3::text[]) OR "
			 "coalesce(exchange, $4) || chr(31) || routing_key = "
			 "ANY($3::text[]))";

	/* One autocommit statement. The batch size is a literal so a
	 * generic plan never estimates the LIMIT as 10 % of the table; the
	 * lease id is made once in its own CTE (in the SET list it would run
	 * per row); a crash suspect is leased at most one per batch. CTEs
	 * are read lazily, so the pending CTE locks only what fits.
	 * "id = ANY(ARRAY(...))" keeps the update on the primary key: a join
	 * against the CTE may be planned as a hash join over the table. */
	s->sql[ST_LEASE] = xasprintf(
	    "WITH lease AS MATERIALIZED (SELECT gen_random_uuid() AS "
	    "lease_id), "
	    "suspect AS MATERIALIZED (SELECT id FROM %s "
	    "WHERE status = 'pending' AND suspect AND next_attempt_at <= "
	    "now() AND %s "
	    "ORDER BY next_attempt_at, seq LIMIT 1 "
	    "FOR NO KEY UPDATE SKIP LOCKED), "
	    "due AS MATERIALIZED (SELECT id FROM %s "
	    "WHERE status = 'pending' AND NOT suspect AND next_attempt_at "
	    "<= now() AND %s "
	    "ORDER BY next_attempt_at, seq LIMIT %d "
	    "FOR NO KEY UPDATE SKIP LOCKED), "
	    "picked AS (SELECT id FROM suspect UNION ALL "
	    "SELECT id FROM due LIMIT %d) "
	    "UPDATE %s AS t SET status = 'in_flight', "
	    "lease_id = lease.lease_id, leased_at = now(), "
	    "lease_expires_at = now() + $1::float8 * interval "
	    "'1 millisecond', leased_by = $2, attempts = t.attempts + 1, "
	    "source = coalesce(t.source, $5) "
	    "FROM lease WHERE t.id = ANY(ARRAY(SELECT id FROM picked)) "
	    "RETURNING t.id::text, t.seq::text, t.type, t.source, "
	    "t.subject, t.content_type, t.exchange, t.routing_key, "
	    "t.partition_key, t.payload, t.headers::text, "
	    "to_char(t.created_at AT TIME ZONE 'UTC', "
	    "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
	    "(extract(epoch FROM t.created_at) * 1000000)::bigint::text, "
	    "t.attempts::text, t.max_attempts::text, "
	    "lease.lease_id::text",
	    T, not_paused, T, not_paused, n, n, T);

	s->sql[ST_RENEW] = xasprintf(
	    "UPDATE %s SET lease_expires_at = now() + %lld * interval "
	    "'1 millisecond' WHERE id = ANY($1::uuid[]) AND lease_id = "
	    "$2::uuid AND status = 'in_flight' RETURNING id::text",
	    T, (long long)o->lease_timeout_ms);

	/* Marks return how many rows they moved; in ordered mode the same
	 * statement moves the key's head marker (or blocks the key). */
	const char *ret = " RETURNING t.id, t.partition_key, t.seq, t.status, "
			  "t.last_error) ";
	tail_sent = order_tail(s, false);
	tail_fail = order_tail(s, true);
	if (!tail_sent || !tail_fail)
		goto oom;
	s->sql[ST_SENT] = xasprintf(
	    "WITH done AS (UPDATE %s AS t SET status = 'sent', finished_at "
	    "= now(), suspect = false WHERE t.id = ANY($1::uuid[]) AND "
	    "t.lease_id = $2::uuid AND t.status = 'in_flight'%s%s"
	    "SELECT count(*)::text FROM done",
	    T, ret, tail_sent);

	/* Event class: failed once the attempts are spent. */
	s->sql[ST_RETRY] = xasprintf(
	    "WITH done AS (UPDATE %s AS t SET "
	    "status = CASE WHEN t.attempts >= t.max_attempts THEN 'failed' "
	    "ELSE 'pending' END, "
	    "finished_at = CASE WHEN t.attempts >= t.max_attempts THEN "
	    "now() END, next_attempt_at = %s, last_error = u.reason, "
	    "suspect = false "
	    "FROM unnest($1::uuid[], $3::text[]) AS u(id, reason) "
	    "WHERE t.id = ANY($1::uuid[]) AND t.id = u.id AND t.lease_id "
	    "= $2::uuid AND t.status = 'in_flight'%s%s"
	    "SELECT count(*)::text FROM done",
	    T, backoff, ret, tail_fail);

	/* Transport class: the broker's fault, so never failed for it; the
	 * row keeps its key's head. */
	s->sql[ST_TRANSPORT] = xasprintf(
	    "WITH done AS (UPDATE %s AS t SET status = 'pending', "
	    "next_attempt_at = %s, last_error = u.reason, suspect = false "
	    "FROM unnest($1::uuid[], $3::text[]) AS u(id, reason) "
	    "WHERE t.id = ANY($1::uuid[]) AND t.id = u.id AND t.lease_id "
	    "= $2::uuid AND t.status = 'in_flight'%s"
	    "SELECT count(*)::text FROM done",
	    T, backoff, ret);

	s->sql[ST_FAILED] = xasprintf(
	    "WITH done AS (UPDATE %s AS t SET status = 'failed', "
	    "finished_at = now(), last_error = u.reason, suspect = false "
	    "FROM unnest($1::uuid[], $3::text[]) AS u(id, reason) "
	    "WHERE t.id = ANY($1::uuid[]) AND t.id = u.id AND t.lease_id "
	    "= $2::uuid AND t.status = 'in_flight'%s%s"
	    "SELECT count(*)::text FROM done",
	    T, ret, tail_fail);

	/* Only rows never handed to the broker get their attempt back. */
	s->sql[ST_RELEASE] = xasprintf(
	    "WITH done AS (UPDATE %s AS t SET status = 'pending', attempts "
	    "= greatest(t.attempts - 1, 0), next_attempt_at = now() WHERE "
	    "t.id = ANY($1::uuid[]) AND t.lease_id = $2::uuid AND t.status "
	    "= 'in_flight'%s"
	    "SELECT count(*)::text FROM done",
	    T, ret);

	s->sql[ST_RECHECK] = xasprintf(
	    "SELECT count(*)::text FROM %s WHERE id = ANY($1::uuid[]) AND "
	    "lease_id = $2::uuid AND status = ANY($3::text[])",
	    T);

	/* Expired by the database clock, so replicas with different
	 * settings never sweep each other early. Suspects return with
	 * per-row jitter. lease_id stays for forensics. */
	s->sql[ST_SWEEP] = xasprintf(
	    "WITH expired AS MATERIALIZED (SELECT id FROM %s WHERE status "
	    "= 'in_flight' AND lease_expires_at < now() ORDER BY "
	    "lease_expires_at LIMIT %d FOR NO KEY UPDATE SKIP LOCKED), "
	    "done AS (UPDATE %s AS t SET "
	    "status = CASE WHEN t.attempts >= t.max_attempts THEN 'failed' "
	    "ELSE 'pending' END, "
	    "finished_at = CASE WHEN t.attempts >= t.max_attempts THEN "
	    "now() END, suspect = t.attempts < t.max_attempts, "
	    "next_attempt_at = now() + random() * %lld * interval "
	    "'1 millisecond', "
	    "last_error = left('lease expired (leased_by ' || "
	    "coalesce(t.leased_by, 'unknown') || ')', %d) "
	    "WHERE t.id = ANY(ARRAY(SELECT id FROM expired)) AND "
	    "t.status = 'in_flight' AND t.lease_expires_at < now()%s%s"
	    "SELECT status FROM done",
	    T, SWEEP_BATCH, T, (long long)o->backoff_base_ms, STORE_ERROR_MAX,
	    ret, tail_fail);

	/* Keyset batches by finished_at: the cursor ($1) moves past what is
	 * gone instead of rescanning the dead index edge each batch. Each
	 * batch must read its rows in index order and stop at the limit; a
	 * plan that sorts reads and sorts every expired row, each batch (1.5
	 * s per batch with 2M rows, against 50 ms). Two things led there:
	 * the blocking-row check inside the limited scan (with a
	 * never-analyzed blocked-keys table it became a hash anti join under
	 * a sort), so it applies to the scanned rows instead; and a generic
	 * plan, which estimates the cursor..cutoff range at 0.5 % of the
	 * table and sorts when that looks smaller than the batch, so the
	 * cleaner's transaction plans for the values (begin_locked). The
	 * cursor then comes from the scanned rows, and one past their last
	 * when the batch deleted nothing, so a run of blocking rows with one
	 * timestamp cannot hold it in place. */
	const char *clean_fmt =
	    "WITH scanned AS MATERIALIZED (SELECT id, finished_at FROM %s t "
	    "WHERE status = '%s' AND finished_at >= $1::timestamptz AND "
	    "finished_at < now() - $2::float8 * interval '1 millisecond' "
	    "ORDER BY finished_at LIMIT %d FOR UPDATE SKIP LOCKED), "
	    "gone AS (DELETE FROM %s AS t WHERE t.id = ANY(ARRAY(SELECT s.id "
	    "FROM scanned s WHERE NOT EXISTS (SELECT 1 FROM %s b WHERE "
	    "b.blocking_id = s.id))) RETURNING 1) "
	    "SELECT (SELECT count(*) FROM gone)::text, count(*)::text, "
	    "coalesce(max(finished_at)::text, ''), "
	    "coalesce((max(finished_at) + interval '1 microsecond')::text, '') "
	    "FROM scanned";
	s->sql[ST_CLEAN_SENT] =
	    xasprintf(clean_fmt, T, "sent", o->clean_batch_size, T, s->blocked);
	s->sql[ST_CLEAN_FAILED] = xasprintf(clean_fmt, T, "failed",
					    o->clean_batch_size, T, s->blocked);

	s->sql[ST_NEXT_DUE] = xasprintf(
	    "SELECT CASE WHEN min(next_attempt_at) IS NULL THEN -1 ELSE "
	    "greatest(0, ceil(extract(epoch FROM (min(next_attempt_at) - "
	    "now())) * 1000))::bigint END::text "
	    "FROM %s WHERE status = 'pending'%s",
	    T, o->ordered ? " AND (partition_key IS NULL OR head)" : "");

	/* Redrive and replay: by ids, type and a finished_at range. */
	const char *redrive_where =
	    "status = '%s' AND ($1::uuid[] IS NULL OR id = ANY($1::uuid[])) "
	    "AND ($2::text IS NULL OR type = $2) AND finished_at >= "
	    "coalesce($3::timestamptz, '-infinity') AND finished_at < "
	    "coalesce($4::timestamptz, 'infinity')";
	const char *states[2] = {"failed", "sent"};
	for (int i = 0; i < 2; i++) {
		char *where = xasprintf(redrive_where, states[i]);
		if (!where)
			break;
		s->sql[ST_REDRIVE_FAILED + i] = xasprintf(
		    "WITH r AS MATERIALIZED (SELECT id FROM %s WHERE %s "
		    "ORDER BY finished_at LIMIT %d FOR NO KEY UPDATE SKIP "
		    "LOCKED) UPDATE %s AS t SET status = 'pending', "
		    "attempts = 0, next_attempt_at = now(), finished_at = "
		    "NULL, suspect = false, head = NULL WHERE t.id = "
		    "ANY(ARRAY(SELECT id "
		    "FROM r)) AND t.status = '%s'",
		    T, where, REDRIVE_BATCH, T, states[i]);
		s->sql[ST_COUNT_FAILED + i] = xasprintf(
		    "SELECT count(*)::text FROM %s WHERE %s", T, where);
		free(where);
	}
	char control[160];
	table_derived(&s->table, "_control", control, sizeof(control));
	s->sql[ST_CONTROL] = xasprintf(
	    "SELECT destination FROM %s ORDER BY destination", control);
	/* Ordered mode: fresh keyed rows become head when no older row of
	 * their key is unfinished and the key is not blocked. */
	s->sql[ST_CLASSIFY] = xasprintf(
	    "WITH fresh AS MATERIALIZED (SELECT id FROM %s WHERE status = "
	    "'pending' AND head IS NULL AND partition_key IS NOT NULL ORDER "
	    "BY seq LIMIT 1000 FOR NO KEY UPDATE SKIP LOCKED) "
	    "UPDATE %s AS t SET head = NOT EXISTS (SELECT 1 FROM %s o WHERE "
	    "o.partition_key = t.partition_key AND o.seq < t.seq AND "
	    "o.status IN ('pending', 'in_flight')) AND NOT EXISTS (SELECT 1 "
	    "FROM %s b WHERE b.partition_key = t.partition_key) WHERE t.id "
	    "= ANY(ARRAY(SELECT id FROM fresh)) AND t.status = 'pending'",
	    T, T, T, s->blocked);
	/* The sweeper's repair: a mark that raced an insert can leave a key
	 * whose oldest live row is not head. */
	s->sql[ST_REPAIR] = xasprintf(
	    "WITH stuck AS MATERIALIZED (SELECT DISTINCT ON (partition_key) "
	    "id FROM %s t WHERE status = 'pending' AND head = false AND "
	    "partition_key IS NOT NULL AND NOT EXISTS (SELECT 1 FROM %s o "
	    "WHERE o.partition_key = t.partition_key AND o.seq < t.seq AND "
	    "o.status IN ('pending', 'in_flight')) AND NOT EXISTS (SELECT 1 "
	    "FROM %s b WHERE b.partition_key = t.partition_key) ORDER BY "
	    "partition_key, seq LIMIT 1000) "
	    "UPDATE %s AS t SET head = true WHERE t.id = ANY(ARRAY(SELECT "
	    "id FROM stuck)) AND t.status = 'pending'",
	    T, T, s->blocked, T);
	/* Redrive in ordered mode: rows whose key already went further. */
	s->sql[ST_REDRIVE_CHECK] = xasprintf(
	    "SELECT count(*)::text FROM %s r WHERE r.status = ANY($5::text[]) "
	    "AND ($1::uuid[] IS NULL OR r.id = ANY($1::uuid[])) AND ($2::text "
	    "IS NULL OR r.type = $2) AND r.finished_at >= "
	    "coalesce($3::timestamptz, '-infinity') AND r.finished_at < "
	    "coalesce($4::timestamptz, 'infinity') AND r.partition_key IS "
	    "NOT NULL AND EXISTS (SELECT 1 FROM %s x WHERE x.partition_key "
	    "= r.partition_key AND x.seq > r.seq AND x.status IN ('sent', "
	    "'in_flight'))",
	    T, T);
	s->sql[ST_UNBLOCK] =
	    xasprintf("DELETE FROM %s WHERE partition_key = $1 RETURNING "
		      "blocking_id::text",
		      s->blocked);
	s->sql[ST_UNBLOCK_SKIP] = xasprintf(
	    "UPDATE %s AS t SET head = true WHERE t.id = (SELECT o.id FROM "
	    "%s o WHERE o.partition_key = $1 AND o.status = 'pending' ORDER "
	    "BY o.seq LIMIT 1)",
	    T, T);
	s->sql[ST_UNBLOCK_REDRIVE] = xasprintf(
	    "UPDATE %s SET status = 'pending', attempts = 0, "
	    "next_attempt_at = now(), finished_at = NULL, suspect = false, "
	    "head = true WHERE id = $1::uuid AND status = 'failed'",
	    T);
	char version[160];
	table_derived(&s->table, "_schema_version", version, sizeof(version));
	s->sql[ST_VERSION] = xasprintf(
	    "SELECT coalesce(max(version), 0)::text FROM %s", version);
	free(backoff);
	free(tail_sent);
	free(tail_fail);
	for (int i = 0; i < ST_COUNT; i++)
		if (!s->sql[i])
			return -1;
	return 0;
oom:
	free(backoff);
	free(tail_sent);
	free(tail_fail);
	return -1;
}

/* Expand-then-contract: `migrate` runs before relays of a new version, so
 * a relay refuses a table whose schema is older than it needs. */
static int check_version(struct store *s, const char *lit, char *err,
			 size_t errlen)
{
	int latest = migrate_latest_version();
	PGresult *res = PQexecParams(s->conn, s->sql[ST_VERSION], 0, NULL, NULL,
				     NULL, NULL, 0);
	int rc = 0;
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		/* A table made by hand has no version table: its columns are
		 * the owner's business. */
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		if (!state || strcmp(state, "42P01") != 0) {
			pgconn_error(s->conn, res, err, errlen);
			rc = pgconn_needs_reconnect(s->conn, res)
				 ? STORE_RECONNECT
				 : STORE_ERROR;
		}
	} else if (strtol(PQgetvalue(res, 0, 0), NULL, 10) < latest) {
		snprintf(err, errlen,
			 "outbox table %s is at schema version %s and this "
			 "relay needs %d: run `outbox-relay migrate`",
			 lit, PQgetvalue(res, 0, 0), latest);
		rc = STORE_ERROR;
	}
	PQclear(res);
	return rc;
}

struct store_options store_options_from_config(const struct config *cfg,
					       const char *app_name,
					       const char *leased_by)
{
	struct store_options o = {
	    .conninfo = cfg->database_url,
	    .table = cfg->table,
	    .app_name = app_name,
	    .leased_by = leased_by,
	    .ce_source = cfg->ce_source,
	    .batch_size = cfg->batch_size,
	    .clean_batch_size = cfg->clean_batch_size,
	    .lease_timeout_ms = cfg->lease_timeout_ms,
	    .statement_timeout_ms = cfg->statement_timeout_ms,
	    .backoff_base_ms = cfg->backoff_base_ms,
	    .backoff_max_ms = cfg->backoff_max_ms,
	    .backoff_factor = cfg->backoff_factor,
	    .prepare = cfg->pg_prepare,
	    .ordered = cfg->ordering == ORDERING_PARTITION,
	    .block_on_failure = cfg->on_failure == ON_FAILURE_BLOCK,
	};
	return o;
}

static int check_table(struct store *s, char *err, size_t errlen)
{
	const char *values[1] = {s->table.literal};
	char lit[160];
	/* to_regclass wants the name itself, not the quoted literal. */
	snprintf(lit, sizeof(lit), "%s%s%s", s->table.schema,
		 s->table.schema[0] ? "." : "", s->table.name);
	values[0] = lit;
	PGresult *res =
	    PQexecParams(s->conn, "SELECT to_regclass($1) IS NOT NULL", 1, NULL,
			 values, NULL, NULL, 0);
	int rc = 0;
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(s->conn, res, err, errlen);
		rc = pgconn_needs_reconnect(s->conn, res) ? STORE_RECONNECT
							  : STORE_ERROR;
	} else if (strcmp(PQgetvalue(res, 0, 0), "t") != 0) {
		char where[256];
		pgconn_describe(s->conn, where, sizeof(where));
		snprintf(err, errlen,
			 "outbox table %s does not exist in %s: create it with "
			 "`outbox-relay migrate`",
			 lit, where);
		rc = STORE_ERROR;
	}
	PQclear(res);
	if (rc == 0)
		rc = check_version(s, lit, err, errlen);
	return rc;
}

static int connect_session(struct store *s, char *err, size_t errlen)
{
	struct pgconn_options po = {
	    .conninfo = s->conninfo,
	    .application_name = s->app_name,
	    .statement_timeout_ms = s->opt.statement_timeout_ms,
	    .extra_sql = s->extra_sql,
	};
	memset(s->prepared, 0, sizeof(s->prepared));
	s->conn = pgconn_connect(&po, err, errlen);
	if (!s->conn)
		return STORE_RECONNECT;
	return check_table(s, err, errlen);
}

static char *dup_or_null(const char *v)
{
	return v ? strdup(v) : NULL;
}

int store_open(struct store **out, const struct store_options *opt, char *err,
	       size_t errlen)
{
	int rc = STORE_ERROR;
	struct store *s = calloc(1, sizeof(*s));
	*out = NULL;
	if (!s) {
		snprintf(err, errlen, "store: out of memory");
		return STORE_ERROR;
	}
	s->opt = *opt;
	if (table_parse(opt->table, &s->table, err, errlen) != 0)
		goto fail;
	table_derived(&s->table, "_blocked_keys", s->blocked,
		      sizeof(s->blocked));
	if (opt->batch_size < 1 || opt->batch_size > 10000) {
		snprintf(err, errlen, "batch size %d is outside 1..10000",
			 opt->batch_size);
		goto fail;
	}
	if (s->opt.clean_batch_size < 1)
		s->opt.clean_batch_size = 1000;
	if (s->opt.backoff_factor < 1.0)
		s->opt.backoff_factor = 2.0;
	s->conninfo = dup_or_null(opt->conninfo);
	s->app_name = strdup(opt->app_name ? opt->app_name : "outbox-relay");
	s->leased_by = strdup(opt->leased_by ? opt->leased_by : "?");
	s->ce_source =
	    strdup(opt->ce_source ? opt->ce_source : "/outbox-relay");
	s->extra_sql = dup_or_null(opt->extra_session_sql);
	if ((opt->conninfo && !s->conninfo) || !s->app_name || !s->leased_by ||
	    !s->ce_source || (opt->extra_session_sql && !s->extra_sql) ||
	    build_statements(s) != 0) {
		snprintf(err, errlen, "store: out of memory");
		goto fail;
	}
	s->opt.conninfo = s->conninfo;
	rc = connect_session(s, err, errlen);
	if (rc != 0)
		goto fail;
	*out = s;
	return 0;
fail:
	store_close(s);
	return rc;
}

void store_close(struct store *s)
{
	if (!s)
		return;
	if (s->conn)
		PQfinish(s->conn);
	for (int i = 0; i < ST_COUNT; i++)
		free(s->sql[i]);
	free(s->conninfo);
	free(s->app_name);
	free(s->leased_by);
	free(s->ce_source);
	free(s->extra_sql);
	free(s);
}

int store_reconnect(struct store *s, char *err, size_t errlen)
{
	if (s->conn) {
		PQfinish(s->conn);
		s->conn = NULL;
	}
	int rc = connect_session(s, err, errlen);
	if (rc != 0 && s->conn) {
		PQfinish(s->conn);
		s->conn = NULL;
	}
	return rc;
}

PGconn *store_conn(struct store *s)
{
	return s->conn;
}

/*
 * Runs statement st. Returns the result (caller clears) when its status is
 * want; otherwise NULL with err set and *rc saying whether to reconnect.
 */
static PGresult *run(struct store *s, enum stmt st, int nparams,
		     const char *const *values, ExecStatusType want,
		     int result_format, int *rc, char *err, size_t errlen)
{
	PGresult *res;
	*rc = 0;
	if (!s->conn) {
		snprintf(err, errlen, "not connected to postgres");
		*rc = STORE_RECONNECT;
		return NULL;
	}
	if (s->opt.prepare) {
		if (!s->prepared[st]) {
			res = PQprepare(s->conn, stmt_names[st], s->sql[st],
					nparams, NULL);
			if (PQresultStatus(res) != PGRES_COMMAND_OK)
				goto failed;
			PQclear(res);
			s->prepared[st] = true;
		}
		res = PQexecPrepared(s->conn, stmt_names[st], nparams, values,
				     NULL, NULL, result_format);
	} else {
		res = PQexecParams(s->conn, s->sql[st], nparams, NULL, values,
				   NULL, NULL, result_format);
	}
	if (PQresultStatus(res) == want)
		return res;
failed:
	pgconn_error(s->conn, res, err, errlen);
	if (pgconn_needs_reconnect(s->conn, res)) {
		*rc = STORE_RECONNECT;
	} else {
		*rc = STORE_ERROR;
		/* The transaction-mode pooler case: a prepared statement
		 * that vanished is prepared again next time. */
		const char *state =
		    res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
		if (state && strcmp(state, "26000") == 0)
			s->prepared[st] = false;
		if (pgconn_is_retryable(res))
			*rc = STORE_RETRY_STATEMENT;
	}
	PQclear(res);
	return NULL;
}

/* Appends to a growable buffer; returns -1 when out of memory. */
struct buf {
	char *p;
	size_t len, cap;
};

static int buf_put(struct buf *b, const char *s, size_t n)
{
	if (b->len + n + 1 > b->cap) {
		size_t cap = (b->len + n + 1) * 2;
		char *p = realloc(b->p, cap);
		if (!p)
			return -1;
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = '\0';
	return 0;
}

/* {a,b,c} for uuids; {"x","y"} with escapes for text (quoted = true). */
static char *pg_array(const char *const *items, size_t n, bool quoted,
		      size_t max_item)
{
	struct buf b = {0};
	int rc = buf_put(&b, "{", 1);
	for (size_t i = 0; i < n && rc == 0; i++) {
		if (i > 0)
			rc = buf_put(&b, ",", 1);
		if (!quoted) {
			rc |= buf_put(&b, items[i], strlen(items[i]));
			continue;
		}
		const char *v = items[i] ? items[i] : "";
		size_t len = strlen(v);
		if (len > max_item) {
			/* Cut on a UTF-8 character boundary. */
			len = max_item;
			while (len > 0 &&
			       ((unsigned char)v[len] & 0xC0) == 0x80)
				len--;
		}
		rc |= buf_put(&b, "\"", 1);
		for (size_t j = 0; j < len && rc == 0; j++) {
			if (v[j] == '"' || v[j] == '\\')
				rc |= buf_put(&b, "\\", 1);
			rc |= buf_put(&b, v + j, 1);
		}
		rc |= buf_put(&b, "\"", 1);
	}
	if (rc == 0)
		rc = buf_put(&b, "}", 1);
	if (rc != 0) {
		free(b.p);
		return NULL;
	}
	return b.p;
}

void lease_batch_release(struct lease_batch *b)
{
	PQclear(b->res);
	free(b->events);
	memset(b, 0, sizeof(*b));
}

static const char *col(PGresult *res, int row, int c)
{
	return PQgetisnull(res, row, c) ? NULL : PQgetvalue(res, row, c);
}

int store_lease(struct store *s, const char *const *paused, size_t n_paused,
		const char *default_destination, struct lease_batch *out,
		char *err, size_t errlen)
{
	int rc;
	char timeout[32];
	memset(out, 0, sizeof(*out));
	char *paused_arr = pg_array(paused, n_paused, true, 4096);
	if (!paused_arr) {
		snprintf(err, errlen, "lease: out of memory");
		return STORE_ERROR;
	}
	snprintf(timeout, sizeof(timeout), "%lld",
		 (long long)s->opt.lease_timeout_ms);
	const char *values[5] = {timeout, s->leased_by, paused_arr,
				 default_destination ? default_destination : "",
				 s->ce_source};
	/* Binary results: text columns arrive as they are and the payload
	 * needs no unescaping. */
	PGresult *res =
	    run(s, ST_LEASE, 5, values, PGRES_TUPLES_OK, 1, &rc, err, errlen);
	free(paused_arr);
	if (!res)
		return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
	int n = PQntuples(res);
	if (n == 0) {
		PQclear(res);
		return 0;
	}
	out->events = calloc((size_t)n, sizeof(*out->events));
	if (!out->events) {
		PQclear(res);
		/* The rows are leased; the sweeper returns them. */
		snprintf(err, errlen, "lease: out of memory for %d rows", n);
		return STORE_ERROR;
	}
	out->res = res;
	out->n = (size_t)n;
	snprintf(out->lease_id, sizeof(out->lease_id), "%s",
		 PQgetvalue(res, 0, LC_LEASE_ID));
	for (int i = 0; i < n; i++) {
		struct outbox_event *e = &out->events[i];
		e->id = col(res, i, LC_ID);
		e->seq = strtoll(PQgetvalue(res, i, LC_SEQ), NULL, 10);
		e->type = col(res, i, LC_TYPE);
		e->source = col(res, i, LC_SOURCE);
		e->subject = col(res, i, LC_SUBJECT);
		e->content_type = col(res, i, LC_CONTENT_TYPE);
		e->exchange = col(res, i, LC_EXCHANGE);
		e->routing_key = col(res, i, LC_ROUTING_KEY);
		e->partition_key = col(res, i, LC_PARTITION_KEY);
		e->payload =
		    (const unsigned char *)PQgetvalue(res, i, LC_PAYLOAD);
		e->payload_len = (size_t)PQgetlength(res, i, LC_PAYLOAD);
		e->headers_json = col(res, i, LC_HEADERS);
		e->time = col(res, i, LC_TIME);
		e->created_at_us =
		    strtoll(PQgetvalue(res, i, LC_CREATED_US), NULL, 10);
		e->attempts =
		    (int)strtol(PQgetvalue(res, i, LC_ATTEMPTS), NULL, 10);
		e->max_attempts =
		    (int)strtol(PQgetvalue(res, i, LC_MAX_ATTEMPTS), NULL, 10);
		/* A table created without our CHECKs may hold NULLs where
		 * the relay expects text; the encoder fails those rows. */
		if (!e->type)
			e->type = "";
		if (!e->content_type)
			e->content_type = "application/octet-stream";
		if (!e->routing_key)
			e->routing_key = "";
		if (!e->headers_json)
			e->headers_json = "null";
		if (!e->source)
			e->source = "";
		if (!e->time)
			e->time = "";
	}
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

int store_renew(struct store *s, const char *lease_id, const char *const *ids,
		size_t n, bool *held, size_t *n_held, char *err, size_t errlen)
{
	int rc;
	*n_held = 0;
	for (size_t i = 0; i < n; i++)
		held[i] = false;
	if (n == 0)
		return 0;
	char *arr = pg_array(ids, n, false, 0);
	if (!arr) {
		snprintf(err, errlen, "renew: out of memory");
		return STORE_ERROR;
	}
	const char *values[2] = {arr, lease_id};
	PGresult *res =
	    run(s, ST_RENEW, 2, values, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	free(arr);
	if (!res)
		return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
	int m = PQntuples(res);
	const char **kept = malloc(sizeof(*kept) * (size_t)(m > 0 ? m : 1));
	if (!kept) {
		PQclear(res);
		snprintf(err, errlen, "renew: out of memory");
		return STORE_ERROR;
	}
	for (int i = 0; i < m; i++)
		kept[i] = PQgetvalue(res, i, 0);
	qsort(kept, (size_t)m, sizeof(*kept), cmp_str);
	for (size_t i = 0; i < n; i++) {
		const char *key = ids[i];
		held[i] = bsearch(&key, kept, (size_t)m, sizeof(*kept),
				  cmp_str) != NULL;
		if (held[i])
			(*n_held)++;
	}
	free(kept);
	PQclear(res);
	return 0;
}

static enum stmt mark_stmt(enum store_mark kind)
{
	switch (kind) {
	case MARK_SENT:
		return ST_SENT;
	case MARK_RETRY:
		return ST_RETRY;
	case MARK_TRANSPORT:
		return ST_TRANSPORT;
	case MARK_FAILED:
		return ST_FAILED;
	case MARK_RELEASE:
		break;
	}
	return ST_RELEASE;
}

/*
 * The terminal states a row reaches through each mark, for the lost-reply
 * check; NULL for marks that leave rows pending. Only terminal rows are
 * recognized: the sweeper also returns rows to pending under their last
 * lease id, so a pending row says nothing about whose mark moved it.
 */
static const char *mark_targets(enum store_mark kind)
{
	switch (kind) {
	case MARK_SENT:
		return "{sent}";
	case MARK_RETRY:
	case MARK_FAILED:
		return "{failed}";
	case MARK_TRANSPORT:
	case MARK_RELEASE:
		break;
	}
	return NULL;
}

/* Counts rows of ids already in kind's target state under lease_id. */
static int recheck(struct store *s, enum store_mark kind, const char *arr,
		   const char *lease_id, size_t *count, char *err,
		   size_t errlen)
{
	int rc;
	const char *values[3] = {arr, lease_id, mark_targets(kind)};
	PGresult *res =
	    run(s, ST_RECHECK, 3, values, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
	*count = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return 0;
}

int store_mark(struct store *s, enum store_mark kind, const char *lease_id,
	       const char *const *ids, const char *const *reasons, size_t n,
	       struct mark_result *r, char *err, size_t errlen)
{
	int ret = STORE_ERROR;
	char *id_arr = NULL, *reason_arr = NULL;
	memset(r, 0, sizeof(*r));
	if (n == 0)
		return 0;
	id_arr = pg_array(ids, n, false, 0);
	if (reasons)
		reason_arr = pg_array(reasons, n, true, STORE_ERROR_MAX);
	if (!id_arr || (reasons && !reason_arr)) {
		snprintf(err, errlen, "mark: out of memory");
		goto out;
	}
	enum stmt st = mark_stmt(kind);
	int nparams = reasons ? 3 : 2;
	const char *values[3] = {id_arr, lease_id, reason_arr};
	for (int attempt = 1;; attempt++) {
		int rc;
		PGresult *res = run(s, st, nparams, values, PGRES_TUPLES_OK, 0,
				    &rc, err, errlen);
		if (res) {
			r->marked =
			    (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
			PQclear(res);
			break;
		}
		if (attempt >= MARK_TRIES ||
		    (rc != STORE_RECONNECT && rc != STORE_RETRY_STATEMENT)) {
			ret = rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
			goto out;
		}
		if (rc == STORE_RECONNECT) {
			/* The reply may have been lost after the commit;
			 * the recheck below recognizes that. */
			char why[256];
			log_warn("mark: %s; reconnecting to retry", err);
			if (store_reconnect(s, why, sizeof(why)) != 0) {
				snprintf(err, errlen, "mark: reconnect: %s",
					 why);
				ret = STORE_RECONNECT;
				goto out;
			}
		}
	}
	if (r->marked < n) {
		/* Rows not moved now were either moved by an earlier try of
		 * this mark whose reply was lost, or are lost leases. The
		 * check runs on every shortfall, not only after a reconnect:
		 * it also tells a retried mark from a stale one. */
		size_t in_target = 0;
		int rc = mark_targets(kind) ? recheck(s, kind, id_arr, lease_id,
						      &in_target, err, errlen)
					    : 0;
		if (rc != 0) {
			ret = rc;
			goto out;
		}
		size_t others = n - r->marked;
		size_t done_before =
		    in_target > r->marked ? in_target - r->marked : 0;
		if (done_before > others)
			done_before = others;
		r->already = done_before;
		r->lost = others - done_before;
	}
	ret = 0;
out:
	free(id_arr);
	free(reason_arr);
	return ret;
}

/* BEGIN; try the transaction-level advisory lock of ns for the table.
 * custom_plans plans the transaction's statements for their values,
 * whatever the role's or database's plan_cache_mode. */
static int begin_locked(struct store *s, int ns, bool custom_plans, bool *got,
			char *err, size_t errlen)
{
	char sql[320];
	*got = false;
	PGresult *res = PQexec(s->conn, "BEGIN");
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		goto failed;
	PQclear(res);
	snprintf(sql, sizeof(sql),
		 "SELECT pg_try_advisory_xact_lock(%d, hashtext(%s))%s", ns,
		 s->table.literal,
		 custom_plans ? ", set_config('plan_cache_mode', "
				"'force_custom_plan', true)"
			      : "");
	res = PQexec(s->conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		goto failed;
	*got = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return 0;
failed:
	pgconn_error(s->conn, res, err, errlen);
	int rc = pgconn_needs_reconnect(s->conn, res) ? STORE_RECONNECT
						      : STORE_ERROR;
	PQclear(res);
	PQclear(PQexec(s->conn, "ROLLBACK"));
	return rc;
}

static int finish_tx(struct store *s, bool commit, char *err, size_t errlen)
{
	PGresult *res = PQexec(s->conn, commit ? "COMMIT" : "ROLLBACK");
	int rc = 0;
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		pgconn_error(s->conn, res, err, errlen);
		rc = pgconn_needs_reconnect(s->conn, res) ? STORE_RECONNECT
							  : STORE_ERROR;
	}
	PQclear(res);
	return rc;
}

int store_sweep(struct store *s, size_t max_rows, struct sweep_result *r,
		char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	for (;;) {
		bool got;
		int rc =
		    begin_locked(s, LOCK_NS_SWEEP, false, &got, err, errlen);
		if (rc != 0)
			return rc;
		if (!got) {
			r->skipped = true;
			return finish_tx(s, false, err, errlen);
		}
		PGresult *res = run(s, ST_SWEEP, 0, NULL, PGRES_TUPLES_OK, 0,
				    &rc, err, errlen);
		if (!res) {
			if (rc != STORE_RECONNECT) {
				char ignored[64];
				finish_tx(s, false, ignored, sizeof(ignored));
			}
			return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
		}
		int n = PQntuples(res);
		for (int i = 0; i < n; i++) {
			if (strcmp(PQgetvalue(res, i, 0), "failed") == 0)
				r->to_failed++;
			else
				r->to_pending++;
		}
		PQclear(res);
		rc = finish_tx(s, true, err, errlen);
		if (rc != 0)
			return rc;
		if (n < SWEEP_BATCH || r->to_pending + r->to_failed >= max_rows)
			return 0;
	}
}

static int clean_status(struct store *s, enum stmt st, int64_t retention_ms,
			size_t max_rows, int64_t pause_ms, size_t *deleted,
			bool *skipped, char *err, size_t errlen)
{
	char cursor[64] = "-infinity";
	char retention[32];
	snprintf(retention, sizeof(retention), "%lld", (long long)retention_ms);
	*deleted = 0;
	while (*deleted < max_rows) {
		bool got;
		int rc =
		    begin_locked(s, LOCK_NS_CLEAN, true, &got, err, errlen);
		if (rc != 0)
			return rc;
		if (!got) {
			*skipped = true;
			return finish_tx(s, false, err, errlen);
		}
		const char *values[2] = {cursor, retention};
		PGresult *res =
		    run(s, st, 2, values, PGRES_TUPLES_OK, 0, &rc, err, errlen);
		if (!res) {
			if (rc != STORE_RECONNECT) {
				char ignored[64];
				finish_tx(s, false, ignored, sizeof(ignored));
			}
			return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
		}
		size_t n = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
		size_t scanned =
		    (size_t)strtoull(PQgetvalue(res, 0, 1), NULL, 10);
		if (scanned > 0)
			snprintf(cursor, sizeof(cursor), "%s",
				 PQgetvalue(res, 0, n > 0 ? 2 : 3));
		PQclear(res);
		rc = finish_tx(s, true, err, errlen);
		if (rc != 0)
			return rc;
		*deleted += n;
		if (scanned < (size_t)s->opt.clean_batch_size)
			return 0;
		clock_sleep_ms(pause_ms);
	}
	return 0;
}

int store_clean(struct store *s, int64_t retention_ms,
		int64_t failed_retention_ms, size_t max_rows, int64_t pause_ms,
		struct clean_result *r, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	/* max_rows caps the whole tick, sent and failed together. */
	int rc =
	    clean_status(s, ST_CLEAN_SENT, retention_ms, max_rows, pause_ms,
			 &r->sent_deleted, &r->skipped, err, errlen);
	if (rc != 0 || r->skipped || failed_retention_ms <= 0 ||
	    r->sent_deleted >= max_rows)
		return rc;
	return clean_status(s, ST_CLEAN_FAILED, failed_retention_ms,
			    max_rows - r->sent_deleted, pause_ms,
			    &r->failed_deleted, &r->skipped, err, errlen);
}

int store_redrive(struct store *s, const struct redrive_filter *f,
		  size_t *count, char *err, size_t errlen)
{
	int rc;
	char *ids = NULL;
	*count = 0;
	if (f->n_ids > 0) {
		ids = pg_array(f->ids, f->n_ids, false, 0);
		if (!ids) {
			snprintf(err, errlen, "redrive: out of memory");
			return STORE_ERROR;
		}
	}
	const char *values[5] = {ids, f->type, f->since, f->until,
				 f->sent ? "{sent}" : "{failed}"};
	if (s->opt.ordered && !f->force) {
		/* Redriving a row whose key already went further would
		 * deliver it after its successors. */
		PGresult *res = run(s, ST_REDRIVE_CHECK, 5, values,
				    PGRES_TUPLES_OK, 0, &rc, err, errlen);
		if (!res) {
			free(ids);
			return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
		}
		long later = strtol(PQgetvalue(res, 0, 0), NULL, 10);
		PQclear(res);
		if (later > 0) {
			snprintf(err, errlen,
				 "%ld matching row%s of a partition key that "
				 "already has a later row sent or in flight: "
				 "redriving would break its order (--force to "
				 "redrive anyway)",
				 later,
				 later == 1 ? " has a key" : "s have keys");
			free(ids);
			return STORE_REFUSED;
		}
	}
	if (f->dry_run) {
		PGresult *res =
		    run(s, f->sent ? ST_COUNT_SENT : ST_COUNT_FAILED, 4, values,
			PGRES_TUPLES_OK, 0, &rc, err, errlen);
		if (res) {
			*count =
			    (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
			PQclear(res);
		}
		free(ids);
		return res ? 0
			   : (rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc);
	}
	for (;;) {
		PGresult *res =
		    run(s, f->sent ? ST_REDRIVE_SENT : ST_REDRIVE_FAILED, 4,
			values, PGRES_COMMAND_OK, 0, &rc, err, errlen);
		if (!res) {
			free(ids);
			return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
		}
		size_t n = (size_t)strtoull(PQcmdTuples(res), NULL, 10);
		PQclear(res);
		*count += n;
		if (n < REDRIVE_BATCH)
			break;
	}
	free(ids);
	return 0;
}

int store_next_due_ms(struct store *s, int64_t *ms, char *err, size_t errlen)
{
	int rc;
	PGresult *res =
	    run(s, ST_NEXT_DUE, 0, NULL, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
	*ms = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return 0;
}

int store_read_pauses(struct store *s, bool *global, char (*keys)[300],
		      size_t max_keys, size_t *n, char *err, size_t errlen)
{
	int rc;
	*global = false;
	*n = 0;
	PGresult *res =
	    run(s, ST_CONTROL, 0, NULL, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
	for (int i = 0; i < PQntuples(res); i++) {
		const char *d = PQgetvalue(res, i, 0);
		if (strcmp(d, "*") == 0)
			*global = true;
		else if (*n < max_keys)
			snprintf(keys[(*n)++], 300, "%s", d);
	}
	PQclear(res);
	return 0;
}

int store_classify(struct store *s, size_t *n, char *err, size_t errlen)
{
	int rc;
	*n = 0;
	PGresult *res =
	    run(s, ST_CLASSIFY, 0, NULL, PGRES_COMMAND_OK, 0, &rc, err, errlen);
	if (!res)
		return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
	*n = (size_t)strtoull(PQcmdTuples(res), NULL, 10);
	PQclear(res);
	return 0;
}

int store_repair_heads(struct store *s, size_t *n, char *err, size_t errlen)
{
	int rc;
	*n = 0;
	PGresult *res =
	    run(s, ST_REPAIR, 0, NULL, PGRES_COMMAND_OK, 0, &rc, err, errlen);
	if (!res)
		return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
	*n = (size_t)strtoull(PQcmdTuples(res), NULL, 10);
	PQclear(res);
	return 0;
}

int store_unblock(struct store *s, const char *key, bool redrive, char *err,
		  size_t errlen)
{
	int rc;
	const char *values[1] = {key};
	PGresult *res = PQexec(s->conn, "BEGIN");
	if (PQresultStatus(res) != PGRES_COMMAND_OK) {
		pgconn_error(s->conn, res, err, errlen);
		PQclear(res);
		return STORE_ERROR;
	}
	PQclear(res);
	res =
	    run(s, ST_UNBLOCK, 1, values, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		goto fail;
	if (PQntuples(res) == 0) {
		PQclear(res);
		snprintf(err, errlen, "partition key '%.200s' is not blocked",
			 key);
		rc = STORE_REFUSED;
		goto fail;
	}
	char blocking[64];
	snprintf(blocking, sizeof(blocking), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	const char *redrive_values[1] = {blocking};
	res = redrive ? run(s, ST_UNBLOCK_REDRIVE, 1, redrive_values,
			    PGRES_COMMAND_OK, 0, &rc, err, errlen)
		      : run(s, ST_UNBLOCK_SKIP, 1, values, PGRES_COMMAND_OK, 0,
			    &rc, err, errlen);
	if (!res)
		goto fail;
	PQclear(res);
	return finish_tx(s, true, err, errlen);
fail : {
	char ignored[64];
	finish_tx(s, false, ignored, sizeof(ignored));
	return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
}
}
