/* SPDX-License-Identifier: MIT */
/*
 * Operator statements of the store: registry, gauges, status, pauses.
 * Nothing here runs on a worker's session or on the hot path.
 */
#include "store.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgconn.h"
#include "store_internal.h"

/* Timestamps as people and jq read them: UTC, ISO 8601, whole seconds. */
#define ISO(c)                                                                 \
	"to_char((" c ") AT TIME ZONE 'UTC', "                                 \
	"'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
/* Seconds between two instants, one decimal, as a JSON number. */
#define SECS(a, b)                                                             \
	"round(extract(epoch FROM (" a ") - (" b "))::numeric, 1)::float8"

/* Postgres type oids the JSON conversion distinguishes (pg_type.h). */
#define OID_BOOL 16
#define OID_INT8 20
#define OID_INT2 21
#define OID_INT4 23
#define OID_JSON 114
#define OID_FLOAT4 700
#define OID_FLOAT8 701
#define OID_NUMERIC 1700
#define OID_JSONB 3802

/* The quoted names of the table's side objects. */
struct names {
	char registry[160];
	char control[160];
	char blocked[160];
	char claims[160];
};

static void names_of(const struct outbox_table *t, struct names *n)
{
	table_derived(t, "_replicas", n->registry, sizeof(n->registry));
	table_derived(t, "_control", n->control, sizeof(n->control));
	table_derived(t, "_blocked_keys", n->blocked, sizeof(n->blocked));
	table_derived(t, "_claims", n->claims, sizeof(n->claims));
}

/* Describes the failure of res as "what: SQLSTATE: message"; clears res. */
static int failed(PGconn *conn, PGresult *res, const char *what, char *err,
		  size_t errlen)
{
	char why[768];
	pgconn_error(conn, res, why, sizeof(why));
	snprintf(err, errlen, "%s: %s", what, why);
	int rc =
	    pgconn_needs_reconnect(conn, res) ? STORE_RECONNECT : STORE_ERROR;
	PQclear(res);
	return rc;
}

/*
 * Runs sql (NULL means it could not be built) with text parameters.
 * Returns the result when its status is want; otherwise NULL with err
 * and *rc set.
 */
static PGresult *run(PGconn *conn, const char *sql, int n,
		     const char *const *values, ExecStatusType want,
		     const char *what, int *rc, char *err, size_t errlen)
{
	*rc = 0;
	if (!sql) {
		snprintf(err, errlen, "%s: out of memory", what);
		*rc = STORE_ERROR;
		return NULL;
	}
	if (!conn || PQstatus(conn) != CONNECTION_OK) {
		snprintf(err, errlen, "%s: not connected to postgres", what);
		*rc = STORE_RECONNECT;
		return NULL;
	}
	PGresult *res = PQexecParams(conn, sql, n, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) == want)
		return res;
	*rc = failed(conn, res, what, err, errlen);
	return NULL;
}

/* Runs a statement for its effect only. */
static int exec_cmd(PGconn *conn, const char *sql, int n,
		    const char *const *values, const char *what, size_t *rows,
		    char *err, size_t errlen)
{
	int rc;
	PGresult *res =
	    run(conn, sql, n, values, PGRES_COMMAND_OK, what, &rc, err, errlen);
	if (!res)
		return rc;
	if (rows)
		*rows = (size_t)strtoull(PQcmdTuples(res), NULL, 10);
	PQclear(res);
	return 0;
}

int store_admin_heartbeat(struct store *s, const char *id, const char *version,
			  bool draining, bool starting, char *err,
			  size_t errlen)
{
	struct names n;
	names_of(&s->table, &n);
	/* Pruning rides on the heartbeat: the table is tiny and the
	 * statement already writes to it. */
	char *sql = store_asprintf(
	    "WITH pruned AS (DELETE FROM %s WHERE last_seen_at < now() - "
	    "%d * interval '1 second' AND id <> $1) "
	    "INSERT INTO %s AS r (id, version, started_at, last_seen_at, "
	    "state) VALUES ($1, $2, now(), now(), $3) "
	    "ON CONFLICT (id) DO UPDATE SET version = excluded.version, "
	    "last_seen_at = now(), state = excluded.state, started_at = "
	    "CASE WHEN $4::boolean THEN now() ELSE r.started_at END",
	    n.registry, STORE_ADMIN_PRUNE_AFTER_S, n.registry);
	const char *values[4] = {id, version, draining ? "draining" : "alive",
				 starting ? "true" : "false"};
	int rc = exec_cmd(s->conn, sql, 4, values, "registry heartbeat", NULL,
			  err, errlen);
	free(sql);
	return rc;
}

int store_admin_forget(struct store *s, const char *id, char *err,
		       size_t errlen)
{
	struct names n;
	names_of(&s->table, &n);
	char *sql = store_asprintf("DELETE FROM %s WHERE id = $1", n.registry);
	const char *values[1] = {id};
	int rc = exec_cmd(s->conn, sql, 1, values, "registry delete", NULL, err,
			  errlen);
	free(sql);
	return rc;
}

int store_admin_side_tables(struct store *s, unsigned *present, char *err,
			    size_t errlen)
{
	struct names n;
	int rc;
	names_of(&s->table, &n);
	*present = 0;
	const char *values[4] = {n.control, n.registry, n.blocked, n.claims};
	PGresult *res =
	    run(s->conn,
		"SELECT to_regclass($1) IS NOT NULL, to_regclass($2) "
		"IS NOT NULL, to_regclass($3) IS NOT NULL, to_regclass($4) "
		"IS NOT NULL",
		4, values, PGRES_TUPLES_OK, "side tables", &rc, err, errlen);
	if (!res)
		return rc;
	const unsigned bits[4] = {STORE_SIDE_CONTROL, STORE_SIDE_REPLICAS,
				  STORE_SIDE_BLOCKED_KEYS, STORE_SIDE_CLAIMS};
	for (int i = 0; i < 4; i++)
		if (PQgetvalue(res, 0, i)[0] == 't')
			*present |= bits[i];
	PQclear(res);
	return 0;
}

/* Appends item to a comma-separated list in out. */
static void list_add(char *out, size_t outlen, const char *item)
{
	size_t used = strlen(out);
	if (used < outlen)
		snprintf(out + used, outlen - used, "%s%s", used ? ", " : "",
			 item);
}

void store_side_tables_describe(const struct store *s, unsigned present,
				char *tables, size_t tables_len, char *features,
				size_t features_len)
{
	const struct {
		unsigned bit;
		const char *suffix, *feature;
	} side[] = {
	    {STORE_SIDE_CONTROL, "_control",
	     "operator pauses (outbox-relay pause/resume)"},
	    {STORE_SIDE_REPLICAS, "_replicas",
	     "the replica registry (status REPLICAS, outbox_live_replicas "
	     "counts only this replica)"},
	    {STORE_SIDE_BLOCKED_KEYS, "_blocked_keys",
	     "blocked keys (OUTBOX_ORDERING_ON_FAILURE=block)"},
	    {STORE_SIDE_CLAIMS, "_claims",
	     "crash accounting (a relay that dies holding rows charges them "
	     "no attempt, so a row that crashes relays is never failed)"},
	};
	tables[0] = features[0] = '\0';
	for (size_t i = 0; i < sizeof(side) / sizeof(side[0]); i++) {
		if (present & side[i].bit)
			continue;
		char name[160];
		snprintf(name, sizeof(name), "%s%s%s%s", s->table.schema,
			 s->table.schema[0] ? "." : "", s->table.name,
			 side[i].suffix);
		list_add(tables, tables_len, name);
		list_add(features, features_len, side[i].feature);
	}
}

/* A side table may not exist (ordered mode's blocked keys; any of them
 * beside a table made by hand). A statement cannot name a table that
 * might be missing, so its count goes through query_to_xml(), which plans
 * the inner query only when the CASE reaches it. select_n and where are
 * SQL text inside a string literal: quotes doubled. */
static char *sum_if_present_sql(const char *table, const char *select_n,
				const char *where)
{
	return store_asprintf(
	    "CASE WHEN to_regclass('%s') IS NULL THEN 0::bigint ELSE "
	    "(xpath('/row/n/text()', query_to_xml('%s FROM ' || "
	    "to_regclass('%s')::text || ' WHERE %s', false, true, "
	    "'')))[1]::text::bigint END",
	    table, select_n, table, where);
}

static char *count_if_present_sql(const char *table, const char *where)
{
	return sum_if_present_sql(table, "SELECT count(*) AS n", where);
}

static char *blocked_count_sql(const struct names *n)
{
	return count_if_present_sql(n->blocked, "true");
}

/* Rows held by live lock leases (docs/design.md §4): the claims whose
 * transaction is in progress. Tables made by hand may have no claims. */
static char *claimed_count_sql(const struct names *n)
{
	return sum_if_present_sql(
	    n->claims, "SELECT coalesce(sum(cardinality(ids)), 0) AS n",
	    "pg_xact_status(xid) = ''in progress''");
}

int store_admin_gauges(struct store *s, struct store_admin_gauges *g, char *err,
		       size_t errlen)
{
	struct names n;
	int rc;
	const char *T = s->table.quoted;
	memset(g, 0, sizeof(*g));
	names_of(&s->table, &n);
	char *blocked = blocked_count_sql(&n);
	char live_where[96];
	snprintf(live_where, sizeof(live_where),
		 "last_seen_at > now() - make_interval(secs => %d)",
		 STORE_ADMIN_DEAD_AFTER_S);
	char *live = count_if_present_sql(n.registry, live_where);
	char *claimed = claimed_count_sql(&n);
	/* Each count is bounded by a partial index of its state; the pending
	 * scan also yields the oldest row's age. */
	char *sql =
	    blocked && live && claimed
		? store_asprintf(
		      "WITH p AS (SELECT count(*) AS n, min(created_at) AS "
		      "oldest "
		      "FROM %s WHERE status = 'pending') "
		      "SELECT p.n, greatest(0, coalesce((extract(epoch FROM "
		      "now() - "
		      "p.oldest) * 1000)::bigint, 0)), "
		      "(SELECT count(*) FROM %s WHERE status = 'in_flight') "
		      "+ %s, "
		      "(SELECT count(*) FROM %s WHERE status = 'failed'), "
		      "coalesce((SELECT n_dead_tup FROM pg_stat_user_tables "
		      "WHERE "
		      "relid = '%s'::regclass), 0), "
		      "%s, %s, "
		      "(pg_notification_queue_usage() * 1000000)::bigint "
		      "FROM p",
		      T, T, claimed, T, T, live, blocked)
		: NULL;
	PGresult *res = run(s->conn, sql, 0, NULL, PGRES_TUPLES_OK,
			    "gauge query", &rc, err, errlen);
	free(sql);
	free(blocked);
	free(live);
	free(claimed);
	if (!res)
		return rc;
	int64_t *fields[8] = {&g->backlog,	&g->oldest_pending_ms,
			      &g->in_flight,	&g->failed,
			      &g->dead_tuples,	&g->live_replicas,
			      &g->blocked_keys, &g->notify_queue_ppm};
	for (int i = 0; i < 8; i++)
		*fields[i] = PQgetisnull(res, 0, i)
				 ? 0
				 : strtoll(PQgetvalue(res, 0, i), NULL, 10);
	PQclear(res);
	return 0;
}

/* ---- status ---- */

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
static int add_query(PGconn *conn, char *sql, int n, const char *const *values,
		     cJSON *parent, const char *key, bool as_array, char *err,
		     size_t errlen)
{
	int rc;
	PGresult *res =
	    run(conn, sql, n, values, PGRES_TUPLES_OK, key, &rc, err, errlen);
	free(sql);
	if (!res)
		return rc;
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
	PGconn *conn;
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
	return add_query(c->conn, sql, 0, NULL, c->st, key, as_array, c->err,
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
		"SELECT id, version, state, last_seen_at > %s AS alive, "
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

/* The holder is leased_by up to its second '/': host/pid, the registry
 * id. */
#define HOLDER                                                                 \
	"CASE WHEN leased_by LIKE '%/%' THEN "                                 \
	"split_part(leased_by, '/', 1) || '/' || "                             \
	"split_part(leased_by, '/', 2) END"

/* The rows in flight as one relation: those of live lock leases (the
 * rows themselves still say pending; attempts counts the one under way)
 * and those left in_flight by relays of the row lease. */
static char *flight_sql(const struct status_ctx *c, bool claims)
{
	char *legacy = store_asprintf(
	    "SELECT id, type, exchange, leased_by, lease_id, leased_at, "
	    "lease_expires_at, attempts, max_attempts, seq FROM %s WHERE "
	    "status = 'in_flight'",
	    c->T);
	if (!claims || !legacy)
		return legacy;
	char *both = store_asprintf(
	    "SELECT t.id, t.type, t.exchange, c.holder AS leased_by, "
	    "c.lease_id, c.leased_at, c.expires_at AS lease_expires_at, "
	    "t.attempts + 1 AS attempts, t.max_attempts, t.seq FROM %s c "
	    "CROSS JOIN LATERAL unnest(c.ids) AS u(id) JOIN %s t ON t.id = "
	    "u.id WHERE cardinality(c.ids) > 0 AND pg_xact_status(c.xid) = "
	    "'in progress' AND t.status = 'pending' UNION ALL %s",
	    c->n.claims, c->T, legacy);
	free(legacy);
	return both;
}

static int status_leases(struct status_ctx *c)
{
	PGresult *res =
	    PQexecParams(c->conn, "SELECT to_regclass($1) IS NOT NULL", 1, NULL,
			 (const char *const[]){c->n.claims}, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		return failed(c->conn, res, "status: claims", c->err,
			      c->errlen);
	bool claims = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	char *F = flight_sql(c, claims);
	if (!F) {
		snprintf(c->err, c->errlen, "status: out of memory");
		return STORE_ERROR;
	}
	int rc = section(
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
			c->dead, SECS("f.lease_expires_at", "now()"), HOLDER, F,
			c->n.registry, c->max_rows));
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
			SECS("f.lease_expires_at", "now()"), HOLDER, F,
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
	char *blocked = blocked_count_sql(&c->n);
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
	return add_query(c->conn,
			 store_asprintf("SELECT row_to_json(b) AS key FROM %s "
					"b LIMIT %d",
					c->n.blocked, c->max_rows),
			 0, NULL, bk, "rows", true, c->err, c->errlen);
}

static int status_table_stats(struct status_ctx *c)
{
	return section(
	    c, "table_stats", false,
	    store_asprintf(
		"SELECT s.n_live_tup AS live_tuples, s.n_dead_tup AS "
		"dead_tuples, pg_total_relation_size('%s'::regclass) AS "
		"total_bytes, %s AS last_vacuum, %s AS last_autovacuum, %s "
		"AS last_analyze, %s AS last_autoanalyze, %s AS "
		"vacuumed_seconds_ago, s.vacuum_count, s.autovacuum_count "
		"FROM (SELECT 1) one LEFT JOIN pg_stat_user_tables s ON "
		"s.relid = '%s'::regclass",
		c->T, ISO("s.last_vacuum"), ISO("s.last_autovacuum"),
		ISO("s.last_analyze"), ISO("s.last_autoanalyze"),
		SECS("now()", "greatest(s.last_vacuum, s.last_autovacuum)"),
		c->T));
}

/* What holds the xmin horizon back: sessions with an old snapshot (this
 * one excluded), replication slots, prepared transactions. Dead rows
 * younger than the oldest of these cannot be vacuumed. */
static int status_xmin_holders(struct status_ctx *c)
{
	return section(
	    c, "oldest_xmin_holders", true,
	    store_asprintf(
		"SELECT * FROM ("
		"SELECT 'session' AS kind, a.pid, a.application_name AS name, "
		"a.usename::text AS user_name, a.backend_type, a.state, "
		"age(a.backend_xmin)::bigint AS xmin_age, %s AS "
		"xact_age_seconds, %s AS state_age_seconds, "
		"left(regexp_replace(a.query, '\\s+', ' ', 'g'), 200) AS query "
		"FROM pg_stat_activity a WHERE a.backend_xmin IS NOT NULL AND "
		"a.pid <> pg_backend_pid() "
		"UNION ALL SELECT 'replication slot', NULL, slot_name::text, "
		"NULL, slot_type, CASE WHEN active THEN 'active' ELSE "
		"'inactive' END, age(xmin)::bigint, NULL, NULL, NULL "
		"FROM pg_replication_slots WHERE xmin IS NOT NULL "
		"UNION ALL SELECT 'prepared transaction', NULL, gid, "
		"owner::text, NULL, 'prepared', age(transaction)::bigint, %s, "
		"NULL, NULL FROM pg_prepared_xacts"
		") h ORDER BY xmin_age DESC NULLS LAST, xact_age_seconds DESC "
		"NULLS LAST LIMIT 5",
		SECS("now()", "a.xact_start"), SECS("now()", "a.state_change"),
		SECS("now()", "prepared")));
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
	struct status_ctx c = {.conn = s->conn,
			       .T = s->table.quoted,
			       .max_rows = max_rows,
			       .err = err,
			       .errlen = errlen};
	names_of(&s->table, &c.n);
	snprintf(c.dead, sizeof(c.dead), "now() - %d * interval '1 second'",
		 STORE_ADMIN_DEAD_AFTER_S);
	c.st = cJSON_CreateObject();
	if (!c.st || !cJSON_AddStringToObject(c.st, "table", c.T)) {
		cJSON_Delete(c.st);
		snprintf(err, errlen, "status: out of memory");
		return STORE_ERROR;
	}
	/* One snapshot for every section, so counts agree. */
	rc = exec_cmd(c.conn, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY",
		      0, NULL, "status", NULL, err, errlen);
	if (rc != 0)
		goto out;
	rc = status_sections(&c);
	if (rc == STORE_RECONNECT)
		goto out;
	char ignored[256];
	if (rc != 0) {
		exec_cmd(c.conn, "ROLLBACK", 0, NULL, "status", NULL, ignored,
			 sizeof(ignored));
		goto out;
	}
	rc = exec_cmd(c.conn, "COMMIT", 0, NULL, "status", NULL, err, errlen);
out:
	if (rc == 0)
		*out = c.st;
	else
		cJSON_Delete(c.st);
	return rc;
}

/* ---- pauses ---- */

/* Pauses need the control table; a table made by hand may lack it. */
static int need_control(struct store *s, const char *control, char *err,
			size_t errlen)
{
	unsigned present = 0;
	int rc = store_admin_side_tables(s, &present, err, errlen);
	if (rc == 0 && !(present & STORE_SIDE_CONTROL)) {
		snprintf(err, errlen,
			 "the control table %s does not exist, so no pause "
			 "can be kept: create it with `outbox-relay migrate`",
			 control);
		rc = STORE_ERROR;
	}
	return rc;
}

int store_admin_pause(struct store *s, const char *destination,
		      const char *reason, const char *paused_by,
		      bool *was_paused, char *err, size_t errlen)
{
	struct names n;
	int rc;
	names_of(&s->table, &n);
	*was_paused = false;
	rc = need_control(s, n.control, err, errlen);
	if (rc != 0)
		return rc;
	/* xmax is set on the conflicting row an upsert updated and zero on
	 * a fresh insert: it tells the two apart in one statement. The
	 * first pause's paused_at is kept. */
	char *sql = store_asprintf(
	    "INSERT INTO %s AS c (destination, paused_by, reason) VALUES "
	    "($1, $2, $3) ON CONFLICT (destination) DO UPDATE SET "
	    "paused_by = excluded.paused_by, reason = "
	    "coalesce(excluded.reason, c.reason) "
	    "RETURNING (c.xmax::text <> '0')",
	    n.control);
	const char *values[3] = {destination, paused_by, reason};
	PGresult *res = run(s->conn, sql, 3, values, PGRES_TUPLES_OK, "pause",
			    &rc, err, errlen);
	free(sql);
	if (!res)
		return rc;
	*was_paused = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return 0;
}

int store_admin_resume(struct store *s, const char *destination,
		       bool *was_paused, char *err, size_t errlen)
{
	struct names n;
	size_t rows = 0;
	names_of(&s->table, &n);
	*was_paused = false;
	int rc = need_control(s, n.control, err, errlen);
	if (rc != 0)
		return rc;
	char *sql =
	    store_asprintf("DELETE FROM %s WHERE destination = $1", n.control);
	const char *values[1] = {destination};
	rc = exec_cmd(s->conn, sql, 1, values, "resume", &rows, err, errlen);
	free(sql);
	if (rc == 0)
		*was_paused = rows > 0;
	return rc;
}

/* ---- time arguments ---- */

static bool is_duration(const char *s)
{
	const char *p = s;
	while (isdigit((unsigned char)*p))
		p++;
	if (p == s)
		return false;
	return strcmp(p, "ms") == 0 || strcmp(p, "s") == 0 ||
	       strcmp(p, "m") == 0 || strcmp(p, "h") == 0 ||
	       strcmp(p, "d") == 0;
}

int store_admin_time(struct store *s, const char *text, char *out,
		     size_t outlen, char *err, size_t errlen)
{
	PGconn *conn = s->conn;
	const char *fmt = "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"'";
	char *sql =
	    is_duration(text)
		? store_asprintf("SELECT to_char((now() - $1::interval) "
				 "AT TIME ZONE 'UTC', %s)",
				 fmt)
		: store_asprintf("SELECT to_char($1::timestamptz AT "
				 "TIME ZONE 'UTC', %s)",
				 fmt);
	const char *values[1] = {text};
	int rc = 0;
	PGresult *res = NULL;
	if (!sql) {
		snprintf(err, errlen, "time: out of memory");
		return STORE_ERROR;
	}
	if (!conn || PQstatus(conn) != CONNECTION_OK) {
		snprintf(err, errlen, "time: not connected to postgres");
		rc = STORE_RECONNECT;
		goto out;
	}
	res = PQexecParams(conn, sql, 1, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
		if (state && strncmp(state, "22", 2) == 0) {
			/* Data exception: the value itself is wrong. */
			snprintf(err, errlen,
				 "'%s' is neither a time Postgres can read "
				 "nor a duration like 90s, 15m, 2h or 3d",
				 text);
			rc = STORE_INVALID;
			PQclear(res);
		} else {
			rc = failed(conn, res, "time", err, errlen);
		}
		res = NULL;
		goto out;
	}
	snprintf(out, outlen, "%s", PQgetvalue(res, 0, 0));
out:
	PQclear(res);
	free(sql);
	return rc;
}
