/* SPDX-License-Identifier: MIT */
/*
 * The listener (OUTBOX_LISTEN=on): waits on the store's LISTEN session and
 * wakes idle workers when rows are inserted (docs/design.md §7).
 */
#include "loops_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store/store.h"

#define LISTEN_USAGE_EVERY_MS 5000
#define LISTEN_WAIT_MS 1000
/* After a probe that did not come back: the path will not mend itself
 * sooner, and each try may leave a LISTEN on some pooled server
 * connection. */
#define LISTEN_PROBE_RETRY_MS 60000

/* Says which setting to mend when database db's LISTEN session loses
 * notifications. */
static void log_probe_lost(const struct config *cfg, size_t db, const char *err)
{
	char listen[160], url[160];
	config_database_setting(cfg, db, "OUTBOX_LISTEN_DATABASE_URL", listen,
				sizeof(listen));
	config_database_setting(cfg, db, "OUTBOX_DATABASE_URL", url,
				sizeof(url));
	if (config_listen_url(cfg, db))
		log_error("listener: %s. Set %s to a direct connection to the "
			  "server; workers poll every OUTBOX_POLL_INTERVAL "
			  "meanwhile, and the listener tries again in %d s",
			  err, listen, LISTEN_PROBE_RETRY_MS / 1000);
	else
		log_error("listener: %s. %s is unset, so LISTEN went through "
			  "%s: set it to a direct connection to the server; "
			  "workers poll every OUTBOX_POLL_INTERVAL meanwhile, "
			  "and the listener tries again in %d s",
			  err, listen, url, LISTEN_PROBE_RETRY_MS / 1000);
}

/* What one listener (one database's, th.index) LISTENs on: the channel
 * of each of its database's sources, in the order they were added. Owned
 * by the listener thread. */
struct channels {
	size_t scanned; /* sources looked at so far, of relay_sources_n() */
	size_t n;	/* channels listened on */
	size_t *source; /* channel k is source[k]'s */
	bool *woken;	/* per channel, from store_listener_wait() */
};

/* LISTENs on the channels of the sources of database db found since the
 * last call. Ticks th before each: a (re)connect LISTENs on every table,
 * two round trips each, and thousands of them did not tick /healthz. */
static int listen_new(struct relay_thread *th, size_t db,
		      struct store_listener *l, struct channels *c, char *err,
		      size_t errlen)
{
	struct relay *r = th->relay;
	size_t n = relay_sources_n(r);
	for (; c->scanned < n; c->scanned++) {
		if (relay_source_db(r, c->scanned) != db)
			continue;
		loop_tick(th);
		int rc = store_listener_add(
		    l, relay_source_table(r, c->scanned), err, errlen);
		if (rc != STORE_OK)
			return rc;
		c->source[c->n++] = c->scanned;
	}
	return STORE_OK;
}

/* Makes the tables of c due, those notified only (c->woken) or all, and
 * wakes the workers once. */
static void wake_tables(struct relay *r, const struct channels *c,
			bool notified_only)
{
	for (size_t k = 0; k < c->n; k++)
		if (!notified_only || c->woken[k])
			atomic_fetch_add(&r->source_wake[c->source[k]], 1);
	relay_wake(r);
}

/* Opens the LISTEN session, retrying with backoff until it works or the
 * relay stops (NULL then). */
static struct store_listener *listen_connect(struct relay_thread *th,
					     struct channels *c)
{
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	size_t db = (size_t)th->index;
	char name[160], err[1024];
	relay_app_name(r, th->name, name, sizeof(name));
	struct store_options o = store_options_from_config(cfg, name, NULL);
	o.table = NULL;
	o.conninfo = config_database_url(cfg, db);
	/* LISTEN needs a direct connection: a transaction pooler drops it. */
	if (config_listen_url(cfg, db))
		o.conninfo = config_listen_url(cfg, db);
	int64_t backoff = RECONNECT_MIN_MS;
	while (!relay_stopping(r)) {
		struct store_listener *l = NULL;
		c->scanned = 0;
		c->n = 0;
		int rc = store_listener_open(&l, &o, err, sizeof(err));
		if (rc == STORE_OK)
			rc = listen_new(th, db, l, c, err, sizeof(err));
		if (rc == STORE_OK) {
			/* Rows inserted while nobody listened would otherwise
			 * wait for the poll interval: this database's tables,
			 * not every database's (one listener's reconnects
			 * made every idle table of every database due). */
			wake_tables(r, c, false);
			/* Said at every (re)connect: from here a table's
			 * insert wakes it, not the poll interval. */
			char tables[32];
			snprintf(tables, sizeof(tables), "%zu", c->n);
			log_fields(LOG_INFO, "listening for inserts", "tables",
				   tables, NULL);
			return l;
		}
		store_listener_close(l);
		if (rc == STORE_REFUSED) {
			metrics_add(MC_LISTEN_PROBES_LOST, 1);
			log_probe_lost(cfg, db, err);
			relay_backoff(th, LISTEN_PROBE_RETRY_MS);
			continue;
		}
		log_warn("listener: %s", err);
		relay_backoff(th, backoff);
		backoff = loop_backoff_grow(backoff, RECONNECT_MAX_MS);
	}
	return NULL;
}

/* One pass: the queue usage when due, then a wait for notifications.
 * Returns STORE_OK, or the store's error when the session must be
 * reopened. */
static int listen_once(struct relay_thread *th, struct store_listener *l,
		       struct channels *c, int64_t *next_usage)
{
	struct relay *r = th->relay;
	char err[512];
	/* Tables found since: their notifications count from now. */
	int rc = listen_new(th, (size_t)th->index, l, c, err, sizeof(err));
	if (rc == STORE_OK && clock_ms() >= *next_usage) {
		int64_t ppm = 0;
		rc = store_listener_queue_usage(l, &ppm, err, sizeof(err));
		if (rc == STORE_OK) {
			relay_note_notify_usage(r, (size_t)th->index, ppm);
		} else if (rc != STORE_RECONNECT) {
			/* The session still listens (a revoked function,
			 * say): only the gauge goes without. Reconnecting
			 * for it woke every table every 5 s. */
			log_debug("reading the notification queue's usage "
				  "failed: %s",
				  err);
			rc = STORE_OK;
		}
		*next_usage = clock_ms() + LISTEN_USAGE_EVERY_MS;
	}
	size_t n = 0;
	memset(c->woken, 0, c->n * sizeof(*c->woken));
	if (rc == STORE_OK)
		rc = store_listener_wait(l, LISTEN_WAIT_MS, &n, c->woken, err,
					 sizeof(err));
	/* Each table's notifications make that table due, not the others:
	 * a relay of many tables leases only where rows came. */
	if (n > 0)
		wake_tables(r, c, true);
	if (rc != STORE_OK)
		log_warn("listener lost its connection (%s); reconnecting",
			 err);
	return rc;
}

/* Wakes idle workers on every notification. Polling stays the fallback,
 * so a lost notification costs at most the poll interval. */
void *listener_main(void *arg)
{
	struct relay_thread *th = arg;
	struct relay *r = th->relay;
	log_set_thread(th->name);
	struct channels c = {0};
	c.source = calloc(r->sources.cap, sizeof(*c.source));
	c.woken = calloc(r->sources.cap, sizeof(*c.woken));
	if (!c.source || !c.woken)
		log_error("out of memory for the listener");
	struct store_listener *l =
	    c.source && c.woken ? listen_connect(th, &c) : NULL;
	int64_t next_usage = 0;
	while (l && !relay_stopping(r)) {
		loop_tick(th);
		if (listen_once(th, l, &c, &next_usage) != STORE_OK) {
			/* Any failure reconnects, as a query that fails on a
			 * live session is as unexpected as a lost one. */
			store_listener_close(l);
			/* Unread while it reconnects: not kept at its last
			 * value, which could hold the alert on, or off. */
			relay_note_notify_usage(r, (size_t)th->index, 0);
			metrics_add(MC_DB_RECONNECTS, 1);
			l = listen_connect(th, &c);
		}
	}
	store_listener_close(l);
	free(c.source);
	free(c.woken);
	log_info("listener stopped");
	return NULL;
}
