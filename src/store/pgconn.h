/* SPDX-License-Identifier: MIT */
/*
 * Postgres sessions as the relay opens them: keepalives and
 * tcp_user_timeout so a black-holed server is noticed in seconds, and the
 * settings of docs/design.md §7, on the session or in each transaction.
 * Also: which errors mean "reconnect" rather than "this statement failed".
 */
#ifndef OUTBOX_PGCONN_H
#define OUTBOX_PGCONN_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct pgconn_options {
	const char *conninfo;	      /* URL or key=value; NULL: PG* env */
	const char *application_name; /* relay/host/worker */
	int64_t statement_timeout_ms; /* 0: server default */
	int64_t lock_timeout_ms;      /* 0: half the statement timeout */
	/* 0: three statement timeouts (at least 10 s). A worker's session
	 * sets the lease timeout: it ends a stalled lease transaction. */
	int64_t idle_in_transaction_ms;
	/* A peer silent this long is given up on both ends (keepalives and
	 * tcp_user_timeout of libpq and of the server); 0: 15 s. */
	int64_t dead_peer_ms;
	const char *extra_sql; /* tests' diagnostics; may be NULL */
	/* Where the settings above hold: PGCONN_SESSION sets them once on
	 * the session; PGCONN_TRANSACTION sets none there, and the caller
	 * puts pgconn_tx_settings() into each transaction it runs. */
	enum pgconn_scope { PGCONN_SESSION, PGCONN_TRANSACTION } scope;
};

/* How every explicit transaction of the relay begins. A database or role
 * may default to REPEATABLE READ or SERIALIZABLE (teams set it for their
 * application's sake): the lease's FOR UPDATE SKIP LOCKED then failed
 * (40001) on any row another lease concluded after its snapshot, where
 * READ COMMITTED checks the row's newest version, and the relay's
 * transactions took part in the application's serializable conflicts.
 * Set as the transaction begins: a setting in the transaction's first
 * SELECT (pgconn_tx_settings()) comes after its snapshot. */
#define PGCONN_BEGIN "BEGIN ISOLATION LEVEL READ COMMITTED"

/* Which transaction pgconn_tx_settings() is for. */
/* The planner settings of a transaction that reads only by index
 * (PGCONN_TX_INDEXED, the lease's, the sweep's; pgconn.c says why), as
 * set_config() calls to append to a SELECT list. */
#define PGCONN_INDEXED_SETTINGS                                                \
	", set_config('enable_bitmapscan', 'off', true), "                     \
	"set_config('enable_seqscan', 'off', true), "                          \
	"set_config('enable_sort', 'off', true), "                             \
	"set_config('plan_cache_mode', 'force_generic_plan', true)"

enum pgconn_tx {
	/* One statement in its implicit transaction: the statement and
	 * lock timeouts, jit. */
	PGCONN_TX_STATEMENT,
	/* An explicit transaction: also idle_in_transaction_session_timeout
	 * (idle_in_transaction_ms). */
	PGCONN_TX_EXPLICIT,
	/* The lease transaction (docs/design.md §4): also the server's end
	 * of the dead-peer window, and the planning of PGCONN_TX_INDEXED. */
	PGCONN_TX_LEASE,
	/* One statement that reads by index (the claim session's):
	 * PGCONN_TX_STATEMENT's settings, no bitmap or sequential scans, and
	 * the prepared statement's generic plan. */
	PGCONN_TX_INDEXED,
};

/*
 * The settings of opt for a transaction of kind tx, as one SELECT that
 * sets them for that transaction alone (set_config(..., true)): sent as
 * the transaction's first statement (after its BEGIN), in the same round
 * trip, they hold for it whatever sits between the relay and Postgres
 * (a transaction-mode pooler hands each transaction a server connection
 * of its own choosing) and end with it, so none outlives it on a server
 * connection that other clients share. Malloc'd; NULL when out of memory.
 */
char *pgconn_tx_settings(const struct pgconn_options *opt, enum pgconn_tx tx);

/*
 * Connects and, for PGCONN_SESSION, applies the session settings. Returns the
 * connection, or NULL with err naming the server (host, port, database, user)
 * and the reason, never a password.
 */
PGconn *pgconn_connect(const struct pgconn_options *opt, char *err,
		       size_t errlen);

/*
 * Sends what the server says outside a statement's reply to the relay's
 * log instead of libpq's raw stderr line: a NOTICE, or the FATAL it sends
 * before it ends the session (a restart, pg_terminate_backend, the idle
 * transaction timeout). Such a FATAL sets *ended when ended is not NULL;
 * ended must live as long as conn. pgconn_connect() installs it with NULL.
 */
void pgconn_hear(PGconn *conn, bool *ended);

/*
 * Applies opt's session settings to conn, opened with PGCONN_TRANSACTION:
 * for a session that proved first that it is a session of its own (the
 * listener's probe), so that nothing was set on a pooler's shared server
 * connection before. 0, or -1 with err.
 */
int pgconn_session_settings(PGconn *conn, const struct pgconn_options *opt,
			    char *err, size_t errlen);

/*
 * True when res (NULL after a lost connection) or the state of conn means
 * the session is gone or unusable for writes: SQLSTATE class 08,
 * 57P01-57P03, 25006 (read-only after a failover), or a bad connection.
 */
bool pgconn_needs_reconnect(PGconn *conn, const PGresult *res);

/* True for 40001 (serialization failure) and 40P01 (deadlock): retry. */
bool pgconn_is_retryable(const PGresult *res);

/* Writes "SQLSTATE: message" of res (or of conn when res is NULL). */
void pgconn_error(PGconn *conn, const PGresult *res, char *err, size_t errlen);

/* Describes where conn points: "host:port/db as user". */
void pgconn_describe(PGconn *conn, char *out, size_t outlen);

/* The process id of the server process answering conn (*server_pid),
 * which a pooler makes differ from PQbackendPID(conn): it answers the
 * connection itself, under an id of its own making. 0, or -1 with err
 * when the question failed. */
int pgconn_server_pid(PGconn *conn, long *server_pid, char *err, size_t errlen);

/* The options of a session of its own (a catalog, a listener) for the
 * app name, timeouts and peer window given; app NULL: "outbox-relay". */
struct pgconn_options pgconn_options_for(const char *conninfo, const char *app,
					 int64_t statement_timeout_ms,
					 int64_t lock_timeout_ms,
					 int64_t dead_peer_ms,
					 enum pgconn_scope scope);

#endif
