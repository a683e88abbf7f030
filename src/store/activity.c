/* SPDX-License-Identifier: MIT */
/*
 * What changed in the relay's tables, from Postgres' cumulative
 * statistics: how a relay of many tables learns which idle ones may have
 * rows to lease without leasing each (docs/design.md §13).
 */
#include <stdio.h>
#include <stdlib.h>

#include "store_internal.h"

char *store_tables_array(const char *const *tables, size_t n, bool with_side,
			 char *err, size_t errlen)
{
	static const char *const side[] = {"_claims", "_control"};
	size_t per = with_side ? 3 : 1;
	/* Quoted as every statement names them, so to_regclass() keeps a
	 * mixed-case name's case. */
	char(*quoted)[160] = calloc(per * n, sizeof(*quoted));
	const char **items = calloc(per * n, sizeof(*items));
	char *arr = NULL;
	if (!quoted || !items) {
		snprintf(err, errlen, "table statistics: out of memory");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		struct outbox_table t;
		if (table_parse(tables[i], &t, err, errlen) != 0)
			goto out;
		snprintf(quoted[per * i], sizeof(quoted[0]), "%s", t.quoted);
		items[per * i] = quoted[per * i];
		for (size_t k = 1; k < per; k++) {
			table_derived(&t, side[k - 1], quoted[per * i + k],
				      sizeof(quoted[0]));
			items[per * i + k] = quoted[per * i + k];
		}
	}
	arr =
	    store_pg_array(items, per * n, PG_ARRAY_QUOTED, sizeof(quoted[0]));
	if (!arr)
		snprintf(err, errlen, "table statistics: out of memory");
out:
	free(items);
	free(quoted);
	return arr;
}

/* One statement's count for each of tables[] (sql reads $1, the array of
 * tables_array(), and returns a row per table in its order, none when
 * track_counts is off). */
static int tables_counts(struct store *s, const char *what, const char *sql,
			 bool with_side, const char *const *tables, size_t n,
			 int64_t *counts, char *err, size_t errlen)
{
	if (n == 0)
		return 0;
	int rc = STORE_ERROR;
	char *arr = store_tables_array(tables, n, with_side, err, errlen);
	if (!arr)
		return STORE_ERROR;
	const char *values[1] = {arr};
	PGresult *res = store_exec(s, what, sql, 1, values, PGRES_TUPLES_OK,
				   &rc, err, errlen);
	if (!res) {
		rc = store_public_rc(rc);
		goto out;
	}
	if (PQntuples(res) == 0) {
		/* Nothing is counted: the caller must look otherwise. */
		snprintf(err, errlen,
			 "%s: track_counts is off, so Postgres counts "
			 "nothing",
			 what);
		rc = STORE_REFUSED;
	} else if ((size_t)PQntuples(res) != n) {
		snprintf(err, errlen, "%s: %d rows for %zu tables", what,
			 PQntuples(res), n);
		rc = STORE_ERROR;
	} else {
		for (size_t i = 0; i < n; i++)
			counts[i] =
			    strtoll(PQgetvalue(res, (int)i, 0), NULL, 10);
		rc = 0;
	}
	PQclear(res);
out:
	free(arr);
	return rc;
}

int store_tables_activity(struct store *s, const char *const *tables, size_t n,
			  int64_t *counts, char *err, size_t errlen)
{
	/*
	 * The table's inserts and updates (a new row, a row redriven or
	 * returned by the sweeper), its claims table's writes (a lease with
	 * rows, and the release that gives rows back without touching the
	 * table) and its control table's (an operator's pause lifted, which
	 * makes the rows it held back due), threes in the array's order. A
	 * table that is gone reads -1; one without claims or control
	 * counts the writes of what it has. The functions read
	 * the statistics the backends flush, at most once a second each, not
	 * the catalog: no scan of pg_class however many tables there are.
	 * Postgres counts a partitioned table's rows in its partitions only:
	 * the leaves are summed (pg_partition_tree, an index probe of
	 * pg_inherits; it lists nothing for a plain table, which counts
	 * itself).
	 */
	return tables_counts(
	    s, "table activity",
	    "SELECT CASE WHEN bool_and(r IS NULL) FILTER (WHERE k = 0) "
	    "THEN -1 ELSE sum(coalesce(pg_stat_get_tuples_inserted(l) + "
	    "pg_stat_get_tuples_updated(l) + "
	    "pg_stat_get_tuples_deleted(l), 0)) END FROM (SELECT "
	    "to_regclass(t) AS r, (i - 1) / 3 AS pair, (i - 1) % 3 "
	    "AS k FROM unnest($1::text[]) WITH ORDINALITY AS u(t, i)) x "
	    "CROSS JOIN LATERAL (SELECT coalesce(array_agg(relid) FILTER "
	    "(WHERE isleaf), ARRAY[x.r]) AS ls FROM "
	    "pg_partition_tree(x.r)) p CROSS JOIN LATERAL unnest(p.ls) "
	    "AS l "
	    "WHERE current_setting('track_counts')::bool "
	    "GROUP BY pair ORDER BY pair",
	    true, tables, n, counts, err, errlen);
}

int store_tables_dead_tuples(struct store *s, const char *const *tables,
			     size_t n, int64_t *dead, char *err, size_t errlen)
{
	/* n_dead_tup as pg_stat_user_tables shows it, the leaves of a
	 * partitioned table summed, as above; -1 for a table gone. */
	return tables_counts(
	    s, "dead tuples",
	    "SELECT CASE WHEN x.r IS NULL THEN -1 ELSE "
	    "coalesce(sum(pg_stat_get_dead_tuples(l)), 0) END FROM (SELECT "
	    "to_regclass(t) AS r, i FROM unnest($1::text[]) WITH ORDINALITY "
	    "AS u(t, i)) x CROSS JOIN LATERAL (SELECT coalesce(array_agg("
	    "relid) FILTER (WHERE isleaf), ARRAY[x.r]) AS ls FROM "
	    "pg_partition_tree(x.r)) p CROSS JOIN LATERAL unnest(p.ls) AS l "
	    "WHERE current_setting('track_counts')::bool "
	    "GROUP BY x.i, x.r ORDER BY x.i",
	    false, tables, n, dead, err, errlen);
}
