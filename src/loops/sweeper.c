/* SPDX-License-Identifier: MIT */
/*
 * The sweeper: returns rows whose lease expired (their worker died or lost
 * its session).
 * One thread with its own store session; the sweep lock in the database
 * keeps replicas from sweeping at once.
 */
#include "loops_int.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"

#define SWEEP_CAP_ROWS 10000

/* Of several sources, a quiet one is swept at least every this many
 * passes even when nothing says it needs one. */
#define SWEEP_BACKSTOP_PASSES 10

/* What the sweeper knows of a source between passes. */
struct sweep_state {
	int64_t activity; /* store_tables_activity() before its last sweep */
	bool known;	  /* swept once since the relay started */
	size_t open;	  /* struct sweep_result's open, of that sweep */
	int skipped;	  /* passes skipped since */
};

/*
 * Of several sources, whether source i can be left for this pass: nothing
 * wrote to it or its claims since its last sweep, which left nothing open
 * (no lease transaction running that could end without committing), so a
 * sweep would find nothing. A relay of many tables thus sweeps the ones
 * in use, not all of them every interval (docs/design.md §13).
 */
static bool sweep_can_skip(struct sweep_state *st, const int64_t *activity)
{
	if (!activity || !st->known || st->open > 0 ||
	    *activity != st->activity || st->skipped >= SWEEP_BACKSTOP_PASSES)
		return false;
	st->skipped++;
	return true;
}

/* Sweeps source i; -1 when shutdown began while reconnecting. */
static int sweep_source(struct relay_thread *th, struct source_stores *ss,
			size_t i, struct sweep_state *st,
			const int64_t *activity)
{
	struct relay *r = th->relay;
	struct store *s = sources_store(th, ss, i);
	if (!s)
		return 0;
	char err[512];
	struct sweep_result sw;
	int64_t t0 = clock_ms();
	int rc = store_sweep(s, SWEEP_CAP_ROWS, &sw, err, sizeof(err));
	metrics_observe(MH_SWEEP_SECONDS, (uint64_t)(clock_ms() - t0) * 1000);
	if (rc != 0) {
		st->known = false;
		return sources_failed(th, ss, i, rc, "sweep", err);
	}
	sources_ok(r, ss, i);
	/* Another replica's sweep (the lock) leaves this one unknowing. */
	st->known = !sw.skipped && activity;
	st->open = sw.open;
	st->skipped = 0;
	if (activity)
		st->activity = *activity;
	if (sw.skipped)
		return 0;
	metrics_add(MC_SWEEPS, 1);
	metrics_add(MC_SWEPT_PENDING, sw.to_pending);
	metrics_add(MC_SWEPT_FAILED, sw.to_failed);
	metrics_set(MG_LAST_SWEEP_MS, clock_wall_us() / 1000);
	if (sw.to_pending + sw.to_failed > 0) {
		source_log_counts(LOG_WARN, "swept expired leases", r, i,
				  "to_pending", sw.to_pending, "to_failed",
				  sw.to_failed);
		relay_wake_source(r, i);
	}
	return 0;
}

/* Sleeps the sweep interval, or less when a session was connected anew
 * (struct relay's sweep_asked): looked at every second, so leases that
 * ended with a session are swept within about one, and the sweeper's own
 * failed sweep is followed by another once it is connected again. Only
 * that, time or shutdown ends the sleep: relay_wake() is for workers,
 * and with LISTEN on it comes with every inserting commit, which would
 * make a sweep per commit. */
static void sweeper_idle(struct relay_thread *th)
{
	struct relay *r = th->relay;
	int64_t until = clock_ms() + r->cfg->sweep_interval_ms;
	while (!relay_stopping(r) && !atomic_exchange(&r->sweep_asked, false)) {
		int64_t left = until - clock_ms();
		if (left <= 0)
			break;
		relay_idle_since(th, NULL, left < 1000 ? left : 1000, NULL,
				 NULL);
	}
}

void *sweeper_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	struct source_stores ss = {0};
	size_t cap = r->sources.cap;
	log_set_thread(th->name);
	struct sweep_state *st = calloc(cap, sizeof(*st));
	int64_t *activity = calloc(cap, sizeof(*activity));
	bool open = st && activity && sources_open(th, th->name, &ss);
	if (!st || !activity)
		log_error("out of memory for the sweeper");
	while (open && !relay_stopping(r)) {
		/* Every source in turn, each pass; of several, one read of
		 * their activity tells which can be left. */
		size_t n = relay_sources_n(r);
		/* A pass may skip a source: its gone ones are let go here,
		 * not kept failing until it next sweeps them. */
		sources_let_go_gone(r, &ss);
		bool read = sources_gated(r) &&
			    sources_read_activity(th, &ss, n, activity);
		for (size_t i = 0; i < n && !relay_stopping(r); i++) {
			loop_tick(th);
			const int64_t *a =
			    read && source_activity_counted(activity[i])
				? &activity[i]
				: NULL;
			if (sweep_can_skip(&st[i], a))
				continue;
			if (sweep_source(th, &ss, i, &st[i], a) != 0)
				break;
		}
		sweeper_idle(th);
	}
	sources_close(r, &ss);
	free(st);
	free(activity);
	log_info("sweeper stopped");
	return NULL;
}
