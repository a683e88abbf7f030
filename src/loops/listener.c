/* SPDX-License-Identifier: MIT */
/*
 * The listener (OUTBOX_LISTEN=on): LISTENs on the outbox trigger's channel
 * over a direct Postgres connection and wakes idle workers. Self-contained
 * on purpose: it still speaks libpq itself and moves onto the store's
 * listener API once that exists.
 */
#include "loops_int.h"

#include <poll.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "store/pgconn.h"

#define LISTEN_USAGE_EVERY_MS 5000

static PGconn *listen_connect(struct relay_thread *th, const char *channel)
{
	struct relay *r = th->relay;
	const struct config *cfg = r->cfg;
	char name[160], err[1024], sql[300];
	relay_app_name(r, th->name, name, sizeof(name));
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
	while (!relay_stopping(r)) {
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
void *listener_main(void *arg)
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
	while (conn && !relay_stopping(r)) {
		loop_tick(th);
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
