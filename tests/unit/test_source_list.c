/* SPDX-License-Identifier: MIT */
/*
 * The relay's list of sources (src/loops/sources.c, docs/design.md §13):
 * room for every table OUTBOX_TABLE lists, in every database of
 * OUTBOX_DATABASES, beside what a pattern may add.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "config/config.h"
#include "loops/loops_int.h"

#define DATABASES 64
#define TABLES 200

/* Unsets every OUTBOX_* variable the test's environment brought,
 * restarting after each unsetenv() because it rewrites environ. */
static void env_clear(void)
{
	extern char **environ;
	for (char **e = environ; *e;) {
		if (strncmp(*e, "OUTBOX_", 7) != 0) {
			e++;
			continue;
		}
		char *name = strndup(*e, strcspn(*e, "="));
		assert_non_null(name);
		assert_int_equal(unsetenv(name), 0);
		free(name);
		e = environ;
	}
}

/* OUTBOX_DATABASES of DATABASES names, each with its URL, and
 * OUTBOX_TABLE listing TABLES tables, after pattern when not NULL. */
static void env_many(const char *pattern)
{
	char *dbs = calloc(DATABASES, 8);
	char *tables = calloc(TABLES + 1, 16 + 64);
	assert_non_null(dbs);
	assert_non_null(tables);
	for (int d = 1; d <= DATABASES; d++) {
		char var[64];
		sprintf(dbs + strlen(dbs), "%sd%02d", d > 1 ? "," : "", d);
		snprintf(var, sizeof(var), "OUTBOX_DATABASE_URL_D%02d", d);
		assert_int_equal(setenv(var, "postgres://relay@127.0.0.1/x", 1),
				 0);
	}
	if (pattern)
		strcpy(tables, pattern);
	for (int t = 1; t <= TABLES; t++)
		sprintf(tables + strlen(tables), "%st%03d.outbox_events",
			*tables ? "," : "", t);
	assert_int_equal(setenv("OUTBOX_DATABASES", dbs, 1), 0);
	assert_int_equal(setenv("OUTBOX_TABLE", tables, 1), 0);
	free(dbs);
	free(tables);
}

static void expect_every_listed_table(const char *pattern)
{
	struct config cfg;
	struct source_list l;
	env_clear();
	env_many(pattern);
	int problems = config_load(&cfg, NULL, stderr);
	assert_int_equal(problems, 0);
	assert_int_equal(source_list_init(&l, &cfg), 0);
	/* More than a pattern's room alone (RELAY_MAX_SOURCES): an earlier
	 * version gave a list beside a pattern that much in all, and the
	 * last databases' tables were left out without a word. */
	assert_true(DATABASES * TABLES > RELAY_MAX_SOURCES);
	size_t n = atomic_load(&l.n);
	assert_int_equal(n, DATABASES * TABLES);
	assert_string_equal(l.names[0], "d01/t001.outbox_events");
	assert_string_equal(l.names[n - 1], "d64/t200.outbox_events");
	/* A pattern's tables still find room beside them. */
	size_t at;
	enum source_found found;
	bool ok =
	    source_list_add(&l, 0, "tenant_1.outbox_events", 7, &at, &found);
	assert_int_equal(ok, pattern != NULL);
	assert_int_equal(found == SOURCE_ADDED, pattern != NULL);
	source_list_free(&l);
	config_release(&cfg);
}

static void test_listed_tables_beside_a_pattern(void **state)
{
	(void)state;
	expect_every_listed_table("tenant_*.outbox_events");
}

static void test_listed_tables_alone(void **state)
{
	(void)state;
	expect_every_listed_table(NULL);
}

/* A pattern's table found again under another oid was dropped and made
 * again between two discovery passes (a tenant restored from a dump in
 * one transaction, never seen gone): its epoch moves on, so each thread
 * opens its store of the new table afresh, as it does for one back. */
static void test_table_made_anew(void **state)
{
	(void)state;
	struct config cfg;
	struct source_list l;
	env_clear();
	assert_int_equal(
	    setenv("OUTBOX_DATABASE_URL", "postgres://relay@127.0.0.1/x", 1),
	    0);
	assert_int_equal(
	    setenv("OUTBOX_TABLE", "t.outbox_events,tenant_*.outbox_events", 1),
	    0);
	assert_int_equal(config_load(&cfg, NULL, stderr), 0);
	assert_int_equal(source_list_init(&l, &cfg), 0);
	size_t at, again;
	enum source_found found;
	assert_true(
	    source_list_add(&l, 0, "tenant_1.outbox_events", 7, &at, &found));
	assert_int_equal(found, SOURCE_ADDED);
	assert_int_equal(atomic_load(&l.epoch[at]), 0);
	assert_true(source_list_add(&l, 0, "tenant_1.outbox_events", 7, &again,
				    &found));
	assert_int_equal(again, at);
	assert_int_equal(found, SOURCE_KNOWN);
	assert_int_equal(atomic_load(&l.epoch[at]), 0);
	assert_true(source_list_add(&l, 0, "tenant_1.outbox_events", 8, &again,
				    &found));
	assert_int_equal(found, SOURCE_REMADE);
	assert_int_equal(atomic_load(&l.epoch[at]), 1);
	/* Gone, then back under the same oid (renamed away and back): a
	 * thread that did not look meanwhile opens afresh too. */
	atomic_store(&l.gone[at], true);
	assert_true(source_list_add(&l, 0, "tenant_1.outbox_events", 8, &again,
				    &found));
	assert_int_equal(found, SOURCE_BACK);
	assert_int_equal(atomic_load(&l.epoch[at]), 2);
	/* A listed table's oid is not known: nothing to compare. */
	assert_true(
	    source_list_add(&l, 0, "t.outbox_events", 0, &again, &found));
	assert_int_equal(again, 0);
	assert_int_equal(found, SOURCE_KNOWN);
	assert_int_equal(atomic_load(&l.epoch[0]), 0);
	source_list_free(&l);
	config_release(&cfg);
}

/* A write the activity read sees makes an idle source due, and its
 * operator pauses are read again at that lease: a resume seen within the
 * pauses' refresh was read as still paused, the lease left the rows, and
 * they waited for the backstop. A source that is not idle keeps both. */
static void test_activity_rereads_pauses(void **state)
{
	(void)state;
	struct source_turns *t = source_turns_create(2);
	assert_non_null(t);
	for (size_t i = 0; i < 2; i++) {
		t->at[i].idle = i == 0;
		t->at[i].activity = 5;
		t->at[i].activity_known = true;
		t->at[i].due_ms = 1000000;
		t->at[i].control_read_ms = 1000;
	}
	const int64_t counts[2] = {6, 6};
	source_turns_note_activity(t, 2, counts);
	assert_int_equal(t->at[0].due_ms, 0);
	assert_int_equal(t->at[0].control_read_ms, 0);
	assert_int_equal(t->at[1].due_ms, 1000000);
	assert_int_equal(t->at[1].control_read_ms, 1000);
	assert_int_equal(t->at[0].activity, 6);
	source_turns_destroy(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_activity_rereads_pauses),
	    cmocka_unit_test(test_table_made_anew),
	    cmocka_unit_test(test_listed_tables_beside_a_pattern),
	    cmocka_unit_test(test_listed_tables_alone),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
