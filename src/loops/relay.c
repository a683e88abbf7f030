/* SPDX-License-Identifier: MIT */
/*
 * The relay's lifecycle (create, start, stop, join, destroy), its health
 * and the accessors of loops/loops.h. The loops themselves live in
 * worker.c, sweeper.c, cleaner.c and listener.c, the primitives they share
 * in loop.c.
 */
#include "loops_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"

/* ---- lifecycle ---- */

/* Frees what relay_create() made before its locks, the first turns of
 * key_turn and due_turn having been set up, and r. */
static void relay_free(struct relay *r, size_t turns)
{
	for (size_t i = 0; i < turns; i++) {
		store_key_turn_destroy(&r->key_turn[i]);
		store_due_turn_destroy(&r->due_turn[i]);
	}
	free(r->key_turn);
	free(r->due_turn);
	free(r->rescan_pace);
	free(r->source_wake);
	free(r->source_wake_at);
	free(r->source_stats);
	source_list_free(&r->sources);
	free(r);
}

int relay_create(struct relay **out, const struct config *cfg,
		 const struct publisher_ops *pub_ops, char *err, size_t errlen)
{
	*out = NULL;
	int window = config_worker_window(cfg);
	if (cfg->workers < 1 || window < 1 ||
	    cfg->workers * window > RELAY_MAX_THREADS - 8) {
		snprintf(err, errlen,
			 "workers %d with a window of %d is out of range",
			 cfg->workers, window);
		return -1;
	}
	struct relay *r = calloc(1, sizeof(*r));
	if (!r) {
		snprintf(err, errlen, "out of memory for the relay");
		return -1;
	}
	r->cfg = cfg;
	r->pub_ops = pub_ops;
	/* A config made by hand (tests of the lanes) may list no table. */
	if (source_list_init(&r->sources, cfg) != 0) {
		free(r);
		snprintf(err, errlen, "out of memory for the relay");
		return -1;
	}
	size_t sources = r->sources.cap;
	r->rescan_pace = calloc(sources, sizeof(*r->rescan_pace));
	r->key_turn = calloc(sources, sizeof(*r->key_turn));
	r->due_turn = calloc(sources, sizeof(*r->due_turn));
	r->source_wake = calloc(sources, sizeof(*r->source_wake));
	r->source_wake_at = calloc(sources, sizeof(*r->source_wake_at));
	r->source_stats = calloc(sources, sizeof(*r->source_stats));
	if (!r->rescan_pace || !r->key_turn || !r->due_turn ||
	    !r->source_wake || !r->source_wake_at || !r->source_stats) {
		relay_free(r, 0);
		snprintf(err, errlen, "out of memory for the relay");
		return -1;
	}
	for (size_t i = 0; i < sources; i++) {
		if (store_key_turn_init(&r->key_turn[i]) != 0) {
			relay_free(r, i);
			snprintf(err, errlen, "cannot create relay locks");
			return -1;
		}
		if (store_due_turn_init(&r->due_turn[i]) != 0) {
			store_key_turn_destroy(&r->key_turn[i]);
			relay_free(r, i);
			snprintf(err, errlen, "cannot create relay locks");
			return -1;
		}
		atomic_init(&r->rescan_pace[i].due_ms, 0);
		atomic_init(&r->source_wake[i], 0);
		atomic_init(&r->source_wake_at[i], 0);
		atomic_init(&r->source_stats[i].sent, 0);
		atomic_init(&r->source_stats[i].retried, 0);
		atomic_init(&r->source_stats[i].failed, 0);
		atomic_init(&r->source_stats[i].failing, 0);
		atomic_init(&r->source_stats[i].lag_ms, 0);
		atomic_init(&r->source_stats[i].dead_tuples, -1);
	}
	r->pid = (int)getpid();
	if (gethostname(r->host, sizeof(r->host)) != 0)
		snprintf(r->host, sizeof(r->host), "unknown");
	r->host[sizeof(r->host) - 1] = '\0';
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	bool locks = pthread_mutex_init(&r->lock, NULL) == 0;
	bool cond = locks && pthread_cond_init(&r->wake, &ca) == 0;
	pthread_condattr_destroy(&ca);
	if (!cond) {
		if (locks)
			pthread_mutex_destroy(&r->lock);
		relay_free(r, sources);
		snprintf(err, errlen, "cannot create relay locks");
		return -1;
	}
	*out = r;
	return 0;
}

static struct relay_thread *add_thread(struct relay *r, const char *name,
				       int index, int64_t max_interval_ms)
{
	struct relay_thread *th = &r->threads[r->n_threads++];
	snprintf(th->name, sizeof(th->name), "%s", name);
	th->relay = r;
	th->index = index;
	th->max_interval_ms = max_interval_ms;
	atomic_store(&th->last_tick_ms, clock_ms());
	return th;
}

int relay_start(struct relay *r, char *err, size_t errlen)
{
	const struct config *cfg = r->cfg;
	/* One pass of any loop runs a bounded number of statements (each
	 * capped by statement_timeout) plus, for workers, one publish. */
	int64_t st = cfg->statement_timeout_ms;
	int64_t worker_max =
	    cfg->publish_timeout_ms + 8 * st + cfg->poll_interval_ms + 10000;
	int64_t loop_max = 25 * st + 10000;
	struct {
		void *(*fn)(void *);
		struct relay_thread *th;
	} starts[RELAY_MAX_THREADS];
	int n = 0;
	int lanes = config_worker_window(cfg);
	r->lanes = lanes_create(r, cfg->workers, lanes, err, errlen);
	if (!r->lanes)
		return -1;
	for (int i = 0; i < cfg->workers; i++)
		for (int lane = 0; lane < lanes; lane++) {
			char name[32];
			if (lane == 0)
				snprintf(name, sizeof(name), "worker-%d", i);
			else
				snprintf(name, sizeof(name), "worker-%d.%d", i,
					 lane);
			starts[n].fn = worker_main;
			starts[n].th = add_thread(r, name, i, worker_max);
			starts[n++].th->lanes = lanes_of_worker(r->lanes, i);
		}
	starts[n].fn = sweeper_main;
	starts[n++].th = add_thread(r, "sweeper", 0, loop_max);
	starts[n].fn = cleaner_main;
	starts[n++].th = add_thread(r, "cleaner", 0, loop_max);
	/* A listener a database: each LISTENs on its own session. */
	for (size_t db = 0; cfg->listen && db < config_n_databases(cfg); db++) {
		char name[32];
		if (db == 0)
			snprintf(name, sizeof(name), "listener");
		else
			snprintf(name, sizeof(name), "listener-%zu", db);
		starts[n].fn = listener_main;
		starts[n++].th = add_thread(r, name, (int)db, loop_max);
	}
	if (config_has_patterns(cfg)) {
		starts[n].fn = discovery_main;
		starts[n++].th = add_thread(r, "discovery", 0, loop_max);
	}
	for (int i = 0; i < n; i++) {
		int rc = pthread_create(&starts[i].th->tid, NULL, starts[i].fn,
					starts[i].th);
		if (rc != 0) {
			char why[128];
			snprintf(err, errlen, "cannot start thread %s: %s",
				 starts[i].th->name,
				 strerror_r(rc, why, sizeof(why)));
			relay_stop(r);
			return -1;
		}
		starts[i].th->started = true;
	}
	return 0;
}

void relay_stop(struct relay *r)
{
	if (atomic_exchange(&r->stopping, 1) == 0)
		r->shutdown_started_ms = clock_ms();
	relay_wake(r);
}

bool relay_finished(struct relay *r)
{
	for (int i = 0; i < r->n_threads; i++) {
		if (!r->threads[i].started)
			continue;
		if (pthread_tryjoin_np(r->threads[i].tid, NULL) == 0)
			r->threads[i].started = false;
		else
			return false;
	}
	return true;
}

int relay_join(struct relay *r)
{
	for (int i = 0; i < r->n_threads; i++)
		if (r->threads[i].started) {
			pthread_join(r->threads[i].tid, NULL);
			r->threads[i].started = false;
		}
	lanes_destroy(r->lanes, r->cfg->workers);
	r->lanes = NULL;
	return atomic_load(&r->marks_failed) ? 1 : 0;
}

void relay_destroy(struct relay *r)
{
	if (!r)
		return;
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->wake);
	relay_free(r, r->sources.cap);
}

bool relay_healthy(struct relay *r, char *out, size_t outlen)
{
	int64_t now = clock_ms();
	for (int i = 0; i < r->n_threads; i++) {
		struct relay_thread *th = &r->threads[i];
		int64_t age = now - atomic_load(&th->last_tick_ms);
		if (age > th->max_interval_ms) {
			snprintf(out, outlen,
				 "loop %s has not ticked for %lld ms (limit "
				 "%lld ms)",
				 th->name, (long long)age,
				 (long long)th->max_interval_ms);
			return false;
		}
	}
	return true;
}

bool relay_publisher_ready(const struct relay *r)
{
	return atomic_load(&r->workers_ready) > 0;
}

const char *relay_publisher_name(const struct relay *r)
{
	return r->pub_ops->name;
}

const struct config *relay_config(const struct relay *r)
{
	return r->cfg;
}

void relay_replica_id(const struct relay *r, char *out, size_t outlen)
{
	snprintf(out, outlen, "%s/%d", r->host, r->pid);
}

const char *relay_host(const struct relay *r)
{
	return r->host;
}
