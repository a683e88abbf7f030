/* SPDX-License-Identifier: MIT */
/* Fixtures for tests against a real Postgres. */
#include "pgtest.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "store/migrate.h"
#include "store/store_test.h"
#include "base/base.h"

const char *pgtest_url(void)
{
	const char *url = getenv("RELAY_TEST_DATABASE_URL");
	if (!url || !*url)
		fail_msg(
		    "RELAY_TEST_DATABASE_URL is not set: run tests/run.sh");
	return url;
}

PGconn *pgtest_connect(void)
{
	PGconn *conn = PQconnectdb(pgtest_url());
	if (PQstatus(conn) != CONNECTION_OK)
		fail_msg("connect: %s", PQerrorMessage(conn));
	PQclear(PQexec(conn, "SET client_min_messages = warning"));
	return conn;
}

static PGresult *vexec(PGconn *conn, const char *fmt, va_list ap)
{
	char *sql = NULL;
	if (vasprintf(&sql, fmt, ap) < 0)
		fail_msg("out of memory");
	PGresult *res = PQexec(conn, sql);
	ExecStatusType st = PQresultStatus(res);
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
		fail_msg("%s: %s", sql, PQerrorMessage(conn));
	free(sql);
	return res;
}

void pgtest_exec(PGconn *conn, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	PQclear(vexec(conn, fmt, ap));
	va_end(ap);
}

long pgtest_long(PGconn *conn, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	PGresult *res = vexec(conn, fmt, ap);
	va_end(ap);
	if (PQntuples(res) < 1 || PQgetisnull(res, 0, 0))
		fail_msg("query returned no value");
	long v = strtol(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return v;
}

void pgtest_failed_index_build(PGconn *conn, const char *name,
			       const char *table)
{
	long seq = pgtest_long(conn, "SELECT min(seq) FROM %s", table);
	char sql[512];
	/* Division by zero at that row. */
	snprintf(sql, sizeof(sql),
		 "CREATE INDEX CONCURRENTLY %s ON %s ((1 / (seq - %ld)))", name,
		 table, seq);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) != PGRES_FATAL_ERROR)
		fail_msg("the build of %s did not fail: %s", name,
			 PQresStatus(PQresultStatus(res)));
	PQclear(res);
}

bool pgtest_has_reloption(PGconn *conn, const char *table, const char *opt)
{
	return pgtest_long(conn,
			   "SELECT count(*) FROM pg_class WHERE oid = "
			   "'%s'::regclass AND '%s' = ANY(reloptions)",
			   table, opt) == 1;
}

/* The fresh table t turned into a table partitioned by id by the
 * migration's own statement (`migrate --partition`, unrecorded), then a
 * partition from now on, so rows with ids of now land there and rows
 * with made-up ids in the default. */
static void partition_fresh(PGconn *conn, const struct outbox_table *t)
{
	char err[1024];
	if (store_partition_unrecorded(conn, t, err, sizeof(err)) != 0)
		fail_msg("partition %s: %s", t->literal, err);
	pgtest_exec(conn,
		    "CREATE TABLE %s\"%s_now\" PARTITION OF %s FOR VALUES "
		    "FROM (%s\"%s_uuidv7\"()) TO (MAXVALUE)",
		    t->prefix, t->name, t->quoted, t->prefix, t->name);
}

void pgtest_fresh_table(const char *prefix, char *table, size_t len)
{
	static int counter;
	char err[1024];
	struct outbox_table t;
	snprintf(table, len, "%s_%d_%d.outbox_events", prefix, (int)getpid(),
		 ++counter);
	if (table_parse(table, &t, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	PGconn *conn = pgtest_connect();
	pgtest_exec(conn, "DROP SCHEMA IF EXISTS \"%s\" CASCADE", t.schema);
	if (migrate_run(conn, &t, NULL, err, sizeof(err)) != 0)
		fail_msg("migrate: %s", err);
	if (pgtest_partitioned())
		partition_fresh(conn, &t);
	PQfinish(conn);
}

bool pgtest_partitioned(void)
{
	const char *v = getenv("RELAY_TEST_PARTITIONED");
	return v && strcmp(v, "1") == 0;
}

struct store_options pgtest_store_options(const char *table)
{
	struct store_options o = {
	    .conninfo = pgtest_url(),
	    .table = table,
	    .app_name = "outbox-relay-test",
	    .leased_by = "test/1/w0",
	    .ce_source = "/test",
	    .batch_size = 100,
	    .clean_batch_size = 100,
	    .lease_timeout_ms = 60000,
	    .statement_timeout_ms = 10000,
	    .backoff_base_ms = 2000,
	    .backoff_max_ms = 300000,
	    .backoff_factor = 2.0,
	    .prepare = true,
	};
	return o;
}

struct store *pgtest_store(const struct store_options *opt)
{
	struct store *s = NULL;
	char err[1024];
	if (store_open(&s, opt, err, sizeof(err)) != 0)
		fail_msg("store_open: %s", err);
	return s;
}

void pgtest_insert(PGconn *conn, const char *table, int n)
{
	pgtest_exec(conn,
		    "INSERT INTO %s (type, payload) SELECT 'test.event', "
		    "convert_to(json_build_object('n', g)::text, 'UTF8') "
		    "FROM generate_series(1, %d) g",
		    table, n);
}

void pgtest_before_004(PGconn *conn, const char *table, const char *sql)
{
	pgtest_exec(conn,
		    "ALTER TABLE %s DROP CONSTRAINT "
		    "outbox_events_destination_text",
		    table);
	pgtest_exec(conn, "%s", sql);
	/* The expression of sql/004_destination_text.sql. */
	pgtest_exec(conn,
		    "ALTER TABLE %s ADD CONSTRAINT "
		    "outbox_events_destination_text CHECK (status <> "
		    "'pending' OR (coalesce(exchange, '') !~ "
		    "'[\\x01-\\x1f\\x7f]' AND routing_key !~ "
		    "'[\\x01-\\x1f\\x7f]')) NOT VALID",
		    table);
}

size_t pgtest_lease_count(const struct store_options *opt)
{
	char err[1024];
	struct store *s = pgtest_store(opt);
	struct lease_batch b;
	if (store_lease(s, NULL, 0, "", &b, err, sizeof(err)) != 0)
		fail_msg("lease: %s", err);
	size_t n = b.n;
	if (store_lease_abort(s, &b, err, sizeof(err)) != 0)
		fail_msg("lease abort: %s", err);
	lease_batch_release(&b);
	store_close(s);
	return n;
}
