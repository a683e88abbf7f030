/* SPDX-License-Identifier: MIT */
/* Applying the embedded sql/ migrations in order, under an advisory lock. */
#include "migrate.h"

#include <poll.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "locks.h"
#include "pgconn.h"
#include "store.h"
#include "store_internal.h"
#include "store_test.h"

#define LOCK_WAIT_MS 60000
/* A strong lock request queues every later request for the table behind
 * it, the application's inserts and the relays' leases included, for as
 * long as it waits: so it waits briefly, and is retried with a backoff
 * (up to about a minute in all) that lets the queue drain between tries.
 * A lease transaction normally ends within one publish. */
#define DDL_LOCK_TIMEOUT "200ms"
#define DDL_ATTEMPTS 30
#define DDL_BACKOFF_MAX_MS 2000

char *migrate_expand(const char *sql, const struct outbox_table *t)
{
	char channel[200];
	store_channel_sql(t, channel, sizeof(channel));
	const struct {
		const char *token;
		const char *value;
	} subst[] = {
	    {"{{table}}", t->quoted}, {"{{s}}", t->prefix},
	    {"{{n}}", t->name},	      {"{{lit}}", t->literal},
	    {"{{channel}}", channel},
	};
	size_t cap = strlen(sql) * 2 + 256, len = 0;
	char *out = malloc(cap);
	if (!out)
		return NULL;
	for (const char *p = sql; *p;) {
		const char *value = NULL;
		size_t token_len = 0;
		if (p[0] == '{' && p[1] == '{') {
			for (size_t i = 0; i < sizeof(subst) / sizeof(subst[0]);
			     i++) {
				size_t n = strlen(subst[i].token);
				if (strncmp(p, subst[i].token, n) == 0) {
					value = subst[i].value;
					token_len = n;
					break;
				}
			}
		}
		const char *chunk = value ? value : p;
		size_t chunk_len = value ? strlen(value) : 1;
		if (len + chunk_len + 1 > cap) {
			cap = (len + chunk_len + 1) * 2;
			char *grown = realloc(out, cap);
			if (!grown) {
				free(out);
				return NULL;
			}
			out = grown;
		}
		memcpy(out + len, chunk, chunk_len);
		len += chunk_len;
		p += value ? token_len : 1;
	}
	out[len] = '\0';
	return out;
}

static bool exec_ok(PGconn *conn, const char *sql, char *err, size_t errlen)
{
	PGresult *res = PQexec(conn, sql);
	ExecStatusType st = PQresultStatus(res);
	bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
	if (!ok)
		pgconn_error(conn, res, err, errlen);
	PQclear(res);
	return ok;
}

int migrate_lock_held(PGconn *conn, const struct outbox_table *t, char *err,
		      size_t errlen)
{
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = "
		 "'advisory' AND pid = pg_backend_pid() AND granted AND "
		 "objsubid = 2 AND classid = %d AND objid::bigint = "
		 "(hashtext(%s)::bigint & 4294967295))",
		 LOCK_NS_MIGRATE, t->literal);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(conn, res, err, errlen);
		PQclear(res);
		return -1;
	}
	bool held = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	if (held)
		return 0;
	snprintf(err, errlen,
		 "the migration lock of %s, taken by the previous statement, "
		 "is not held by the session of the next one: the connection "
		 "goes through a transaction-mode pooler (PgBouncer "
		 "pool_mode = transaction)? Give migrate a direct connection "
		 "to the server",
		 t->literal);
	return -1;
}

/* Takes the session-level migration lock, waiting at most LOCK_WAIT_MS.
 * A session lock is right here (unlike the loops): migrate is a short
 * command whose connection ends with it. */
int migrate_lock(PGconn *conn, const struct outbox_table *t, char *err,
		 size_t errlen)
{
	char sql[256];
	snprintf(sql, sizeof(sql),
		 "SELECT pg_try_advisory_lock(%d, hashtext(%s))",
		 LOCK_NS_MIGRATE, t->literal);
	int64_t until = clock_ms() + LOCK_WAIT_MS;
	for (;;) {
		PGresult *res = PQexec(conn, sql);
		if (PQresultStatus(res) != PGRES_TUPLES_OK) {
			pgconn_error(conn, res, err, errlen);
			PQclear(res);
			return -1;
		}
		bool got = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
		PQclear(res);
		if (got)
			return migrate_lock_held(conn, t, err, errlen);
		if (clock_ms() > until) {
			snprintf(err, errlen,
				 "another migrate held the migration lock of "
				 "%s for %d s",
				 t->literal, LOCK_WAIT_MS / 1000);
			return -1;
		}
		clock_sleep_ms(200);
	}
}

static int applied_versions(PGconn *conn, const char *version_table,
			    bool *applied, int max_version, char *err,
			    size_t errlen)
{
	char sql[256];
	snprintf(sql, sizeof(sql), "SELECT version FROM %s", version_table);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(conn, res, err, errlen);
		PQclear(res);
		return -1;
	}
	for (int i = 0; i < PQntuples(res); i++) {
		long v = strtol(PQgetvalue(res, i, 0), NULL, 10);
		if (v > 0 && v <= max_version)
			applied[v] = true;
	}
	PQclear(res);
	return 0;
}

/* Runs one transactional migration, retrying when its DDL could not get
 * its lock within DDL_LOCK_TIMEOUT (the application's traffic goes first). */
static int apply_in_transaction(PGconn *conn, const struct sql_migration *m,
				const char *body, const char *version_table,
				char *err, size_t errlen)
{
	char record[512];
	snprintf(record, sizeof(record),
		 "INSERT INTO %s (version, name) VALUES (%d, '%s')",
		 version_table, m->version, m->name);
	int64_t backoff = 200;
	for (int attempt = 1;; attempt++) {
		char why[512] = "";
		bool ok =
		    exec_ok(conn, PGCONN_BEGIN, why, sizeof(why)) &&
		    exec_ok(conn,
			    "SET LOCAL lock_timeout = '" DDL_LOCK_TIMEOUT "'",
			    why, sizeof(why)) &&
		    exec_ok(conn, body, why, sizeof(why)) &&
		    exec_ok(conn, record, why, sizeof(why)) &&
		    exec_ok(conn, "COMMIT", why, sizeof(why));
		if (ok)
			return 0;
		char ignored[64];
		exec_ok(conn, "ROLLBACK", ignored, sizeof(ignored));
		/* pgconn_error() leads with the SQLSTATE. */
		bool lock_timeout = strncmp(why, "55P03", 5) == 0;
		if (!lock_timeout || attempt >= DDL_ATTEMPTS) {
			snprintf(err, errlen, "migration %s failed: %s",
				 m->name, why);
			return -1;
		}
		clock_sleep_ms(backoff);
		if (backoff < DDL_BACKOFF_MAX_MS)
			backoff *= 2;
	}
}

/* The index a CREATE INDEX statement builds: its first quoted name. */
static void index_name(const char *sql, char *out, size_t outlen)
{
	const char *q = strstr(sql, "INDEX");
	q = q ? strchr(q, '"') : NULL;
	const char *end = q ? strchr(q + 1, '"') : NULL;
	if (end)
		snprintf(out, outlen, "%.*s", (int)(end - q - 1), q + 1);
	else
		snprintf(out, outlen, "index");
}

/* Reports pg_stat_progress_create_index of backend pid through w, read on
 * a second session (opened on first use; without one, nothing is said). */
static void report_index(struct migrate_watch *w, int pid, const char *name)
{
	char err[256], sql[256];
	if (!w->session && !w->tried) {
		w->tried = true;
		w->session = pgconn_connect(w->po, err, sizeof(err));
	}
	if (!w->session)
		return;
	snprintf(sql, sizeof(sql),
		 "SELECT phase, blocks_done, blocks_total, tuples_done, "
		 "tuples_total FROM pg_stat_progress_create_index WHERE pid = "
		 "%d",
		 pid);
	PGresult *res = PQexec(w->session, sql);
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
		int64_t v[4];
		for (int i = 0; i < 4; i++)
			v[i] = strtoll(PQgetvalue(res, 0, i + 1), NULL, 10);
		bool blocks = v[1] > 0;
		struct store_progress_info p = {
		    .what = name,
		    .phase = PQgetvalue(res, 0, 0),
		    .done = blocks ? v[0] : v[2],
		    .total = blocks ? v[1] : v[3],
		};
		w->progress->fn(w->progress->ctx, &p);
		w->reported = true;
	}
	PQclear(res);
}

/* exec_ok() of an index build, reporting its progress about every second
 * while it runs (PQsendQuery, then waiting on the socket). */
static bool exec_watched(PGconn *conn, const char *sql, struct migrate_watch *w,
			 char *err, size_t errlen)
{
	if (!w || !w->progress || !strstr(sql, "CREATE INDEX"))
		return exec_ok(conn, sql, err, errlen);
	char name[128];
	index_name(sql, name, sizeof(name));
	if (!PQsendQuery(conn, sql)) {
		pgconn_error(conn, NULL, err, errlen);
		return false;
	}
	int pid = PQbackendPID(conn);
	w->reported = false;
	while (PQconsumeInput(conn) && PQisBusy(conn)) {
		struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};
		if (poll(&pfd, 1, 1000) == 0)
			report_index(w, pid, name);
	}
	/* Every result, so the connection is ready for the next statement;
	 * a lost connection ends with NULL at once. */
	bool ok = true;
	PGresult *res;
	while ((res = PQgetResult(conn)) != NULL) {
		ExecStatusType st = PQresultStatus(res);
		if (ok && st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
			pgconn_error(conn, res, err, errlen);
			ok = false;
		}
		PQclear(res);
	}
	if (ok && PQstatus(conn) != CONNECTION_OK) {
		pgconn_error(conn, NULL, err, errlen);
		ok = false;
	}
	if (w->reported) {
		struct store_progress_info p = {.what = name,
						.phase =
						    ok ? "built" : "failed",
						.finished = true};
		w->progress->fn(w->progress->ctx, &p);
	}
	return ok;
}

int migrate_exec_watched(PGconn *conn, const char *sql, enum ddl_wait wait,
			 struct migrate_watch *w, char *err, size_t errlen)
{
	int64_t backoff = 200;
	const char *set = wait == DDL_WAIT_SHORT
			      ? "SET lock_timeout = '" DDL_LOCK_TIMEOUT "'"
			      : "SET lock_timeout = 0";
	for (int attempt = 1;; attempt++) {
		if (exec_ok(conn, set, err, errlen) &&
		    exec_watched(conn, sql, w, err, errlen))
			return 0;
		if (strncmp(err, "55P03", 5) != 0 || attempt >= DDL_ATTEMPTS)
			return -1;
		clock_sleep_ms(backoff);
		if (backoff < DDL_BACKOFF_MAX_MS)
			backoff *= 2;
	}
}

int migrate_exec_retrying(PGconn *conn, const char *sql, enum ddl_wait wait,
			  char *err, size_t errlen)
{
	return migrate_exec_watched(conn, sql, wait, NULL, err, errlen);
}

int migrate_drop_invalid_indexes(PGconn *conn, const struct outbox_table *t,
				 FILE *out, char *err, size_t errlen)
{
	char sql[1024], claims[160];
	table_derived(t, "_claims", claims, sizeof(claims));
	snprintf(sql, sizeof(sql),
		 "SELECT format('%%I.%%I', n.nspname, c.relname) "
		 "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
		 "JOIN pg_namespace n ON n.oid = c.relnamespace "
		 /* pg_partition_tree() lists nothing of a plain table. */
		 "WHERE NOT i.indisvalid AND (i.indrelid = '%s'::regclass OR "
		 "i.indrelid IN (SELECT relid FROM "
		 "pg_partition_tree('%s'::regclass)) "
		 /* The claims' side table has one built concurrently too
		  * (006). */
		 "OR i.indrelid = to_regclass('%s')) "
		 /* The table's and, when it is partitioned, its partitions'
		  * (a per-partition build cut short). A partitioned table's
		  * own index is invalid until each partition's is attached:
		  * migrate_statement() ends it. */
		 "AND c.relkind = 'i'",
		 t->quoted, t->quoted, claims);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(conn, res, err, errlen);
		PQclear(res);
		return -1;
	}
	int rc = 0;
	for (int i = 0; i < PQntuples(res) && rc == 0; i++) {
		char drop[256];
		snprintf(drop, sizeof(drop), "DROP INDEX CONCURRENTLY %s",
			 PQgetvalue(res, i, 0));
		if (out)
			fprintf(out, "dropping invalid index %s\n",
				PQgetvalue(res, i, 0));
		/* It waits for every transaction using the table, a lease
		 * in a publish among them: as long as it takes (the
		 * session's lock_timeout may be a short step's). */
		if (migrate_exec_retrying(conn, drop, DDL_WAIT_UNBOUNDED, err,
					  errlen) != 0)
			rc = -1;
	}
	PQclear(res);
	return rc;
}

/* The statements of a migration outside a transaction (body, expanded,
 * cut in place), after the invalid leftovers of a run cut short. */
static int run_body(PGconn *conn, const struct outbox_table *t, char *body,
		    FILE *out, struct migrate_watch *w, const char *name,
		    char *err, size_t errlen)
{
	char why[512];
	if (migrate_drop_invalid_indexes(conn, t, out, why, sizeof(why)) != 0) {
		snprintf(err, errlen, "migration %s: %s", name, why);
		return -1;
	}
	/* Each statement is idempotent (IF NOT EXISTS), so a run cut short
	 * is completed by the next one. */
	const char *sep = "-- outbox:next";
	char *stmt = body;
	for (;;) {
		char *next = strstr(stmt, sep);
		if (next)
			*next = '\0';
		if (strspn(stmt, " \t\r\n") != strlen(stmt) &&
		    migrate_statement(conn, t, stmt, w, why, sizeof(why)) !=
			0) {
			snprintf(err, errlen, "migration %s failed: %s", name,
				 why);
			return -1;
		}
		if (!next)
			break;
		stmt = next + strlen(sep);
	}
	return 0;
}

int migrate_body(PGconn *conn, const struct outbox_table *t, const char *sql,
		 FILE *out, struct migrate_watch *w, const char *name,
		 char *err, size_t errlen)
{
	char *body = migrate_expand(sql, t);
	if (!body) {
		snprintf(err, errlen, "%s: out of memory", name);
		return -1;
	}
	int rc = run_body(conn, t, body, out, w, name, err, errlen);
	free(body);
	return rc;
}

int store_migration_unrecorded(PGconn *conn, const struct outbox_table *t,
			       const char *sql, char *err, size_t errlen)
{
	return migrate_body(conn, t, sql, NULL, NULL, "(test)", err, errlen) ==
		       0
		   ? STORE_OK
		   : STORE_ERROR;
}

static int apply_without_transaction(PGconn *conn, const struct outbox_table *t,
				     const struct sql_migration *m, char *body,
				     const char *version_table, FILE *out,
				     struct migrate_watch *w, char *err,
				     size_t errlen)
{
	char why[512];
	if (run_body(conn, t, body, out, w, m->name, err, errlen) != 0)
		return -1;
	char record[512];
	snprintf(record, sizeof(record),
		 "INSERT INTO %s (version, name) VALUES (%d, '%s') "
		 "ON CONFLICT (version) DO NOTHING",
		 version_table, m->version, m->name);
	if (!exec_ok(conn, record, why, sizeof(why))) {
		snprintf(err, errlen, "migration %s: recording failed: %s",
			 m->name, why);
		return -1;
	}
	return 0;
}

/* The schema (when the table names one) and the version table. */
static int create_version_table(PGconn *conn, const struct outbox_table *t,
				const char *version_table, char *err,
				size_t errlen)
{
	char sql[512], why[512];
	if (t->schema[0]) {
		snprintf(sql, sizeof(sql), "CREATE SCHEMA IF NOT EXISTS \"%s\"",
			 t->schema);
		if (!exec_ok(conn, sql, why, sizeof(why))) {
			snprintf(err, errlen, "create schema \"%s\": %s",
				 t->schema, why);
			return -1;
		}
	}
	snprintf(sql, sizeof(sql),
		 "CREATE TABLE IF NOT EXISTS %s (version integer PRIMARY KEY, "
		 "name text NOT NULL, applied_at timestamptz NOT NULL "
		 "DEFAULT now())",
		 version_table);
	if (!exec_ok(conn, sql, why, sizeof(why))) {
		snprintf(err, errlen, "schema version table %s: %s",
			 version_table, why);
		return -1;
	}
	return 0;
}

/* Applies migration m, printing how long it took to out. */
static int apply_one(PGconn *conn, const struct outbox_table *t,
		     const struct sql_migration *m, const char *version_table,
		     FILE *out, struct migrate_watch *w, char *err,
		     size_t errlen)
{
	char *body = migrate_expand(m->sql, t);
	if (!body) {
		snprintf(err, errlen, "migration %s: out of memory", m->name);
		return -1;
	}
	int64_t started = clock_ms();
	int rc;
	if (strncmp(m->sql, "-- outbox:no-transaction", 24) == 0)
		rc = apply_without_transaction(conn, t, m, body, version_table,
					       out, w, err, errlen);
	else
		rc = apply_in_transaction(conn, m, body, version_table, err,
					  errlen);
	free(body);
	if (rc == 0 && out)
		fprintf(out, "%s: applied in %lld ms\n", m->name,
			(long long)(clock_ms() - started));
	return rc;
}

/* Applies the migrations not yet recorded; the migration lock is held. */
static int apply_pending(PGconn *conn, const struct outbox_table *t,
			 bool *applied, int latest, FILE *out,
			 struct migrate_watch *w, char *err, size_t errlen)
{
	char version_table[160], why[512];
	table_derived(t, "_schema_version", version_table,
		      sizeof(version_table));
	if (create_version_table(conn, t, version_table, err, errlen) != 0)
		return -1;
	if (applied_versions(conn, version_table, applied, latest, why,
			     sizeof(why)) != 0) {
		snprintf(err, errlen, "schema version table %s: %s",
			 version_table, why);
		return -1;
	}
	for (const struct sql_migration *m = sql_migrations; m->name; m++) {
		if (applied[m->version]) {
			if (out)
				fprintf(out, "%s: already applied\n", m->name);
			continue;
		}
		if (migrate_lock_held(conn, t, why, sizeof(why)) != 0) {
			snprintf(err, errlen, "before %s: %s", m->name, why);
			return -1;
		}
		if (apply_one(conn, t, m, version_table, out, w, err, errlen) !=
		    0)
			return -1;
	}
	return 0;
}

/*
 * A migration may leave a CHECK NOT VALID when old rows break it (004):
 * enforced for new rows, validated here on every later run once those
 * rows are gone. VALIDATE scans under SHARE UPDATE EXCLUSIVE, which lets
 * inserts and the relay's updates go on. Only constraints named after the
 * table (the migrations' own) are touched; one still broken is reported
 * and left as it is, never an error.
 */
static int validate_left_constraints(PGconn *conn, const struct outbox_table *t,
				     FILE *out, char *err, size_t errlen)
{
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "SELECT conname FROM pg_constraint WHERE conrelid = "
		 "'%s'::regclass AND NOT convalidated AND "
		 "starts_with(conname, '%s_') ORDER BY conname",
		 t->quoted, t->name);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		char why[512];
		pgconn_error(conn, res, why, sizeof(why));
		snprintf(err, errlen,
			 "migrate: listing NOT VALID constraints: %s", why);
		PQclear(res);
		return -1;
	}
	for (int i = 0; i < PQntuples(res); i++) {
		char why[512];
		const char *name = PQgetvalue(res, i, 0);
		snprintf(sql, sizeof(sql),
			 "ALTER TABLE %s VALIDATE CONSTRAINT \"%s\"", t->quoted,
			 name);
		if (migrate_exec_watched(conn, sql, DDL_WAIT_UNBOUNDED, NULL,
					 why, sizeof(why)) == 0) {
			if (out)
				fprintf(out, "constraint %s: validated\n",
					name);
		} else if (out) {
			fprintf(out,
				"constraint %s left NOT VALID (still enforced "
				"for new rows): %s\n",
				name, why);
		}
	}
	PQclear(res);
	return 0;
}

void migrate_unlock(PGconn *conn, const struct outbox_table *t)
{
	char sql[256], why[256];
	snprintf(sql, sizeof(sql),
		 "SELECT pg_advisory_unlock(%d, hashtext(%s))", LOCK_NS_MIGRATE,
		 t->literal);
	exec_ok(conn, sql, why, sizeof(why));
}

int migrate_run(PGconn *conn, const struct outbox_table *t, FILE *out,
		char *err, size_t errlen)
{
	return migrate_run_watched(conn, t, out, NULL, err, errlen);
}

int migrate_run_watched(PGconn *conn, const struct outbox_table *t, FILE *out,
			struct migrate_watch *w, char *err, size_t errlen)
{
	int ret = -1;
	char why[512];
	int latest = sql_schema_version;
	bool *applied = calloc((size_t)latest + 1, sizeof(bool));
	if (!applied) {
		snprintf(err, errlen, "migrate: out of memory");
		return -1;
	}
	/* IF NOT EXISTS notices on a second run are not news. */
	exec_ok(conn, "SET client_min_messages = warning", why, sizeof(why));
	if (migrate_lock(conn, t, why, sizeof(why)) != 0) {
		snprintf(err, errlen, "migrate %s: %s", t->literal, why);
		goto out;
	}
	ret = apply_pending(conn, t, applied, latest, out, w, err, errlen);
	if (ret == 0)
		ret = validate_left_constraints(conn, t, out, err, errlen);
	if (ret == 0)
		ret = migrate_catch_up_seq(conn, t, out, err, errlen);
	if (ret == 0)
		ret = migrate_terminal(conn, t, out, w, err, errlen);
	if (ret == 0)
		ret = migrate_default_identity(conn, t, out, err, errlen);
	migrate_unlock(conn, t);
out:
	free(applied);
	return ret;
}

int migrate_notify_trigger(PGconn *conn, const struct outbox_table *t, bool on,
			   char *err, size_t errlen)
{
	char sql[512], fn[160], why[512];
	table_derived(t, "_notify", fn, sizeof(fn));
	if (on)
		snprintf(sql, sizeof(sql),
			 "CREATE OR REPLACE TRIGGER \"%s_notify\" AFTER INSERT "
			 "ON %s FOR EACH STATEMENT EXECUTE FUNCTION %s()",
			 t->name, t->quoted, fn);
	else
		snprintf(sql, sizeof(sql),
			 "DROP TRIGGER IF EXISTS \"%s_notify\" ON %s", t->name,
			 t->quoted);
	if (migrate_exec_watched(conn, sql, DDL_WAIT_SHORT, NULL, why,
				 sizeof(why)) != 0) {
		snprintf(err, errlen, "%s the NOTIFY trigger on %s: %s",
			 on ? "creating" : "dropping", t->literal, why);
		return -1;
	}
	return 0;
}

int store_migrate(const struct store_options *opt, bool notify_trigger,
		  FILE *out, char *err, size_t errlen)
{
	return store_migrate_watched(opt, notify_trigger, out, NULL, err,
				     errlen);
}

/*
 * Whether conn reaches the server process it was opened with. A pooler
 * that speaks the protocol (PgBouncer, in any mode) answers the startup
 * itself, with a process id of its own making, and then runs each
 * transaction (in transaction mode) on a server connection of its
 * choosing: migrate's session lock would guard nothing and its settings
 * would stay on a connection the application shares, even with a pool so
 * idle that every statement lands on one connection, which the lock's
 * check cannot tell from a direct one. 0, or -1 with err.
 */
static int direct(PGconn *conn, char *err, size_t errlen)
{
	long server;
	if (pgconn_server_pid(conn, &server, err, errlen) != 0)
		return -1;
	if (server == (long)PQbackendPID(conn))
		return 0;
	snprintf(err, errlen,
		 "migrate's connection goes through a pooler or proxy (the "
		 "server process answering, pid %ld, is not the one the "
		 "connection announced, %d); through a transaction-mode "
		 "pooler (PgBouncer pool_mode = transaction) its lock would "
		 "guard nothing and its settings would stay on a server "
		 "connection the application shares. Give migrate a direct "
		 "connection to the server",
		 server, PQbackendPID(conn));
	return -1;
}

PGconn *migrate_session(const struct store_options *opt, struct outbox_table *t,
			struct pgconn_options *po, int *rc, char *err,
			size_t errlen)
{
	*rc = STORE_ERROR;
	if (table_parse(opt->table, t, err, errlen) != 0)
		return NULL;
	/* statement_timeout 0 lets index builds take their time. Nothing
	 * is set before the session proved to be the server's own: on a
	 * pooler's shared server connection it would stay for the
	 * application's transactions (statement_timeout 0 among it). */
	*po = (struct pgconn_options){
	    .conninfo = opt->conninfo,
	    .application_name = opt->app_name ? opt->app_name : "outbox-relay",
	    .lock_timeout_ms = opt->lock_timeout_ms,
	    .scope = PGCONN_TRANSACTION,
	};
	PGconn *conn = pgconn_connect(po, err, errlen);
	*rc = conn ? STORE_OK : STORE_RECONNECT;
	po->scope = PGCONN_SESSION;
	if (conn && (direct(conn, err, errlen) != 0 ||
		     pgconn_session_settings(conn, po, err, errlen) != 0)) {
		*rc = STORE_ERROR;
		PQfinish(conn);
		conn = NULL;
	}
	return conn;
}

int store_migrate_watched(const struct store_options *opt, bool notify_trigger,
			  FILE *out, const struct store_progress *progress,
			  char *err, size_t errlen)
{
	struct outbox_table t;
	struct pgconn_options po;
	int rc;
	PGconn *conn = migrate_session(opt, &t, &po, &rc, err, errlen);
	if (!conn)
		return rc;
	/* The watcher's session reads the build's progress beside it. */
	struct pgconn_options watch_po = po;
	watch_po.application_name = "outbox-relay/migrate-progress";
	struct migrate_watch w = {.progress = progress, .po = &watch_po};
	rc = migrate_run_watched(conn, &t, out, progress ? &w : NULL, err,
				 errlen);
	if (rc == 0)
		rc =
		    migrate_room(conn, &t, !opt->delete_sent, out, err, errlen);
	if (rc == 0)
		rc = migrate_notify_trigger(conn, &t, notify_trigger, err,
					    errlen);
	if (w.session)
		PQfinish(w.session);
	PQfinish(conn);
	return rc == 0 ? STORE_OK : STORE_ERROR;
}
