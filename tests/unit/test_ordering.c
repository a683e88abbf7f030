/* SPDX-License-Identifier: MIT */
/*
 * Ordered mode in the store against a real Postgres: the per-key head
 * marker, its hand-over in the marks, skip and block, unblock, the
 * sweeper's repair, the cleaner sparing blocking rows, redrive refusals.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pgtest.h"
#include "store/store.h"
#include "store/store_test.h"

static char err[1024];

static struct store *ordered_store(const char *table, bool block)
{
	struct store_options o = pgtest_store_options(table);
	o.ordered = true;
	o.block_on_failure = block;
	return pgtest_store(&o);
}

/* Classifies, then leases one batch. */
static void lease(struct store *s, struct lease_batch *b)
{
	size_t n;
	if (store_classify(s, &n, err, sizeof(err)) != 0)
		fail_msg("classify: %s", err);
	if (store_lease(s, NULL, 0, "", b, err, sizeof(err)) != 0)
		fail_msg("lease: %s", err);
}

static void mark_all(struct store *s, enum mark_kind kind,
		     struct lease_batch *b, const char *reason)
{
	const char *ids[128], *reasons[128];
	assert_true(b->n <= 128);
	for (size_t i = 0; i < b->n; i++) {
		ids[i] = b->events[i].id;
		reasons[i] = reason;
	}
	struct mark_result r;
	if (store_mark(s, kind, ids, reason ? reasons : NULL, b->n, &r, err,
		       sizeof(err)) != 0)
		fail_msg("mark: %s", err);
	assert_int_equal(r.marked, b->n);
	if (store_lease_commit(s, b, err, sizeof(err)) != 0)
		fail_msg("commit: %s", err);
	lease_batch_release(b);
}

/* The subjects (used as labels) of a batch, sorted, comma-joined. */
static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static void expect_batch(struct store *s, const char *want)
{
	struct lease_batch b;
	lease(s, &b);
	const char *labels[128];
	for (size_t i = 0; i < b.n; i++)
		labels[i] = b.events[i].subject;
	qsort(labels, b.n, sizeof(*labels), cmp_str);
	char got[1024] = "";
	for (size_t i = 0; i < b.n; i++) {
		strcat(got, i ? "," : "");
		strcat(got, labels[i]);
	}
	if (strcmp(got, want) != 0)
		fail_msg("leased [%s], want [%s]", got, want);
	mark_all(s, MARK_SENT, &b, NULL);
}

static void insert(PGconn *c, const char *table, const char *label,
		   const char *key)
{
	if (key)
		pgtest_exec(c,
			    "INSERT INTO %s (type, subject, partition_key, "
			    "payload) VALUES ('t', '%s', '%s', 'x')",
			    table, label, key);
	else
		pgtest_exec(c,
			    "INSERT INTO %s (type, subject, payload) VALUES "
			    "('t', '%s', 'x')",
			    table, label);
}

/* per rows of each one-letter key in keys, labelled by the lower-case
 * letter and their place: "a1", "a2", "b1"... */
static void insert_keys(PGconn *c, const char *table, const char *keys, int per)
{
	for (const char *k = keys; *k; k++)
		for (int i = 1; i <= per; i++) {
			char label[8], key[2] = {*k, '\0'};
			snprintf(label, sizeof(label), "%c%d", *k + 32, i);
			insert(c, table, label, key);
		}
}

static void test_one_head_per_key_in_seq_order(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_heads", table, sizeof(table));
	PGconn *c = pgtest_connect();
	/* a1..a3 and b1..b2 in one transaction each; u unkeyed. */
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, partition_key, payload) "
		    "VALUES ('t', 'a1', 'A', 'x'), ('t', 'a2', 'A', 'x'), "
		    "('t', 'a3', 'A', 'x'), ('t', 'b1', 'B', 'x'), ('t', "
		    "'b2', 'B', 'x')",
		    table);
	insert(c, table, "u1", NULL);
	insert(c, table, "u2", NULL);
	struct store *s = ordered_store(table, false);
	expect_batch(s, "a1,b1,u1,u2");
	expect_batch(s, "a2,b2");
	insert(c, table, "b3", "B");
	expect_batch(s, "a3,b3");
	expect_batch(s, "");
	store_close(s);
	PQfinish(c);
}

static void test_backoff_holds_the_key(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_backoff", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	struct store *s = ordered_store(table, false);
	struct lease_batch b;
	lease(s, &b);
	assert_int_equal(b.n, 1);
	mark_all(s, MARK_RETRY, &b, "nack");
	/* a1 waits in backoff and still holds A: a2 is not leased. */
	expect_batch(s, "");
	lease(s, &b);
	assert_int_equal(b.n, 0);
	lease_batch_release(&b);
	pgtest_exec(c, "UPDATE %s SET next_attempt_at = now()", table);
	expect_batch(s, "a1");
	expect_batch(s, "a2");
	store_close(s);
	PQfinish(c);
}

static void test_skip_moves_on(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_skip", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	struct store *s = ordered_store(table, false);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "permanent");
	expect_batch(s, "a2");
	store_close(s);
	PQfinish(c);
}

static void test_block_unblock_and_cleaner(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_block", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "b1", "B");
	struct store *s = ordered_store(table, true);
	struct lease_batch b;
	lease(s, &b);
	assert_int_equal(b.n, 2);
	/* Fail a1, send b1. */
	const char *ids[1];
	const char *reasons[1] = {"too large"};
	struct mark_result r;
	for (size_t i = 0; i < b.n; i++) {
		ids[0] = b.events[i].id;
		bool is_a = strcmp(b.events[i].subject, "a1") == 0;
		assert_int_equal(store_mark(s, is_a ? MARK_FAILED : MARK_SENT,
					    ids, is_a ? reasons : NULL, 1, &r,
					    err, sizeof(err)),
				 0);
	}
	assert_int_equal(store_lease_commit(s, &b, err, sizeof(err)), 0);
	lease_batch_release(&b);
	char blocked[160];
	snprintf(blocked, sizeof(blocked), "%.*soutbox_events_blocked_keys",
		 (int)(strlen(table) - strlen("outbox_events")), table);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE "
				     "partition_key = 'A' AND reason = 'too "
				     "large'",
				     blocked),
			 1);
	/* Nothing more of A, even a fresh row; B goes on. */
	insert(c, table, "a3", "A");
	insert(c, table, "b2", "B");
	expect_batch(s, "b2");
	expect_batch(s, "");

	/* The cleaner spares the blocking row past its retention. */
	pgtest_exec(c,
		    "UPDATE %s SET finished_at = now() - interval '30 days' "
		    "WHERE status IN ('sent', 'failed')",
		    table);
	struct clean_result cr;
	assert_int_equal(
	    store_clean(s, 1000, 1000, 1000, 0, &cr, err, sizeof(err)), 0);
	assert_int_equal(cr.sent_deleted, 2);
	assert_int_equal(cr.failed_deleted, 0);
	assert_int_equal(
	    pgtest_long(c,
			"SELECT count(*) FROM %s WHERE subject = 'a1' AND "
			"status = 'failed'",
			table),
	    1);

	/* unblock --skip: a2 becomes head, a3 follows. */
	assert_int_equal(store_unblock(s, "A", false, err, sizeof(err)), 0);
	expect_batch(s, "a2");
	expect_batch(s, "a3");
	assert_int_equal(store_unblock(s, "A", false, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "not blocked"));
	store_close(s);
	PQfinish(c);
}

static void test_unblock_redrive(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_unblock", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	struct store *s = ordered_store(table, true);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	expect_batch(s, "");
	assert_int_equal(store_unblock(s, "A", true, err, sizeof(err)), 0);
	assert_int_equal(pgtest_long(c,
				     "SELECT attempts FROM %s WHERE "
				     "subject = 'a1'",
				     table),
			 0);
	expect_batch(s, "a1");
	expect_batch(s, "a2");
	store_close(s);
	PQfinish(c);
}

static void test_sweeper_repairs_lost_heads(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_repair", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	struct store *s = ordered_store(table, false);
	size_t n;
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1); /* a1; a2 stays unclassified */
	/* What a mark racing an insert leaves behind: nobody is head. */
	pgtest_exec(c, "UPDATE %s SET head = false", table);
	expect_batch(s, "");
	assert_int_equal(store_repair_heads(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	expect_batch(s, "a1");
	expect_batch(s, "a2");
	/* What a classification racing a mark leaves behind: the key's
	 * next row unclassified, behind the walk, with no writer after
	 * the classification's floor. */
	insert(c, table, "a3", "A");
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	pgtest_exec(c, "UPDATE %s SET head = NULL", table);
	assert_int_equal(store_repair_heads(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	expect_batch(s, "a3");
	store_close(s);
	PQfinish(c);
}

/* The repair steps from key to key (key_idx), reading each key's first
 * live row only: every key is visited, and a key is repaired only when
 * that row is pending, not head, and the key is not blocked. */
static void test_repair_visits_every_key(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_repair_keys", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "ABCDEF", 2);
	struct store *s = ordered_store(table, false);
	size_t n;
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 6);
	/* B keeps its head; E's first row is out under an older relay's
	 * row lease; F is blocked; A, C and D lost theirs. */
	pgtest_exec(c, "UPDATE %s SET head = NULL WHERE partition_key <> 'B'",
		    table);
	pgtest_exec(c,
		    "UPDATE %s SET status = 'in_flight', lease_id = "
		    "gen_random_uuid(), leased_at = now(), lease_expires_at = "
		    "now() + interval '1 hour' WHERE subject = 'e1'",
		    table);
	pgtest_exec(c,
		    "INSERT INTO %s_blocked_keys (partition_key, blocking_id) "
		    "SELECT 'F', id FROM %s WHERE subject = 'f1'",
		    table, table);
	assert_int_equal(store_repair_heads(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 3);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE head AND "
				     "subject IN ('a1', 'b1', 'c1', 'd1')",
				     table),
			 4);
	assert_int_equal(
	    pgtest_long(c, "SELECT count(*) FROM %s WHERE head", table), 4);
	store_close(s);
	PQfinish(c);
}

/* How many of the subjects listed are head. */
static long heads_among(PGconn *c, const char *table, const char *subjects)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM %s WHERE head AND subject = "
			   "ANY('{%s}'::text[])",
			   table, subjects);
}

/* A sweep walks a bounded number of keys: the next goes on where it
 * stopped, and once past the last key the walk starts again from the
 * first, so every key is visited within a few sweeps, none skipped. */
static void test_repair_walk_goes_on(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_repair_walk", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "ABCDEF", 1);
	struct store *s = ordered_store(table, false);
	store_set_repair_walk(s, 3);
	size_t n;
	assert_int_equal(store_repair_heads(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 3);
	assert_int_equal(heads_among(c, table, "a1,b1,c1"), 3);
	/* From C again (the stop is walked twice), to E. */
	assert_int_equal(store_repair_heads(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_int_equal(heads_among(c, table, "d1,e1"), 2);
	assert_int_equal(heads_among(c, table, "f1"), 0);
	/* E and F: the end, fewer than the cap; the next walk starts over. */
	assert_int_equal(store_repair_heads(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_int_equal(heads_among(c, table, "f1"), 1);
	pgtest_exec(c, "UPDATE %s SET head = NULL WHERE subject = 'a1'", table);
	assert_int_equal(store_repair_heads(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	assert_int_equal(heads_among(c, table, "a1"), 1);
	assert_int_equal(
	    pgtest_long(c, "SELECT count(*) FROM %s WHERE head", table), 6);
	store_close(s);
	PQfinish(c);
}

/* A row's place in the table, as one number: a row written anew moves. */
static long row_place(PGconn *c, const char *table, const char *label)
{
	return pgtest_long(c,
			   "SELECT ((ctid::text::point)[0] * 100000 + "
			   "(ctid::text::point)[1])::bigint FROM %s WHERE "
			   "subject = '%s'",
			   table, label);
}

/* Classification writes the heads only: the rows behind a head keep their
 * row version and stay unclassified until the mark that finishes their
 * predecessor hands them the marker (docs/design.md §6). */
static void test_classify_writes_heads_only(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_heads_only", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "a3", "A");
	insert(c, table, "b1", "B");
	long a2 = row_place(c, table, "a2"), a3 = row_place(c, table, "a3");
	struct store *s = ordered_store(table, false);
	size_t n;
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_int_equal(row_place(c, table, "a2"), a2);
	assert_int_equal(row_place(c, table, "a3"), a3);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE head IS "
				     "NULL AND subject IN ('a2', 'a3')",
				     table),
			 2);
	expect_batch(s, "a1,b1");
	expect_batch(s, "a2");
	expect_batch(s, "a3");
	expect_batch(s, "");
	store_close(s);
	PQfinish(c);
}

/* The hand-over writes the next row anew; migration 008 leaves room in
 * each page (fillfactor 70) so that its new version, and the sent version
 * of the row before it, stay on the page of the old ones, where Postgres
 * logs only the bytes that changed, not the payload (docs/design.md §11).
 * Rows of 1 KB fill a page of a table at fillfactor 100 to the brim, so
 * without the room the next row would move to another page. */
static void test_handover_stays_on_its_page(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_page_room", table, sizeof(table));
	PGconn *c = pgtest_connect();
	assert_true(pgtest_has_reloption(c, table, "fillfactor=70"));
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, partition_key, payload) "
		    "SELECT 't', 'a' || g, 'A', decode(repeat(md5(g::text), "
		    "32), 'hex') FROM generate_series(1, 12) g",
		    table);
	long a1 = row_place(c, table, "a1"), a2 = row_place(c, table, "a2");
	assert_int_equal(a1 / 100000, a2 / 100000);
	struct store *s = ordered_store(table, false);
	expect_batch(s, "a1");
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE subject = "
				     "'a2' AND head IS NOT NULL",
				     table),
			 1);
	assert_int_equal(row_place(c, table, "a1") / 100000, a1 / 100000);
	assert_int_equal(row_place(c, table, "a2") / 100000, a2 / 100000);
	store_close(s);
	PQfinish(c);
}

/* Rows committed behind the classification's walk are made head by the
 * next classification, from the late floor, not at the next rescan: a
 * producer transaction that began before a row it now follows in seq, and
 * a redrive (both write written_by). With the rescan an hour away, the
 * walk alone would not come back to them. */
static void test_classify_reads_late_rows(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_late", table, sizeof(table));
	PGconn *c = pgtest_connect(), *late = pgtest_connect();
	pgtest_exec(late, "BEGIN");
	insert(late, table, "k1", "K");
	insert(c, table, "c1", "C");
	struct store_options o = pgtest_store_options(table);
	o.ordered = true;
	o.lease_rescan_ms = 3600 * 1000;
	struct store *s = pgtest_store(&o);
	size_t n;
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1); /* c1: k1 is not committed */
	pgtest_exec(late, "COMMIT");
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1); /* k1, below the walk */
	expect_batch(s, "c1,k1");
	char sql[256], id[64];
	snprintf(sql, sizeof(sql),
		 "SELECT id::text FROM %s WHERE subject = 'c1'", table);
	PGresult *r = PQexec(c, sql);
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	assert_int_equal(PQntuples(r), 1);
	snprintf(id, sizeof(id), "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	const char *ids[] = {id};
	struct redrive_filter f = {.ids = ids, .n_ids = 1, .sent = true};
	size_t count;
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1); /* c1 again, redriven */
	expect_batch(s, "c1");
	store_close(s);
	PQfinish(late);
	PQfinish(c);
}

static void test_redrive_refuses_to_reorder(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_redrive", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	struct store *s = ordered_store(table, false);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	expect_batch(s, "a2"); /* skip: a2 sent after a1 failed */
	size_t count;
	struct redrive_filter f = {.type = "t"};
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "--force"));
	f.force = true;
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	expect_batch(s, "a1");
	store_close(s);
	PQfinish(c);
}

/* How many pending rows of key are head now. */
static long heads(PGconn *c, const char *table, const char *key)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM %s WHERE partition_key = '%s' "
			   "AND status = 'pending' AND head",
			   table, key);
}

/* a1 failed under skip, so a2 became A's head, and a2 is held by a lease
 * of another session: redriving a1 now would let a2 out first, or (once
 * that lease ends) make a1 a second head of A. Refused, with and without
 * --force, and nothing changes; once the lease ends with a2 released, the
 * redrive puts a1 back in front. */
/* A redrive locks the key's next row only, the one row that could be
 * head: a row further behind, locked elsewhere (here by a session of the
 * test), does not refuse it, and the rows behind stay unwritten. */
static void test_redrive_locks_next_row_only(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_redrive_next", table, sizeof(table));
	PGconn *c = pgtest_connect(), *other = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "a3", "A");
	struct store *s = ordered_store(table, false);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad"); /* skip: a2 is head now */
	pgtest_exec(other, "BEGIN");
	pgtest_exec(other,
		    "SELECT 1 FROM %s WHERE subject = 'a3' FOR NO KEY UPDATE",
		    table);
	size_t count;
	struct redrive_filter f = {.type = "t"};
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	pgtest_exec(other, "COMMIT");
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE subject = "
				     "'a2' AND head = false",
				     table),
			 1);
	expect_batch(s, "a1");
	expect_batch(s, "a2");
	expect_batch(s, "a3");
	store_close(s);
	PQfinish(other);
	PQfinish(c);
}

static void test_redrive_sees_later_row_held(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_redrive_held", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "a3", "A");
	struct store *s = ordered_store(table, false);
	struct store *op = ordered_store(table, false);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	lease(s, &b); /* a2, held while it is published */
	assert_int_equal(b.n, 1);
	assert_string_equal(b.events[0].subject, "a2");
	size_t count;
	struct redrive_filter f = {.type = "t"};
	assert_int_equal(store_redrive(op, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "held by a lease"));
	f.force = true;
	assert_int_equal(store_redrive(op, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE subject = "
				     "'a1' AND status = 'failed'",
				     table),
			 1);
	/* The lease ends without a mark: a2 is pending and A's head again,
	 * and a1 goes back in front of it. */
	assert_int_equal(store_lease_abort(s, &b, err, sizeof(err)), 0);
	lease_batch_release(&b);
	f.force = false;
	assert_int_equal(store_redrive(op, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	size_t n;
	assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	assert_int_equal(heads(c, table, "A"), 1);
	expect_batch(s, "a1");
	/* The aborted lease charged a2 (settled with the next claim): a
	 * crash suspect, due after a jitter. */
	pgtest_exec(c, "UPDATE %s SET next_attempt_at = now()", table);
	expect_batch(s, "a2");
	expect_batch(s, "a3");
	store_close(op);
	store_close(s);
	PQfinish(c);
}

/* a1 failed under skip and a2 is A's head, only pending: the redrive
 * demotes a2, so A is delivered in seq order again, one head at a time. */
static void test_redrive_goes_before_later_pending(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_redrive_pending", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "a3", "A");
	insert(c, table, "b1", "B");
	struct store *s = ordered_store(table, false);
	struct lease_batch b;
	if (store_classify(s, &(size_t){0}, err, sizeof(err)) != 0)
		fail_msg("classify: %s", err);
	/* Only A's head is leased: B's waits for the next pass. */
	pgtest_exec(c, "UPDATE %s SET head = false WHERE subject = 'b1'",
		    table);
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	pgtest_exec(c, "UPDATE %s SET head = true WHERE subject = 'b1'", table);
	assert_int_equal(heads(c, table, "A"), 1); /* a2 */
	size_t count;
	struct redrive_filter f = {.type = "t"};
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	expect_batch(s, "a1,b1");
	expect_batch(s, "a2");
	expect_batch(s, "a3");
	expect_batch(s, "");
	store_close(s);
	PQfinish(c);
}

/* Replay of a sent row whose key has later rows still to go: it goes
 * before them, and a later row held by a lease refuses the replay. */
static void test_replay_goes_before_later_rows(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_replay", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "a3", "A");
	struct store *s = ordered_store(table, false);
	struct store *op = ordered_store(table, false);
	expect_batch(s, "a1");
	size_t count;
	struct redrive_filter f = {.type = "t", .sent = true};
	struct lease_batch b;
	lease(s, &b); /* a2, held */
	assert_int_equal(store_redrive(op, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_int_equal(store_lease_abort(s, &b, err, sizeof(err)), 0);
	lease_batch_release(&b);
	assert_int_equal(store_redrive(op, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	expect_batch(s, "a1");
	pgtest_exec(c, "UPDATE %s SET next_attempt_at = now()", table);
	expect_batch(s, "a2");
	expect_batch(s, "a3");
	store_close(op);
	store_close(s);
	PQfinish(c);
}

/* The progress watcher of the next test: between the first and the
 * second batch, a relay delivers k2 (its lease commits). */
struct send_between {
	PGconn *c;
	const char *table;
	int calls;
};

static bool send_k2(void *ctx, const struct store_progress_info *p)
{
	struct send_between *sb = ctx;
	(void)p;
	if (sb->calls++ == 0)
		pgtest_exec(sb->c,
			    "UPDATE %s SET status = 'sent', finished_at = "
			    "now(), head = false WHERE subject = 'k2'",
			    sb->table);
	return true;
}

/* A later row sent after the check that precedes the first batch (a
 * lease that committed while redrive ran) is seen by the batch that
 * would redrive its key's earlier row: that batch is refused and changes
 * nothing; the batches before it stay done. */
static void test_redrive_rechecks_each_batch(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_redrive_recheck", table, sizeof(table));
	PGconn *c = pgtest_connect();
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, payload, status, "
		    "finished_at) SELECT 't', 'u' || g, 'x', 'failed', now() - "
		    "interval '1 hour' FROM generate_series(1, 1000) g",
		    table);
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, partition_key, payload, "
		    "status, finished_at) VALUES ('t', 'k1', 'K', 'x', "
		    "'failed', now())",
		    table);
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, partition_key, payload, "
		    "head) VALUES ('t', 'k2', 'K', 'x', true)",
		    table);
	struct store *s = ordered_store(table, false);
	struct send_between sb = {.c = c, .table = table};
	struct store_progress watch = {.fn = send_k2, .ctx = &sb};
	size_t count;
	struct redrive_filter f = {.type = "t", .progress = &watch};
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "sent while redrive ran"));
	assert_int_equal(count, 1000);
	assert_int_equal(sb.calls, 1);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE subject = "
				     "'k1' AND status = 'failed'",
				     table),
			 1);
	store_close(s);
	PQfinish(c);
}

/* Rows failed for breaking the destination CHECK, naming the column. */
static long refused(PGconn *c, const char *table, const char *column)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM %s WHERE status = 'failed' "
			   "AND last_error LIKE '%%destination_text: %s "
			   "contains a control character%%'",
			   table, column);
}

/* Rows written before migration 004, some with control characters in
 * routing_key or exchange, classified by a relay of that time (a1 and b1
 * head), and d1 written after it and not classified yet: the first
 * classification of a session fails those rows alone, with the reason,
 * before any head moves. Other rows flow in key order: A goes on past
 * a2 (skip), B's head b1 is failed with nothing after it, u2 unkeyed. */
static void test_refused_rows_fail_alone(void **state)
{
	(void)state;
	char table[128], sql[1024];
	pgtest_fresh_table("ord_refused", table, sizeof(table));
	PGconn *c = pgtest_connect();
	snprintf(sql, sizeof(sql),
		 "INSERT INTO %s (type, subject, partition_key, exchange, "
		 "routing_key, payload) VALUES ('t', 'a1', 'A', NULL, 'k', "
		 "'x'), ('t', 'a2', 'A', NULL, 'k' || chr(10), 'x'), ('t', "
		 "'a3', 'A', NULL, 'k', 'x'), ('t', 'b1', 'B', NULL, chr(27) "
		 "|| 'k', 'x'), ('t', 'u1', NULL, NULL, 'k', 'x'), ('t', "
		 "'u2', NULL, NULL, 'k' || chr(127), 'x'); UPDATE %s SET head "
		 "= subject IN ('a1', 'b1') WHERE partition_key IS NOT NULL; "
		 "INSERT INTO %s (type, subject, partition_key, exchange, "
		 "payload) VALUES ('t', 'd1', 'D', 'ex' || chr(9), 'x')",
		 table, table, table);
	pgtest_before_004(c, table, sql);
	insert(c, table, "a4", "A");
	struct store *s = ordered_store(table, false);
	expect_batch(s, "a1,u1");
	assert_int_equal(refused(c, table, "routing_key"), 3);
	assert_int_equal(refused(c, table, "exchange"), 1);
	expect_batch(s, "a3");
	expect_batch(s, "a4");
	expect_batch(s, "");
	assert_int_equal(
	    pgtest_long(c, "SELECT count(*) FROM %s WHERE status = 'pending'",
			table),
	    0);
	store_close(s);
	PQfinish(c);
}

/* The same under block: a2, not head yet, is failed and blocks A; a1,
 * A's head, is delivered and A stops there until unblock. */
static void test_refused_row_blocks_its_key(void **state)
{
	(void)state;
	char table[128], sql[1024];
	pgtest_fresh_table("ord_refused_block", table, sizeof(table));
	PGconn *c = pgtest_connect();
	snprintf(sql, sizeof(sql),
		 "INSERT INTO %s (type, subject, partition_key, routing_key, "
		 "payload) VALUES ('t', 'a1', 'A', 'k', 'x'), ('t', 'a2', "
		 "'A', 'k' || chr(10), 'x'), ('t', 'a3', 'A', 'k', 'x'); "
		 "UPDATE %s SET head = subject = 'a1'",
		 table, table);
	pgtest_before_004(c, table, sql);
	insert(c, table, "u1", NULL);
	struct store *s = ordered_store(table, true);
	expect_batch(s, "a1,u1");
	assert_int_equal(refused(c, table, "routing_key"), 1);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s_blocked_keys b "
				     "JOIN %s t ON t.id = b.blocking_id WHERE "
				     "b.partition_key = 'A' AND t.subject = "
				     "'a2'",
				     table, table),
			 1);
	expect_batch(s, "");
	assert_int_equal(store_unblock(s, "A", false, err, sizeof(err)), 0);
	expect_batch(s, "a3");
	store_close(s);
	PQfinish(c);
}

/* A hot key's blocked rows are not in the ordered lease's path: with
 * 20k rows behind one head, other keys' heads are leased beside it and
 * the key's rows follow one per lease. (Its cost is the benchmark's.) */
static void test_hot_key_does_not_starve_others(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_hot", table, sizeof(table));
	PGconn *c = pgtest_connect();
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, partition_key, payload) "
		    "SELECT 't', 'hot' || g, 'HOT', 'x' FROM "
		    "generate_series(1, 20000) g",
		    table);
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, partition_key, payload) "
		    "SELECT 't', 'k' || g, 'K' || g, 'x' FROM "
		    "generate_series(1, 50) g",
		    table);
	struct store *s = ordered_store(table, false);
	size_t n;
	for (int i = 0; i < 30; i++)
		assert_int_equal(store_classify(s, &n, err, sizeof(err)), 0);
	pgtest_exec(c, "ANALYZE %s", table);
	struct lease_batch b;
	assert_int_equal(store_lease(s, NULL, 0, "", &b, err, sizeof(err)), 0);
	assert_int_equal(b.n, 51);
	mark_all(s, MARK_SENT, &b, NULL);
	expect_batch(s, "hot2");
	expect_batch(s, "hot3");
	store_close(s);
	PQfinish(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_one_head_per_key_in_seq_order),
	    cmocka_unit_test(test_backoff_holds_the_key),
	    cmocka_unit_test(test_skip_moves_on),
	    cmocka_unit_test(test_block_unblock_and_cleaner),
	    cmocka_unit_test(test_unblock_redrive),
	    cmocka_unit_test(test_sweeper_repairs_lost_heads),
	    cmocka_unit_test(test_repair_visits_every_key),
	    cmocka_unit_test(test_repair_walk_goes_on),
	    cmocka_unit_test(test_classify_writes_heads_only),
	    cmocka_unit_test(test_classify_reads_late_rows),
	    cmocka_unit_test(test_handover_stays_on_its_page),
	    cmocka_unit_test(test_redrive_refuses_to_reorder),
	    cmocka_unit_test(test_redrive_sees_later_row_held),
	    cmocka_unit_test(test_redrive_locks_next_row_only),
	    cmocka_unit_test(test_redrive_goes_before_later_pending),
	    cmocka_unit_test(test_replay_goes_before_later_rows),
	    cmocka_unit_test(test_redrive_rechecks_each_batch),
	    cmocka_unit_test(test_refused_rows_fail_alone),
	    cmocka_unit_test(test_refused_row_blocks_its_key),
	    cmocka_unit_test(test_hot_key_does_not_starve_others),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
