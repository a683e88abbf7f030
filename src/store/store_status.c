/* SPDX-License-Identifier: MIT */
/*
 * `outbox-relay status`: the whole state of the outbox as one JSON
 * document, each section one query (docs/design.md §9).
 */
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgconn.h"
#include "store_admin.h"
#include "store_internal.h"

static cJSON *value_json(const PGresult *res, int row, int col)
{
	if (PQgetisnull(res, row, col))
		return cJSON_CreateNull();
	const char *v = PQgetvalue(res, row, col);
	switch (PQftype(res, col)) {
	case OID_INT2:
	case OID_INT4:
	case OID_INT8:
	case OID_FLOAT4:
	case OID_FLOAT8:
	case OID_NUMERIC:
		return cJSON_CreateNumber(strtod(v, NULL));
	case OID_BOOL:
		return cJSON_CreateBool(v[0] == 't');
	case OID_JSON:
	case OID_JSONB: {
		cJSON *j = cJSON_Parse(v);
		return j ? j : cJSON_CreateString(v);
	}
	default:
		return cJSON_CreateString(v);
	}
}

/* Row i of res as an object keyed by column names; NULL when out of
 * memory. */
static cJSON *row_json(const PGresult *res, int i)
{
	cJSON *obj = cJSON_CreateObject();
	for (int c = 0; obj && c < PQnfields(res); c++) {
		cJSON *v = value_json(res, i, c);
		if (!v || !cJSON_AddItemToObject(obj, PQfname(res, c), v)) {
			cJSON_Delete(v);
			cJSON_Delete(obj);
			obj = NULL;
		}
	}
	return obj;
}

/* Runs sql and adds its rows to parent under key: every row as an array
 * of objects (as_array), or the first row's columns merged into an
 * object (a statement returning one row). Frees sql. */
static int add_query(struct store *s, char *sql, int n,
		     const char *const *values, cJSON *parent, const char *key,
		     bool as_array, char *err, size_t errlen)
{
	int rc;
	PGresult *res = store_exec(s, key, sql, n, values, PGRES_TUPLES_OK, &rc,
				   err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	cJSON *item = NULL;
	rc = STORE_ERROR;
	if (as_array) {
		item = cJSON_CreateArray();
		for (int i = 0; item && i < PQntuples(res); i++) {
			cJSON *row = row_json(res, i);
			if (!row || !cJSON_AddItemToArray(item, row)) {
				cJSON_Delete(row);
				goto out;
			}
		}
	} else {
		item = PQntuples(res) > 0 ? row_json(res, 0)
					  : cJSON_CreateObject();
	}
	if (item && cJSON_AddItemToObject(parent, key, item)) {
		item = NULL;
		rc = 0;
	}
out:
	if (rc != 0)
		snprintf(err, errlen, "%s: out of memory", key);
	cJSON_Delete(item);
	PQclear(res);
	return rc;
}

/* What every section of status needs. */
struct status_ctx {
	struct store *s;
	const char *T; /* the outbox table, quoted */
	struct names n;
	char dead[64]; /* the instant before which a replica is dead */
	int max_rows;
	cJSON *st;
	char *err;
	size_t errlen;
};

/* Adds the rows of sql (freed) to the status under key. */
static int section(struct status_ctx *c, const char *key, bool as_array,
		   char *sql)
{
	return add_query(c->s, sql, 0, NULL, c->st, key, as_array, c->err,
			 c->errlen);
}

static int status_database(struct status_ctx *c)
{
	int rc = section(
	    c, "database", false,
	    store_asprintf(
		"SELECT %s AS checked_at, current_database() AS database, "
		"current_setting('server_version') AS server_version, %d AS "
		"dead_after_seconds",
		ISO("now()"), STORE_ADMIN_DEAD_AFTER_S));
	if (rc != 0)
		return rc;
	return section(
	    c, "replicas", true,
	    store_asprintf(
		"SELECT id, version, protocol, retention_ms, "
		"failed_retention_ms, state, "
		"last_seen_at > %s AS alive, "
		"%s AS started_at, %s AS up_seconds, %s AS last_seen_at, "
		"%s AS last_seen_seconds_ago FROM %s "
		"ORDER BY last_seen_at > %s DESC, id LIMIT %d",
		c->dead, ISO("started_at"), SECS("now()", "started_at"),
		ISO("last_seen_at"), SECS("now()", "last_seen_at"),
		c->n.registry, c->dead, c->max_rows));
}

static int status_backlog(struct status_ctx *c)
{
	return section(
	    c, "backlog", false,
	    store_asprintf(
		"SELECT count(*) AS pending, count(*) FILTER (WHERE "
		"next_attempt_at <= now()) AS due_now, count(*) FILTER "
		"(WHERE suspect) AS crash_suspects, "
		"CASE WHEN count(*) > 0 THEN greatest(0, %s) END AS "
		"oldest_pending_age_seconds, "
		"%s AS oldest_pending_created_at "
		"FROM %s WHERE status = 'pending'",
		SECS("now()", "min(created_at)"), ISO("min(created_at)"),
		c->T));
}

static int status_leases(struct status_ctx *c)
{
	int rc;
	PGresult *res = store_exec(c->s, "status: claims",
				   "SELECT to_regclass($1) IS NOT NULL", 1,
				   (const char *const[]){c->n.claims},
				   PGRES_TUPLES_OK, &rc, c->err, c->errlen);
	if (!res)
		return store_public_rc(rc);
	bool claims = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	char *F = admin_flight_sql(c->T, c->n.claims, claims);
	if (!F) {
		snprintf(c->err, c->errlen, "status: out of memory");
		return STORE_ERROR;
	}
	rc = section(
	    c, "in_flight", false,
	    store_asprintf("SELECT count(*) AS count, count(*) FILTER (WHERE "
			   "lease_expires_at < now()) AS expired_leases "
			   "FROM (%s) f0",
			   F));
	if (rc == 0)
		rc = section(
		    c, "in_flight_holders", true,
		    store_asprintf(
			"SELECT f.holder, coalesce(r.last_seen_at > %s, false) "
			"AS holder_alive, r.state AS holder_state, count(*) AS "
			"rows, count(*) FILTER (WHERE f.lease_expires_at < "
			"now()) AS expired, min(%s) AS next_expiry_in_seconds "
			"FROM (SELECT %s AS holder, lease_expires_at FROM (%s) "
			"f0) f LEFT JOIN %s r ON r.id "
			"= f.holder GROUP BY f.holder, r.last_seen_at, r.state "
			"ORDER BY count(*) DESC LIMIT %d",
			c->dead, SECS("f.lease_expires_at", "now()"),
			ADMIN_HOLDER, F, c->n.registry, c->max_rows));
	if (rc == 0)
		rc = section(
		    c, "in_flight_rows", true,
		    store_asprintf(
			"SELECT f.id::text AS id, f.type, f.exchange AS "
			"destination, f.leased_by, f.holder, "
			"coalesce(r.last_seen_at > %s, false) AS holder_alive, "
			"f.attempts, f.max_attempts, %s AS leased_at, %s AS "
			"lease_expires_at, %s AS lease_expires_in_seconds, "
			"f.lease_id::text AS lease_id "
			"FROM (SELECT *, %s AS holder FROM (%s) f0 ORDER BY "
			"lease_expires_at LIMIT %d) f "
			"LEFT JOIN %s r ON r.id = f.holder "
			"ORDER BY f.lease_expires_at, f.seq",
			c->dead, ISO("f.leased_at"), ISO("f.lease_expires_at"),
			SECS("f.lease_expires_at", "now()"), ADMIN_HOLDER, F,
			c->max_rows, c->n.registry));
	free(F);
	return rc;
}

/* The sample error is the latest failure of the type, found through the
 * terminal index instead of aggregating every error text. */
static int status_failures(struct status_ctx *c)
{
	int rc = section(
	    c, "failed_by_type", true,
	    store_asprintf(
		"SELECT g.type, g.count, g.max_attempts_spent, %s AS "
		"last_failed_at, (SELECT x.last_error FROM %s x WHERE "
		"x.status = 'failed' AND x.type = g.type ORDER BY "
		"x.finished_at DESC LIMIT 1) AS sample_error FROM "
		"(SELECT type, count(*) AS count, count(*) FILTER (WHERE "
		"attempts >= max_attempts) AS max_attempts_spent, "
		"max(finished_at) AS last FROM %s WHERE status = 'failed' "
		"GROUP BY type) g ORDER BY g.count DESC, g.type LIMIT %d",
		ISO("g.last"), c->T, c->T, c->max_rows));
	if (rc != 0)
		return rc;
	return section(c, "failed", false,
		       store_asprintf("SELECT count(*) AS count FROM %s WHERE "
				      "status = 'failed'",
				      c->T));
}

static int status_pauses(struct status_ctx *c)
{
	return section(
	    c, "paused", true,
	    store_asprintf(
		"SELECT destination, %s AS paused_at, %s AS paused_seconds, "
		"paused_by, reason FROM %s ORDER BY destination",
		ISO("paused_at"), SECS("now()", "paused_at"), c->n.control));
}

static int status_blocked_keys(struct status_ctx *c)
{
	char *blocked = admin_blocked_count_sql(&c->n);
	int rc = section(c, "blocked_keys", false,
			 blocked ? store_asprintf("SELECT to_regclass('%s') IS "
						  "NOT NULL AS present, %s AS "
						  "count",
						  c->n.blocked, blocked)
				 : NULL);
	free(blocked);
	if (rc != 0)
		return rc;
	cJSON *bk = cJSON_GetObjectItemCaseSensitive(c->st, "blocked_keys");
	if (!cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(bk, "present")))
		return 0;
	/* Present: the ordering feature owns its columns, so rows are shown
	 * whole. */
	return add_query(c->s,
			 store_asprintf("SELECT row_to_json(b) AS key FROM %s "
					"b LIMIT %d",
					c->n.blocked, c->max_rows),
			 0, NULL, bk, "rows", true, c->err, c->errlen);
}

/* Of a partitioned table, its partitions' statistics: counts and sizes
 * summed, and of the times the earliest, so "vacuumed ... ago" tells of
 * the partition autovacuum reached last. */
static int status_table_stats(struct status_ctx *c)
{
	return section(
	    c, "table_stats", false,
	    store_asprintf(
		"SELECT s.n_live_tup AS live_tuples, s.n_dead_tup AS "
		"dead_tuples, s.total_bytes, %s AS last_vacuum, %s AS "
		"last_autovacuum, %s AS last_analyze, %s AS last_autoanalyze, "
		"%s AS vacuumed_seconds_ago, s.vacuum_count, "
		"s.autovacuum_count FROM (SELECT 1) one LEFT JOIN (SELECT "
		"sum(pg_stat_get_live_tuples(relid))::bigint AS n_live_tup, "
		"sum(pg_stat_get_dead_tuples(relid))::bigint "
		"AS n_dead_tup, sum(pg_total_relation_size(relid))::bigint AS "
		"total_bytes, min(pg_stat_get_last_vacuum_time(relid)) AS "
		"last_vacuum, min(pg_stat_get_last_autovacuum_time(relid)) AS "
		"last_autovacuum, min(pg_stat_get_last_analyze_time(relid)) AS "
		"last_analyze, min(pg_stat_get_last_autoanalyze_time(relid)) "
		"AS last_autoanalyze, "
		"min(greatest(pg_stat_get_last_vacuum_time(relid), "
		"pg_stat_get_last_autovacuum_time(relid))) AS vacuumed, "
		"sum(pg_stat_get_vacuum_count(relid))::bigint AS vacuum_count, "
		"sum(pg_stat_get_autovacuum_count(relid))::bigint AS "
		"autovacuum_count FROM " ADMIN_STATS_OF(
		    "'%s'::regclass") " r) s ON true",
		ISO("s.last_vacuum"), ISO("s.last_autovacuum"),
		ISO("s.last_analyze"), ISO("s.last_autoanalyze"),
		SECS("now()", "s.vacuumed"), c->T, c->T));
}

/* What holds the xmin horizon back: sessions with an old snapshot or
 * transaction id (this one excluded, others as ADMIN_SESSION_HOLDS says),
 * replication slots, prepared transactions. Dead rows younger than the oldest
 * of these cannot be vacuumed; the first row is the horizon's holder (of
 * those as old, one holding by its transaction id first, as the gauges
 * rank them). A logical slot's catalog_xmin holds back only the catalogs:
 * shown, ranked last. */
static int status_xmin_holders(struct status_ctx *c)
{
	return section(
	    c, "oldest_xmin_holders", true,
	    store_asprintf(
		"SELECT * FROM ("
		"SELECT 'session' AS kind, a.pid, a.application_name AS name, "
		"a.usename::text AS user_name, a.backend_type, a.state, "
		"(%s)::bigint AS xmin_age, %s AS holds_by_xid, "
		"NULL::bigint AS catalog_xmin_age, "
		"%s AS xact_age_seconds, %s AS state_age_seconds, "
		"left(regexp_replace(a.query, '\\s+', ' ', 'g'), 200) AS query "
		"FROM pg_stat_activity a WHERE %s "
		"UNION ALL SELECT 'replication slot', NULL, slot_name::text, "
		"NULL, slot_type, CASE WHEN active THEN 'active' ELSE "
		"'inactive' END, age(xmin)::bigint, false, "
		"age(catalog_xmin)::bigint, "
		"NULL, NULL, NULL FROM pg_replication_slots WHERE xmin IS NOT "
		"NULL OR catalog_xmin IS NOT NULL "
		"UNION ALL SELECT 'prepared transaction', NULL, gid, "
		"owner::text, NULL, 'prepared', age(transaction)::bigint, "
		"true, NULL, "
		"%s, NULL, NULL FROM pg_prepared_xacts"
		") h ORDER BY xmin_age DESC NULLS LAST, holds_by_xid DESC, "
		"xact_age_seconds DESC NULLS LAST LIMIT 5",
		ADMIN_SESSION_XMIN_AGE, ADMIN_SESSION_BY_XID,
		SECS("now()", "a.xact_start"), SECS("now()", "a.state_change"),
		ADMIN_SESSION_HOLDS, SECS("now()", "prepared")));
}

/* The sections in the order status shows them; the first failure ends
 * the read. */
static int status_sections(struct status_ctx *c)
{
	int (*const sections[])(struct status_ctx *) = {
	    status_database,	status_backlog,	     status_leases,
	    status_failures,	status_pauses,	     status_blocked_keys,
	    status_table_stats, status_xmin_holders,
	};
	for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++) {
		int rc = sections[i](c);
		if (rc != 0)
			return rc;
	}
	return 0;
}

int store_admin_status(struct store *s, int max_rows, cJSON **out, char *err,
		       size_t errlen)
{
	int rc;
	*out = NULL;
	if (max_rows < 1)
		max_rows = 1;
	struct status_ctx c = {.s = s,
			       .T = s->table.quoted,
			       .max_rows = max_rows,
			       .err = err,
			       .errlen = errlen};
	admin_names_of(&s->table, &c.n);
	snprintf(c.dead, sizeof(c.dead), "now() - %d * interval '1 second'",
		 STORE_ADMIN_DEAD_AFTER_S);
	c.st = cJSON_CreateObject();
	if (!c.st || !cJSON_AddStringToObject(c.st, "table", c.T)) {
		cJSON_Delete(c.st);
		snprintf(err, errlen, "status: out of memory");
		return STORE_ERROR;
	}
	/* One snapshot for every section, so counts agree. */
	rc = store_exec_cmd(s, "status",
			    "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
			    0, NULL, NULL, err, errlen);
	if (rc != 0)
		goto out;
	rc = status_sections(&c);
	if (rc == STORE_RECONNECT)
		goto out;
	char ignored[256];
	if (rc != 0) {
		store_exec_cmd(s, "status", "ROLLBACK", 0, NULL, NULL, ignored,
			       sizeof(ignored));
		goto out;
	}
	rc = store_exec_cmd(s, "status", "COMMIT", 0, NULL, NULL, err, errlen);
out:
	if (rc == 0)
		*out = c.st;
	else
		cJSON_Delete(c.st);
	return rc;
}
