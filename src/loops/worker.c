/* SPDX-License-Identifier: MIT */
/*
 * One lane of a relay worker: leases a batch, publishes it, marks every row
 * by its outcome, and leases again when the worker's cadence says. Each
 * lane has its own store session (its lease is an open transaction); the
 * lanes of one worker share its publisher and lease cadence (lanes.c);
 * what the workers share goes through struct relay (pauses.c, rate.c, the
 * wake-up generation).
 */
#include "loops_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "encode/encode.h"

/* How stale the operator pauses a worker obeys may be, at most (the poll
 * interval when shorter). */
#define CONTROL_REFRESH_MS 1000

#define REASON_MAX 256

/* Of many sources, an idle one is leased at least this often, for
 * what the activity read cannot see (a table without a claims table whose
 * rows another replica's lease let go). Statistics reset or lost in a
 * crash restart move the counts, so they are seen. */
#define SOURCE_IDLE_BACKSTOP_MS 300000

/* enum mark_kind runs from MARK_SENT to MARK_RELEASE. */
#define N_MARKS (MARK_RELEASE + 1)

/* The rows one store mark applies to; reasons[i] goes with ids[i]. */
struct mark_list {
	const char **ids;
	const char **reasons;
	size_t n;
};

/*
 * One leased batch on its way through a worker.
 *
 * Ownership: batch_init() takes over the lease; from then on the batch owns
 * it and every array below until batch_release(), which frees whatever
 * batch_init() got to. Only the worker that leased it uses it.
 */
struct batch {
	struct lease_batch lease;    /* every event and id points into it */
	char (*invalid)[REASON_MAX]; /* per row: why it cannot be encoded */
	struct outbox_event *valid;  /* the rows handed to the publisher */
	size_t *valid_row; /* valid[j] is lease.events[valid_row[j]] */
	size_t n_valid;
	struct pub_result *results; /* per valid row */
	bool *asked; /* per valid row: may_send said yes (handed over) */
	struct mark_list marks[N_MARKS]; /* indexed by enum mark_kind */
	/* Rows per publish outcome, counted once the marks committed: a
	 * lease that does not commit concluded none of them. */
	size_t outcomes[PUB_PERMANENT + 1];
	int64_t local_deadline_ms; /* no row handed to the broker after */
	int64_t last_renew_ms;	   /* the last renewal tried, done or not */
	bool lease_lost;	   /* a renewal failed: no more hand-over */
	uint64_t ticket;	   /* its turn at the publisher (lanes.c) */
};

/* One lane thread's state; only that thread touches it. */
struct worker {
	struct relay_thread *th;
	struct relay *r;
	const struct config *cfg;
	struct source_stores src;   /* a store per source, one session */
	size_t source;		    /* the source of the lease in hand */
	struct store *store;	    /* its store */
	struct lanes *lanes;	    /* the publisher and lease cadence */
	struct source_turns *turns; /* the worker's, under its lease turn */
	/* Where a NULL exchange goes: the backend's default, asked once. */
	const char *default_destination;
	struct batch batch; /* the batch in progress */
	int lease_slot;	    /* metrics_lease_slot() */
};

/* The keys the lease skips: operator pauses, then destination pauses.
 * Owned by the worker; pause_keys_release() frees both arrays. */
struct pause_keys {
	char (*keys)[PAUSE_KEY_MAX];
	const char **ptrs; /* ptrs[i] is keys[i], as store_lease takes them */
	size_t n;
};

/* ---- the batch ---- */

static void batch_release(struct batch *b)
{
	free(b->invalid);
	free(b->valid);
	free(b->valid_row);
	free(b->results);
	free(b->asked);
	for (int k = 0; k < N_MARKS; k++) {
		free(b->marks[k].ids);
		free(b->marks[k].reasons);
	}
	lease_batch_release(&b->lease);
	*b = (struct batch){0};
}

/* Takes over *lease (leaving it empty) and allocates the per-row arrays
 * for its rows. Returns 0, or -1 with err; b owns the lease either way. */
static int batch_init(struct batch *b, struct lease_batch *lease, char *err,
		      size_t errlen)
{
	size_t n = lease->n;
	*b = (struct batch){.lease = *lease};
	*lease = (struct lease_batch){0};
	b->invalid = calloc(n, sizeof(*b->invalid));
	b->valid = calloc(n, sizeof(*b->valid));
	b->valid_row = calloc(n, sizeof(*b->valid_row));
	b->results = calloc(n, sizeof(*b->results));
	b->asked = calloc(n, sizeof(*b->asked));
	bool ok =
	    b->invalid && b->valid && b->valid_row && b->results && b->asked;
	for (int k = 0; k < N_MARKS; k++) {
		b->marks[k].ids = calloc(n, sizeof(*b->marks[k].ids));
		b->marks[k].reasons = calloc(n, sizeof(*b->marks[k].reasons));
		ok = ok && b->marks[k].ids && b->marks[k].reasons;
	}
	if (!ok) {
		snprintf(err, errlen, "out of memory for a batch of %zu rows",
			 n);
		return -1;
	}
	return 0;
}

static void batch_add_mark(struct batch *b, enum mark_kind mark, const char *id,
			   const char *reason)
{
	struct mark_list *l = &b->marks[mark];
	l->ids[l->n] = id;
	l->reasons[l->n++] = reason;
}

/* ---- what each publish outcome does (docs/design.md §3) ---- */

struct outcome_rule {
	enum mark_kind mark;
	enum metric_counter counter;
	bool in_doubt;		 /* also counted in MC_IN_DOUBT */
	bool pauses_destination; /* the event's destination is paused */
	bool observes_latency;	 /* end-to-end latency is recorded */
	bool logged_as_failed;
};

static const struct outcome_rule outcome_rules[] = {
    [PUB_ACKED] = {.mark = MARK_SENT,
		   .counter = MC_SENT,
		   .observes_latency = true},
    [PUB_NOT_WRITTEN] = {.mark = MARK_RELEASE, .counter = MC_RELEASED},
    [PUB_TRANSPORT] = {.mark = MARK_TRANSPORT,
		       .counter = MC_TRANSPORT,
		       .in_doubt = true},
    [PUB_DESTINATION] = {.mark = MARK_RELEASE,
			 .counter = MC_DESTINATION,
			 .pauses_destination = true},
    [PUB_EVENT] = {.mark = MARK_RETRY, .counter = MC_EVENT},
    [PUB_PERMANENT] = {.mark = MARK_FAILED,
		       .counter = MC_PERMANENT,
		       .logged_as_failed = true},
};

#define N_OUTCOMES (sizeof(outcome_rules) / sizeof(outcome_rules[0]))
_Static_assert(N_OUTCOMES == PUB_PERMANENT + 1, "one rule per publish outcome");

/* The order the marks run in. Release is first: the rows never handed
 * over leave the claim while the lease still holds them, so a mark that
 * fails later (and with it the lease) does not get them charged by a sweep
 * (docs/design.md §4). At shutdown the publisher is closed before it (see
 * run_marks), and so before the COMMIT that lets those rows go. Sent and
 * release carry no reason: neither records an error on the row. */
static const struct {
	enum mark_kind mark;
	const char *name;
	bool with_reasons;
} mark_order[] = {
    {MARK_RELEASE, "release", false}, {MARK_SENT, "sent", false},
    {MARK_RETRY, "retry", true},      {MARK_TRANSPORT, "transport", true},
    {MARK_FAILED, "failed", true},
};

_Static_assert(sizeof(mark_order) / sizeof(mark_order[0]) == N_MARKS,
	       "every store mark runs once per batch");

/* ---- while publishing: lease renewal and the publisher's callbacks ---- */

/* The lease transaction is gone while the batch is with the broker: no
 * further row may be handed over, since nothing holds them any more. The
 * rows not handed over leave the claim at once, before a sweep settles it
 * and charges them (docs/design.md §4); the marks will fail, and the
 * sweeper charges the rows that did go out. */
static void stop_handing_over(struct worker *w, const char *why)
{
	struct batch *b = &w->batch;
	b->lease_lost = true;
	log_fields(LOG_WARN,
		   "lease lost while publishing; no more rows of the batch "
		   "are handed over",
		   "lease_id", b->lease.lease_id, "error", why, NULL);
	const char **ids = calloc(b->n_valid ? b->n_valid : 1, sizeof(*ids));
	size_t n = 0;
	for (size_t j = 0; ids && j < b->n_valid; j++)
		if (!b->asked[j])
			ids[n++] = b->valid[j].id;
	char err[512];
	struct mark_result mr;
	if (n > 0)
		(void)store_mark(w->store, MARK_RELEASE, ids, NULL, n, &mr, err,
				 sizeof(err));
	free(ids);
}

/* Keeps the lease transaction from the idle-in-transaction timeout while
 * the batch waits for its turn or is with the broker. Every row stays held
 * while it lives. A renewal that fails means the transaction is gone (any
 * error in it ends it): no further row of the batch may be handed over,
 * since nothing holds them any more, and nothing is tried again. */
static void renew(struct worker *w)
{
	struct batch *b = &w->batch;
	char err[512];
	int64_t before = clock_ms();
	int rc = store_renew(w->store, err, sizeof(err));
	b->last_renew_ms = before;
	if (rc == 0) {
		metrics_add(MC_RENEWALS, 1);
		/* The deadline moves only as far as the database moved the
		 * lease, measured from before the statement. */
		b->local_deadline_ms = before + w->cfg->lease_timeout_ms -
				       w->cfg->statement_timeout_ms;
		return;
	}
	stop_handing_over(w, err);
}

static bool ctx_may_send(struct publish_ctx *ctx, size_t j)
{
	struct worker *w = ctx->opaque;
	struct batch *b = &w->batch;
	if (!b->lease_lost && !store_lease_held(w->store, &b->lease))
		stop_handing_over(w, "the lease transaction's session ended");
	bool yes = !relay_stopping(w->r) && !b->lease_lost &&
		   clock_ms() < b->local_deadline_ms;
	if (yes && j < b->n_valid)
		b->asked[j] = true;
	return yes;
}

static bool ctx_tick(struct publish_ctx *ctx)
{
	struct worker *w = ctx->opaque;
	loop_tick(w->th);
	if (!w->batch.lease_lost &&
	    clock_ms() - w->batch.last_renew_ms >= w->cfg->lease_timeout_ms / 3)
		renew(w);
	/* Read by lanes_publish() at the batch's turn and at each tick. */
	ctx->deadline_ms = w->batch.local_deadline_ms;
	return relay_stopping(w->r);
}

/* ---- one batch: validate, publish, route outcomes, mark ---- */

/* An event over OUTBOX_MAX_EVENT_SIZE can never be sent: it fails before
 * anything is, so no broker, no JSON parser and no encoder buffer sees it. */
static bool event_too_large(const struct outbox_event *e,
			    const struct config *cfg, char *reason, size_t len)
{
	char limit[32];
	size_t bytes = cloudevent_row_bytes(e);

	if (cfg->max_event_size <= 0 || bytes <= (size_t)cfg->max_event_size)
		return false;
	config_format_size(cfg->max_event_size, limit, sizeof(limit));
	snprintf(reason, len,
		 "too large: event of %zu bytes (payload %zu) is over "
		 "OUTBOX_MAX_EVENT_SIZE (%s)",
		 bytes, e->payload_len, limit);
	return true;
}

/* Picks the rows that can be encoded and are within
 * OUTBOX_MAX_EVENT_SIZE; the others are marked failed with their reason,
 * or for a retry when memory ran out while checking them. */
static void validate_rows(struct batch *b, const struct config *cfg)
{
	b->n_valid = 0;
	for (size_t i = 0; i < b->lease.n; i++) {
		const struct outbox_event *e = &b->lease.events[i];
		char *why = b->invalid[i];
		if (!event_too_large(e, cfg, why, sizeof(b->invalid[i])) &&
		    cloudevent_validate(e, why, sizeof(b->invalid[i])) == 0) {
			b->valid[b->n_valid] = *e;
			b->valid_row[b->n_valid++] = i;
			continue;
		}
		/* A row that can never be encoded fails, never stopping the
		 * batch (docs/design.md §10); memory is a charged retry. */
		bool memory = strcmp(why, CLOUDEVENT_NO_MEMORY) == 0;
		batch_add_mark(b, memory ? MARK_RETRY : MARK_FAILED, e->id,
			       why);
		b->outcomes[memory ? PUB_EVENT : PUB_PERMANENT]++;
		log_fields(LOG_WARN,
			   memory ? "event not encoded; retried"
				  : "event cannot be encoded",
			   "id", e->id, "reason", why, NULL);
	}
}

static void publish_valid_rows(struct worker *w)
{
	struct batch *b = &w->batch;
	/* Never past the lease's local deadline as renewals move it; the
	 * publish timeout counts from the batch's turn (lanes_publish()). */
	struct publish_ctx ctx = {
	    .deadline_ms = b->local_deadline_ms,
	    .may_send = ctx_may_send,
	    .tick = ctx_tick,
	    .opaque = w,
	};
	if (b->n_valid == 0) {
		/* Waiting for its turn, the lease is renewed all the same. */
		lanes_pass(w->lanes, b->ticket, &ctx);
		return;
	}
	/* A result the backend leaves unfilled must not read as PUB_ACKED
	 * (0): no row is marked sent without the broker's word. */
	for (size_t j = 0; j < b->n_valid; j++)
		b->results[j] = (struct pub_result){
		    .outcome = PUB_TRANSPORT,
		    .reason = "the publisher reported no outcome"};
	/* A publisher that failed is probed before the next batch (lanes.c);
	 * the rows say what became of them either way. */
	(void)lanes_publish(w->lanes, b->ticket, b->valid, b->n_valid,
			    w->cfg->publish_timeout_ms, &ctx, b->results);
}

/* Pauses the destination that refused e (or its routing key), and makes
 * the source due at the pause's end: idle by then, its rows left. */
static void pause_refused(struct worker *w, const struct outbox_event *e,
			  const struct pub_result *res)
{
	char key[PAUSE_KEY_MAX];
	const char *dest = e->exchange ? e->exchange : w->default_destination;
	if (res->route_scoped)
		snprintf(key, sizeof(key), "%s\x1f%s", dest, e->routing_key);
	else
		snprintf(key, sizeof(key), "%s", dest);
	relay_wake_source_at(w->r, w->source,
			     pause_destination(w->r, key, res->reason));
}

/* Applies outcome_rules[] to every published row. */
static void route_outcomes(struct worker *w)
{
	struct batch *b = &w->batch;
	int64_t now_us = clock_wall_us();
	for (size_t j = 0; j < b->n_valid; j++) {
		const struct outbox_event *e = &b->valid[j];
		const struct pub_result *res = &b->results[j];
		/* Not one of ours: leave the row to the sweeper rather than
		 * guess what the backend meant. */
		if ((size_t)res->outcome >= N_OUTCOMES)
			continue;
		const struct outcome_rule *rule = &outcome_rules[res->outcome];
		batch_add_mark(b, rule->mark, e->id, res->reason);
		b->outcomes[res->outcome]++;
		if (rule->in_doubt)
			metrics_add(MC_IN_DOUBT, 1);
		/* Unsigned: a created_at of '-infinity' lies further back
		 * than a signed difference reaches. */
		if (rule->observes_latency && now_us > e->created_at_us)
			metrics_observe(MH_END_TO_END_SECONDS,
					(uint64_t)now_us -
					    (uint64_t)e->created_at_us);
		if (rule->pauses_destination)
			pause_refused(w, e, res);
		if (rule->logged_as_failed)
			log_fields(LOG_WARN, "event failed permanently", "id",
				   e->id, "reason", res->reason, NULL);
	}
	const struct mark_list *transport = &b->marks[MARK_TRANSPORT];
	if (transport->n > 0)
		log_fields(LOG_WARN,
			   "publish outcome unknown; rows retried "
			   "with backoff",
			   "reason", transport->reasons[0], NULL);
}

/* Runs one mark; false when it failed, and with it the lease
 * transaction. */
static bool run_mark(struct worker *w, int order)
{
	const struct mark_list *l = &w->batch.marks[mark_order[order].mark];
	const char *what = mark_order[order].name;
	if (l->n == 0)
		return true;
	char err[512];
	struct mark_result mr;
	int64_t t0 = clock_ms();
	int rc = store_mark(w->store, mark_order[order].mark, l->ids,
			    mark_order[order].with_reasons ? l->reasons : NULL,
			    l->n, &mr, err, sizeof(err));
	metrics_observe(MH_MARK_SECONDS, (uint64_t)(clock_ms() - t0) * 1000);
	char count[32];
	if (rc != 0) {
		/* The lease transaction is lost with it: nothing of the
		 * batch takes effect, its rows are pending again and the
		 * sweeper charges their attempt (docs/design.md §4). */
		snprintf(count, sizeof(count), "%zu", l->n);
		log_fields(LOG_ERROR,
			   "mark failed; the batch's rows return to pending",
			   "mark", what, "rows", count, "error", err, NULL);
		return false;
	}
	if (mr.missing > 0) {
		/* Each row is in one mark list once: a row marked twice is
		 * a bug of ours, and the first mark stands. */
		snprintf(count, sizeof(count), "%zu", mr.missing);
		log_fields(LOG_ERROR,
			   "rows of the lease were marked already; left as "
			   "the first mark made them",
			   "mark", what, "rows", count, "lease_id",
			   w->batch.lease.lease_id, NULL);
	}
	return true;
}

static void run_marks(struct worker *w)
{
	for (int k = 0; k < N_MARKS; k++) {
		if (mark_order[k].mark == MARK_RELEASE &&
		    relay_stopping(w->r)) {
			/* docs/design.md §7: never-sent rows are released only
			 * once the broker client is closed, so nothing still
			 * queued in it can go out after another replica
			 * leased them. */
			lanes_close_before_release(w->lanes);
		}
		/* A failed mark ended the transaction: the rest cannot
		 * run, and conclude() says what became of the batch. */
		if (!run_mark(w, k))
			return;
	}
}

/* The committed outcomes of the batch, by its source (/metrics). */
static void count_source(struct worker *w, const struct batch *b)
{
	struct source_stats *st = &w->r->source_stats[w->source];
	atomic_fetch_add(&st->sent, b->outcomes[PUB_ACKED]);
	atomic_fetch_add(&st->retried,
			 b->outcomes[PUB_TRANSPORT] + b->outcomes[PUB_EVENT]);
	atomic_fetch_add(&st->failed, b->outcomes[PUB_PERMANENT]);
}

/* Commits the marks: only now do they take effect, and only now are the
 * rows left unmarked released (after run_marks() closed the publisher, at
 * shutdown). */
static void conclude(struct worker *w)
{
	struct batch *b = &w->batch;
	char err[512];
	int64_t t0 = clock_ms();
	int rc = store_lease_commit(w->store, &b->lease, err, sizeof(err));
	metrics_observe(MH_MARK_SECONDS, (uint64_t)(clock_ms() - t0) * 1000);
	if (rc == 0) {
		for (size_t k = 0; k < N_OUTCOMES; k++)
			if (b->outcomes[k] > 0)
				metrics_add(outcome_rules[k].counter,
					    b->outcomes[k]);
		count_source(w, b);
		return;
	}
	char count[32];
	snprintf(count, sizeof(count), "%zu", b->lease.n);
	/* A stale relay (its session ended past the lease) lands here: its
	 * marks are refused by the database, not by us. */
	log_fields(LOG_WARN,
		   "lost leases: the lease did not commit; its rows are "
		   "pending again and go out again",
		   "lease_id", b->lease.lease_id, "rows", count, "error", err,
		   NULL);
	metrics_add(MC_LOST_LEASES, b->lease.n);
	if (relay_stopping(w->r))
		atomic_store(&w->r->marks_failed, 1);
	if (rc == STORE_RECONNECT)
		sources_reconnect(w->th, &w->src, w->source);
}

/* Publishes the leased rows and marks every one by its outcome. Takes
 * over *lease. */
static void process_batch(struct worker *w, struct lease_batch *lease,
			  int64_t lease_started_ms, uint64_t ticket)
{
	struct batch *b = &w->batch;
	char err[128];
	if (batch_init(b, lease, err, sizeof(err)) != 0) {
		/* Nothing was handed over: roll the lease back, its rows
		 * uncharged, then let the next lane have its turn. */
		log_error("%s", err);
		if (store_lease_abort(w->store, &b->lease, err, sizeof(err)) ==
		    STORE_RECONNECT)
			sources_reconnect(w->th, &w->src, w->source);
		lanes_pass(w->lanes, ticket, NULL);
		goto out;
	}
	b->ticket = ticket;
	b->local_deadline_ms = lease_started_ms + w->cfg->lease_timeout_ms -
			       w->cfg->statement_timeout_ms;
	b->last_renew_ms = lease_started_ms;
	validate_rows(b, w->cfg);
	publish_valid_rows(w);
	route_outcomes(w);
	run_marks(w);
	conclude(w);
out:
	batch_release(b);
}

/* ---- the worker loop ---- */

static int pause_keys_init(struct pause_keys *pk)
{
	/* Operator pauses and destination pauses, up to RELAY_MAX_PAUSES
	 * each. */
	pk->keys = calloc(RELAY_MAX_PAUSES * 2, sizeof(*pk->keys));
	pk->ptrs = calloc(RELAY_MAX_PAUSES * 2, sizeof(*pk->ptrs));
	pk->n = 0;
	return pk->keys && pk->ptrs ? 0 : -1;
}

static void pause_keys_release(struct pause_keys *pk)
{
	free(pk->keys);
	free(pk->ptrs);
	*pk = (struct pause_keys){0};
}

/* Fills pk with the keys the next lease skips. Returns 0 when the turn
 * leases, 1 when it leases nothing (an operator paused everything, pk
 * then left unfilled; no memory), or the store's error when the pauses
 * could not be read (err says why). The operator pauses are read once
 * per poll interval (at most a second), not each loop: a statement per
 * batch is a share of the database's cost per event. */
static int read_pauses(struct worker *w, struct pause_keys *pk, char *err,
		       size_t errlen)
{
	struct source_turns *turns = w->turns;
	struct source_turn *t = &turns->at[w->source];
	int64_t now = clock_ms();
	int64_t refresh = w->cfg->poll_interval_ms < CONTROL_REFRESH_MS
			      ? w->cfg->poll_interval_ms
			      : CONTROL_REFRESH_MS;
	if (t->control_read_ms == 0 || now - t->control_read_ms >= refresh) {
		size_t n = 0;
		bool global = false;
		/* Pauses not read are not known to be lifted: the turn
		 * leases nothing rather than rows an operator may have
		 * paused (a failover, a lock on the control table). Those
		 * read before stay, and the next turn reads again. */
		int rc = store_read_pauses(w->store, &global, pk->keys,
					   RELAY_MAX_PAUSES, &n, err, errlen);
		if (rc != 0)
			return rc;
		if (!source_turn_keep_control(t, pk->keys, n)) {
			log_error("out of memory for the operator pauses");
			return 1;
		}
		t->control_read_ms = now;
		if (global != t->control_global)
			turns->n_paused += global ? 1 : (size_t)-1;
		t->control_global = global;
		/* A relay of one table: 1 while it is paused. Of several:
		 * how many of them are. */
		metrics_set(MG_PAUSED_GLOBALLY, (int64_t)turns->n_paused);
	}
	if (t->control_global)
		return 1;
	size_t n_control = t->n_control;
	if (n_control > 0)
		memcpy(pk->keys, t->control, n_control * sizeof(*pk->keys));
	pk->n = n_control +
		active_pauses(w->r, pk->keys + n_control, RELAY_MAX_PAUSES);
	for (size_t i = 0; i < pk->n; i++)
		pk->ptrs[i] = pk->keys[i];
	return 0;
}

/* Leases a batch into *lease; 0, or the store's error with err. */
static int lease_next_batch(struct worker *w, const struct pause_keys *pk,
			    int64_t started, struct lease_batch *lease,
			    char *err, size_t errlen)
{
	int rc = store_lease(w->store, pk->ptrs, pk->n, w->default_destination,
			     lease, err, errlen);
	metrics_observe(MH_LEASE_SECONDS,
			(uint64_t)(clock_ms() - started) * 1000);
	metrics_add(MC_LEASES, 1);
	return rc;
}

/* When the worker's next lease may start after one that began at started
 * and found n rows. */
static int64_t next_lease_at(struct worker *w, size_t n, int64_t started)
{
	const struct config *cfg = w->cfg;
	if (n == (size_t)cfg->batch_size)
		return started; /* a backlog: the next lane leases at once */
	if (n > 0)
		/* Not cut short by notifications: with LISTEN on, a steady
		 * stream would otherwise turn into a lease per few rows,
		 * and the leases' cost into queueing delay (measured: p99
		 * at 1000 events/s 90 ms against 18 without).
		 * Notifications are for waking an idle worker.
		 * OUTBOX_LEASE_INTERVAL (14 ms): long enough that a trickle
		 * is leased in batches rather than a statement per row,
		 * short enough that an event waits at most this plus one
		 * publish (docs/benchmark.md, "Latency"). */
		return started + cfg->lease_interval_ms;
	/* Idle: until the poll interval (of several sources the backstop:
	 * their poll is the activity read) or the earliest row to come due
	 * (or one that came due during the lease). Rows due before that the
	 * lease left behind (paused, locked by another replica) must not
	 * shorten the sleep, or it would spin. */
	char err[1024];
	int64_t sleep_ms = sources_gated(w->r) ? SOURCE_IDLE_BACKSTOP_MS
					       : cfg->poll_interval_ms;
	int64_t due;
	if (store_next_due_since_ms(w->store, clock_ms() - started, &due, err,
				    sizeof(err)) != 0)
		due = cfg->poll_interval_ms; /* unknown: not the backstop */
	if (due >= 0 && due < sleep_ms)
		sleep_ms = due < 10 ? 10 : due;
	return clock_ms() + sleep_ms;
}

/* When the worker's next lease turn may start: the earliest source due. */
static int64_t next_turn_at(struct worker *w)
{
	/* With patterns there may be no source yet: discovery wakes the
	 * workers when it finds one, and the backstop bounds the sleep. */
	int64_t earliest = source_turns_earliest(w->turns, w->r, &w->src);
	int64_t latest = clock_ms() + SOURCE_IDLE_BACKSTOP_MS;
	return earliest < latest ? earliest : latest;
}

/*
 * Holding the lease turn, picks the source to lease from: the next one due
 * in round-robin order (docs/design.md §13), its store in w->store. False,
 * the turn ended, when none is due or its store cannot be opened.
 */
static bool pick_source(struct worker *w, uint64_t gen)
{
	sources_let_go_gone(w->r, &w->src);
	source_turns_read_activity(w->turns, w->th, &w->src,
				   w->cfg->poll_interval_ms);
	size_t i = source_turns_pick(w->turns, w->r, &w->src, clock_ms());
	struct store *s =
	    i == SIZE_MAX ? NULL : sources_store(w->th, &w->src, i);
	if (!s) {
		/* Nothing due: idle as after an empty lease (a wake-up
		 * ends it); a store that would not open was set aside. */
		lanes_end_turn(w->lanes, TURN_EMPTY, next_turn_at(w), gen);
		return false;
	}
	w->source = i;
	w->store = s;
	return true;
}

/* One pass of the lane's loop. */
static void worker_pass(struct worker *w, struct pause_keys *pk)
{
	struct relay *r = w->r;
	const struct config *cfg = w->cfg;
	loop_tick(w->th);
	int64_t next_probe_ms;
	if (!lanes_publisher_ready(w->lanes, cfg, &next_probe_ms)) {
		/* New rows do not make a probe due. */
		relay_idle_since(w->th, NULL, next_probe_ms - clock_ms(),
				 lanes_publisher_service, w->lanes);
		return;
	}
	rate_wait(w->th, cfg->batch_size, lanes_publisher_service, w->lanes);
	if (relay_stopping(r) || !lanes_take_turn(w->lanes, w->th)) {
		rate_refund(r, cfg->batch_size);
		return;
	}
	uint64_t gen = relay_wake_generation(r);
	if (!pick_source(w, gen)) {
		rate_refund(r, cfg->batch_size);
		return;
	}
	struct source_turn *t = &w->turns->at[w->source];
	/* Read within the turn: waiting for it can take longer than a
	 * pause takes to matter. A session lost on the way is reconnected
	 * after the turn, as for a lease below, and the next turn reads
	 * them again: not a poll interval later. */
	char err[1024];
	int rc = read_pauses(w, pk, err, sizeof(err));
	if (rc != 0) {
		if (rc != STORE_RECONNECT)
			t->due_ms = clock_ms() + cfg->poll_interval_ms;
		lanes_end_turn(
		    w->lanes, TURN_SKIPPED,
		    rc == STORE_RECONNECT ? clock_ms() : next_turn_at(w), 0);
		rate_refund(r, cfg->batch_size);
		if (rc < 0)
			sources_failed(w->th, &w->src, w->source, rc,
				       "reading operator pauses", err);
		return;
	}

	int64_t started = clock_ms();
	struct lease_batch lease = {0};
	rc = lease_next_batch(w, pk, started, &lease, err, sizeof(err));
	if (rc != 0) {
		rate_refund(r, cfg->batch_size);
		if (rc == STORE_RECONNECT) {
			/* The other lanes' sessions may be fine: they lease
			 * while this one reconnects. */
			lanes_end_turn(w->lanes, TURN_SKIPPED, clock_ms(), 0);
			sources_failed(w->th, &w->src, w->source, rc, "lease",
				       err);
		} else {
			sources_failed(w->th, &w->src, w->source, rc, "lease",
				       err);
			lanes_end_turn(w->lanes, TURN_SKIPPED, next_turn_at(w),
				       0);
		}
		return;
	}
	sources_ok(r, &w->src, w->source);
	source_note_lag(r, w->source, &lease);
	size_t n = lease.n;
	t->due_ms = next_lease_at(w, n, started);
	t->idle = n == 0;
	uint64_t ticket = lanes_end_turn(
	    w->lanes, n > 0 ? TURN_LEASED : TURN_EMPTY, next_turn_at(w), gen);
	rate_refund(r, (double)cfg->batch_size - (double)n);
	/* An empty lease holds nothing to release. */
	if (n > 0) {
		metrics_observe(MH_BATCH_SIZE, n);
		/* From before BEGIN to the end of COMMIT or ROLLBACK. */
		metrics_lease_open(w->lease_slot, started);
		process_batch(w, &lease, started, ticket);
		metrics_lease_closed(w->lease_slot);
		/* Ordered mode: a key's next row waits for this batch's
		 * end, so another lane's lease meanwhile, ended or under
		 * way, may find every key held and leave the worker idle
		 * for the poll interval with rows due (measured: 3 keys, 60
		 * rows, a poll of 60 s: 6 sent in 5 s). The end of the
		 * batch wakes it, as a notification would. */
		if (cfg->ordering == ORDERING_PARTITION &&
		    lanes_leased_since(w->lanes, started))
			relay_wake_source(r, w->source);
	}
}

void *worker_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	struct worker w = {.th = th,
			   .r = r,
			   .cfg = r->cfg,
			   .lanes = th->lanes,
			   /* Backends without the notion have no callback. */
			   .default_destination =
			       r->pub_ops->default_destination
				   ? r->pub_ops->default_destination(r->cfg)
				   : "",
			   .lease_slot = metrics_lease_slot()};
	struct pause_keys pk = {0};
	log_set_thread(th->name);
	if (pause_keys_init(&pk) != 0) {
		log_error("out of memory for the pause keys");
		goto out;
	}
	w.turns = lanes_source_turns(w.lanes);
	if (!sources_open(th, th->name, &w.src))
		goto out;
	while (!relay_stopping(r))
		worker_pass(&w, &pk);
out:
	lanes_leave(w.lanes);
	sources_close(w.r, &w.src);
	pause_keys_release(&pk);
	log_info("worker stopped");
	return NULL;
}
