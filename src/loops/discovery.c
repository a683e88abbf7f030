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
	struct store_catalog *catalog;
	bool *seen;
	bool full_warned; /* the source list's cap was reported */
	bool first_done;  /* the first pass's summary was logged */
};

/* Adds what pattern p matched to the sources; STORE_OK or the catalog's
 * error (nothing is let go on an error). */
static int discover_pattern(struct relay *r, struct discovery *d, const char *p,
			    size_t *found)
{
	char **names = NULL, err[512];
	size_t n = 0;
	int rc =
	    store_catalog_tables(d->catalog, p, &names, &n, err, sizeof(err));
	if (rc != STORE_OK) {
		log_warn("discovery of %s failed: %s", p, err);
		return rc;
	}
	for (size_t k = 0; k < n; k++) {
		size_t i;
		bool added, was_gone;
		if (!source_list_add(&r->sources, names[k], &i, &added,
				     &was_gone)) {
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
		if (added && d->first_done)
			log_fields(LOG_INFO, "found a table; relaying it",
				   "source", names[k], "pattern", p, NULL);
		else if (was_gone)
			log_fields(LOG_INFO, "a table is back; relaying it",
				   "source", names[k], NULL);
		if (added || was_gone)
			relay_wake_source(r, i);
	}
	store_names_free(names, n);
	return STORE_OK;
}

/* One pass over every pattern; the tables they no longer match are let
 * go. STORE_OK or the catalog's error. */
static int discover(struct relay *r, struct discovery *d)
{
	const struct config *cfg = r->cfg;
	memset(d->seen, 0, r->sources.cap * sizeof(*d->seen));
	size_t found = 0;
	for (size_t p = 0; p < cfg->n_tables; p++) {
		if (!table_is_pattern(cfg->tables[p]))
			continue;
		int rc = discover_pattern(r, d, cfg->tables[p], &found);
		if (rc != STORE_OK)
			return rc;
	}
	size_t n = relay_sources_n(r);
	for (size_t i = 0; i < n; i++) {
		const char *name = relay_source_name(r, i);
		bool matched = false;
		for (size_t p = 0; p < cfg->n_tables && !matched; p++)
			matched = table_is_pattern(cfg->tables[p]) &&
				  table_pattern_match(cfg->tables[p], name);
		/* A listed table is the operator's: only a pattern's tables
		 * come and go with the catalog. */
		if (!matched || d->seen[i] || relay_source_gone(r, i))
			continue;
		relay_source_set_gone(r, i, true);
		log_fields(LOG_WARN, "a table is gone; no longer relayed",
			   "source", name, NULL);
	}
	if (!d->first_done) {
		char count[32];
		snprintf(count, sizeof(count), "%zu", found);
		log_fields(LOG_INFO, "discovered tables", "tables", count,
			   "pattern", cfg->table, NULL);
		d->first_done = true;
	}
	return STORE_OK;
}

void *discovery_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	struct discovery d = {0};
	log_set_thread(th->name);
	d.seen = calloc(r->sources.cap, sizeof(*d.seen));
	if (!d.seen)
		log_error("out of memory for discovery");
	int64_t backoff = RECONNECT_MIN_MS;
	while (d.seen && !relay_stopping(r)) {
		loop_tick(th);
		char err[512];
		int rc = STORE_OK;
		if (!d.catalog) {
			char name[160];
			relay_app_name(r, th->name, name, sizeof(name));
			struct store_options o =
			    store_options_from_config(r->cfg, name, NULL);
			rc = store_catalog_open(&d.catalog, &o, err,
						sizeof(err));
			if (rc != STORE_OK)
				log_warn("discovery: %s", err);
		}
		if (rc == STORE_OK)
			rc = discover(r, &d);
		if (rc == STORE_OK) {
			backoff = RECONNECT_MIN_MS;
			relay_idle_since(th, NULL,
					 r->cfg->discovery_interval_ms, NULL,
					 NULL);
			continue;
		}
		store_catalog_close(d.catalog);
		d.catalog = NULL;
		relay_idle_since(th, NULL, backoff, NULL, NULL);
		backoff = backoff * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS
							 : backoff * 2;
	}
	store_catalog_close(d.catalog);
	free(d.seen);
	log_info("discovery stopped");
	return NULL;
}
