/* SPDX-License-Identifier: MIT */
/*
 * Discovery (OUTBOX_TABLE with a pattern, docs/design.md §13): looks the
 * patterns up in the catalog every OUTBOX_DISCOVERY_INTERVAL, adds each
 * new matching table to the relay's sources and wakes the workers for it,
 * and lets go of a table that no longer exists with one warning (and
 * takes it back if it returns). One thread with a catalog session of its
 * own; the only writer of the source list after relay_create().
 */
#include "loops_int.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"

/* What one pass found: a flag per source, set for each table a pattern
 * matched. Owned by the discovery thread. */
struct discovery {
	struct store_catalog *catalog[CONFIG_DATABASES_MAX];
	int64_t retry_ms[CONFIG_DATABASES_MAX];	  /* clock_ms; 0: now */
	int64_t backoff_ms[CONFIG_DATABASES_MAX]; /* 0: none yet */
	bool *seen;
	bool full_warned; /* the source list's cap was reported */
	bool first_done;  /* the first pass's summary was logged */
	/* OUTBOX_TABLE's listed tables without a schema, and the oids they
	 * name in the database of this pass (its search_path's): a
	 * pattern's match of one of them is that listed source, not a
	 * second source of the same table. */
	const char **bare;
	uint32_t *bare_oid;
	size_t n_bare;
	bool bare_said[CONFIG_DATABASES_MAX];
};

/* Whether oid is one a bare listed table names in this pass's database;
 * says so once a database. */
static bool listed_bare(struct discovery *d, size_t db, uint32_t oid,
			const char *name)
{
	for (size_t b = 0; b < d->n_bare; b++) {
		if (d->bare_oid[b] != oid || oid == 0)
			continue;
		if (!d->bare_said[db])
			log_fields(LOG_INFO,
				   "a table the pattern matches is listed "
				   "too; relayed once, as listed",
				   "table", name, "listed", d->bare[b], NULL);
		d->bare_said[db] = true;
		return true;
	}
	return false;
}

/* Adds what pattern p matched in database db to the sources; STORE_OK or
 * the catalog's error (nothing is let go on an error). */
static int discover_pattern(struct relay *r, struct discovery *d, size_t db,
			    const char *p, size_t *found)
{
	char **names = NULL, err[512];
	uint32_t *oids = NULL;
	size_t n = 0;
	int rc = store_catalog_tables(d->catalog[db], p, &names, &oids, &n, err,
				      sizeof(err));
	if (rc != STORE_OK) {
		log_warn("discovery of %s failed: %s", p, err);
		return rc;
	}
	for (size_t k = 0; k < n; k++) {
		size_t i;
		enum source_found what;
		if (listed_bare(d, db, oids[k], names[k]))
			continue;
		if (!source_list_add(&r->sources, db, names[k], oids[k], &i,
				     &what)) {
			if (!d->full_warned)
				log_fields(LOG_WARN,
					   "more tables match than a relay "
					   "serves; the rest are not relayed",
					   "pattern", p, "first_left_out",
					   names[k], NULL);
			d->full_warned = true;
			continue;
		}
		d->seen[i] = true;
		(*found)++;
		if (what == SOURCE_ADDED && d->first_done)
			log_fields(LOG_INFO, "found a table; relaying it",
				   "source", relay_source_name(r, i), "pattern",
				   p, NULL);
		else if (what == SOURCE_BACK || what == SOURCE_REMADE) {
			/* Not gone: its lag starts afresh. */
			relay_source_set_gone(r, i, false);
			log_fields(LOG_INFO,
				   what == SOURCE_BACK
				       ? "a table is back; relaying it"
				       : "a table was made anew; relaying it "
					 "afresh",
				   "source", relay_source_name(r, i), NULL);
		}
		if (what != SOURCE_KNOWN)
			relay_wake_source(r, i);
	}
	store_names_free(names, n);
	free(oids);
	return STORE_OK;
}

/* One pass over every pattern in database db; the tables of db they no
 * longer match are let go. STORE_OK or the catalog's error. */
static int discover(struct relay *r, struct discovery *d, size_t db,
		    size_t *found)
{
	const struct config *cfg = r->cfg;
	memset(d->seen, 0, r->sources.cap * sizeof(*d->seen));
	char err[512];
	int rc = store_catalog_oids(d->catalog[db], d->bare, d->n_bare,
				    d->bare_oid, err, sizeof(err));
	if (rc != STORE_OK) {
		log_warn("discovery: %s", err);
		return rc;
	}
	for (size_t p = 0; p < cfg->n_tables; p++) {
		if (!table_is_pattern(cfg->tables[p]))
			continue;
		int rc = discover_pattern(r, d, db, cfg->tables[p], found);
		if (rc != STORE_OK)
			return rc;
	}
	size_t n = relay_sources_n(r);
	for (size_t i = 0; i < n; i++) {
		const char *name = relay_source_name(r, i);
		const char *table = relay_source_table(r, i);
		bool matched = false;
		if (relay_source_db(r, i) != db)
			continue;
		bool listed = false;
		for (size_t p = 0; p < cfg->n_tables && !matched; p++)
			matched = table_is_pattern(cfg->tables[p]) &&
				  table_pattern_match(cfg->tables[p], table);
		for (size_t p = 0; p < cfg->n_tables && !listed; p++)
			listed = !table_is_pattern(cfg->tables[p]) &&
				 strcmp(cfg->tables[p], table) == 0;
		/* A listed table is the operator's, also where a pattern
		 * matches it too: only a pattern's own tables come and go
		 * with the catalog. */
		if (!matched || listed || d->seen[i] || relay_source_gone(r, i))
			continue;
		relay_source_set_gone(r, i, true);
		log_fields(LOG_WARN, "a table is gone; no longer relayed",
			   "source", name, NULL);
	}
	return STORE_OK;
}

/* One pass over every database whose catalog is not waiting out a failure;
 * a database that fails waits alone. */
static void discover_all(struct relay_thread *th, struct discovery *d)
{
	struct relay *r = th->relay;
	size_t found = 0, dbs = config_n_databases(r->cfg);
	bool all = true;
	for (size_t db = 0; db < dbs && !relay_stopping(r); db++) {
		char err[512];
		int rc = STORE_OK;
		/* Each database's connect and read is bounded on its own; a
		 * pass over many out of reach is not, and without a tick
		 * between them /healthz took the thread for stuck. */
		loop_tick(th);
		if (clock_ms() < d->retry_ms[db]) {
			all = false;
			continue;
		}
		if (!d->catalog[db]) {
			char name[160];
			relay_app_name(r, th->name, name, sizeof(name));
			struct store_options o =
			    store_options_from_config(r->cfg, name, NULL);
			o.conninfo = config_database_url(r->cfg, db);
			rc = store_catalog_open(&d->catalog[db], &o, err,
						sizeof(err));
			if (rc != STORE_OK)
				log_warn("discovery: %s", err);
		}
		if (rc == STORE_OK)
			rc = discover(r, d, db, &found);
		if (rc == STORE_OK) {
			d->backoff_ms[db] = 0;
			d->retry_ms[db] = 0;
			continue;
		}
		all = false;
		store_catalog_close(d->catalog[db]);
		d->catalog[db] = NULL;
		d->backoff_ms[db] = d->backoff_ms[db] == 0
					? RECONNECT_MIN_MS
					: loop_backoff_grow(d->backoff_ms[db],
							    RECONNECT_MAX_MS);
		d->retry_ms[db] = clock_ms() + d->backoff_ms[db];
	}
	if (all && !d->first_done) {
		char count[32];
		snprintf(count, sizeof(count), "%zu", found);
		log_fields(LOG_INFO, "discovered tables", "tables", count,
			   "pattern", r->cfg->table, NULL);
		d->first_done = true;
	}
}

/* Until the next pass: the interval, or sooner when a database waits
 * out a failure. */
static int64_t next_pass_ms(const struct discovery *d, const struct relay *r)
{
	int64_t wait = r->cfg->discovery_interval_ms;
	int64_t now = clock_ms();
	for (size_t db = 0; db < config_n_databases(r->cfg); db++)
		if (d->retry_ms[db] > 0 && d->retry_ms[db] - now < wait)
			wait =
			    d->retry_ms[db] > now ? d->retry_ms[db] - now : 0;
	return wait;
}

void *discovery_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	struct discovery d = {0};
	log_set_thread(th->name);
	d.seen = calloc(r->sources.cap, sizeof(*d.seen));
	d.bare = calloc(r->cfg->n_tables + 1, sizeof(*d.bare));
	d.bare_oid = calloc(r->cfg->n_tables + 1, sizeof(*d.bare_oid));
	for (size_t p = 0; d.bare && p < r->cfg->n_tables; p++)
		if (table_is_bare(r->cfg->tables[p]))
			d.bare[d.n_bare++] = r->cfg->tables[p];
	if (!d.seen || !d.bare || !d.bare_oid) {
		log_error("out of memory for discovery");
		free(d.seen);
		d.seen = NULL;
	}
	while (d.seen && !relay_stopping(r)) {
		loop_tick(th);
		discover_all(th, &d);
		relay_idle_since(th, NULL, next_pass_ms(&d, r), NULL, NULL);
	}
	for (size_t db = 0; db < CONFIG_DATABASES_MAX; db++)
		store_catalog_close(d.catalog[db]);
	free(d.seen);
	free(d.bare);
	free(d.bare_oid);
	log_info("discovery stopped");
	return NULL;
}
