/* SPDX-License-Identifier: MIT */
/*
 * Several outbox tables of one database on one session (store.h,
 * store_open_sharing; docs/design.md §13), against a real Postgres: each
 * table's statements under names of their own, one lease at a time per
 * session, a reconnect by one store seen by the others, a dropped table
 * failing its own store alone, and claims on one claim session.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "capture.h"
#include "pgtest.h"
#include "store/store.h"
#include "store/store_test.h"

static char err[1024];

static struct store *open_sharing(const char *table, struct store *with)
{
	struct store_options o = pgtest_store_options(table);
	struct store *s = NULL;
	if (store_open_sharing(&s, &o, with, err, sizeof(err)) != 0)
		fail_msg("store_open_sharing %s: %s", table, err);
	return s;
}

/* Leases, marks everything sent and commits; returns the batch's size. */
static size_t lease_all_sent(struct store *s)
{
	struct lease_batch b;
	struct mark_result r;
	if (store_lease(s, NULL, 0, "", &b, err, sizeof(err)) != 0)
		fail_msg("lease: %s", err);
	size_t n = b.n;
	if (n > 0) {
		const char **ids = calloc(n, sizeof(*ids));
		assert_non_null(ids);
		for (size_t i = 0; i < n; i++)
			ids[i] = b.events[i].id;
		if (store_mark(s, MARK_SENT, ids, NULL, n, &r, err,
			       sizeof(err)) != 0)
			fail_msg("mark: %s", err);
		free(ids);
		if (store_lease_commit(s, &b, err, sizeof(err)) != 0)
			fail_msg("commit: %s", err);
	}
	lease_batch_release(&b);
	return n;
}

static long sent_in(PGconn *c, const char *table)
{
	return pgtest_long(c, "SELECT count(*) FROM %s WHERE status = 'sent'",
			   table);
}

static void test_tables_share_a_session(void **state)
{
	(void)state;
	char a[128], b[128];
	pgtest_fresh_table("src_a", a, sizeof(a));
	pgtest_fresh_table("src_b", b, sizeof(b));
	PGconn *c = pgtest_connect();
	pgtest_insert(c, a, 3);
	pgtest_insert(c, b, 5);
	struct store *sa = open_sharing(a, NULL);
	struct store *sb = open_sharing(b, sa);
	assert_ptr_equal(store_conn(sa), store_conn(sb));

	/* The same statements of two tables, prepared on one session. */
	assert_int_equal(lease_all_sent(sa), 3);
	assert_int_equal(lease_all_sent(sb), 5);
	assert_int_equal(sent_in(c, a), 3);
	assert_int_equal(sent_in(c, b), 5);
	/* Their claims went to one claim session too. */
	assert_non_null(store_claim_conn(sa));
	assert_ptr_equal(store_claim_conn(sa), store_claim_conn(sb));
	long sessions = pgtest_long(
	    c, "SELECT count(*) FROM pg_stat_activity WHERE pid <> "
	       "pg_backend_pid() AND application_name LIKE 'test%%'");

	/* One lease transaction per session: b cannot lease while a's is
	 * open, and says why. */
	pgtest_insert(c, a, 2);
	pgtest_insert(c, b, 2);
	struct lease_batch la, lb;
	assert_int_equal(store_lease(sa, NULL, 0, "", &la, err, sizeof(err)),
			 0);
	assert_int_equal(la.n, 2);
	assert_int_not_equal(
	    store_lease(sb, NULL, 0, "", &lb, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "lease"));
	assert_int_equal(store_lease_abort(sa, &la, err, sizeof(err)), 0);
	lease_batch_release(&la);

	/* A reconnect by b is a new session for a as well: a prepares its
	 * statements again and goes on. */
	PGconn *before = store_conn(sa);
	(void)before;
	assert_int_equal(store_reconnect(sb, err, sizeof(err)), 0);
	assert_ptr_equal(store_conn(sa), store_conn(sb));
	assert_int_equal(lease_all_sent(sa), 2);
	assert_int_equal(lease_all_sent(sb), 2);
	assert_int_equal(sent_in(c, a), 5);
	assert_int_equal(sent_in(c, b), 7);
	/* Sharing did not open a session per table. */
	assert_true(pgtest_long(c,
				"SELECT count(*) FROM pg_stat_activity WHERE "
				"pid <> pg_backend_pid() AND application_name "
				"LIKE 'test%%'") <= sessions);

	/* The session outlives its first store. */
	store_close(sa);
	pgtest_insert(c, b, 1);
	assert_int_equal(lease_all_sent(sb), 1);
	store_close(sb);
	PQfinish(c);
}

static void test_dropped_table_fails_alone(void **state)
{
	(void)state;
	char a[128], b[128];
	pgtest_fresh_table("src_c", a, sizeof(a));
	pgtest_fresh_table("src_d", b, sizeof(b));
	PGconn *c = pgtest_connect();
	struct store *sa = open_sharing(a, NULL);
	struct store *sb = open_sharing(b, sa);
	pgtest_insert(c, a, 1);
	pgtest_insert(c, b, 1);
	assert_int_equal(lease_all_sent(sb), 1);

	pgtest_exec(c, "DROP TABLE %s CASCADE", b);
	struct lease_batch lb;
	int rc = store_lease(sb, NULL, 0, "", &lb, err, sizeof(err));
	assert_int_equal(rc, STORE_ERROR);
	assert_non_null(strstr(err, "42P01"));
	/* Its session is a's as well, and a goes on. */
	assert_int_equal(lease_all_sent(sa), 1);

	/* After a reconnect b checks its table again before its statements:
	 * the error names the table and the fix; a is unaffected. */
	assert_int_not_equal(store_reconnect(sb, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "does not exist"));
	pgtest_insert(c, a, 2);
	assert_int_equal(lease_all_sent(sa), 2);
	rc = store_lease(sb, NULL, 0, "", &lb, err, sizeof(err));
	assert_int_equal(rc, STORE_ERROR);
	assert_non_null(strstr(err, "outbox-relay migrate"));

	/* A store cannot be opened on a session for a table that is not
	 * there, and the session stays the others'. */
	struct store_options o = pgtest_store_options(b);
	struct store *again = NULL;
	assert_int_not_equal(
	    store_open_sharing(&again, &o, sa, err, sizeof(err)), 0);
	assert_null(again);
	pgtest_insert(c, a, 1);
	assert_int_equal(lease_all_sent(sa), 1);
	store_close(sb);
	store_close(sa);
	PQfinish(c);
}

/* A store opened on a shared session that was lost since its last
 * statement (a server restart) connects it anew for all its stores: it
 * failed, and the new source was set aside as failing until another
 * statement of the session reconnected it. */
static void test_open_on_a_lost_session_reconnects(void **state)
{
	(void)state;
	char a[128], b[128];
	pgtest_fresh_table("src_g", a, sizeof(a));
	pgtest_fresh_table("src_h", b, sizeof(b));
	PGconn *c = pgtest_connect();
	struct store *sa = open_sharing(a, NULL);
	int lost = PQbackendPID(store_conn(sa));
	pgtest_exec(c, "SELECT pg_terminate_backend(%d)", lost);
	for (int i = 0; i < 50 && pgtest_long(c,
					      "SELECT count(*) FROM "
					      "pg_stat_activity WHERE pid = %d",
					      lost) > 0;
	     i++)
		usleep(20 * 1000);
	struct store *sb = open_sharing(b, sa);
	assert_ptr_equal(store_conn(sa), store_conn(sb));
	assert_int_not_equal(PQbackendPID(store_conn(sb)), lost);
	pgtest_insert(c, a, 1);
	pgtest_insert(c, b, 2);
	assert_int_equal(lease_all_sent(sa), 1);
	assert_int_equal(lease_all_sent(sb), 2);
	store_close(sb);
	store_close(sa);
	PQfinish(c);
}

static long prepared_on(PGconn *c)
{
	PGresult *r = PQexec(c, "SELECT count(*) FROM pg_prepared_statements");
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	long n = strtol(PQgetvalue(r, 0, 0), NULL, 10);
	PQclear(r);
	return n;
}

/* A store closed while its session goes on with others leaves none of its
 * statements there: a source set aside and tried again at each backoff,
 * or let go and found again, opens a store of a new name prefix each
 * time, whose statements stayed for the session's life. */
static void test_closed_store_leaves_no_statements(void **state)
{
	(void)state;
	char a[128], b[128];
	pgtest_fresh_table("src_e", a, sizeof(a));
	pgtest_fresh_table("src_f", b, sizeof(b));
	PGconn *c = pgtest_connect();
	struct store *sa = open_sharing(a, NULL);
	pgtest_insert(c, a, 1);
	assert_int_equal(lease_all_sent(sa), 1);
	long main_before = prepared_on(store_conn(sa));
	long claim_before = prepared_on(store_claim_conn(sa));
	for (int i = 0; i < 3; i++) {
		struct store *sb = open_sharing(b, sa);
		pgtest_insert(c, b, 1);
		assert_int_equal(lease_all_sent(sb), 1);
		assert_true(prepared_on(store_conn(sa)) > main_before);
		store_close(sb);
		assert_int_equal(prepared_on(store_conn(sa)), main_before);
		assert_int_equal(prepared_on(store_claim_conn(sa)),
				 claim_before);
	}
	/* Opens refused for a table not there leave none either. */
	struct store_options o = pgtest_store_options("public.src_not_there");
	for (int i = 0; i < 3; i++) {
		struct store *none = NULL;
		assert_int_not_equal(
		    store_open_sharing(&none, &o, sa, err, sizeof(err)), 0);
		assert_null(none);
	}
	assert_int_equal(prepared_on(store_conn(sa)), main_before);
	/* The statements of the store that goes on are its own still. */
	pgtest_insert(c, a, 2);
	assert_int_equal(lease_all_sent(sa), 2);
	assert_int_equal(prepared_on(store_conn(sa)), main_before);
	store_close(sa);
	PQfinish(c);
}

struct catalog_call {
	struct store_catalog *c;
	const char *pattern;
	char **names;
	size_t n;
};

static void catalog_call_run(void *arg)
{
	struct catalog_call *k = arg;
	store_names_free(k->names, k->n);
	if (store_catalog_tables(k->c, k->pattern, &k->names, NULL, &k->n, err,
				 sizeof(err)) != 0)
		fail_msg("catalog: %s", err);
}

static size_t count_of(const char *text, const char *what)
{
	size_t n = 0;
	for (const char *p = text; (p = strstr(p, what)); p++)
		n++;
	return n;
}

/* A table a pattern matches whose schema's name the relay cannot take
 * (past 43 bytes: a tenant's schema of a prefix and 32 hex digits) is
 * said to be left out, once per catalog session, where it was left out
 * silently, never relayed nor migrated; another session's temporary
 * table (in pg_temp_N, which a glob of * matches) is no match. */
static void test_catalog_says_what_it_leaves_out(void **state)
{
	(void)state;
	char a[128], prefix[64], longer[128];
	pgtest_fresh_table("cat", a, sizeof(a));
	snprintf(prefix, sizeof(prefix), "cat_%d_", (int)getpid());
	snprintf(longer, sizeof(longer),
		 "%s0123456789abcdef0123456789abcdef0123456789", prefix);
	PGconn *c = pgtest_connect();
	pgtest_exec(c, "DROP SCHEMA IF EXISTS %s CASCADE", longer);
	pgtest_exec(c, "CREATE SCHEMA %s", longer);
	pgtest_exec(c, "CREATE TABLE %s.outbox_events (id int)", longer);
	pgtest_exec(c, "CREATE TEMP TABLE outbox_events (id int)");
	struct store_options o = pgtest_store_options(a);
	struct catalog_call k = {0};
	assert_int_equal(store_catalog_open(&k.c, &o, err, sizeof(err)), 0);
	char pattern[96];
	snprintf(pattern, sizeof(pattern), "%s*.outbox_events", prefix);
	k.pattern = pattern;
	char *said = capture_stderr(catalog_call_run, &k);
	assert_int_equal(k.n, 1);
	assert_string_equal(k.names[0], a);
	assert_int_equal(count_of(said, "a table the pattern matches is left "
					"out"),
			 1);
	assert_non_null(strstr(said, longer));
	free(said);
	said = capture_stderr(catalog_call_run, &k);
	assert_int_equal(k.n, 1);
	assert_null(strstr(said, "left out"));
	free(said);
	k.pattern = "*.outbox_events";
	catalog_call_run(&k);
	for (size_t i = 0; i < k.n; i++)
		if (strncmp(k.names[i], "pg_temp", 7) == 0)
			fail_msg("another session's temporary table: %s",
				 k.names[i]);
	store_names_free(k.names, k.n);
	store_catalog_close(k.c);
	pgtest_exec(c, "DROP SCHEMA %s CASCADE", longer);
	PQfinish(c);
}

/* store_tables_activity() or store_tables_dead_tuples(). */
typedef int (*table_stats_fn)(struct store *, const char *const *, size_t,
			      int64_t *, char *, size_t);

/* Inserts n rows into table (and deletes them, when del) in a session
 * that ends, then reads read()'s count of tables (3 of them) into after
 * until tables[i]'s is no longer was (5 s at most); that count. A
 * session flushes its statistics when it ends (an idle one within 10 s,
 * a busy one within a second). */
static int64_t written_seen(struct store *s, table_stats_fn read,
			    const char *const *tables, const char *table, int n,
			    bool del, size_t i, int64_t was, int64_t *after)
{
	PGconn *producer = pgtest_connect();
	pgtest_insert(producer, table, n);
	if (del) {
		char sql[256];
		snprintf(sql, sizeof(sql), "DELETE FROM %s", table);
		PGresult *res = PQexec(producer, sql);
		assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
		PQclear(res);
	}
	PQfinish(producer);
	for (int k = 0; k < 50; k++) {
		assert_int_equal(read(s, tables, 3, after, err, sizeof(err)),
				 0);
		if (after[i] != was)
			break;
		usleep(100 * 1000);
	}
	return after[i];
}

/* Fresh tables a (plain) and b (partitioned) and gone, a name of none;
 * a store of a's, and read()'s first counts of the three in before. */
static struct store *three_tables(const char *pa, const char *pb,
				  char (*names)[160], table_stats_fn read,
				  int64_t *before)
{
	pgtest_fresh_table(pa, names[0], sizeof(names[0]));
	pgtest_fresh_table(pb, names[1], sizeof(names[1]));
	snprintf(names[2], sizeof(names[2]), "%.120s_nope", names[0]);
	PGconn *c = pgtest_connect();
	struct outbox_table tb;
	assert_int_equal(table_parse(names[1], &tb, err, sizeof(err)), 0);
	if (!pgtest_partitioned() &&
	    store_partition_unrecorded(c, &tb, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);
	PQfinish(c);
	struct store *s = open_sharing(names[0], NULL);
	const char *tables[3] = {names[0], names[1], names[2]};
	assert_int_equal(read(s, tables, 3, before, err, sizeof(err)), 0);
	assert_int_equal(before[2], -1);
	return s;
}

/* Rows written to b (partitioned: counted in its partitions alone) and
 * then to a (plain: counted itself) move each table's count of read()
 * alone, in one statement; a table gone reads -1. del: the rows are
 * deleted too. The store, for more checks. */
static struct store *b_then_a(table_stats_fn read, const char *pa,
			      const char *pb, bool del)
{
	char names[3][160];
	int64_t before[3], after[3];
	struct store *s = three_tables(pa, pb, names, read, before);
	const char *tables[3] = {names[0], names[1], names[2]};
	assert_int_equal(written_seen(s, read, tables, names[1], 2, del, 1,
				      before[1], after),
			 before[1] + 2);
	assert_int_equal(after[0], before[0]);
	assert_int_equal(written_seen(s, read, tables, names[0], 3, del, 0,
				      before[0], after),
			 before[0] + 3);
	assert_int_equal(after[1], before[1] + 2);
	assert_int_equal(after[2], -1);
	return s;
}

/* Statistics say which tables had rows inserted or updated. */
static void test_tables_activity(void **state)
{
	(void)state;
	store_close(b_then_a(store_tables_activity, "src_e", "src_f", false));
}

/* An operator's pause and resume (the control table's writes) move the
 * table's activity count: a resume makes the rows it held back due, and
 * of many idle tables only the count says so; without it the paused
 * rows waited for the 5-minute backstop. */
static void test_tables_activity_sees_pauses(void **state)
{
	(void)state;
	char table[160];
	pgtest_fresh_table("src_p", table, sizeof(table));
	struct store *s = open_sharing(table, NULL);
	const char *tables[1] = {table};
	int64_t before, after = 0;
	assert_int_equal(
	    store_tables_activity(s, tables, 1, &before, err, sizeof(err)), 0);
	for (size_t k = 0; k < 2; k++) {
		PGconn *c = pgtest_connect();
		if (k == 0)
			pgtest_exec(c,
				    "INSERT INTO %s_control (destination, "
				    "reason) VALUES ('x', 't')",
				    table);
		else
			pgtest_exec(c, "DELETE FROM %s_control", table);
		/* The backend flushes its counts as it ends. */
		PQfinish(c);
		for (int tries = 0; tries < 50; tries++) {
			assert_int_equal(store_tables_activity(s, tables, 1,
							       &after, err,
							       sizeof(err)),
					 0);
			if (after != before)
				break;
			usleep(100 * 1000);
		}
		assert_int_equal(after, before + 1);
		before = after;
	}
	store_close(s);
}

/* Each table's dead tuples. */
static void test_tables_dead_tuples(void **state)
{
	(void)state;
	struct store *s =
	    b_then_a(store_tables_dead_tuples, "src_i", "src_j", true);
	int64_t after[1];
	/* A bad name is refused before any statement. */
	const char *bad[1] = {"no such; table"};
	assert_int_not_equal(
	    store_tables_dead_tuples(s, bad, 1, after, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "table name is not"));
	store_close(s);
}

/* One LISTEN session for several tables says which of them had rows. */
static void test_listener_per_table(void **state)
{
	(void)state;
	char a[128], b[128];
	pgtest_fresh_table("src_g", a, sizeof(a));
	pgtest_fresh_table("src_h", b, sizeof(b));
	PGconn *c = pgtest_connect();
	struct store_options oa = pgtest_store_options(a);
	struct store_options ob = pgtest_store_options(b);
	assert_int_equal(store_migrate(&oa, true, NULL, err, sizeof(err)), 0);
	assert_int_equal(store_migrate(&ob, true, NULL, err, sizeof(err)), 0);
	struct store_listener *l = NULL;
	assert_int_equal(store_listener_open(&l, &oa, err, sizeof(err)), 0);
	assert_int_equal(store_listener_add(l, b, err, sizeof(err)), 0);
	pgtest_insert(c, b, 1);
	bool woken[2] = {false, false};
	size_t n = 0;
	for (int i = 0; i < 10 && n == 0; i++)
		assert_int_equal(
		    store_listener_wait(l, 500, &n, woken, err, sizeof(err)),
		    0);
	assert_true(n > 0);
	assert_false(woken[0]);
	assert_true(woken[1]);
	store_listener_close(l);
	PQfinish(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tables_share_a_session),
	    cmocka_unit_test(test_dropped_table_fails_alone),
	    cmocka_unit_test(test_closed_store_leaves_no_statements),
	    cmocka_unit_test(test_open_on_a_lost_session_reconnects),
	    cmocka_unit_test(test_catalog_says_what_it_leaves_out),
	    cmocka_unit_test(test_tables_activity),
	    cmocka_unit_test(test_tables_activity_sees_pauses),
	    cmocka_unit_test(test_tables_dead_tuples),
	    cmocka_unit_test(test_listener_per_table),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
