/* SPDX-License-Identifier: MIT */
/*
 * The room a plain table keeps in its pages, by whether it keeps history
 * (docs/design.md §11, "Pages keep room for a row's next version").
 * Migration 008 sets fillfactor 70 so that a row's next version lands on
 * its page: with history every row is rewritten once, to sent. Without
 * history (OUTBOX_RETENTION=0) no row is rewritten, only deleted where it
 * lies, and the room spreads the rows over 1.4 times the pages, which
 * each lease's scan then reads (docs/benchmark.md, "Pages without room
 * without history"). So migrate sets the room by the configuration, as it
 * sets the NOTIFY trigger: 70 with history, the default (100) without.
 * It changes only a fillfactor one of these two left, never one set by
 * hand, and only pages filled from then on. A partitioned table has no
 * storage parameters of its own: the cleaner gives each partition its
 * own when it makes it (partitions.c).
 */
#include <stdio.h>
#include <string.h>

#include "migrate.h"
#include "pgconn.h"

#define ROOM_HISTORY "fillfactor=70"

int migrate_room(PGconn *conn, const struct outbox_table *t, bool history,
		 FILE *out, char *err, size_t errlen)
{
	const char *values[1] = {t->quoted};
	PGresult *res = PQexecParams(
	    conn,
	    "SELECT relkind = 'r', coalesce((SELECT o FROM unnest(reloptions) "
	    "o WHERE o LIKE 'fillfactor=%'), '') FROM pg_class WHERE oid = "
	    "to_regclass($1)",
	    1, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		char why[512];
		pgconn_error(conn, res, why, sizeof(why));
		snprintf(err, errlen, "reading the fillfactor of %s: %s",
			 t->literal, why);
		PQclear(res);
		return -1;
	}
	bool plain =
	    PQntuples(res) == 1 && strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	const char *now = plain ? PQgetvalue(res, 0, 1) : "";
	bool set = plain && history && now[0] == '\0';
	bool reset = plain && !history && strcmp(now, ROOM_HISTORY) == 0;
	PQclear(res);
	if (!set && !reset)
		return 0;
	char sql[512], why[512];
	snprintf(sql, sizeof(sql), "ALTER TABLE %s %s", t->quoted,
		 set ? "SET (" ROOM_HISTORY ")" : "RESET (fillfactor)");
	if (migrate_exec_retrying(conn, sql, DDL_WAIT_SHORT, why,
				  sizeof(why)) != 0) {
		snprintf(err, errlen, "setting the fillfactor of %s: %s",
			 t->literal, why);
		return -1;
	}
	if (out)
		fprintf(out,
			"fillfactor of %s: %s (%s); pages filled from now on "
			"keep it\n",
			t->literal, set ? "70" : "100",
			set ? "history kept"
			    : "OUTBOX_RETENTION=0, no history");
	return 0;
}
