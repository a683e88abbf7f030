/* SPDX-License-Identifier: MIT */
/*
 * The relay's lifecycle (init, start, stop, join, health) and what every
 * loop thread shares: the wake-up generation, idle sleeps, store opening
 * and reconnects. The loops themselves live in worker.c, sweeper.c,
 * cleaner.c and listener.c.
 */
#include "loops_int.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"

void loop_tick(struct relay_thread *th)
{
	atomic_store(&th->last_tick_ms, clock_ms());
}

bool relay_stopping(const struct relay *r)
{
	return atomic_load(&r->stopping) != 0;
}

void relay_wake(struct relay *r)
{
	pthread_mutex_lock(&r->lock);
	r->wake_gen++;
	pthread_cond_broadcast(&r->wake);
	pthread_mutex_unlock(&r->lock);
}

uint64_t relay_wake_generation(struct relay *r)
{
	pthread_mutex_lock(&r->lock);
	uint64_t gen = r->wake_gen;
	pthread_mutex_unlock(&r->lock);
	return gen;
}

/* A notification that arrives while a lease is under way must not be slept
 * through, hence the generation read before the lease. */
void relay_idle_since(struct relay_thread *th, const uint64_t *gen, int64_t ms,
		      void (*service)(void *), void *state)
{
	struct relay *r = th->relay;
	int64_t until = clock_ms() + ms;
	int64_t next_service = clock_ms() + 1000;
	pthread_mutex_lock(&r->lock);
	while (!relay_stopping(r) && (!gen || r->wake_gen == *gen)) {
		int64_t now = clock_ms();
		if (now >= until)
			break;
		/* Wake every second so the tick stays fresh and the
		 * service call keeps broker heartbeats going; not on every
		 * wake-up of other threads (with LISTEN on, thousands a
		 * second), which this sleep does not end. */
		int64_t slice = until - now < 1000 ? until - now : 1000;
		if (service && next_service - now < slice)
			slice = next_service > now ? next_service - now : 1;
		struct timespec ts = clock_monotonic_after(slice);
		pthread_cond_timedwait(&r->wake, &r->lock, &ts);
		if (service && clock_ms() >= next_service) {
			pthread_mutex_unlock(&r->lock);
			service(state);
			pthread_mutex_lock(&r->lock);
			next_service = clock_ms() + 1000;
		}
		loop_tick(th);
	}
	pthread_mutex_unlock(&r->lock);
	loop_tick(th);
}

void relay_idle(struct relay_thread *th, int64_t ms, void (*service)(void *),
		void *state)
{
	uint64_t gen = relay_wake_generation(th->relay);
	relay_idle_since(th, &gen, ms, service, state);
}

static int64_t next_backoff(int64_t backoff)
{
	return backoff * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS : backoff * 2;
}

int relay_reconnect(struct relay_thread *th, struct store *s)
{
	int64_t backoff = RECONNECT_MIN_MS;
	char err[512];
	while (!relay_stopping(th->relay)) {
		if (store_reconnect(s, err, sizeof(err)) == 0) {
			metrics_add(MC_DB_RECONNECTS, 1);
			log_info("reconnected to postgres");
			return 0;
		}
		log_warn("postgres reconnect failed: %s", err);
		relay_idle(th, backoff, NULL, NULL);
		backoff = next_backoff(backoff);
	}
	return -1;
}

void relay_app_name(const struct relay *r, const char *who, char *out,
		    size_t outlen)
{
	snprintf(out, outlen, "outbox-relay/%s/%s", r->host, who);
}

/* A missing table is not retried quietly: it is logged every time. */
struct store *relay_open_store(struct relay_thread *th, const char *who)
{
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	char name[160], leased_by[160], err[1024];
	relay_app_name(r, who, name, sizeof(name));
	snprintf(leased_by, sizeof(leased_by), "%s/%d/%s", r->host, r->pid,
		 who);
	struct store_options o =
	    store_options_from_config(cfg, name, leased_by);
	int64_t backoff = RECONNECT_MIN_MS;
	while (!relay_stopping(r)) {
		struct store *s = NULL;
		if (store_open(&s, &o, err, sizeof(err)) == 0)
			return s;
		log_error("%s", err);
		relay_idle(th, backoff, NULL, NULL);
		backoff = next_backoff(backoff);
	}
	return NULL;
}

/* ---- lifecycle ---- */

int relay_init(struct relay *r, const struct config *cfg,
	       const struct publisher_ops *pub_ops, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	r->cfg = cfg;
	r->pub_ops = pub_ops;
	r->pid = (int)getpid();
	snprintf(r->version, sizeof(r->version), "%s", OUTBOX_VERSION);
	if (gethostname(r->host, sizeof(r->host)) != 0)
		snprintf(r->host, sizeof(r->host), "unknown");
	r->host[sizeof(r->host) - 1] = '\0';
	int window = config_worker_window(cfg);
	if (cfg->workers < 1 || window < 1 ||
	    cfg->workers * window > RELAY_MAX_THREADS - 8) {
		snprintf(err, errlen,
			 "workers %d with a window of %d is out of range",
			 cfg->workers, window);
		return -1;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_mutex_init(&r->lock, NULL) != 0 ||
	    pthread_cond_init(&r->wake, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		snprintf(err, errlen, "cannot create relay locks");
		return -1;
	}
	pthread_condattr_destroy(&ca);
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
	r->worker_shares =
	    worker_shares_create(r, cfg->workers, lanes, err, errlen);
	if (!r->worker_shares)
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
			starts[n++].th->share =
			    worker_share_at(r->worker_shares, i);
		}
	starts[n].fn = sweeper_main;
	starts[n++].th = add_thread(r, "sweeper", 0, loop_max);
	starts[n].fn = cleaner_main;
	starts[n++].th = add_thread(r, "cleaner", 0, loop_max);
	if (cfg->listen) {
		starts[n].fn = listener_main;
		starts[n++].th = add_thread(r, "listener", 0, loop_max);
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
	worker_shares_destroy(r->worker_shares, r->cfg->workers);
	r->worker_shares = NULL;
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->wake);
	return atomic_load(&r->marks_failed) ? 1 : 0;
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
