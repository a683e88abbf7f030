/* SPDX-License-Identifier: MIT */
/*
 * What the lanes of one worker share (docs/design.md §7, "The worker's
 * window"): the publisher, its health and probe schedule, and the lease
 * cadence. A worker with OUTBOX_WORKER_WINDOW=w runs w lane threads; each
 * lane leases, publishes and marks one batch at a time on its own Postgres
 * session (a lease is an open transaction, so one per session), and the
 * lanes take turns at the publisher: while one batch is with the broker,
 * the next lane's lease and the last lane's marks run beside it.
 *
 * Batches go to the broker in the order they were leased: each leased
 * batch gets a ticket at the end of its lease turn, and the publisher
 * serves tickets in order, so one worker keeps a key's rows in order as
 * the serial worker did (and as Kafka's per-key partitions show).
 *
 * Locks: pub_lock guards pub and the health fields; turn_lock the ticket
 * being served; lease_lock the lease cadence and the tickets issued. A
 * lane holds pub_lock and lease_lock never together, turn_lock only over
 * the ticket (never while it waits for another lock), and lease_lock
 * over no statement (it takes the turn, leases, and gives it back). The
 * publisher is thus used by one lane at a time, on whichever lane's
 * thread holds pub_lock; a publish's callbacks (struct publish_ctx) run
 * on that thread. A lane waits for its turn without pub_lock: waiting on
 * a condition of the lock the publishing lane holds, its wait could not
 * end, nor its lease be renewed, until that whole publish was over.
 */
#include "loops_int.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "base/base.h"

#define PROBE_MIN_MS 1000
/* A probe is one confirmed publish: cheap enough to try every few seconds,
 * so publishing resumes soon after the broker recovers. */
#define PROBE_MAX_MS 5000
/* How long a lane waits for another lane's lease before looking at
 * shutdown again. */
#define TURN_WAIT_MS 50
/* How often a lane waiting for the publisher calls ctx->tick (its lease
 * renewal and health tick). */
#define WAIT_SLICE_MS 200

struct lanes {
	struct relay *r;

	pthread_mutex_t pub_lock;
	struct publisher pub;
	/* pub.healthy as last set (under pub_lock), for a lane that finds
	 * the lock taken by another lane's publish. */
	atomic_bool healthy;
	int64_t next_probe_ms;
	int64_t probe_backoff_ms;
	int lanes_left; /* the last lane out closes the publisher */

	pthread_mutex_t turn_lock;
	uint64_t serving;	     /* the ticket whose batch publishes next */
	pthread_cond_t publish_turn; /* with turn_lock, on CLOCK_MONOTONIC */

	pthread_mutex_t lease_lock;
	pthread_cond_t lease_done; /* on CLOCK_MONOTONIC */
	bool leasing;		   /* a lane holds the lease turn */
	int64_t turn_began_ms;	   /* when it took it (clock_ms) */
	int64_t next_lease_ms;	   /* no lease before (clock_ms) */
	bool idle;		   /* the last lease found nothing */
	int64_t idle_lease_ms;	   /* when that lease began (clock_ms) */
	uint64_t idle_gen;	   /* wake-up generation read before it */
	uint64_t issued;	   /* tickets given to leased batches */
	/* When each source is due: only the lane holding the lease turn
	 * (leasing) touches it. */
	struct source_turns *turns;
};

struct lanes *lanes_create(struct relay *r, int n, int per_worker, char *err,
			   size_t errlen)
{
	struct lanes *all = calloc((size_t)n, sizeof(*all));
	if (!all) {
		snprintf(err, errlen, "out of memory for %d workers", n);
		return NULL;
	}
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	for (int i = 0; i < n; i++) {
		struct lanes *l = &all[i];
		l->r = r;
		l->lanes_left = per_worker;
		l->serving = 1;
		publisher_init(&l->pub, r->pub_ops);
		/* Counted unhealthy until the first open. */
		metrics_gauge_add(MG_PUBLISHERS_UNHEALTHY, 1);
		pthread_mutex_init(&l->pub_lock, NULL);
		pthread_mutex_init(&l->turn_lock, NULL);
		pthread_mutex_init(&l->lease_lock, NULL);
		pthread_cond_init(&l->lease_done, &ca);
		pthread_cond_init(&l->publish_turn, &ca);
		l->turns =
		    source_turns_create(r->sources.cap ? r->sources.cap : 1);
	}
	pthread_condattr_destroy(&ca);
	for (int i = 0; i < n; i++)
		if (!all[i].turns) {
			lanes_destroy(all, n);
			snprintf(err, errlen, "out of memory for %d workers",
				 n);
			return NULL;
		}
	return all;
}

struct lanes *lanes_of_worker(struct lanes *all, int i)
{
	return &all[i];
}

struct source_turns *lanes_source_turns(struct lanes *l)
{
	return l->turns;
}

void lanes_destroy(struct lanes *all, int n)
{
	if (!all)
		return;
	for (int i = 0; i < n; i++) {
		struct lanes *l = &all[i];
		publisher_close(&l->pub);
		pthread_mutex_destroy(&l->pub_lock);
		pthread_mutex_destroy(&l->turn_lock);
		pthread_mutex_destroy(&l->lease_lock);
		pthread_cond_destroy(&l->lease_done);
		pthread_cond_destroy(&l->publish_turn);
		source_turns_destroy(l->turns);
	}
	free(all);
}

/* ---- the publisher (under pub_lock) ---- */

static void set_healthy(struct lanes *l, bool healthy)
{
	if (healthy == l->pub.healthy)
		return;
	l->pub.healthy = healthy;
	atomic_store(&l->healthy, healthy);
	atomic_fetch_add(&l->r->workers_ready, healthy ? 1 : -1);
	metrics_gauge_add(MG_PUBLISHERS_UNHEALTHY, healthy ? -1 : 1);
}

/* Opens or probes the publisher when it is due, and not once shutdown
 * began: a probe or a reconnect takes seconds that a lane closing behind
 * it, with acknowledged rows to mark, would wait out. */
static bool ensure_publisher(struct lanes *l, const struct config *cfg)
{
	if (l->pub.healthy)
		return true;
	int64_t now = clock_ms();
	if (now < l->next_probe_ms || relay_stopping(l->r))
		return false;
	char err[512] = "";
	int rc = l->pub.open ? publisher_probe(&l->pub, err, sizeof(err))
			     : publisher_open(&l->pub, cfg, err, sizeof(err));
	if (rc == 0) {
		log_info("publisher %s is healthy", l->pub.ops->name);
		l->probe_backoff_ms = 0;
		set_healthy(l, true);
		return true;
	}
	metrics_add(MC_PUBLISHER_FAILURES, 1);
	l->probe_backoff_ms =
	    l->probe_backoff_ms ? l->probe_backoff_ms * 2 : PROBE_MIN_MS;
	if (l->probe_backoff_ms > PROBE_MAX_MS)
		l->probe_backoff_ms = PROBE_MAX_MS;
	l->next_probe_ms = now + l->probe_backoff_ms;
	log_fields(LOG_WARN, "publisher unhealthy; leasing nothing for it",
		   "publisher", l->pub.ops->name, "error", err, NULL);
	return false;
}

bool lanes_publisher_ready(struct lanes *l, const struct config *cfg,
			   int64_t *next_probe_ms)
{
	/* Taken by a lane publishing with a healthy publisher: ready, and
	 * this lane's lease runs beside that publish rather than after it.
	 * Taken otherwise (a probe, a close), wait for its verdict. */
	if (pthread_mutex_trylock(&l->pub_lock) != 0) {
		if (atomic_load(&l->healthy))
			return true;
		pthread_mutex_lock(&l->pub_lock);
	}
	bool ok = ensure_publisher(l, cfg);
	if (ok)
		publisher_service(&l->pub);
	*next_probe_ms = l->next_probe_ms;
	pthread_mutex_unlock(&l->pub_lock);
	return ok;
}

void lanes_publisher_service(void *arg)
{
	struct lanes *l = arg;
	/* Busy means another lane is publishing, which services it. */
	if (pthread_mutex_trylock(&l->pub_lock) != 0)
		return;
	publisher_service(&l->pub);
	pthread_mutex_unlock(&l->pub_lock);
}

/* Takes pub_lock, calling ctx->tick (lease renewal, health tick) at least
 * every few hundred milliseconds while another lane holds it (a probe, the
 * publisher's service, a close). */
static void lock_publisher(struct lanes *l, struct publish_ctx *ctx)
{
	for (;;) {
		struct timespec at = clock_monotonic_after(WAIT_SLICE_MS);
		int rc =
		    pthread_mutex_clocklock(&l->pub_lock, CLOCK_MONOTONIC, &at);
		if (rc == 0)
			return;
		if (rc != ETIMEDOUT) {
			/* Not expected of a default mutex; waiting blind is
			 * still correct, only without renewals. */
			pthread_mutex_lock(&l->pub_lock);
			return;
		}
		ctx->tick(ctx);
	}
}

/* Waits until ticket is served, calling ctx->tick (if ctx) at least every
 * few hundred milliseconds meanwhile, whether the wait timed out or another
 * lane's turn woke it (the tick renews the lease only when due), and
 * without turn_lock: a renewal is a round trip to the database that the
 * other lanes need not wait for. */
static void await_ticket(struct lanes *l, uint64_t ticket,
			 struct publish_ctx *ctx)
{
	pthread_mutex_lock(&l->turn_lock);
	while (l->serving != ticket) {
		struct timespec at = clock_monotonic_after(WAIT_SLICE_MS);
		pthread_cond_timedwait(&l->publish_turn, &l->turn_lock, &at);
		if (ctx && l->serving != ticket) {
			pthread_mutex_unlock(&l->turn_lock);
			ctx->tick(ctx);
			pthread_mutex_lock(&l->turn_lock);
		}
	}
	pthread_mutex_unlock(&l->turn_lock);
}

/* The next ticket's turn. */
static void next_ticket(struct lanes *l)
{
	pthread_mutex_lock(&l->turn_lock);
	l->serving++;
	pthread_cond_broadcast(&l->publish_turn);
	pthread_mutex_unlock(&l->turn_lock);
}

void lanes_pass(struct lanes *l, uint64_t ticket, struct publish_ctx *ctx)
{
	await_ticket(l, ticket, ctx);
	next_ticket(l);
}

/* What the backend gets for one publish: the lane's context with the
 * deadline capped by the publish's own. */
struct turn_ctx {
	struct publish_ctx pub; /* the backend's; opaque: this */
	struct publish_ctx *lane;
	int64_t own_deadline_ms;
};

static int64_t turn_deadline(const struct turn_ctx *t)
{
	return t->own_deadline_ms < t->lane->deadline_ms ? t->own_deadline_ms
							 : t->lane->deadline_ms;
}

static bool turn_may_send(struct publish_ctx *ctx, size_t i)
{
	struct turn_ctx *t = ctx->opaque;
	return t->lane->may_send(t->lane, i);
}

/* A renewal moves the lane's deadline (its lease's); the publish follows
 * it up to its own. */
static bool turn_tick(struct publish_ctx *ctx)
{
	struct turn_ctx *t = ctx->opaque;
	bool stopping = t->lane->tick(t->lane);
	t->pub.deadline_ms = turn_deadline(t);
	return stopping;
}

int lanes_publish(struct lanes *l, uint64_t ticket,
		  const struct outbox_event *events, size_t n,
		  int64_t timeout_ms, struct publish_ctx *ctx,
		  struct pub_result *results)
{
	await_ticket(l, ticket, ctx);
	lock_publisher(l, ctx);
	/* The publish's own time starts with its turn: the lanes before it
	 * may have taken most of a publish timeout each (a broker slow to
	 * confirm), and a deadline counted from the lease would report
	 * this batch's confirms in doubt before they were due. The lease's
	 * deadline is read now, as the renewals of the wait left it, not as
	 * it was when the lane began to wait. */
	struct turn_ctx turn = {
	    .pub = {.may_send = turn_may_send, .tick = turn_tick},
	    .lane = ctx,
	    .own_deadline_ms = clock_ms() + timeout_ms};
	turn.pub.opaque = &turn;
	turn.pub.deadline_ms = turn_deadline(&turn);
	int rc = -1;
	/* Another lane may have found the broker gone while this one
	 * waited: its rows were never handed over. */
	if (!l->pub.healthy || !l->pub.open) {
		for (size_t i = 0; i < n; i++) {
			results[i].outcome = PUB_NOT_WRITTEN;
			snprintf(results[i].reason, sizeof(results[i].reason),
				 "not handed to the broker: the publisher "
				 "became unhealthy");
		}
		goto out;
	}
	/* The publish alone: the wait for the turn is the lanes'. */
	int64_t t0 = clock_ms();
	rc = publisher_publish(&l->pub, events, n, &turn.pub, results);
	metrics_observe(MH_PUBLISH_SECONDS, (uint64_t)(clock_ms() - t0) * 1000);
	bool in_doubt = false;
	for (size_t i = 0; i < n; i++)
		in_doubt = in_doubt || results[i].outcome == PUB_TRANSPORT;
	/* An outcome in doubt means the connection is: probe it before the
	 * next batch (docs/design.md §3). */
	if (rc != 0 || in_doubt)
		set_healthy(l, false);
out:
	pthread_mutex_unlock(&l->pub_lock);
	next_ticket(l);
	return rc;
}

void lanes_close_before_release(struct lanes *l)
{
	pthread_mutex_lock(&l->pub_lock);
	if (l->pub.open) {
		publisher_close(&l->pub);
		set_healthy(l, false);
	}
	pthread_mutex_unlock(&l->pub_lock);
}

void lanes_leave(struct lanes *l)
{
	pthread_mutex_lock(&l->pub_lock);
	if (--l->lanes_left == 0) {
		publisher_close(&l->pub);
		set_healthy(l, false);
	}
	pthread_mutex_unlock(&l->pub_lock);
}

/* ---- the lease cadence (under lease_lock) ---- */

static void lease_wait(struct lanes *l, int64_t ms)
{
	struct timespec at = clock_monotonic_after(ms);
	pthread_cond_timedwait(&l->lease_done, &l->lease_lock, &at);
}

/* Called with lease_lock held, in a wait for the turn: once a second
 * the publisher is serviced (broker heartbeats), without lease_lock,
 * which a lane never holds with pub_lock. */
static void service_while_waiting(struct lanes *l, int64_t *serviced_ms)
{
	if (clock_ms() - *serviced_ms < 1000)
		return;
	pthread_mutex_unlock(&l->lease_lock);
	lanes_publisher_service(l);
	pthread_mutex_lock(&l->lease_lock);
	*serviced_ms = clock_ms();
}

bool lanes_take_turn(struct lanes *l, struct relay_thread *th)
{
	struct relay *r = l->r;
	int64_t serviced_ms = clock_ms();
	pthread_mutex_lock(&l->lease_lock);
	for (;;) {
		if (relay_stopping(r)) {
			pthread_mutex_unlock(&l->lease_lock);
			return false;
		}
		if (l->leasing) {
			/* Another lane leases: two at once would only split
			 * the same rows between them. */
			loop_tick(th);
			lease_wait(l, TURN_WAIT_MS);
			service_while_waiting(l, &serviced_ms);
			continue;
		}
		int64_t now = clock_ms();
		bool woken = l->idle && relay_wake_generation(r) != l->idle_gen;
		if (now >= l->next_lease_ms || woken) {
			l->leasing = true;
			l->turn_began_ms = now;
			pthread_mutex_unlock(&l->lease_lock);
			return true;
		}
		int64_t wait = l->next_lease_ms - now;
		if (!l->idle) {
			/* Paced after a partial batch (OUTBOX_LEASE_INTERVAL)
			 * or a skipped turn (a pause, a source set aside: up
			 * to OUTBOX_POLL_INTERVAL): only time ends it, so it
			 * waits here, where the wake-ups of LISTEN do not
			 * reach; in slices, since neither does shutdown. */
			loop_tick(th);
			lease_wait(l,
				   wait < TURN_WAIT_MS ? wait : TURN_WAIT_MS);
			service_while_waiting(l, &serviced_ms);
			continue;
		}
		uint64_t gen = l->idle_gen;
		pthread_mutex_unlock(&l->lease_lock);
		/* Idle: a wake-up (a notification, a resume) ends the wait. */
		relay_idle_since(th, &gen, wait, lanes_publisher_service, l);
		pthread_mutex_lock(&l->lease_lock);
	}
}

uint64_t lanes_end_turn(struct lanes *l, enum turn_end how,
			int64_t next_lease_ms, uint64_t wake_gen)
{
	uint64_t ticket = 0;
	pthread_mutex_lock(&l->lease_lock);
	if (how == TURN_LEASED)
		ticket = ++l->issued;
	l->leasing = false;
	l->next_lease_ms = next_lease_ms;
	l->idle = how == TURN_EMPTY;
	l->idle_gen = wake_gen;
	if (l->idle)
		l->idle_lease_ms = l->turn_began_ms;
	pthread_cond_broadcast(&l->lease_done);
	pthread_mutex_unlock(&l->lease_lock);
	return ticket;
}

bool lanes_leased_since(struct lanes *l, int64_t ms)
{
	pthread_mutex_lock(&l->lease_lock);
	/* A lease under way may still come back empty, and its lane would
	 * then sleep with the wake-up generation read before this batch's
	 * end (measured: ops_cli_partition stalled with 12 of 60 sent, the
	 * last lease of a relay taken 1 ms before the other lane's batch
	 * ended). */
	bool leased = (l->leasing && l->turn_began_ms >= ms) ||
		      (l->idle && l->idle_lease_ms >= ms);
	pthread_mutex_unlock(&l->lease_lock);
	return leased;
}
