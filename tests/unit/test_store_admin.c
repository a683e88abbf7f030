/* SPDX-License-Identifier: MIT */
/*
 * The store's operator statements against a real Postgres: registry
 * heartbeats, dead and pruned replicas, the gauge query, status, pauses
 * and time arguments. Time moves by updating rows.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pgtest.h"
#include "store/store.h"
#include "store/store_test.h"
#include "base/base.h"
#include "ops/metrics_text.h"

static char err[1024];

struct fixture {
	char table[128];
	struct outbox_table t;
	PGconn *conn;	 /* the test's own session */
	PGconn *rep;	 /* a replication session, or NULL */
	PGconn *holder;	 /* a session holding the horizon, or NULL */
	PGconn *writer;	 /* a producer's session, or NULL */
	struct store *s; /* the store under test */
};

/* A store as the operator commands open it: statements unprepared. */
static struct store *admin_store(const char *table)
{
	struct store_options o = pgtest_store_options(table);
	o.prepare = false;
	return pgtest_store(&o);
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	pgtest_fresh_table("admin", f->table, sizeof(f->table));
	assert_int_equal(table_parse(f->table, &f->t, err, sizeof(err)), 0);
	f->conn = pgtest_connect();
	f->s = admin_store(f->table);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;
	/* A test that failed midway must not hang here on a lock. */
	store_close(f->s);
	/* A horizon test that failed midway leaves no holder behind for the
	 * tests after it: its slot is let go, then dropped. */
	pgtest_exec(f->conn,
		    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
		    "WHERE application_name = 'hz-vacuum-%s'",
		    f->t.schema);
	if (f->holder)
		PQfinish(f->holder);
	if (f->writer)
		PQfinish(f->writer);
	if (f->rep) {
		PQfinish(f->rep);
		for (int i = 0; i < 100 && pgtest_long(f->conn,
						       "SELECT count(*) FROM "
						       "pg_replication_slots "
						       "WHERE slot_name = "
						       "'hz_%s' AND active",
						       f->t.schema) > 0;
		     i++)
			usleep(100000);
	}
	PGresult *r = PQexecParams(
	    f->conn,
	    "SELECT 'ROLLBACK PREPARED ' || quote_literal(gid) FROM "
	    "pg_prepared_xacts WHERE gid LIKE 'hz-prepared-' || $1 || '%' "
	    "UNION ALL "
	    "SELECT format('SELECT pg_drop_replication_slot(%L)', slot_name) "
	    "FROM pg_replication_slots WHERE slot_name = 'hz_' || $1",
	    1, NULL, (const char *const[]){f->t.schema}, NULL, NULL, 0);
	for (int i = 0;
	     PQresultStatus(r) == PGRES_TUPLES_OK && i < PQntuples(r); i++)
		PQclear(PQexec(f->conn, PQgetvalue(r, i, 0)));
	PQclear(r);
	pgtest_exec(f->conn, "SET lock_timeout = '10s'");
	pgtest_exec(f->conn, "DROP SCHEMA \"%s\" CASCADE", f->t.schema);
	pgtest_exec(f->conn, "DROP ROLE IF EXISTS hz_role_%s", f->t.schema);
	pgtest_exec(f->conn, "DROP DATABASE IF EXISTS hz_db_%s WITH (FORCE)",
		    f->t.schema);
	PQfinish(f->conn);
	free(f);
	return 0;
}

static void heartbeat(struct fixture *f, const char *id, bool draining,
		      bool starting)
{
	struct store_kept kept = {.sent_ms = 86400000,
				  .failed_ms = 7 * 86400000LL};
	if (store_admin_heartbeat(f->s, id, "9.9.9", kept, draining, starting,
				  err, sizeof(err)) != 0)
		fail_msg("heartbeat: %s", err);
}

static struct store_gauges gauges_of(struct store *s)
{
	struct store_gauges g;
	if (store_admin_gauges(s, &g, err, sizeof(err)) != 0)
		fail_msg("gauges: %s", err);
	return g;
}

static struct store_gauges gauges(struct fixture *f)
{
	return gauges_of(f->s);
}

static cJSON *status(struct fixture *f)
{
	cJSON *st = NULL;
	if (store_admin_status(f->s, 50, &st, err, sizeof(err)) != 0)
		fail_msg("status: %s", err);
	return st;
}

static const cJSON *get(const cJSON *obj, const char *key)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
	if (!v)
		fail_msg("no member '%s'", key);
	return v;
}

static double num(const cJSON *obj, const char *key)
{
	const cJSON *v = get(obj, key);
	if (!cJSON_IsNumber(v))
		fail_msg("member '%s' is not a number", key);
	return v->valuedouble;
}

static const char *str(const cJSON *obj, const char *key)
{
	const cJSON *v = get(obj, key);
	if (!cJSON_IsString(v))
		fail_msg("member '%s' is not a string", key);
	return v->valuestring;
}

/* The array element whose member key equals value. */
static const cJSON *find(const cJSON *arr, const char *key, const char *value)
{
	const cJSON *item;
	cJSON_ArrayForEach(item, arr)
	{
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(item, key);
		if (cJSON_IsString(v) && strcmp(v->valuestring, value) == 0)
			return item;
	}
	fail_msg("no element with %s = %s", key, value);
	return NULL;
}

static void test_registry(void **state)
{
	struct fixture *f = *state;
	char reg[160];
	table_derived(&f->t, "_replicas", reg, sizeof(reg));

	heartbeat(f, "host-a/1", false, true);
	heartbeat(f, "host-b/2", false, true);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s "
				     "WHERE state = 'alive' AND "
				     "version = '9.9.9' AND protocol = %d "
				     "AND retention_ms = 86400000 AND "
				     "failed_retention_ms = 604800000",
				     reg, STORE_PROTOCOL),
			 2);
	assert_int_equal(gauges(f).live_replicas, 2);

	/* A later heartbeat keeps started_at unless the process restarted. */
	pgtest_exec(f->conn,
		    "UPDATE %s SET started_at = now() - interval '1 hour', "
		    "last_seen_at = now() - interval '10 seconds'",
		    reg);
	heartbeat(f, "host-a/1", false, false);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE id = "
				     "'host-a/1' AND started_at < now() - "
				     "interval '59 minutes' AND last_seen_at "
				     "> now() - interval '2 seconds'",
				     reg),
			 1);
	heartbeat(f, "host-b/2", false, true);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE id = "
				     "'host-b/2' AND started_at > now() - "
				     "interval '2 seconds'",
				     reg),
			 1);

	/* Draining is written and kept. */
	heartbeat(f, "host-b/2", true, false);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE id = "
				     "'host-b/2' AND state = 'draining'",
				     reg),
			 1);

	/* Silent for longer than the threshold: dead, in gauges and status. */
	pgtest_exec(
	    f->conn,
	    "UPDATE %s SET last_seen_at = now() - interval '16 seconds' "
	    "WHERE id = 'host-b/2'",
	    reg);
	assert_int_equal(gauges(f).live_replicas, 1);
	cJSON *st = status(f);
	const cJSON *reps = get(st, "replicas");
	assert_int_equal(cJSON_GetArraySize(reps), 2);
	const cJSON *a = find(reps, "id", "host-a/1");
	const cJSON *b = find(reps, "id", "host-b/2");
	assert_true(cJSON_IsTrue(get(a, "alive")));
	assert_true(cJSON_IsFalse(get(b, "alive")));
	assert_string_equal(str(b, "state"), "draining");
	assert_true(num(b, "last_seen_seconds_ago") >= 16);
	assert_true(num(a, "up_seconds") >= 3540);
	assert_true(num(a, "retention_ms") == 86400000);
	assert_true(num(a, "failed_retention_ms") == 604800000);
	cJSON_Delete(st);

	/* Rows silent for a day are pruned by anyone's heartbeat. */
	pgtest_exec(f->conn,
		    "UPDATE %s SET last_seen_at = now() - interval '25 hours' "
		    "WHERE id = 'host-b/2'",
		    reg);
	heartbeat(f, "host-a/1", false, false);
	assert_int_equal(pgtest_long(f->conn, "SELECT count(*) FROM %s", reg),
			 1);

	/* A clean stop leaves the registry. */
	assert_int_equal(store_admin_forget(f->s, "host-a/1", err, sizeof(err)),
			 0);
	assert_int_equal(pgtest_long(f->conn, "SELECT count(*) FROM %s", reg),
			 0);
	assert_int_equal(gauges(f).live_replicas, 0);
}

#define HOUR_MS INT64_C(3600000)

static struct store_kept kept_of(struct fixture *f, int64_t sent_ms,
				 int64_t failed_ms, enum store_kept_for asked)
{
	return store_admin_kept(
	    f->s,
	    (struct store_kept){.sent_ms = sent_ms, .failed_ms = failed_ms},
	    asked);
}

/* A relay in the registry keeping rows sent_ms and failed_ms ("NULL": a
 * relay older than the record), seen secs_ago. */
static void registered(struct fixture *f, const char *reg, const char *id,
		       const char *sent_ms, const char *failed_ms, int secs_ago)
{
	pgtest_exec(
	    f->conn,
	    "INSERT INTO %s (id, version, started_at, last_seen_at, "
	    "state, protocol, retention_ms, failed_retention_ms) VALUES "
	    "('%s', 'x', now(), now() - %d * interval '1 second', "
	    "'alive', 1, %s, %s)",
	    reg, id, secs_ago, sent_ms, failed_ms);
}

static void expect_kept(struct store_kept k, int64_t sent_ms, int64_t failed_ms)
{
	if (k.sent_ms != sent_ms || k.failed_ms != failed_ms)
		fail_msg("kept %lld and %lld ms, want %lld and %lld",
			 (long long)k.sent_ms, (long long)k.failed_ms,
			 (long long)sent_ms, (long long)failed_ms);
}

/* What operator commands go by: the shortest retentions the relays
 * record (a failed retention of 0, kept for good, the longest). A drop
 * asks what the live relays keep; a redrive since when a row may be gone,
 * a stopped relay's retention grown by its silence. The command's own
 * only where the registry cannot tell. */
/* One relay's heartbeat in several tables' registries at once (a relay
 * of several tables, src/ops/registries.c): each row written or moved,
 * started_at kept, nothing pruned; a registry gone fails it whole. */
static void test_registry_group(void **state)
{
	struct fixture *f = *state;
	char other[2][128], reg[3][160];
	struct outbox_table t[2];
	struct store *st[3] = {f->s, NULL, NULL};
	table_derived(&f->t, "_replicas", reg[0], sizeof(reg[0]));
	for (int k = 0; k < 2; k++) {
		pgtest_fresh_table("admin_g", other[k], sizeof(other[k]));
		assert_int_equal(table_parse(other[k], &t[k], err, sizeof(err)),
				 0);
		table_derived(&t[k], "_replicas", reg[k + 1],
			      sizeof(reg[k + 1]));
		struct store_options o = pgtest_store_options(other[k]);
		o.prepare = false;
		if (store_open_sharing(&st[k + 1], &o, f->s, err,
				       sizeof(err)) != 0)
			fail_msg("open: %s", err);
	}
	heartbeat(f, "host-a/1", false, true);
	pgtest_exec(f->conn,
		    "UPDATE %s SET started_at = now() - interval '1 hour', "
		    "last_seen_at = now() - interval '10 seconds'",
		    reg[0]);
	/* A dead relay's row, silent for two days: a group does not prune. */
	pgtest_exec(f->conn,
		    "INSERT INTO %s (id, version, started_at, last_seen_at, "
		    "state) VALUES ('host-z/9', '1', now() - interval '3 "
		    "days', now() - interval '2 days', 'alive')",
		    reg[2]);

	struct store_kept kept = {.sent_ms = 3600000, .failed_ms = 7200000};
	if (store_admin_heartbeat_group(st, 3, "host-a/1", "9.9.10", kept, true,
					err, sizeof(err)) != 0)
		fail_msg("group heartbeat: %s", err);
	for (int k = 0; k < 3; k++)
		assert_int_equal(
		    pgtest_long(f->conn,
				"SELECT count(*) FROM %s WHERE id = 'host-a/1' "
				"AND version = '9.9.10' AND state = 'draining' "
				"AND protocol = %d AND retention_ms = 3600000 "
				"AND failed_retention_ms = 7200000 AND "
				"last_seen_at > now() - interval '2 seconds'",
				reg[k], STORE_PROTOCOL),
		    1);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE started_at "
				     "< now() - interval '59 minutes'",
				     reg[0]),
			 1);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE id = "
				     "'host-z/9'",
				     reg[2]),
			 1);
	/* One table alone is one statement too. */
	if (store_admin_heartbeat_group(st + 1, 1, "host-b/2", "9.9.10", kept,
					false, err, sizeof(err)) != 0)
		fail_msg("group of one: %s", err);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE id = "
				     "'host-b/2' AND state = 'alive'",
				     reg[1]),
			 1);

	/* A table of the group that fails its check after a reconnect (here
	 * renamed away) fails the group, and no table of it is beaten: the
	 * statement ran as the first store's, and beat the others'
	 * registries unchecked. */
	assert_int_equal(store_reconnect(f->s, err, sizeof(err)), 0);
	pgtest_exec(f->conn, "ALTER TABLE %s RENAME TO outbox_events_away",
		    other[1]);
	pgtest_exec(f->conn,
		    "UPDATE %s SET last_seen_at = now() - interval '1 minute'",
		    reg[2]);
	assert_int_not_equal(store_admin_heartbeat_group(st, 3, "host-a/1",
							 "9.9.10", kept, false,
							 err, sizeof(err)),
			     0);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE "
				     "last_seen_at > now() - interval '30 "
				     "seconds'",
				     reg[2]),
			 0);
	pgtest_exec(f->conn,
		    "ALTER TABLE \"%s\".outbox_events_away RENAME TO "
		    "outbox_events",
		    t[1].schema);

	/* A registry gone: the group fails whole, with why, none beaten. */
	pgtest_exec(f->conn, "DROP TABLE %s", reg[1]);
	pgtest_exec(f->conn,
		    "UPDATE %s SET last_seen_at = now() - interval '1 minute'",
		    reg[0]);
	assert_int_not_equal(store_admin_heartbeat_group(st, 3, "host-a/1",
							 "9.9.10", kept, false,
							 err, sizeof(err)),
			     0);
	assert_non_null(strstr(err, "42P01"));
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE "
				     "last_seen_at > now() - interval '30 "
				     "seconds'",
				     reg[0]),
			 0);

	/* Stores of two sessions cannot share one statement. */
	struct store *apart = admin_store(other[0]);
	struct store *pair[2] = {f->s, apart};
	assert_int_equal(store_admin_heartbeat_group(pair, 2, "host-a/1",
						     "9.9.10", kept, false, err,
						     sizeof(err)),
			 STORE_ERROR);
	assert_non_null(strstr(err, "do not share a session"));
	store_close(apart);
	for (int k = 0; k < 2; k++) {
		store_close(st[k + 1]);
		pgtest_exec(f->conn, "DROP SCHEMA \"%s\" CASCADE", t[k].schema);
	}
}

static void test_kept_by_relays(void **state)
{
	struct fixture *f = *state;
	char reg[160];
	table_derived(&f->t, "_replicas", reg, sizeof(reg));
	const int64_t day = 24 * HOUR_MS, week = 168 * HOUR_MS;
	/* Seen an hour ahead: alive however slowly the test runs. */
	const int LIVE = -3600;
	/* None registered, or only relays older than the record: the
	 * command's own. */
	expect_kept(kept_of(f, day, week, STORE_KEPT_LIVE), day, week);
	expect_kept(kept_of(f, day, -1, STORE_KEPT_SINCE), day, -1);
	registered(f, reg, "old/1", "NULL", "NULL", LIVE);
	expect_kept(kept_of(f, day, week, STORE_KEPT_LIVE), day, week);

	/* Live relays: the shortest of theirs, shorter or longer than the
	 * command's own; one keeping failed rows for good keeps none longer
	 * than another's 3 days. Beside the older relay, the command's own
	 * where shorter. */
	registered(f, reg, "a/1", "3600000", "0", LIVE);
	registered(f, reg, "b/1", "604800000", "259200000", LIVE);
	expect_kept(kept_of(f, day, week, STORE_KEPT_LIVE), HOUR_MS,
		    72 * HOUR_MS);
	expect_kept(kept_of(f, 0, day, STORE_KEPT_LIVE), 0, day);
	pgtest_exec(f->conn, "DELETE FROM %s WHERE id = 'old/1'", reg);
	expect_kept(kept_of(f, 0, 0, STORE_KEPT_LIVE), HOUR_MS, 72 * HOUR_MS);

	/* A relay without history stopped a minute ago: the running relays
	 * keep what they keep, but rows may be gone up to a minute ago. */
	registered(f, reg, "gone/1", "0", "3600000", 60);
	expect_kept(kept_of(f, day, week, STORE_KEPT_LIVE), HOUR_MS,
		    72 * HOUR_MS);
	struct store_kept k = kept_of(f, day, -1, STORE_KEPT_SINCE);
	if (k.sent_ms < 60000 || k.sent_ms > 120000 || k.failed_ms != -1)
		fail_msg("a relay stopped a minute ago: kept %lld ms",
			 (long long)k.sent_ms);
	/* Stopped two days ago: its silence outgrew the live relays'
	 * hour. */
	pgtest_exec(f->conn,
		    "UPDATE %s SET last_seen_at = now() - interval '2 days' "
		    "WHERE id = 'gone/1'",
		    reg);
	k = kept_of(f, day, -1, STORE_KEPT_SINCE);
	if (k.sent_ms < HOUR_MS || k.sent_ms > HOUR_MS + 60000)
		fail_msg("a relay stopped two days ago: kept %lld ms",
			 (long long)k.sent_ms);
	/* The command's own where shorter: a relay that stopped cleanly
	 * left the registry, which cannot tell what it deleted. A drop goes
	 * by the running relays alone. */
	expect_kept(kept_of(f, 60000, -1, STORE_KEPT_SINCE), 60000, -1);
	expect_kept(kept_of(f, 60000, week, STORE_KEPT_LIVE), HOUR_MS,
		    72 * HOUR_MS);
}

/* Rows in every state: 3 pending (one created an hour ago, one not due),
 * 3 in flight (alive holder, dead holder, expired), 3 failed of two
 * types, 2 sent. */
static void fill(struct fixture *f)
{
	const char *T = f->table;
	pgtest_exec(f->conn,
		    "INSERT INTO %s (type, payload, created_at) VALUES "
		    "('p', '\\x00', now() - interval '1 hour'), "
		    "('p', '\\x00', now())",
		    T);
	pgtest_exec(f->conn,
		    "INSERT INTO %s (type, payload, next_attempt_at) VALUES "
		    "('p', '\\x00', now() + interval '5 minutes')",
		    T);
	pgtest_exec(
	    f->conn,
	    "INSERT INTO %s (type, payload, status, attempts, lease_id, "
	    "leased_at, lease_expires_at, leased_by) VALUES "
	    "('f1', '\\x00', 'in_flight', 1, gen_random_uuid(), now(), "
	    "now() + interval '40 seconds', 'host-a/1/worker-0'), "
	    "('f2', '\\x00', 'in_flight', 2, gen_random_uuid(), now(), "
	    "now() + interval '50 seconds', 'host-dead/7/worker-1'), "
	    "('f3', '\\x00', 'in_flight', 3, gen_random_uuid(), now() - "
	    "interval '2 minutes', now() - interval '1 minute', "
	    "'host-a/1/worker-0')",
	    T);
	pgtest_exec(f->conn,
		    "INSERT INTO %s (type, payload, status, attempts, "
		    "last_error, finished_at) VALUES "
		    "('order.created', '\\x00', 'failed', 10, 'old error', "
		    "now() - interval '2 hours'), "
		    "('order.created', '\\x00', 'failed', 10, 'newest error', "
		    "now() - interval '1 minute'), "
		    "('user.deleted', '\\x00', 'failed', 1, 'cannot encode', "
		    "now())",
		    T);
	pgtest_exec(f->conn,
		    "INSERT INTO %s (type, payload, status, finished_at) "
		    "SELECT 's', '\\x00', 'sent', now() FROM "
		    "generate_series(1, 2)",
		    T);
}

static void test_gauges(void **state)
{
	struct fixture *f = *state;
	fill(f);
	heartbeat(f, "host-a/1", false, true);
	struct store_gauges g = gauges(f);
	assert_int_equal(g.backlog, 3);
	assert_true(g.oldest_pending_ms >= 3600000);
	assert_true(g.oldest_pending_ms < 3700000);
	assert_int_equal(g.in_flight, 3);
	assert_int_equal(g.failed, 3);
	assert_int_equal(g.live_replicas, 1);
	assert_int_equal(g.blocked_keys, 0);
	/* The NOTIFY queue's usage: a listener in a transaction reads
	 * nothing, so notifications of 80 KB stay queued (its queue is
	 * 8 GB: ten pages are about 10 ppm). */
	PGconn *listener = pgtest_connect(), *notifier = pgtest_connect();
	pgtest_exec(listener, "LISTEN test_gauges_queue");
	pgtest_exec(listener, "BEGIN");
	pgtest_exec(listener, "SELECT 1");
	for (int i = 0; i < 10; i++)
		pgtest_exec(notifier,
			    "SELECT pg_notify('test_gauges_queue', "
			    "repeat('x', 7900) || '%d')",
			    i);
	int64_t queued = gauges(f).notify_queue_ppm;
	pgtest_exec(listener, "COMMIT");
	PQfinish(listener);
	PQfinish(notifier);
	if (queued < 5)
		fail_msg("the NOTIFY queue's usage read %lld ppm with 80 KB "
			 "queued",
			 (long long)queued);

	/* Blocked keys are counted; a table migrated before ordered
	 * delivery has no blocked-keys table and counts none. */
	pgtest_exec(f->conn,
		    "INSERT INTO \"%s\".outbox_events_blocked_keys "
		    "(partition_key, blocking_id) VALUES "
		    "('k1', gen_random_uuid()), ('k2', gen_random_uuid())",
		    f->t.schema);
	assert_int_equal(gauges(f).blocked_keys, 2);
	pgtest_exec(f->conn, "DROP TABLE \"%s\".outbox_events_blocked_keys",
		    f->t.schema);
	assert_int_equal(gauges(f).blocked_keys, 0);

	/* Dead tuples come from the statistics, flushed by the writer. */
	pgtest_exec(f->conn, "DELETE FROM %s WHERE status = 'sent'", f->table);
	pgtest_exec(f->conn, "SELECT pg_stat_force_next_flush()");
	int64_t dead = 0;
	for (int i = 0; i < 100 && dead < 2; i++) {
		usleep(100000);
		dead = gauges(f).dead_tuples;
	}
	assert_true(dead >= 2);

	/* Nothing pending: the oldest age is zero, not stale. */
	pgtest_exec(f->conn, "DELETE FROM %s WHERE status = 'pending'",
		    f->table);
	g = gauges(f);
	assert_int_equal(g.backlog, 0);
	assert_int_equal(g.oldest_pending_ms, 0);
}

static void test_status(void **state)
{
	struct fixture *f = *state;
	fill(f);
	heartbeat(f, "host-a/1", false, true);
	heartbeat(f, "host-dead/7", false, true);
	char reg[160];
	table_derived(&f->t, "_replicas", reg, sizeof(reg));
	pgtest_exec(f->conn,
		    "UPDATE %s SET last_seen_at = now() - interval '1 minute' "
		    "WHERE id = 'host-dead/7'",
		    reg);
	bool was;
	assert_int_equal(store_admin_pause(f->s, "orders", "broken",
					   "alice@laptop", &was, err,
					   sizeof(err)),
			 0);

	/* Another session holding a snapshot shows as a vacuum holder. */
	PGconn *holder = pgtest_connect();
	pgtest_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(holder, "SELECT count(*) FROM %s", f->table);

	cJSON *st = status(f);
	/* Closed before any assertion: a failing test must not leave a
	 * transaction that blocks the teardown's DROP SCHEMA. */
	int holder_pid = PQbackendPID(holder);
	PQfinish(holder);
	assert_string_equal(str(st, "table"), f->t.quoted);
	assert_int_equal((int)num(get(st, "database"), "dead_after_seconds"),
			 STORE_ADMIN_DEAD_AFTER_S);

	const cJSON *b = get(st, "backlog");
	assert_int_equal((int)num(b, "pending"), 3);
	assert_int_equal((int)num(b, "due_now"), 2);
	assert_true(num(b, "oldest_pending_age_seconds") >= 3600);

	const cJSON *fl = get(st, "in_flight");
	assert_int_equal((int)num(fl, "count"), 3);
	assert_int_equal((int)num(fl, "expired_leases"), 1);
	const cJSON *rows = get(st, "in_flight_rows");
	assert_int_equal(cJSON_GetArraySize(rows), 3);
	const cJSON *r1 = find(rows, "type", "f1");
	assert_string_equal(str(r1, "leased_by"), "host-a/1/worker-0");
	assert_string_equal(str(r1, "holder"), "host-a/1");
	assert_true(cJSON_IsTrue(get(r1, "holder_alive")));
	assert_int_equal((int)num(r1, "attempts"), 1);
	double left = num(r1, "lease_expires_in_seconds");
	assert_true(left > 30 && left <= 40);
	const cJSON *r2 = find(rows, "type", "f2");
	assert_string_equal(str(r2, "holder"), "host-dead/7");
	assert_true(cJSON_IsFalse(get(r2, "holder_alive")));
	const cJSON *r3 = find(rows, "type", "f3");
	assert_true(num(r3, "lease_expires_in_seconds") < -50);
	const cJSON *holders = get(st, "in_flight_holders");
	const cJSON *ha = find(holders, "holder", "host-a/1");
	assert_int_equal((int)num(ha, "rows"), 2);
	assert_int_equal((int)num(ha, "expired"), 1);
	assert_true(cJSON_IsTrue(get(ha, "holder_alive")));
	assert_true(cJSON_IsFalse(
	    get(find(holders, "holder", "host-dead/7"), "holder_alive")));

	assert_int_equal((int)num(get(st, "failed"), "count"), 3);
	const cJSON *by_type = get(st, "failed_by_type");
	const cJSON *oc = find(by_type, "type", "order.created");
	assert_int_equal((int)num(oc, "count"), 2);
	assert_string_equal(str(oc, "sample_error"), "newest error");
	assert_int_equal(
	    (int)num(find(by_type, "type", "user.deleted"), "count"), 1);

	const cJSON *paused = get(st, "paused");
	assert_int_equal(cJSON_GetArraySize(paused), 1);
	const cJSON *p = find(paused, "destination", "orders");
	assert_string_equal(str(p, "reason"), "broken");
	assert_string_equal(str(p, "paused_by"), "alice@laptop");

	const cJSON *bk = get(st, "blocked_keys");
	assert_true(cJSON_IsTrue(get(bk, "present")));
	assert_int_equal((int)num(bk, "count"), 0);
	assert_int_equal(cJSON_GetArraySize(get(bk, "rows")), 0);

	const cJSON *ts = get(st, "table_stats");
	assert_true(num(ts, "total_bytes") > 0);

	bool seen = false;
	const cJSON *h;
	cJSON_ArrayForEach(h, get(st, "oldest_xmin_holders"))
	{
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, "pid");
		if (cJSON_IsNumber(v) && v->valueint == holder_pid) {
			seen = true;
			assert_string_equal(str(h, "kind"), "session");
			assert_non_null(strstr(str(h, "query"), "count(*)"));
		}
	}
	assert_true(seen);
	cJSON_Delete(st);

	/* The table's counts and times are its relations' statistics (a
	 * partitioned table's partitions'), read one relation at a time. */
	pgtest_exec(f->conn, "VACUUM %s", f->table);
	st = status(f);
	ts = get(st, "table_stats");
	assert_true(num(ts, "vacuum_count") >= 1);
	/* Exact after a VACUUM: each relation counted once. */
	assert_int_equal(
	    (long)num(ts, "live_tuples"),
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", f->table));
	assert_true(num(ts, "dead_tuples") >= 0);
	assert_non_null(str(ts, "last_vacuum"));
	assert_true(num(ts, "vacuumed_seconds_ago") >= 0);
	cJSON_Delete(st);

	/* Blocked keys are shown whole, row by row. */
	pgtest_exec(f->conn,
		    "INSERT INTO \"%s\".outbox_events_blocked_keys "
		    "(partition_key, blocking_id, reason) VALUES "
		    "('order-42', gen_random_uuid(), 'failed')",
		    f->t.schema);
	st = status(f);
	bk = get(st, "blocked_keys");
	assert_true(cJSON_IsTrue(get(bk, "present")));
	assert_int_equal((int)num(bk, "count"), 1);
	const cJSON *key = get(cJSON_GetArrayItem(get(bk, "rows"), 0), "key");
	assert_string_equal(str(key, "partition_key"), "order-42");
	assert_string_equal(str(key, "reason"), "failed");
	cJSON_Delete(st);

	/* A table migrated before ordered delivery: none, and no error. */
	pgtest_exec(f->conn, "DROP TABLE \"%s\".outbox_events_blocked_keys",
		    f->t.schema);
	st = status(f);
	bk = get(st, "blocked_keys");
	assert_true(cJSON_IsFalse(get(bk, "present")));
	assert_int_equal((int)num(bk, "count"), 0);
	cJSON_Delete(st);

	/* max_rows cuts the lists, not the counts. */
	cJSON *cut = NULL;
	assert_int_equal(store_admin_status(f->s, 1, &cut, err, sizeof(err)),
			 0);
	assert_int_equal(cJSON_GetArraySize(get(cut, "in_flight_rows")), 1);
	assert_int_equal((int)num(get(cut, "in_flight"), "count"), 3);
	cJSON_Delete(cut);
}

static void test_pause_resume(void **state)
{
	struct fixture *f = *state;
	bool was = true, global = false;
	char keys[4][STORE_PAUSE_KEY_MAX];
	size_t n = 99;
	char control[160];
	table_derived(&f->t, "_control", control, sizeof(control));

	assert_int_equal(store_admin_pause(f->s, "*", "deploy", "bob@host",
					   &was, err, sizeof(err)),
			 0);
	assert_false(was);
	assert_int_equal(store_admin_pause(f->s, "orders", NULL, "bob@host",
					   &was, err, sizeof(err)),
			 0);
	assert_false(was);

	/* What workers read each tick. */
	struct store_options o = pgtest_store_options(f->table);
	struct store *s = pgtest_store(&o);
	assert_int_equal(
	    store_read_pauses(s, &global, keys, 4, &n, err, sizeof(err)), 0);
	assert_true(global);
	assert_int_equal(n, 1);
	assert_string_equal(keys[0], "orders");

	/* Pausing again updates the author and keeps a reason not
	 * replaced. */
	assert_int_equal(store_admin_pause(f->s, "*", NULL, "carol@host", &was,
					   err, sizeof(err)),
			 0);
	assert_true(was);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE "
				     "destination = '*' AND reason = 'deploy' "
				     "AND paused_by = 'carol@host'",
				     control),
			 1);

	assert_int_equal(store_admin_resume(f->s, "*", &was, err, sizeof(err)),
			 0);
	assert_true(was);
	assert_int_equal(store_admin_resume(f->s, "*", &was, err, sizeof(err)),
			 0);
	assert_false(was);
	assert_int_equal(
	    store_read_pauses(s, &global, keys, 4, &n, err, sizeof(err)), 0);
	assert_false(global);
	assert_int_equal(n, 1);
	assert_int_equal(
	    store_admin_resume(f->s, "orders", &was, err, sizeof(err)), 0);
	assert_true(was);
	assert_int_equal(
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", control), 0);

	/* As many destinations as a relay keeps: one more is refused (the
	 * relays would not read it, and its rows would go on), one paused
	 * already is paused again, and so is all leasing. */
	pgtest_exec(f->conn,
		    "INSERT INTO %s (destination, paused_by) SELECT 'd' || g, "
		    "'x' FROM generate_series(1, %d) g",
		    control, STORE_MAX_PAUSES - 1);
	assert_int_equal(store_admin_pause(f->s, "the-last", NULL, "bob@host",
					   &was, err, sizeof(err)),
			 0);
	assert_false(was);
	assert_int_equal(store_admin_pause(f->s, "one-more", NULL, "bob@host",
					   &was, err, sizeof(err)),
			 STORE_REFUSED);
	assert_non_null(strstr(err, "destinations are paused already"));
	assert_int_equal(store_admin_pause(f->s, "d7", NULL, "bob@host", &was,
					   err, sizeof(err)),
			 0);
	assert_true(was);
	assert_int_equal(store_admin_pause(f->s, "*", NULL, "bob@host", &was,
					   err, sizeof(err)),
			 0);
	assert_int_equal(
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", control),
	    STORE_MAX_PAUSES + 1);
	pgtest_exec(f->conn, "DELETE FROM %s", control);
	store_close(s);
}

static void test_time_arguments(void **state)
{
	struct fixture *f = *state;
	char out[64];
	assert_int_equal(store_admin_time(f->s, "2024-05-01 10:00+02", out,
					  sizeof(out), err, sizeof(err)),
			 0);
	assert_string_equal(out, "2024-05-01T08:00:00.000000+00:00");

	assert_int_equal(
	    store_admin_time(f->s, "2h", out, sizeof(out), err, sizeof(err)),
	    0);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT (abs(extract(epoch FROM now() - "
				     "interval '2 hours' - '%s'::timestamptz))"
				     " < 5)::int",
				     out),
			 1);
	assert_int_equal(
	    store_admin_time(f->s, "90s", out, sizeof(out), err, sizeof(err)),
	    0);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT (abs(extract(epoch FROM now() - "
				     "interval '90 seconds' - "
				     "'%s'::timestamptz)) < 5)::int",
				     out),
			 1);

	const char *bad[] = {"garbage", "5 parsecs", "2024-13-45"};
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(store_admin_time(f->s, bad[i], out,
						  sizeof(out), err,
						  sizeof(err)),
				 STORE_INVALID);
		assert_non_null(strstr(err, bad[i]));
	}
}

/* ---- the xmin horizon ---- */

/* Gauges, read until the horizon's holder is the one named (kind and
 * name): other test programs share the server, and a session of theirs
 * may hold an older snapshot for a moment. */
static struct store_gauges horizon_seen_by(struct store *s, const char *kind,
					   const char *name)
{
	struct store_gauges g = gauges_of(s);
	for (int i = 0; i < 100; i++) {
		if (strcmp(g.horizon.kind, kind) == 0 &&
		    strcmp(g.horizon.name, name) == 0)
			return g;
		usleep(100000);
		g = gauges_of(s);
	}
	fail_msg("the horizon is held by %s '%s' (pid %lld), not %s '%s'",
		 g.horizon.kind, g.horizon.name, (long long)g.horizon.pid, kind,
		 name);
	return g;
}

static struct store_gauges horizon_held_by(struct fixture *f, const char *kind,
					   const char *name)
{
	return horizon_seen_by(f->s, kind, name);
}

/* Consumes n transaction ids, so the horizon's holder grows older. */
static void burn_xids(struct fixture *f, int n)
{
	for (int i = 0; i < n; i++)
		pgtest_exec(f->conn, "SELECT txid_current()");
}

/* The holders status lists, the element whose key is value. */
static const cJSON *status_holder(struct fixture *f, cJSON **st,
				  const char *key, const char *value)
{
	*st = status(f);
	return find(get(*st, "oldest_xmin_holders"), key, value);
}

/* The pending index's counters as the gauges read them, after the
 * statistics of f->conn are flushed. */
static void index_counters(struct fixture *f, int64_t out[3],
			   const int64_t after[3])
{
	pgtest_exec(f->conn, "SELECT pg_stat_force_next_flush()");
	for (int i = 0; i < 100; i++) {
		struct store_gauges g = gauges(f);
		out[0] = g.pending_idx_scans;
		out[1] = g.pending_idx_read;
		out[2] = g.pending_idx_fetched;
		if (!after || out[0] > after[0])
			return;
		usleep(100000);
	}
	fail_msg("the pending index's scan count did not move");
}

/* One scan of the pending index the way the lease walks it. */
static void lease_scan(struct fixture *f)
{
	pgtest_exec(f->conn, "SET enable_seqscan = off");
	pgtest_exec(f->conn, "SET enable_bitmapscan = off");
	pgtest_exec(f->conn,
		    "SELECT count(*) FROM (SELECT id FROM %s WHERE status = "
		    "'pending' AND next_attempt_at <= now() ORDER BY "
		    "next_attempt_at, seq LIMIT 10 FOR UPDATE SKIP LOCKED) s",
		    f->table);
	pgtest_exec(f->conn, "RESET enable_seqscan");
	pgtest_exec(f->conn, "RESET enable_bitmapscan");
}

/* A session holding a repeatable-read snapshot holds the horizon: the
 * gauges and status name it (kind, application_name, pid) with an age
 * that grows; every lease steps over the entries of rows finished since,
 * until it lets go. */
static void test_horizon_session(void **state)
{
	struct fixture *f = *state;
	char app[96];
	snprintf(app, sizeof(app), "hz-report-%s", f->t.schema);
	PGconn *holder = f->holder = pgtest_connect();
	pgtest_exec(holder, "SET application_name = '%s'", app);
	pgtest_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(holder, "SELECT 1");
	burn_xids(f, 3);

	struct store_gauges g = horizon_held_by(f, "session", app);
	assert_int_equal(g.horizon.pid, PQbackendPID(holder));
	assert_true(g.horizon.xmin_age >= 3);
	assert_true(g.xmin_age_sessions >= g.horizon.xmin_age);
	usleep(1500000);
	struct store_gauges later = horizon_held_by(f, "session", app);
	assert_true(later.horizon.age_ms >= 1500);
	assert_true(later.horizon.age_ms >= g.horizon.age_ms + 1000);

	cJSON *st;
	const cJSON *h = status_holder(f, &st, "name", app);
	assert_string_equal(str(h, "kind"), "session");
	assert_int_equal((int)num(h, "pid"), PQbackendPID(holder));
	assert_true(num(h, "xmin_age") >= 3);
	assert_true(num(h, "xact_age_seconds") >= 1.5);
	cJSON_Delete(st);

	/* 200 rows leased and finished behind the snapshot: their entries
	 * stay in the pending index, and a scan returns each of them
	 * without a visible row behind it. */
	pgtest_insert(f->conn, f->table, 200);
	pgtest_exec(f->conn,
		    "UPDATE %s SET status = 'sent', finished_at = now()",
		    f->table);
	pgtest_insert(f->conn, f->table, 5);
	/* The gauges' own backlog count through the pending index is told
	 * apart: it is not a lease's. */
	pgtest_exec(store_conn(f->s), "SET enable_seqscan = off");
	struct store_gauges own = gauges(f);
	assert_true(own.own_idx_scans >= 1);
	assert_true(own.own_idx_read >= 205);
	pgtest_exec(store_conn(f->s), "RESET enable_seqscan");
	const int64_t none[3] = {0, 0, 0};
	int64_t before[3], after[3];
	index_counters(f, before, NULL);
	lease_scan(f);
	index_counters(f, after, before);
	assert_true((after[1] - after[2]) - (before[1] - before[2]) >= 200);
	int64_t per_scan =
	    metrics_dead_entries_per_scan_milli(before, after, none);
	assert_true(per_scan >= 200 * 1000 / (after[0] - before[0]) - 1000);
	assert_true(per_scan >= 50000);

	/* Let go: vacuum removes the entries, the next scan passes none
	 * and the horizon is someone else's. */
	pgtest_exec(holder, "ROLLBACK");
	pgtest_exec(f->conn, "VACUUM %s", f->table);
	/* The store's own statistics of the held period reach the server
	 * at most a second later: let them land before counting. */
	usleep(1100000);
	gauges(f);
	index_counters(f, before, NULL);
	lease_scan(f);
	index_counters(f, after, before);
	assert_true(metrics_dead_entries_per_scan_milli(before, after, none) <
		    20000);
	assert_true(strcmp(gauges(f).horizon.name, app) != 0);
}

/* A session's own index counts reach the server when it goes idle at
 * least a second after they last did, and until then its next
 * transactions' own counts include them: one statement past that second
 * sends them. */
static void flush_own_counts(struct store *s)
{
	usleep(1100 * 1000);
	pgtest_exec(store_conn(s), "SELECT 1");
}

/* The backlog count under a held snapshot: after one count from the start
 * it reads the pending index from the oldest row it found and the late
 * scan's index for rows written since, so it steps over none of the
 * entries the snapshot keeps, and still counts a row committed late below
 * its floor. A row with no writer put below the floor waits for the next
 * count from the start (a store without floors yet, or one whose session
 * was connected anew, counts it). */
static void test_backlog_count_floors(void **state)
{
	struct fixture *f = *state;
	struct store_options o = pgtest_store_options(f->table);
	o.prepare = false;
	o.lease_rescan_ms = 3600 * 1000;
	struct store *s = pgtest_store(&o);
	pgtest_exec(store_conn(s), "SET enable_seqscan = off");
	PGconn *holder = f->holder = pgtest_connect();
	PGconn *producer = f->writer = pgtest_connect();
	pgtest_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(holder, "SELECT count(*) FROM %s", f->table);
	pgtest_insert(f->conn, f->table, 200);
	pgtest_exec(f->conn,
		    "UPDATE %s SET status = 'sent', finished_at = now()",
		    f->table);
	pgtest_exec(producer, "BEGIN");
	pgtest_exec(producer,
		    "INSERT INTO %s (type, payload) VALUES ('late.event', "
		    "'\\x01')",
		    f->table);
	pgtest_insert(f->conn, f->table, 5);
	struct store_gauges g = gauges_of(s);
	assert_int_equal(g.backlog, 5);
	assert_true(g.own_idx_read >= 205);
	flush_own_counts(s);
	g = gauges_of(s);
	assert_int_equal(g.backlog, 5);
	if (g.own_idx_read >= 50)
		fail_msg("the count from its floor read %lld entries",
			 (long long)g.own_idx_read);
	pgtest_exec(producer, "COMMIT");
	flush_own_counts(s);
	g = gauges_of(s);
	assert_int_equal(g.backlog, 6);
	assert_true(g.own_idx_read < 50);
	pgtest_exec(f->conn,
		    "INSERT INTO %s (type, payload, next_attempt_at, "
		    "written_by) VALUES ('nowriter.event', '\\x02', now() - "
		    "interval '1 hour', NULL)",
		    f->table);
	assert_int_equal(gauges_of(s).backlog, 6);
	struct store *fresh = admin_store(f->table);
	assert_int_equal(gauges_of(fresh).backlog, 7);
	store_close(fresh);
	/* A session connected anew counts from the start: what ended the
	 * old one (a restore, a switch-over) may have put rows below the
	 * floors, which were kept across it. */
	pgtest_exec(f->conn, "SELECT pg_terminate_backend(%d)",
		    PQbackendPID(store_conn(s)));
	struct store_gauges lost;
	for (int i = 0;
	     i < 20 && store_admin_gauges(s, &lost, err, sizeof(err)) == 0; i++)
		usleep(100000);
	assert_int_equal(store_reconnect(s, err, sizeof(err)), 0);
	assert_int_equal(gauges_of(s).backlog, 7);
	store_close(s);
}

/* The backlog count's floor outlives the session settings it was read
 * under: behind a pooler the next count may run on a server connection
 * where another client's plain SET left another DateStyle. Read as
 * German with a numeric zone, the floor (the 25th of last month) was
 * refused as month 25 under ISO, MDY, and every count from the floors
 * failed until the next from the start. */
static void test_backlog_floor_across_date_styles(void **state)
{
	struct fixture *f = *state;
	struct store_options o = pgtest_store_options(f->table);
	o.lease_rescan_ms = 3600 * 1000;
	struct store *s = pgtest_store(&o);
	pgtest_exec(f->conn,
		    "INSERT INTO %s (type, payload, next_attempt_at) SELECT "
		    "'styled.event', '\\x01', date_trunc('month', now()) - "
		    "interval '1 month' + interval '24 days 12 hours' FROM "
		    "generate_series(1, 3)",
		    f->table);
	pgtest_exec(store_conn(s), "SET DateStyle = 'German'");
	pgtest_exec(store_conn(s), "SET TimeZone = '+02'");
	assert_int_equal(gauges_of(s).backlog, 3);
	pgtest_exec(store_conn(s), "SET DateStyle = 'ISO, MDY'");
	pgtest_exec(store_conn(s), "SET TimeZone = 'UTC'");
	pgtest_insert(f->conn, f->table, 2);
	assert_int_equal(gauges_of(s).backlog, 5);
	/* A time before the common era, which to_char writes without its
	 * era: taken for the year of the common era, the floor passed over
	 * the row itself. */
	pgtest_exec(f->conn,
		    "INSERT INTO %s (type, payload, next_attempt_at) VALUES "
		    "('ancient.event', '\\x01', '0044-03-15 12:00:00+00 BC')",
		    f->table);
	assert_int_equal(gauges_of(s).backlog, 6);
	assert_int_equal(gauges_of(s).backlog, 6);
	store_close(s);
}

/* A session in a read-committed transaction that has written holds the
 * horizon by its transaction id alone, with no snapshot between its
 * statements; a prepared transaction holds it until it is committed or
 * rolled back, with no session at all. */
static void test_horizon_xid_and_prepared(void **state)
{
	struct fixture *f = *state;
	struct store_gauges g;
	char app[96], gid[200], cut[200];
	snprintf(app, sizeof(app), "hz-writer-%s", f->t.schema);
	/* A gid of two-byte characters, longer than the gauge keeps, whose
	 * last byte kept would fall inside a character: it is cut before
	 * that character. */
	const int keep = (int)sizeof(g.horizon.name) - 1;
	int n = snprintf(gid, sizeof(gid), "hz-prepared-%s-", f->t.schema);
	if ((keep - n) % 2 == 0)
		n += snprintf(gid + n, sizeof(gid) - (size_t)n, "x");
	int whole = (keep - n) / 2;
	for (int i = 0; i < 40; i++) {
		if (i == whole)
			memcpy(cut, gid, strlen(gid) + 1);
		strcat(gid, "\xc3\xa9");
	}
	PGconn *writer = f->holder = pgtest_connect();
	pgtest_exec(writer, "SET application_name = '%s'", app);
	pgtest_exec(writer, "BEGIN");
	pgtest_exec(writer, "SELECT txid_current()");
	burn_xids(f, 3);
	g = horizon_held_by(f, "session", app);
	assert_int_equal(g.horizon.pid, PQbackendPID(writer));
	assert_true(g.horizon.xmin_age >= 3);
	cJSON *st;
	const cJSON *h = status_holder(f, &st, "name", app);
	assert_true(num(h, "xmin_age") >= 3);
	cJSON_Delete(st);
	pgtest_exec(writer, "COMMIT");

	pgtest_exec(writer, "BEGIN");
	pgtest_exec(writer, "SELECT txid_current()");
	pgtest_exec(writer, "PREPARE TRANSACTION '%s'", gid);
	burn_xids(f, 3);
	g = horizon_held_by(f, "prepared_transaction", cut);
	assert_int_equal(g.horizon.pid, 0);
	assert_true(g.horizon.xmin_age >= 3);
	assert_true(g.xmin_age_prepared >= g.horizon.xmin_age);
	h = status_holder(f, &st, "name", gid);
	assert_string_equal(str(h, "kind"), "prepared transaction");
	assert_true(num(h, "xmin_age") >= 3);
	cJSON_Delete(st);
	pgtest_exec(f->conn, "ROLLBACK PREPARED '%s'", gid);
	assert_true(strcmp(gauges(f).horizon.name, cut) != 0);
}

static void put_be(unsigned char *p, uint64_t v, int bytes)
{
	for (int i = bytes - 1; i >= 0; i--, v >>= 8)
		p[i] = (unsigned char)(v & 0xff);
}

/* A physical replication slot holds the horizon with the xmin its
 * standby reports (hot_standby_feedback): a replication connection sends
 * the feedback message a standby would. */
static void test_horizon_slot(void **state)
{
	struct fixture *f = *state;
	char slot[96];
	snprintf(slot, sizeof(slot), "hz_%s", f->t.schema);
	pgtest_exec(f->conn,
		    "SELECT pg_create_physical_replication_slot('%s', true)",
		    slot);
	long long xid = pgtest_long(f->conn, "SELECT txid_current()");
	PGresult *r = PQexec(f->conn, "SELECT pg_current_wal_flush_lsn()");
	assert_int_equal(PQresultStatus(r), PGRES_TUPLES_OK);
	char start[128];
	snprintf(start, sizeof(start), "START_REPLICATION SLOT %s PHYSICAL %s",
		 slot, PQgetvalue(r, 0, 0));
	PQclear(r);

	const char *keys[] = {"dbname", "replication", NULL};
	const char *values[] = {pgtest_url(), "true", NULL};
	PGconn *rep = f->rep = PQconnectdbParams(keys, values, 1);
	if (PQstatus(rep) != CONNECTION_OK)
		fail_msg("replication connection: %s", PQerrorMessage(rep));
	r = PQexec(rep, start);
	if (PQresultStatus(r) != PGRES_COPY_BOTH)
		fail_msg("%s: %s", start, PQerrorMessage(rep));
	PQclear(r);
	/* 'h': send time, xmin, its epoch, catalog xmin, its epoch. */
	unsigned char msg[25] = {'h'};
	put_be(msg + 9, (uint64_t)xid & 0xffffffffu, 4);
	put_be(msg + 13, (uint64_t)xid >> 32, 4);
	assert_int_equal(PQputCopyData(rep, (const char *)msg, sizeof(msg)), 1);
	assert_int_equal(PQflush(rep), 0);
	burn_xids(f, 3);

	struct store_gauges g = horizon_held_by(f, "replication_slot", slot);
	assert_int_equal(g.horizon.pid, 0);
	assert_true(g.horizon.xmin_age >= 4);
	assert_int_equal(g.horizon.age_ms, 0);
	assert_true(g.xmin_age_slots >= g.horizon.xmin_age);
	cJSON *st;
	const cJSON *h = status_holder(f, &st, "name", slot);
	assert_string_equal(str(h, "kind"), "replication slot");
	assert_true(num(h, "xmin_age") >= 4);
	cJSON_Delete(st);
	PQfinish(rep);
	f->rep = NULL;
	for (int i = 0; i < 100 && pgtest_long(f->conn,
					       "SELECT count(*) FROM "
					       "pg_replication_slots WHERE "
					       "slot_name = '%s' AND active",
					       slot) > 0;
	     i++)
		usleep(100000);
	pgtest_exec(f->conn, "SELECT pg_drop_replication_slot('%s')", slot);
	assert_true(strcmp(gauges(f).horizon.name, slot) != 0);
}

/* A session of this database on another one, as application app. */
static PGconn *connect_to(struct fixture *f, const char *db, const char *app)
{
	char conninfo[512];
	snprintf(conninfo, sizeof(conninfo),
		 "host=%s port=%s dbname=%s user=%s password=%s "
		 "application_name=%s",
		 PQhost(f->conn), PQport(f->conn), db, PQuser(f->conn),
		 PQpass(f->conn), app);
	PGconn *c = PQconnectdb(conninfo);
	if (PQstatus(c) != CONNECTION_OK)
		fail_msg("connect to %s: %s", db, PQerrorMessage(c));
	return c;
}

/* Another database's sessions: a snapshot there holds nothing back here
 * (vacuum ignores it), a transaction id does (every snapshot here counts
 * it as running). */
static void test_horizon_other_database(void **state)
{
	struct fixture *f = *state;
	char db[96], reader_app[96], writer_app[96];
	snprintf(db, sizeof(db), "hz_db_%s", f->t.schema);
	snprintf(reader_app, sizeof(reader_app), "hz-elsewhere-reader-%s",
		 f->t.schema);
	snprintf(writer_app, sizeof(writer_app), "hz-elsewhere-writer-%s",
		 f->t.schema);
	pgtest_exec(f->conn, "CREATE DATABASE %s", db);
	PGconn *reader = f->holder = connect_to(f, db, reader_app);
	pgtest_exec(reader, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(reader, "SELECT 1");
	burn_xids(f, 3);
	for (int i = 0; i < 10; i++) {
		assert_string_not_equal(gauges(f).horizon.name, reader_app);
		usleep(100000);
	}
	cJSON *st = status(f);
	const cJSON *h;
	cJSON_ArrayForEach(h, get(st, "oldest_xmin_holders"))
	{
		const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, "name");
		assert_false(cJSON_IsString(v) &&
			     strcmp(v->valuestring, reader_app) == 0);
	}
	cJSON_Delete(st);
	pgtest_exec(reader, "ROLLBACK");

	pgtest_exec(reader, "SET application_name = '%s'", writer_app);
	pgtest_exec(reader, "BEGIN");
	pgtest_exec(reader, "SELECT txid_current()");
	burn_xids(f, 3);
	struct store_gauges g = horizon_held_by(f, "session", writer_app);
	assert_int_equal(g.horizon.pid, PQbackendPID(reader));
	assert_true(g.horizon.xmin_age >= 3);
	h = status_holder(f, &st, "name", writer_app);
	assert_true(num(h, "xmin_age") >= 3);
	cJSON_Delete(st);
	pgtest_exec(reader, "ROLLBACK");
}

/* A store of a relay role of its own (hz_role_<schema>, which teardown
 * drops) without pg_read_all_stats; conninfo (512 bytes) reaches the
 * database as that role. */
static struct store *store_without_stats_grant(struct fixture *f,
					       char *conninfo)
{
	char role[96];
	snprintf(role, sizeof(role), "hz_role_%s", f->t.schema);
	pgtest_exec(f->conn, "CREATE ROLE %s LOGIN PASSWORD 'hz-secret'", role);
	pgtest_exec(f->conn, "GRANT USAGE ON SCHEMA \"%s\" TO %s", f->t.schema,
		    role);
	pgtest_exec(f->conn,
		    "GRANT SELECT ON ALL TABLES IN SCHEMA \"%s\" TO %s",
		    f->t.schema, role);
	snprintf(conninfo, 512,
		 "host=%s port=%s dbname=%s user=%s password=hz-secret",
		 PQhost(f->conn), PQport(f->conn), PQdb(f->conn), role);
	struct store_options o = pgtest_store_options(f->table);
	o.prepare = false;
	o.conninfo = conninfo;
	return pgtest_store(&o);
}

/* A relay role without pg_read_all_stats still sees another role's
 * session hold the horizon (pid, application_name, xmin), not how long:
 * its age reads 0 until the grant (docs/deployment.md). */
static void test_horizon_without_stats_grant(void **state)
{
	struct fixture *f = *state;
	char app[96], conninfo[512];
	snprintf(app, sizeof(app), "hz-other-%s", f->t.schema);
	struct store *relay = store_without_stats_grant(f, conninfo);

	PGconn *holder = f->holder = pgtest_connect();
	pgtest_exec(holder, "SET application_name = '%s'", app);
	pgtest_exec(holder, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(holder, "SELECT 1");
	burn_xids(f, 3);
	usleep(1100000);
	struct store_gauges g = horizon_seen_by(relay, "session", app);
	assert_int_equal(g.horizon.pid, PQbackendPID(holder));
	assert_true(g.horizon.xmin_age >= 3);
	assert_int_equal(g.horizon.age_ms, 0);

	pgtest_exec(f->conn, "GRANT pg_read_all_stats TO hz_role_%s",
		    f->t.schema);
	g = horizon_seen_by(relay, "session", app);
	assert_true(g.horizon.age_ms >= 1100);
	store_close(relay);
	pgtest_exec(holder, "ROLLBACK");
}

/* A writer idle in its transaction and a session whose snapshot, taken
 * while the writer ran, has the writer's id as its xmin are as old; the
 * writer holds the horizon by its id and is named, also where the
 * relay's role sees its age as unknown and the snapshot's as known (the
 * relay's own leases are such snapshots: ranked by age, they were named). */
static void test_horizon_tie_names_the_writer(void **state)
{
	struct fixture *f = *state;
	char app[96], reader_app[96], conninfo[512];
	snprintf(app, sizeof(app), "hz-writer-%s", f->t.schema);
	snprintf(reader_app, sizeof(reader_app), "hz-reader-%s", f->t.schema);
	struct store *relay = store_without_stats_grant(f, conninfo);
	PGconn *writer = f->writer = pgtest_connect();
	pgtest_exec(writer, "SET application_name = '%s'", app);
	pgtest_exec(writer, "BEGIN");
	pgtest_exec(writer, "SELECT txid_current()");
	/* The relay role's own session: its age is known to the relay. */
	PGconn *reader = f->holder = PQconnectdb(conninfo);
	assert_int_equal(PQstatus(reader), CONNECTION_OK);
	pgtest_exec(reader, "SET application_name = '%s'", reader_app);
	pgtest_exec(reader, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(reader, "SELECT 1");
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(DISTINCT "
				     "greatest(age(backend_xmin), "
				     "age(backend_xid))) FROM "
				     "pg_stat_activity WHERE "
				     "application_name IN ('%s', '%s')",
				     app, reader_app),
			 1);
	burn_xids(f, 3);

	struct store_gauges g = horizon_seen_by(relay, "session", app);
	assert_int_equal(g.horizon.pid, PQbackendPID(writer));
	assert_true(g.horizon.xmin_age >= 3);

	cJSON *st;
	const cJSON *h = status_holder(f, &st, "name", app);
	assert_true(cJSON_IsTrue(get(h, "holds_by_xid")));
	h = find(get(st, "oldest_xmin_holders"), "name", reader_app);
	assert_non_null(h);
	assert_true(cJSON_IsFalse(get(h, "holds_by_xid")));
	cJSON_Delete(st);
	store_close(relay);
	pgtest_exec(reader, "ROLLBACK");
	pgtest_exec(writer, "ROLLBACK");
}

/* A lazy VACUUM shows an xmin in pg_stat_activity, but Postgres leaves
 * it out of the horizon: an hour-long one is never named the holder
 * (gauges and status read the same rule). */
static void test_horizon_vacuum_left_out(void **state)
{
	struct fixture *f = *state;
	char app[96];
	snprintf(app, sizeof(app), "hz-vacuum-%s", f->t.schema);
	pgtest_insert(f->conn, f->table, 5000);
	PGconn *vac = f->holder = pgtest_connect();
	pgtest_exec(vac, "SET application_name = '%s'", app);
	/* A page costs 1 and each unit of cost sleeps 100 ms: the vacuum
	 * runs for minutes, until cancelled. */
	pgtest_exec(vac, "SET vacuum_cost_limit = 1");
	pgtest_exec(vac, "SET vacuum_cost_delay = '100ms'");
	char sql[256];
	snprintf(sql, sizeof(sql), "VACUUM %s", f->table);
	assert_int_equal(PQsendQuery(vac, sql), 1);
	int pid = PQbackendPID(vac);
	for (int i = 0; i < 100 && pgtest_long(f->conn,
					       "SELECT count(*) FROM "
					       "pg_stat_progress_vacuum v JOIN "
					       "pg_stat_activity a USING (pid) "
					       "WHERE pid = %d AND "
					       "a.backend_xmin IS NOT NULL",
					       pid) == 0;
	     i++)
		usleep(100000);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM "
				     "pg_stat_progress_vacuum WHERE pid = %d",
				     pid),
			 1);
	burn_xids(f, 5);
	/* Older than every later snapshot: without the rule, the first
	 * holder status lists. */
	assert_true(pgtest_long(f->conn,
				"SELECT age(backend_xmin) FROM "
				"pg_stat_activity WHERE pid = %d",
				pid) >= 5);

	cJSON *st = status(f);
	const cJSON *h;
	cJSON_ArrayForEach(h, get(st, "oldest_xmin_holders"))
	{
		assert_string_not_equal(str(h, "name"), app);
	}
	cJSON_Delete(st);
	for (int i = 0; i < 20; i++) {
		struct store_gauges g = gauges(f);
		assert_true(g.horizon.pid != pid);
		assert_string_not_equal(g.horizon.name, app);
		usleep(100000);
	}
	pgtest_exec(f->conn, "SELECT pg_cancel_backend(%d)", pid);
	PGresult *r;
	while ((r = PQgetResult(vac)))
		PQclear(r);
}

/* A walsender of a database (a subscription's table copy, a tool on a
 * replication=database connection) that runs SQL under a snapshot holds
 * the horizon like any session: only one streaming a slot's changes is
 * left out. */
static void test_horizon_walsender_running_sql(void **state)
{
	struct fixture *f = *state;
	char app[96];
	snprintf(app, sizeof(app), "hz-walsender-%s", f->t.schema);
	const char *keys[] = {"dbname", "replication", "application_name",
			      NULL};
	const char *values[] = {pgtest_url(), "database", app, NULL};
	PGconn *ws = f->holder = PQconnectdbParams(keys, values, 1);
	if (PQstatus(ws) != CONNECTION_OK)
		fail_msg("replication connection: %s", PQerrorMessage(ws));
	pgtest_exec(ws, "BEGIN ISOLATION LEVEL REPEATABLE READ");
	pgtest_exec(ws, "SELECT 1");
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM pg_stat_activity "
				     "WHERE pid = %d AND backend_type = "
				     "'walsender' AND datid IS NOT NULL AND "
				     "backend_xmin IS NOT NULL",
				     PQbackendPID(ws)),
			 1);
	burn_xids(f, 3);

	struct store_gauges g = horizon_held_by(f, "session", app);
	assert_int_equal(g.horizon.pid, PQbackendPID(ws));
	assert_true(g.horizon.xmin_age >= 3);
	cJSON *st;
	const cJSON *h = status_holder(f, &st, "name", app);
	assert_true(num(h, "xmin_age") >= 3);
	cJSON_Delete(st);
	pgtest_exec(ws, "ROLLBACK");
}

/* A relay that opened the table before a contract step's record, and
 * tells of itself by a heartbeat once the record is there. */
struct late_relay {
	const char *table;
	char registry[160];
	char contract[160];
};

static void *late_relay_beats(void *arg)
{
	struct late_relay *l = arg;
	PGconn *c = pgtest_connect();
	for (int i = 0; i < 200; i++) {
		if (pgtest_long(c, "SELECT count(*) FROM %s", l->contract) > 0)
			break;
		usleep(20000);
	}
	pgtest_exec(c,
		    "INSERT INTO %s (id, version) VALUES ('late/1', '0.1.0')",
		    l->registry);
	PQfinish(c);
	return NULL;
}

static long index_count(PGconn *c, const struct outbox_table *t,
			const char *suffix)
{
	return pgtest_long(c,
			   "SELECT count(*) FROM pg_indexes WHERE schemaname "
			   "= '%s' AND indexname = '%s%s'",
			   t->schema, t->name, suffix);
}

/* Contract steps (design.md §11, "Contract steps wait for the relays'
 * protocol"): refused while a relay of an older protocol is alive, before
 * the record or while it settles; then done, recorded, and done again
 * harmlessly; a relay refuses a table contracted beyond its protocol. */
static void test_contract_steps(void **state)
{
	struct fixture *f = *state;
	struct late_relay l = {.table = f->table};
	table_derived(&f->t, "_replicas", l.registry, sizeof(l.registry));
	table_derived(&f->t, "_contract", l.contract, sizeof(l.contract));
	struct store_options o = pgtest_store_options(f->table);
	char text[4096];
	FILE *out = fmemopen(text, sizeof(text), "w");
	assert_non_null(out);

	/* A live relay older than the protocol column, a dead one. */
	pgtest_exec(f->conn,
		    "INSERT INTO %s (id, version, last_seen_at) VALUES "
		    "('old/1', '0.1.0', now()), ('gone/1', '0.0.9', now() - "
		    "interval '1 minute')",
		    l.registry);
	heartbeat(f, "new/1", false, true);
	assert_int_not_equal(
	    store_contract_settled(&o, 50, out, err, sizeof(err)), 0);
	if (!strstr(err, "old/1 (version 0.1.0, protocol none)") ||
	    strstr(err, "gone/1") || strstr(err, "new/1"))
		fail_msg("refused for: %s", err);
	assert_int_equal(
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", l.contract), 0);
	assert_int_equal(index_count(f->conn, &f->t, "_unclassified_idx"), 1);

	/* One that opened the table before the record beats while it
	 * settles: refused, the record taken back. */
	pgtest_exec(f->conn, "DELETE FROM %s WHERE id = 'old/1'", l.registry);
	pthread_t late;
	assert_int_equal(pthread_create(&late, NULL, late_relay_beats, &l), 0);
	int rc = store_contract_settled(&o, 2000, out, err, sizeof(err));
	pthread_join(late, NULL);
	assert_int_not_equal(rc, 0);
	assert_non_null(strstr(err, "late/1 (version 0.1.0, protocol none)"));
	assert_int_equal(
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", l.contract), 0);
	assert_int_equal(index_count(f->conn, &f->t, "_unclassified_idx"), 1);

	/* A record younger than the settle time (migrate of many tables
	 * records every table's steps first, then waits once) is checked
	 * again when it settles, not taken as done before: refused, taken
	 * back. */
	pgtest_exec(f->conn,
		    "INSERT INTO %s (step, protocol) VALUES "
		    "('drop_unclassified_idx', 1)",
		    l.contract);
	pgtest_exec(f->conn,
		    "DELETE FROM %s WHERE id = 'late/1'; INSERT INTO %s (id, "
		    "version, last_seen_at) VALUES ('young/1', '0.1.0', now())",
		    l.registry, l.registry);
	assert_int_not_equal(
	    store_contract_settled(&o, 2000, out, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "young/1 (version 0.1.0, protocol none)"));
	assert_int_equal(
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", l.contract), 0);
	assert_int_equal(index_count(f->conn, &f->t, "_unclassified_idx"), 1);
	/* The records alone: refused while it is alive, then made, the
	 * step not run. */
	assert_int_not_equal(
	    store_contract_record(&o, true, false, out, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "young/1"));
	pgtest_exec(f->conn, "DELETE FROM %s WHERE id = 'young/1'", l.registry);
	if (store_contract_record(&o, true, false, out, err, sizeof(err)) != 0)
		fail_msg("record: %s", err);
	assert_int_equal(
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", l.contract), 1);
	assert_int_equal(index_count(f->conn, &f->t, "_unclassified_idx"), 1);
	/* Settled, its step not run, and a relay older than the protocol
	 * column started since (it reads no record): the step is refused
	 * and the record kept, where the settled record ran the step under
	 * that relay. */
	usleep(100 * 1000);
	pgtest_exec(f->conn,
		    "INSERT INTO %s (id, version, last_seen_at) VALUES "
		    "('back/1', '0.1.0', now())",
		    l.registry);
	assert_int_not_equal(
	    store_contract_settled(&o, 50, out, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "back/1 (version 0.1.0, protocol none)"));
	assert_int_equal(
	    pgtest_long(f->conn, "SELECT count(*) FROM %s", l.contract), 1);
	assert_int_equal(index_count(f->conn, &f->t, "_unclassified_idx"), 1);
	pgtest_exec(f->conn, "DELETE FROM %s WHERE id = 'back/1'", l.registry);
	pgtest_exec(f->conn, "DELETE FROM %s", l.contract);

	/* Upgraded: the step runs, once recorded. */
	pgtest_exec(f->conn, "UPDATE %s SET protocol = %d", l.registry,
		    STORE_PROTOCOL);
	if (store_contract_settled(&o, 50, out, err, sizeof(err)) != 0)
		fail_msg("contract: %s", err);
	assert_int_equal(index_count(f->conn, &f->t, "_unclassified_idx"), 0);
	assert_int_equal(pgtest_long(f->conn,
				     "SELECT count(*) FROM %s WHERE step = "
				     "'drop_unclassified_idx' AND protocol = "
				     "1",
				     l.contract),
			 1);
	if (store_contract_settled(&o, 50, out, err, sizeof(err)) != 0)
		fail_msg("contract again: %s", err);
	fflush(out);
	assert_non_null(
	    strstr(text, "contract step drop_unclassified_idx (protocol 1): "
			 "done\n"));
	assert_non_null(
	    strstr(text, "contract step drop_unclassified_idx (protocol 1): "
			 "recorded before, done\n"));
	fclose(out);

	/* The relay leases keyed rows in order without the index. */
	pgtest_insert(f->conn, f->table, 4);
	pgtest_exec(f->conn, "UPDATE %s SET partition_key = 'k'", f->table);
	o.ordered = true;
	assert_int_equal(pgtest_lease_count(&o), 1);

	/* A step that needs a newer protocol than this relay's. */
	pgtest_exec(f->conn,
		    "INSERT INTO %s (step, protocol) VALUES ('next_step', %d)",
		    l.contract, STORE_PROTOCOL + 1);
	struct store *refused = NULL;
	assert_int_not_equal(store_open(&refused, &o, err, sizeof(err)), 0);
	if (!strstr(err, "contract step next_step") ||
	    !strstr(err, "needs relays of protocol 2"))
		fail_msg("opened, or refused for: %s", err);
	store_close(refused);
}

static void test_lost_session(void **state)
{
	struct fixture *f = *state;
	struct store_gauges g;
	struct store *gone = admin_store(f->table);
	pgtest_exec(f->conn, "SELECT pg_terminate_backend(%d)",
		    PQbackendPID(store_conn(gone)));
	int rc = store_admin_gauges(gone, &g, err, sizeof(err));
	assert_int_equal(rc, STORE_RECONNECT);
	assert_non_null(strstr(err, "gauge query"));
	rc = store_admin_heartbeat(gone, "x/1", "1", (struct store_kept){0},
				   false, true, err, sizeof(err));
	assert_int_equal(rc, STORE_RECONNECT);
	store_close(gone);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_registry, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_registry_group, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_kept_by_relays, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_contract_steps, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_gauges, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_status, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_pause_resume, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_time_arguments, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_lost_session, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_session, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_backlog_count_floors, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(
		test_backlog_floor_across_date_styles, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_xid_and_prepared,
					    setup, teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_slot, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_tie_names_the_writer,
					    setup, teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_vacuum_left_out, setup,
					    teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_walsender_running_sql,
					    setup, teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_without_stats_grant,
					    setup, teardown),
	    cmocka_unit_test_setup_teardown(test_horizon_other_database, setup,
					    teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
