/* SPDX-License-Identifier: MIT */
/*
 * The store's operator statements, a second file of the store module (all
 * SQL lives in the store): the replica registry, the one gauge query of
 * the ops thread, everything `status` shows, operator pauses, and the
 * time arguments of `redrive`.
 *
 * Every function runs on a session the caller owns (store_conn() of an
 * open store, or any PGconn) and keeps no state of its own; one session is
 * used by one thread at a time. The database clock is the only clock:
 * ages and "dead" are computed with now() in the statements.
 *
 * Return values as in store.h: 0 success; STORE_RECONNECT when the session
 * is gone; STORE_ERROR otherwise; err says what failed either way.
 */
#ifndef OUTBOX_STORE_ADMIN_H
#define OUTBOX_STORE_ADMIN_H

#include <cjson/cJSON.h>
#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store.h"
#include "base/base.h"

/* A replica whose last heartbeat is older than this is shown dead. */
#define STORE_ADMIN_DEAD_AFTER_S 15
/* Registry rows silent for this long are deleted by any live replica. */
#define STORE_ADMIN_PRUNE_AFTER_S 86400
/* store_admin_time(): Postgres could not read the value (usage error). */
#define STORE_ADMIN_INVALID (-4)

/*
 * Upserts this replica's registry row: last_seen_at = now(), the version,
 * state 'draining' or 'alive'. starting resets started_at (an id is
 * host/pid, which a restarted container may reuse). Also deletes rows
 * silent for STORE_ADMIN_PRUNE_AFTER_S, so the registry does not grow with
 * every deploy.
 */
int store_admin_heartbeat(PGconn *conn, const struct outbox_table *t,
			  const char *id, const char *version, bool draining,
			  bool starting, char *err, size_t errlen);

/* Deletes the registry row id (a replica that stopped cleanly). */
int store_admin_forget(PGconn *conn, const struct outbox_table *t,
		       const char *id, char *err, size_t errlen);

/* The SQL-backed gauges, from one statement. */
struct store_admin_gauges {
	int64_t backlog;	   /* pending rows */
	int64_t oldest_pending_ms; /* now() - min(created_at) of pending; 0 */
	int64_t in_flight;
	int64_t failed;
	int64_t dead_tuples;	  /* pg_stat_user_tables.n_dead_tup */
	int64_t live_replicas;	  /* heartbeat within the dead threshold */
	int64_t blocked_keys;	  /* 0 without a blocked-keys table */
	int64_t notify_queue_ppm; /* pg_notification_queue_usage() * 1e6 */
};

int store_admin_gauges(PGconn *conn, const struct outbox_table *t,
		       struct store_admin_gauges *g, char *err, size_t errlen);

/*
 * Everything `status` shows, read in one read-only repeatable-read
 * transaction so the sections agree with each other. Lists of rows are
 * cut to max_rows. On success *out is a new cJSON object the caller
 * deletes; its members are documented in docs/operations.md.
 */
int store_admin_status(PGconn *conn, const struct outbox_table *t, int max_rows,
		       cJSON **out, char *err, size_t errlen);

/*
 * Inserts (or, when present, updates the reason and author of) the pause
 * of destination ("*" = all leasing). *was_paused says it existed.
 */
int store_admin_pause(PGconn *conn, const struct outbox_table *t,
		      const char *destination, const char *reason,
		      const char *paused_by, bool *was_paused, char *err,
		      size_t errlen);

/* Deletes the pause of destination; *was_paused says it existed. */
int store_admin_resume(PGconn *conn, const struct outbox_table *t,
		       const char *destination, bool *was_paused, char *err,
		       size_t errlen);

/*
 * Reads a time argument: a duration with a unit ("90s", "15m", "2h",
 * "3d") means that long before now(); anything else is read as a
 * timestamptz by Postgres. Writes the instant as ISO 8601 with offset
 * into out. STORE_ADMIN_INVALID when Postgres cannot read it.
 */
int store_admin_time(PGconn *conn, const char *text, char *out, size_t outlen,
		     char *err, size_t errlen);

#endif
