/* SPDX-License-Identifier: MIT */
/*
 * The NOTIFY listener: a session that LISTENs on the table's wake-up
 * channel and reports how many notifications came. It never opens a
 * transaction; polling stays the fallback, so a lost notification costs at
 * most the poll interval.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgconn.h"
#include "store_internal.h"

/* Ownership: the listener owns its session and its channels' names, the
 * i-th that of the i-th table it listens for (open's, then each add's). */
struct store_listener {
	PGconn *conn;
	char (*channels)[64];
	size_t n;
};

/* LISTEN on the table's channel; the channel's name is computed by
 * Postgres, as the trigger computes it, and kept as l's next channel. */
static int listen_on(struct store_listener *l, const struct outbox_table *t,
		     char *err, size_t errlen)
{
	PGconn *conn = l->conn;
	char channel[200], sql[300];
	char(*grown)[64] =
	    realloc(l->channels, (l->n + 1) * sizeof(*l->channels));
	if (!grown) {
		snprintf(err, errlen, "listen: out of memory");
		return STORE_ERROR;
	}
	l->channels = grown;
	store_channel_sql(t, channel, sizeof(channel));
	snprintf(sql, sizeof(sql),
		 "SELECT format('LISTEN %%I', c), c FROM (SELECT %s AS c) x",
		 channel);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) == PGRES_TUPLES_OK) {
		char listen[128];
		snprintf(listen, sizeof(listen), "%s", PQgetvalue(res, 0, 0));
		snprintf(l->channels[l->n], sizeof(l->channels[l->n]), "%s",
			 PQgetvalue(res, 0, 1));
		PQclear(res);
		res = PQexec(conn, listen);
	}
	int rc = STORE_OK;
	if (PQresultStatus(res) == PGRES_COMMAND_OK)
		l->n++;
	else {
		char why[512];
		pgconn_error(conn, res, why, sizeof(why));
		snprintf(err, errlen, "listen: %s", why);
		rc = STORE_RECONNECT;
	}
	PQclear(res);
	return rc;
}

int store_listener_open(struct store_listener **out,
			const struct store_options *opt, char *err,
			size_t errlen)
{
	struct outbox_table t;
	*out = NULL;
	if (opt->table && table_parse(opt->table, &t, err, errlen) != 0)
		return STORE_ERROR;
	struct store_listener *l = calloc(1, sizeof(*l));
	if (!l) {
		snprintf(err, errlen, "listener: out of memory");
		return STORE_ERROR;
	}
	struct pgconn_options po = pgconn_options_for(
	    opt->conninfo, opt->app_name, opt->statement_timeout_ms,
	    opt->lock_timeout_ms, opt->dead_peer_ms, PGCONN_SESSION);
	l->conn = pgconn_connect(&po, err, errlen);
	int rc = !l->conn     ? STORE_RECONNECT
		 : opt->table ? listen_on(l, &t, err, errlen)
			      : STORE_OK;
	if (rc != STORE_OK) {
		store_listener_close(l);
		return rc;
	}
	*out = l;
	return STORE_OK;
}

int store_listener_add(struct store_listener *l, const char *table, char *err,
		       size_t errlen)
{
	struct outbox_table t;
	if (table_parse(table, &t, err, errlen) != 0)
		return STORE_ERROR;
	return listen_on(l, &t, err, errlen);
}

/* Frees what libpq has queued, setting woken[i] (when not NULL) for each
 * channel i that had some; returns how many there were. */
static size_t drain(struct store_listener *l, bool *woken)
{
	size_t n = 0;
	PGnotify *note;
	while ((note = PQnotifies(l->conn)) != NULL) {
		n++;
		for (size_t i = 0; woken && i < l->n; i++)
			if (strcmp(note->relname, l->channels[i]) == 0)
				woken[i] = true;
		PQfreemem(note);
	}
	return n;
}

static int lost(PGconn *conn, char *err, size_t errlen)
{
	char why[512];
	pgconn_error(conn, NULL, why, sizeof(why));
	snprintf(err, errlen, "LISTEN session: %s", why);
	return STORE_RECONNECT;
}

int store_listener_wait(struct store_listener *l, int64_t timeout_ms,
			size_t *notifications, bool *woken, char *err,
			size_t errlen)
{
	*notifications = 0;
	if (PQstatus(l->conn) != CONNECTION_OK)
		return lost(l->conn, err, errlen);
	/* Notifications that came in with a reply are queued inside libpq
	 * and the socket would not show them to poll(). */
	*notifications = drain(l, woken);
	if (*notifications > 0)
		return STORE_OK;
	struct pollfd pfd = {.fd = PQsocket(l->conn), .events = POLLIN};
	int ready = poll(&pfd, 1, timeout_ms > 0 ? (int)timeout_ms : 0);
	if (ready < 0 || PQconsumeInput(l->conn) != 1 ||
	    PQstatus(l->conn) != CONNECTION_OK)
		return lost(l->conn, err, errlen);
	*notifications = drain(l, woken);
	return STORE_OK;
}

int store_listener_queue_usage(struct store_listener *l, int64_t *ppm,
			       char *err, size_t errlen)
{
	PGresult *res =
	    PQexec(l->conn, "SELECT (pg_notification_queue_usage() * 1e6)"
			    "::bigint::text");
	int rc = STORE_OK;
	if (PQresultStatus(res) == PGRES_TUPLES_OK) {
		*ppm = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	} else {
		char why[512];
		pgconn_error(l->conn, res, why, sizeof(why));
		snprintf(err, errlen, "notify queue usage: %s", why);
		rc = pgconn_needs_reconnect(l->conn, res) ? STORE_RECONNECT
							  : STORE_ERROR;
	}
	PQclear(res);
	return rc;
}

void store_listener_close(struct store_listener *l)
{
	if (!l)
		return;
	if (l->conn)
		PQfinish(l->conn);
	free(l->channels);
	free(l);
}
