/* SPDX-License-Identifier: MIT */
/*
 * A partitioned table's partitions by the hour (docs/design.md §11,
 * "Partitions by the hour"): made ahead of the ids that will land in them,
 * and dropped whole once every row in one is a row the cleaner would
 * delete. The cleaner's thread tends them on its own session, one replica
 * at a time (the cleaner's advisory lock), each step a short transaction
 * of its own that waits for its locks at most PARTITION_LOCK_TIMEOUT.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "locks.h"
#include "store_internal.h"

/* Longer than a producer's insert or a relay's lease takes to commit;
 * short enough that writers queued behind the DDL's lock barely notice.
 * A step that times out waits for the next round. */
#define PARTITION_LOCK_TIMEOUT "200ms"

/* The partitions' hours are UTC whatever the session's zone, so that
 * every replica names a partition alike. */
static const char tend_settings[] =
    "SELECT set_config('lock_timeout', '" PARTITION_LOCK_TIMEOUT "', true), "
    "set_config('TimeZone', 'UTC', true), "
    "set_config('client_min_messages', 'warning', true)";

/* The hours 1..$1 ahead without a partition named $2 || 'p' || hour ($2:
 * the schema prefix and the table's name and "_"), each with the least
 * UUIDv7 of the hour and of the next (48 bits of milliseconds, the rest
 * zero). */
static const char sql_missing[] =
    "SELECT tag, substr(a, 1, 8) || '-' || substr(a, 9, 4) || "
    "'-0000-0000-000000000000', substr(b, 1, 8) || '-' || substr(b, 9, 4) "
    "|| '-0000-0000-000000000000' FROM (SELECT to_char(at, "
    "'YYYYMMDDHH24') AS tag, lpad(to_hex((extract(epoch FROM at) * "
    "1000)::bigint), 12, '0') AS a, lpad(to_hex((extract(epoch FROM at + "
    "interval '1 hour') * 1000)::bigint), 12, '0') AS b FROM (SELECT "
    "date_trunc('hour', now()) + g * interval '1 hour' AS at FROM "
    "generate_series(1, $1::int) g) h) x WHERE to_regclass($2 || "
    "quote_ident($3 || tag)) IS NULL ORDER BY tag";

/* The table's hourly partitions ($2: the name and "_p") whose hour ended
 * more than $3 ms ago, oldest first. */
static const char sql_old[] =
    "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = "
    "i.inhrelid WHERE i.inhparent = to_regclass($1) AND left(c.relname, "
    "length($2)) = $2 AND substr(c.relname, length($2) + 1) ~ "
    "'^[0-9]{10}$' AND to_timestamp(substr(c.relname, length($2) + 1) "
    "|| '+00', 'YYYYMMDDHH24TZH') + interval '1 hour' < now() - $3::float8 * "
    "interval '1 millisecond' ORDER BY c.relname";

/* BEGIN under the cleaner's lock with tend_settings; *got false (the
 * transaction ended) when another replica holds the lock. */
static int begin(struct store *s, bool *got, char *err, size_t errlen)
{
	int rc = store_begin_locked(s, LOCK_NS_CLEAN, PLANS_AS_SET, got, err,
				    errlen);
	if (rc != 0)
		return rc;
	if (!*got)
		return store_finish_tx(s, TX_ROLLBACK, err, errlen);
	PGresult *res = store_exec(s, "partitions", tend_settings, 0, NULL,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res) {
		char ignored[64];
		store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
		return store_public_rc(rc);
	}
	PQclear(res);
	return 0;
}

/* Ends a step whose statement failed with rc and err: a lock not had in
 * time is no error (*busy: the next round tries again); anything else
 * is. */
static int step_failed(struct store *s, int rc, bool *busy, char *err,
		       size_t errlen)
{
	char ignored[64];
	store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
	(void)errlen;
	if (strstr(err, "55P03")) {
		*busy = true;
		return 0;
	}
	return rc ? store_public_rc(rc) : STORE_ERROR;
}

/* One statement of a step, for its effect; as step_failed() on error. */
static int step(struct store *s, const char *sql, bool *busy, char *err,
		size_t errlen)
{
	int rc =
	    store_exec_cmd(s, "partitions", sql, 0, NULL, NULL, err, errlen);
	return rc == 0 ? 0 : step_failed(s, rc, busy, err, errlen);
}

/* Whether the table is partitioned (*yes), and its default partition's
 * storage parameters, which new partitions take (into with, "" if
 * none). */
static int shape(struct store *s, const char *dflt, bool *yes, char *with,
		 size_t withlen, char *err, size_t errlen)
{
	int rc;
	const char *values[2] = {s->table.quoted, dflt};
	PGresult *res = store_exec(
	    s, "partitions",
	    "SELECT coalesce((SELECT relkind = 'p' FROM pg_class WHERE oid = "
	    "to_regclass($1)), false), (SELECT coalesce(array_to_string("
	    "reloptions, ', '), '') FROM pg_class WHERE oid = "
	    "to_regclass($2))",
	    2, values, PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	/* Partitioned otherwise than by migrate --partition: not ours. */
	*yes =
	    strcmp(PQgetvalue(res, 0, 0), "t") == 0 && !PQgetisnull(res, 0, 1);
	snprintf(with, withlen, "%s", PQgetvalue(res, 0, 1));
	PQclear(res);
	return 0;
}

/* A row of the default partition has an id of the hours ahead (a
 * producer's clock ahead, or a UUIDv4 that looks like one): the CHECK,
 * which would refuse such inserts while it stays, is dropped and no
 * partition made; an error that says so. */
static int refuse_ahead(struct store *s, const char *dflt, const char *check,
			char *err, size_t errlen)
{
	char why[512];
	snprintf(why, sizeof(why), "%s", err);
	bool got;
	int rc = begin(s, &got, err, errlen);
	char *sql = store_asprintf(
	    "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s", dflt, check);
	if (rc == 0 && got && sql &&
	    store_exec_cmd(s, "partitions", sql, 0, NULL, NULL, err, errlen) ==
		0)
		store_finish_tx(s, TX_COMMIT, err, errlen);
	else if (rc == 0 && got)
		store_finish_tx(s, TX_ROLLBACK, err, errlen);
	free(sql);
	snprintf(err, errlen,
		 "partitions of %s: no partition made for the next hours, "
		 "since the default partition holds a row with an id of "
		 "them (%s)",
		 s->table.literal, why);
	return STORE_ERROR;
}

/*
 * The hours ahead without a partition get one each, behind a CHECK on
 * the default partition that none of its rows lies in them: added NOT
 * VALID (no scan), then validated (a scan under SHARE UPDATE EXCLUSIVE,
 * which no writer waits for), after which each creation is implied by
 * it and scans nothing (docs/design.md §11, measured 15 ms against 306
 * ms at 719 MB). The CHECK stays until the next hours are made: ids of
 * hours with a partition never go to the default.
 */
static int make_ahead(struct store *s, const char *dflt, const char *with,
		      int hours, struct partition_result *r, char *err,
		      size_t errlen)
{
	char ahead[16], part_prefix[80], check[96];
	snprintf(ahead, sizeof(ahead), "%d", hours);
	snprintf(part_prefix, sizeof(part_prefix), "%s_p", s->table.name);
	snprintf(check, sizeof(check), "\"%s_ahead\"", s->table.name);
	bool got, busy = false;
	int rc = begin(s, &got, err, errlen);
	if (rc != 0 || !got)
		return rc;
	const char *values[3] = {ahead, s->table.prefix, part_prefix};
	PGresult *res = store_exec(s, "partitions", sql_missing, 3, values,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return step_failed(s, rc, &busy, err, errlen);
	int n = PQntuples(res);
	char *sql = NULL;
	if (n > 0)
		sql = store_asprintf(
		    "ALTER TABLE %s DROP CONSTRAINT IF EXISTS %s, ADD "
		    "CONSTRAINT %s CHECK (id < '%s' OR id >= '%s') NOT VALID",
		    dflt, check, check, PQgetvalue(res, 0, 1),
		    PQgetvalue(res, n - 1, 2));
	if (n > 0 && !sql) {
		PQclear(res);
		snprintf(err, errlen, "partitions: out of memory");
		return step_failed(s, 0, &busy, err, errlen);
	}
	if (n == 0) {
		PQclear(res);
		return store_finish_tx(s, TX_COMMIT, err, errlen);
	}
	rc = step(s, sql, &busy, err, errlen);
	free(sql);
	if (rc == 0 && !busy)
		rc = store_finish_tx(s, TX_COMMIT, err, errlen);
	if (rc == 0 && !busy) {
		rc = begin(s, &got, err, errlen);
		if (rc == 0 && got) {
			sql = store_asprintf(
			    "ALTER TABLE %s VALIDATE CONSTRAINT %s", dflt,
			    check);
			rc = sql ? step(s, sql, &busy, err, errlen)
				 : STORE_ERROR;
			free(sql);
			if (rc == 0 && !busy)
				rc = store_finish_tx(s, TX_COMMIT, err, errlen);
			else if (rc != 0 && strstr(err, "23514"))
				rc = refuse_ahead(s, dflt, check, err, errlen);
		} else if (rc == 0) {
			busy = true;
		}
	}
	if (rc == 0 && !busy) {
		rc = begin(s, &got, err, errlen);
		busy = rc == 0 && !got;
		for (int i = 0; rc == 0 && got && !busy && i < n; i++) {
			sql = store_asprintf(
			    "CREATE TABLE IF NOT EXISTS %s\"%s%s\" PARTITION "
			    "OF %s FOR VALUES FROM ('%s') TO ('%s')%s%s%s",
			    s->table.prefix, part_prefix, PQgetvalue(res, i, 0),
			    s->table.quoted, PQgetvalue(res, i, 1),
			    PQgetvalue(res, i, 2), with[0] ? " WITH (" : "",
			    with, with[0] ? ")" : "");
			rc = sql ? step(s, sql, &busy, err, errlen)
				 : STORE_ERROR;
			free(sql);
		}
		if (rc == 0 && got && !busy) {
			rc = store_finish_tx(s, TX_COMMIT, err, errlen);
			if (rc == 0)
				r->created += (size_t)n;
		}
	}
	PQclear(res);
	r->busy |= busy;
	return rc;
}

/*
 * Drops the hourly partition named part (bare) if every row in it is one
 * the cleaner would delete now and none blocks a key: under the table's
 * and the partition's ACCESS EXCLUSIVE locks, so no insert (a producer's
 * own id of that hour, however late) and no redrive can come between
 * the look, a few index probes, and the drop.
 */
static int drop_if_done(struct store *s, const char *part,
			const char *const *retentions,
			struct partition_result *r, char *err, size_t errlen)
{
	char p[160];
	snprintf(p, sizeof(p), "%s\"%s\"", s->table.prefix, part);
	bool got, busy = false;
	int rc = begin(s, &got, err, errlen);
	if (rc != 0 || !got)
		return rc;
	char *lock =
	    store_asprintf("LOCK TABLE ONLY %s, %s IN ACCESS EXCLUSIVE MODE",
			   s->table.quoted, p);
	char *look = store_asprintf(
	    "SELECT EXISTS (SELECT 1 FROM %s WHERE status = 'pending') OR "
	    "EXISTS (SELECT 1 FROM %s WHERE status = 'in_flight') OR EXISTS "
	    "(SELECT 1 FROM %s WHERE status = 'sent' AND finished_at >= now() "
	    "- $1::float8 * interval '1 millisecond') OR EXISTS (SELECT 1 "
	    "FROM %s WHERE status = 'failed' AND ($2::float8 <= 0 OR "
	    "finished_at >= now() - $2::float8 * interval '1 millisecond')) "
	    "OR EXISTS (SELECT 1 FROM %s b JOIN %s x ON x.id = "
	    "b.blocking_id)",
	    p, p, p, p, s->blocked, p);
	char *drop = store_asprintf("DROP TABLE %s", p);
	if (!lock || !look || !drop) {
		snprintf(err, errlen, "partitions: out of memory");
		rc = step_failed(s, 0, &busy, err, errlen);
		goto out;
	}
	rc = step(s, lock, &busy, err, errlen);
	if (rc != 0 || busy)
		goto out;
	PGresult *res = store_exec(s, "partitions", look, 2, retentions,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res) {
		rc = step_failed(s, rc, &busy, err, errlen);
		goto out;
	}
	bool live = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (live) {
		r->kept++;
		rc = store_finish_tx(s, TX_ROLLBACK, err, errlen);
		goto out;
	}
	rc = step(s, drop, &busy, err, errlen);
	if (rc == 0 && !busy) {
		rc = store_finish_tx(s, TX_COMMIT, err, errlen);
		if (rc == 0)
			r->dropped++;
	}
out:
	r->busy |= busy;
	free(lock);
	free(look);
	free(drop);
	return rc;
}

int store_partitions_tend(struct store *s, int hours_ahead,
			  int64_t retention_ms, int64_t failed_retention_ms,
			  struct partition_result *r, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	char dflt[160], with[512];
	table_derived(&s->table, "_default", dflt, sizeof(dflt));
	int rc =
	    shape(s, dflt, &r->partitioned, with, sizeof(with), err, errlen);
	if (rc != 0)
		return rc;
	/* Rows of the hourly partitions leave with them: the cleaner's
	 * deletes are for the default partition's. */
	s->clean_default = r->partitioned;
	if (!r->partitioned)
		return 0;
	rc = make_ahead(s, dflt, with, hours_ahead, r, err, errlen);
	if (rc != 0)
		return rc;

	/* No row of an hour can be deletable before the hour's end plus the
	 * shorter retention. */
	int64_t least = retention_ms;
	if (failed_retention_ms > 0 && failed_retention_ms < least)
		least = failed_retention_ms;
	char part_prefix[80], least_s[32], ret[32], fret[32];
	snprintf(part_prefix, sizeof(part_prefix), "%s_p", s->table.name);
	snprintf(least_s, sizeof(least_s), "%lld", (long long)least);
	snprintf(ret, sizeof(ret), "%lld", (long long)retention_ms);
	snprintf(fret, sizeof(fret), "%lld", (long long)failed_retention_ms);
	const char *values[3] = {s->table.quoted, part_prefix, least_s};
	PGresult *res = store_exec(s, "partitions", sql_old, 3, values,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	const char *retentions[2] = {ret, fret};
	for (int i = 0; rc == 0 && i < PQntuples(res); i++)
		rc = drop_if_done(s, PQgetvalue(res, i, 0), retentions, r, err,
				  errlen);
	PQclear(res);
	return rc;
}
