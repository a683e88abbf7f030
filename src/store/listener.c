/* SPDX-License-Identifier: MIT */
/*
 * The NOTIFY listener: a session that LISTENs on the table's wake-up
 * channel and reports how many notifications came. It never opens a
 * transaction; polling stays the fallback, so a lost notification costs at
 * most the poll interval.
 */
#include <errno.h>
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
	size_t warned; /* tables told of as waking no relay, this session */
};

/* Of those, the ones told at warn; the rest at debug, so that a pattern
 * of thousands without the trigger does not flood each reconnect. */
#define LISTEN_WARN_MAX 5

/*
 * The table's channel, as its trigger notifies it: the literal the
 * trigger function hashes (migration 002 wrote it as the table was spelled
 * then, 'outbox_events' or 'public.outbox_events'), read from the function
 * the table's enabled NOTIFY trigger runs, on the LISTEN session itself.
 * Computed from this relay's own spelling, a table migrated under another
 * (a name later qualified, a pattern) was listened for on a channel no
 * insert notified, without a word. Without such a trigger (none, disabled
 * or firing on replicas only, or the table not in the database the
 * session reached), or with a function whose channel it cannot read, it
 * is this spelling's channel, and the third column says why nothing may
 * wake it.
 */
#define LISTEN_CHANNEL_SQL                                                     \
	"SELECT format('LISTEN %%I', c), c, CASE WHEN to_regclass('%s') IS "   \
	"NULL THEN 'the table is not in the database this session reached' "   \
	"WHEN f IS NULL THEN 'the table has no enabled NOTIFY trigger "        \
	"(`outbox-relay migrate` with OUTBOX_LISTEN=on installs it)' WHEN m "  \
	"IS NULL THEN 'its NOTIFY trigger''s function names no channel the "   \
	"relay can read (changed by hand?): listened for on the channel of "   \
	"the relay''s own spelling, which it may not notify' END FROM "        \
	"(SELECT coalesce('outbox_wakeup_' || hashtext(replace(m, '''''', "    \
	"'''')), %s) AS c, f, m FROM (SELECT f, (regexp_match(f, "             \
	"$re$hashtext\\('((?:[^']|'')*)'\\)$re$))[1] AS m FROM (SELECT "       \
	"(SELECT p.prosrc FROM pg_trigger g JOIN pg_proc p ON p.oid = "        \
	"g.tgfoid WHERE g.tgrelid = to_regclass('%s') AND g.tgname = "         \
	"'%s_notify' AND g.tgenabled IN ('O', 'A')) AS f) y) z) x"

/* LISTEN on the table's channel (LISTEN_CHANNEL_SQL), kept as l's next
 * channel. */
static int listen_on(struct store_listener *l, const struct outbox_table *t,
		     char *err, size_t errlen)
{
	PGconn *conn = l->conn;
	char channel[200], sql[1400];
	char(*grown)[64] =
	    realloc(l->channels, (l->n + 1) * sizeof(*l->channels));
	if (!grown) {
		snprintf(err, errlen, "listen: out of memory");
		return STORE_ERROR;
	}
	l->channels = grown;
	store_channel_sql(t, channel, sizeof(channel));
	snprintf(sql, sizeof(sql), LISTEN_CHANNEL_SQL, t->quoted, channel,
		 t->quoted, t->name);
	PGresult *res = PQexec(conn, sql);
	if (PQresultStatus(res) == PGRES_TUPLES_OK) {
		char listen[128];
		snprintf(listen, sizeof(listen), "%s", PQgetvalue(res, 0, 0));
		snprintf(l->channels[l->n], sizeof(l->channels[l->n]), "%s",
			 PQgetvalue(res, 0, 1));
		if (!PQgetisnull(res, 0, 2))
			log_fields(l->warned++ < LISTEN_WARN_MAX ? LOG_WARN
								 : LOG_DEBUG,
				   "inserts into a table will wake no relay; "
				   "it is polled",
				   "table", t->literal, "why",
				   PQgetvalue(res, 0, 2), NULL);
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

/* Waits up to timeout_ms for a notification on channel, dropping the
 * others (the caller wakes every table after opening). 1 when it came, 0
 * when not, -1 when the session was lost. */
static int await_channel(PGconn *conn, const char *channel, int64_t timeout_ms)
{
	int64_t deadline = clock_ms() + timeout_ms;
	for (;;) {
		bool came = false;
		PGnotify *note;
		while ((note = PQnotifies(conn)) != NULL) {
			came = came || strcmp(note->relname, channel) == 0;
			PQfreemem(note);
		}
		int64_t left = deadline - clock_ms();
		if (came || left <= 0)
			return came ? 1 : 0;
		struct pollfd pfd = {.fd = PQsocket(conn), .events = POLLIN};
		if ((poll(&pfd, 1, (int)left) < 0 && errno != EINTR) ||
		    PQconsumeInput(conn) != 1)
			return -1;
	}
}

/*
 * Proves that notifications reach this session while it waits between
 * statements: LISTENs on a channel of its own and notifies it from
 * another session. Through a transaction-mode pooler the LISTEN stays on a
 * server connection that is no longer this client's once the statement
 * ends, and the pooler drops what arrives there (PgBouncer logs "got
 * packet 'A' from server when not linked"), so every producer's
 * notification would be lost without a word. The notification comes from
 * another session because one sent by this session's own statement is
 * delivered with its reply, while the server connection is still linked.
 */
static int probe(struct store_listener *l, const struct pgconn_options *po,
		 char *err, size_t errlen)
{
	PGconn *other = NULL;
	char channel[64] = "", listen[128] = "", why[512];
	int rc = STORE_RECONNECT;
	PGresult *res = PQexec(
	    l->conn, "SELECT format('LISTEN %I', c), c FROM (SELECT "
		     "'outbox_relay_probe_' || left(md5(random()::text || "
		     "clock_timestamp()::text), 16) AS c) x");
	if (PQresultStatus(res) != PGRES_TUPLES_OK)
		goto failed;
	snprintf(listen, sizeof(listen), "%s", PQgetvalue(res, 0, 0));
	snprintf(channel, sizeof(channel), "%s", PQgetvalue(res, 0, 1));
	PQclear(res);
	res = PQexec(l->conn, listen);
	if (PQresultStatus(res) != PGRES_COMMAND_OK)
		goto failed;
	PQclear(res);
	res = NULL;
	other = pgconn_connect(po, err, errlen);
	if (!other)
		goto out;
	const char *values[] = {channel};
	res = PQexecParams(other, "SELECT pg_notify($1, 'probe')", 1, NULL,
			   values, NULL, NULL, 0);
	if (PQresultStatus(res) != PGRES_TUPLES_OK) {
		pgconn_error(other, res, why, sizeof(why));
		snprintf(err, errlen, "listen probe: notify: %s", why);
		goto out;
	}
	int came = await_channel(l->conn, channel, STORE_LISTEN_PROBE_MS);
	if (came < 0) {
		pgconn_error(l->conn, NULL, why, sizeof(why));
		snprintf(err, errlen, "LISTEN session: %s", why);
	} else if (came == 0) {
		snprintf(
		    err, errlen,
		    "a notification sent to the LISTEN session did not "
		    "reach it within %d ms: what arrives while it waits is "
		    "lost, as through a transaction-mode pooler (PgBouncer "
		    "pool_mode = transaction); LISTEN needs a direct "
		    "connection or session pooling",
		    STORE_LISTEN_PROBE_MS);
		rc = STORE_REFUSED;
		/* Best effort: through the pooler it reaches the server
		 * connection that LISTENs only when the pool is idle. */
		PQclear(res);
		res = PQexec(l->conn, "UNLISTEN *");
	} else
		rc = STORE_OK;
	goto out;
failed:
	pgconn_error(l->conn, res, why, sizeof(why));
	snprintf(err, errlen, "listen probe: %s", why);
	if (!pgconn_needs_reconnect(l->conn, res))
		rc = STORE_ERROR;
out:
	PQclear(res);
	if (other)
		PQfinish(other);
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
	/* Nothing is set on the session before the probe has shown that it
	 * is one of its own, not a pooler's shared server connection. */
	struct pgconn_options po = pgconn_options_for(
	    opt->conninfo, opt->app_name, opt->statement_timeout_ms,
	    opt->lock_timeout_ms, opt->dead_peer_ms, PGCONN_TRANSACTION);
	l->conn = pgconn_connect(&po, err, errlen);
	int rc = l->conn ? probe(l, &po, err, errlen) : STORE_RECONNECT;
	if (rc == STORE_OK &&
	    pgconn_session_settings(l->conn, &po, err, errlen) != 0)
		rc = STORE_RECONNECT;
	if (rc == STORE_OK && opt->table)
		rc = listen_on(l, &t, err, errlen);
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
