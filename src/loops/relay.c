/* SPDX-License-Identifier: MIT */
/*
 * The loops: relay workers (lease, publish, mark), sweeper and cleaner.
 * Each runs on its own thread with its own store session.
 */
#include "loops.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "encode/encode.h"
#include "store/pgconn.h"
#include "store/store.h"

#define RECONNECT_MIN_MS 100
#define RECONNECT_MAX_MS 5000
#define PROBE_MIN_MS 1000
/* A probe is one confirmed publish: cheap enough to try every few seconds,
 * so publishing resumes soon after the broker recovers. */
#define PROBE_MAX_MS 5000
#define PAUSE_MIN_MS 1000
#define PAUSE_MAX_MS 60000
/* After a partial batch: long enough that a trickle is leased in batches
 * rather than a statement per row, short enough that an event waits less
 * than one cycle (pause + lease + publish + mark) at moderate rates. */
#define REPOLL_MS 10
#define SWEEP_CAP_ROWS 10000
#define CLEAN_CAP_BATCHES 20
#define CLEAN_PAUSE_MS 100

static void tick(struct relay_thread *th)
{
	atomic_store(&th->last_tick_ms, clock_ms());
}

static bool stopping(const struct relay *r)
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

static uint64_t wake_generation(struct relay *r)
{
	pthread_mutex_lock(&r->lock);
	uint64_t gen = r->wake_gen;
	pthread_mutex_unlock(&r->lock);
	return gen;
}

/* Sleeps like relay_idle(), but returns at once when a wake-up came after
 * generation *gen was read: a notification that arrives while a lease is
 * under way must not be slept through. Without gen, only shutdown ends the
 * sleep early. */
static void idle_since(struct relay_thread *th, const uint64_t *gen, int64_t ms,
		       void (*service)(void *), void *state)
{
	struct relay *r = th->relay;
	int64_t until = clock_ms() + ms;
	pthread_mutex_lock(&r->lock);
	while (!stopping(r) && (!gen || r->wake_gen == *gen)) {
		int64_t now = clock_ms();
		if (now >= until)
			break;
		int64_t slice = until - now < 1000 ? until - now : 1000;
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_sec += slice / 1000;
		ts.tv_nsec += (slice % 1000) * 1000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&r->wake, &r->lock, &ts);
		if (service) {
			pthread_mutex_unlock(&r->lock);
			service(state);
			pthread_mutex_lock(&r->lock);
		}
		tick(th);
	}
	pthread_mutex_unlock(&r->lock);
	tick(th);
}

void relay_idle(struct relay_thread *th, int64_t ms, void (*service)(void *),
		void *state)
{
	uint64_t gen = wake_generation(th->relay);
	idle_since(th, &gen, ms, service, state);
}

/* Reconnects with capped exponential backoff until it works or shutdown. */
static int reconnect(struct relay_thread *th, struct store *s)
{
	int64_t backoff = RECONNECT_MIN_MS;
	char err[512];
	while (!stopping(th->relay)) {
		if (store_reconnect(s, err, sizeof(err)) == 0) {
			metrics_add(MC_DB_RECONNECTS, 1);
			log_info("reconnected to postgres");
			return 0;
		}
		log_warn("postgres reconnect failed: %s", err);
		relay_idle(th, backoff, NULL, NULL);
		backoff = backoff * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS
							 : backoff * 2;
	}
	return -1;
}

static void app_name(const struct relay *r, const char *who, char *out,
		     size_t outlen)
{
	snprintf(out, outlen, "outbox-relay/%s/%s", r->host, who);
}

/* Opens the thread's store, retrying until it works or shutdown. A
 * missing table is not retried quietly: it is logged every time. */
static struct store *open_store(struct relay_thread *th, const char *who)
{
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	char name[160], leased_by[160], err[1024];
	app_name(r, who, name, sizeof(name));
	snprintf(leased_by, sizeof(leased_by), "%s/%d/%s", r->host, r->pid,
		 who);
	struct store_options o =
	    store_options_from_config(cfg, name, leased_by);
	int64_t backoff = RECONNECT_MIN_MS;
	while (!stopping(r)) {
		struct store *s = NULL;
		if (store_open(&s, &o, err, sizeof(err)) == 0)
			return s;
		log_error("%s", err);
		relay_idle(th, backoff, NULL, NULL);
		backoff = backoff * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS
							 : backoff * 2;
	}
	return NULL;
}

/* ---- destination pauses (shared, under r->lock) ---- */

static void pause_destination(struct relay *r, const char *key,
			      const char *reason)
{
	int64_t now = clock_ms();
	pthread_mutex_lock(&r->lock);
	struct relay_pause *p = NULL;
	for (size_t i = 0; i < r->n_pauses; i++)
		if (strcmp(r->pauses[i].key, key) == 0)
			p = &r->pauses[i];
	if (!p && r->n_pauses < RELAY_MAX_PAUSES) {
		p = &r->pauses[r->n_pauses++];
		snprintf(p->key, sizeof(p->key), "%s", key);
		p->backoff_ms = 0;
		p->until_ms = 0;
	}
	if (p && p->until_ms <= now) {
		/* Refused again after its pause: wait longer next time. */
		p->backoff_ms =
		    p->backoff_ms ? p->backoff_ms * 2 : PAUSE_MIN_MS;
		if (p->backoff_ms > PAUSE_MAX_MS)
			p->backoff_ms = PAUSE_MAX_MS;
		p->until_ms = now + p->backoff_ms;
		char shown[300];
		snprintf(shown, sizeof(shown), "%s", key);
		char *sep = strchr(shown, '\x1f');
		if (sep)
			*sep = ' ';
		log_fields(LOG_WARN, "destination paused", "destination", shown,
			   "reason", reason, NULL);
	}
	pthread_mutex_unlock(&r->lock);
}

/* Copies the active pause keys into keys[]; forgets long-expired ones. */
static size_t active_pauses(struct relay *r, char (*keys)[300], size_t max)
{
	int64_t now = clock_ms();
	size_t n = 0;
	pthread_mutex_lock(&r->lock);
	for (size_t i = 0; i < r->n_pauses;) {
		struct relay_pause *p = &r->pauses[i];
		if (p->until_ms > now) {
			if (n < max)
				snprintf(keys[n++], 300, "%s", p->key);
			i++;
		} else if (now - p->until_ms > 10 * PAUSE_MAX_MS) {
			r->pauses[i] = r->pauses[--r->n_pauses];
		} else {
			i++;
		}
	}
	pthread_mutex_unlock(&r->lock);
	metrics_set(MG_DESTINATIONS_PAUSED, (int64_t)n);
	return n;
}

/* ---- max rate (shared schedule, under r->lock) ---- */

/* Reserves n events of the per-replica rate; returns ms to wait. */
static int64_t rate_reserve(struct relay *r, double n)
{
	double rate = r->cfg->max_rate;
	if (rate <= 0)
		return 0;
	double now = (double)clock_ms();
	pthread_mutex_lock(&r->lock);
	double start = r->rate_next_ms > now ? r->rate_next_ms : now;
	r->rate_next_ms = start + n * 1000.0 / rate;
	pthread_mutex_unlock(&r->lock);
	return (int64_t)(start - now);
}

static void rate_refund(struct relay *r, double n)
{
	if (r->cfg->max_rate <= 0 || n <= 0)
		return;
	pthread_mutex_lock(&r->lock);
	r->rate_next_ms -= n * 1000.0 / r->cfg->max_rate;
	pthread_mutex_unlock(&r->lock);
}

/* ---- workers ---- */

struct worker {
	struct relay_thread *th;
	struct relay *r;
	const struct config *cfg;
	struct store *store;
	void *pub;
	bool pub_open;
	bool pub_healthy;
	int64_t next_probe_ms;
	int64_t probe_backoff_ms;

	/* The batch in progress. */
	struct lease_batch batch;
	struct outbox_event *valid; /* events handed to the publisher */
	size_t *valid_index; /* valid[j] is batch.events[valid_index[j]] */
	size_t n_valid;
	bool *held;		    /* per batch row: lease still ours */
	const char **ids;	    /* per batch row */
	struct pub_result *results; /* per valid event */
	int64_t local_deadline_ms;  /* no row handed to the broker after */
	int64_t last_renew_ms;
};

static void set_healthy(struct worker *w, bool healthy)
{
	if (healthy == w->pub_healthy)
		return;
	w->pub_healthy = healthy;
	atomic_fetch_add(&w->r->workers_ready, healthy ? 1 : -1);
	metrics_gauge_add(MG_PUBLISHERS_UNHEALTHY, healthy ? -1 : 1);
}

static void service_publisher(void *arg)
{
	struct worker *w = arg;
	if (w->pub_open && w->r->pub->service)
		w->r->pub->service(w->pub);
}

/* Opens or probes the publisher when it is due; true when healthy. */
static bool ensure_publisher(struct worker *w)
{
	if (w->pub_healthy)
		return true;
	int64_t now = clock_ms();
	if (now < w->next_probe_ms)
		return false;
	char err[512] = "";
	int rc;
	if (!w->pub_open) {
		rc = w->r->pub->open(w->cfg, &w->pub, err, sizeof(err));
		w->pub_open = rc == 0;
	} else {
		rc = w->r->pub->probe(w->pub, err, sizeof(err));
	}
	if (rc == 0) {
		log_info("publisher %s is healthy", w->r->pub->name);
		w->probe_backoff_ms = 0;
		set_healthy(w, true);
		return true;
	}
	metrics_add(MC_PUBLISHER_FAILURES, 1);
	w->probe_backoff_ms =
	    w->probe_backoff_ms ? w->probe_backoff_ms * 2 : PROBE_MIN_MS;
	if (w->probe_backoff_ms > PROBE_MAX_MS)
		w->probe_backoff_ms = PROBE_MAX_MS;
	w->next_probe_ms = now + w->probe_backoff_ms;
	log_fields(LOG_WARN, "publisher unhealthy; leasing nothing for it",
		   "publisher", w->r->pub->name, "error", err, NULL);
	return false;
}

static void renew(struct worker *w)
{
	struct lease_batch *b = &w->batch;
	bool *now_held = calloc(b->n, sizeof(bool));
	char err[512];
	size_t n_held;
	if (!now_held)
		return;
	int64_t before = clock_ms();
	int rc = store_renew(w->store, b->lease_id, w->ids, b->n, now_held,
			     &n_held, err, sizeof(err));
	if (rc == 0) {
		size_t lost = 0;
		for (size_t i = 0; i < b->n; i++) {
			if (w->held[i] && !now_held[i])
				lost++;
			w->held[i] = w->held[i] && now_held[i];
		}
		metrics_add(MC_RENEWALS, 1);
		metrics_add(MC_RENEWAL_LOST, lost);
		/* The deadline moves only as far as the database moved the
		 * lease, measured from before the statement. */
		w->local_deadline_ms = before + w->cfg->lease_timeout_ms -
				       w->cfg->statement_timeout_ms;
		w->last_renew_ms = before;
	} else {
		log_warn("lease renewal failed: %s", err);
		if (rc == STORE_RECONNECT)
			store_reconnect(w->store, err, sizeof(err));
	}
	free(now_held);
}

static bool ctx_may_send(struct publish_ctx *ctx, size_t j)
{
	struct worker *w = ctx->opaque;
	if (stopping(w->r) || clock_ms() >= w->local_deadline_ms)
		return false;
	return w->held[w->valid_index[j]];
}

static bool ctx_tick(struct publish_ctx *ctx)
{
	struct worker *w = ctx->opaque;
	tick(w->th);
	if (clock_ms() - w->last_renew_ms >= w->cfg->lease_timeout_ms / 3)
		renew(w);
	return stopping(w->r);
}

/* Per-class id and reason lists for the marks of one batch. */
struct mark_list {
	const char **ids;
	const char **reasons;
	size_t n;
};

static int batch_alloc(struct worker *w, size_t n)
{
	w->valid = calloc(n, sizeof(*w->valid));
	w->valid_index = calloc(n, sizeof(*w->valid_index));
	w->held = calloc(n, sizeof(*w->held));
	w->ids = calloc(n, sizeof(*w->ids));
	w->results = calloc(n, sizeof(*w->results));
	return w->valid && w->valid_index && w->held && w->ids && w->results
		   ? 0
		   : -1;
}

static void batch_free(struct worker *w)
{
	free(w->valid);
	free(w->valid_index);
	free(w->held);
	free(w->ids);
	free(w->results);
	w->valid = NULL;
	w->valid_index = NULL;
	w->held = NULL;
	w->ids = NULL;
	w->results = NULL;
	lease_batch_release(&w->batch);
}

static void run_mark(struct worker *w, enum store_mark kind,
		     struct mark_list *l, const char *what)
{
	if (l->n == 0)
		return;
	char err[512];
	struct mark_result mr;
	bool with_reasons = kind != MARK_SENT && kind != MARK_RELEASE;
	int64_t t0 = clock_ms();
	int rc = store_mark(w->store, kind, w->batch.lease_id, l->ids,
			    with_reasons ? l->reasons : NULL, l->n, &mr, err,
			    sizeof(err));
	metrics_observe(MH_MARK_SECONDS, (uint64_t)(clock_ms() - t0) * 1000);
	if (rc != 0) {
		/* The rows stay in_flight; the sweeper returns them once
		 * the lease expires. */
		char count[32];
		snprintf(count, sizeof(count), "%zu", l->n);
		log_fields(LOG_ERROR,
			   "mark failed; the sweeper will recover "
			   "the rows",
			   "mark", what, "rows", count, "error", err, NULL);
		if (stopping(w->r))
			atomic_store(&w->r->marks_failed, 1);
		if (rc == STORE_RECONNECT)
			reconnect(w->th, w->store);
		return;
	}
	metrics_add(MC_LOST_LEASES, mr.lost);
	metrics_add(MC_MARKS_ALREADY, mr.already);
	if (mr.lost > 0) {
		char count[32];
		snprintf(count, sizeof(count), "%zu", mr.lost);
		log_fields(LOG_WARN,
			   "lost leases: rows no longer ours were "
			   "left alone",
			   "mark", what, "rows", count, "lease_id",
			   w->batch.lease_id, NULL);
	}
}

static void destination_key(const struct config *cfg,
			    const struct outbox_event *e, bool route_scoped,
			    char *out, size_t outlen)
{
	const char *dest =
	    e->exchange ? e->exchange : publisher_default_destination(cfg);
	if (route_scoped)
		snprintf(out, outlen, "%s\x1f%s", dest, e->routing_key);
	else
		snprintf(out, outlen, "%s", dest);
}

/* Publishes the leased batch and marks every row by its outcome. */
static void process_batch(struct worker *w, int64_t lease_started_ms)
{
	struct relay *r = w->r;
	const struct config *cfg = w->cfg;
	struct lease_batch *b = &w->batch;
	size_t n = b->n;
	struct mark_list sent = {0}, retry = {0}, transport = {0}, failed = {0},
			 release = {0};
	char(*reasons)[256] = calloc(n, sizeof(*reasons));
	const char **lists = calloc(n * 10, sizeof(*lists));
	if (!reasons || !lists || batch_alloc(w, n) != 0) {
		/* Nothing was handed over; the sweeper returns the rows. */
		log_error("out of memory for a batch of %zu rows", n);
		free(reasons);
		free(lists);
		batch_free(w);
		return;
	}
	struct mark_list *all[5] = {&sent, &retry, &transport, &failed,
				    &release};
	for (int k = 0; k < 5; k++) {
		all[k]->ids = lists + (size_t)(2 * k) * n;
		all[k]->reasons = lists + (size_t)(2 * k + 1) * n;
	}

	w->local_deadline_ms = lease_started_ms + cfg->lease_timeout_ms -
			       cfg->statement_timeout_ms;
	w->last_renew_ms = lease_started_ms;
	w->n_valid = 0;
	for (size_t i = 0; i < n; i++) {
		w->ids[i] = b->events[i].id;
		w->held[i] = true;
		/* A row that can never be encoded fails with its reason and
		 * never stops the batch (contract section 10). */
		if (cloudevent_validate(&b->events[i], reasons[i],
					sizeof(reasons[i])) != 0) {
			failed.ids[failed.n] = b->events[i].id;
			failed.reasons[failed.n++] = reasons[i];
			metrics_add(MC_PERMANENT, 1);
			log_fields(LOG_WARN, "event cannot be encoded", "id",
				   b->events[i].id, "reason", reasons[i], NULL);
			continue;
		}
		w->valid[w->n_valid] = b->events[i];
		w->valid_index[w->n_valid++] = i;
	}

	if (w->n_valid > 0) {
		int64_t publish_deadline = clock_ms() + cfg->publish_timeout_ms;
		struct publish_ctx ctx = {
		    .deadline_ms = publish_deadline < w->local_deadline_ms
				       ? publish_deadline
				       : w->local_deadline_ms,
		    .may_send = ctx_may_send,
		    .tick = ctx_tick,
		    .opaque = w,
		};
		int64_t t0 = clock_ms();
		int rc = r->pub->publish(w->pub, w->valid, w->n_valid, &ctx,
					 w->results);
		metrics_observe(MH_PUBLISH_SECONDS,
				(uint64_t)(clock_ms() - t0) * 1000);
		if (rc != 0)
			set_healthy(w, false);
	}

	int64_t now_us = clock_wall_us();
	for (size_t j = 0; j < w->n_valid; j++) {
		const struct outbox_event *e = &w->valid[j];
		struct pub_result *res = &w->results[j];
		switch (res->outcome) {
		case PUB_ACKED:
			sent.ids[sent.n++] = e->id;
			metrics_add(MC_SENT, 1);
			if (now_us > e->created_at_us)
				metrics_observe(
				    MH_END_TO_END_SECONDS,
				    (uint64_t)(now_us - e->created_at_us));
			break;
		case PUB_NOT_WRITTEN:
			release.ids[release.n++] = e->id;
			metrics_add(MC_RELEASED, 1);
			break;
		case PUB_DESTINATION: {
			char key[300];
			destination_key(cfg, e, res->route_scoped, key,
					sizeof(key));
			pause_destination(r, key, res->reason);
			release.ids[release.n++] = e->id;
			metrics_add(MC_DESTINATION, 1);
			break;
		}
		case PUB_TRANSPORT:
			transport.ids[transport.n] = e->id;
			transport.reasons[transport.n++] = res->reason;
			metrics_add(MC_TRANSPORT, 1);
			metrics_add(MC_IN_DOUBT, 1);
			set_healthy(w, false);
			break;
		case PUB_EVENT:
			retry.ids[retry.n] = e->id;
			retry.reasons[retry.n++] = res->reason;
			metrics_add(MC_EVENT, 1);
			break;
		case PUB_PERMANENT:
			failed.ids[failed.n] = e->id;
			failed.reasons[failed.n++] = res->reason;
			metrics_add(MC_PERMANENT, 1);
			log_fields(LOG_WARN, "event failed permanently", "id",
				   e->id, "reason", res->reason, NULL);
			break;
		}
	}
	if (transport.n > 0)
		log_fields(LOG_WARN,
			   "publish outcome unknown; rows retried "
			   "with backoff",
			   "reason", transport.reasons[0], NULL);

	run_mark(w, MARK_SENT, &sent, "sent");
	run_mark(w, MARK_RETRY, &retry, "retry");
	run_mark(w, MARK_TRANSPORT, &transport, "transport");
	run_mark(w, MARK_FAILED, &failed, "failed");
	if (stopping(r) && w->pub_open) {
		/* Section 7: never-sent rows are released only once the
		 * broker client is closed, so nothing still queued in it can
		 * go out after another replica leased them. */
		r->pub->close(w->pub);
		w->pub_open = false;
		set_healthy(w, false);
	}
	run_mark(w, MARK_RELEASE, &release, "release");
	free(reasons);
	free(lists);
	batch_free(w);
}

static bool read_control(struct worker *w, char (*keys)[300], size_t max,
			 size_t *n)
{
	bool global = false;
	char err[512];
	int rc = store_read_pauses(w->store, &global, keys, max, n, err,
				   sizeof(err));
	if (rc != 0) {
		log_warn("reading operator pauses failed: %s", err);
		if (rc == STORE_RECONNECT)
			reconnect(w->th, w->store);
		*n = 0;
		return false;
	}
	return global;
}

static void *worker_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	struct worker w = {.th = th, .r = r, .cfg = cfg};
	char(*paused)[300] = calloc(RELAY_MAX_PAUSES * 2, sizeof(*paused));
	const char **paused_ptrs =
	    calloc(RELAY_MAX_PAUSES * 2, sizeof(*paused_ptrs));
	log_set_thread(th->name);
	if (!paused || !paused_ptrs) {
		log_error("out of memory");
		goto out;
	}
	w.store = open_store(th, th->name);
	if (!w.store)
		goto out;
	atomic_fetch_add(&r->db_ok, 1);
	metrics_gauge_add(MG_PUBLISHERS_UNHEALTHY, 1); /* until first open */
	const char *default_dest = publisher_default_destination(cfg);

	while (!stopping(r)) {
		tick(th);
		if (!ensure_publisher(&w)) {
			relay_idle(th, w.next_probe_ms - clock_ms(),
				   service_publisher, &w);
			continue;
		}
		service_publisher(&w);

		size_t n_control = 0;
		bool global =
		    read_control(&w, paused, RELAY_MAX_PAUSES, &n_control);
		metrics_set(MG_PAUSED_GLOBALLY, global ? 1 : 0);
		if (global) {
			relay_idle(th, cfg->poll_interval_ms, service_publisher,
				   &w);
			continue;
		}
		size_t n_paused =
		    n_control +
		    active_pauses(r, paused + n_control, RELAY_MAX_PAUSES);
		for (size_t i = 0; i < n_paused; i++)
			paused_ptrs[i] = paused[i];

		int64_t wait = rate_reserve(r, cfg->batch_size);
		if (wait > 0)
			relay_idle(th, wait, service_publisher, &w);
		if (stopping(r))
			break;

		char err[1024];
		uint64_t gen = wake_generation(r);
		int64_t started = clock_ms();
		int rc = 0;
		if (cfg->ordering == ORDERING_PARTITION) {
			/* Fresh keyed rows learn whether they head their key
			 * before the lease looks for heads. */
			size_t classified;
			rc = store_classify(w.store, &classified, err,
					    sizeof(err));
		}
		if (rc == 0)
			rc = store_lease(w.store, paused_ptrs, n_paused,
					 default_dest, &w.batch, err,
					 sizeof(err));
		metrics_observe(MH_LEASE_SECONDS,
				(uint64_t)(clock_ms() - started) * 1000);
		metrics_add(MC_LEASES, 1);
		if (rc != 0) {
			rate_refund(r, cfg->batch_size);
			log_warn("lease failed: %s", err);
			if (rc == STORE_RECONNECT)
				reconnect(th, w.store);
			else
				relay_idle(th, cfg->poll_interval_ms, NULL,
					   NULL);
			continue;
		}
		size_t n = w.batch.n;
		rate_refund(r, (double)cfg->batch_size - (double)n);
		if (n > 0) {
			metrics_observe(MH_BATCH_SIZE, n);
			process_batch(&w, started);
		}
		if (n == (size_t)cfg->batch_size)
			continue;
		if (n > 0) {
			/* Not cut short by notifications: with LISTEN on, a
			 * steady stream would otherwise turn into a lease per
			 * few rows, and the leases' cost into queueing delay
			 * (measured: p99 at 1000 events/s 90 ms against 18
			 * without). Notifications are for waking idle
			 * workers. */
			idle_since(th, NULL, REPOLL_MS, NULL, NULL);
			continue;
		}
		/* Idle: until the poll interval or the earliest row that
		 * becomes due. Rows already due that the lease left behind
		 * (paused destination, locked by another replica) must not
		 * shorten the sleep, or an idle worker would spin. */
		int64_t sleep_ms = cfg->poll_interval_ms, due;
		if (store_next_due_ms(w.store, &due, err, sizeof(err)) == 0 &&
		    due > 0 && due < sleep_ms)
			sleep_ms = due < 10 ? 10 : due;
		idle_since(th, &gen, sleep_ms, service_publisher, &w);
	}
out:
	if (w.pub_open)
		r->pub->close(w.pub);
	if (w.pub_healthy)
		atomic_fetch_sub(&r->workers_ready, 1);
	store_close(w.store);
	free(paused);
	free(paused_ptrs);
	log_info("worker stopped");
	return NULL;
}

/* ---- sweeper and cleaner ---- */

static void *sweeper_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	log_set_thread(th->name);
	struct store *s = open_store(th, th->name);
	while (s && !stopping(r)) {
		tick(th);
		char err[512];
		struct sweep_result sw;
		int64_t t0 = clock_ms();
		int rc = store_sweep(s, SWEEP_CAP_ROWS, &sw, err, sizeof(err));
		size_t repaired = 0;
		if (rc == 0 && r->cfg->ordering == ORDERING_PARTITION) {
			rc = store_repair_heads(s, &repaired, err, sizeof(err));
			if (rc == 0 && repaired > 0)
				log_warn(
				    "gave %zu partition keys their lost head "
				    "marker",
				    repaired);
		}
		metrics_observe(MH_SWEEP_SECONDS,
				(uint64_t)(clock_ms() - t0) * 1000);
		if (rc != 0) {
			log_warn("sweep failed: %s", err);
			if (rc == STORE_RECONNECT && reconnect(th, s) != 0)
				break;
		} else if (!sw.skipped) {
			metrics_add(MC_SWEEPS, 1);
			metrics_add(MC_SWEPT_PENDING, sw.to_pending);
			metrics_add(MC_SWEPT_FAILED, sw.to_failed);
			metrics_set(MG_LAST_SWEEP_MS, clock_wall_us() / 1000);
			if (sw.to_pending + sw.to_failed > 0) {
				char p[32], f[32];
				snprintf(p, sizeof(p), "%zu", sw.to_pending);
				snprintf(f, sizeof(f), "%zu", sw.to_failed);
				log_fields(LOG_WARN, "swept expired leases",
					   "to_pending", p, "to_failed", f,
					   NULL);
				relay_wake(r);
			}
		}
		relay_idle(th, r->cfg->sweep_interval_ms, NULL, NULL);
	}
	store_close(s);
	log_info("sweeper stopped");
	return NULL;
}

static void *cleaner_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	log_set_thread(th->name);
	struct store *s = open_store(th, th->name);
	size_t cap = (size_t)cfg->clean_batch_size * CLEAN_CAP_BATCHES;
	while (s && !stopping(r)) {
		tick(th);
		char err[512];
		struct clean_result cr;
		int rc =
		    store_clean(s, cfg->retention_ms, cfg->failed_retention_ms,
				cap, CLEAN_PAUSE_MS, &cr, err, sizeof(err));
		int64_t next = cfg->clean_interval_ms;
		if (rc != 0) {
			log_warn("clean failed: %s", err);
			if (rc == STORE_RECONNECT && reconnect(th, s) != 0)
				break;
		} else if (!cr.skipped) {
			metrics_add(MC_CLEANS, 1);
			metrics_add(MC_CLEANED_SENT, cr.sent_deleted);
			metrics_add(MC_CLEANED_FAILED, cr.failed_deleted);
			metrics_set(MG_LAST_CLEAN_MS, clock_wall_us() / 1000);
			if (cr.sent_deleted + cr.failed_deleted > 0)
				log_info("cleaned %zu sent and %zu failed rows",
					 cr.sent_deleted, cr.failed_deleted);
			/* Hit the cap: more is due; go on after a pause. */
			if (cr.sent_deleted + cr.failed_deleted >= cap)
				next = 1000;
		}
		relay_idle(th, next, NULL, NULL);
	}
	store_close(s);
	log_info("cleaner stopped");
	return NULL;
}

/* ---- listener (OUTBOX_LISTEN=on) ---- */

#define LISTEN_USAGE_EVERY_MS 5000

static PGconn *listen_connect(struct relay_thread *th, const char *channel)
{
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	char name[160], err[1024], sql[300];
	app_name(r, th->name, name, sizeof(name));
	struct pgconn_options o = {
	    .conninfo = cfg->listen_database_url ? cfg->listen_database_url
						 : cfg->database_url,
	    .application_name = name,
	    .statement_timeout_ms = cfg->statement_timeout_ms,
	};
	int64_t backoff = RECONNECT_MIN_MS;
	/* The channel of sql/002's trigger: hashed from the table's name. */
	snprintf(
	    sql, sizeof(sql),
	    "SELECT format('LISTEN %%I', 'outbox_wakeup_' || hashtext(%s))",
	    channel);
	while (!stopping(r)) {
		PGconn *conn = pgconn_connect(&o, err, sizeof(err));
		if (conn) {
			PGresult *res = PQexec(conn, sql);
			if (PQresultStatus(res) == PGRES_TUPLES_OK) {
				char listen[128];
				snprintf(listen, sizeof(listen), "%s",
					 PQgetvalue(res, 0, 0));
				PQclear(res);
				res = PQexec(conn, listen);
			}
			bool ok = PQresultStatus(res) == PGRES_COMMAND_OK;
			if (!ok)
				pgconn_error(conn, res, err, sizeof(err));
			PQclear(res);
			if (ok) {
				/* Rows inserted while we were not listening
				 * would otherwise wait for the poll interval.
				 */
				relay_wake(r);
				return conn;
			}
			PQfinish(conn);
		}
		log_warn("listener: %s", err);
		relay_idle(th, backoff, NULL, NULL);
		backoff = backoff * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS
							 : backoff * 2;
	}
	return NULL;
}

/* Reports pg_notification_queue_usage(): a listener that falls behind
 * fills the queue, and then producers' commits fail. */
static bool listen_usage(PGconn *conn)
{
	PGresult *res =
	    PQexec(conn, "SELECT (pg_notification_queue_usage() * 1e6)"
			 "::bigint::text");
	bool ok = PQresultStatus(res) == PGRES_TUPLES_OK;
	if (ok)
		metrics_set(MG_NOTIFY_QUEUE_PPM,
			    strtoll(PQgetvalue(res, 0, 0), NULL, 10));
	PQclear(res);
	return ok;
}

/* LISTENs on a direct connection and wakes idle workers on every
 * notification. It never opens a transaction; polling stays the fallback,
 * so a lost notification costs at most the poll interval. */
static void *listener_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	char channel[160]; /* the table's SQL literal */
	struct outbox_table t;
	char err[256];
	log_set_thread(th->name);
	if (table_parse(r->cfg->table, &t, err, sizeof(err)) != 0) {
		log_error("listener: %s", err);
		return NULL;
	}
	snprintf(channel, sizeof(channel), "%s", t.literal);
	PGconn *conn = listen_connect(th, channel);
	int64_t next_usage = 0;
	while (conn && !stopping(r)) {
		tick(th);
		struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};
		int ready = poll(&pfd, 1, 1000);
		bool healthy = ready >= 0 && PQconsumeInput(conn) == 1;
		/* The usage query first: notifications that come in with its
		 * reply are queued inside libpq, and the socket would not
		 * show them to the next poll(). */
		if (healthy && clock_ms() >= next_usage) {
			healthy = listen_usage(conn);
			next_usage = clock_ms() + LISTEN_USAGE_EVERY_MS;
		}
		if (healthy) {
			bool woke = false;
			PGnotify *n;
			while ((n = PQnotifies(conn)) != NULL) {
				woke = true;
				PQfreemem(n);
			}
			if (woke)
				relay_wake(r);
		}
		if (!healthy || PQstatus(conn) != CONNECTION_OK) {
			log_warn("listener lost its connection; reconnecting");
			PQfinish(conn);
			metrics_add(MC_DB_RECONNECTS, 1);
			conn = listen_connect(th, channel);
		}
	}
	if (conn)
		PQfinish(conn);
	log_info("listener stopped");
	return NULL;
}

/* ---- lifecycle ---- */

int relay_init(struct relay *r, const struct config *cfg,
	       const struct publisher_ops *pub, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	r->cfg = cfg;
	r->pub = pub;
	r->pid = (int)getpid();
	snprintf(r->version, sizeof(r->version), "%s", OUTBOX_VERSION);
	if (gethostname(r->host, sizeof(r->host)) != 0)
		snprintf(r->host, sizeof(r->host), "unknown");
	r->host[sizeof(r->host) - 1] = '\0';
	if (cfg->workers < 1 || cfg->workers > RELAY_MAX_THREADS - 8) {
		snprintf(err, errlen, "workers %d is out of range",
			 cfg->workers);
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
	for (int i = 0; i < cfg->workers; i++) {
		char name[32];
		snprintf(name, sizeof(name), "worker-%d", i);
		starts[n].fn = worker_main;
		starts[n++].th = add_thread(r, name, i, worker_max);
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
			snprintf(err, errlen, "cannot start thread %s: %s",
				 starts[i].th->name, strerror(rc));
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
