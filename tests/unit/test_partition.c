/* SPDX-License-Identifier: MIT */
/*
 * `migrate --partition` (store_partition(), docs/design.md §11, "The
 * migration"): a live table, with rows in every state, a lease open, a
 * producer writing and a relay's prepared statements, becomes partitioned
 * by id with nothing lost, nothing delivered twice and nothing the
 * producers or relays need left behind; a table something names by oid is
 * refused and left as it was.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cJSON.h>
#include <cmocka.h>

#include "pgtest.h"
#include "store/locks.h"
#include "store/store.h"
#include "store/store_test.h"

static char err[1024];

/* The names of table's indexes, in order, into out. */
static void indexes_of(PGconn *c, const char *table, char *out, size_t len)
{
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "SELECT string_agg(c.relname, ',' ORDER BY c.relname) FROM "
		 "pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE "
		 "i.indrelid = '%s'::regclass",
		 table);
	PGresult *res = PQexec(c, sql);
	assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
	snprintf(out, len, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
}

/* A producer inserting one row every 10 ms until told to stop (at most
 * 500 rows): inserts refused while the table changes shape count as
 * lost events. */
struct producer {
	const char *table;
	atomic_int stop; /* set by the test, read by the thread */
	int inserted;
	int refused;
	char why[512];
};

static void *produce(void *arg)
{
	struct producer *p = arg;
	PGconn *c = pgtest_connect();
	char sql[256];
	snprintf(sql, sizeof(sql),
		 "INSERT INTO %s (type, payload) VALUES ('produced', '{}')",
		 p->table);
	for (int i = 0; i < 500 && !atomic_load(&p->stop); i++) {
		PGresult *res = PQexec(c, sql);
		if (PQresultStatus(res) == PGRES_COMMAND_OK) {
			p->inserted++;
		} else {
			p->refused++;
			snprintf(p->why, sizeof(p->why), "%s",
				 PQerrorMessage(c));
		}
		PQclear(res);
		usleep(10 * 1000);
	}
	PQfinish(c);
	return NULL;
}

struct migration {
	struct store_options o;
	int rc;
	char text[2048];
	char why[1024];
};

static void *partition(void *arg)
{
	struct migration *m = arg;
	FILE *out = fmemopen(m->text, sizeof(m->text), "w");
	m->rc = store_partition_settled(&m->o, 50, out, m->why, sizeof(m->why));
	if (out)
		fclose(out);
	return NULL;
}

/* Marks every row of the open lease b of relay sent and commits it. */
static void mark_all_sent(struct store *relay, struct lease_batch *b,
			  const char *what)
{
	const char **ids = calloc(b->n ? b->n : 1, sizeof(*ids));
	assert_non_null(ids);
	for (size_t i = 0; i < b->n; i++)
		ids[i] = b->events[i].id;
	struct mark_result r;
	if (store_mark(relay, MARK_SENT, ids, NULL, b->n, &r, err,
		       sizeof(err)) != 0 ||
	    store_lease_commit(relay, b, err, sizeof(err)) != 0)
		fail_msg("%s: %s", what, err);
	free(ids);
	lease_batch_release(b);
}

/* Runs step (a migration, for a thread) on m beside the producer p and
 * the open lease b of relay: 800 ms in, the lease marks its rows sent
 * and commits (the step's locks and builds wait for its transaction);
 * then the step is waited for, and the producer stopped 200 ms after. */
static void beside_lease_and_producer(void *(*step)(void *),
				      struct migration *m, struct store *relay,
				      struct lease_batch *b, struct producer *p)
{
	pthread_t producer, migrating;
	assert_int_equal(pthread_create(&producer, NULL, produce, p), 0);
	assert_int_equal(pthread_create(&migrating, NULL, step, m), 0);
	usleep(800 * 1000);
	mark_all_sent(relay, b, "the open lease's marks");
	pthread_join(migrating, NULL);
	usleep(200 * 1000);
	atomic_store(&p->stop, 1);
	pthread_join(producer, NULL);
}

static long count(PGconn *c, const char *table, const char *where)
{
	return pgtest_long(c, "SELECT count(*) FROM %s WHERE %s", table, where);
}

static void test_live_table_becomes_partitioned(void **state)
{
	(void)state;
	char table[128], registry[160], dflt[160], role[64];
	struct outbox_table t;
	pgtest_fresh_table("part_live", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	table_derived(&t, "_replicas", registry, sizeof(registry));
	table_derived(&t, "_default", dflt, sizeof(dflt));
	snprintf(role, sizeof(role), "part_reader_%d", (int)getpid());
	PGconn *c = pgtest_connect();
	struct store_options o = pgtest_store_options(table);
	assert_int_equal(store_migrate(&o, true, NULL, err, sizeof(err)), 0);
	pgtest_exec(c, "DROP ROLE IF EXISTS %s; CREATE ROLE %s", role, role);
	pgtest_exec(c, "GRANT SELECT, INSERT ON %s TO %s", table, role);

	/* Rows in every state: due, a retry in backoff, keyed, a producer's
	 * own UUIDv4, sent, failed; and 4 leased below. */
	pgtest_insert(c, table, 30);
	pgtest_exec(
	    c,
	    "UPDATE %s SET status = 'sent', finished_at = now() WHERE "
	    "seq <= 5; UPDATE %s SET status = 'failed', finished_at = "
	    "now(), attempts = 10, last_error = 'x' WHERE seq BETWEEN 6 "
	    "AND 8; UPDATE %s SET next_attempt_at = now() + interval "
	    "'1 hour', attempts = 2 WHERE seq = 9; UPDATE %s SET "
	    "partition_key = 'k' || (seq %% 3) WHERE seq BETWEEN 10 AND "
	    "20; INSERT INTO %s (id, type, payload) VALUES "
	    "(gen_random_uuid(), 'v4', '{}')",
	    table, table, table, table, table);
	long seq_before = pgtest_long(c, "SELECT max(seq) FROM %s", table);
	char before[1024];
	indexes_of(c, table, before, sizeof(before));

	/* A relay of protocol 1 alive; its lease of 4 rows stays open while
	 * the migration starts (its lock waits, briefly, retried). */
	o.batch_size = 4;
	struct store *relay = pgtest_store(&o);
	pgtest_exec(c,
		    "INSERT INTO %s (id, version, protocol, last_seen_at) "
		    "VALUES ('relay/1', 'test', %d, now())",
		    registry, STORE_PROTOCOL);
	struct lease_batch b;
	if (store_lease(relay, NULL, 0, "", &b, err, sizeof(err)) != 0)
		fail_msg("lease: %s", err);
	assert_int_equal(b.n, 4);

	struct producer p = {.table = table};
	struct migration m = {.o = pgtest_store_options(table)};
	beside_lease_and_producer(partition, &m, relay, &b, &p);
	if (m.rc != 0)
		fail_msg("partition: %s", m.why);
	if (!strstr(m.text, "contract step partition_by_id (protocol 1): "
			    "done\n"))
		fail_msg("said: %s", m.text);
	if (p.refused)
		fail_msg("%d of the producer's inserts refused: %s", p.refused,
			 p.why);
	assert_true(p.inserted > 0);

	/* The shape: partitioned, the old rows in its default partition,
	 * its indexes valid under their names, the registry's step. */
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_class WHERE oid "
				     "= '%s'::regclass AND relkind = 'p'",
				     table),
			 1);
	assert_int_equal(count(c, dflt, "type <> 'produced'"), 31);
	/* Every index under its name, but the one of finished rows, split
	 * by status (test_finished_index_split_live). */
	char after[1024], expected[1024];
	indexes_of(c, table, after, sizeof(after));
	char sql[1600];
	snprintf(sql, sizeof(sql),
		 "SELECT string_agg(x, ',' ORDER BY x) FROM unnest("
		 "string_to_array('%s', ',') || ARRAY['%s_failed_idx', "
		 "'%s_sent_brin']) x WHERE x <> '%s_terminal_idx'",
		 before, t.name, t.name, t.name);
	PGresult *res = PQexec(c, sql);
	assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
	snprintf(expected, sizeof(expected), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	assert_string_equal(after, expected);
	if (!strstr(m.text, "indexed by status"))
		fail_msg("said: %s", m.text);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_index WHERE "
				     "indrelid = '%s'::regclass AND NOT "
				     "indisvalid",
				     table),
			 0);
	/* What producers and relays need went with the name. */
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE type = "
				     "'produced'",
				     table),
			 p.inserted);
	pgtest_exec(c, "INSERT INTO %s (type, payload) VALUES ('after', '{}')",
		    table);
	long seq_after =
	    pgtest_long(c, "SELECT seq FROM %s WHERE type = 'after'", table);
	if (seq_after <= seq_before + p.inserted)
		fail_msg("the next insert's seq %ld is not above every older "
			 "row's (%ld + %d produced)",
			 seq_after, seq_before, p.inserted);
	assert_int_equal(pgtest_long(c,
				     "SELECT has_table_privilege('%s', '%s', "
				     "'INSERT')::int",
				     role, table),
			 1);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_trigger WHERE "
				     "tgrelid = '%s'::regclass AND tgname = "
				     "'%s_notify'",
				     table, t.name),
			 1);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_trigger WHERE "
				     "tgrelid = '%s'::regclass AND NOT "
				     "tgisinternal",
				     dflt),
			 0);

	/* The relay's sessions and prepared statements go on: every row
	 * due is delivered once, the 4 marked before not again, the retry
	 * in backoff kept. */
	long due = count(c, table, "status = 'pending' AND seq <> 9");
	long delivered = 0;
	for (int i = 0; i < 100; i++) {
		if (store_lease(relay, NULL, 0, "", &b, err, sizeof(err)) != 0)
			fail_msg("lease after: %s", err);
		if (b.n == 0) {
			lease_batch_release(&b);
			break;
		}
		delivered += (long)b.n;
		mark_all_sent(relay, &b, "marks after");
	}
	assert_int_equal(delivered, due);
	assert_int_equal(count(c, table, "status = 'sent'"), 5 + 4 + due);
	assert_int_equal(count(c, table, "status = 'failed'"), 3);
	assert_int_equal(count(c, table, "status = 'pending'"), 1);
	store_close(relay);

	/* Done before: nothing to do, no partition of the partition. */
	FILE *out = fmemopen(m.text, sizeof(m.text), "w");
	assert_int_equal(store_partition_settled(&o, 50, out, err, sizeof(err)),
			 0);
	fclose(out);
	assert_non_null(strstr(m.text, "recorded before, done"));
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_partition_tree("
				     "'%s') WHERE level > 0",
				     table),
			 1);
	pgtest_exec(c, "DROP OWNED BY %s; DROP ROLE %s", role, role);
	PQfinish(c);
}

/* The partition step on table must be refused with an error holding
 * both why and what, the table left plain. */
static void expect_partition_refused(PGconn *c, const char *table,
				     const char *why, const char *what)
{
	struct store_options o = pgtest_store_options(table);
	assert_int_not_equal(
	    store_partition_settled(&o, 50, NULL, err, sizeof(err)), 0);
	if (!strstr(err, why) || !strstr(err, what))
		fail_msg("refused for: %s", err);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_class WHERE oid "
				     "= '%s'::regclass AND relkind = 'r'",
				     table),
			 1);
}

/* Something that names the table by oid (here a view) would stay with
 * the old table: refused, the table left as it was. */
static void test_dependents_refused(void **state)
{
	(void)state;
	char table[128], view[160];
	struct outbox_table t;
	pgtest_fresh_table("part_view", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	table_derived(&t, "_pending_view", view, sizeof(view));
	PGconn *c = pgtest_connect();
	pgtest_exec(c,
		    "CREATE VIEW %s AS SELECT id FROM %s WHERE status = "
		    "'pending'",
		    view, table);
	pgtest_insert(c, table, 3);
	expect_partition_refused(c, table, "cannot become partitioned",
				 "_pending_view");
	assert_int_equal(pgtest_long(c, "SELECT count(*) FROM %s", view), 3);
	PQfinish(c);
}

/* An invalid index a build cut short left (a REINDEX or CREATE INDEX
 * CONCURRENTLY): copied to the partitioned table, its ATTACH would build
 * a valid one on the whole old table under ACCESS EXCLUSIVE, then the
 * step failed on it. It is dropped first, and the table partitioned. */
static void test_invalid_index_dropped_first(void **state)
{
	(void)state;
	char table[128], idx[160];
	struct outbox_table t;
	pgtest_fresh_table("part_invalid", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	snprintf(idx, sizeof(idx), "\"%s\".cut_idx", t.schema);
	PGconn *c = pgtest_connect();
	pgtest_insert(c, table, 3);
	pgtest_failed_index_build(c, "cut_idx", table);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_index WHERE "
				     "indexrelid = to_regclass('%s') AND NOT "
				     "indisvalid",
				     idx),
			 1);
	struct store_options o = pgtest_store_options(table);
	if (store_partition_settled(&o, 50, NULL, err, sizeof(err)) != 0)
		fail_msg("partitioning with an invalid index: %s", err);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_class WHERE oid "
				     "= '%s'::regclass AND relkind = 'p'",
				     table),
			 1);
	assert_int_equal(
	    pgtest_long(c,
			"SELECT count(*) FROM pg_class WHERE oid = "
			"to_regclass('%s')",
			idx),
	    0);
	assert_int_equal(pgtest_long(c, "SELECT count(*) FROM %s", table), 3);
	PQfinish(c);
}

/* 004's CHECK left NOT VALID by a row written before it: the partition
 * step would copy it as valid and Postgres would then refuse the old
 * table's; refused up front, named, the table left as it was. */
static void test_not_valid_check_refused(void **state)
{
	(void)state;
	char table[128];
	struct outbox_table t;
	pgtest_fresh_table("part_notvalid", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	PGconn *c = pgtest_connect();
	pgtest_insert(c, table, 3);
	pgtest_exec(
	    c,
	    "ALTER TABLE %s DROP CONSTRAINT \"%s_destination_text\"; "
	    "INSERT INTO %s (type, payload, routing_key) VALUES ('old', "
	    "'\\x00', 'a' || chr(10) || 'b'); ALTER TABLE %s ADD "
	    "CONSTRAINT \"%s_destination_text\" CHECK (status <> "
	    "'pending' OR routing_key !~ '[\\x01-\\x1f\\x7f]') NOT VALID",
	    table, t.name, table, table, t.name);
	expect_partition_refused(c, table,
				 "cannot become partitioned while its CHECK",
				 "_destination_text is not valid");
	PQfinish(c);
}

/* The least UUIDv7 of the day d days from today (UTC), as SQL text,
 * and that day's tag. */
static void day_of(PGconn *c, int d, char *lo, char *tag)
{
	PGresult *res = PQexec(c, "SET TimeZone = 'UTC'");
	PQclear(res);
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "SELECT substr(a, 1, 8) || '-' || substr(a, 9, 4) || "
		 "'-0000-0000-000000000000', to_char(at, 'YYYYMMDD') FROM "
		 "(SELECT at, lpad(to_hex((extract(epoch FROM at) * "
		 "1000)::bigint), 12, '0') AS a FROM (SELECT date_trunc('day', "
		 "now()) + %d * interval '1 day' AS at) x) y",
		 d);
	res = PQexec(c, sql);
	assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
	snprintf(lo, 40, "%s", PQgetvalue(res, 0, 0));
	snprintf(tag, 16, "%s", PQgetvalue(res, 0, 1));
	PQclear(res);
}

/* A row with an id of the day whose least id is lo (the n-th). */
static void insert_in_day(PGconn *c, const char *table, const char *lo, int n,
			  const char *status, const char *finished)
{
	pgtest_exec(c,
		    "INSERT INTO %s (id, type, payload, status, finished_at) "
		    "VALUES ((substr('%s', 1, 14) || '7000-8000-%012d')::uuid, "
		    "'day', '{}', '%s', %s)",
		    table, lo, n, status, finished);
}

static struct partition_result tend(struct store *s, int64_t retention_ms,
				    int64_t failed_retention_ms)
{
	struct partition_result r;
	if (store_partitions_tend(s, 3, retention_ms, failed_retention_ms, &r,
				  err, sizeof(err)) != 0)
		fail_msg("tend: %s", err);
	assert_false(r.busy);
	return r;
}

#define DAY_MS (24 * 3600 * 1000LL)

/* Partitions by the day: made ahead with the default's storage
 * parameters (fill factor 50 with history), rows landing in them; dropped once
 * past retention, each row the cleaner would not delete yet carried to the
 * default partition; the cleaner's deletes for the default partition alone. */
static void test_partitions_by_the_day(void **state)
{
	(void)state;
	char table[128], lo[40], tag[16], part[200], dflt[160];
	struct outbox_table t;
	pgtest_fresh_table("part_day", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	table_derived(&t, "_default", dflt, sizeof(dflt));
	PGconn *c = pgtest_connect();
	struct store_options o = pgtest_store_options(table);
	struct store *s = pgtest_store(&o);

	/* Today's table: nothing to tend, the cleaner as before. */
	struct partition_result r = tend(s, DAY_MS, 0);
	assert_false(r.partitioned);
	assert_int_equal(r.created, 0);
	if (!pgtest_partitioned() &&
	    store_partition_unrecorded(c, &t, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);

	r = tend(s, DAY_MS, 0);
	assert_true(r.partitioned);
	assert_int_equal(r.created, 3);
	for (int h = 1; h <= 3; h++) {
		day_of(c, h, lo, tag);
		snprintf(part, sizeof(part), "%s\"%s_p%s\"", t.prefix, t.name,
			 tag);
		/* History kept: room for each row's sent version. */
		assert_true(pgtest_has_reloption(c, part, "fillfactor=50"));
		assert_false(pgtest_has_reloption(c, part, "fillfactor=70"));
		assert_true(pgtest_has_reloption(
		    c, part, "autovacuum_vacuum_threshold=10000"));
	}
	assert_int_equal(tend(s, DAY_MS, 0).created, 0);
	day_of(c, 2, lo, tag);
	insert_in_day(c, table, lo, 1, "pending", "NULL");
	pgtest_insert(c, table, 1);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE type = "
				     "'day' AND tableoid = '%s\"%s_p%s\"'::"
				     "regclass",
				     table, t.prefix, t.name, tag),
			 1);

	/* Days past, made by hand as by a relay that ran then, each with a
	 * row long sent and one the cleaner would not delete: -6 that row
	 * blocks a key, -5 a row in flight (a relay of the row lease), -4 a
	 * failed row (kept), -3 a pending row, -2 a row sent an hour ago.
	 * Each ended more than a day ago. */
	enum { PAST = 5 };
	char los[PAST + 1][40], tags[PAST + 1][16];
	for (int i = 0; i <= PAST; i++)
		day_of(c, i - 6, los[i], tags[i]);
	for (int i = 0; i < PAST; i++) {
		pgtest_exec(c,
			    "CREATE TABLE %s\"%s_p%s\" PARTITION OF %s FOR "
			    "VALUES FROM ('%s') TO ('%s')",
			    t.prefix, t.name, tags[i], table, los[i],
			    los[i + 1]);
		insert_in_day(c, table, los[i], 1, "sent",
			      "now() - interval '2 days'");
	}
	const char *old = "now() - interval '2 days'";
	char blocked[160];
	table_derived(&t, "_blocked_keys", blocked, sizeof(blocked));
	pgtest_exec(c,
		    "INSERT INTO %s (partition_key, blocking_id) VALUES ('k', "
		    "(substr('%s', 1, 14) || '7000-8000-%012d')::uuid)",
		    blocked, los[0], 1);
	pgtest_exec(c,
		    "INSERT INTO %s (id, type, payload, status, lease_id, "
		    "leased_at, lease_expires_at) VALUES ((substr('%s', 1, 14) "
		    "|| '7000-8000-000000000002')::uuid, 'day', '{}', "
		    "'in_flight', gen_random_uuid(), now(), now())",
		    table, los[1]);
	insert_in_day(c, table, los[2], 2, "failed", old);
	insert_in_day(c, table, los[3], 2, "pending", "NULL");
	insert_in_day(c, table, los[4], 2, "sent", "now() - interval '1 hour'");
	/* Expired rows of the default partition and of a day ahead. */
	pgtest_exec(c,
		    "UPDATE %s SET status = 'sent', finished_at = %s WHERE "
		    "type <> 'day'",
		    table, old);
	day_of(c, 2, lo, tag);
	pgtest_exec(c,
		    "UPDATE %s SET status = 'sent', finished_at = %s WHERE "
		    "id = (substr('%s', 1, 14) || '7000-8000-%012d')::uuid",
		    table, old, lo, 1);

	/* Each past day dropped, its rows long sent with it; the one row
	 * of each that the cleaner would keep carried to the default
	 * partition with its id and seq. */
	long seqs = pgtest_long(c,
				"SELECT sum(seq) FROM %s WHERE type = 'day' "
				"AND (status <> 'sent' OR finished_at > now() "
				"- interval '1 day' OR id IN (SELECT "
				"blocking_id FROM %s))",
				table, blocked);
	r = tend(s, DAY_MS, 0);
	assert_int_equal(r.dropped, PAST);
	assert_int_equal(r.carried, PAST);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_partition_tree("
				     "'%s') WHERE level = 1",
				     table),
			 4); /* the default and the 3 ahead */
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE type = "
				     "'day' AND id < '%s'",
				     table, los[PAST]),
			 PAST);
	assert_int_equal(pgtest_long(c,
				     "SELECT sum(seq) FROM %s WHERE type = "
				     "'day' AND id < '%s'",
				     dflt, los[PAST]),
			 seqs);
	for (int i = 0; i < PAST; i++)
		assert_int_equal(pgtest_long(c,
					     "SELECT count(*) FROM %s WHERE id "
					     "= (substr('%s', 1, 14) || "
					     "'7000-8000-%012d')::uuid",
					     dflt, los[i], i == 0 ? 1 : 2),
				 1);

	/* The cleaner deletes the default's expired row alone, not the
	 * day ahead's; the carried pending row is leased. */
	struct clean_result cr;
	assert_int_equal(
	    store_clean(s, DAY_MS, 0, 1000, 0, &cr, err, sizeof(err)), 0);
	assert_int_equal(cr.sent_deleted, 1);
	day_of(c, 2, lo, tag);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE id = "
				     "(substr('%s', 1, 14) || "
				     "'7000-8000-000000000001')::uuid",
				     table, lo),
			 1);
	assert_int_equal(pgtest_lease_count(&o), 1);

	/* Without history a day is made with no room (fill factor 100),
	 * the default's other parameters kept. */
	day_of(c, 3, lo, tag);
	pgtest_exec(c, "DROP TABLE %s\"%s_p%s\"", t.prefix, t.name, tag);
	assert_int_equal(tend(s, 0, 0).created, 1);
	snprintf(part, sizeof(part), "%s\"%s_p%s\"", t.prefix, t.name, tag);
	assert_true(pgtest_has_reloption(c, dflt, "fillfactor=70"));
	assert_false(pgtest_has_reloption(c, part, "fillfactor=70"));
	assert_false(pgtest_has_reloption(c, part, "fillfactor=50"));
	assert_true(
	    pgtest_has_reloption(c, part, "autovacuum_vacuum_threshold=10000"));
	store_close(s);
	PQfinish(c);
}

/* A fresh table (prefix), partitioned as migrate --partition makes it,
 * with a store on it; t its parsed name, *c a connection of the test's. */
static struct store *partitioned(const char *prefix, char *table,
				 size_t tablelen, struct outbox_table *t,
				 PGconn **c)
{
	pgtest_fresh_table(prefix, table, tablelen);
	assert_int_equal(table_parse(table, t, err, sizeof(err)), 0);
	*c = pgtest_connect();
	struct store_options o = pgtest_store_options(table);
	struct store *s = pgtest_store(&o);
	if (store_partition_unrecorded(*c, t, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);
	return s;
}

/* While another session holds the cleaner's lock (a replica's cleaner
 * making fewer days ahead than migrate --partition), a tend makes
 * nothing and says so (busy: run it again); once the lock is free, it
 * makes its days. */
static void test_tend_behind_another_cleaner(void **state)
{
	(void)state;
	char table[128];
	struct outbox_table t;
	PGconn *c;
	struct store *s =
	    partitioned("part_busy", table, sizeof(table), &t, &c);

	pgtest_exec(c, "BEGIN");
	pgtest_exec(c, "SELECT pg_advisory_xact_lock(%d, hashtext(%s))",
		    LOCK_NS_CLEAN, t.literal);
	struct partition_result r;
	if (store_partitions_tend(s, 3, DAY_MS, 0, &r, err, sizeof(err)) != 0)
		fail_msg("tend: %s", err);
	assert_true(r.partitioned);
	assert_true(r.busy);
	assert_int_equal(r.created, 0);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_partition_tree("
				     "'%s') WHERE level = 1",
				     table),
			 1); /* the default alone */
	pgtest_exec(c, "COMMIT");

	assert_int_equal(tend(s, DAY_MS, 0).created, 3);
	store_close(s);
	PQfinish(c);
}

static long default_identities(PGconn *c, const char *dflt)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM pg_attribute WHERE attrelid = "
			   "'%s'::regclass AND attname = 'seq' AND attidentity "
			   "<> ''",
			   dflt);
}

/* The default partition keeps no identity of its own: inserts take seq
 * from the table's, and Postgres 17 and later refuse to attach a table
 * with one (a dump of the table restored there failed at the ATTACH).
 * One partitioned by an earlier version, which kept the old table's, has
 * it dropped by the next migrate; seq goes on above the rows. */
static void test_default_partition_without_identity(void **state)
{
	(void)state;
	char table[128], dflt[160];
	struct outbox_table t;
	PGconn *c;
	struct store *s =
	    partitioned("part_ident", table, sizeof(table), &t, &c);
	table_derived(&t, "_default", dflt, sizeof(dflt));
	assert_int_equal(default_identities(c, dflt), 0);

	pgtest_insert(c, table, 3);
	pgtest_exec(c,
		    "ALTER TABLE %s ALTER COLUMN seq ADD GENERATED ALWAYS AS "
		    "IDENTITY",
		    dflt);
	assert_int_equal(default_identities(c, dflt), 1);
	long before = pgtest_long(c, "SELECT max(seq) FROM %s", table);
	struct store_options o = pgtest_store_options(table);
	if (store_migrate(&o, true, NULL, err, sizeof(err)) != 0)
		fail_msg("migrate: %s", err);
	assert_int_equal(default_identities(c, dflt), 0);
	pgtest_insert(c, table, 2);
	assert_true(pgtest_long(c, "SELECT min(seq) FROM %s WHERE seq > %ld",
				table, before) > before);
	assert_int_equal(pgtest_long(c, "SELECT count(*) FROM %s", table), 5);
	if (store_migrate(&o, true, NULL, err, sizeof(err)) != 0)
		fail_msg("migrate again: %s", err);
	store_close(s);
	PQfinish(c);
}

/* What another replica's cleaner does between a tend's listing of the
 * days past retention and its own drops: drops the first of them. */
struct other_replica {
	PGconn *c;
	char part[200];
	int calls;
};

static void other_replica_drops(void *arg)
{
	struct other_replica *o = arg;
	if (o->calls++ == 0)
		pgtest_exec(o->c, "DROP TABLE %s", o->part);
}

/* Two days past retention, listed; another replica drops the first before
 * this one's lock: that day is passed over and the second dropped in the
 * same round. Its LOCK TABLE on the missing day failed the whole round. */
static void test_day_dropped_by_another_replica(void **state)
{
	(void)state;
	char table[128], los[3][40], tags[3][16];
	struct outbox_table t;
	PGconn *c;
	struct store *s =
	    partitioned("part_gone", table, sizeof(table), &t, &c);
	for (int i = 0; i < 3; i++)
		day_of(c, i - 5, los[i], tags[i]);
	for (int i = 0; i < 2; i++)
		pgtest_exec(c,
			    "CREATE TABLE %s\"%s_p%s\" PARTITION OF %s FOR "
			    "VALUES FROM ('%s') TO ('%s')",
			    t.prefix, t.name, tags[i], table, los[i],
			    los[i + 1]);

	struct other_replica other = {.c = c};
	snprintf(other.part, sizeof(other.part), "%s\"%s_p%s\"", t.prefix,
		 t.name, tags[0]);
	store_on_partitions_listed(s, other_replica_drops, &other);
	struct partition_result r = tend(s, DAY_MS, 0);
	assert_int_equal(other.calls, 1);
	assert_int_equal(r.dropped, 1);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(to_regclass(p)) FROM "
				     "(VALUES ('%s\"%s_p%s\"'), "
				     "('%s\"%s_p%s\"')) v(p)",
				     t.prefix, t.name, tags[0], t.prefix,
				     t.name, tags[1]),
			 0);
	store_close(s);
	PQfinish(c);
}

/* Two days past retention, made by hand as by a relay that ran then; the
 * first (oldest) holds n pending rows of 1 KB. */
static void two_old_days(PGconn *c, const char *table,
			 const struct outbox_table *t, int n, char tags[3][16])
{
	char los[3][40];
	for (int i = 0; i < 3; i++)
		day_of(c, i - 5, los[i], tags[i]);
	for (int i = 0; i < 2; i++)
		pgtest_exec(c,
			    "CREATE TABLE %s\"%s_p%s\" PARTITION OF %s FOR "
			    "VALUES FROM ('%s') TO ('%s')",
			    t->prefix, t->name, tags[i], table, los[i],
			    los[i + 1]);
	pgtest_exec(
	    c,
	    "INSERT INTO %s (id, type, payload) SELECT (substr('%s', 1, "
	    "14) || '7000-8000-' || lpad(g::text, 12, '0'))::uuid, "
	    "'day', convert_to(repeat('x', 1024), 'UTF8') FROM "
	    "generate_series(1, %d) g",
	    table, los[0], n);
	insert_in_day(c, table, los[1], 1, "pending", "NULL");
}

static long parts_left(PGconn *c, const struct outbox_table *t,
		       char tags[3][16])
{
	return pgtest_long(c,
			   "SELECT count(to_regclass(p)) FROM (VALUES "
			   "('%s\"%s_p%s\"'), ('%s\"%s_p%s\"')) v(p)",
			   t->prefix, t->name, tags[0], t->prefix, t->name,
			   tags[1]);
}

/* A day past retention with more rows to carry than the drop moves under
 * the table's lock (a paused destination's backlog) stays, said in
 * r.kept, and the next day is dropped all the same; once few enough are
 * left, it goes with them carried. Before, the carry ran whatever its
 * size under the ACCESS EXCLUSIVE lock, every producer's insert waiting,
 * and past the statement timeout failed the round, each round. */
static void test_day_kept_for_its_rows(void **state)
{
	(void)state;
	char table[128], tags[3][16];
	struct outbox_table t;
	PGconn *c;
	struct store *s =
	    partitioned("part_kept", table, sizeof(table), &t, &c);
	two_old_days(c, table, &t, 10001, tags);
	struct partition_result r = tend(s, DAY_MS, 0);
	assert_int_equal(r.kept, 1);
	assert_int_equal(r.dropped, 1);
	assert_int_equal(r.carried, 1);
	assert_int_equal(parts_left(c, &t, tags), 1);
	assert_int_equal(pgtest_long(c, "SELECT count(*) FROM %s\"%s_p%s\"",
				     t.prefix, t.name, tags[0]),
			 10001);

	/* One sent: 10,000 left to carry, moved with the day's drop; the
	 * blocking rows of other days count for theirs alone. */
	char blocked[160];
	table_derived(&t, "_blocked_keys", blocked, sizeof(blocked));
	pgtest_exec(c,
		    "INSERT INTO %s (partition_key, blocking_id) SELECT 'k' || "
		    "g, gen_random_uuid() FROM generate_series(1, 5) g",
		    blocked);
	pgtest_exec(c,
		    "UPDATE %s\"%s_p%s\" SET status = 'sent', finished_at = "
		    "now() - interval '2 days' WHERE id = (SELECT id FROM "
		    "%s\"%s_p%s\" ORDER BY id LIMIT 1)",
		    t.prefix, t.name, tags[0], t.prefix, t.name, tags[0]);
	int64_t t0 = clock_ms();
	r = tend(s, DAY_MS, 0);
	printf("# carried %zu rows of 1 KB in one drop: %lld ms\n", r.carried,
	       (long long)(clock_ms() - t0));
	assert_int_equal(r.kept, 0);
	assert_int_equal(r.dropped, 1);
	assert_int_equal(r.carried, 10000);
	assert_int_equal(parts_left(c, &t, tags), 0);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM %s WHERE type = "
				     "'day' AND status = 'pending'",
				     table),
			 10001);
	store_close(s);
	PQfinish(c);
}

/* A drop that waits past its lock wait (a report reading the oldest day)
 * ends the round's drops: each would queue every writer behind its own
 * ACCESS EXCLUSIVE request in turn. The next round drops both. So does
 * a count of the day's rows that waits (behind another session's queued
 * ACCESS EXCLUSIVE request). */
static void test_drops_stop_at_a_lock(void **state)
{
	(void)state;
	char table[128], tags[3][16];
	struct outbox_table t;
	PGconn *c;
	struct store *s =
	    partitioned("part_lockd", table, sizeof(table), &t, &c);
	two_old_days(c, table, &t, 1, tags);
	PGconn *reader = pgtest_connect();
	PGconn *alter = pgtest_connect();
	struct partition_result r;
	for (int queued = 1; queued >= 0; queued--) {
		pgtest_exec(reader,
			    "BEGIN; LOCK TABLE %s\"%s_p%s\" IN ACCESS SHARE "
			    "MODE",
			    t.prefix, t.name, tags[0]);
		char sql[256];
		snprintf(sql, sizeof(sql),
			 "BEGIN; LOCK TABLE %s\"%s_p%s\" IN ACCESS EXCLUSIVE "
			 "MODE; COMMIT",
			 t.prefix, t.name, tags[0]);
		if (queued) {
			assert_int_equal(PQsendQuery(alter, sql), 1);
			clock_sleep_ms(200);
		}
		if (store_partitions_tend(s, 3, DAY_MS, 0, &r, err,
					  sizeof(err)) != 0)
			fail_msg("tend (queued %d): %s", queued, err);
		assert_true(r.busy);
		assert_int_equal(r.dropped, 0);
		assert_int_equal(parts_left(c, &t, tags), 2);
		pgtest_exec(reader, "COMMIT");
		for (PGresult *res; queued && (res = PQgetResult(alter));) {
			/* Queued, then had, not refused. */
			assert_int_equal(PQresultStatus(res), PGRES_COMMAND_OK);
			PQclear(res);
		}
	}
	PQfinish(alter);
	r = tend(s, DAY_MS, 0);
	assert_int_equal(r.dropped, 2);
	assert_int_equal(parts_left(c, &t, tags), 0);
	PQfinish(reader);
	store_close(s);
	PQfinish(c);
}

/* The validation of the days ahead's CHECK ends a minute before their
 * midnight and within 15 statement timeouts (the cleaner's thread waits
 * in it; /healthz reads a thread stuck after 25), a second in the last
 * minute. It was bounded by midnight alone, up to a day. */
static void test_validation_bounded(void **state)
{
	(void)state;
	const int64_t hour = 3600 * 1000LL;
	assert_int_equal(store_validate_bound_ms(20 * hour, 10000), 150000);
	assert_int_equal(store_validate_bound_ms(100000, 10000), 40000);
	assert_int_equal(store_validate_bound_ms(20 * hour, 0),
			 20 * hour - 60000);
	assert_int_equal(store_validate_bound_ms(61000, 10000), 1000);
	assert_int_equal(store_validate_bound_ms(60500, 10000), 1000);
	assert_int_equal(store_validate_bound_ms(30000, 10000), 1000);
}

/* A table just partitioned, its sequence where the old one was; the days
 * ahead not made (their creation waited past its lock wait: a
 * session holds the table): the CHECK on the default partition that none
 * of its rows lies in them goes too, so an insert of tomorrow's id lands
 * in the default. It stayed, and refused every insert of the day from its
 * midnight until a round made its partition or moved the check on. */
static void test_days_not_made_leave_no_check(void **state)
{
	(void)state;
	char table[128], dflt[160], lo[40], tag[16];
	struct outbox_table t;
	pgtest_fresh_table("part_nocheck", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	table_derived(&t, "_default", dflt, sizeof(dflt));
	PGconn *c = pgtest_connect();
	struct store_options o = pgtest_store_options(table);
	struct store *s = pgtest_store(&o);
	pgtest_insert(c, table, 3);
	if (store_partition_unrecorded(c, &t, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);
	/* The new identity's sequence as the old one left it, used: with
	 * nothing inserted since, ordered mode's check of the rows against
	 * it (check_seq) read it as 0, below them, and refused the table
	 * until the first insert. */
	long seq_last = pgtest_long(c,
				    "SELECT coalesce(pg_sequence_last_value("
				    "pg_get_serial_sequence('%s', 'seq')), 0)",
				    table);
	long seq_max = pgtest_long(c, "SELECT max(seq) FROM %s", table);
	if (seq_last < seq_max)
		fail_msg("the sequence is at %ld, the rows' seq at %ld",
			 seq_last, seq_max);

	/* The parent alone: the check and its validation (the default
	 * partition's) go by, the creation (the parent's) waits. */
	pgtest_exec(c, "BEGIN");
	pgtest_exec(c, "LOCK TABLE ONLY %s IN ACCESS SHARE MODE", table);
	struct partition_result r;
	if (store_partitions_tend(s, 3, DAY_MS, 0, &r, err, sizeof(err)) != 0)
		fail_msg("tend: %s", err);
	assert_true(r.busy);
	assert_int_equal(r.created, 0);
	pgtest_exec(c, "COMMIT");
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_constraint "
				     "WHERE conrelid = '%s'::regclass AND "
				     "conname = '%s_ahead'",
				     dflt, t.name),
			 0);
	day_of(c, 1, lo, tag);
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "INSERT INTO %s (id, type, payload) VALUES ('%s'::uuid, "
		 "'tomorrow', '{}')",
		 table, lo);
	PGresult *res = PQexec(c, sql);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		fail_msg("an insert of tomorrow's id: %s",
			 PQresultErrorMessage(res));
	PQclear(res);

	/* While tomorrow's row stays in the default partition no day is
	 * made (refused, said); a day past retention goes all the same,
	 * where every old day stayed while one ahead could not be made. */
	char old_lo[40], old_tag[16], old_hi[40], old_hi_tag[16];
	day_of(c, -3, old_lo, old_tag);
	day_of(c, -2, old_hi, old_hi_tag);
	pgtest_exec(c,
		    "CREATE TABLE %s\"%s_p%s\" PARTITION OF %s FOR VALUES "
		    "FROM ('%s') TO ('%s')",
		    t.prefix, t.name, old_tag, table, old_lo, old_hi);
	if (store_partitions_tend(s, 3, DAY_MS, 0, &r, err, sizeof(err)) == 0)
		fail_msg("a day ahead made with tomorrow's row in the default");
	if (!strstr(err, "no partition made for the next days"))
		fail_msg("tend: %s", err);
	assert_int_equal(r.created, 0);
	assert_int_equal(r.dropped, 1);

	/* The next round makes the days once that row is gone. */
	pgtest_exec(c, "DELETE FROM %s WHERE type = 'tomorrow'", table);
	assert_int_equal(tend(s, DAY_MS, 0).created, 3);
	store_close(s);
	PQfinish(c);
}

/* Another replica's cleaner holding the cleaner's lock from try
 * `from` of the check's drop until before try `until` (never when
 * until < 0), on a session of its own. */
struct cleaner_elsewhere {
	PGconn *c;
	const struct outbox_table *t;
	int from, until, tries;
};

static void cleaner_elsewhere_try(void *arg, int attempt)
{
	struct cleaner_elsewhere *e = arg;
	e->tries++;
	if (attempt == e->from)
		pgtest_exec(e->c, "SELECT pg_advisory_lock(%d, hashtext(%s))",
			    LOCK_NS_CLEAN, e->t->literal);
	if (attempt == e->until)
		pgtest_exec(e->c, "SELECT pg_advisory_unlock(%d, hashtext(%s))",
			    LOCK_NS_CLEAN, e->t->literal);
}

static long ahead_checks(PGconn *c, const char *dflt,
			 const struct outbox_table *t)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM pg_constraint WHERE conrelid "
			   "= '%s'::regclass AND conname = '%s_ahead'",
			   dflt, t->name);
}

/* The days ahead not made, and the cleaner's lock, which the check's drop
 * takes, held elsewhere as the drop begins (every clean batch of any
 * replica takes it): the drop is tried again until the lock is free, and
 * the check goes. Left in place, it refused every insert of those days
 * from the first one's midnight until a round replaced it. When no try
 * gets the lock, the check stays and the next round's replaces it. */
static void test_ahead_check_dropped_behind_another_cleaner(void **state)
{
	(void)state;
	char table[128], dflt[160];
	struct outbox_table t;
	PGconn *c;
	struct store *s =
	    partitioned("part_dropbusy", table, sizeof(table), &t, &c);
	table_derived(&t, "_default", dflt, sizeof(dflt));
	struct cleaner_elsewhere other = {
	    .c = pgtest_connect(), .t = &t, .from = 0, .until = 2};
	store_on_ahead_drop_try(s, cleaner_elsewhere_try, &other);

	/* The parent alone: the check goes on the default partition, the
	 * creation (the parent's) waits past its lock wait. */
	pgtest_exec(c, "BEGIN");
	pgtest_exec(c, "LOCK TABLE ONLY %s IN ACCESS SHARE MODE", table);
	struct partition_result r;
	if (store_partitions_tend(s, 3, DAY_MS, 0, &r, err, sizeof(err)) != 0)
		fail_msg("tend: %s", err);
	assert_true(r.busy);
	assert_int_equal(r.created, 0);
	assert_int_equal(ahead_checks(c, dflt, &t), 0);
	assert_int_equal(other.tries, 3);

	/* Held through every try: the check stays, said; the next round,
	 * the table free, replaces it and makes the days. */
	other = (struct cleaner_elsewhere){
	    .c = other.c, .t = &t, .from = 0, .until = -1};
	if (store_partitions_tend(s, 3, DAY_MS, 0, &r, err, sizeof(err)) != 0)
		fail_msg("tend: %s", err);
	assert_true(r.busy);
	assert_int_equal(other.tries, 5);
	assert_int_equal(ahead_checks(c, dflt, &t), 1);
	pgtest_exec(c, "COMMIT");
	pgtest_exec(other.c, "SELECT pg_advisory_unlock_all()");
	store_on_ahead_drop_try(s, NULL, NULL);
	assert_int_equal(tend(s, DAY_MS, 0).created, 3);
	assert_int_equal(ahead_checks(c, dflt, &t), 1);
	store_close(s);
	PQfinish(other.c);
	PQfinish(c);
}

static bool index_valid(PGconn *c, const char *index)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM pg_index WHERE indexrelid = "
			   "'%s'::regclass AND indisvalid",
			   index) == 1;
}

/* The children of index (a partitioned index) that are attached to it. */
static long attached(PGconn *c, const char *index)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM pg_partition_tree('%s') "
			   "WHERE level = 1",
			   index);
}

/* A later migration's CREATE INDEX CONCURRENTLY on the partitioned table
 * (docs/design.md §11, "Later migrations"): Postgres refuses it as
 * written, so migrate builds it on the parent alone and then on each
 * partition, attaching each. A run cut short (the parent's index made,
 * one partition's built and not attached, another's left invalid by a
 * failed build) is completed by the next; a rerun changes nothing;
 * partitions made later have it. On the plain table the statement runs
 * as written. */
static void test_later_migration_index(void **state)
{
	(void)state;
	static const char later[] =
	    "-- outbox:no-transaction\n"
	    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{{n}}_later_idx\"\n"
	    "  ON {{table}} (type, seq) WHERE status = 'pending'";
	char table[128], index[200], dflt[200], tag[16], lo[40], part[200];
	struct outbox_table t;
	PGconn *c = pgtest_connect();
	if (!pgtest_partitioned()) {
		pgtest_fresh_table("part_later_plain", table, sizeof(table));
		assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
		if (store_migration_unrecorded(c, &t, later, err,
					       sizeof(err)) != 0)
			fail_msg("the plain table's index: %s", err);
		snprintf(index, sizeof(index), "%s\"%s_later_idx\"", t.prefix,
			 t.name);
		assert_true(index_valid(c, index));
	}
	pgtest_fresh_table("part_later", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	struct store_options o = pgtest_store_options(table);
	struct store *s = pgtest_store(&o);
	if (!pgtest_partitioned() &&
	    store_partition_unrecorded(c, &t, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);
	tend(s, DAY_MS, 0);
	pgtest_insert(c, table, 20);
	day_of(c, 1, lo, tag);
	insert_in_day(c, table, lo, 1, "pending", "NULL");
	insert_in_day(c, table, lo, 2, "pending", "NULL");
	snprintf(index, sizeof(index), "%s\"%s_later_idx\"", t.prefix, t.name);
	snprintf(dflt, sizeof(dflt), "%s\"%s_default\"", t.prefix, t.name);
	snprintf(part, sizeof(part), "%s\"%s_p%s\"", t.prefix, t.name, tag);
	long parts = pgtest_long(
	    c, "SELECT count(*) FROM pg_partition_tree('%s') WHERE level = 1",
	    table);
	assert_true(parts >= 4);

	/* Cut short: the parent's index, the default's built and not
	 * attached, tomorrow's left invalid by a failed build (unique on
	 * its two rows' status). */
	pgtest_exec(c,
		    "CREATE INDEX \"%s_later_idx\" ON ONLY %s (type, seq) "
		    "WHERE status = 'pending'",
		    t.name, table);
	pgtest_exec(c,
		    "CREATE INDEX \"%s_default_later_idx\" ON %s (type, seq) "
		    "WHERE status = 'pending'",
		    t.name, dflt);
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "CREATE UNIQUE INDEX CONCURRENTLY \"%s_p%s_later_idx\" ON %s "
		 "(status)",
		 t.name, tag, part);
	PGresult *res = PQexec(c, sql);
	assert_int_equal(PQresultStatus(res), PGRES_FATAL_ERROR);
	PQclear(res);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_index WHERE "
				     "indrelid = '%s'::regclass AND NOT "
				     "indisvalid",
				     part),
			 1);
	assert_int_equal(attached(c, index), 0);

	if (store_migration_unrecorded(c, &t, later, err, sizeof(err)) != 0)
		fail_msg("the later index on the partitioned table: %s", err);
	assert_int_equal(attached(c, index), parts);
	assert_true(index_valid(c, index));
	/* The leftover was built again as the migration says. */
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_index i JOIN "
				     "pg_partition_tree('%s') p ON p.relid = "
				     "i.indexrelid WHERE p.level = 1 AND "
				     "(NOT i.indisvalid OR i.indisunique)",
				     index),
			 0);

	if (store_migration_unrecorded(c, &t, later, err, sizeof(err)) != 0)
		fail_msg("the rerun: %s", err);
	assert_int_equal(attached(c, index), parts);
	struct partition_result r;
	if (store_partitions_tend(s, 5, DAY_MS, 0, &r, err, sizeof(err)) != 0)
		fail_msg("tend: %s", err);
	assert_true(r.created > 0);
	long more = pgtest_long(
	    c, "SELECT count(*) FROM pg_partition_tree('%s') WHERE level = 1",
	    table);
	assert_true(more > parts);
	assert_int_equal(attached(c, index), more);
	store_close(s);
	PQfinish(c);
}

/* A later migration's index cut short on the partitioned table, its
 * partitions without it dropped since (the cleaner's retention): nothing
 * is left to attach, and Postgres makes the parent's index valid only
 * when the last partition's is attached. The next run drops it and builds
 * it again, valid. */
static void test_later_index_after_its_partitions_dropped(void **state)
{
	(void)state;
	static const char later[] =
	    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{{n}}_gone_idx\"\n"
	    "  ON {{table}} (type, seq) WHERE status = 'pending'";
	char table[128], index[200], dflt[200];
	struct outbox_table t;
	PGconn *c = pgtest_connect();
	pgtest_fresh_table("part_gone", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	struct store_options o = pgtest_store_options(table);
	struct store *s = pgtest_store(&o);
	if (store_partition_unrecorded(c, &t, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);
	tend(s, DAY_MS, 0);
	snprintf(index, sizeof(index), "%s\"%s_gone_idx\"", t.prefix, t.name);
	snprintf(dflt, sizeof(dflt), "%s\"%s_default\"", t.prefix, t.name);
	/* Cut short: the parent's and the default's, attached; the days
	 * without, then dropped. */
	pgtest_exec(c,
		    "CREATE INDEX \"%s_gone_idx\" ON ONLY %s (type, seq) WHERE "
		    "status = 'pending'",
		    t.name, table);
	pgtest_exec(c,
		    "CREATE INDEX \"%s_default_gone_idx\" ON %s (type, seq) "
		    "WHERE status = 'pending'; ALTER INDEX %s ATTACH PARTITION "
		    "%s\"%s_default_gone_idx\"",
		    t.name, dflt, index, t.prefix, t.name);
	char sql[512];
	snprintf(sql, sizeof(sql),
		 "SELECT string_agg('DROP TABLE ' || relid::regclass::text, "
		 "'; ') FROM pg_partition_tree('%s') WHERE level = 1 AND relid "
		 "<> '%s'::regclass",
		 table, dflt);
	PGresult *res = PQexec(c, sql);
	assert_int_equal(PQresultStatus(res), PGRES_TUPLES_OK);
	char drops[1024];
	snprintf(drops, sizeof(drops), "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	pgtest_exec(c, "%s", drops);
	assert_false(index_valid(c, index));

	if (store_migration_unrecorded(c, &t, later, err, sizeof(err)) != 0)
		fail_msg("the index after its partitions were dropped: %s",
			 err);
	assert_true(index_valid(c, index));
	assert_int_equal(attached(c, index), 1);
	store_close(s);
	PQfinish(c);
}

/* A later migration's index build on its own session, for a thread. */
struct later_build {
	const struct outbox_table *t;
	const char *sql;
	int rc;
	char why[1024];
};

static void *build_later(void *arg)
{
	struct later_build *b = arg;
	PGconn *c = pgtest_connect();
	b->rc =
	    store_migration_unrecorded(c, b->t, b->sql, b->why, sizeof(b->why));
	PQfinish(c);
	return NULL;
}

/* The per-partition build beside the producers: each partition's is
 * concurrent, so a build that waits for a held snapshot (a report, a
 * pg_dump) holds up no insert, where CREATE INDEX on the partitioned
 * table would hold a SHARE lock on every partition for the whole build. */
static void test_later_index_beside_writers(void **state)
{
	(void)state;
	static const char later[] =
	    "CREATE INDEX CONCURRENTLY IF NOT EXISTS \"{{n}}_beside_idx\"\n"
	    "  ON {{table}} (type, seq) WHERE status = 'pending'";
	char table[128], index[200];
	struct outbox_table t;
	pgtest_fresh_table("part_beside", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	PGconn *c = pgtest_connect(), *holder = pgtest_connect();
	if (!pgtest_partitioned() &&
	    store_partition_unrecorded(c, &t, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);
	pgtest_insert(c, table, 100);
	/* A snapshot held on another table: it locks nothing of the
	 * outbox, and every concurrent build waits for it. */
	pgtest_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(holder, "SELECT count(*) FROM pg_class");
	struct later_build b = {.t = &t, .sql = later};
	pthread_t builder;
	assert_int_equal(pthread_create(&builder, NULL, build_later, &b), 0);
	long waiting = 0;
	for (int i = 0; i < 300 && !waiting; i++) {
		waiting = pgtest_long(
		    c, "SELECT count(*) FROM pg_stat_activity WHERE query LIKE "
		       "'CREATE INDEX CONCURRENTLY%%' AND wait_event = "
		       "'virtualxid'");
		if (!waiting)
			usleep(100 * 1000);
	}
	if (!waiting) {
		pgtest_exec(holder, "ROLLBACK");
		pthread_join(builder, NULL);
		fail_msg("no build waited for the held snapshot (%s)",
			 b.rc ? b.why : "the build ended");
	}
	/* While it waits, inserts go on, none waiting a second for a lock. */
	pgtest_exec(c, "SET lock_timeout = '1s'");
	for (int i = 0; i < 20; i++)
		pgtest_insert(c, table, 1);
	pgtest_exec(c, "RESET lock_timeout");
	pgtest_exec(holder, "ROLLBACK");
	assert_int_equal(pthread_join(builder, NULL), 0);
	if (b.rc != 0)
		fail_msg("the build: %s", b.why);
	snprintf(index, sizeof(index), "%s\"%s_beside_idx\"", t.prefix, t.name);
	assert_true(index_valid(c, index));
	PQfinish(holder);
	PQfinish(c);
}

/* migrate on a live table */
static void *migrate_live(void *arg)
{
	struct migration *m = arg;
	FILE *out = fmemopen(m->text, sizeof(m->text), "w");
	m->rc = store_migrate(&m->o, false, out, m->why, sizeof(m->why));
	if (out)
		fclose(out);
	return NULL;
}

/* The finished rows' index split by status (docs/design.md §11): a table
 * partitioned before it, with its one B-tree of sent and failed rows on
 * the parent, rows in every state in the default partition and in a
 * day's, a lease open and a producer writing, gets the split from
 * migrate: the failed rows' B-tree and the sent rows' BRIN on every
 * partition, the default's own B-tree of both, the old index gone, no
 * insert refused; watch and redrive then read the rows of both
 * partitions; a rerun has nothing to do. */
static void test_finished_index_split_live(void **state)
{
	(void)state;
	char table[128], lo[40], tag[16], old[200], failed[200], brin[200],
	    dfin[200];
	struct outbox_table t;
	pgtest_fresh_table("part_split", table, sizeof(table));
	assert_int_equal(table_parse(table, &t, err, sizeof(err)), 0);
	snprintf(old, sizeof(old), "%s\"%s_terminal_idx\"", t.prefix, t.name);
	snprintf(failed, sizeof(failed), "%s\"%s_failed_idx\"", t.prefix,
		 t.name);
	snprintf(brin, sizeof(brin), "%s\"%s_sent_brin\"", t.prefix, t.name);
	snprintf(dfin, sizeof(dfin), "%s\"%s_d_finished_idx\"", t.prefix,
		 t.name);
	PGconn *c = pgtest_connect();
	if (store_partition_unrecorded(c, &t, err, sizeof(err)) != 0)
		fail_msg("partition: %s", err);
	assert_true(index_valid(c, failed) && index_valid(c, brin) &&
		    index_valid(c, dfin));
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_class WHERE "
				     "oid = to_regclass('%s')",
				     old),
			 0);
	/* The shape of a table partitioned before the split. */
	pgtest_exec(c,
		    "DROP INDEX %s, %s; DROP INDEX %s; CREATE INDEX "
		    "\"%s_terminal_idx\" ON %s (status, finished_at) WHERE "
		    "status IN ('sent', 'failed')",
		    failed, brin, dfin, t.name, table);
	struct store_options o = pgtest_store_options(table);
	struct store *s = pgtest_store(&o);
	tend(s, DAY_MS, 0);
	long parts = pgtest_long(
	    c, "SELECT count(*) FROM pg_partition_tree('%s') WHERE level = 1",
	    table);
	assert_true(parts >= 4);

	/* Rows in every state: in the default partition (ids of now) due,
	 * sent, failed, a retry in backoff; in tomorrow's sent, failed and
	 * due; and 4 leased below. */
	pgtest_insert(c, table, 20);
	pgtest_exec(c,
		    "UPDATE %s SET status = 'sent', finished_at = now() - "
		    "interval '1 minute' WHERE seq <= 5; UPDATE %s SET status "
		    "= 'failed', finished_at = now(), attempts = 10, "
		    "last_error = 'x' WHERE seq BETWEEN 6 AND 8; UPDATE %s SET "
		    "next_attempt_at = now() + interval '1 hour', attempts = 2 "
		    "WHERE seq = 9",
		    table, table, table);
	day_of(c, 1, lo, tag);
	for (int i = 1; i <= 4; i++)
		insert_in_day(c, table, lo, i, "sent",
			      "now() - interval '1 minute'");
	insert_in_day(c, table, lo, 5, "failed", "now()");
	insert_in_day(c, table, lo, 6, "pending", "NULL");

	o.batch_size = 4;
	struct store *relay = pgtest_store(&o);
	struct lease_batch b;
	if (store_lease(relay, NULL, 0, "", &b, err, sizeof(err)) != 0)
		fail_msg("lease: %s", err);
	assert_int_equal(b.n, 4);
	struct producer p = {.table = table};
	struct migration m = {.o = pgtest_store_options(table)};
	beside_lease_and_producer(migrate_live, &m, relay, &b, &p);
	store_close(relay);
	if (m.rc != 0)
		fail_msg("migrate: %s", m.why);
	if (!strstr(m.text, "indexed by status"))
		fail_msg("said: %s", m.text);
	if (p.refused)
		fail_msg("%d of the producer's inserts refused: %s", p.refused,
			 p.why);
	assert_true(p.inserted > 0);

	/* The shape: both new indexes valid on every partition, the
	 * default's own, the old one gone. */
	assert_true(index_valid(c, failed) && index_valid(c, brin) &&
		    index_valid(c, dfin));
	assert_int_equal(attached(c, failed), parts);
	assert_int_equal(attached(c, brin), parts);
	assert_int_equal(pgtest_long(c,
				     "SELECT count(*) FROM pg_class WHERE "
				     "oid = to_regclass('%s')",
				     old),
			 0);

	/* watch counts the finished rows of both partitions; redrive moves
	 * every one back to pending. */
	cJSON *doc = NULL;
	assert_int_equal(store_admin_watch(s, 600000, &doc, err, sizeof(err)),
			 0);
	assert_int_equal(cJSON_GetObjectItem(doc, "sent")->valuedouble,
			 5 + 4 + 4);
	assert_int_equal(
	    cJSON_GetObjectItem(doc, "failed_attempts_spent")->valuedouble +
		cJSON_GetObjectItem(doc, "failed_permanent")->valuedouble,
	    3 + 1);
	cJSON_Delete(doc);
	size_t moved = 0;
	struct redrive_filter f = {.sent = true};
	if (store_redrive(s, &f, &moved, err, sizeof(err)) != 0)
		fail_msg("redrive sent: %s", err);
	assert_int_equal(moved, 5 + 4 + 4);
	f.sent = false;
	if (store_redrive(s, &f, &moved, err, sizeof(err)) != 0)
		fail_msg("redrive failed: %s", err);
	assert_int_equal(moved, 3 + 1);
	assert_int_equal(count(c, table, "status IN ('sent', 'failed')"), 0);
	assert_int_equal(count(c, table, "status = 'pending'"),
			 20 + 6 + p.inserted);

	/* Done before: nothing to do. */
	struct migration again = {.o = pgtest_store_options(table)};
	migrate_live(&again);
	if (again.rc != 0)
		fail_msg("migrate again: %s", again.why);
	assert_null(strstr(again.text, "indexed by status"));
	store_close(s);
	PQfinish(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_live_table_becomes_partitioned),
	    cmocka_unit_test(test_dependents_refused),
	    cmocka_unit_test(test_invalid_index_dropped_first),
	    cmocka_unit_test(test_not_valid_check_refused),
	    cmocka_unit_test(test_partitions_by_the_day),
	    cmocka_unit_test(test_tend_behind_another_cleaner),
	    cmocka_unit_test(test_default_partition_without_identity),
	    cmocka_unit_test(test_days_not_made_leave_no_check),
	    cmocka_unit_test(test_ahead_check_dropped_behind_another_cleaner),
	    cmocka_unit_test(test_day_dropped_by_another_replica),
	    cmocka_unit_test(test_day_kept_for_its_rows),
	    cmocka_unit_test(test_drops_stop_at_a_lock),
	    cmocka_unit_test(test_validation_bounded),
	    cmocka_unit_test(test_later_migration_index),
	    cmocka_unit_test(test_later_index_beside_writers),
	    cmocka_unit_test(test_finished_index_split_live),
	    cmocka_unit_test(test_later_index_after_its_partitions_dropped),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
