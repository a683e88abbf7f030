/* SPDX-License-Identifier: MIT */
/*
 * The outbox tables a relay serves, its sources (OUTBOX_TABLE,
 * docs/design.md §13): each loop thread's stores of them on one session,
 * a source that fails set aside while the others go on, and the
 * round-robin of a worker's lease turns across the sources with due rows.
 * Uses loop.c only.
 */
#include "loops_int.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "config/config.h"

/* A failing source is tried again after this, doubling up to the max. */
#define SOURCE_RETRY_MIN_MS 1000
#define SOURCE_RETRY_MAX_MS 30000

/* struct source_list keeps a source's database index in a byte. */
_Static_assert(CONFIG_DATABASES_MAX <= 255, "source_list.db");

/* An open store of ss in database db, one not set aside first (a source
 * set aside may be so because its table's check fails), never a gone
 * one's (its table's check fails at the session's next connect); NULL
 * when none. */
static struct store *store_of_db(struct relay *r,
				 const struct source_stores *ss, size_t db,
				 bool healthy)
{
	size_t n = relay_sources_n(r);
	for (size_t i = 0; i < n && i < ss->n; i++)
		if (ss->at[i].store && relay_source_db(r, i) == db &&
		    (!healthy || !ss->at[i].failing) &&
		    !relay_source_gone(r, i))
			return ss->at[i].store;
	return NULL;
}

/* ---- the relay's list of sources ---- */

int source_list_init(struct source_list *l, const struct config *cfg)
{
	memset(l, 0, sizeof(*l));
	size_t literal = 0, dbs = config_n_databases(cfg);
	for (size_t i = 0; i < cfg->n_tables; i++)
		literal += !table_is_pattern(cfg->tables[i]);
	l->several_databases = dbs > 1;
	l->cfg = cfg;
	/* Room for every listed table in every database, and with a
	 * pattern for RELAY_MAX_SOURCES more: a list bigger than that
	 * (64 databases of 200 tables) lost its last tables silently. */
	l->cap =
	    literal * dbs + (config_has_patterns(cfg) ? RELAY_MAX_SOURCES : 0);
	if (l->cap == 0)
		l->cap = 1;
	l->names = calloc(l->cap, sizeof(*l->names));
	l->table_at = calloc(l->cap, sizeof(*l->table_at));
	l->db = calloc(l->cap, sizeof(*l->db));
	l->gone = calloc(l->cap, sizeof(*l->gone));
	l->oid = calloc(l->cap, sizeof(*l->oid));
	l->epoch = calloc(l->cap, sizeof(*l->epoch));
	if (!l->names || !l->table_at || !l->db || !l->gone || !l->oid ||
	    !l->epoch || pthread_mutex_init(&l->lock, NULL) != 0) {
		free(l->names);
		free(l->table_at);
		free(l->db);
		free(l->gone);
		free(l->oid);
		free(l->epoch);
		memset(l, 0, sizeof(*l));
		return -1;
	}
	for (size_t i = 0; i < l->cap; i++) {
		atomic_init(&l->gone[i], false);
		atomic_init(&l->epoch[i], 0);
	}
	atomic_init(&l->n, 0);
	/* Database by database: a worker's round-robin then meets them in
	 * this order too. */
	for (size_t d = 0; d < dbs; d++) {
		for (size_t i = 0; i < cfg->n_tables; i++) {
			size_t at;
			enum source_found found;
			if (!table_is_pattern(cfg->tables[i]))
				source_list_add(l, d, cfg->tables[i], 0, &at,
						&found);
		}
	}
	return 0;
}

void source_list_free(struct source_list *l)
{
	if (!l->names)
		return;
	pthread_mutex_destroy(&l->lock);
	free(l->names);
	free(l->table_at);
	free(l->db);
	free(l->gone);
	free(l->oid);
	free(l->epoch);
	memset(l, 0, sizeof(*l));
}

bool source_list_add(struct source_list *l, size_t db, const char *table,
		     uint32_t oid, size_t *index, enum source_found *found)
{
	char name[SOURCE_NAME_MAX];
	size_t table_at = 0;
	if (l->several_databases) {
		snprintf(name, sizeof(name), "%s/",
			 config_database_name(l->cfg, db));
		table_at = strlen(name);
	}
	snprintf(name + table_at, sizeof(name) - table_at, "%s", table);
	bool ok = true;
	*found = SOURCE_KNOWN;
	pthread_mutex_lock(&l->lock);
	size_t n = atomic_load(&l->n);
	size_t i = 0;
	while (i < n && strcmp(l->names[i], name) != 0)
		i++;
	if (i < n) {
		if (atomic_load(&l->gone[i]))
			*found = SOURCE_BACK;
		else if (oid && l->oid[i] && oid != l->oid[i])
			*found = SOURCE_REMADE;
		if (oid)
			l->oid[i] = oid;
		/* A table back may be one made anew too, and a thread
		 * that did not look while it was gone still has the old
		 * one's store. The epoch moves before the source is back:
		 * a thread that sees it back sees the new epoch. */
		if (*found != SOURCE_KNOWN)
			atomic_fetch_add(&l->epoch[i], 1);
		atomic_store(&l->gone[i], false);
	} else if (n < l->cap) {
		memcpy(l->names[n], name, sizeof(name));
		l->table_at[n] = (unsigned char)table_at;
		l->db[n] = (unsigned char)db;
		l->oid[n] = oid;
		*found = SOURCE_ADDED;
		/* Published after it is written: readers load n with
		 * acquire and read names below it without the lock. */
		atomic_store_explicit(&l->n, n + 1, memory_order_release);
	} else {
		ok = false;
	}
	*index = i;
	pthread_mutex_unlock(&l->lock);
	return ok;
}

size_t relay_sources_n(struct relay *r)
{
	return atomic_load_explicit(&r->sources.n, memory_order_acquire);
}

const char *relay_source_name(struct relay *r, size_t i)
{
	return r->sources.names[i];
}

const char *relay_source_table(struct relay *r, size_t i)
{
	return r->sources.names[i] + r->sources.table_at[i];
}

size_t relay_source_db(struct relay *r, size_t i)
{
	return r->sources.db[i];
}

void source_log_counts(enum log_level level, const char *msg, struct relay *r,
		       size_t i, const char *k1, size_t v1, const char *k2,
		       size_t v2)
{
	char a[32], b[32];
	snprintf(a, sizeof(a), "%zu", v1);
	snprintf(b, sizeof(b), "%zu", v2);
	log_fields(level, msg, "source", relay_source_name(r, i), k1, a, k2, b,
		   NULL);
}

void source_note_lag(struct relay *r, size_t i, const struct lease_batch *b)
{
	int64_t oldest = INT64_MAX;
	for (size_t k = 0; k < b->n; k++)
		if (b->events[k].created_at_us < oldest)
			oldest = b->events[k].created_at_us;
	int64_t now = clock_wall_us();
	/* Unsigned: a created_at of '-infinity' lies further back
	 * than a signed difference reaches (undefined); in ms it fits. */
	int64_t lag = b->n && now > oldest
			  ? (int64_t)(((uint64_t)now - (uint64_t)oldest) / 1000)
			  : 0;
	atomic_store(&r->source_stats[i].lag_ms, lag);
}

void relay_note_dead_tuples(struct relay *r, size_t i, int64_t n)
{
	atomic_store(&r->source_stats[i].dead_tuples, n);
}

void relay_source_stats(struct relay *r, size_t i,
			struct relay_source_stats *out)
{
	struct source_stats *st = &r->source_stats[i];
	out->sent = atomic_load(&st->sent);
	out->retried = atomic_load(&st->retried);
	out->failed = atomic_load(&st->failed);
	out->failing = atomic_load(&st->failing) > 0;
	out->lag_ms = atomic_load(&st->lag_ms);
	out->dead_tuples = atomic_load(&st->dead_tuples);
	out->gone = relay_source_gone(r, i);
}

bool relay_source_gone(struct relay *r, size_t i)
{
	return atomic_load(&r->sources.gone[i]);
}

unsigned relay_source_epoch(struct relay *r, size_t i)
{
	return atomic_load(&r->sources.epoch[i]);
}

bool sources_gated(struct relay *r)
{
	return r->sources.cap > SOURCES_POLLED_MAX;
}

void relay_source_set_gone(struct relay *r, size_t i, bool gone)
{
	/* Found again, its lag is its next lease's, not the one it had
	 * when it went (a lane's lease that ended after the table went may
	 * have noted one since). */
	atomic_store(&r->source_stats[i].lag_ms, 0);
	atomic_store(&r->sources.gone[i], gone);
}

/* Marks this thread's store of source i failing, counted for /metrics
 * (relay_source_stats) once per thread until it works again. */
static void mark_failing(struct relay *r, struct source_store *at, size_t i)
{
	if (!at->failing)
		atomic_fetch_add(&r->source_stats[i].failing, 1);
	at->failing = true;
}

/* Sets source i aside until its backoff passes; logs the first failure of
 * a streak as a warning, the rest at debug level. */
static void set_aside(struct relay *r, struct source_stores *ss, size_t i,
		      const char *what, const char *err)
{
	struct source_store *at = &ss->at[i];
	if (ss->n == 1 && strcmp(what, "open") == 0)
		/* A relay of one table says so on every try, as ever. */
		log_error("%s", err);
	else if (ss->n == 1)
		log_warn("%s failed: %s", what, err);
	else if (!at->failing)
		log_fields(LOG_WARN, "source failing; the others go on",
			   "source", relay_source_name(r, i), "what", what,
			   "error", err, NULL);
	else
		log_debug("source %s still failing: %s: %s",
			  relay_source_name(r, i), what, err);
	mark_failing(r, at, i);
	at->backoff_ms = at->backoff_ms ? loop_backoff_grow(at->backoff_ms,
							    SOURCE_RETRY_MAX_MS)
					: SOURCE_RETRY_MIN_MS;
	at->retry_ms = clock_ms() + at->backoff_ms;
}

/* Database db of source i cannot be reached (its session could not be
 * made again, or opened): every source of it waits out the same backoff
 * while the other databases' go on, with one warning for them all. */
static void set_aside_database(struct relay *r, struct source_stores *ss,
			       size_t i, const char *what, const char *why)
{
	size_t db = relay_source_db(r, i), n = relay_sources_n(r);
	set_aside(r, ss, i, what, why);
	for (size_t j = 0; j < n; j++) {
		struct source_store *at = &ss->at[j];
		if (j == i || relay_source_db(r, j) != db ||
		    relay_source_gone(r, j))
			continue;
		mark_failing(r, at, j);
		at->backoff_ms = ss->at[i].backoff_ms;
		at->retry_ms = ss->at[i].retry_ms;
	}
}

/* Tries to open source i's store on the session of ss's open ones. */
static bool try_open(struct relay_thread *th, struct source_stores *ss,
		     size_t i)
{
	struct relay *r = th->relay;
	char name[160], leased_by[160], err[1024];
	relay_app_name(r, ss->who, name, sizeof(name));
	snprintf(leased_by, sizeof(leased_by), "%s/%d/%s", r->host, r->pid,
		 ss->who);
	struct store_options o =
	    store_options_from_config(r->cfg, name, leased_by);
	size_t db = relay_source_db(r, i);
	o.table = relay_source_table(r, i);
	o.conninfo = config_database_url(r->cfg, db);
	o.rescan_pace = &r->rescan_pace[i];
	o.key_turn = &r->key_turn[i];
	o.due_turn = &r->due_turn[i];
	/* Before the open: a table made anew while it runs is met again. */
	ss->at[i].epoch = relay_source_epoch(r, i);
	int rc =
	    store_open_sharing(&ss->at[i].store, &o,
			       store_of_db(r, ss, db, false), err, sizeof(err));
	if (rc == 0) {
		sources_ok(r, ss, i);
		return true;
	}
	if (rc == STORE_RECONNECT && r->sources.several_databases)
		/* Each of its other sources would wait for a connect too. */
		set_aside_database(r, ss, i, "open", err);
	else
		set_aside(r, ss, i, "open", err);
	return false;
}

bool sources_open(struct relay_thread *th, const char *who,
		  struct source_stores *ss)
{
	struct relay *r = th->relay;
	memset(ss, 0, sizeof(*ss));
	snprintf(ss->who, sizeof(ss->who), "%s", who);
	ss->n = r->sources.cap;
	ss->at = calloc(ss->n, sizeof(*ss->at));
	if (!ss->at) {
		log_error("out of memory for %zu sources", ss->n);
		return false;
	}
	int64_t backoff = RECONNECT_MIN_MS;
	while (!relay_stopping(r)) {
		bool any = false;
		size_t n = relay_sources_n(r);
		for (size_t i = 0; i < n; i++) {
			struct source_store *at = &ss->at[i];
			/* Set aside with its database in this pass: one
			 * connect attempt a database, not one a table. */
			if (at->failing && clock_ms() < at->retry_ms)
				continue;
			any |= !relay_source_gone(r, i) && try_open(th, ss, i);
		}
		/* With patterns the tables come and go: the others are
		 * opened as they are found. */
		if (any || config_has_patterns(r->cfg))
			return true;
		/* Nothing to lease from yet: this loop's backoff, not the
		 * sources', paces the tries. */
		for (size_t i = 0; i < ss->n; i++)
			ss->at[i].retry_ms = 0;
		relay_backoff(th, backoff);
		backoff = loop_backoff_grow(backoff, RECONNECT_MAX_MS);
	}
	return false;
}

void sources_close(struct relay *r, struct source_stores *ss)
{
	for (size_t i = 0; ss->at && i < ss->n; i++) {
		store_close(ss->at[i].store);
		if (ss->at[i].failing)
			atomic_fetch_sub(&r->source_stats[i].failing, 1);
	}
	free(ss->at);
	memset(ss, 0, sizeof(*ss));
}

/* Lets a gone source go: its session goes with the last store of it, and
 * /metrics no longer counts it failing; a table of that name made again
 * is opened anew, checked. */
static void let_go(struct relay *r, struct source_store *at, size_t i)
{
	store_close(at->store);
	at->store = NULL;
	if (at->failing)
		atomic_fetch_sub(&r->source_stats[i].failing, 1);
	at->failing = false;
	at->backoff_ms = 0;
	at->retry_ms = 0;
	at->tended_ms = 0;
}

/* Whether the store of source i that at has is of another table than
 * the one now under its name. (One set aside without a store opens the
 * new table at its next try; its epoch may be older than the store it
 * never opened, as when its whole database was set aside.) */
static bool remade(struct relay *r, const struct source_store *at, size_t i)
{
	return at->store && at->epoch != relay_source_epoch(r, i);
}

void sources_let_go_gone(struct relay *r, struct source_stores *ss)
{
	size_t n = relay_sources_n(r);
	for (size_t i = 0; i < n && i < ss->n; i++)
		if (((ss->at[i].store || ss->at[i].failing) &&
		     relay_source_gone(r, i)) ||
		    remade(r, &ss->at[i], i))
			let_go(r, &ss->at[i], i);
}

struct store *sources_store(struct relay_thread *th, struct source_stores *ss,
			    size_t i)
{
	struct source_store *at = &ss->at[i];
	if (relay_source_gone(th->relay, i)) {
		let_go(th->relay, at, i);
		return NULL;
	}
	/* Its checks, flags and floors were of the table dropped. */
	if (remade(th->relay, at, i))
		let_go(th->relay, at, i);
	if (at->failing && clock_ms() < at->retry_ms)
		return NULL;
	if (!at->store && !try_open(th, ss, i))
		return NULL;
	return at->store;
}

int64_t sources_retry_ms(const struct source_stores *ss, size_t i)
{
	return ss->at[i].failing ? ss->at[i].retry_ms : 0;
}

void sources_ok(struct relay *r, struct source_stores *ss, size_t i)
{
	struct source_store *at = &ss->at[i];
	if (at->failing) {
		log_fields(LOG_INFO, "source works again", "source",
			   relay_source_name(r, i), NULL);
		atomic_fetch_sub(&r->source_stats[i].failing, 1);
	}
	at->failing = false;
	at->backoff_ms = 0;
	at->retry_ms = 0;
}

int sources_failed(struct relay_thread *th, struct source_stores *ss, size_t i,
		   int rc, const char *what, const char *err)
{
	struct relay *r = th->relay;
	struct store *s = ss->at[i].store;
	if (rc != STORE_RECONNECT || !s) {
		set_aside(r, ss, i, what, err);
		return 0;
	}
	log_warn("%s failed: %s", what, err);
	return sources_reconnect(th, ss, i);
}

int sources_reconnect(struct relay_thread *th, struct source_stores *ss,
		      size_t i)
{
	/* The session is gone, for every source of it: connect it again
	 * through source i, which then checks its table. A table that
	 * fails its check sets that source aside alone. */
	struct relay *r = th->relay;
	struct store *s = ss->at[i].store;
	int64_t backoff = RECONNECT_MIN_MS;
	char why[1024];
	while (!relay_stopping(r)) {
		int got = store_reconnect(s, why, sizeof(why));
		if (got == 0) {
			metrics_add(MC_DB_RECONNECTS, 1);
			log_info("reconnected to postgres");
			atomic_store(&r->sweep_asked, true);
			return 0;
		}
		if (got != STORE_RECONNECT) {
			metrics_add(MC_DB_RECONNECTS, 1);
			set_aside(r, ss, i, "reconnect", why);
			return 0;
		}
		if (r->sources.several_databases) {
			/* Waiting here would stop every other database's
			 * sources behind this one (docs/design.md §13). */
			set_aside_database(r, ss, i, "reconnect", why);
			return 0;
		}
		log_warn("postgres reconnect failed: %s", why);
		relay_backoff(th, backoff);
		backoff = loop_backoff_grow(backoff, RECONNECT_MAX_MS);
	}
	return -1;
}

/* ---- a worker's turns across its sources ---- */

struct source_turns *source_turns_create(size_t n)
{
	struct source_turns *t = calloc(1, sizeof(*t));
	if (!t)
		return NULL;
	t->n = n;
	t->at = calloc(n, sizeof(*t->at));
	t->counts = calloc(n, sizeof(*t->counts));
	if (!t->at || !t->counts) {
		source_turns_destroy(t);
		return NULL;
	}
	return t;
}

void source_turns_destroy(struct source_turns *t)
{
	if (!t)
		return;
	for (size_t i = 0; t->at && i < t->n; i++)
		free(t->at[i].control);
	free(t->at);
	free(t->counts);
	free(t);
}

size_t source_turns_pick(struct source_turns *t, struct relay *r,
			 const struct source_stores *ss, int64_t now)
{
	/* A wake-up (LISTEN, the sweeper) makes its idle source due; one
	 * with rows keeps its cadence, as a worker of one table does
	 * (worker.c, next_lease_at). */
	size_t n = relay_sources_n(r);
	for (size_t i = 0; i < n; i++) {
		if (t->at[i].control_global && relay_source_gone(r, i)) {
			/* A table dropped while an operator had it paused is
			 * paused no more (counted, outbox_paused stayed up for
			 * good); found again, its pauses are read anew. */
			t->at[i].control_global = false;
			t->at[i].control_read_ms = 0;
			t->n_paused--;
			metrics_set(MG_PAUSED_GLOBALLY, (int64_t)t->n_paused);
		}
		uint64_t woken = atomic_load(&r->source_wake[i]);
		if (woken != t->at[i].seen_wake) {
			t->at[i].seen_wake = woken;
			if (t->at[i].idle)
				t->at[i].due_ms = 0;
		}
		long long at = atomic_load(&r->source_wake_at[i]);
		if (at != 0 && at <= now &&
		    atomic_compare_exchange_strong(&r->source_wake_at[i], &at,
						   0) &&
		    t->at[i].idle)
			t->at[i].due_ms = 0;
	}
	for (size_t k = 0; k < n; k++) {
		size_t i = (t->next + k) % n;
		int64_t due = t->at[i].due_ms;
		int64_t retry = sources_retry_ms(ss, i);
		if ((retry > due ? retry : due) <= now &&
		    !relay_source_gone(r, i)) {
			t->next = (i + 1) % n;
			return i;
		}
	}
	return SIZE_MAX;
}

void source_turns_note_activity(struct source_turns *t, size_t n,
				const int64_t *counts)
{
	for (size_t i = 0; i < n; i++) {
		struct source_turn *at = &t->at[i];
		/* A lane yet to open a session of the source's database
		 * has tried nothing: taken as unread, its turn would make
		 * every idle table due, a lease of each. */
		if (counts && counts[i] == SOURCE_ACTIVITY_NO_SESSION)
			continue;
		bool read = counts && source_activity_counted(counts[i]);
		bool moved =
		    !read || !at->activity_known || counts[i] != at->activity;
		/* Its pauses are read again too: a resume that moved the
		 * count within the pauses' refresh would be read as paused
		 * by the lease it makes, which leaves the rows behind. */
		if (moved && at->idle) {
			at->due_ms = 0;
			at->control_read_ms = 0;
		}
		if (read) {
			at->activity = counts[i];
			at->activity_known = true;
		}
	}
}

/* An open store of database db for ss, opening one of its sources' if
 * none is open; NULL when none would open. */
static struct store *store_for_read(struct relay_thread *th,
				    struct source_stores *ss, size_t db)
{
	struct relay *r = th->relay;
	struct store *s = sources_any(r, ss, db);
	size_t n = relay_sources_n(r);
	for (size_t i = 0; !s && i < n && i < ss->n; i++)
		if (relay_source_db(r, i) == db && !relay_source_gone(r, i))
			s = sources_store(th, ss, i);
	return s;
}

bool sources_read_activity(struct relay_thread *th, struct source_stores *ss,
			   size_t n, int64_t *counts)
{
	struct relay *r = th->relay;
	const char **names = calloc(n ? n : 1, sizeof(*names));
	size_t *of = calloc(n ? n : 1, sizeof(*of));
	int64_t *got = calloc(n ? n : 1, sizeof(*got));
	bool any = false;
	for (size_t i = 0; i < n; i++)
		counts[i] = SOURCE_ACTIVITY_UNREAD;
	if (!names || !of || !got)
		goto out;
	/* One statement a database, on a session of its own stores. */
	for (size_t d = 0; d < config_n_databases(r->cfg); d++) {
		size_t k = 0;
		for (size_t i = 0; i < n; i++)
			if (relay_source_db(r, i) == d) {
				names[k] = relay_source_table(r, i);
				of[k++] = i;
			}
		char err[512];
		if (k == 0)
			continue;
		/* Each database's read is bounded on its own; a pass over
		 * many that hang is not, and without a tick between them
		 * /healthz took the thread for stuck. */
		loop_tick(th);
		/* A lane's first turn reads before it has leased: it opens
		 * its session of the database for the read, or its read
		 * would count nothing (a second lane that never leased read
		 * nothing, every turn it took). */
		struct store *s = store_for_read(th, ss, d);
		if (!s) {
			for (size_t j = 0; j < k; j++)
				counts[of[j]] = SOURCE_ACTIVITY_NO_SESSION;
			continue;
		}
		if (store_tables_activity(s, names, k, got, err, sizeof(err)) !=
		    0) {
			log_debug("reading the tables' activity failed: %s",
				  err);
			continue;
		}
		for (size_t j = 0; j < k; j++)
			counts[of[j]] = got[j];
		any = true;
	}
out:
	free(names);
	free(of);
	free(got);
	return any;
}

struct store *sources_any(struct relay *r, const struct source_stores *ss,
			  size_t db)
{
	/* Not a source set aside: its table's check would fail the read,
	 * and with it the gating of every idle source. */
	struct store *s = store_of_db(r, ss, db, true);
	return s ? s : store_of_db(r, ss, db, false);
}

int64_t source_turns_earliest(const struct source_turns *t, struct relay *r,
			      const struct source_stores *ss)
{
	size_t n = relay_sources_n(r);
	int64_t earliest =
	    t->next_activity_ms > 0 ? t->next_activity_ms : INT64_MAX;
	for (size_t i = 0; i < n; i++) {
		int64_t due = t->at[i].due_ms;
		int64_t retry = sources_retry_ms(ss, i);
		if (retry > due)
			due = retry;
		if (due < earliest && !relay_source_gone(r, i))
			earliest = due;
		long long at = atomic_load(&r->source_wake_at[i]);
		if (at != 0 && at < earliest)
			earliest = at;
	}
	return earliest;
}

/*
 * Of many sources, once per poll interval: which idle ones were written
 * since the last look (one statement for them all), instead of a lease of
 * each (docs/design.md §13). Unread counts make every idle source due, as
 * polling would.
 */
void source_turns_read_activity(struct source_turns *t, struct relay_thread *th,
				struct source_stores *ss, int64_t every_ms)
{
	struct relay *r = th->relay;
	int64_t now = clock_ms();
	size_t n = relay_sources_n(r);
	/* A source found since the last read gets its first count before
	 * its first lease. Counted after that lease, a write between the
	 * two could not be told from none, so the count would have to make
	 * the source due once more: at start, a second lease of every
	 * table leased before the first read. */
	if (!sources_gated(r) || (now < t->next_activity_ms && n <= t->read_n))
		return;
	sources_read_activity(th, ss, n, t->counts);
	/* Tried on a session, read or failed (track_counts off): the next
	 * read waits for its time, or a failing one would run every turn.
	 * Not tried (no store of the database would open): the next turn
	 * reads, and one comes by that time too; without a time set, a
	 * relay whose tables all went idle slept to the backstop, 5
	 * minutes, however many rows were written meanwhile. */
	if (n > 0)
		t->next_activity_ms = now + every_ms;
	for (size_t i = 0; i < n; i++)
		if (t->counts[i] != SOURCE_ACTIVITY_NO_SESSION) {
			t->read_n = n;
			break;
		}
	source_turns_note_activity(t, n, t->counts);
}

/* Keeps the source's operator pauses (keys[0..n)) for the reads between
 * refreshes; false when out of memory (none kept then). */
bool source_turn_keep_control(struct source_turn *t,
			      char (*keys)[PAUSE_KEY_MAX], size_t n)
{
	char(*kept)[PAUSE_KEY_MAX] = NULL;
	if (n > 0) {
		kept = malloc(n * sizeof(*kept));
		if (!kept)
			return false;
		memcpy(kept, keys, n * sizeof(*kept));
	}
	free(t->control);
	t->control = kept;
	t->n_control = n;
	return true;
}
