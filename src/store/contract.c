/* SPDX-License-Identifier: MIT */
/*
 * Contract steps (`outbox-relay migrate --contract`): what only relays of
 * an older protocol need, dropped once none is left (docs/design.md §11,
 * "Contract steps wait for the relays' protocol"). Migrations expand; a
 * contract step is their other half, and runs only when asked.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "migrate.h"
#include "pgconn.h"
#include "store_internal.h"
#include "store_test.h"

struct contract_step {
	const char *name;
	int protocol; /* what every relay left must speak */
	/* Outside a transaction; no write waits for its lock. */
	const char *sql;
	/* The same on a partitioned table, which Postgres allows no
	 * CONCURRENTLY on: its lock blocks writes, so it waits briefly and
	 * retries, as migrate's do. */
	const char *sql_partitioned;
};

/* In the order they run; a step's statement is idempotent, so a step
 * recorded by a run that stopped before it is done again. */
static const struct contract_step contract_steps[] = {
    /* Fresh keyed rows waiting for the head marker's classification
     * (migration 002): relays of protocol 1 lease keys by a key lock and
     * classify nothing, yet every keyed insert writes an entry. */
    {"drop_unclassified_idx", 1,
     "DROP INDEX CONCURRENTLY IF EXISTS {{s}}\"{{n}}_unclassified_idx\"",
     "DROP INDEX IF EXISTS {{s}}\"{{n}}_unclassified_idx\""},
};

/* Replicas seen alive that speak an older protocol than protocol (or
 * record none): how many, or -1 with err; the first few into who. */
static int live_below(PGconn *conn, const char *registry, int protocol,
		      char *who, size_t wholen, char *err, size_t errlen)
{
	char sql[512], p[16];
	snprintf(sql, sizeof(sql),
		 "SELECT id, version, coalesce(protocol::text, 'none'), "
		 "count(*) OVER () FROM %s WHERE last_seen_at > now() - %d * "
		 "interval '1 second' AND coalesce(protocol, 0) < $1::integer "
		 "ORDER BY id LIMIT 3",
		 registry, STORE_ADMIN_DEAD_AFTER_S);
	snprintf(p, sizeof(p), "%d", protocol);
	const char *values[1] = {p};
	PGresult *res = PQexecParams(conn, sql, 1, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(conn, res, err, errlen);
		PQclear(res);
		return -1;
	}
	int n = PQntuples(res) ? atoi(PQgetvalue(res, 0, 3)) : 0;
	size_t len = 0;
	who[0] = '\0';
	for (int i = 0; i < PQntuples(res) && len < wholen; i++) {
		int w = snprintf(who + len, wholen - len,
				 "%s%s (version %s, protocol %s)",
				 i ? ", " : "", PQgetvalue(res, i, 0),
				 PQgetvalue(res, i, 1), PQgetvalue(res, i, 2));
		len += w > 0 ? (size_t)w : 0;
	}
	PQclear(res);
	return n;
}

/* One statement with up to two parameters; false with err. */
static bool run(PGconn *conn, const char *sql, const char *a, const char *b,
		int *rows, char *err, size_t errlen)
{
	const char *values[2] = {a, b};
	int n = b ? 2 : a ? 1 : 0;
	PGresult *res = PQexecParams(conn, sql, n, NULL, values, NULL, NULL, 0);
	ExecStatusType st = PQresultStatus(res);
	bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
	if (!ok)
		pgconn_error(conn, res, err, errlen);
	else if (rows)
		*rows = st == PGRES_TUPLES_OK ? PQntuples(res)
					      : atoi(PQcmdTuples(res));
	PQclear(res);
	return ok;
}

/* Records step, unless a replica of an older protocol is alive before or
 * within settle_ms after: a relay that opened the table before the record
 * passed its own check, and tells of itself by its next heartbeat. 1: the
 * step was recorded already; 0: recorded now; -1 with err. */
static int record_step(PGconn *conn, const struct outbox_table *t,
		       const struct contract_step *c, int settle_ms, char *err,
		       size_t errlen)
{
	char contract[160], registry[160], p[16], who[512], why[512];
	char sql[512];
	table_derived(t, "_contract", contract, sizeof(contract));
	table_derived(t, "_replicas", registry, sizeof(registry));
	snprintf(p, sizeof(p), "%d", c->protocol);
	int rows = 0;
	snprintf(sql, sizeof(sql), "SELECT 1 FROM %s WHERE step = $1",
		 contract);
	if (!run(conn, sql, c->name, NULL, &rows, why, sizeof(why)))
		goto failed;
	if (rows > 0)
		return 1;
	for (int round = 0; round < 2; round++) {
		int n = live_below(conn, registry, c->protocol, who,
				   sizeof(who), why, sizeof(why));
		if (n < 0)
			goto failed;
		if (n > 0) {
			snprintf(sql, sizeof(sql),
				 "DELETE FROM %s WHERE step = $1", contract);
			run(conn, sql, c->name, NULL, NULL, why, sizeof(why));
			snprintf(err, errlen,
				 "contract step %s of %s needs every relay to "
				 "speak protocol %d, and %d replica%s seen "
				 "alive in the last %d s speak%s an older "
				 "one: %s%s; upgrade %s (or wait until %s "
				 "gone) and run it again",
				 c->name, t->literal, c->protocol, n,
				 n == 1 ? "" : "s", STORE_ADMIN_DEAD_AFTER_S,
				 n == 1 ? "s" : "", who, n > 3 ? ", ..." : "",
				 n == 1 ? "it" : "them",
				 n == 1 ? "it is" : "they are");
			return -1;
		}
		if (round == 1)
			break;
		snprintf(sql, sizeof(sql),
			 "INSERT INTO %s (step, protocol) VALUES ($1, "
			 "$2::integer) ON CONFLICT (step) DO NOTHING",
			 contract);
		if (!run(conn, sql, c->name, p, NULL, why, sizeof(why)))
			goto failed;
		clock_sleep_ms(settle_ms);
	}
	return 0;
failed:
	snprintf(err, errlen, "contract step %s of %s: %s", c->name, t->literal,
		 why);
	return -1;
}

/* Every expand migration has run: the registry has its protocol column
 * and the contract table exists. */
static bool expanded(PGconn *conn, const struct outbox_table *t, char *err,
		     size_t errlen)
{
	char version[160], sql[256], why[512];
	table_derived(t, "_schema_version", version, sizeof(version));
	snprintf(sql, sizeof(sql),
		 "SELECT 1 FROM %s HAVING coalesce(max(version), 0) >= %d",
		 version, sql_schema_version);
	int rows = 0;
	bool ran = run(conn, sql, NULL, NULL, &rows, why, sizeof(why));
	if (ran && rows > 0)
		return true;
	snprintf(err, errlen,
		 "contract steps of %s: the table is not at schema version "
		 "%d%s%s; run `outbox-relay migrate` first",
		 t->literal, sql_schema_version, ran ? "" : " (",
		 ran ? "" : why);
	if (!ran && strlen(err) + 2 < errlen)
		strcat(err, ")");
	return false;
}

int store_contract_settled(const struct store_options *opt, int settle_ms,
			   FILE *out, char *err, size_t errlen)
{
	struct outbox_table t;
	struct pgconn_options po;
	int rc;
	/* No statement_timeout: DROP INDEX CONCURRENTLY waits for every
	 * transaction that may still use the index. */
	PGconn *conn = migrate_session(opt, &t, &po, &rc, err, errlen);
	if (!conn)
		return rc;
	rc = STORE_ERROR;
	char why[512];
	/* "does not exist, skipping" is no news on a second run. */
	run(conn, "SET client_min_messages = warning", NULL, NULL, NULL, why,
	    sizeof(why));
	if (!expanded(conn, &t, err, errlen))
		goto out;
	if (migrate_lock(conn, &t, why, sizeof(why)) != 0) {
		snprintf(err, errlen, "contract steps of %s: %s", t.literal,
			 why);
		goto out;
	}
	int rows = 0;
	if (!run(conn,
		 "SELECT 1 FROM pg_class WHERE oid = to_regclass($1) AND "
		 "relkind = 'p'",
		 t.quoted, NULL, &rows, why, sizeof(why))) {
		snprintf(err, errlen, "contract steps of %s: %s", t.literal,
			 why);
		goto unlock;
	}
	bool partitioned = rows > 0;
	size_t n = sizeof(contract_steps) / sizeof(contract_steps[0]);
	for (size_t i = 0; i < n; i++) {
		const struct contract_step *c = &contract_steps[i];
		int had = record_step(conn, &t, c, settle_ms, err, errlen);
		if (had < 0)
			goto unlock;
		char *sql = migrate_expand(
		    partitioned ? c->sql_partitioned : c->sql, &t);
		if (!sql)
			snprintf(why, sizeof(why), "out of memory");
		bool ok = sql && migrate_exec_retrying(conn, sql,
						       partitioned
							   ? DDL_WAIT_SHORT
							   : DDL_WAIT_UNBOUNDED,
						       why, sizeof(why)) == 0;
		free(sql);
		if (!ok) {
			snprintf(err, errlen,
				 "contract step %s of %s (recorded; run it "
				 "again): %s",
				 c->name, t.literal, why);
			goto unlock;
		}
		if (out)
			fprintf(out, "contract step %s (protocol %d): %s\n",
				c->name, c->protocol,
				had ? "recorded before, done" : "done");
	}
	rc = STORE_OK;
unlock:
	migrate_unlock(conn, &t);
out:
	PQfinish(conn);
	return rc;
}

int store_contract(const struct store_options *opt, FILE *out, char *err,
		   size_t errlen)
{
	return store_contract_settled(opt, STORE_CONTRACT_SETTLE_MS, out, err,
				      errlen);
}
