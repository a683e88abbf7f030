/* SPDX-License-Identifier: MIT */
/*
 * A migration's index on a partitioned table (docs/design.md §11,
 * "Later migrations"). Postgres refuses CREATE INDEX CONCURRENTLY on a
 * partitioned table, and a plain CREATE INDEX there holds a SHARE lock on
 * every partition, stopping the producers' inserts, for the whole build.
 * So what a migration builds concurrently on a plain table is built here
 * the way Postgres's documentation gives for partitioned ones: the index
 * on the parent alone (ON ONLY: a catalog entry, invalid), then each
 * partition's concurrently, each attached as soon as it is built; the
 * parent's turns valid with the last. A partition made meanwhile (the
 * cleaner's) gets the index with its CREATE TABLE; one dropped meanwhile
 * is looked up again. A run cut short leaves the parent's index invalid,
 * and the next run builds what is missing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "migrate.h"
#include "pgconn.h"

#define LEAD "CREATE INDEX CONCURRENTLY IF NOT EXISTS "

/* Each round builds one partition's index, or finds its partition
 * dropped and looks again: far more rounds than a table keeps daily
 * partitions only when something makes partitions faster than it builds. */
#define MAX_ROUNDS 4096

/* stmt cut at its parts: the index's name and what follows the table
 * ("(columns) WHERE ..."). */
struct index_stmt {
	char name[64];
	const char *rest;
};

/* A space between words (strchr() alone would take the end too). */
static bool blank(char c)
{
	return c != '\0' && strchr(" \t\r\n", c) != NULL;
}

/* Whether stmt builds an index concurrently on t itself (not on one of
 * its side tables): LEAD "name" ON t rest. */
static bool parse(const char *stmt, const struct outbox_table *t,
		  struct index_stmt *out)
{
	const char *p = strstr(stmt, LEAD);
	if (!p)
		return false;
	p += strlen(LEAD);
	const char *end = *p == '"' ? strchr(p + 1, '"') : NULL;
	if (!end || (size_t)(end - p - 1) >= sizeof(out->name))
		return false;
	snprintf(out->name, sizeof(out->name), "%.*s", (int)(end - p - 1),
		 p + 1);
	p = end + 1;
	p += strspn(p, " \t\r\n");
	if (strncmp(p, "ON", 2) != 0 || !blank(p[2]))
		return false;
	p += 2 + strspn(p + 2, " \t\r\n");
	size_t n = strlen(t->quoted);
	if (strncmp(p, t->quoted, n) != 0 || !blank(p[n]))
		return false;
	out->rest = p + n;
	return true;
}

int migrate_ask_n(PGconn *conn, const char *sql, int n,
		  const char *const *values, char *err, size_t errlen)
{
	PGresult *res = PQexecParams(conn, sql, n, NULL, values, NULL, NULL, 0);
	int rc = -1;
	if (PQresultStatus(res) == PGRES_TUPLES_OK)
		rc = PQntuples(res) == 1 && PQgetvalue(res, 0, 0)[0] == 't';
	else
		pgconn_error(conn, res, err, errlen);
	PQclear(res);
	return rc;
}

/* migrate_ask_n() with the one parameter value. */
static int ask(PGconn *conn, const char *sql, const char *value, char *err,
	       size_t errlen)
{
	const char *values[] = {value};
	return migrate_ask_n(conn, sql, 1, values, err, errlen);
}

/* Names of one partition's part of the build, each quoted: the
 * partition, qualified; its index bare (as CREATE INDEX names it) and
 * qualified. */
struct part_names {
	char table[200];
	char index[80];
	char index_qualified[200];
};

/* One partition of t whose index is not yet attached to the parent's
 * index (qualified, quoted): its names, its index named after it and the
 * parent index's name after the table's ("<partition>_x_idx" for
 * "<table>_x_idx", cut at 63 bytes as Postgres cuts every identifier).
 * 1 with one found, 0 when none is left, -1 with err. (An invalid
 * leftover of a build cut short was dropped before the migration's
 * statements, with the table's, so IF NOT EXISTS builds it again.) */
static int next_partition(PGconn *conn, const struct outbox_table *t,
			  const char *index, const char *parent_index,
			  struct part_names *out, char *err, size_t errlen)
{
	const char *suffix = index;
	size_t n = strlen(t->name);
	if (strncmp(index, t->name, n) == 0 && index[n] == '_')
		suffix = index + n + 1;
	const char *values[] = {t->quoted, parent_index, suffix};
	/* Names are plain identifiers (the table's are validated, the
	 * partitions' and indexes' made from them), so quoting is
	 * wrapping. */
	PGresult *res = PQexecParams(
	    conn,
	    "SELECT format('\"%s\".\"%s\"', n.nspname, c.relname), "
	    "format('\"%s\"', left(c.relname || '_' || $3, 63)), "
	    "format('\"%s\".\"%s\"', n.nspname, left(c.relname || '_' || $3, "
	    "63)) FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
	    "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE i.inhparent "
	    "= to_regclass($1) AND NOT EXISTS (SELECT 1 FROM pg_inherits ii "
	    "JOIN pg_index x ON x.indexrelid = ii.inhrelid WHERE ii.inhparent "
	    "= to_regclass($2) AND x.indrelid = c.oid) ORDER BY c.relname "
	    "LIMIT 1",
	    3, NULL, values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(conn, res, err, errlen);
		PQclear(res);
		return -1;
	}
	int rc = PQntuples(res);
	if (rc == 1) {
		snprintf(out->table, sizeof(out->table), "%s",
			 PQgetvalue(res, 0, 0));
		snprintf(out->index, sizeof(out->index), "%s",
			 PQgetvalue(res, 0, 1));
		snprintf(out->index_qualified, sizeof(out->index_qualified),
			 "%s", PQgetvalue(res, 0, 2));
	}
	PQclear(res);
	return rc;
}

/* What one pass of build() needs beside its index statement. */
struct build_pass {
	PGconn *conn;
	const struct outbox_table *t;
	const struct index_stmt *s;
	struct migrate_watch *w;
	char *sql; /* a buffer of sql_len bytes */
	size_t sql_len;
	const char *parent_index; /* qualified, quoted */
};

/* Makes the parent's index (ON ONLY), then builds each partition's that
 * is missing and attaches it: 1 when the parent's is then valid, 0 when
 * not, -1 with err. */
static int build_pass(const struct build_pass *b, char *err, size_t errlen)
{
	const struct index_stmt *s = b->s;
	/* The parent's SHARE lock for a catalog entry only: a short wait. */
	snprintf(b->sql, b->sql_len,
		 "CREATE INDEX IF NOT EXISTS \"%s\" ON ONLY %s%s", s->name,
		 b->t->quoted, s->rest);
	if (migrate_exec_watched(b->conn, b->sql, DDL_WAIT_SHORT, NULL, err,
				 errlen) != 0)
		return -1;
	for (int round = 1;; round++) {
		struct part_names p;
		int found = next_partition(b->conn, b->t, s->name,
					   b->parent_index, &p, err, errlen);
		if (found < 0)
			return -1;
		if (found == 0)
			break;
		if (round > MAX_ROUNDS) {
			snprintf(err, errlen,
				 "index %s: partitions kept coming under its "
				 "build (%d built or looked up again)",
				 s->name, MAX_ROUNDS);
			return -1;
		}
		snprintf(b->sql, b->sql_len,
			 "CREATE INDEX CONCURRENTLY IF NOT EXISTS %s ON %s%s",
			 p.index, p.table, s->rest);
		if (migrate_exec_watched(b->conn, b->sql, DDL_WAIT_UNBOUNDED,
					 b->w, err, errlen) != 0) {
			/* The cleaner dropped the partition meanwhile. */
			if (strncmp(err, "42P01", 5) == 0)
				continue;
			return -1;
		}
		snprintf(b->sql, b->sql_len,
			 "ALTER INDEX %s ATTACH PARTITION %s", b->parent_index,
			 p.index_qualified);
		if (migrate_exec_watched(b->conn, b->sql, DDL_WAIT_SHORT, NULL,
					 err, errlen) != 0 &&
		    strncmp(err, "42P01", 5) != 0)
			return -1;
	}
	/* Valid once every partition's is attached. */
	return ask(b->conn,
		   "SELECT indisvalid FROM pg_index WHERE indexrelid = "
		   "to_regclass($1)",
		   b->parent_index, err, errlen);
}

/* Builds s on t's partitions and attaches each to the parent's index. */
static int build(PGconn *conn, const struct outbox_table *t,
		 const struct index_stmt *s, struct migrate_watch *w, char *err,
		 size_t errlen)
{
	char parent_index[200];
	snprintf(parent_index, sizeof(parent_index), "%s\"%s\"", t->prefix,
		 s->name);
	size_t sql_len = strlen(s->rest) + 512;
	char *sql = malloc(sql_len);
	if (!sql) {
		snprintf(err, errlen, "index %s: out of memory", s->name);
		return -1;
	}
	struct build_pass b = {conn, t, s, w, sql, sql_len, parent_index};
	int valid = build_pass(&b, err, errlen);
	if (valid == 0) {
		/* Postgres makes the parent's valid only as the last
		 * partition's is attached. A run cut short, whose partitions
		 * without it were dropped since (past retention), left
		 * nothing to attach: the parent's is dropped, with its
		 * partitions', and built again. */
		snprintf(sql, sql_len, "DROP INDEX IF EXISTS %s", parent_index);
		valid = migrate_exec_watched(conn, sql, DDL_WAIT_SHORT, NULL,
					     err, errlen) == 0
			    ? build_pass(&b, err, errlen)
			    : -1;
	}
	if (valid == 0)
		snprintf(err, errlen,
			 "index %s: every partition's index is attached, yet "
			 "the parent's is not valid",
			 s->name);
	free(sql);
	return valid == 1 ? 0 : -1;
}

/* Whether stmt takes no lock a writer waits for (SHARE UPDATE EXCLUSIVE:
 * an index built or dropped concurrently, a VALIDATE): those wait as long
 * as it takes. Anything else (ADD COLUMN, ADD CONSTRAINT ... NOT VALID,
 * SET DEFAULT, DROP CONSTRAINT: ACCESS EXCLUSIVE) waits at most the short
 * lock wait at a time, retried, since the producers' inserts queue behind
 * it while it waits, for as long as a report or a dump holds the table. */
static bool writers_never_wait(const char *stmt)
{
	/* Line by line, past the comments (a migration's first statement
	 * carries its file's, which may well say CONCURRENTLY). */
	for (const char *line = stmt; *line;) {
		size_t len = strcspn(line, "\n");
		const char *text = line + strspn(line, " \t");
		if (strncmp(text, "--", 2) != 0 &&
		    (memmem(line, len, "CONCURRENTLY", 12) ||
		     memmem(line, len, "VALIDATE CONSTRAINT", 19)))
			return true;
		line += len + (line[len] == '\n');
	}
	return false;
}

int migrate_statement(PGconn *conn, const struct outbox_table *t,
		      const char *stmt, struct migrate_watch *w, char *err,
		      size_t errlen)
{
	struct index_stmt s;
	if (parse(stmt, t, &s)) {
		int p = ask(conn,
			    "SELECT relkind = 'p' FROM pg_class WHERE oid = "
			    "to_regclass($1)",
			    t->quoted, err, errlen);
		if (p < 0)
			return -1;
		if (p == 1)
			return build(conn, t, &s, w, err, errlen);
	}
	return migrate_exec_watched(
	    conn, stmt,
	    writers_never_wait(stmt) ? DDL_WAIT_UNBOUNDED : DDL_WAIT_SHORT, w,
	    err, errlen);
}
