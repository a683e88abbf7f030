/* SPDX-License-Identifier: MIT */
/*
 * The per-replica max rate (OUTBOX_MAX_RATE): one schedule shared by all
 * workers, relay.rate_next_ms, touched only with relay.lock held. A worker
 * reserves a whole batch before leasing and refunds what the lease did not
 * fill, so the rate holds across workers without a token per event.
 */
#include "loops_int.h"

#include "base/base.h"

/* A rate near 0 (OUTBOX_MAX_RATE=1e-15 is in range) puts the next batch
 * further off than int64 milliseconds reach: the wait is cut to a day,
 * after which the worker asks again and waits on. */
#define RATE_WAIT_MAX_MS (24 * 3600 * 1000.0)

int64_t rate_reserve(struct relay *r, double n)
{
	double rate = r->cfg->max_rate;
	if (rate <= 0)
		return 0;
	double now = (double)clock_ms();
	pthread_mutex_lock(&r->lock);
	double start = r->rate_next_ms > now ? r->rate_next_ms : now;
	r->rate_next_ms = start + n * 1000.0 / rate;
	pthread_mutex_unlock(&r->lock);
	double wait = start - now;
	return (int64_t)(wait < RATE_WAIT_MAX_MS ? wait : RATE_WAIT_MAX_MS);
}

void rate_wait(struct relay_thread *th, double n, void (*service)(void *),
	       void *state)
{
	int64_t wait = rate_reserve(th->relay, n);
	/* Only shutdown ends it early: a notification did, and with LISTEN
	 * on a steady stream of them let every lease through at once, past
	 * the rate, while each reservation pushed the schedule further
	 * ahead (a long wait once the stream stopped). */
	if (wait > 0)
		relay_idle_since(th, NULL, wait, service, state);
}

void rate_refund(struct relay *r, double n)
{
	if (r->cfg->max_rate <= 0 || n <= 0)
		return;
	pthread_mutex_lock(&r->lock);
	r->rate_next_ms -= n * 1000.0 / r->cfg->max_rate;
	pthread_mutex_unlock(&r->lock);
}
