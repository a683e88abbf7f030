/* SPDX-License-Identifier: MIT */
/*
 * OUTBOX_PG_PREPARE=on where a session's statements do not all reach one
 * server session (docs/design.md §7): the relay sees a pooler answer its
 * connection and prepares as pooled from the start; a proxy that passes
 * the server's process id through shows it only as a name missing or
 * already there (26000, 42P05). The first such refusal turns every store
 * of the process to pooled, said once. Its own binary: the switch is the
 * process's, and would turn the other tests' stores too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>
#include "capture.h"
#include "pgtest.h"
#include "store/store.h"
#include "store/store_test.h"

static char err[1024];

/* The text of the statement store_next_due_ms() runs, as it begins. */
static const char due_sql[] = "SELECT coalesce(ceil(extract(epoch";

struct due_call {
	struct store *s;
	int rc;
};

static void due_call_run(void *arg)
{
	struct due_call *c = arg;
	int64_t when;
	c->rc = store_next_due_ms(c->s, &when, err, sizeof(err));
}

static void test_refused_name_turns_to_pooled(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("prepare_refused", table, sizeof(table));
	struct store_options o = pgtest_store_options(table);
	o.prepare = true;
	struct store *a = pgtest_store(&o), *b = pgtest_store(&o);
	int64_t when;
	/* a prepares the statement under its name, once a session. */
	if (store_next_due_ms(a, &when, err, sizeof(err)) != 0)
		fail_msg("next due: %s", err);
	PGresult *r =
	    PQexec(store_conn(a),
		   "SELECT name FROM pg_prepared_statements WHERE "
		   "statement LIKE 'SELECT coalesce(ceil(extract(epoch%'");
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	assert_int_equal(PQntuples(r), 1);
	/* b's session holds that name already, as a pool's server
	 * connection where another relay left it. */
	pgtest_exec(store_conn(b), "PREPARE \"%s\" AS SELECT 1",
		    PQgetvalue(r, 0, 0));
	PQclear(r);
	struct due_call first = {.s = b}, second = {.s = b};
	char *said = capture_stderr(due_call_run, &first);
	assert_int_not_equal(first.rc, 0);
	if (!strstr(err, "42P05"))
		fail_msg("the refusal: %s", err);
	if (!strstr(said, "OUTBOX_PG_PREPARE=on cannot work; the relay now "
			  "prepares its statements once a server connection"))
		fail_msg("the refusal was not explained: %s", said);
	free(said);
	said = capture_stderr(due_call_run, &second);
	if (second.rc != 0)
		fail_msg("next due after the switch: %s", err);
	assert_null(strstr(said, "cannot work"));
	free(said);
	assert_int_equal(pgtest_long(store_conn(b),
				     "SELECT count(*) FROM "
				     "pg_prepared_statements WHERE name LIKE "
				     "'outbox\\_p\\_%%' AND statement LIKE "
				     "'%s%%'",
				     due_sql),
			 1);
	/* Every store of the process: a's next run is pooled too. */
	if (store_next_due_ms(a, &when, err, sizeof(err)) != 0)
		fail_msg("next due on a: %s", err);
	assert_int_equal(pgtest_long(store_conn(a),
				     "SELECT count(*) FROM "
				     "pg_prepared_statements WHERE name LIKE "
				     "'outbox\\_p\\_%%'"),
			 1);

	/* A store first run pooled, then the process back to on (a pool
	 * seen to keep statements itself): it prepares under its own name.
	 * The flag its pooled run set for the pool's name made it run that
	 * name unprepared, refused (26000) at every run after. */
	struct store *c = pgtest_store(&o);
	if (store_next_due_ms(c, &when, err, sizeof(err)) != 0)
		fail_msg("next due on c, pooled: %s", err);
	store_pool_keeps_statements();
	for (int i = 0; i < 2; i++)
		if (store_next_due_ms(c, &when, err, sizeof(err)) != 0)
			fail_msg("next due on c, on again (%d): %s", i, err);
	/* Gone from the session (a DEALLOCATE) where the flags say they
	 * are there: a run refused (26000) for each of its statements (the
	 * transaction's settings, the statement), each prepared again at
	 * the next, where every run after failed. */
	pgtest_exec(store_conn(c), "DEALLOCATE ALL");
	int refused = 0;
	while (refused < 3 &&
	       store_next_due_ms(c, &when, err, sizeof(err)) != 0) {
		if (!strstr(err, "26000"))
			fail_msg("a run after DEALLOCATE: %s", err);
		refused++;
	}
	if (refused == 0 || refused == 3)
		fail_msg("runs refused after DEALLOCATE: %d", refused);
	assert_int_equal(pgtest_long(store_conn(c),
				     "SELECT count(*) FROM "
				     "pg_prepared_statements WHERE name NOT "
				     "LIKE 'outbox\\_p\\_%%' AND statement "
				     "LIKE '%s%%'",
				     due_sql),
			 1);
	store_close(a);
	store_close(b);
	store_close(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_refused_name_turns_to_pooled),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
