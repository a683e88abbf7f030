/* SPDX-License-Identifier: MIT */
/*
 * The worker's lanes (src/loops/lanes.c, docs/design.md §7) with a fake
 * backend: batches reach the publisher in ticket (lease) order whatever
 * order the lanes arrive in, a lane passing its turn lets the next one go,
 * a publisher gone unhealthy hands later lanes' rows back unwritten, the
 * last lane out closes the publisher, a lane waiting for the publisher
 * or passing its turn keeps ticking (its lease renewal), the lease cadence
 * holds a lane until the time the last turn set and lets shutdown through,
 * the max rate outlasts wake-ups, and a batch's lag reaches any past.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "loops/loops_int.h"

/* ---- the fake backend ---- */

#define MAX_CALLS 64

/* What the fake backend saw; every field under fake.lock. */
static struct {
	pthread_mutex_t lock;
	int64_t published[MAX_CALLS]; /* seq of each batch's first event */
	int n_published;
	int opens, closes, probes, services;
	int busy;		       /* publishes under way at once, now */
	int max_busy;		       /* and at most */
	int delay_ms;		       /* each publish takes this long */
	int64_t budget_ms[MAX_CALLS];  /* each publish's deadline - its start */
	int64_t started_ms[MAX_CALLS]; /* when each publish began */
	int64_t fail_seq;	       /* the batch with this first seq fails */
	bool tick_first;	       /* each publish ticks once first, */
	int64_t ticked_budget_ms[MAX_CALLS]; /* and its deadline after */
} fake = {.lock = PTHREAD_MUTEX_INITIALIZER};

static int fake_open(const struct config *cfg, void **state, char *err,
		     size_t errlen)
{
	(void)cfg;
	(void)err;
	(void)errlen;
	pthread_mutex_lock(&fake.lock);
	fake.opens++;
	pthread_mutex_unlock(&fake.lock);
	*state = &fake;
	return 0;
}

static int fake_publish(void *state, const struct outbox_event *events,
			size_t n, struct publish_ctx *ctx,
			struct pub_result *results)
{
	(void)state;
	pthread_mutex_lock(&fake.lock);
	int delay = fake.delay_ms;
	bool fail = events[0].seq == fake.fail_seq;
	if (++fake.busy > fake.max_busy)
		fake.max_busy = fake.busy;
	if (fake.n_published < MAX_CALLS) {
		fake.started_ms[fake.n_published] = clock_ms();
		fake.budget_ms[fake.n_published] =
		    ctx->deadline_ms - clock_ms();
		fake.published[fake.n_published++] = events[0].seq;
	}
	bool tick_first = fake.tick_first;
	int k = fake.n_published - 1;
	pthread_mutex_unlock(&fake.lock);
	if (tick_first && k < MAX_CALLS) {
		ctx->tick(ctx);
		pthread_mutex_lock(&fake.lock);
		fake.ticked_budget_ms[k] = ctx->deadline_ms - clock_ms();
		pthread_mutex_unlock(&fake.lock);
	}
	if (delay > 0)
		clock_sleep_ms(delay);
	for (size_t i = 0; i < n; i++)
		results[i].outcome = fail ? PUB_TRANSPORT : PUB_ACKED;
	pthread_mutex_lock(&fake.lock);
	fake.busy--;
	pthread_mutex_unlock(&fake.lock);
	return fail ? -1 : 0;
}

static int fake_probe(void *state, char *err, size_t errlen)
{
	(void)state;
	(void)err;
	(void)errlen;
	pthread_mutex_lock(&fake.lock);
	fake.probes++;
	pthread_mutex_unlock(&fake.lock);
	return 0;
}

static void fake_service(void *state)
{
	(void)state;
	pthread_mutex_lock(&fake.lock);
	fake.services++;
	pthread_mutex_unlock(&fake.lock);
}

static void fake_close(void *state)
{
	(void)state;
	pthread_mutex_lock(&fake.lock);
	fake.closes++;
	pthread_mutex_unlock(&fake.lock);
}

static const char *fake_destination(const struct config *cfg)
{
	(void)cfg;
	return "";
}

static const struct publisher_ops fake_ops = {
    .name = "fake",
    .default_destination = fake_destination,
    .open = fake_open,
    .publish = fake_publish,
    .probe = fake_probe,
    .service = fake_service,
    .close = fake_close,
};

/* ---- a relay with one worker of `lanes` lanes ---- */

struct fixture {
	struct config cfg;
	struct relay *r;
	struct lanes *lanes;
	int per_worker;
};

static struct fixture *fixture_new(int per_worker)
{
	struct fixture *f = calloc(1, sizeof(*f));
	char err[256];
	assert_non_null(f);
	f->cfg.workers = 1;
	f->cfg.worker_window = per_worker;
	f->per_worker = per_worker;
	pthread_mutex_lock(&fake.lock);
	memset(fake.published, 0, sizeof(fake.published));
	memset(fake.budget_ms, 0, sizeof(fake.budget_ms));
	fake.n_published = fake.opens = fake.closes = fake.probes = 0;
	fake.services = 0;
	fake.busy = fake.max_busy = fake.delay_ms = 0;
	fake.fail_seq = -1;
	fake.tick_first = false;
	pthread_mutex_unlock(&fake.lock);
	assert_int_equal(
	    relay_create(&f->r, &f->cfg, &fake_ops, err, sizeof(err)), 0);
	f->lanes = lanes_create(f->r, 1, per_worker, err, sizeof(err));
	assert_non_null(f->lanes);
	int64_t next_probe;
	assert_true(lanes_publisher_ready(f->lanes, &f->cfg, &next_probe));
	return f;
}

static void fixture_free(struct fixture *f)
{
	for (int i = 0; i < f->per_worker; i++)
		lanes_leave(f->lanes);
	lanes_destroy(f->lanes, 1);
	relay_destroy(f->r);
	free(f);
}

/* Issues the next publish ticket, as a lane's lease turn does. */
static uint64_t lease_turn(struct fixture *f)
{
	struct relay_thread th = {.relay = f->r};
	assert_true(lanes_take_turn(f->lanes, &th));
	return lanes_end_turn(f->lanes, TURN_LEASED, clock_ms(), 0);
}

/* ---- one lane as a thread ---- */

struct lane {
	struct fixture *f;
	uint64_t ticket;
	bool pass;	    /* give the turn up instead of publishing */
	bool pass_ticking;  /* and tick meanwhile, as a worker does */
	int start_after_ms; /* sleep before asking for the turn */
	int timeout_ms;	    /* the publish timeout; 0: 10 s */
	int deadline_ms;    /* the lease's deadline from the start; 0: 10 s */
	bool renews;	  /* each tick moves it deadline_ms on, as a renewal */
	int rc;		  /* what lanes_publish() returned */
	atomic_int ticks; /* ctx->tick calls */
	/* On the lane's own thread: its last tick (or the start of its wait)
	 * and the longest time between two. */
	int64_t last_tick_ms, max_gap_ms;
	int64_t passed_ms; /* when lanes_pass() returned */
	struct outbox_event event;
	struct pub_result result;
	pthread_t tid;
};

static bool lane_tick(struct publish_ctx *ctx)
{
	struct lane *l = ctx->opaque;
	atomic_fetch_add(&l->ticks, 1);
	int64_t now = clock_ms();
	if (l->renews)
		ctx->deadline_ms = now + l->deadline_ms;
	if (now - l->last_tick_ms > l->max_gap_ms)
		l->max_gap_ms = now - l->last_tick_ms;
	l->last_tick_ms = now;
	return false;
}

static bool lane_may_send(struct publish_ctx *ctx, size_t i)
{
	(void)ctx;
	(void)i;
	return true;
}

static void *lane_main(void *arg)
{
	struct lane *l = arg;
	if (l->start_after_ms > 0)
		clock_sleep_ms(l->start_after_ms);
	struct publish_ctx ctx = {.deadline_ms =
				      clock_ms() +
				      (l->deadline_ms ? l->deadline_ms : 10000),
				  .may_send = lane_may_send,
				  .tick = lane_tick,
				  .opaque = l};
	l->last_tick_ms = clock_ms();
	if (l->pass) {
		lanes_pass(l->f->lanes, l->ticket,
			   l->pass_ticking ? &ctx : NULL);
		l->passed_ms = clock_ms();
		return NULL;
	}
	/* The batch's first seq names its ticket in the fake's record. */
	l->event.seq = (int64_t)l->ticket;
	l->rc = lanes_publish(l->f->lanes, l->ticket, &l->event, 1,
			      l->timeout_ms ? l->timeout_ms : 10000, &ctx,
			      &l->result);
	return NULL;
}

static void lanes_run(struct lane *lanes, size_t n)
{
	for (size_t i = 0; i < n; i++)
		assert_int_equal(
		    pthread_create(&lanes[i].tid, NULL, lane_main, &lanes[i]),
		    0);
	for (size_t i = 0; i < n; i++)
		pthread_join(lanes[i].tid, NULL);
}

/* n lanes, each with the next publish ticket, in lease order. */
static void lease_lanes(struct fixture *f, struct lane *l, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		l[i].f = f;
		l[i].ticket = lease_turn(f);
	}
}

/* What the fake saw, copied out of its lock: a failed assertion must not
 * leave the lock held for the next test. */
static struct fake_record {
	int64_t published[MAX_CALLS];
	int64_t budget_ms[MAX_CALLS];
	int64_t started_ms[MAX_CALLS];
	int n_published, opens, closes, probes, max_busy;
} fake_seen(void)
{
	struct fake_record r;
	pthread_mutex_lock(&fake.lock);
	memcpy(r.published, fake.published, sizeof(r.published));
	memcpy(r.budget_ms, fake.budget_ms, sizeof(r.budget_ms));
	memcpy(r.started_ms, fake.started_ms, sizeof(r.started_ms));
	r.n_published = fake.n_published;
	r.opens = fake.opens;
	r.closes = fake.closes;
	r.probes = fake.probes;
	r.max_busy = fake.max_busy;
	pthread_mutex_unlock(&fake.lock);
	return r;
}

/* ---- the tests ---- */

/* Lanes arriving in the reverse of their lease order publish in lease
 * order, one at a time. */
static void test_tickets_publish_in_lease_order(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(3);
	struct lane l[3] = {0};
	lease_lanes(f, l, 3);
	/* The newest batch asks first, the oldest last. */
	for (int i = 0; i < 3; i++)
		l[i].start_after_ms = (2 - i) * 60;
	assert_int_equal(l[0].ticket + 2, l[2].ticket);
	lanes_run(l, 3);
	struct fake_record seen = fake_seen();
	assert_int_equal(seen.n_published, 3);
	for (int i = 0; i < 3; i++)
		assert_int_equal(seen.published[i], (int64_t)l[i].ticket);
	assert_int_equal(seen.max_busy, 1);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(l[i].rc, 0);
		assert_int_equal(l[i].result.outcome, PUB_ACKED);
	}
	fixture_free(f);
}

/* A publish's timeout counts from its turn, not from its lease: the lane
 * behind a publish that took 400 ms of a 1 s timeout still has its whole
 * second for its own confirms (a deadline from the lease would leave it
 * 600 ms and report them in doubt); the lease's deadline still caps it. */
static void test_publish_timeout_counts_from_its_turn(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(3);
	struct lane l[3] = {0};
	lease_lanes(f, l, 3);
	pthread_mutex_lock(&fake.lock);
	fake.delay_ms = 400;
	pthread_mutex_unlock(&fake.lock);
	for (int i = 0; i < 3; i++)
		l[i].timeout_ms = 1000;
	/* The last lane's lease ends 1 s after it starts: before its turn
	 * (800 ms on) plus its timeout. */
	l[2].deadline_ms = 1000;
	l[1].start_after_ms = 20;
	l[2].start_after_ms = 40;
	lanes_run(l, 3);
	struct fake_record seen = fake_seen();
	assert_int_equal(seen.n_published, 3);
	/* A deadline from the lease would leave the second about 620 ms;
	 * 700 leaves a loaded machine's scheduler 300 ms before the fake
	 * publish reads its clock. */
	for (int i = 0; i < 2; i++)
		if (seen.budget_ms[i] < 700 || seen.budget_ms[i] > 1000)
			fail_msg("publish %d had %lld ms of its 1000", i,
				 (long long)seen.budget_ms[i]);
	if (seen.budget_ms[2] > 300)
		fail_msg("the lease's deadline gave the last publish %lld ms "
			 "of the 200 or so left",
			 (long long)seen.budget_ms[2]);
	fixture_free(f);
}

/* The lanes read the lane's deadline when its turn comes, as the ticks of
 * its wait (renewals) left it: a lane whose lease ends 500 ms after each
 * renewal, waiting 900 ms behind another publish, has about 500 ms at its
 * turn, not a deadline read before the wait and past 400 ms ago. (That
 * the worker's tick moves the deadline is lanes_deadline.sh's.) */
static void test_publish_deadline_follows_renewals(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(2);
	struct lane l[2] = {0};
	lease_lanes(f, l, 2);
	pthread_mutex_lock(&fake.lock);
	fake.delay_ms = 900;
	pthread_mutex_unlock(&fake.lock);
	l[1].deadline_ms = 500;
	l[1].renews = true;
	l[1].start_after_ms = 20;
	lanes_run(l, 2);
	struct fake_record seen = fake_seen();
	assert_int_equal(seen.n_published, 2);
	/* At most a wait slice (200 ms) since the last renewal, and a
	 * loaded machine's scheduling. */
	if (seen.budget_ms[1] < 100)
		fail_msg("the publish had %lld ms of its lease",
			 (long long)seen.budget_ms[1]);
	fixture_free(f);
}

/* A renewal during the publish moves the lease's deadline, never past the
 * publish's own: a lease 10 s long, renewed at the publish's first tick,
 * leaves the publish its 1 s timeout. */
static void test_publish_renewal_keeps_its_timeout(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(1);
	struct lane l[1] = {0};
	lease_lanes(f, l, 1);
	pthread_mutex_lock(&fake.lock);
	fake.tick_first = true;
	pthread_mutex_unlock(&fake.lock);
	l[0].deadline_ms = 10000;
	l[0].renews = true;
	l[0].timeout_ms = 1000;
	lanes_run(l, 1);
	pthread_mutex_lock(&fake.lock);
	int64_t budget = fake.ticked_budget_ms[0];
	pthread_mutex_unlock(&fake.lock);
	if (budget > 1000 || budget < 500)
		fail_msg("after a renewal the publish had %lld ms, want its "
			 "1000",
			 (long long)budget);
	fixture_free(f);
}

/* A batch with nothing to publish passes its turn in order: the lane after
 * it waits for it, then goes. */
static void test_a_lane_passes_its_turn(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(3);
	struct lane l[3] = {0};
	lease_lanes(f, l, 3);
	/* Ticket 2 passes before ticket 1 published; ticket 3 asks first
	 * and must wait for both. */
	l[1].pass = true;
	l[0].start_after_ms = 120;
	l[1].start_after_ms = 40;
	lanes_run(l, 3);
	struct fake_record seen = fake_seen();
	assert_int_equal(seen.n_published, 2);
	assert_int_equal(seen.published[0], (int64_t)l[0].ticket);
	assert_int_equal(seen.published[1], (int64_t)l[2].ticket);
	fixture_free(f);
}

/* A publish that leaves the publisher unhealthy hands the later lanes'
 * rows back unwritten, and the worker no longer counts as ready. */
static void test_unhealthy_publisher_releases_later_lanes(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(3);
	assert_true(relay_publisher_ready(f->r));
	struct lane l[3] = {0};
	lease_lanes(f, l, 3);
	fake.fail_seq = (int64_t)l[0].ticket;
	l[1].start_after_ms = 30;
	l[2].start_after_ms = 60;
	lanes_run(l, 3);
	assert_int_equal(fake_seen().n_published, 1);
	assert_int_equal(l[0].rc, -1);
	for (int i = 1; i < 3; i++) {
		assert_int_equal(l[i].rc, -1);
		assert_int_equal(l[i].result.outcome, PUB_NOT_WRITTEN);
		assert_non_null(strstr(l[i].result.reason, "unhealthy"));
	}
	assert_false(relay_publisher_ready(f->r));
	fixture_free(f);
}

/* Once shutdown began, a publisher gone unhealthy is not probed again:
 * a lane closing with acknowledged rows to mark would wait for it. Before,
 * it is, when its probe is due. */
static void test_no_probe_after_shutdown_began(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(2);
	struct lane l[1] = {0};
	lease_lanes(f, l, 1);
	fake.fail_seq = (int64_t)l[0].ticket;
	lanes_run(l, 1);
	assert_false(relay_publisher_ready(f->r));
	/* Due at once after a failed publish. */
	int64_t next_probe = 0;
	assert_true(lanes_publisher_ready(f->lanes, &f->cfg, &next_probe));
	assert_int_equal(fake_seen().probes, 1);
	lease_lanes(f, l, 1);
	fake.fail_seq = (int64_t)l[0].ticket;
	lanes_run(l, 1);
	relay_stop(f->r);
	assert_false(lanes_publisher_ready(f->lanes, &f->cfg, &next_probe));
	assert_int_equal(fake_seen().probes, 1);
	fixture_free(f);
}

/* OUTBOX_MAX_RATE near 0: the second batch's wait is at most a day (then
 * asked again), not a conversion out of int64's range that read as no
 * wait at all. */
static void test_rate_near_zero_waits(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(1);
	f->cfg.max_rate = 1e-15;
	assert_int_equal(rate_reserve(f->r, 100), 0);
	int64_t wait = rate_reserve(f->r, 100);
	if (wait <= 0 || wait > 24 * 3600 * 1000LL)
		fail_msg("waits %lld ms", (long long)wait);
	fixture_free(f);
}

/* A batch's lag with a created_at of '-infinity' (a table made by hand has
 * no CHECK against it): the longest, where the signed difference overflowed
 * (undefined) and read as no lag. */
static void test_lag_of_the_infinite_past(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(1);
	struct outbox_event e[2] = {
	    {.created_at_us = clock_wall_us() - 5000000},
	    {.created_at_us = INT64_MIN + INT64_C(946684800000000)},
	};
	struct lease_batch b = {.events = e, .n = 1};
	struct relay_source_stats st;
	source_note_lag(f->r, 0, &b);
	relay_source_stats(f->r, 0, &st);
	assert_true(st.lag_ms >= 5000 && st.lag_ms < 60000);
	b.n = 2;
	source_note_lag(f->r, 0, &b);
	relay_source_stats(f->r, 0, &st);
	/* Over 200,000 years. */
	if (st.lag_ms < INT64_C(6000000000000000))
		fail_msg("lag %lld ms", (long long)st.lag_ms);
	/* A table gone keeps no lag for when it is found again. */
	relay_source_set_gone(f->r, 0, true);
	relay_source_set_gone(f->r, 0, false);
	relay_source_stats(f->r, 0, &st);
	assert_int_equal(st.lag_ms, 0);
	fixture_free(f);
}

struct turn_asker {
	struct fixture *f;
	bool took;
	int64_t returned_ms;
};

static void *ask_turn(void *arg)
{
	struct turn_asker *a = arg;
	struct relay_thread th = {.relay = a->f->r};
	a->took = lanes_take_turn(a->f->lanes, &th);
	a->returned_ms = clock_ms();
	return NULL;
}

/* A lane waiting out a skipped turn (a pause: up to the poll interval, 10 s
 * here) sees shutdown at once; it slept the wait out, and the process was
 * killed at its shutdown timeout with nothing in flight. */
static void test_skipped_turn_sees_shutdown(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(1);
	struct relay_thread th = {.relay = f->r};
	assert_true(lanes_take_turn(f->lanes, &th));
	lanes_end_turn(f->lanes, TURN_SKIPPED, clock_ms() + 10000, 0);
	struct turn_asker a = {.f = f};
	pthread_t tid;
	assert_int_equal(pthread_create(&tid, NULL, ask_turn, &a), 0);
	clock_sleep_ms(100);
	int64_t stopped = clock_ms();
	relay_stop(f->r);
	pthread_join(tid, NULL);
	assert_false(a.took);
	if (a.returned_ms - stopped > 5000)
		fail_msg("the lane saw shutdown after %lld ms",
			 (long long)(a.returned_ms - stopped));
	fixture_free(f);
}

static atomic_bool waking;

/* Wakes the relay every 5 ms, as LISTEN does under a steady stream. */
static void *wake_often(void *arg)
{
	struct relay *r = arg;
	while (atomic_load(&waking)) {
		relay_wake(r);
		clock_sleep_ms(5);
	}
	return NULL;
}

/* OUTBOX_MAX_RATE holds under wake-ups: 10 events/s, batches of 5, so the
 * second batch waits 500 ms however often the relay is woken (a wake-up
 * ended the wait, and the rate went as fast as notifications came). */
static void test_rate_wait_outlasts_wakeups(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(1);
	f->cfg.max_rate = 10;
	struct relay_thread th = {.relay = f->r};
	int64_t t0 = clock_ms();
	rate_wait(&th, 5, NULL, NULL);
	atomic_store(&waking, true);
	pthread_t waker;
	assert_int_equal(pthread_create(&waker, NULL, wake_often, f->r), 0);
	rate_wait(&th, 5, NULL, NULL);
	int64_t waited = clock_ms() - t0;
	atomic_store(&waking, false);
	pthread_join(waker, NULL);
	if (waited < 450)
		fail_msg("the second batch went after %lld ms, want 500",
			 (long long)waited);
	fixture_free(f);
}

/* The publisher lives until the last lane leaves. */
static void test_last_lane_closes_the_publisher(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(3);
	assert_int_equal(fake_seen().opens, 1);
	lanes_leave(f->lanes);
	lanes_leave(f->lanes);
	assert_int_equal(fake_seen().closes, 0);
	lanes_leave(f->lanes);
	assert_int_equal(fake_seen().closes, 1);
	assert_false(relay_publisher_ready(f->r));
	lanes_destroy(f->lanes, 1);
	relay_destroy(f->r);
	free(f);
	assert_int_equal(fake_seen().closes, 1);
}

/* Fails unless lane l ticked, and never went 600 ms without a tick while
 * it waited: between two, or from the last to the end of its wait
 * (ended_ms). what and before name the case. */
static void assert_kept_ticking(const struct lane *l, int64_t ended_ms,
				const char *what, bool before)
{
	int64_t gap = ended_ms - l->last_tick_ms;
	if (l->max_gap_ms > gap)
		gap = l->max_gap_ms;
	if (gap >= 600 || atomic_load(&l->ticks) < 1)
		fail_msg("%s, waiting %s the publish: %d ticks, %lld ms "
			 "without one",
			 what, before ? "before" : "after",
			 atomic_load(&l->ticks), (long long)gap);
}

/* A lane waiting while another publishes (900 ms) keeps calling
 * ctx->tick, which renews its lease, every WAIT_SLICE_MS (200 ms), whether
 * it came to wait before the publish began or after: 600 ms between two
 * leaves a slow machine room, where a lane that waited on the publishing
 * lane's lock went 900 ms without one. Its batch goes next. */
static void test_waiting_lane_keeps_ticking(void **state)
{
	(void)state;
	for (int before = 0; before < 2; before++) {
		struct fixture *f = fixture_new(2);
		struct lane l[2] = {0};
		lease_lanes(f, l, 2);
		fake.delay_ms = 900;
		if (before)
			l[0].start_after_ms = 100;
		else
			l[1].start_after_ms = 50;
		lanes_run(l, 2);
		struct fake_record seen = fake_seen();
		assert_int_equal(seen.published[1], (int64_t)l[1].ticket);
		assert_kept_ticking(&l[1], seen.started_ms[1], "publishing",
				    before);
		fixture_free(f);
	}
}

/* A lane with nothing to publish (every row of its batch failed
 * validation) still holds its lease while it waits for its turn to pass:
 * it keeps ticking, so its lease is renewed, whether it came before the
 * publish ahead of it began or after, and the lanes after it go once it
 * passed. */
static void test_passing_lane_keeps_ticking(void **state)
{
	(void)state;
	for (int before = 0; before < 2; before++) {
		struct fixture *f = fixture_new(3);
		struct lane l[3] = {0};
		lease_lanes(f, l, 3);
		fake.delay_ms = 900;
		l[1].pass = l[1].pass_ticking = true;
		if (before)
			l[0].start_after_ms = 100;
		else
			l[1].start_after_ms = 50;
		l[2].start_after_ms = 150;
		lanes_run(l, 3);
		struct fake_record seen = fake_seen();
		assert_int_equal(seen.n_published, 2);
		assert_int_equal(seen.published[1], (int64_t)l[2].ticket);
		assert_kept_ticking(&l[1], l[1].passed_ms, "passing", before);
		fixture_free(f);
	}
}

/* A lease turn sets when the next may start: a lane asking earlier
 * waits. */
static void test_cadence_holds_the_next_lease(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(2);
	struct relay_thread th = {.relay = f->r};
	assert_true(lanes_take_turn(f->lanes, &th));
	int64_t t0 = clock_ms();
	assert_int_equal(lanes_end_turn(f->lanes, TURN_SKIPPED, t0 + 150, 0),
			 0);
	assert_true(lanes_take_turn(f->lanes, &th));
	assert_true(clock_ms() - t0 >= 140);
	/* A full batch lets the next lease start at once, with a ticket. */
	uint64_t ticket = lanes_end_turn(f->lanes, TURN_LEASED, clock_ms(), 0);
	assert_int_equal(ticket, 1);
	assert_true(lanes_take_turn(f->lanes, &th));
	lanes_end_turn(f->lanes, TURN_SKIPPED, clock_ms(), 0);
	lanes_pass(f->lanes, ticket, NULL);
	fixture_free(f);
}

/* Ordered mode's wake-up at a batch's end (worker.c): a lease of another
 * lane that began since the batch's own, under way or found empty, may
 * have found the batch's keys held. */
static void test_batch_end_sees_leases_begun_since(void **state)
{
	(void)state;
	struct fixture *f = fixture_new(2);
	struct relay_thread th = {.relay = f->r};
	int64_t started = clock_ms();
	assert_true(lanes_take_turn(f->lanes, &th));
	uint64_t ticket = lanes_end_turn(f->lanes, TURN_LEASED, clock_ms(), 0);
	assert_false(lanes_leased_since(f->lanes, started));
	/* The other lane's lease under way: the race that stalled. */
	assert_true(lanes_take_turn(f->lanes, &th));
	assert_true(lanes_leased_since(f->lanes, started));
	assert_false(lanes_leased_since(f->lanes, clock_ms() + 1000));
	lanes_end_turn(f->lanes, TURN_EMPTY, clock_ms(), 0);
	assert_true(lanes_leased_since(f->lanes, started));
	assert_false(lanes_leased_since(f->lanes, clock_ms() + 1000));
	/* A lease that found rows leaves nothing asleep. */
	assert_true(lanes_take_turn(f->lanes, &th));
	uint64_t next = lanes_end_turn(f->lanes, TURN_LEASED, clock_ms(), 0);
	assert_false(lanes_leased_since(f->lanes, started));
	lanes_pass(f->lanes, ticket, NULL);
	lanes_pass(f->lanes, next, NULL);
	fixture_free(f);
}

static int fake_busy(void)
{
	pthread_mutex_lock(&fake.lock);
	int busy = fake.busy;
	pthread_mutex_unlock(&fake.lock);
	return busy;
}

/* A lane asking whether the publisher is ready while another lane
 * publishes (with a healthy publisher) is answered at once, so its lease
 * runs beside that publish; it waited for the publish to end before. */
static void test_ready_beside_a_publish(void **unused)
{
	(void)unused;
	struct fixture *f = fixture_new(2);
	pthread_mutex_lock(&fake.lock);
	fake.delay_ms = 1500;
	pthread_mutex_unlock(&fake.lock);
	struct lane a = {0};
	lease_lanes(f, &a, 1);
	assert_int_equal(pthread_create(&a.tid, NULL, lane_main, &a), 0);
	for (int i = 0; i < 500 && fake_busy() == 0; i++)
		clock_sleep_ms(2);
	assert_int_equal(fake_busy(), 1);
	int64_t next_probe;
	assert_true(lanes_publisher_ready(f->lanes, &f->cfg, &next_probe));
	/* Still publishing: the answer did not wait for it. */
	assert_int_equal(fake_busy(), 1);
	pthread_join(a.tid, NULL);
	assert_int_equal(a.rc, 0);
	fixture_free(f);
}

struct turn_taker {
	struct fixture *f;
	bool got;
	pthread_t tid;
};

static void *take_turn_main(void *arg)
{
	struct turn_taker *t = arg;
	struct relay_thread th = {.relay = t->f->r};
	t->got = lanes_take_turn(t->f->lanes, &th);
	if (t->got)
		lanes_end_turn(t->f->lanes, TURN_EMPTY, clock_ms(), 0);
	return NULL;
}

/* A lane waiting for the lease turn while another lane's lease runs long
 * (a lock wait in Postgres, say) services the publisher once a second,
 * so a broker's heartbeats go on: it did not while it waited. */
static void test_turn_wait_services_publisher(void **unused)
{
	(void)unused;
	struct fixture *f = fixture_new(2);
	struct relay_thread th = {.relay = f->r};
	assert_true(lanes_take_turn(f->lanes, &th));
	pthread_mutex_lock(&fake.lock);
	int before = fake.services;
	pthread_mutex_unlock(&fake.lock);
	struct turn_taker b = {.f = f};
	assert_int_equal(pthread_create(&b.tid, NULL, take_turn_main, &b), 0);
	clock_sleep_ms(2600);
	lanes_end_turn(f->lanes, TURN_EMPTY, clock_ms(), 0);
	pthread_join(b.tid, NULL);
	assert_true(b.got);
	pthread_mutex_lock(&fake.lock);
	int services = fake.services - before;
	pthread_mutex_unlock(&fake.lock);
	if (services < 2)
		fail_msg("the waiting lane serviced the publisher %d times in "
			 "2.6 s",
			 services);
	fixture_free(f);
}

/* A full table of destination pauses still pauses a new destination (the
 * slot whose pause ends first goes), and a key as long as an AMQP
 * exchange and routing key can be comes back whole: a key left out or
 * cut short matches no row, and the refused rows would be leased again
 * at once, again and again. */
static void test_pauses_full_and_long_keys(void **unused)
{
	(void)unused;
	struct fixture *f = fixture_new(1);
	char key[255 + 1 + 255 + 1];
	for (int i = 0; i < RELAY_MAX_PAUSES; i++) {
		snprintf(key, sizeof(key), "exchange-%d", i);
		pause_destination(f->r, key, "refused");
	}
	memset(key, 'e', 255);
	key[255] = '\x1f';
	memset(key + 256, 'r', 255);
	key[511] = '\0';
	pause_destination(f->r, key, "refused");
	static char keys[RELAY_MAX_PAUSES][PAUSE_KEY_MAX];
	size_t n = active_pauses(f->r, keys, RELAY_MAX_PAUSES);
	assert_int_equal(n, RELAY_MAX_PAUSES);
	size_t found = 0;
	for (size_t i = 0; i < n; i++)
		found += strcmp(keys[i], key) == 0;
	assert_int_equal(found, 1);
	fixture_free(f);
}

int main(void)
{
	log_setup(LOG_ERROR, false);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tickets_publish_in_lease_order),
	    cmocka_unit_test(test_publish_timeout_counts_from_its_turn),
	    cmocka_unit_test(test_a_lane_passes_its_turn),
	    cmocka_unit_test(test_unhealthy_publisher_releases_later_lanes),
	    cmocka_unit_test(test_no_probe_after_shutdown_began),
	    cmocka_unit_test(test_rate_near_zero_waits),
	    cmocka_unit_test(test_rate_wait_outlasts_wakeups),
	    cmocka_unit_test(test_publish_deadline_follows_renewals),
	    cmocka_unit_test(test_publish_renewal_keeps_its_timeout),
	    cmocka_unit_test(test_lag_of_the_infinite_past),
	    cmocka_unit_test(test_skipped_turn_sees_shutdown),
	    cmocka_unit_test(test_last_lane_closes_the_publisher),
	    cmocka_unit_test(test_waiting_lane_keeps_ticking),
	    cmocka_unit_test(test_passing_lane_keeps_ticking),
	    cmocka_unit_test(test_cadence_holds_the_next_lease),
	    cmocka_unit_test(test_batch_end_sees_leases_begun_since),
	    cmocka_unit_test(test_pauses_full_and_long_keys),
	    cmocka_unit_test(test_ready_beside_a_publish),
	    cmocka_unit_test(test_turn_wait_services_publisher),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
