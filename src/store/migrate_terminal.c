/* SPDX-License-Identifier: MIT */
/*
 * The index of finished rows on a table partitioned by `migrate
 * --partition` (docs/design.md §11, "The finished rows' index split by
 * status"). Migration 001's one B-tree of (status, finished_at) over sent
 * and failed rows takes an entry from every mark to sent; on the daily
 * partitions, which leave whole by DROP, nothing needs sent rows in that
 * order but the few statements that read a window of them. So there the
 * index is split: failed rows keep a B-tree of finished_at, sent rows get
 * a BRIN of it (an entry per range of pages, not per row). The default
 * partition, whose sent rows the cleaner deletes in finished_at order,
 * keeps a B-tree of both statuses as an index of its own. Each index is
 * built without blocking writers (the partitioned ones ON ONLY the table,
 * then concurrently on each partition: migrate_index.c); the old index
 * is dropped last, under the short lock wait, so until then every
 * statement has what it had.
 */
#include <stdio.h>
#include <string.h>

#include "migrate.h"

static const char split_sql[] =
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{{n}}_d_finished_idx\" ON "
    "{{s}}\"{{n}}_default\" (status, finished_at) WHERE status IN ('sent', "
    "'failed')\n"
    "-- outbox:next\n"
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{{n}}_failed_idx\" ON "
    "{{table}} (finished_at) WHERE status = 'failed'\n"
    "-- outbox:next\n"
    /* Ranges filled since the last VACUUM are read whole by every scan
     * until summarized; autosummarize asks for each as the next begins. */
    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{{n}}_sent_brin\" ON "
    "{{table}} USING brin (finished_at) WITH (autosummarize = on) WHERE "
    "status = 'sent'\n";

/* Whether t is partitioned by migrate --partition (its default partition
 * named after it) and not yet split: the old index still there, or one of
 * the new ones missing or not valid (a run cut short). 1, 0, or -1 with
 * err. */
static int needed(PGconn *conn, const struct outbox_table *t, char *err,
		  size_t errlen)
{
	char dflt[160], old[160], failed[160], brin[160], dfin[160];
	table_derived(t, "_default", dflt, sizeof(dflt));
	table_derived(t, "_terminal_idx", old, sizeof(old));
	table_derived(t, "_failed_idx", failed, sizeof(failed));
	table_derived(t, "_sent_brin", brin, sizeof(brin));
	table_derived(t, "_d_finished_idx", dfin, sizeof(dfin));
	const char *values[6] = {t->quoted, dflt, old, failed, brin, dfin};
	return migrate_ask_n(
	    conn,
	    "SELECT c.relkind = 'p' AND EXISTS (SELECT 1 FROM pg_inherits "
	    "WHERE inhparent = c.oid AND inhrelid = to_regclass($2)) AND "
	    "(to_regclass($3) IS NOT NULL OR NOT EXISTS (SELECT 1 FROM "
	    "pg_index WHERE indisvalid AND indexrelid = to_regclass($4)) OR "
	    "NOT EXISTS (SELECT 1 FROM pg_index WHERE indisvalid AND "
	    "indexrelid = to_regclass($5)) OR NOT EXISTS (SELECT 1 FROM "
	    "pg_index WHERE indisvalid AND indexrelid = to_regclass($6))) "
	    "FROM pg_class c WHERE c.oid = to_regclass($1)",
	    6, values, err, errlen);
}

int migrate_terminal(PGconn *conn, const struct outbox_table *t, FILE *out,
		     struct migrate_watch *w, char *err, size_t errlen)
{
	char why[512];
	int yes = needed(conn, t, why, sizeof(why));
	if (yes <= 0) {
		if (yes < 0)
			snprintf(err, errlen,
				 "the finished rows' indexes of %s: %s",
				 t->literal, why);
		return yes;
	}
	if (migrate_body(conn, t, split_sql, out, w, "finished rows' indexes",
			 err, errlen) != 0)
		return -1;
	char drop[200];
	snprintf(drop, sizeof(drop),
		 "DROP INDEX IF EXISTS %s\"%s_terminal_idx\"", t->prefix,
		 t->name);
	if (migrate_exec_retrying(conn, drop, DDL_WAIT_SHORT, why,
				  sizeof(why)) != 0) {
		snprintf(err, errlen,
			 "dropping the index of finished rows of %s, now split "
			 "by status: %s",
			 t->literal, why);
		return -1;
	}
	if (out)
		fprintf(out,
			"finished rows of %s%s%s: indexed by status (failed: "
			"B-tree, sent: BRIN; the default partition keeps "
			"both in one B-tree)\n",
			t->schema, t->schema[0] ? "." : "", t->name);
	return 0;
}
