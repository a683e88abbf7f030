/* SPDX-License-Identifier: MIT */
/*
 * Ordered mode in the store against a real Postgres: one row per key out
 * at a time in seq order (the key lock), the key walk's turns, rows of
 * older relays' markers, crash suspects, skip and block, unblock, the
 * cleaner sparing blocking rows, redrive refusals.
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

#include "pgtest.h"
#include "store/store.h"
#include "store/store_test.h"

static char err[1024];

/* Sent rows kept a day (OUTBOX_RETENTION's default), for a redrive's
 * order check. */
#define DAY_MS INT64_C(86400000)

/* How often a session rebuilds its key map (OUTBOX_LEASE_RESCAN_INTERVAL):
 * the relay's default, or 0, which walks key_idx at every lease (no key
 * map); the tests of the walk run both ways. */
static int64_t rescan_ms = 5000;

static struct store_options ordered_options(const char *table)
{
	struct store_options o = pgtest_store_options(table);
	o.ordered = true;
	o.lease_rescan_ms = rescan_ms;
	return o;
}

static struct store *ordered_store(const char *table, bool block)
{
	struct store_options o = ordered_options(table);
	o.block_on_failure = block;
	return pgtest_store(&o);
}

/* Options of an ordered store whose key map is built once in a test: the
 * next build is an hour on. */
static struct store_options map_options(const char *table)
{
	struct store_options o = ordered_options(table);
	o.lease_rescan_ms = 3600 * 1000;
	return o;
}

static struct store *map_store(const char *table)
{
	struct store_options o = map_options(table);
	return pgtest_store(&o);
}

static void lease(struct store *s, struct lease_batch *b)
{
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

/* Leases a batch and checks its labels against want. */
static void lease_labels(struct store *s, struct lease_batch *b,
			 const char *want)
{
	lease(s, b);
	const char *labels[128];
	for (size_t i = 0; i < b->n; i++)
		labels[i] = b->events[i].subject;
	qsort(labels, b->n, sizeof(*labels), cmp_str);
	char got[1024] = "";
	for (size_t i = 0; i < b->n; i++) {
		strcat(got, i ? "," : "");
		strcat(got, labels[i]);
	}
	if (strcmp(got, want) != 0)
		fail_msg("leased [%s], want [%s]", got, want);
}

static void expect_batch(struct store *s, const char *want)
{
	struct lease_batch b;
	lease_labels(s, &b, want);
	mark_all(s, MARK_SENT, &b, NULL);
}

/* Leases a batch, checks it, and lets it go untouched: no attempt is
 * charged and every row stays as it was. */
static void expect_released(struct store *s, const char *want)
{
	struct lease_batch b;
	lease_labels(s, &b, want);
	if (store_lease_abort(s, &b, err, sizeof(err)) != 0)
		fail_msg("abort: %s", err);
	lease_batch_release(&b);
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

/* rounds rows of each one-letter key in keys, a row of each in turn (a
 * key's rows come strlen(keys) apart in seq), labelled by the lower-case
 * letter and their place: "a1", "b1", "a2"... */
static void insert_rounds(PGconn *c, const char *table, const char *keys,
			  int rounds)
{
	for (int i = 1; i <= rounds; i++)
		for (const char *k = keys; *k; k++) {
			char label[8], key[2] = {*k, '\0'};
			snprintf(label, sizeof(label), "%c%d", *k + 32, i);
			insert(c, table, label, key);
		}
}

/* per rows of each one-letter key in keys, a key's rows one after the
 * other: "a1", "a2", "b1"... */
static void insert_keys(PGconn *c, const char *table, const char *keys, int per)
{
	for (const char *k = keys; *k; k++) {
		char key[2] = {*k, '\0'};
		insert_rounds(c, table, key, per);
	}
}

static void test_one_row_per_key_in_seq_order(void **state)
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

	/* unblock --skip: a2 goes, a3 follows. */
	assert_int_equal(store_unblock(s, "A", false, err, sizeof(err)), 0);
	assert_string_equal(err, "; its blocking row stays failed");
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
	/* The blocking row no longer failed (set by hand here): nothing to
	 * redrive, so the block stays (lifted, the key would go on without
	 * the row the operator asked for). */
	pgtest_exec(c, "UPDATE %s SET status = 'sent' WHERE subject = 'a1'",
		    table);
	assert_int_equal(store_unblock(s, "A", true, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "no longer failed"));
	pgtest_exec(c, "UPDATE %s SET status = 'failed' WHERE subject = 'a1'",
		    table);
	expect_batch(s, "");
	assert_int_equal(store_unblock(s, "A", true, err, sizeof(err)), 0);
	assert_int_equal(pgtest_long(c,
				     "SELECT attempts FROM %s WHERE "
				     "subject = 'a1'",
				     table),
			 0);
	expect_batch(s, "a1");
	expect_batch(s, "a2");

	/* --skip of a block whose row is pending again (put back by hand,
	 * or by the plain redrive of a version that lifted no block): said
	 * so, where "its failed row stays failed" was printed, and the row
	 * goes first. */
	insert(c, table, "a3", "A");
	insert(c, table, "a4", "A");
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	pgtest_exec(c,
		    "UPDATE %s SET status = 'pending', finished_at = NULL, "
		    "next_attempt_at = now(), attempts = 0, head = NULL, "
		    "written_by = pg_current_xact_id() WHERE subject = 'a3'",
		    table);
	assert_int_equal(store_unblock(s, "A", false, err, sizeof(err)), 0);
	if (!strstr(err, "is pending, not failed (redriven since), and goes "
			 "first"))
		fail_msg("unblock --skip said: %s", err);
	expect_batch(s, "a3");
	expect_batch(s, "a4");
	store_close(s);
	PQfinish(c);
}

/* A plain redrive of the failed row that blocks its key lifts the block,
 * as `unblock --redrive` does: the lease holds back only the rows after
 * the blocking row, so that row went out again while the rest of its key
 * stayed blocked for good. A later row that failed ahead of its turn
 * blocks the key in turn. */
static void test_redrive_of_blocking_row_lifts_block(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_redrive_block", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "a3", "A");
	insert(c, table, "a4", "A");
	struct store *s = ordered_store(table, true);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	expect_batch(s, "");
	/* a3 failed ahead of its turn (a row the destination CHECK
	 * refused, failed before a session's first lease). */
	pgtest_exec(c,
		    "UPDATE %s SET status = 'failed', finished_at = now(), "
		    "last_error = 'refused' WHERE subject = 'a3'",
		    table);
	char blocked[160];
	snprintf(blocked, sizeof(blocked), "%.*soutbox_events_blocked_keys",
		 (int)(strlen(table) - strlen("outbox_events")), table);
	struct redrive_filter f = {.type = "t", .sent_kept_ms = DAY_MS};
	pgtest_exec(c, "UPDATE %s SET type = 'other' WHERE subject = 'a3'",
		    table);
	size_t count;
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s b JOIN %s t ON "
				     "t.id = b.blocking_id WHERE "
				     "t.subject = 'a3'",
				     blocked, table),
			 1);
	expect_batch(s, "a1");
	expect_batch(s, "a2");
	expect_batch(s, "");
	/* Redriven in turn, a3 lifts its own block and the key goes on. */
	f.type = "other";
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	assert_int_equal(pgtest_long(c, "SELECT count(*) FROM %s", blocked), 0);
	expect_batch(s, "a3");
	expect_batch(s, "a4");
	store_close(s);
	PQfinish(c);
}

/* A redrive without OUTBOX_ORDERING=partition (an operator's shell) of a
 * table whose relays record it in the registry: refused, dry run too,
 * nothing moved. It took the plain way, which neither kept the key's
 * order nor lifted the block of the redriven blocking row, so the key's
 * later rows stayed blocked for good. Beside relays that record none,
 * it goes. */
static void test_unordered_redrive_refused_beside_ordered_relays(void **state)
{
	(void)state;
	char table[128], blocked[160];
	pgtest_fresh_table("ord_redrive_shell", table, sizeof(table));
	snprintf(blocked, sizeof(blocked), "%.*soutbox_events_blocked_keys",
		 (int)(strlen(table) - strlen("outbox_events")), table);
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	struct store *s = ordered_store(table, true);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	struct store_kept kept = {.sent_ms = DAY_MS, .failed_ms = 0};
	if (store_admin_heartbeat(s, "ordered/1", "x", kept, false, true, err,
				  sizeof(err)) != 0)
		fail_msg("heartbeat: %s", err);

	struct store_options po = pgtest_store_options(table);
	struct store *plain = pgtest_store(&po);
	struct redrive_filter f = {.type = "t", .sent_kept_ms = DAY_MS};
	size_t count = 9;
	for (int dry = 0; dry < 2; dry++) {
		f.dry_run = dry;
		assert_int_equal(
		    store_redrive(plain, &f, &count, err, sizeof(err)),
		    STORE_REFUSED);
		if (!strstr(err, "relay ordered/1 records "
				 "OUTBOX_ORDERING=partition"))
			fail_msg("refused for: %s", err);
	}
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE status = "
				     "'failed'",
				     table),
			 1);
	assert_int_equal(pgtest_long(c, "SELECT count(*) FROM %s", blocked), 1);

	/* Every relay stopped (their rows gone from the registry): the
	 * blocked key still says an ordered relay ran, and the plain way
	 * would leave it blocked for good. */
	pgtest_exec(c, "DELETE FROM %s_replicas", table);
	assert_int_equal(store_redrive(plain, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	if (!strstr(err, "key A of ") || !strstr(err, "is blocked"))
		fail_msg("refused for: %s", err);
	/* No registry at all (a table made by hand): likewise. */
	pgtest_exec(c, "ALTER TABLE %s_replicas RENAME TO replicas_away",
		    table);
	int got = store_redrive(plain, &f, &count, err, sizeof(err));
	if (got != STORE_REFUSED || !strstr(err, "is blocked"))
		fail_msg("without a registry: %d %s", got, err);
	pgtest_exec(c,
		    "ALTER TABLE %.*sreplicas_away RENAME TO "
		    "outbox_events_replicas",
		    (int)(strlen(table) - strlen("outbox_events")), table);

	/* The ordered way lifts the block; the key goes on in order. */
	f.dry_run = false;
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	assert_int_equal(pgtest_long(c, "SELECT count(*) FROM %s", blocked), 0);
	expect_batch(s, "a1");
	expect_batch(s, "a2");

	/* No registry and no block (a table made by hand): the plain
	 * redrive goes, where its registry read failed it (42P01). */
	pgtest_exec(c, "ALTER TABLE %s_replicas RENAME TO replicas_away",
		    table);
	assert_int_equal(store_redrive(plain, &f, &count, err, sizeof(err)), 0);
	pgtest_exec(c,
		    "ALTER TABLE %.*sreplicas_away RENAME TO "
		    "outbox_events_replicas",
		    (int)(strlen(table) - strlen("outbox_events")), table);

	/* Relays that record none: the plain redrive goes. */
	pgtest_exec(c, "DELETE FROM %s_replicas", table);
	if (store_admin_heartbeat(plain, "plain/1", "x", kept, false, true, err,
				  sizeof(err)) != 0)
		fail_msg("heartbeat: %s", err);
	pgtest_exec(c,
		    "UPDATE %s SET status = 'failed', finished_at = now(), "
		    "last_error = 'x' WHERE subject = 'a2'",
		    table);
	assert_int_equal(store_redrive(plain, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	store_close(plain);
	store_close(s);
	PQfinish(c);
}

/* The buffer reads of table's written_by index so far, as the statistics
 * count them once the sessions that read them flushed them. */
static long written_idx_reads(PGconn *c, const char *table)
{
	return pgtest_long(c,
			   "SELECT coalesce(sum(idx_blks_read + idx_blks_hit), "
			   "0) FROM pg_statio_all_indexes WHERE indexrelid = "
			   "'%s_written_idx'::regclass",
			   table);
}

/* Closes s once its sessions flushed their statistics (a session sends
 * most of them only as it ends, which store_close() does not wait for),
 * and returns written_idx_reads() once the count stands still. */
static long close_and_read(struct store *s, PGconn *c, const char *table)
{
	PGconn *own[2] = {store_conn(s), store_claim_conn(s)};
	for (int i = 0; i < 2; i++)
		if (own[i])
			PQclear(PQexec(own[i],
				       "SELECT pg_stat_force_next_flush()"));
	store_close(s);
	long before = -1, now = written_idx_reads(c, table);
	for (int i = 0; i < 50 && now != before; i++) {
		usleep(500000);
		before = now;
		now = written_idx_reads(c, table);
	}
	return now;
}

/* Rows of a restored copy carry written_by from the other cluster's
 * counter, past this one's: the key map's discovery by writer leaves them
 * to its builds, as rows without a writer. Read by writer, every lease
 * fetched and folded all of them (here 20,000 keyed rows not yet due, 10
 * leases), its cost the restored backlog's size. */
static void test_key_map_passes_restored_writers(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_restored", table, sizeof(table));
	PGconn *c = pgtest_connect();
	/* Loaded on a session of its own, whose statistics (the inserts'
	 * own reads of the index, about 40,000) are flushed before the
	 * count starts: counted late, they read as the leases'. */
	PGconn *loader = pgtest_connect();
	pgtest_exec(
	    loader,
	    "INSERT INTO %s (type, subject, partition_key, payload, "
	    "next_attempt_at, written_by) SELECT 't', 'old', 'K' || "
	    "(i %% 20), 'x', now() + interval '1 day', "
	    "(pg_snapshot_xmax(pg_current_snapshot())::text::numeric "
	    "+ 1000000000)::text::xid8 FROM generate_series(1, 20000) i",
	    table);
	pgtest_exec(loader, "ANALYZE %s", table);
	pgtest_exec(loader, "SELECT pg_stat_force_next_flush()");
	PQfinish(loader);
	struct store *s = map_store(table);
	insert(c, table, "n0", "N0");
	expect_batch(s, "n0");
	long before = close_and_read(s, c, table);
	s = map_store(table);
	/* The session's first lease builds the map; each after it
	 * discovers keys by writer from its floor. */
	char label[16], key[16];
	for (int i = 1; i <= 11; i++) {
		snprintf(label, sizeof(label), "n%d", i);
		snprintf(key, sizeof(key), "N%d", i);
		insert(c, table, label, key);
		expect_batch(s, label);
	}
	long after = close_and_read(s, c, table);
	/* Measured: read by writer, about 200 buffer reads in the ten
	 * leases; passed over, 24. */
	if (after - before >= 100)
		fail_msg(
		    "10 leases made %ld buffer reads of the written_by index",
		    after - before);
	PQfinish(c);
}

/* The seq of the row labelled label. */
static long seq_of(PGconn *c, const char *table, const char *label)
{
	return pgtest_long(c, "SELECT seq FROM %s WHERE subject = '%s'", table,
			   label);
}

/* The seqs of key A's rows a1..a4 (insert_keys), in seq[1..4]. */
static void key_a_seqs(PGconn *c, const char *table, long seq[5])
{
	for (int i = 1; i <= 4; i++) {
		char label[8];
		snprintf(label, sizeof(label), "a%d", i);
		seq[i] = seq_of(c, table, label);
	}
}

/* b's one row marked sent, then its lease rolled back (its attempt
 * charged): a mark that never commits. */
static void sent_then_rolled_back(struct store *s, struct lease_batch *b)
{
	const char *ids[1] = {b->events[0].id};
	struct mark_result r;
	assert_int_equal(
	    store_mark(s, MARK_SENT, ids, NULL, 1, &r, err, sizeof(err)), 0);
	assert_int_equal(store_lease_rollback_charged(s, b, err, sizeof(err)),
			 0);
	lease_batch_release(b);
}

/* Two stores of one process on one table (one key turn), their maps'
 * next builds an hour away: a floor one moves past a row it finished
 * moves in the other (docs/design.md §6, "The key map", *Shared moves*). */
struct store_pair {
	struct store_key_turn turn;
	struct store *s1, *s2;
};

static void pair_open(struct store_pair *p, const char *table)
{
	assert_int_equal(store_key_turn_init(&p->turn), 0);
	struct store_options o = map_options(table);
	o.key_turn = &p->turn;
	p->s1 = pgtest_store(&o);
	p->s2 = pgtest_store(&o);
}

static void pair_close(struct store_pair *p)
{
	store_close(p->s1);
	store_close(p->s2);
	store_key_turn_destroy(&p->turn);
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

/* A key's first row held by one lease keeps every later row of the key
 * from every other lease (another session here, as another replica), and
 * the key goes on once that row is finished; other keys are not held up.
 * Nothing is written to say so: the rows behind keep their version. */
static void test_held_row_holds_its_key(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_held", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "AB", 2);
	insert(c, table, "c1", "C");
	long a2 = row_place(c, table, "a2");
	struct store *s = ordered_store(table, false);
	struct store *other = ordered_store(table, false);
	struct lease_batch b;
	lease_labels(s, &b, "a1,b1,c1");
	expect_batch(other, "");
	assert_int_equal(row_place(c, table, "a2"), a2);
	mark_all(s, MARK_SENT, &b, NULL);
	expect_batch(other, "a2,b2");
	expect_batch(s, "");
	store_close(other);
	store_close(s);
	PQfinish(c);
}

/* Every row but the one labelled keep waits in backoff for an hour (a
 * broker outage's backlog). */
static void backoff_all_but(PGconn *c, const char *table, const char *keep)
{
	pgtest_exec(c,
		    "UPDATE %s SET next_attempt_at = now() + interval '1 hour' "
		    "WHERE subject <> '%s'",
		    table, keep);
}

/* The walk goes on from the key where the last lease stopped and comes
 * round to the first, so with more keys than a batch every key gets its
 * turn: keys a batch could not take are not passed over again and again
 * by the keys that sort first. With the key map and without. */
static void walk_gives_every_key_its_turn(void)
{
	char table[128];
	pgtest_fresh_table("ord_turns", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "ABCDE", 2);
	struct store_options o = ordered_options(table);
	o.batch_size = 2;
	struct store *s = pgtest_store(&o);
	expect_released(s, "a1,b1");
	expect_released(s, "c1,d1");
	expect_released(s, "a1,e1");
	expect_released(s, "b1,c1");
	expect_batch(s, "d1,e1");
	expect_batch(s, "a1,b1");
	expect_batch(s, "c1,d2");
	store_close(s);
	PQfinish(c);
}

static void test_walk_gives_every_key_its_turn(void **state)
{
	(void)state;
	walk_gives_every_key_its_turn();
	rescan_ms = 0;
	walk_gives_every_key_its_turn();
	rescan_ms = 5000;
}

/* A walk steps to at most the cap's number of keys, and the next goes
 * on from where it stopped: with every key's first row in backoff but
 * F's (a broker outage's backlog, here with a cap of 2 for 6 keys), two
 * leases walk A-B and C-D and find nothing, the third reaches F. With
 * the key map (its window) and without. */
static void walk_stops_at_its_cap(void)
{
	char table[128];
	pgtest_fresh_table("ord_walk_cap", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "ABCDEF", 1);
	backoff_all_but(c, table, "f1");
	struct store *s = ordered_store(table, false);
	store_set_key_walk_cap(s, 2);
	expect_batch(s, "");
	expect_batch(s, "");
	expect_batch(s, "f1");
	pgtest_exec(c, "UPDATE %s SET next_attempt_at = now()", table);
	expect_batch(s, "a1,b1");
	expect_batch(s, "c1,d1");
	expect_batch(s, "e1");
	store_close(s);
	PQfinish(c);
}

static void test_walk_stops_at_its_cap(void **state)
{
	(void)state;
	walk_stops_at_its_cap();
	rescan_ms = 0;
	walk_stops_at_its_cap();
	rescan_ms = 5000;
}

/* The key map's window is four batches of keys (8 here), and a lease
 * that walked all of it without filling its batch makes the next one
 * four times larger: with 20 keys whose first rows wait in backoff but
 * T's, the first lease walks A-H and finds nothing, the second walks the
 * rest of the map and finds t1 (an unchanging window would need a third
 * lease). */
static void test_key_window_grows_when_nothing_is_due(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_window", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "ABCDEFGHIJKLMNOPQRST", 1);
	backoff_all_but(c, table, "t1");
	struct store_options o = ordered_options(table);
	o.batch_size = 2;
	struct store *s = pgtest_store(&o);
	expect_batch(s, "");
	expect_batch(s, "t1");
	store_close(s);
	PQfinish(c);
}

/* The stores of one relay share a key turn (store.h): a lease's walk of
 * the key map begins past the key the latest lease of any of them will
 * end on, not behind its own previous batch, where the keys another
 * store took since would be stepped over. Batches of 3, windows of 4
 * keys (the cap), 16 keys of one row each, G, H and L in backoff. With a
 * store's own place S2 would walk A-D past S1's locked a1-c1 to d1
 * alone, and S1's next walk D-G past S2's d1-f1 to nothing. S1's second
 * walk ends on J, past I where a full batch would have ended, and no
 * lease began in between, so the turn moves on to J: S2 walks K-N, where
 * from I it would walk J-M past S1's locked j1 and L to k1 and m1. */
static void test_key_turn_shared(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_turn", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "ABCDEFGHIJKLMNOP", 1);
	pgtest_exec(c,
		    "UPDATE %s SET next_attempt_at = now() + interval '1 "
		    "hour' WHERE subject IN ('g1', 'h1', 'l1')",
		    table);
	struct store_key_turn turn;
	assert_int_equal(store_key_turn_init(&turn), 0);
	struct store_options o = ordered_options(table);
	o.batch_size = 3;
	o.key_turn = &turn;
	struct store *s1 = pgtest_store(&o), *s2 = pgtest_store(&o);
	store_set_key_walk_cap(s1, 4);
	store_set_key_walk_cap(s2, 4);
	struct lease_batch b1, b2;
	lease_labels(s1, &b1, "a1,b1,c1");
	lease_labels(s2, &b2, "d1,e1,f1");
	mark_all(s1, MARK_SENT, &b1, NULL);
	lease_labels(s1, &b1, "i1,j1");
	mark_all(s2, MARK_SENT, &b2, NULL);
	lease_labels(s2, &b2, "k1,m1,n1");
	mark_all(s1, MARK_SENT, &b1, NULL);
	mark_all(s2, MARK_SENT, &b2, NULL);
	store_close(s1);
	store_close(s2);
	store_key_turn_destroy(&turn);
	PQfinish(c);
}

/* Rows an older relay's head marker left (a rolling upgrade): head true
 * on a row behind its key's first, false on the first, an older relay's
 * row lease in flight. The key lock reads none of the markers: each
 * key's first live row goes, in seq order, and a key whose first row is
 * out under the row lease waits for it. */
static void test_markers_of_older_relays_change_nothing(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_markers", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "ABC", 2);
	pgtest_exec(c,
		    "UPDATE %s SET head = subject IN ('a2', 'b2') WHERE "
		    "partition_key IS NOT NULL",
		    table);
	pgtest_exec(c,
		    "UPDATE %s SET status = 'in_flight', lease_id = "
		    "gen_random_uuid(), leased_at = now(), lease_expires_at = "
		    "now() + interval '1 hour' WHERE subject = 'c1'",
		    table);
	struct store *s = ordered_store(table, false);
	expect_batch(s, "a1,b1");
	expect_batch(s, "a2,b2");
	expect_batch(s, "");
	pgtest_exec(c,
		    "UPDATE %s SET status = 'sent', finished_at = now() WHERE "
		    "subject = 'c1'",
		    table);
	expect_batch(s, "c2");
	store_close(s);
	PQfinish(c);
}

/* Crash suspects go one a batch, keyed or not, ahead of the rest, and a
 * suspect that is its key's first row holds its key like any other: a1
 * and b1 are suspects of keys A and B, u1 an unkeyed one. */
static void test_suspects_go_alone_in_key_order(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_suspects", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "AB", 2);
	insert(c, table, "c1", "C");
	insert(c, table, "u1", NULL);
	pgtest_exec(c,
		    "UPDATE %s SET suspect = true WHERE subject IN ('a1', "
		    "'b1', 'u1')",
		    table);
	struct store *s = ordered_store(table, false);
	expect_batch(s, "c1,u1");
	expect_batch(s, "a1");
	expect_batch(s, "a2,b1");
	expect_batch(s, "b2");
	store_close(s);
	PQfinish(c);
}

/* Rows committed late, by a producer transaction that began before rows
 * already delivered, are delivered: a keyed one by the key walk, an
 * unkeyed one (below the scan floor u1 set, with the rescan an hour
 * away) by the late scan; and a redriven row goes again. */
static void test_late_rows_and_redrive_are_leased(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_late", table, sizeof(table));
	PGconn *c = pgtest_connect(), *late = pgtest_connect();
	pgtest_exec(late, "BEGIN");
	insert(late, table, "k1", "K");
	insert(late, table, "u0", NULL);
	insert(c, table, "c1", "C");
	insert(c, table, "u1", NULL);
	struct store *s = map_store(table);
	expect_batch(s, "c1,u1");
	pgtest_exec(late, "COMMIT");
	expect_batch(s, "k1,u0");
	char sql[256], id[64];
	snprintf(sql, sizeof(sql),
		 "SELECT id::text FROM %s WHERE subject = 'c1'", table);
	PGresult *r = PQexec(c, sql);
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	assert_int_equal(PQntuples(r), 1);
	snprintf(id, sizeof(id), "%s", PQgetvalue(r, 0, 0));
	PQclear(r);
	const char *ids[] = {id};
	struct redrive_filter f = {
	    .ids = ids, .n_ids = 1, .sent = true, .sent_kept_ms = DAY_MS};
	size_t count;
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	expect_batch(s, "c1");
	store_close(s);
	PQfinish(late);
	PQfinish(c);
}

/* seq's sequence behind the table's rows (docs/design.md §6: a copy made
 * by logical replication, `migrate` not run on it): an ordered store
 * refuses the table when it opens it and when it connects again, and
 * takes it once the sequence is past the rows; an unordered one does not
 * look; a role that may not read the sequence is told, not refused. */
static void test_seq_behind_its_rows_refused(void **state)
{
	(void)state;
	char table[128], role[96], conninfo[512];
	pgtest_fresh_table("ord_seq_behind", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "AB", 3);
	const char *back = "SELECT setval(pg_get_serial_sequence('%s', "
			   "'seq'), %d)";
	struct store_options o = ordered_options(table);
	struct store *s = pgtest_store(&o);
	pgtest_exec(c, back, table, 2);
	assert_int_not_equal(store_reconnect(s, err, sizeof(err)), 0);
	if (!strstr(err, "rows up to seq 6 past its sequence, at 2") ||
	    !strstr(err, "run `outbox-relay migrate`"))
		fail_msg("reconnected, or refused for: %s", err);
	struct store *refused = NULL;
	assert_int_not_equal(store_open(&refused, &o, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "past its sequence"));
	store_close(refused);

	struct store_options unordered = pgtest_store_options(table);
	store_close(pgtest_store(&unordered));

	snprintf(role, sizeof(role), "seq_role_%d", (int)getpid());
	pgtest_exec(c, "CREATE ROLE %s LOGIN PASSWORD 'seq-secret'", role);
	pgtest_exec(c, "GRANT USAGE ON SCHEMA %.*s TO %s",
		    (int)(strchr(table, '.') - table), table, role);
	pgtest_exec(c, "GRANT SELECT ON ALL TABLES IN SCHEMA %.*s TO %s",
		    (int)(strchr(table, '.') - table), table, role);
	snprintf(conninfo, sizeof(conninfo),
		 "host=%s port=%s dbname=%s user=%s password=seq-secret",
		 PQhost(c), PQport(c), PQdb(c), role);
	struct store_options blind = o;
	blind.conninfo = conninfo;
	blind.prepare = false;
	store_close(pgtest_store(&blind));
	pgtest_exec(c, "DROP OWNED BY %s; DROP ROLE %s", role, role);

	pgtest_exec(c, back, table, 6);
	if (store_reconnect(s, err, sizeof(err)) != 0)
		fail_msg("refused with the sequence caught up: %s", err);
	expect_batch(s, "a1,b1");
	store_close(s);
	PQfinish(c);
}

/* migrate's move of seq's sequence on a copy (docs/design.md §6) takes
 * the rows' highest seq under a lock that waits for the table's writers:
 * a row replication was still writing when migrate first read the table
 * (its seq 40, its own; committed 600 ms later) is counted, so the
 * sequence ends past it, not at the 6 of the rows committed before, and
 * the next row's seq comes after it. */
static void test_seq_moved_past_a_row_in_flight(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_seq_flight", table, sizeof(table));
	PGconn *c = pgtest_connect(), *apply = pgtest_connect();
	insert_keys(c, table, "AB", 3);
	pgtest_exec(c, "SELECT setval(pg_get_serial_sequence('%s', 'seq'), 2)",
		    table);
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "BEGIN; INSERT INTO %s (seq, type, subject, partition_key, "
		 "payload) OVERRIDING SYSTEM VALUE VALUES (40, 't', 'c1', 'C', "
		 "'x'); SELECT pg_sleep(0.6); COMMIT",
		 table);
	assert_int_equal(PQsendQuery(apply, sql), 1);
	/* Migrate starts once the insert holds its lock. */
	for (int i = 0; i < 100 && pgtest_long(c,
					       "SELECT count(*) FROM pg_locks "
					       "WHERE pid = %d AND relation = "
					       "'%s'::regclass AND mode = "
					       "'RowExclusiveLock'",
					       PQbackendPID(apply), table) == 0;
	     i++)
		clock_sleep_ms(10);
	struct store_options o = ordered_options(table);
	assert_int_equal(store_migrate(&o, false, NULL, err, sizeof(err)), 0);
	PGresult *r;
	while ((r = PQgetResult(apply)) != NULL) {
		if (PQresultStatus(r) == PGRES_FATAL_ERROR)
			fail_msg("the replication's insert: %s",
				 PQresultErrorMessage(r));
		PQclear(r);
	}
	assert_int_equal(
	    pgtest_long(c,
			"SELECT pg_sequence_last_value(pg_get_serial_sequence("
			"'%s', 'seq'))",
			table),
	    40);
	insert(c, table, "c2", "C");
	assert_int_equal(
	    pgtest_long(c, "SELECT seq FROM %s WHERE subject = 'c2'", table),
	    41);
	PQfinish(apply);
	PQfinish(c);
}

/* The key map (docs/design.md §6): a row committed late below its key's
 * floor, by a producer transaction that took its seq before rows of the
 * key already delivered and committed after them, is found by the
 * lease's read of the rows written since its previous lease, not left
 * for the next build (an hour away here): k1 goes before k3, whose key
 * kept its floor at k2; and j1 is found though its key left the map,
 * found with no live row while j1 was not yet committed. */
static void test_late_row_below_a_keys_floor(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_below_floor", table, sizeof(table));
	PGconn *c = pgtest_connect(), *late = pgtest_connect();
	pgtest_exec(late, "BEGIN");
	insert(late, table, "k1", "K");
	insert(c, table, "k2", "K");
	insert(c, table, "k3", "K");
	struct store *s = map_store(table);
	expect_batch(s, "k2");
	pgtest_exec(late, "COMMIT");
	expect_batch(s, "k1");
	expect_batch(s, "k3");
	pgtest_exec(late, "BEGIN");
	insert(late, table, "j1", "J");
	insert(c, table, "j2", "J");
	expect_batch(s, "j2");
	expect_batch(s, "");
	pgtest_exec(late, "COMMIT");
	expect_batch(s, "j1");
	store_close(s);
	PQfinish(late);
	PQfinish(c);
}

/* A row made live again by hand keeps its writer, so the lease's read of
 * the rows written since its previous lease does not meet it: the
 * session's map still puts its key's floor past it, and the next build
 * of a map (a session's first lease here; each rescan, and after a
 * reconnect) finds it first of its key. The redrive command writes the
 * writer (test_late_rows_and_redrive_are_leased). */
static void test_rows_live_again_by_hand_wait_for_a_build(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_by_hand", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "A", 3);
	struct store *s = map_store(table);
	expect_batch(s, "a1");
	expect_released(s, "a2");
	pgtest_exec(c,
		    "UPDATE %s SET status = 'pending', finished_at = NULL "
		    "WHERE subject = 'a1'",
		    table);
	store_close(s);
	s = map_store(table);
	expect_batch(s, "a1");
	expect_batch(s, "a2");
	store_close(s);
	PQfinish(c);
}

/* Key A's a1 failed (under skip), then a2 sent after it, in a fresh
 * table of prefix: an ordered store on it, and *c a connection. */
static struct store *a1_failed_a2_sent(const char *prefix, char *table,
				       size_t len, PGconn **c)
{
	pgtest_fresh_table(prefix, table, len);
	*c = pgtest_connect();
	insert(*c, table, "a1", "A");
	insert(*c, table, "a2", "A");
	struct store *s = ordered_store(table, false);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	expect_batch(s, "a2");
	return s;
}

/* f redrives a1 alone, which the next lease takes; then s and c close. */
static void redrive_a1_and_close(struct store *s,
				 const struct redrive_filter *f, PGconn *c)
{
	size_t count;
	assert_int_equal(store_redrive(s, f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
	expect_batch(s, "a1");
	store_close(s);
	PQfinish(c);
}

static void test_redrive_refuses_to_reorder(void **state)
{
	(void)state;
	char table[128];
	PGconn *c;
	struct store *s =
	    a1_failed_a2_sent("ord_redrive", table, sizeof(table), &c);
	size_t count;
	struct redrive_filter f = {.type = "t", .sent_kept_ms = DAY_MS};
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

/* A later row of the key sent and deleted since (no history kept, or
 * over the retention) leaves no row the check could see: a keyed row
 * finished longer ago than sent rows are kept is refused without
 * --force, whatever is left of its key. */
static void test_redrive_refuses_past_retention(void **state)
{
	(void)state;
	char table[128];
	PGconn *c;
	struct store *s =
	    a1_failed_a2_sent("ord_redrive_gone", table, sizeof(table), &c);
	/* a2 gone, as the mark of a relay without history deletes it. */
	pgtest_exec(c, "DELETE FROM %s WHERE subject = 'a2'", table);
	size_t count;
	struct redrive_filter f = {.type = "t", .sent_kept_ms = 0};
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "may have been sent and deleted"));
	assert_non_null(strstr(err, "no history"));
	/* With history kept a day: a1 failed just now, so a row of its key
	 * sent after it would still be there; gone by hand, it is not seen
	 * (the check trusts the cleaner's retention). Failed two days ago,
	 * refused. */
	pgtest_exec(c,
		    "UPDATE %s SET finished_at = now() - interval '2 days' "
		    "WHERE subject = 'a1'",
		    table);
	f.sent_kept_ms = DAY_MS;
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "longer ago than sent rows are kept"));
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE subject = "
				     "'a1' AND status = 'failed'",
				     table),
			 1);
	pgtest_exec(c, "UPDATE %s SET finished_at = now() WHERE subject = 'a1'",
		    table);
	redrive_a1_and_close(s, &f, c);
}

/* The retention the check goes by is the shorter of the relays' (each
 * records its own in the registry) and the command's own
 * OUTBOX_RETENTION: an operator's shell with the default day, beside
 * relays that keep no history, let a row whose key's later row was sent
 * and deleted go out after it. The command's own still bounds it (a relay
 * that stopped cleanly left the registry): a row two days old goes beside
 * relays of a week only when the command says a week too. */
static void test_redrive_goes_by_relays_retention(void **state)
{
	(void)state;
	char table[128], reg[160];
	PGconn *c;
	struct store *s =
	    a1_failed_a2_sent("ord_redrive_relays", table, sizeof(table), &c);
	snprintf(reg, sizeof(reg), "%s_replicas", table);
	/* The relays below are seen an hour ahead: alive however slowly
	 * the test runs. */
	pgtest_exec(c, "DELETE FROM %s WHERE subject = 'a2'", table);
	pgtest_exec(c,
		    "UPDATE %s SET finished_at = now() - interval '2 hours' "
		    "WHERE subject = 'a1'",
		    table);
	pgtest_exec(c,
		    "INSERT INTO %s (id, version, started_at, last_seen_at, "
		    "state, protocol, retention_ms) VALUES ('r/1', 'x', now(), "
		    "now() + interval '1 hour', 'alive', 1, 0)",
		    reg);
	size_t count;
	struct redrive_filter f = {.type = "t", .sent_kept_ms = DAY_MS};
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "no history"));

	/* A relay keeping a week beside one of an older version, which
	 * records none: the shorter of the week and the command's day, and
	 * a row failed two days ago is refused. */
	pgtest_exec(c, "UPDATE %s SET retention_ms = %lld", reg,
		    (long long)(7 * DAY_MS));
	pgtest_exec(c,
		    "INSERT INTO %s (id, version, started_at, last_seen_at, "
		    "state) VALUES ('old/1', 'x', now(), now() + interval "
		    "'1 hour', 'alive')",
		    reg);
	pgtest_exec(c,
		    "UPDATE %s SET finished_at = now() - interval '2 days' "
		    "WHERE subject = 'a1'",
		    table);
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "longer ago than sent rows are kept"));

	/* The relays alone keep a week, the command's own day still refuses;
	 * told a week, it lets the row go. */
	pgtest_exec(c, "DELETE FROM %s WHERE id = 'old/1'", reg);
	assert_int_equal(store_redrive(s, &f, &count, err, sizeof(err)),
			 STORE_REFUSED);
	f.sent_kept_ms = 7 * DAY_MS;
	redrive_a1_and_close(s, &f, c);
}

/* A redrive locks the key's next row only, the one row a lease could be
 * taking, and writes it (head = false: a lease that read the key before
 * the redrive committed leaves it): a row further behind, locked
 * elsewhere (here by a session of the test), does not refuse it. */
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
	mark_all(s, MARK_FAILED, &b, "bad"); /* skip: a2 is first now */
	pgtest_exec(other, "BEGIN");
	pgtest_exec(other,
		    "SELECT 1 FROM %s WHERE subject = 'a3' FOR NO KEY UPDATE",
		    table);
	size_t count;
	struct redrive_filter f = {.type = "t", .sent_kept_ms = DAY_MS};
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

/* a1 failed under skip, so a2 is A's first live row, and a2 is held by
 * a lease of another session: redriving a1 now would let a2 out first.
 * Refused, with and without --force, and nothing changes; once the lease
 * ends with a2 released, the redrive puts a1 back in front. */
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
	struct redrive_filter f = {.type = "t", .sent_kept_ms = DAY_MS};
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
	/* The lease ends without a mark: a2 is pending and A's first again,
	 * and a1 goes back in front of it. */
	assert_int_equal(store_lease_abort(s, &b, err, sizeof(err)), 0);
	lease_batch_release(&b);
	f.force = false;
	assert_int_equal(store_redrive(op, &f, &count, err, sizeof(err)), 0);
	assert_int_equal(count, 1);
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

/* a1 failed under skip and a2, A's first live row now, is only pending:
 * the redriven a1 goes first again, then A in seq order. b1, written
 * after, goes beside a1. */
static void test_redrive_goes_before_later_pending(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_redrive_pending", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	insert(c, table, "a3", "A");
	struct store *s = ordered_store(table, false);
	struct lease_batch b;
	lease(s, &b);
	mark_all(s, MARK_FAILED, &b, "bad");
	insert(c, table, "b1", "B");
	size_t count;
	struct redrive_filter f = {.type = "t", .sent_kept_ms = DAY_MS};
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
	struct redrive_filter f = {
	    .type = "t", .sent = true, .sent_kept_ms = DAY_MS};
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
	struct redrive_filter f = {
	    .type = "t", .progress = &watch, .sent_kept_ms = DAY_MS};
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
 * routing_key or exchange, marked head by a relay of that time (a1 and
 * b1), and d1 written after it: before its first lease an ordered
 * session fails those rows alone, with the reason. Other rows flow in key
 * order: A goes on past a2 (skip), B's b1 is failed with nothing after
 * it, u2 unkeyed. */
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

/* The same under block: a2 is failed and blocks A; a1, before it, is
 * delivered and A stops at a2 until unblock. */
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

/* Whether key A is blocked at the row of subject label. */
static long a_blocked_at(PGconn *c, const char *table, const char *label)
{
	return pgtest_long(
	    c,
	    "SELECT count(*) FROM %s_blocked_keys b JOIN %s t ON "
	    "t.id = b.blocking_id WHERE b.partition_key = 'A' "
	    "AND t.subject = '%s'",
	    table, table, label);
}

/* Under block, A is blocked at a2 (refused, failed ahead of its turn)
 * while a1 and a1b before it go; a1 then fails too: A is blocked at a1,
 * so a1b waits (the block's record was kept at a2 before, and a1b went
 * out after a failed a1), and the cleaner keeps a2 past its retention.
 * Unblocking a1 blocks A at a2 again: a1b goes, a3 waits for a2's
 * unblock. */
static void test_earlier_failure_takes_the_block(void **state)
{
	(void)state;
	char table[128], sql[1024];
	pgtest_fresh_table("ord_refused_earlier", table, sizeof(table));
	PGconn *c = pgtest_connect();
	snprintf(sql, sizeof(sql),
		 "INSERT INTO %s (type, subject, partition_key, routing_key, "
		 "payload) VALUES ('t', 'a1', 'A', 'k', 'x'), ('t', 'a1b', "
		 "'A', 'k', 'x'), ('t', 'a2', 'A', 'k' || chr(10), 'x'), ('t', "
		 "'a3', 'A', 'k', 'x'); UPDATE %s SET head = subject = 'a1'",
		 table, table);
	pgtest_before_004(c, table, sql);
	struct store *s = ordered_store(table, true);
	struct lease_batch b;
	lease_labels(s, &b, "a1");
	assert_int_equal(a_blocked_at(c, table, "a2"), 1);
	mark_all(s, MARK_FAILED, &b, "refused for good");
	assert_int_equal(a_blocked_at(c, table, "a1"), 1);
	expect_batch(s, "");
	/* Past failed retention, the cleaner spares a2 too: failed past
	 * the blocking row, it is where the key stops next. */
	pgtest_exec(c,
		    "UPDATE %s SET finished_at = now() - interval '30 days' "
		    "WHERE status = 'failed'",
		    table);
	struct clean_result cr;
	assert_int_equal(
	    store_clean(s, 1000, 1000, 1000, 0, &cr, err, sizeof(err)), 0);
	assert_int_equal(cr.failed_deleted, 0);
	err[0] = 'x';
	assert_int_equal(store_unblock(s, "A", false, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "blocked again at its next failed row"));
	assert_int_equal(a_blocked_at(c, table, "a2"), 1);
	expect_batch(s, "a1b");
	expect_batch(s, "");
	assert_int_equal(store_unblock(s, "A", false, err, sizeof(err)), 0);
	assert_string_equal(err, "; its blocking row stays failed");
	expect_batch(s, "a3");
	store_close(s);
	PQfinish(c);
}

/* A hot key's waiting rows are not in the ordered lease's path: with
 * 20k rows behind one key's first, other keys' first rows are leased
 * beside it and the key's rows follow one per lease. (Its cost is the
 * benchmark's.) */
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

/* A key's floor moves past its first live row once the lease that took
 * it commits it sent or failed, so the key's next descent starts past the
 * finished row; a row retried, or marked by a lease that then did not
 * commit, keeps it (docs/design.md §6, "The key map"). */
static void test_floor_passes_finished_heads(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_floor_past", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "A", 4);
	long seq[5];
	key_a_seqs(c, table, seq);
	struct store *s = map_store(table);
	struct lease_batch b;
	lease_labels(s, &b, "a1");
	assert_int_equal(store_key_map_floor(s, "A"), seq[1]);
	mark_all(s, MARK_SENT, &b, NULL);
	assert_int_equal(store_key_map_floor(s, "A"), seq[1] + 1);
	lease_labels(s, &b, "a2");
	mark_all(s, MARK_RETRY, &b, "nack");
	assert_int_equal(store_key_map_floor(s, "A"), seq[2]);
	pgtest_exec(c, "UPDATE %s SET next_attempt_at = now()", table);
	lease_labels(s, &b, "a2");
	mark_all(s, MARK_FAILED, &b, "permanent");
	assert_int_equal(store_key_map_floor(s, "A"), seq[2] + 1);
	lease_labels(s, &b, "a3");
	sent_then_rolled_back(s, &b);
	assert_int_equal(store_key_map_floor(s, "A"), seq[3]);
	store_close(s);
	PQfinish(c);
}

/* Two stores of one process (one key turn): the floor a store moves past
 * a row it finished moves in the other too, at its next lease, when the
 * other's floor lies between the floor the finisher's lease read the key
 * from and that row; move after move, as the rows of a key go. A lease
 * rolled back shares nothing. */
static void test_floor_passes_between_stores(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_floor_shared", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "A", 4);
	long seq[5];
	key_a_seqs(c, table, seq);
	struct store_pair pair;
	pair_open(&pair, table);
	struct store *s1 = pair.s1, *s2 = pair.s2;
	struct lease_batch b;
	lease_labels(s2, &b, "a1");
	mark_all(s2, MARK_RELEASE, &b, NULL);
	assert_int_equal(store_key_map_floor(s2, "A"), seq[1]);
	lease_labels(s1, &b, "a1");
	mark_all(s1, MARK_SENT, &b, NULL);
	store_key_map_catch_up(s2);
	assert_int_equal(store_key_map_floor(s2, "A"), seq[1] + 1);
	lease_labels(s1, &b, "a2");
	mark_all(s1, MARK_SENT, &b, NULL);
	lease_labels(s1, &b, "a3");
	mark_all(s1, MARK_SENT, &b, NULL);
	store_key_map_catch_up(s2);
	assert_int_equal(store_key_map_floor(s2, "A"), seq[3] + 1);
	lease_labels(s1, &b, "a4");
	sent_then_rolled_back(s1, &b);
	store_key_map_catch_up(s2);
	assert_int_equal(store_key_map_floor(s2, "A"), seq[3] + 1);
	pair_close(&pair);
	PQfinish(c);
}

/* A shared move lowers the catching-up store's discovery floor to the
 * finisher's. Row w of key A is written by a producer transaction that
 * commits late: the finisher's lease (s1, reading A from past a0) could
 * not see it and took a1, above it; s2 meanwhile found w as A's first
 * live row (held, so not taken) with a discovery floor above w's writer.
 * Once a1 is sent, s2's floor moves past a1, and only the lowered
 * discovery finds w again: without it s2 would take a2 and w would wait
 * for the map's next build (docs/design.md §6, "The key map", *Shared
 * moves*). */
static void test_shared_move_lowers_discovery(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_floor_late", table, sizeof(table));
	PGconn *c = pgtest_connect(), *w = pgtest_connect(),
	       *h = pgtest_connect();
	struct store_pair pair;
	pair_open(&pair, table);
	struct store *s1 = pair.s1, *s2 = pair.s2;
	struct lease_batch b1, b2;
	insert(c, table, "a0", "A");
	expect_batch(s1, "a0");
	pgtest_exec(w, "BEGIN");
	insert(w, table, "w", "A");
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	long a0 = seq_of(c, table, "a0"), a1 = seq_of(c, table, "a1");
	lease_labels(s1, &b1, "a1");
	pgtest_exec(w, "COMMIT");
	long sw = seq_of(c, table, "w");
	assert_true(a0 < sw && sw < a1);
	pgtest_exec(h, "BEGIN");
	pgtest_exec(h, "SELECT 1 FROM %s WHERE subject = 'w' FOR UPDATE",
		    table);
	lease_labels(s2, &b2, "");
	mark_all(s2, MARK_SENT, &b2, NULL);
	assert_int_equal(store_key_map_floor(s2, "A"), sw);
	pgtest_exec(h, "ROLLBACK");
	mark_all(s1, MARK_SENT, &b1, NULL);
	expect_batch(s2, "w");
	expect_batch(s2, "a2");
	pair_close(&pair);
	PQfinish(h);
	PQfinish(w);
	PQfinish(c);
}

/* A shared move leaves a floor below the one the finisher's lease read
 * the key from. An operator set a0, sent, back to pending by hand: its
 * writer is old, so no discovery finds it, and s1, whose floor had passed
 * it, goes on to a1 (rows made live by hand wait for the map's next build,
 * docs/design.md §6); s2, built since, has A's floor at a0 (held, so not
 * taken). Once a1 is sent, s2 keeps that floor and takes a0: a floor moved
 * past a1 would have taken a2, and a0 would have waited for a build.
 * The update also gives a0 the oldest writer there is: its own insert's
 * would be at or above s1's discovery floor whenever a transaction older
 * than it, anywhere in the cluster (another test's), was still running
 * when s1 took its snapshot, and the discovery would find a0. */
static void test_shared_move_keeps_a_floor_below_its_from(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_floor_from", table, sizeof(table));
	PGconn *c = pgtest_connect(), *h = pgtest_connect();
	struct store_pair pair;
	pair_open(&pair, table);
	struct store *s1 = pair.s1, *s2 = pair.s2;
	struct lease_batch b1, b2;
	insert(c, table, "a0", "A");
	insert(c, table, "a1", "A");
	insert(c, table, "a2", "A");
	expect_batch(s1, "a0");
	pgtest_exec(c,
		    "UPDATE %s SET status = 'pending', finished_at = NULL, "
		    "written_by = '3' WHERE subject = 'a0'",
		    table);
	pgtest_exec(h, "BEGIN");
	pgtest_exec(h, "SELECT 1 FROM %s WHERE subject = 'a0' FOR UPDATE",
		    table);
	lease_labels(s2, &b2, "");
	mark_all(s2, MARK_SENT, &b2, NULL);
	assert_int_equal(store_key_map_floor(s2, "A"), seq_of(c, table, "a0"));
	lease_labels(s1, &b1, "a1");
	pgtest_exec(h, "ROLLBACK");
	mark_all(s1, MARK_SENT, &b1, NULL);
	expect_batch(s2, "a0");
	expect_batch(s2, "a2");
	pair_close(&pair);
	PQfinish(h);
	PQfinish(c);
}

/* Two keys in one batch, one row sent and one retried: each key's floor
 * moves by its own row's marks only. */
static void test_floor_passes_per_key_in_a_batch(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_floor_keys", table, sizeof(table));
	PGconn *c = pgtest_connect();
	struct lease_batch b;
	struct mark_result r;
	insert(c, table, "b1", "Z");
	insert(c, table, "c1", "C");
	insert(c, table, "c2", "C");
	long b1 = seq_of(c, table, "b1"), c1 = seq_of(c, table, "c1");
	struct store *s = map_store(table);
	lease_labels(s, &b, "b1,c1");
	const char *sent[1], *nacked[1], *why[1] = {"nack"};
	for (size_t i = 0; i < b.n; i++)
		*(strcmp(b.events[i].subject, "b1") == 0 ? sent : nacked) =
		    b.events[i].id;
	assert_int_equal(
	    store_mark(s, MARK_SENT, sent, NULL, 1, &r, err, sizeof(err)), 0);
	assert_int_equal(
	    store_mark(s, MARK_RETRY, nacked, why, 1, &r, err, sizeof(err)), 0);
	assert_int_equal(store_lease_commit(s, &b, err, sizeof(err)), 0);
	lease_batch_release(&b);
	assert_int_equal(store_key_map_floor(s, "Z"), b1 + 1);
	assert_int_equal(store_key_map_floor(s, "C"), c1);
	store_close(s);
	PQfinish(c);
}

/* A scheduled build of the key map that fails (its walk of 300,000 keys
 * past the statement timeout) leaves the map of the last build, and the
 * lease goes on by it: failing the lease, every lease tried the same walk
 * and no ordered row went out (docs/design.md §6, *The build*). */
static void test_failed_build_keeps_the_map(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_build_fails", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert(c, table, "a1", "A");
	insert(c, table, "b1", "B");
	struct store_options o = map_options(table);
	o.statement_timeout_ms = 300;
	struct store *s = pgtest_store(&o);
	expect_released(s, "a1,b1");
	/* Rows an older relay holds in_flight: the build walks their keys,
	 * the lease's discovery (pending rows) does not read them. */
	pgtest_exec(c,
		    "INSERT INTO %s (type, subject, partition_key, payload, "
		    "status, lease_id, leased_at, lease_expires_at, "
		    "leased_by) SELECT 't', 'k' || g, 'k' || g, 'x', "
		    "'in_flight', gen_random_uuid(), now(), now() + interval "
		    "'1 hour', 'older' FROM generate_series(1, 300000) g",
		    table);
	pgtest_exec(c, "ANALYZE %s", table);
	store_key_map_expire(s);
	struct lease_batch b;
	lease(s, &b);
	/* The build did fail: the lease went on by the old map. */
	assert_int_equal(store_key_map_builds_failed(s), 1);
	assert_true(b.n > 0);
	mark_all(s, MARK_SENT, &b, NULL);
	if (store_lease_commit(s, &b, err, sizeof(err)) != 0)
		fail_msg("commit: %s", err);
	lease_batch_release(&b);
	store_close(s);
	PQfinish(c);
}

/* A key's rows' spacing, learned each time the walk goes past a row the
 * store finished, bounds the key's next descent once two are seen: four
 * of the larger past the floor (docs/design.md §6, *The descent's
 * bound*). */
static void test_descent_bound_learned(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_bound", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_rounds(c, table, "AB", 4);
	long a2 = seq_of(c, table, "a2"), a3 = seq_of(c, table, "a3");
	struct store *s = map_store(table);
	struct lease_batch b;
	lease_labels(s, &b, "a1,b1");
	assert_int_equal(store_key_map_bound(s, "A"), -1);
	mark_all(s, MARK_SENT, &b, NULL);
	lease_labels(s, &b, "a2,b2");
	assert_int_equal(store_key_map_bound(s, "A"), -1);
	mark_all(s, MARK_SENT, &b, NULL);
	lease_labels(s, &b, "a3,b3");
	assert_int_equal(store_key_map_bound(s, "A"), a3 + 4 * (a3 - a2));
	mark_all(s, MARK_SENT, &b, NULL);
	assert_int_equal(store_key_map_bound(s, "A"), a3 + 1 + 4 * (a3 - a2));
	store_close(s);
	PQfinish(c);
}

/* A key whose next row lies past its descent's bound: the descent reads
 * on past the bound and finds it, and the bound takes the new spacing. */
static void test_descent_reads_past_its_bound(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_bound_past", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_keys(c, table, "A", 3);
	insert_keys(c, table, "Z", 20);
	insert(c, table, "a4", "A");
	long a2 = seq_of(c, table, "a2"), a3 = seq_of(c, table, "a3"),
	     a4 = seq_of(c, table, "a4");
	struct store *s = map_store(table);
	expect_batch(s, "a1,z1");
	expect_batch(s, "a2,z2");
	expect_batch(s, "a3,z3");
	long bound = a3 + 1 + 4 * (a3 - a2);
	assert_int_equal(store_key_map_bound(s, "A"), bound);
	assert_true(a4 > bound);
	struct lease_batch b;
	lease_labels(s, &b, "a4,z4");
	assert_int_equal(store_key_map_bound(s, "A"), a4 + 4 * (a4 - a3));
	mark_all(s, MARK_SENT, &b, NULL);
	store_close(s);
	PQfinish(c);
}

/* A build of the map (a rescan, a reconnect) keeps what a key's rows
 * taught its bound: its descents stay bounded from the build's floor. */
static void test_descent_bound_kept_by_a_build(void **state)
{
	(void)state;
	char table[128];
	pgtest_fresh_table("ord_bound_build", table, sizeof(table));
	PGconn *c = pgtest_connect();
	insert_rounds(c, table, "AB", 4);
	long a2 = seq_of(c, table, "a2"), a3 = seq_of(c, table, "a3"),
	     a4 = seq_of(c, table, "a4");
	struct store *s = map_store(table);
	expect_batch(s, "a1,b1");
	expect_batch(s, "a2,b2");
	expect_batch(s, "a3,b3");
	store_key_map_expire(s);
	struct lease_batch b;
	lease_labels(s, &b, "a4,b4");
	assert_int_equal(store_key_map_floor(s, "A"), a4);
	assert_int_equal(store_key_map_bound(s, "A"), a4 + 4 * (a3 - a2));
	mark_all(s, MARK_SENT, &b, NULL);
	store_close(s);
	PQfinish(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_one_row_per_key_in_seq_order),
	    cmocka_unit_test(test_backoff_holds_the_key),
	    cmocka_unit_test(test_skip_moves_on),
	    cmocka_unit_test(test_block_unblock_and_cleaner),
	    cmocka_unit_test(test_unblock_redrive),
	    cmocka_unit_test(test_redrive_of_blocking_row_lifts_block),
	    cmocka_unit_test(
		test_unordered_redrive_refused_beside_ordered_relays),
	    cmocka_unit_test(test_key_map_passes_restored_writers),
	    cmocka_unit_test(test_held_row_holds_its_key),
	    cmocka_unit_test(test_walk_gives_every_key_its_turn),
	    cmocka_unit_test(test_walk_stops_at_its_cap),
	    cmocka_unit_test(test_key_window_grows_when_nothing_is_due),
	    cmocka_unit_test(test_key_turn_shared),
	    cmocka_unit_test(test_markers_of_older_relays_change_nothing),
	    cmocka_unit_test(test_suspects_go_alone_in_key_order),
	    cmocka_unit_test(test_late_rows_and_redrive_are_leased),
	    cmocka_unit_test(test_late_row_below_a_keys_floor),
	    cmocka_unit_test(test_seq_behind_its_rows_refused),
	    cmocka_unit_test(test_seq_moved_past_a_row_in_flight),
	    cmocka_unit_test(test_rows_live_again_by_hand_wait_for_a_build),
	    cmocka_unit_test(test_redrive_refuses_to_reorder),
	    cmocka_unit_test(test_redrive_refuses_past_retention),
	    cmocka_unit_test(test_redrive_goes_by_relays_retention),
	    cmocka_unit_test(test_redrive_sees_later_row_held),
	    cmocka_unit_test(test_redrive_locks_next_row_only),
	    cmocka_unit_test(test_redrive_goes_before_later_pending),
	    cmocka_unit_test(test_replay_goes_before_later_rows),
	    cmocka_unit_test(test_redrive_rechecks_each_batch),
	    cmocka_unit_test(test_refused_rows_fail_alone),
	    cmocka_unit_test(test_refused_row_blocks_its_key),
	    cmocka_unit_test(test_earlier_failure_takes_the_block),
	    cmocka_unit_test(test_hot_key_does_not_starve_others),
	    cmocka_unit_test(test_floor_passes_finished_heads),
	    cmocka_unit_test(test_floor_passes_per_key_in_a_batch),
	    cmocka_unit_test(test_floor_passes_between_stores),
	    cmocka_unit_test(test_shared_move_lowers_discovery),
	    cmocka_unit_test(test_shared_move_keeps_a_floor_below_its_from),
	    cmocka_unit_test(test_failed_build_keeps_the_map),
	    cmocka_unit_test(test_descent_bound_learned),
	    cmocka_unit_test(test_descent_reads_past_its_bound),
	    cmocka_unit_test(test_descent_bound_kept_by_a_build),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
