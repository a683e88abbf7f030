/* SPDX-License-Identifier: MIT */
/*
 * What every loop thread uses: its health tick, the relay's wake-ups and
 * shutdown flag, idle sleeps, and the names of its sessions. The bottom of
 * src/loops: it calls nothing else in the folder.
 */
#include "loops_int.h"

#include <stdio.h>
#include <time.h>

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

void relay_wake_source(struct relay *r, size_t i)
{
	atomic_fetch_add(&r->source_wake[i], 1);
	relay_wake(r);
}

void relay_wake_source_at(struct relay *r, size_t i, int64_t at_ms)
{
	long long was = atomic_load(&r->source_wake_at[i]);
	while ((was == 0 || at_ms < was) &&
	       !atomic_compare_exchange_weak(&r->source_wake_at[i], &was,
					     (long long)at_ms))
		;
	relay_wake(r);
}

void relay_note_notify_usage(struct relay *r, size_t db, int64_t ppm)
{
	size_t dbs = config_n_databases(r->cfg);
	if (db >= dbs)
		return;
	pthread_mutex_lock(&r->lock);
	r->notify_ppm[db] = ppm;
	int64_t most = 0;
	for (size_t d = 0; d < dbs; d++)
		if (r->notify_ppm[d] > most)
			most = r->notify_ppm[d];
	metrics_set(MG_NOTIFY_QUEUE_PPM, most);
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

void relay_backoff(struct relay_thread *th, int64_t ms)
{
	relay_idle_since(th, NULL, ms, NULL, NULL);
}

void relay_app_name(const struct relay *r, const char *who, char *out,
		    size_t outlen)
{
	snprintf(out, outlen, "outbox-relay/%s/%s", r->host, who);
}

int64_t loop_backoff_grow(int64_t backoff, int64_t max)
{
	return backoff * 2 > max ? max : backoff * 2;
}
