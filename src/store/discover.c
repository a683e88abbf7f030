/* SPDX-License-Identifier: MIT */
/*
 * The catalog session: which tables of the database match OUTBOX_TABLE's
 * patterns (docs/design.md §13). A session of its own, holding no
 * transaction and naming no outbox table, so it works before any table
 * exists and is cheap enough to ask every discovery interval.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "pgconn.h"
#include "store_internal.h"

/* Ownership: owns its session and the names it warned of. */
struct store_catalog {
	PGconn *conn;
	char **warned;
	size_t n_warned;
};

/* Says once per catalog that full, matched by a pattern, is not relayed
 * and why: a schema name past the relay's limit (a tenant's schema of 48
 * bytes) or one it cannot write in a setting was left out silently, never
 * relayed nor migrated. */
static void warn_left_out(struct store_catalog *c, const char *full,
			  const char *why)
{
	for (size_t i = 0; i < c->n_warned; i++)
		if (strcmp(c->warned[i], full) == 0)
			return;
	log_fields(LOG_WARN,
		   "a table the pattern matches is left out: its name cannot "
		   "be one of OUTBOX_TABLE's",
		   "table", full, "error", why, NULL);
	char **grown = realloc(c->warned, (c->n_warned + 1) * sizeof(*grown));
	if (!grown)
		return;
	c->warned = grown;
	if ((grown[c->n_warned] = strdup(full)))
		c->n_warned++;
}

/* A catalog statement's res failed: err says why, res is cleared;
 * STORE_RECONNECT when the session is gone, else STORE_ERROR. */
static int catalog_failed(struct store_catalog *c, PGresult *res, char *err,
			  size_t errlen)
{
	char why[512];
	pgconn_error(c->conn, res, why, sizeof(why));
	snprintf(err, errlen, "catalog: %s", why);
	int rc = pgconn_needs_reconnect(c->conn, res) ? STORE_RECONNECT
						      : STORE_ERROR;
	PQclear(res);
	return rc;
}

int store_catalog_open(struct store_catalog **out,
		       const struct store_options *opt, char *err,
		       size_t errlen)
{
	*out = NULL;
	struct store_catalog *c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "catalog: out of memory");
		return STORE_ERROR;
	}
	struct pgconn_options po = pgconn_options_for(
	    opt->conninfo, opt->app_name, opt->statement_timeout_ms,
	    opt->lock_timeout_ms, opt->dead_peer_ms, PGCONN_TRANSACTION);
	c->conn = pgconn_connect(&po, err, errlen);
	if (!c->conn) {
		free(c);
		return STORE_RECONNECT;
	}
	*out = c;
	return 0;
}

void store_catalog_close(struct store_catalog *c)
{
	if (!c)
		return;
	if (c->conn)
		PQfinish(c->conn);
	store_names_free(c->warned, c->n_warned);
	free(c);
}

void store_names_free(char **names, size_t n)
{
	for (size_t i = 0; names && i < n; i++)
		free(names[i]);
	free(names);
}

int store_catalog_tables(struct store_catalog *c, const char *pattern,
			 char ***names, uint32_t **oids, size_t *n, char *err,
			 size_t errlen)
{
	char like[128], name[64];
	*names = NULL;
	if (oids)
		*oids = NULL;
	*n = 0;
	if (table_pattern_parse(pattern, like, sizeof(like), name, sizeof(name),
				err, errlen) != 0)
		return STORE_ERROR;
	/* Tables and partitioned tables the pattern names, by schema: an
	 * index read of pg_class by name. Not a session's temporary table
	 * (pg_temp_N matches a glob of *): no other session can read it. */
	const char *values[2] = {like, name};
	PGresult *res = PQexecParams(
	    c->conn,
	    "SELECT n.nspname, c.oid FROM pg_catalog.pg_class c JOIN "
	    "pg_catalog.pg_namespace n ON n.oid = c.relnamespace WHERE "
	    "c.relname = $2 AND c.relkind IN ('r', 'p') AND NOT "
	    "c.relispartition AND c.relpersistence <> 't' AND n.nspname "
	    "LIKE $1 ORDER BY 1",
	    2, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		return catalog_failed(c, res, err, errlen);
	size_t rows = (size_t)PQntuples(res);
	char **out = calloc(rows ? rows : 1, sizeof(*out));
	uint32_t *ids = calloc(rows ? rows : 1, sizeof(*ids));
	if (!ids) {
		free(out);
		out = NULL;
	}
	for (size_t i = 0; out && i < rows; i++) {
		struct outbox_table t;
		char full[160], why[160];
		snprintf(full, sizeof(full), "%s.%s",
			 PQgetvalue(res, (int)i, 0), name);
		/* A schema whose name the relay cannot write in a setting
		 * (quotes, dots, past its length) is not one of its tables. */
		if (table_parse(full, &t, why, sizeof(why)) != 0) {
			warn_left_out(c, full, why);
			continue;
		}
		if (!(out[*n] = strdup(full))) {
			store_names_free(out, *n);
			out = NULL;
		} else {
			ids[*n] = (uint32_t)strtoul(PQgetvalue(res, (int)i, 1),
						    NULL, 10);
			(*n)++;
		}
	}
	PQclear(res);
	if (!out) {
		free(ids);
		*n = 0;
		snprintf(err, errlen, "catalog: out of memory");
		return STORE_ERROR;
	}
	*names = out;
	if (oids)
		*oids = ids;
	else
		free(ids);
	return STORE_OK;
}

int store_catalog_oids(struct store_catalog *c, const char *const *tables,
		       size_t n, uint32_t *oids, char *err, size_t errlen)
{
	if (n == 0)
		return STORE_OK;
	int rc = STORE_ERROR;
	char *arr = store_tables_array(tables, n, false, err, errlen);
	if (!arr)
		return STORE_ERROR;
	const char *values[1] = {arr};
	PGresult *res = PQexecParams(
	    c->conn,
	    "SELECT coalesce(to_regclass(t)::oid, 0) FROM unnest($1::text[]) "
	    "WITH ORDINALITY AS u(t, i) ORDER BY i",
	    1, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK ||
	    (size_t)PQntuples(res) != n) {
		rc = catalog_failed(c, res, err, errlen);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		oids[i] =
		    (uint32_t)strtoul(PQgetvalue(res, (int)i, 0), NULL, 10);
	PQclear(res);
	rc = STORE_OK;
out:
	free(arr);
	return rc;
}

int store_catalog_match(const struct store_options *opt, const char *pattern,
			char ***names, size_t *n, char *err, size_t errlen)
{
	struct store_catalog *c = NULL;
	*names = NULL;
	*n = 0;
	int rc = store_catalog_open(&c, opt, err, errlen);
	if (rc == STORE_OK)
		rc = store_catalog_tables(c, pattern, names, NULL, n, err,
					  errlen);
	store_catalog_close(c);
	return rc;
}
