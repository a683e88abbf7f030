/* SPDX-License-Identifier: MIT */
/*
 * Postgres sessions as the relay opens them: keepalives and
 * tcp_user_timeout so a black-holed server is noticed in seconds, and the
 * session settings of docs/design.md §7 on every connection.
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
};

/*
 * Connects and applies the session settings. Returns the connection, or
 * NULL with err naming the server (host, port, database, user) and the
 * reason, never a password.
 */
PGconn *pgconn_connect(const struct pgconn_options *opt, char *err,
		       size_t errlen);

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

#endif
