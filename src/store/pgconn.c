/* SPDX-License-Identifier: MIT */
/* Opening Postgres sessions, classifying their errors, checking conninfo. */
#include "pgconn.h"
#include "store.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "config/config.h"
#include "guards.h"

int pgconn_server_pid(PGconn *conn, long *server_pid, char *err, size_t errlen)
{
	PGresult *res = PQexec(conn, "SELECT pg_backend_pid()");
	int rc = -1;
	if (PQresultStatus(res) == PGRES_TUPLES_OK && PQntuples(res) == 1) {
		*server_pid = strtol(PQgetvalue(res, 0, 0), NULL, 10);
		rc = 0;
	} else {
		pgconn_error(conn, res, err, errlen);
	}
	PQclear(res);
	return rc;
}

void pgconn_describe(PGconn *conn, char *out, size_t outlen)
{
	const char *host = PQhost(conn);
	const char *port = PQport(conn);
	const char *db = PQdb(conn);
	const char *user = PQuser(conn);
	snprintf(out, outlen, "%s:%s/%s as %s", host && *host ? host : "?",
		 port && *port ? port : "?", db ? db : "?", user ? user : "?");
}

static void trim_newlines(char *s)
{
	size_t n = strlen(s);
	while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == '\r'))
		s[--n] = '\0';
	for (char *p = s; *p; p++)
		if (*p == '\n')
			*p = ' ';
}

void pgconn_error(PGconn *conn, const PGresult *res, char *err, size_t errlen)
{
	const char *state =
	    res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	const char *msg = res ? PQresultErrorMessage(res) : NULL;
	if (!msg || !*msg)
		msg = conn ? PQerrorMessage(conn) : "no connection";
	if (!*msg)
		msg = "unknown error";
	snprintf(err, errlen, "%s%s%s", state ? state : "", state ? ": " : "",
		 msg);
	trim_newlines(err);
}

static void heard(void *arg, const PGresult *res)
{
	const char *sev =
	    PQresultErrorField(res, PG_DIAG_SEVERITY_NONLOCALIZED);
	const char *msg = PQresultErrorField(res, PG_DIAG_MESSAGE_PRIMARY);
	bool ends =
	    sev && (strcmp(sev, "FATAL") == 0 || strcmp(sev, "PANIC") == 0);
	enum log_level level = LOG_INFO;
	if (ends && arg)
		*(bool *)arg = true;
	if (ends ||
	    (sev && (strcmp(sev, "ERROR") == 0 || strcmp(sev, "WARNING") == 0)))
		level = LOG_WARN;
	else if (sev && strncmp(sev, "DEBUG", 5) == 0)
		level = LOG_DEBUG;
	log_fields(level, ends ? "postgres ended the session" : "postgres said",
		   "severity", sev, "sqlstate",
		   PQresultErrorField(res, PG_DIAG_SQLSTATE), "message",
		   msg ? msg : PQresultErrorMessage(res), NULL);
}

void pgconn_hear(PGconn *conn, bool *ended)
{
	PQsetNoticeReceiver(conn, heard, ended);
}

/* Runs sql, which must succeed; err says "what on where failed: why". */
static int exec_setup(PGconn *conn, const char *sql, const char *what,
		      const char *where, char *err, size_t errlen)
{
	PGresult *res = PQexec(conn, sql);
	ExecStatusType st = PQresultStatus(res);
	int rc = 0;
	if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK) {
		char why[512];
		pgconn_error(conn, res, why, sizeof(why));
		snprintf(err, errlen, "%s on %s failed: %s", what, where, why);
		rc = -1;
	}
	PQclear(res);
	return rc;
}

/* The dead-peer window split into TCP keepalive settings, the same on the
 * relay's end and the server's: the first probe after half the window of
 * silence, then three probes a sixth of it apart. tcp_user_timeout gives up
 * on data sent but never acknowledged after the whole window. */
struct keepalive {
	int idle_s, interval_s, count;
	int64_t user_timeout_ms;
};

#define DEAD_PEER_DEFAULT_MS 15000

static struct keepalive keepalive_of(int64_t dead_peer_ms)
{
	int64_t w = dead_peer_ms > 0 ? dead_peer_ms : DEAD_PEER_DEFAULT_MS;
	struct keepalive k = {
	    .idle_s = (int)(w / 2000 > 0 ? w / 2000 : 1),
	    .interval_s = (int)(w / 6000 > 0 ? w / 6000 : 1),
	    .count = 3,
	    .user_timeout_ms = w,
	};
	return k;
}

/*
 * The lock timeout is shorter than the statement timeout so a blocked
 * statement reports the lock (unless the caller asks for its own, shorter
 * one), and an idle transaction of ours cannot pin vacuum's horizon for
 * long.
 */
struct timeouts {
	long long statement_ms, lock_ms, idle_ms;
};

static struct timeouts timeouts_of(const struct pgconn_options *opt)
{
	int64_t st = opt->statement_timeout_ms;
	int64_t lock = opt->lock_timeout_ms > 0 ? opt->lock_timeout_ms
		       : st > 0			? st / 2
						: 5000;
	int64_t idle = opt->idle_in_transaction_ms > 0
			   ? opt->idle_in_transaction_ms
		       : st > 0 ? (st * 3 > 10000 ? st * 3 : 10000)
				: 60000;
	struct timeouts t = {(long long)st, (long long)(lock > 0 ? lock : 1),
			     (long long)idle};
	return t;
}

char *pgconn_tx_settings(const struct pgconn_options *opt, enum pgconn_tx tx)
{
	struct timeouts t = timeouts_of(opt);
	struct keepalive k = keepalive_of(opt->dead_peer_ms);
	char idle[96] = "", lease[400] = "", sql[880];

	if (tx == PGCONN_TX_EXPLICIT ||
	    (tx == PGCONN_TX_LEASE && GUARD_LEASE_IDLE_TIMEOUT))
		snprintf(idle, sizeof(idle),
			 ", set_config('idle_in_transaction_session_timeout', "
			 "'%lld', true)",
			 t.idle_ms);
	/* The server's end of the dead-peer window, for as long as the lease
	 * holds rows: a relay cut off mid-lease loses its locks within the
	 * window rather than after the kernel's two hours of keepalive
	 * silence. Only here: a session's other transactions hold nothing
	 * across round trips, and behind a pooler these land on the pooler's
	 * own server socket, which must get its values back (they do, with
	 * the transaction). The lease walks the pending index in its order:
	 * an index scan marks the entries of rows earlier leases took (dead
	 * once those commit) as dead as it passes them, so the next lease
	 * skips them; a bitmap scan marks nothing, and Postgres picks one
	 * whenever its statistics say few rows are pending (a queue table's
	 * normal state): then every lease re-reads every row leased since
	 * the last vacuum (docs/design.md §4). The marks name their rows by
	 * ctid, and on a table Postgres thinks small it reads the whole
	 * table instead of fetching them: a plan made so stays cached for
	 * the prepared statement while the table grows (measured: 374 us of
	 * Postgres CPU per event against 60 with history kept). No
	 * statement of a lease transaction needs a sequential scan, of the
	 * outbox table or of the claims table (read through its written_by
	 * index since migration 006). Each has one right plan whatever its
	 * values, and Postgres, left to choose, planned some anew on every
	 * call, at a cost that grew with a held snapshot (planning was 906
	 * of the lease's 1843 ms per 20 s late in a 2-minute hold, 105 of
	 * the claim's 169 in another run; docs/benchmark.md, "A held
	 * snapshot"), so they run their generic plan. Nor does any need a
	 * sort: the lease's late scan (migration 007) reads its own index in
	 * writer order, and its generic plan otherwise read the pending index
	 * from its start and sorted what it found, stepping over every entry
	 * a held snapshot keeps (33,000 buffers a lease late in a hold with
	 * history kept, 2 with its index). */
	const char *indexed = PGCONN_INDEXED_SETTINGS;
	if (tx == PGCONN_TX_LEASE)
		snprintf(lease, sizeof(lease),
			 "%s, set_config('tcp_keepalives_idle', '%d', true), "
			 "set_config('tcp_keepalives_interval', '%d', true), "
			 "set_config('tcp_keepalives_count', '%d', true), "
			 "set_config('tcp_user_timeout', '%lld', true)",
			 indexed, k.idle_s, k.interval_s, k.count,
			 (long long)k.user_timeout_ms);
	else if (tx == PGCONN_TX_INDEXED)
		snprintf(lease, sizeof(lease), "%s", indexed);
	snprintf(sql, sizeof(sql),
		 "SELECT set_config('statement_timeout', '%lld', true), "
		 "set_config('lock_timeout', '%lld', true), "
		 "set_config('jit', 'off', true)%s%s",
		 t.statement_ms, t.lock_ms, idle, lease);
	return strdup(sql);
}

/*
 * Settings go in SET statements, not startup options, so the relay also
 * works through poolers that refuse startup parameters. A session of its
 * own (the listener's, migrate's: both need a direct connection) takes
 * them once; the store's sessions take them per transaction instead
 * (pgconn_tx_settings()).
 */
static int apply_settings(PGconn *conn, const struct pgconn_options *opt,
			  const char *where, char *err, size_t errlen)
{
	struct timeouts t = timeouts_of(opt);
	/* The server's end of the same dead-peer window: without it a relay
	 * cut off mid-transaction keeps its session, locks and open
	 * transaction on the server for the kernel's two hours of keepalive
	 * silence, or until idle_in_transaction_session_timeout. (Ignored on
	 * a Unix socket.) */
	struct keepalive k = keepalive_of(opt->dead_peer_ms);
	char sql[640];
	if (opt->scope == PGCONN_SESSION) {
		snprintf(sql, sizeof(sql),
			 "SET statement_timeout = %lld; SET lock_timeout = "
			 "%lld; SET idle_in_transaction_session_timeout = "
			 "%lld; SET tcp_keepalives_idle = %d; "
			 "SET tcp_keepalives_interval = %d; "
			 "SET tcp_keepalives_count = %d; SET tcp_user_timeout "
			 "= %lld; SET jit = off; SET "
			 "default_transaction_isolation = 'read committed'",
			 t.statement_ms, t.lock_ms, t.idle_ms, k.idle_s,
			 k.interval_s, k.count, (long long)k.user_timeout_ms);
		if (exec_setup(conn, sql, "session settings", where, err,
			       errlen) != 0)
			return -1;
	}
	if (opt->extra_sql && exec_setup(conn, opt->extra_sql, "session setup",
					 where, err, errlen) != 0)
		return -1;
	return 0;
}

PGconn *pgconn_connect(const struct pgconn_options *opt, char *err,
		       size_t errlen)
{
	/* keepalives + tcp_user_timeout: a server that vanished without a
	 * FIN is noticed within the dead-peer window (OUTBOX_PG_DEAD_PEER_
	 * TIMEOUT) instead of the kernel's two hours. */
	struct keepalive k = keepalive_of(opt->dead_peer_ms);
	char idle[16], interval[16], count[16], user_timeout[24], connect[16];
	/* A connection attempt into a cut link (no answer to the SYN) is
	 * given up within the same window, so a relay tries again soon after
	 * the link returns instead of waiting out the kernel's SYN retries. */
	snprintf(connect, sizeof(connect), "%lld",
		 (long long)(k.user_timeout_ms + 999) / 1000);
	snprintf(idle, sizeof(idle), "%d", k.idle_s);
	snprintf(interval, sizeof(interval), "%d", k.interval_s);
	snprintf(count, sizeof(count), "%d", k.count);
	snprintf(user_timeout, sizeof(user_timeout), "%lld",
		 (long long)k.user_timeout_ms);
	/* client_encoding after dbname, so that it wins over the URL's
	 * and PGCLIENTENCODING: every text the relay reads (an event's type,
	 * source, subject, headers) goes out as UTF-8, and in a database of
	 * another encoding (LATIN1, say) the server converts it; read in that
	 * encoding it would fail the CloudEvents checks as bad input. */
	const char *keys[] = {"dbname",		  "application_name",
			      "client_encoding",  "keepalives",
			      "keepalives_idle",  "keepalives_interval",
			      "keepalives_count", "tcp_user_timeout",
			      "connect_timeout",  NULL};
	const char *values[] = {
	    opt->conninfo, opt->application_name, "UTF8",  "1", idle, interval,
	    count,	   user_timeout,	  connect, NULL};
	char where[256];
	PGconn *conn = NULL;

	if (!opt->conninfo) {
		/* libpq's PG* environment variables apply. */
		keys[0] = "application_name";
		values[0] = opt->application_name;
		for (size_t i = 1; keys[i]; i++) {
			keys[i] = keys[i + 1];
			values[i] = values[i + 1];
		}
	}
	conn = PQconnectdbParams(keys, values, 1);
	if (!conn) {
		snprintf(err, errlen, "connect to postgres: out of memory");
		return NULL;
	}
	pgconn_hear(conn, NULL);
	pgconn_describe(conn, where, sizeof(where));
	if (PQstatus(conn) != CONNECTION_OK) {
		char why[512];
		pgconn_error(conn, NULL, why, sizeof(why));
		snprintf(err, errlen, "connect to postgres at %s failed: %s",
			 where, why);
		goto fail;
	}

	if (apply_settings(conn, opt, where, err, errlen) != 0)
		goto fail;
	return conn;
fail:
	PQfinish(conn);
	return NULL;
}

int pgconn_session_settings(PGconn *conn, const struct pgconn_options *opt,
			    char *err, size_t errlen)
{
	struct pgconn_options session = *opt;
	session.scope = PGCONN_SESSION;
	session.extra_sql = NULL; /* pgconn_connect() ran it */
	char where[256];
	pgconn_describe(conn, where, sizeof(where));
	return apply_settings(conn, &session, where, err, errlen);
}

bool pgconn_needs_reconnect(PGconn *conn, const PGresult *res)
{
	if (!conn || PQstatus(conn) != CONNECTION_OK)
		return true;
	if (!res)
		return true;
	const char *state = PQresultErrorField(res, PG_DIAG_SQLSTATE);
	if (!state) {
		/* An error without SQLSTATE is raised by libpq itself: the
		 * connection is broken. */
		return PQresultStatus(res) == PGRES_FATAL_ERROR;
	}
	return strncmp(state, "08", 2) == 0 || strcmp(state, "57P01") == 0 ||
	       strcmp(state, "57P02") == 0 || strcmp(state, "57P03") == 0 ||
	       strcmp(state, "25006") == 0;
}

bool pgconn_is_retryable(const PGresult *res)
{
	const char *state =
	    res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	return state &&
	       (strcmp(state, "40001") == 0 || strcmp(state, "40P01") == 0);
}

int store_conninfo_check(const char *conninfo, char *why, size_t whylen)
{
	char *msg = NULL;
	PQconninfoOption *opts;

	/* libpq takes the first '@' and would show the rest of a password
	 * holding one as the host name, in errors and /readyz. */
	if (config_url_userinfo_check(conninfo, why, whylen) != 0)
		return -1;
	opts = PQconninfoParse(conninfo, &msg);
	/* libpq's message may quote the password: say only what is wrong. */
	PQfreemem(msg);
	if (!opts) {
		snprintf(why, whylen,
			 "not a valid libpq connection URI or key=value "
			 "string");
		return -1;
	}
	PQconninfoFree(opts);
	return 0;
}

/* The value of keyword in opts, or libpq's environment variable for it
 * (what libpq itself would fall back to), or NULL. */
static const char *conninfo_value(const PQconninfoOption *opts,
				  const char *keyword, const char *envvar)
{
	for (const PQconninfoOption *o = opts; o && o->keyword; o++)
		if (strcmp(o->keyword, keyword) == 0 && o->val && o->val[0])
			return o->val;
	return getenv(envvar);
}

bool store_conninfo_plaintext(const char *conninfo, char *hosts, size_t len)
{
	static const char *const encrypted[] = {"require", "verify-ca",
						"verify-full"};
	PQconninfoOption *opts =
	    PQconninfoParse(conninfo ? conninfo : "", NULL);
	const char *mode, *list, *p;
	size_t used = 0;
	bool remote = false;

	hosts[0] = '\0';
	if (!opts)
		return false;
	mode = conninfo_value(opts, "sslmode", "PGSSLMODE");
	for (size_t i = 0; mode && i < sizeof(encrypted) / sizeof(*encrypted);
	     i++)
		if (strcmp(mode, encrypted[i]) == 0)
			goto out;
	/* hostaddr, when given, is where libpq connects. */
	list = conninfo_value(opts, "hostaddr", "PGHOSTADDR");
	if (!list)
		list = conninfo_value(opts, "host", "PGHOST");
	for (p = list ? list : ""; *p;) {
		size_t n = strcspn(p, ",");

		if (!config_host_is_local(p, n)) {
			int w = snprintf(hosts + used, len - used, "%s%.*s",
					 remote ? "," : "", (int)n, p);
			if (w > 0 && (size_t)w < len - used)
				used += (size_t)w;
			remote = true;
		}
		p += n + (p[n] == ',');
	}
out:
	PQconninfoFree(opts);
	return remote;
}

struct pgconn_options pgconn_options_for(const char *conninfo, const char *app,
					 int64_t statement_timeout_ms,
					 int64_t lock_timeout_ms,
					 int64_t dead_peer_ms,
					 enum pgconn_scope scope)
{
	struct pgconn_options po = {
	    .conninfo = conninfo,
	    .application_name = app ? app : "outbox-relay",
	    .statement_timeout_ms = statement_timeout_ms,
	    .lock_timeout_ms = lock_timeout_ms,
	    .dead_peer_ms = dead_peer_ms,
	    .scope = scope,
	};
	return po;
}
