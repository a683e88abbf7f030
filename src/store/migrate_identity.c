/* SPDX-License-Identifier: MIT */
/*
 * The default partition of a table partitioned by an earlier `migrate
 * --partition` kept the old table's identity on seq (docs/design.md §11,
 * "Partitions by the day"). Inserts go through the parent, whose own
 * identity gives seq, so the partition's was never used; but Postgres 17
 * and later refuse to attach a table with an identity column of its own,
 * so a dump restored there (pg_dump, or pg_upgrade's schema) failed at
 * the partition's ATTACH. It is dropped once, under the short lock wait.
 * From 17 on, an attached partition shows its parent's identity, which
 * cannot be dropped there and is no identity of its own: left alone.
 */
#include <stdio.h>

#include "migrate.h"

int migrate_default_identity(PGconn *conn, const struct outbox_table *t,
			     FILE *out, char *err, size_t errlen)
{
	char dflt[160], sql[256], why[512];
	table_derived(t, "_default", dflt, sizeof(dflt));
	const char *values[2] = {t->quoted, dflt};
	int yes = migrate_ask_n(
	    conn,
	    "SELECT current_setting('server_version_num')::int < 170000 AND "
	    "EXISTS (SELECT 1 FROM pg_inherits i JOIN pg_attribute a ON "
	    "a.attrelid = i.inhrelid WHERE i.inhparent = to_regclass($1) AND "
	    "i.inhrelid = to_regclass($2) AND a.attname = 'seq' AND "
	    "a.attidentity <> '')",
	    2, values, why, sizeof(why));
	if (yes <= 0) {
		if (yes < 0)
			snprintf(err, errlen,
				 "the default partition's identity of %s: %s",
				 t->literal, why);
		return yes;
	}
	snprintf(sql, sizeof(sql),
		 "ALTER TABLE %s ALTER COLUMN seq DROP IDENTITY IF EXISTS",
		 dflt);
	if (migrate_exec_retrying(conn, sql, DDL_WAIT_SHORT, why,
				  sizeof(why)) != 0) {
		snprintf(err, errlen,
			 "dropping the default partition's identity of %s: %s",
			 t->literal, why);
		return -1;
	}
	if (out)
		fprintf(out,
			"default partition of %s%s%s: its own identity on seq "
			"dropped (the table's gives seq)\n",
			t->schema, t->schema[0] ? "." : "", t->name);
	return 0;
}
