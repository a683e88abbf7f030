/* SPDX-License-Identifier: MIT */
/*
 * Benchmark (not a test): what a hot partition key costs the ordered lease.
 * Runs the relay's own lease statement (store_lease, batch 100) in ordered
 * mode on a table where 10k keys each have one due row, then again after
 * one key gets 100k due rows older than all of them, and in unordered mode
 * for reference; then with every key's first row in backoff, the key map
 * against the walk along key_idx (OUTBOX_LEASE_RESCAN_INTERVAL=0). Every
 * lease is released again, so each measurement sees the same table.
 * Prints one JSON object: median and min/max per case and the hot/none
 * ratio (docs/design.md §6: at most 2).
 *
 * Usage: bench_ordering DATABASE_URL [HOT_ROWS] [REPEATS]
 */
#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "store/migrate.h"
#include "store/store.h"

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int exec(PGconn *c, const char *sql)
{
	PGresult *r = PQexec(c, sql);
	int ok = PQresultStatus(r) == PGRES_COMMAND_OK ||
		 PQresultStatus(r) == PGRES_TUPLES_OK;
	if (!ok)
		fprintf(stderr, "bench_ordering: %s: %s", sql,
			PQerrorMessage(c));
	PQclear(r);
	return ok ? 0 : -1;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/*
 * Leases and releases `repeats` times; writes median, min, max in ms. In
 * ordered mode each lease walks the keys from where the last one stopped
 * (docs/design.md §6), so consecutive leases take different keys.
 */
static int measure(struct store *s, int repeats, size_t want, double out[3])
{
	char err[1024];
	double *t = calloc((size_t)repeats, sizeof(double));
	if (!t)
		return -1;
	for (int i = 0; i < repeats; i++) {
		struct lease_batch b;
		double t0 = now_ms();
		if (store_lease(s, NULL, 0, "", &b, err, sizeof(err)) != 0) {
			fprintf(stderr, "bench_ordering: %s\n", err);
			free(t);
			return -1;
		}
		t[i] = now_ms() - t0;
		if (b.n == 0 && want == 0)
			continue; /* an empty lease ended its transaction */
		if (b.n != want) {
			fprintf(stderr,
				"bench_ordering: leased %zu rows, want %zu\n",
				b.n, want);
			store_lease_abort(s, &b, err, sizeof(err));
			lease_batch_release(&b);
			free(t);
			return -1;
		}
		const char **ids = calloc(b.n, sizeof(*ids));
		for (size_t k = 0; k < b.n; k++)
			ids[k] = b.events[k].id;
		struct mark_result r;
		int rc = store_mark(s, MARK_RELEASE, ids, NULL, b.n, &r, err,
				    sizeof(err));
		if (rc == 0)
			rc = store_lease_abort(s, &b, err, sizeof(err));
		free(ids);
		lease_batch_release(&b);
		if (rc != 0) {
			fprintf(stderr, "bench_ordering: %s\n", err);
			free(t);
			return -1;
		}
	}
	qsort(t, (size_t)repeats, sizeof(double), cmp_double);
	out[0] = t[repeats / 2];
	out[1] = t[0];
	out[2] = t[repeats - 1];
	free(t);
	return 0;
}

static struct store *open_store(const char *url, const char *table,
				bool ordered, int64_t rescan_ms)
{
	char err[1024];
	struct store_options o = {
	    .conninfo = url,
	    .table = table,
	    .app_name = "bench_ordering",
	    .leased_by = "bench",
	    .ce_source = "/bench",
	    .batch_size = 100,
	    .clean_batch_size = 1000,
	    .lease_timeout_ms = 60000,
	    .statement_timeout_ms = 60000,
	    .backoff_base_ms = 2000,
	    .backoff_max_ms = 300000,
	    .backoff_factor = 2,
	    .prepare = true,
	    .ordered = ordered,
	    /* 5 s, the relay's default: floors on, the key map in ordered
	     * mode; 0: no floors, the walk along key_idx. */
	    .lease_rescan_ms = rescan_ms,
	};
	struct store *s = NULL;
	if (store_open(&s, &o, err, sizeof(err)) != 0)
		fprintf(stderr, "bench_ordering: %s\n", err);
	return s;
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: bench_ordering DATABASE_URL [HOT_ROWS] "
				"[REPEATS]\n");
		return 2;
	}
	const char *url = argv[1];
	long hot = argc > 2 ? strtol(argv[2], NULL, 10) : 100000;
	int repeats = argc > 3 ? (int)strtol(argv[3], NULL, 10) : 50;
	if (hot < 1 || repeats < 3) {
		fprintf(stderr, "bench_ordering: bad HOT_ROWS or REPEATS\n");
		return 2;
	}
	char table[96], err[1024], sql[512];
	snprintf(table, sizeof(table), "bench_ord_%d.outbox_events",
		 (int)getpid());
	struct outbox_table t;
	table_parse(table, &t, err, sizeof(err));
	PGconn *c = PQconnectdb(url);
	if (PQstatus(c) != CONNECTION_OK) {
		fprintf(stderr, "bench_ordering: %s", PQerrorMessage(c));
		return 1;
	}
	exec(c, "SET client_min_messages = warning");
	if (migrate_run(c, &t, NULL, err, sizeof(err)) != 0) {
		fprintf(stderr, "bench_ordering: %s\n", err);
		return 1;
	}
	/* 10k keys with one due row each. */
	snprintf(sql, sizeof(sql),
		 "INSERT INTO %s (type, partition_key, payload, "
		 "next_attempt_at) SELECT 't', 'k' || g, 'x', now() - "
		 "interval '1 minute' FROM generate_series(1, 10000) g",
		 t.quoted);
	int rc = exec(c, sql);
	snprintf(sql, sizeof(sql), "VACUUM ANALYZE %s", t.quoted);
	rc |= exec(c, sql);
	struct store *ord = open_store(url, table, true, 5000);
	struct store *unord = open_store(url, table, false, 5000);
	double none[3], hot_t[3], unordered[3];
	if (rc || !ord || !unord || measure(ord, repeats, 100, none) != 0)
		return 1;
	/* One key with HOT_ROWS due rows, all older than the others: the
	 * head of the pending index. */
	snprintf(sql, sizeof(sql),
		 "INSERT INTO %s (type, partition_key, payload, "
		 "next_attempt_at) SELECT 't', 'HOT', 'x', now() - interval "
		 "'1 hour' FROM generate_series(1, %ld) g",
		 t.quoted, hot);
	rc = exec(c, sql);
	snprintf(sql, sizeof(sql), "VACUUM ANALYZE %s", t.quoted);
	rc |= exec(c, sql);
	if (rc || measure(ord, repeats, 100, hot_t) != 0 ||
	    measure(unord, repeats, 100, unordered) != 0)
		return 1;
	/* Every key's first row waits in backoff (a broker outage's
	 * backlog): a lease finds nothing and walks as far as the cap, with
	 * the key map (its window grown to the cap by the first leases) and
	 * with the walk along key_idx (no floors). */
	snprintf(sql, sizeof(sql),
		 "UPDATE %s SET next_attempt_at = now() + interval '1 hour'",
		 t.quoted);
	struct store *walk = open_store(url, table, true, 0);
	double backoff_map[3], backoff_walk[3], warm[3];
	if (exec(c, sql) != 0 || !walk || measure(ord, 5, 0, warm) != 0 ||
	    measure(ord, repeats, 0, backoff_map) != 0 ||
	    measure(walk, repeats, 0, backoff_walk) != 0)
		return 1;
	printf("{\"hot_rows\":%ld,\"repeats\":%d,"
	       "\"ordered_lease_ms_no_hot_key\":[%.3f,%.3f,%.3f],"
	       "\"ordered_lease_ms_hot_key\":[%.3f,%.3f,%.3f],"
	       "\"unordered_lease_ms_hot_key\":[%.3f,%.3f,%.3f],"
	       "\"hot_over_none\":%.2f,"
	       "\"ordered_lease_ms_all_in_backoff\":[%.3f,%.3f,%.3f],"
	       "\"walk_lease_ms_all_in_backoff\":[%.3f,%.3f,%.3f]}\n",
	       hot, repeats, none[0], none[1], none[2], hot_t[0], hot_t[1],
	       hot_t[2], unordered[0], unordered[1], unordered[2],
	       hot_t[0] / none[0], backoff_map[0], backoff_map[1],
	       backoff_map[2], backoff_walk[0], backoff_walk[1],
	       backoff_walk[2]);
	store_close(ord);
	store_close(unord);
	store_close(walk);
	snprintf(sql, sizeof(sql), "DROP SCHEMA \"%s\" CASCADE", t.schema);
	exec(c, sql);
	PQfinish(c);
	return 0;
}
