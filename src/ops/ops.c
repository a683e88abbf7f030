/* SPDX-License-Identifier: MIT */
/*
 * The operating surface of a running relay: /healthz, /readyz and
 * /metrics, and the ops thread (registry heartbeat, SQL-backed gauges,
 * the Postgres check behind readiness) on its own session.
 */
#include "ops.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "http.h"
#include "metrics_sources.h"
#include "metrics_text.h"
#include "registries.h"
#include "store/store.h"

#define HEARTBEAT_MS 3000
#define GAUGES_MS 5000
#define RECONNECT_MS 1000
/* Readiness wants a statement that succeeded at most this long ago: a
 * heartbeat is due every HEARTBEAT_MS, so two missed ones mean trouble. */
#define DB_FRESH_MS 10000
/* How long ops_stop waits for the thread (it may be inside a connect to
 * an unreachable server) before leaving it to process exit. */
#define STOP_WAIT_MS 3000
/* The gauge query must never queue behind DDL or a table lock; it tries
 * again next interval instead. */
#define OPS_LOCK_TIMEOUT_MS 1000

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/*
 * One per process: main starts the operating surface once. Sharing: the
 * atomics are written by the ops thread (db_ok, db_ok_ms, tick_ms) or
 * main (stop, draining) and read by the HTTP thread; wake is touched
 * only under lock; first_db_check only by the ops thread (after main set
 * it before starting that thread); everything else is written before the
 * threads start.
 */
static struct ops_state {
	struct relay *relay;
	struct http_server *http;
	char id[160]; /* registry id: host/pid */
	pthread_t thread;
	bool thread_started;
	bool inited;	     /* lock and cond exist */
	int64_t max_tick_ms; /* /healthz limit for the ops thread */

	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool wake; /* under lock: draining or stop requested */
	/* Only the ops thread: no check has failed or passed yet. */
	bool first_db_check;

	atomic_int stop;
	atomic_int draining;
	atomic_int db_ok;
	atomic_llong db_ok_ms;
	atomic_llong tick_ms;
} ops;

/* ---- HTTP endpoints ---- */

static void reply_printf(struct http_reply *reply, unsigned int status,
			 const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void reply_printf(struct http_reply *reply, unsigned int status,
			 const char *fmt, ...)
{
	char text[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	http_reply_text(reply, status, text);
}

static void healthz(struct http_reply *reply)
{
	char why[256];
	if (atomic_load(&ops.draining)) {
		/* Loops stop ticking as they finish; a shutdown that hangs is
		 * ended by main's own deadline, not by a liveness probe. */
		http_reply_text(reply, 200, "ok: shutting down\n");
		return;
	}
	if (!relay_healthy(ops.relay, why, sizeof(why))) {
		reply_printf(reply, 503, "unhealthy: %s\n", why);
		return;
	}
	int64_t age = clock_ms() - atomic_load(&ops.tick_ms);
	if (age > ops.max_tick_ms) {
		reply_printf(reply, 503,
			     "unhealthy: loop ops has not ticked for %lld ms "
			     "(limit %lld ms)\n",
			     (long long)age, (long long)ops.max_tick_ms);
		return;
	}
	http_reply_text(reply, 200, "ok\n");
}

static void readyz(struct http_reply *reply)
{
	struct relay *r = ops.relay;
	if (atomic_load(&ops.draining)) {
		http_reply_text(reply, 503, "not ready: shutting down\n");
		return;
	}
	/* Which dependency is down, never where it is or as whom: anyone
	 * who reaches the port reads this. The log has the details. */
	if (!atomic_load(&ops.db_ok)) {
		http_reply_text(reply, 503,
				"not ready: postgres: unreachable\n");
		return;
	}
	int64_t age = clock_ms() - atomic_load(&ops.db_ok_ms);
	if (age > DB_FRESH_MS) {
		reply_printf(reply, 503,
			     "not ready: postgres: no statement succeeded for "
			     "%lld ms\n",
			     (long long)age);
		return;
	}
	if (!relay_publisher_ready(r)) {
		reply_printf(reply, 503, "not ready: publisher %s: unhealthy\n",
			     relay_publisher_name(r));
		return;
	}
	http_reply_text(reply, 200, "ready\n");
}

static void metrics(struct http_reply *reply)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f) {
		http_reply_text(reply, 500, "out of memory\n");
		return;
	}
	metrics_text_render(f);
	metrics_sources_render(f, ops.relay);
	if (fclose(f) != 0) {
		free(buf);
		http_reply_text(reply, 500, "out of memory\n");
		return;
	}
	reply->status = 200;
	reply->content_type = METRICS_CONTENT_TYPE;
	reply->body = buf;
	reply->len = len;
}

static void handle(void *arg, const char *path, struct http_reply *reply)
{
	(void)arg;
	if (strcmp(path, "/healthz") == 0)
		healthz(reply);
	else if (strcmp(path, "/readyz") == 0)
		readyz(reply);
	else if (strcmp(path, "/metrics") == 0)
		metrics(reply);
	else
		http_reply_text(reply, 404,
				"not found: try /healthz, /readyz or "
				"/metrics\n");
}

/* ---- the ops thread ---- */

/* Records the outcome of a Postgres check; logs only the changes, with
 * the reason (which /readyz leaves out). */
static void set_db(bool ok, const char *why)
{
	if (ok) {
		atomic_store(&ops.db_ok_ms, clock_ms());
		ops.first_db_check = false;
	}
	int was = atomic_exchange(&ops.db_ok, ok ? 1 : 0);
	if (!ok && ops.first_db_check) {
		/* Not yet connected once: the first failure is told too. */
		ops.first_db_check = false;
		log_fields(LOG_WARN, "postgres check failed: not ready",
			   "error", why, NULL);
	} else if (was && !ok)
		log_fields(LOG_WARN, "postgres check failed: not ready",
			   "error", why, NULL);
	else if (!was && ok)
		log_info("postgres check ok");
}

/* database: the listed database whose read named g->horizon's holder
 * ("" without OUTBOX_DATABASES). */
static void publish_gauges(const struct store_gauges *g, const char *database)
{
	metrics_set(MG_BACKLOG, g->backlog);
	metrics_set(MG_OLDEST_PENDING_MS, g->oldest_pending_ms);
	metrics_set(MG_IN_FLIGHT, g->in_flight);
	metrics_set(MG_FAILED_ROWS, g->failed);
	metrics_set(MG_DEAD_TUPLES, g->dead_tuples);
	metrics_set(MG_LIVE_REPLICAS, g->live_replicas);
	metrics_set(MG_BLOCKED_KEYS, g->blocked_keys);
	const struct store_horizon *h = &g->horizon;
	metrics_set(MG_XMIN_HORIZON_AGE_MS, h->age_ms);
	metrics_set(MG_XMIN_HORIZON_XMIN_AGE, h->xmin_age);
	metrics_set(MG_XMIN_AGE_SESSIONS, g->xmin_age_sessions);
	metrics_set(MG_XMIN_AGE_SLOTS, g->xmin_age_slots);
	metrics_set(MG_XMIN_AGE_PREPARED, g->xmin_age_prepared);
	metrics_publish_horizon_holder(h->kind, h->name, h->pid, h->age_ms,
				       h->kind[0] ? database : "");
}

/* The ops thread is alive (/healthz). */
static void tick(void)
{
	atomic_store(&ops.tick_ms, clock_ms());
}

/* Sleeps until the monotonic time until_ms, stop, or draining. */
static void ops_sleep(int64_t until_ms)
{
	pthread_mutex_lock(&ops.lock);
	while (!ops.wake) {
		int64_t now = clock_ms();
		if (now >= until_ms)
			break;
		/* Wake at least every second to keep the tick fresh. */
		int64_t slice = until_ms - now < 1000 ? until_ms - now : 1000;
		struct timespec ts = clock_monotonic_after(slice);
		pthread_cond_timedwait(&ops.cond, &ops.lock, &ts);
		tick();
	}
	ops.wake = false;
	pthread_mutex_unlock(&ops.lock);
}

static int64_t min64(int64_t a, int64_t b)
{
	return a < b ? a : b;
}

/* The ops thread's session and its schedule. */
struct ops_session {
	struct relay *relay;
	struct store *s;
	bool connected, starting, draining_sent;
	bool gauges_failing, beat_failing;
	bool notify_unread; /* the last gauges lacked the NOTIFY queue's */
	bool side_checked;  /* the side tables were looked at (and told) */
	bool registry;	    /* the replica registry table exists */
	int64_t next_beat, next_gauges, next_connect;
	/* The pending index's counters at the last gauge refresh, and what
	 * the gauge statements themselves added to them then. */
	int64_t idx_before[3], idx_own[3];
	bool idx_known;
	size_t source; /* the source whose table and database it uses */
	bool has_source;
	unsigned epoch; /* relay_source_epoch() of source as it connected */
	struct registries *regs; /* the other sources' registries */
	/* Moves to another source since a heartbeat last worked: once
	 * every source was tried, the next round waits RECONNECT_MS, and
	 * its moves are not told again (quiet). */
	size_t moves;
	bool quiet;
	char err[1024];
};

static void lose_session(struct ops_session *o)
{
	/* Its database's dead tuples are unknown until it is back (the
	 * other databases' go with their own sessions, registries.c). */
	for (size_t i = 0; o->has_source && i < relay_sources_n(o->relay); i++)
		if (relay_source_db(o->relay, i) ==
		    relay_source_db(o->relay, o->source))
			relay_note_dead_tuples(o->relay, i, -1);
	set_db(false, o->err);
	o->connected = false;
	o->next_connect = clock_ms();
}

/*
 * A table made by hand may lack its side tables (store.h): said once, at
 * the first connect, with what is off and how to get it; then silence.
 * Without the registry this replica neither beats nor leaves it, and
 * counts itself as the one live replica it can vouch for.
 */
static void check_side_tables(struct ops_session *o)
{
	unsigned present = 0;
	char tables[512], features[512];
	if (store_admin_side_tables(o->s, &present, o->err, sizeof(o->err)) !=
	    0) {
		/* Unknown: behave as with the registry; its errors say why. */
		o->registry = true;
		return;
	}
	o->registry = (present & STORE_SIDE_REPLICAS) != 0;
	if (o->side_checked)
		return;
	o->side_checked = true;
	store_side_tables_describe(o->s, present, tables, sizeof(tables),
				   features, sizeof(features));
	if (tables[0])
		log_fields(LOG_WARN,
			   "side tables missing: these features are off; "
			   "`outbox-relay migrate` creates the tables (then "
			   "restart the relay)",
			   "missing", tables, "off", features, NULL);
}

/* Points so at source i's table and database. */
static void use_source(struct ops_session *o, struct store_options *so,
		       size_t i)
{
	struct relay *r = o->relay;
	o->source = i;
	o->has_source = true;
	/* The last refresh's index counters were another table's: the
	 * difference to this one's would be one arbitrary sample. */
	o->idx_known = false;
	/* Another database, maybe: its NOTIFY gauge gets its own 0 if
	 * unread there too. */
	o->notify_unread = false;
	so->table = relay_source_table(r, i);
	so->conninfo =
	    config_database_url(relay_config(r), relay_source_db(r, i));
}

/*
 * Of several sources, the next one (not gone) after the session's, for
 * the ops session: a source whose table fails must not take readiness,
 * the registry and the gauges with it, nor one whose database is down
 * (other_db: then the next of another database). False when there is
 * none (docs/design.md §13).
 */
static bool next_source(struct ops_session *o, struct store_options *so,
			bool other_db)
{
	struct relay *r = o->relay;
	size_t n = relay_sources_n(r), at = o->source;
	for (size_t k = 1; k < n; k++) {
		size_t i = (at + k) % n;
		if (relay_source_gone(r, i) ||
		    (other_db &&
		     relay_source_db(r, i) == relay_source_db(r, at)))
			continue;
		use_source(o, so, i);
		return true;
	}
	return false;
}

/* Moves to the next source (next_source()) unless every source has been
 * tried since a heartbeat last worked: sources that all fail must not
 * spin the thread through them, each try a connection, a log line and a
 * backend fork for a recovering server. */
static bool move_on(struct ops_session *o, struct store_options *so,
		    bool other_db)
{
	size_t from_db = relay_source_db(o->relay, o->source);
	if (o->moves + 1 >= relay_sources_n(o->relay) ||
	    !next_source(o, so, other_db))
		return false;
	o->moves++;
	if (!o->quiet)
		log_fields(LOG_WARN, "the ops session moves to another source",
			   "error", o->err, "source",
			   relay_source_name(o->relay, o->source), NULL);
	/* The stores that shared the session it leaves, and those of the
	 * database it goes to, which are to share its new one. */
	registries_close_db(o->regs, o->relay, from_db);
	registries_close_db(o->regs, o->relay,
			    relay_source_db(o->relay, o->source));
	store_close(o->s);
	o->s = NULL;
	o->connected = false;
	o->next_connect = clock_ms();
	return true;
}

/* No source served in a whole round: not ready, and the next round after
 * RECONNECT_MS. */
static void round_failed(struct ops_session *o)
{
	set_db(false, o->err);
	o->moves = 0;
	o->quiet = true;
	o->next_connect = clock_ms() + RECONNECT_MS;
}

static void try_connect(struct ops_session *o, struct store_options *so,
			int64_t now)
{
	o->epoch = relay_source_epoch(o->relay, o->source);
	int rc = o->s ? store_reconnect(o->s, o->err, sizeof(o->err))
		      : store_open(&o->s, so, o->err, sizeof(o->err));
	o->connected = rc == 0;
	if (o->connected) {
		check_side_tables(o);
		o->next_beat = now;
		return;
	}
	/* Postgres answered about this table, or this database is out of
	 * reach: another may serve. */
	bool several_dbs = config_n_databases(relay_config(o->relay)) > 1;
	if ((rc != STORE_RECONNECT && move_on(o, so, false)) ||
	    (rc == STORE_RECONNECT && several_dbs && move_on(o, so, true)))
		return;
	round_failed(o);
}

static void beat(struct ops_session *o, struct store_options *so, bool draining)
{
	/* Without a registry the statement that answers is a plain check,
	 * which readiness needs all the same. */
	unsigned present;
	const struct config *cfg = relay_config(ops.relay);
	struct store_kept kept = {.sent_ms = cfg->retention_ms,
				  .failed_ms = cfg->failed_retention_ms};
	int rc = o->registry
		     ? store_admin_heartbeat(o->s, ops.id, OUTBOX_VERSION, kept,
					     draining, o->starting, o->err,
					     sizeof(o->err))
		     : store_admin_side_tables(o->s, &present, o->err,
					       sizeof(o->err));
	/* A failed draining heartbeat is retried with the regular ones, not
	 * in a tight loop. */
	o->draining_sent = draining;
	bool table_gone = rc != 0 && strstr(o->err, "42P01");
	if (rc == 0) {
		o->starting = false;
		o->moves = 0;
		o->quiet = false;
		if (o->beat_failing)
			log_info("registry heartbeat ok again");
		o->beat_failing = false;
		set_db(true, NULL);
	} else if (rc == STORE_RECONNECT) {
		lose_session(o);
	} else if (table_gone && move_on(o, so, false)) {
		/* Its table is gone (dropped with its tenant, say): the
		 * registry, the gauges and readiness move to another
		 * source instead of failing with this one. */
	} else {
		/* Postgres answered: readiness stays, the error (a missing
		 * grant, a timeout) is told once. A table gone from every
		 * source this round: the next beat starts another. */
		if (table_gone)
			o->moves = 0;
		if (!o->beat_failing)
			log_fields(LOG_WARN, "registry heartbeat failed",
				   "error", o->err, NULL);
		o->beat_failing = true;
		set_db(true, NULL);
	}
	o->next_beat = clock_ms() + HEARTBEAT_MS;
	/* After its own, which readiness and its schedule go by. */
	struct registry_beat others = {.id = ops.id,
				       .version = OUTBOX_VERSION,
				       .kept = kept,
				       .draining = draining,
				       .tick = tick};
	if (o->connected && relay_sources_n(o->relay) > 1 &&
	    registries_beat(o->regs, o->relay, o->s, o->source, so, &others,
			    o->err, sizeof(o->err)) == STORE_RECONNECT)
		lose_session(o);
}

static void refresh_gauges(struct ops_session *o)
{
	struct store_gauges g;
	int64_t t0 = clock_ms();
	int rc = store_admin_gauges(o->s, &g, o->err, sizeof(o->err));
	int64_t took = clock_ms() - t0;
	int dead_rc = 0;
	if (rc == 0) {
		if (!o->registry)
			g.live_replicas = 1;
		size_t ops_db = relay_source_db(o->relay, o->source);
		size_t held_in = ops_db;
		if (relay_sources_n(o->relay) > 1) {
			registries_horizons(o->regs, o->relay, ops_db, &g,
					    &held_in, tick);
			dead_rc = registries_dead_tuples(
			    o->regs, o->relay, ops_db, o->s, tick, o->err,
			    sizeof(o->err));
			/* The pause after paces every database's read. */
			took = clock_ms() - t0;
		} else {
			relay_note_dead_tuples(o->relay, 0, g.dead_tuples);
		}
		publish_gauges(
		    &g, config_database_name(relay_config(o->relay), held_in));
		/* Unread (the function refused): 0 once, not a value
		 * frozen from before, which could hold the alert on. */
		if (o->has_source &&
		    (g.notify_queue_ppm >= 0 || !o->notify_unread))
			relay_note_notify_usage(
			    o->relay, relay_source_db(o->relay, o->source),
			    g.notify_queue_ppm >= 0 ? g.notify_queue_ppm : 0);
		o->notify_unread = g.notify_queue_ppm < 0;
		int64_t idx[3] = {g.pending_idx_scans, g.pending_idx_read,
				  g.pending_idx_fetched};
		int64_t per_scan = o->idx_known
				       ? metrics_dead_entries_per_scan_milli(
					     o->idx_before, idx, o->idx_own)
				       : -1;
		if (per_scan >= 0)
			metrics_set(MG_LEASE_DEAD_ENTRIES_MILLI, per_scan);
		memcpy(o->idx_before, idx, sizeof(idx));
		o->idx_own[0] = g.own_idx_scans;
		o->idx_own[1] = g.own_idx_read;
		o->idx_own[2] = g.own_idx_fetched;
		o->idx_known = true;
		if (o->gauges_failing)
			log_info("gauge query ok again");
		o->gauges_failing = false;
	} else {
		/* Stale gauges are better than a log line every five
		 * seconds. */
		if (!o->gauges_failing)
			log_fields(LOG_WARN,
				   "gauge query failed; gauges keep their "
				   "last values",
				   "error", o->err, NULL);
		o->gauges_failing = true;
		/* One table, dropped: no series, as for a table of several
		 * not there. */
		if (relay_sources_n(o->relay) == 1 && strstr(o->err, "42P01"))
			relay_note_dead_tuples(o->relay, 0, -1);
		if (rc == STORE_RECONNECT)
			lose_session(o);
	}
	/* Lost after the gauge query: readiness says so now, not at the
	 * next heartbeat. */
	if (dead_rc == STORE_RECONNECT)
		lose_session(o);
	o->next_gauges = clock_ms() + metrics_gauge_pause_ms(GAUGES_MS, took);
}

static void *ops_main(void *arg)
{
	struct relay *r = arg;
	char name[160];
	struct ops_session o = {
	    .relay = r, .starting = true, .regs = registries_new()};

	log_set_thread("ops");
	snprintf(name, sizeof(name), "outbox-relay/%s/ops", relay_host(r));
	struct store_options so =
	    store_options_from_config(relay_config(r), name, NULL);
	/* Operator statements are few and varied: unnamed, never prepared. */
	so.prepare = false;
	so.lock_timeout_ms = OPS_LOCK_TIMEOUT_MS;

	while (!atomic_load(&ops.stop)) {
		int64_t now = clock_ms();
		atomic_store(&ops.tick_ms, now);
		bool draining = atomic_load(&ops.draining) != 0;

		/* The registry and the gauges live in the first source's
		 * table (with patterns only, the first table found) until
		 * it fails. */
		if (!o.has_source && relay_sources_n(r) > 0)
			use_source(&o, &so, 0);
		/* Its table made anew (docs/design.md §13): opened and
		 * checked again, as are the registries that share its
		 * session. */
		if (o.s && o.has_source &&
		    o.epoch != relay_source_epoch(r, o.source)) {
			registries_close_db(o.regs, r,
					    relay_source_db(r, o.source));
			store_close(o.s);
			o.s = NULL;
			o.connected = false;
			o.next_connect = now;
		}
		if (!o.connected && now >= o.next_connect && o.has_source)
			try_connect(&o, &so, now);
		if (o.connected &&
		    (now >= o.next_beat || (draining && !o.draining_sent)))
			beat(&o, &so, draining);
		if (o.connected && clock_ms() >= o.next_gauges)
			refresh_gauges(&o);
		/* No source yet (a pattern that matches no table so far):
		 * look again in a second, not at once. */
		int64_t until = o.connected ? min64(o.next_beat, o.next_gauges)
				: o.has_source ? o.next_connect
					       : now + 1000;
		if (draining && !o.draining_sent && o.connected)
			until = clock_ms();
		ops_sleep(until);
	}

	/* A replica that stopped cleanly leaves the registry; one that
	 * vanished stays there, shown dead, until pruned. */
	if (o.connected && o.registry &&
	    store_admin_forget(o.s, ops.id, o.err, sizeof(o.err)) != 0)
		log_warn("leaving the replica registry failed: %s", o.err);
	if (o.has_source)
		registries_forget(o.regs, r, o.source, o.connected, ops.id);
	registries_free(o.regs);
	store_close(o.s);
	return NULL;
}

static void wake_thread(void)
{
	if (!ops.inited)
		return;
	pthread_mutex_lock(&ops.lock);
	ops.wake = true;
	pthread_cond_signal(&ops.cond);
	pthread_mutex_unlock(&ops.lock);
}

int ops_start(struct relay *r, char *err, size_t errlen)
{
	const struct config *cfg = relay_config(r);
	pthread_condattr_t ca;

	ops.relay = r;
	relay_replica_id(r, ops.id, sizeof(ops.id));
	/* Connect (connect_timeout plus tcp_user_timeout) and two
	 * statements bound one pass of the loop. */
	ops.max_tick_ms = 30000 + 2 * cfg->statement_timeout_ms;
	atomic_store(&ops.stop, 0);
	atomic_store(&ops.draining, 0);
	atomic_store(&ops.db_ok, 0);
	atomic_store(&ops.tick_ms, clock_ms());
	ops.first_db_check = true;

	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	if (pthread_mutex_init(&ops.lock, NULL) != 0 ||
	    pthread_cond_init(&ops.cond, &ca) != 0) {
		pthread_condattr_destroy(&ca);
		snprintf(err, errlen, "ops: cannot create locks");
		return -1;
	}
	pthread_condattr_destroy(&ca);
	ops.inited = true;

	if (cfg->http_addr && cfg->http_addr[0]) {
		if (http_start(&ops.http, cfg->http_addr, handle, NULL, err,
			       errlen) != 0)
			goto fail;
		char port[16];
		snprintf(port, sizeof(port), "%d", http_port(ops.http));
		log_fields(LOG_INFO, "http listening", "addr", cfg->http_addr,
			   "port", port, NULL);
	}
	int rc = pthread_create(&ops.thread, NULL, ops_main, r);
	if (rc != 0) {
		char why[128];
		snprintf(err, errlen, "cannot start thread ops: %s",
			 strerror_r(rc, why, sizeof(why)));
		goto fail;
	}
	ops.thread_started = true;
	return 0;
fail:
	http_stop(ops.http);
	ops.http = NULL;
	pthread_mutex_destroy(&ops.lock);
	pthread_cond_destroy(&ops.cond);
	ops.inited = false;
	return -1;
}

void ops_draining(struct relay *r)
{
	(void)r;
	atomic_store(&ops.draining, 1);
	wake_thread();
}

bool ops_stop(struct relay *r)
{
	(void)r;
	atomic_store(&ops.stop, 1);
	wake_thread();
	http_stop(ops.http);
	ops.http = NULL;
	if (ops.thread_started) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += STOP_WAIT_MS / 1000;
		if (pthread_timedjoin_np(ops.thread, NULL, &ts) != 0) {
			/* Stuck connecting to an unreachable server: the
			 * process is exiting, which ends the thread. */
			log_warn("ops thread did not stop within %d ms; "
				 "leaving it",
				 STOP_WAIT_MS);
			return false;
		}
		ops.thread_started = false;
	}
	if (ops.inited) {
		pthread_mutex_destroy(&ops.lock);
		pthread_cond_destroy(&ops.cond);
		ops.inited = false;
	}
	return true;
}
