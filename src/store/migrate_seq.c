/* SPDX-License-Identifier: MIT */
/* The last of migrate's repairs: seq's sequence and a copy's rows. */
#include <stdio.h>

#include "migrate.h"
#include "pgconn.h"
#include "store_internal.h"

/*
 * seq's sequence brought up to the table's rows. A copy made by logical
 * replication (a blue-green upgrade) carries the rows and not the
 * sequence, so producers on the copy would write seqs below those of rows
 * already there, and ordered mode would send their keys' new events
 * before the old ones (docs/design.md §6). The newest rows by id (UUIDv7:
 * time order) tell cheaply; no row of a table whose sequence made its
 * seqs can be past it, so a healthy table is never touched. Only then is
 * every row read, once, for the highest seq, without a lock. The move
 * itself runs under a lock that waits for the table's writers and holds
 * off new ones for as long as a setval() takes: a producer's nextval()
 * during the read, or a row replication was still writing (its seq its
 * own), would otherwise be overtaken, the sequence set back below them.
 * Under it nothing moves the sequence but a bare nextval(), and every
 * row there is is below the greatest of what the read found, where the
 * sequence is, and the newest rows.
 */
int migrate_catch_up_seq(PGconn *conn, const struct outbox_table *t, FILE *out,
			 char *err, size_t errlen)
{
	char seq[300], sql[1400], why[512], read[24] = "", was[24] = "";
	snprintf(seq, sizeof(seq), "pg_get_serial_sequence('%s', 'seq')",
		 t->quoted);
	snprintf(sql, sizeof(sql),
		 "WITH s AS MATERIALIZED (SELECT coalesce(pg_sequence_last_"
		 "value(%s), 0) AS was) SELECT greatest((SELECT max(seq) FROM "
		 "%s), was), was FROM s WHERE " SQL_NEWEST_SEQ " > was",
		 seq, t->quoted, t->quoted);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		goto failed;
	if (PQntuples(res) == 0)
		goto done;
	snprintf(read, sizeof(read), "%s", PQgetvalue(res, 0, 0));
	snprintf(was, sizeof(was), "%s", PQgetvalue(res, 0, 1));
	PQclear(res);
	res = NULL;
	/* One query string: one implicit transaction, whose lock goes with
	 * it whatever fails; a lock not had within the short wait is asked
	 * again, as for the migrations' own. */
	snprintf(sql, sizeof(sql),
		 "LOCK TABLE %s IN SHARE ROW EXCLUSIVE MODE; SELECT setval(%s, "
		 "greatest(%s, coalesce(pg_sequence_last_value(%s), "
		 "0), " SQL_NEWEST_SEQ "))",
		 t->quoted, seq, read, seq, t->quoted);
	if (migrate_exec_retrying(conn, sql, DDL_WAIT_SHORT, why,
				  sizeof(why)) != 0) {
		snprintf(err, errlen,
			 "migrate: bringing seq's sequence (at %s) up to the "
			 "rows of %s (up to %s): %s",
			 was, t->literal, read, why);
		return -1;
	}
	snprintf(sql, sizeof(sql), "SELECT pg_sequence_last_value(%s)", seq);
	res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_TUPLES_OK || PQntuples(res) != 1)
		goto failed;
	if (out)
		fprintf(out,
			"seq: its sequence was at %s, behind rows up to %s (a "
			"copy whose sequence did not come along, as by logical "
			"replication); moved to %s\n",
			was, read, PQgetvalue(res, 0, 0));
done:
	PQclear(res);
	return 0;
failed:
	pgconn_error(conn, res, why, sizeof(why));
	snprintf(err, errlen,
		 "migrate: bringing seq's sequence up to the rows of %s: %s",
		 t->literal, why);
	PQclear(res);
	return -1;
}
