/* SPDX-License-Identifier: MIT */
/*
 * The listener (OUTBOX_LISTEN=on): waits on the store's LISTEN session and
 * wakes idle workers when rows are inserted (docs/design.md §7).
 */
#include "loops_int.h"

#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store/store.h"

#define LISTEN_USAGE_EVERY_MS 5000
#define LISTEN_WAIT_MS 1000

/* LISTENs on the channels of the sources found since the last call
 * (*listened of them so far), in index order: the listener's i-th channel
 * is source i's. */
static int listen_new(struct relay *r, struct store_listener *l,
		      size_t *listened, char *err, size_t errlen)
{
	size_t n = relay_sources_n(r);
	for (; *listened < n; (*listened)++) {
		int rc = store_listener_add(l, relay_source_name(r, *listened),
					    err, errlen);
		if (rc != STORE_OK)
			return rc;
	}
	return STORE_OK;
}

/* Opens the LISTEN session, retrying with backoff until it works or the
 * relay stops (NULL then). */
static struct store_listener *listen_connect(struct relay_thread *th,
					     size_t *listened)
{
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	char name[160], err[1024];
	relay_app_name(r, th->name, name, sizeof(name));
	struct store_options o = store_options_from_config(cfg, name, NULL);
	o.table = NULL;
	/* LISTEN needs a direct connection: a transaction pooler drops it. */
	if (cfg->listen_database_url)
		o.conninfo = cfg->listen_database_url;
	int64_t backoff = RECONNECT_MIN_MS;
	while (!relay_stopping(r)) {
		struct store_listener *l = NULL;
		*listened = 0;
		int rc = store_listener_open(&l, &o, err, sizeof(err));
		if (rc == STORE_OK)
			rc = listen_new(r, l, listened, err, sizeof(err));
		if (rc == STORE_OK) {
			/* Rows inserted while nobody listened would otherwise
			 * wait for the poll interval. */
			relay_wake_sources(r);
			return l;
		}
		store_listener_close(l);
		log_warn("listener: %s", err);
		relay_idle(th, backoff, NULL, NULL);
		backoff = backoff * 2 > RECONNECT_MAX_MS ? RECONNECT_MAX_MS
							 : backoff * 2;
	}
	return NULL;
}

/* One pass: the queue usage when due, then a wait for notifications.
 * Returns STORE_OK, or the store's error when the session must be
 * reopened. */
static int listen_once(struct relay_thread *th, struct store_listener *l,
		       bool *woken, size_t *listened, int64_t *next_usage)
{
	struct relay *r = th->relay;
	char err[512];
	/* Tables found since: their notifications count from now. */
	int rc = listen_new(r, l, listened, err, sizeof(err));
	if (rc == STORE_OK && clock_ms() >= *next_usage) {
		int64_t ppm = 0;
		rc = store_listener_queue_usage(l, &ppm, err, sizeof(err));
		if (rc == STORE_OK)
			metrics_set(MG_NOTIFY_QUEUE_PPM, ppm);
		*next_usage = clock_ms() + LISTEN_USAGE_EVERY_MS;
	}
	size_t n = 0;
	size_t sources = *listened;
	memset(woken, 0, sources * sizeof(*woken));
	if (rc == STORE_OK)
		rc = store_listener_wait(l, LISTEN_WAIT_MS, &n, woken, err,
					 sizeof(err));
	/* Each table's notifications make that table due, not the others:
	 * a relay of many tables leases only where rows came. */
	if (n > 0) {
		for (size_t i = 0; i < sources; i++)
			if (woken[i])
				atomic_fetch_add(&r->source_wake[i], 1);
		relay_wake(r);
	}
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
	bool *woken = calloc(r->sources.cap, sizeof(*woken));
	size_t listened = 0;
	if (!woken)
		log_error("out of memory for the listener");
	struct store_listener *l = woken ? listen_connect(th, &listened) : NULL;
	int64_t next_usage = 0;
	while (l && !relay_stopping(r)) {
		loop_tick(th);
		if (listen_once(th, l, woken, &listened, &next_usage) !=
		    STORE_OK) {
			/* Any failure reconnects, as a query that fails on a
			 * live session is as unexpected as a lost one. */
			store_listener_close(l);
			metrics_add(MC_DB_RECONNECTS, 1);
			l = listen_connect(th, &listened);
		}
	}
	store_listener_close(l);
	free(woken);
	log_info("listener stopped");
	return NULL;
}
