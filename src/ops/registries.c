/* SPDX-License-Identifier: MIT */
#include "registries.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* A table whose store would not open (gone, unmigrated), or a database
 * out of reach, is tried again after this, not at every heartbeat. */
#define REOPEN_MS 30000
/* Registries beaten in one statement (store_admin_heartbeat_group()):
 * a group's plan grows faster than its tables, measured at 49-61 us a
 * table for ten and 74 for a hundred (docs/benchmark.md, "Every table's
 * registry"). */
#define GROUP_MAX 10
/* The other tables' rows are written at the first round 4.5 s after
 * their last write, so every other round (6 s): still twice within the
 * 15 s a row is seen alive in, at half the writes (and half the vacuums
 * of a thousand registries). A table's first heartbeat goes at once, as
 * the ops session's own does (a contract step waits 6.5 s for a relay
 * that just opened a table to show, docs/design.md §11). */
#define WRITE_AFTER_MS 4500
/* A single heartbeat, which prunes rows silent for a day, once in so
 * many writes of each registry (10 minutes). */
#define PRUNE_EVERY 100
/* A round's work on the other tables stops after this, the rest left to
 * the next rounds (still due): the ops session's own heartbeat, the
 * gauges and readiness must not wait for thousands of tables' opens. */
#define ROUND_BUDGET_MS 1000
/* Another database's registry session gives up a connect or a reply in
 * this: a database out of reach must not hold the ops thread for the
 * dead-peer window (15 s) every REOPEN_MS. */
#define OTHER_DB_DEAD_PEER_MS 2000

struct registry_entry {
	struct store *s;   /* NULL: not open */
	bool no_registry;  /* the table has no registry (made by hand) */
	bool started;	   /* one went in: this relay's row is there */
	bool failing;	   /* its failure was told */
	int64_t reopen_at; /* an open failed: not before then */
	int64_t written;   /* its last heartbeat's time */
	size_t writes;	   /* for its turn to prune */
	bool draining;	   /* what its last heartbeat said */
	unsigned epoch;	   /* relay_source_epoch() as it was opened */
};

/* A database's round: where its budget last ran out, and, for one other
 * than the ops session's (whose tables' stores share one session of
 * their own), when that session may be made again. */
struct registry_db {
	int64_t reopen_at;    /* its session was lost: not before then */
	bool failing;	      /* that was told */
	size_t cursor;	      /* where its last round's budget ran out */
	bool horizon_failing; /* its horizon's read failed, and was told */
	bool dead_failing;    /* its dead tuples' read failed, told */
};

/* Indexed by source and by database, as every per-source array
 * (docs/design.md §13). */
struct registries {
	struct registry_entry *at;
	size_t n;
	struct registry_db *db;
	size_t n_db;
	size_t ops_source; /* the ops session's source at the last round */
	bool ops_known;
	int64_t round_end; /* ROUND_BUDGET_MS from the round's start */
	size_t first_db;   /* the database a round starts with, in turn */
};

struct registries *registries_new(void)
{
	return calloc(1, sizeof(struct registries));
}

static bool grow(void **at, size_t *have, size_t want, size_t size)
{
	if (want <= *have)
		return true;
	char *more = realloc(*at, want * size);
	if (!more)
		return false;
	memset(more + *have * size, 0, (want - *have) * size);
	*at = more;
	*have = want;
	return true;
}

static void entry_close(struct registry_entry *e)
{
	store_close(e->s);
	e->s = NULL;
	e->no_registry = false;
}

static void told_failing(struct registry_entry *e, const char *source,
			 const char *what, const char *err)
{
	if (!e->failing)
		log_fields(LOG_WARN,
			   "a table's replica registry gets no heartbeat; the "
			   "others go on",
			   "source", source, "step", what, "error", err, NULL);
	e->failing = true;
}

/* An open store of database db, for the next one to share its session. */
static struct store *store_of_db(struct registries *g, struct relay *r,
				 size_t db)
{
	for (size_t i = 0; i < g->n; i++)
		if (g->at[i].s && relay_source_db(r, i) == db)
			return g->at[i].s;
	return NULL;
}

/* Database db's session (not the ops session's) was lost: its stores
 * close, and it is tried again after REOPEN_MS. */
static void db_lost(struct registries *g, struct relay *r, size_t db,
		    const char *err)
{
	for (size_t i = 0; i < g->n; i++)
		if (relay_source_db(r, i) == db)
			entry_close(&g->at[i]);
	struct registry_db *d = &g->db[db];
	d->reopen_at = clock_ms() + REOPEN_MS;
	if (!d->failing)
		log_fields(LOG_WARN,
			   "a database's replica registries get no "
			   "heartbeat; the others go on",
			   "database",
			   config_database_name(relay_config(r), db), "error",
			   err, NULL);
	d->failing = true;
}

/* Opens source i's store, on the session of with (NULL: a new one;
 * other_db: of a database other than the ops session's).
 * STORE_RECONNECT, with err, when the session was lost or could not be
 * made; else 0, with e->s NULL when the table failed. */
static int entry_open(struct registry_entry *e, struct relay *r, size_t i,
		      struct store *with, bool other_db,
		      const struct store_options *so, char *err, size_t errlen)
{
	struct store_options o = *so;
	o.table = relay_source_table(r, i);
	o.conninfo =
	    config_database_url(relay_config(r), relay_source_db(r, i));
	if (other_db)
		o.dead_peer_ms = OTHER_DB_DEAD_PEER_MS;
	e->epoch = relay_source_epoch(r, i);
	int rc = store_open_sharing(&e->s, &o, with, err, errlen);
	if (rc == STORE_RECONNECT)
		return rc;
	if (rc != 0) {
		e->reopen_at = clock_ms() + REOPEN_MS;
		told_failing(e, relay_source_name(r, i), "open", err);
		return 0;
	}
	unsigned present = 0;
	rc = store_admin_side_tables(e->s, &present, err, errlen);
	if (rc == STORE_RECONNECT)
		return rc;
	/* A table made by hand without one: nothing to beat (the relay's
	 * check of that table says which side tables are missing). */
	e->no_registry = rc == 0 && !(present & STORE_SIDE_REPLICAS);
	return 0;
}

/* Source i's store, opened if need be. STORE_RECONNECT, with err, when
 * its session was lost. new_session: it may open a session of its own
 * (once a round: each may wait for a connect). */
static int ensure_open(struct registries *g, struct relay *r, size_t i,
		       struct store *with, bool other_db, bool *new_session,
		       const struct store_options *so, char *err, size_t errlen)
{
	struct registry_entry *e = &g->at[i];
	if (e->s || clock_ms() < e->reopen_at || (!with && !*new_session))
		return 0;
	if (!with)
		*new_session = false;
	return entry_open(e, r, i, with, other_db, so, err, errlen);
}

/* What a heartbeat of e's row that went in tells the next rounds. */
static void wrote(struct registry_entry *e, const struct registry_beat *beat)
{
	e->written = clock_ms();
	e->writes++;
	e->draining = beat->draining;
}

/* Source i's registry alone, its row inserted if missing and the rows
 * silent for a day pruned. STORE_RECONNECT, with err, when its session
 * was lost. */
static int beat_single(struct registries *g, struct relay *r, size_t i,
		       const struct registry_beat *beat, char *err,
		       size_t errlen)
{
	struct registry_entry *e = &g->at[i];
	if (beat->tick)
		beat->tick();
	int rc =
	    store_admin_heartbeat(e->s, beat->id, beat->version, beat->kept,
				  beat->draining, !e->started, err, errlen);
	if (rc == STORE_RECONNECT)
		return rc;
	if (rc != 0) {
		told_failing(e, relay_source_name(r, i), "heartbeat", err);
		return 0;
	}
	wrote(e, beat);
	e->started = true;
	if (e->failing)
		log_fields(LOG_INFO,
			   "a table's replica registry gets its heartbeat "
			   "again",
			   "source", relay_source_name(r, i), NULL);
	e->failing = false;
	return 0;
}

/* Whether source i's row is to be written this round: its first, one
 * that failed, a change to draining, or WRITE_AFTER_MS since the last. */
static bool due(const struct registries *g, size_t i,
		const struct registry_beat *beat)
{
	const struct registry_entry *e = &g->at[i];
	return !e->started || e->failing || beat->draining != e->draining ||
	       clock_ms() - e->written >= WRITE_AFTER_MS;
}

/* Whether source i's registry goes in a group: not its first heartbeat
 * (which resets started_at), it did not fail, and its turn to prune (a
 * single heartbeat once in PRUNE_EVERY writes, the sources' turns spread
 * over them) is not now. */
static bool groupable(const struct registries *g, size_t i)
{
	const struct registry_entry *e = &g->at[i];
	return e->started && !e->failing && (e->writes + i) % PRUNE_EVERY != 0;
}

/* The sources in group (all of one session) in one statement; each
 * alone when it failed (to tell which table fails). */
static int beat_group(struct registries *g, struct relay *r,
		      const size_t *group, size_t n,
		      const struct registry_beat *beat, char *err,
		      size_t errlen)
{
	struct store *stores[GROUP_MAX] = {0};
	for (size_t k = 0; k < n; k++)
		stores[k] = g->at[group[k]].s;
	if (beat->tick)
		beat->tick();
	int rc = store_admin_heartbeat_group(stores, n, beat->id, beat->version,
					     beat->kept, beat->draining, err,
					     errlen);
	if (rc == STORE_RECONNECT)
		return rc;
	for (size_t k = 0; k < n; k++) {
		if (rc == 0) {
			wrote(&g->at[group[k]], beat);
			continue;
		}
		if (beat_single(g, r, group[k], beat, err, errlen) ==
		    STORE_RECONNECT)
			return STORE_RECONNECT;
	}
	return 0;
}

/* The sources of database db: with, the session's store to share (NULL:
 * another database's sources, whose first open makes their session).
 * STORE_RECONNECT, with err, when that session was lost. */
static int beat_db(struct registries *g, struct relay *r, size_t db,
		   size_t ops_source, struct store *with, bool *new_session,
		   const struct store_options *so,
		   const struct registry_beat *beat, char *err, size_t errlen)
{
	/* g->n, not the sources' count now: discovery may have added some
	 * since the round grew the entries. */
	size_t group[GROUP_MAX], grouped = 0, n = g->n;
	struct registry_db *d = &g->db[db];
	bool other_db = with == NULL;
	int rc = 0;
	/* Gone sources' stores first: one of them may be the store the
	 * others would share their session through. A table made anew is
	 * opened again: its side tables are looked at anew. */
	for (size_t i = 0; i < n; i++)
		if (relay_source_db(r, i) == db &&
		    (relay_source_gone(r, i) ||
		     (g->at[i].s &&
		      g->at[i].epoch != relay_source_epoch(r, i))))
			entry_close(&g->at[i]);
	if (!with)
		with = store_of_db(g, r, db);
	/* From where the last round's budget ran out: every table gets its
	 * turn however many the budget leaves for a round. */
	for (size_t k = 0; k < n && rc != STORE_RECONNECT; k++) {
		size_t i = (d->cursor + k) % n;
		struct registry_entry *e = &g->at[i];
		if (i == ops_source || relay_source_db(r, i) != db ||
		    relay_source_gone(r, i) || !due(g, i, beat))
			continue;
		if (clock_ms() >= g->round_end) {
			d->cursor = i;
			break;
		}
		if (beat->tick)
			beat->tick();
		rc = ensure_open(g, r, i, with, other_db, new_session, so, err,
				 errlen);
		if (rc != 0 || !e->s || e->no_registry)
			continue;
		if (!with)
			with = e->s;
		if (!groupable(g, i)) {
			rc = beat_single(g, r, i, beat, err, errlen);
			continue;
		}
		group[grouped++] = i;
		if (grouped == GROUP_MAX) {
			rc =
			    beat_group(g, r, group, grouped, beat, err, errlen);
			grouped = 0;
		}
	}
	if (rc == 0 && grouped)
		rc = beat_group(g, r, group, grouped, beat, err, errlen);
	return rc;
}

int registries_beat(struct registries *g, struct relay *r,
		    struct store *ops_store, size_t ops_source,
		    const struct store_options *so,
		    const struct registry_beat *beat, char *ops_err,
		    size_t ops_errlen)
{
	size_t n = relay_sources_n(r), ops_db = relay_source_db(r, ops_source);
	size_t n_db = config_n_databases(relay_config(r));
	if (!g || !grow((void **)&g->at, &g->n, n, sizeof(*g->at)) ||
	    !grow((void **)&g->db, &g->n_db, n_db, sizeof(*g->db))) {
		log_warn("the other tables' replica registries: out of memory");
		return 0;
	}
	/* The ops session moved: its former source's row is this process's
	 * (its started_at is not reset). */
	if (g->ops_known && g->ops_source != ops_source && g->ops_source < g->n)
		g->at[g->ops_source].started = true;
	g->ops_source = ops_source;
	g->ops_known = true;
	g->round_end = clock_ms() + ROUND_BUDGET_MS;
	bool new_session = true;
	char err[1024];
	/* Each database first in turn: one whose tables take the whole
	 * budget must not leave the others none for good (another's
	 * connect gives up in OTHER_DB_DEAD_PEER_MS). */
	g->first_db = (g->first_db + 1) % n_db;
	for (size_t k = 0; k < n_db; k++) {
		size_t d = (g->first_db + k) % n_db;
		if (d == ops_db) {
			if (beat_db(g, r, ops_db, ops_source, ops_store,
				    &new_session, so, beat, err,
				    sizeof(err)) != STORE_RECONNECT)
				continue;
			snprintf(ops_err, ops_errlen, "%s", err);
			return STORE_RECONNECT;
		}
		if (clock_ms() < g->db[d].reopen_at)
			continue;
		if (beat_db(g, r, d, ops_source, NULL, &new_session, so, beat,
			    err, sizeof(err)) == STORE_RECONNECT)
			db_lost(g, r, d, err);
		else if (g->db[d].failing && store_of_db(g, r, d)) {
			log_fields(LOG_INFO,
				   "a database's replica registries get their "
				   "heartbeat again",
				   "database",
				   config_database_name(relay_config(r), d),
				   NULL);
			g->db[d].failing = false;
		}
	}
	return 0;
}

/* Whether holder a has held its database's horizon longer than b: by
 * seconds, what the alert goes by, where both are known (a slot's, or
 * another role's session without pg_read_all_stats, are not), else by
 * transactions, as each database's own statement ranks its holders. */
static bool held_longer(const struct store_horizon *a,
			const struct store_horizon *b)
{
	if (!a->kind[0])
		return false;
	if (!b->kind[0])
		return true;
	if (a->age_ms > 0 && b->age_ms > 0)
		return a->age_ms > b->age_ms;
	return a->xmin_age > b->xmin_age;
}

static bool same_holder(const struct store_horizon *a,
			const struct store_horizon *b)
{
	return a->kind[0] && strcmp(a->kind, b->kind) == 0 &&
	       a->pid == b->pid && strcmp(a->name, b->name) == 0;
}

static int64_t max64(int64_t a, int64_t b)
{
	return a > b ? a : b;
}

/* Whether server (a read's start time) is among the n in seen; added if
 * not (room for every database's). */
static bool server_seen(char (*seen)[STORE_SERVER_MAX], size_t *n,
			const char *server)
{
	for (size_t k = 0; k < *n; k++)
		if (strcmp(seen[k], server) == 0)
			return true;
	snprintf(seen[*n], sizeof(seen[*n]), "%s", server);
	(*n)++;
	return false;
}

void registries_horizons(struct registries *g, struct relay *r, size_t ops_db,
			 struct store_gauges *into, size_t *held_in,
			 void (*tick)(void))
{
	char seen[CONFIG_DATABASES_MAX + 1][STORE_SERVER_MAX];
	size_t n_seen = 0;
	/* The server of the read that named into's holder. */
	char held_on[STORE_SERVER_MAX];
	snprintf(held_on, sizeof(held_on), "%s", into->server);
	server_seen(seen, &n_seen, into->server);
	*held_in = ops_db;
	for (size_t d = 0; g && d < g->n_db && d < CONFIG_DATABASES_MAX; d++) {
		struct store *s = d == ops_db ? NULL : store_of_db(g, r, d);
		if (!s)
			continue;
		if (tick)
			tick();
		struct store_gauges h;
		char err[1024];
		const char *name = config_database_name(relay_config(r), d);
		int rc = store_admin_horizon(s, &h, err, sizeof(err));
		if (rc == STORE_RECONNECT) {
			db_lost(g, r, d, err);
			continue;
		}
		struct registry_db *db = &g->db[d];
		if (rc != 0) {
			if (!db->horizon_failing)
				log_fields(LOG_WARN,
					   "a database's xmin horizon could "
					   "not be read; /metrics shows the "
					   "others'",
					   "database", name, "error", err,
					   NULL);
			db->horizon_failing = true;
			continue;
		}
		if (db->horizon_failing)
			log_fields(LOG_INFO,
				   "a database's xmin horizon is read again",
				   "database", name, NULL);
		db->horizon_failing = false;
		into->xmin_age_sessions =
		    max64(into->xmin_age_sessions, h.xmin_age_sessions);
		into->xmin_age_slots =
		    max64(into->xmin_age_slots, h.xmin_age_slots);
		into->xmin_age_prepared =
		    max64(into->xmin_age_prepared, h.xmin_age_prepared);
		/* What every database of a server sees (a writer of another
		 * database, a physical slot, a session of none) is named by
		 * that server's first read; a later one names only its own
		 * database's holders, and one the earlier read named already
		 * takes this database's name, its own. */
		bool known = server_seen(seen, &n_seen, h.server);
		const struct store_horizon *c =
		    known ? &h.own_horizon : &h.horizon;
		if ((known && strcmp(h.server, held_on) == 0 &&
		     same_holder(c, &into->horizon)) ||
		    held_longer(c, &into->horizon)) {
			into->horizon = *c;
			*held_in = d;
			snprintf(held_on, sizeof(held_on), "%s", h.server);
		}
	}
}

/* Reads the dead tuples of database d's sources among the first n on s
 * (NULL: d is not read, and its sources are noted unknown, as
 * registries_horizons() leaves such a database out); false, with err,
 * when s's session was lost. names, which and dead have room for n. */
static bool dead_tuples_of(struct registries *g, struct relay *r, size_t d,
			   struct store *s, size_t n, const char **names,
			   size_t *which, int64_t *dead, char *err,
			   size_t errlen)
{
	size_t k = 0;
	/* n, not the sources' count now: discovery may add one meanwhile,
	 * past the arrays' room. */
	for (size_t i = 0; i < n; i++) {
		if (relay_source_db(r, i) != d)
			continue;
		if (!s || relay_source_gone(r, i)) {
			relay_note_dead_tuples(r, i, -1);
			continue;
		}
		names[k] = relay_source_table(r, i);
		which[k++] = i;
	}
	if (k == 0)
		return true;
	int rc = store_tables_dead_tuples(s, names, k, dead, err, errlen);
	/* Unknown now, not a value frozen from before: the session is gone,
	 * or the server counts nothing (track_counts turned off). */
	bool unknown = rc == STORE_RECONNECT || rc == STORE_REFUSED;
	for (size_t j = 0; unknown && j < k; j++)
		relay_note_dead_tuples(r, which[j], -1);
	if (rc == STORE_RECONNECT)
		return false;
	struct registry_db *db = &g->db[d];
	const char *name = config_database_name(relay_config(r), d);
	if (rc != 0) {
		if (!db->dead_failing)
			log_fields(LOG_WARN,
				   unknown ? "a database's tables' dead tuples "
					     "are not counted; their gauges "
					     "are left out"
					   : "a database's tables' dead tuples "
					     "could not be read; their gauges "
					     "keep their last values",
				   "database", name, "error", err, NULL);
		db->dead_failing = true;
		return true;
	}
	if (db->dead_failing)
		log_fields(LOG_INFO,
			   "a database's tables' dead tuples are "
			   "read again",
			   "database", name, NULL);
	db->dead_failing = false;
	for (size_t j = 0; j < k; j++)
		relay_note_dead_tuples(r, which[j], dead[j]);
	return true;
}

int registries_dead_tuples(struct registries *g, struct relay *r, size_t ops_db,
			   struct store *ops_store, void (*tick)(void),
			   char *err, size_t errlen)
{
	size_t n = relay_sources_n(r);
	const char **names = calloc(n, sizeof(*names));
	size_t *which = calloc(n, sizeof(*which));
	int64_t *dead = calloc(n, sizeof(*dead));
	int rc = 0;
	for (size_t d = 0; names && which && dead && g && d < g->n_db; d++) {
		struct store *s =
		    d == ops_db ? ops_store : store_of_db(g, r, d);
		if (s && tick)
			tick();
		char lost[1024];
		if (dead_tuples_of(g, r, d, s, n, names, which, dead, lost,
				   sizeof(lost)))
			continue;
		if (d != ops_db) {
			db_lost(g, r, d, lost);
			continue;
		}
		snprintf(err, errlen, "%s", lost);
		rc = STORE_RECONNECT;
		break;
	}
	free(dead);
	free(which);
	free(names);
	return rc;
}

void registries_forget(struct registries *g, struct relay *r, size_t ops_source,
		       bool ops_connected, const char *id)
{
	size_t ops_db = relay_source_db(r, ops_source);
	/* The ops session's database first (another's may not answer
	 * before the stop's wait ends); its stores not when that session
	 * was lost. */
	for (size_t k = 0; g && k < 2 * g->n; k++) {
		size_t i = k % g->n;
		struct registry_entry *e = &g->at[i];
		bool own_db = relay_source_db(r, i) == ops_db;
		char err[1024];
		if (own_db != (k < g->n) || (own_db && !ops_connected) ||
		    !e->s || !e->started)
			continue;
		if (store_admin_forget(e->s, id, err, sizeof(err)) != 0)
			log_warn(
			    "leaving a table's replica registry failed: %s",
			    err);
	}
}

void registries_close_db(struct registries *g, struct relay *r, size_t db)
{
	for (size_t i = 0; g && i < g->n; i++)
		if (relay_source_db(r, i) == db)
			entry_close(&g->at[i]);
}

static void registries_close(struct registries *g)
{
	for (size_t i = 0; g && i < g->n; i++)
		entry_close(&g->at[i]);
}

void registries_free(struct registries *g)
{
	registries_close(g);
	if (g) {
		free(g->at);
		free(g->db);
	}
	free(g);
}
