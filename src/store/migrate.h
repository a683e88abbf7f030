/* SPDX-License-Identifier: MIT */
/*
 * Schema migrations: the plain SQL files of sql/, embedded at build time,
 * applied in order and recorded in a schema-version table, under an
 * advisory lock so concurrent `migrate` runs (say, two pods starting) both
 * succeed. A step whose lock blocks the application's writes runs with a
 * short lock_timeout and retries, so it never queues in front of their
 * inserts; concurrent index builds and VALIDATE CONSTRAINT, which block no
 * write, wait as long as they must (design.md §2).
 *
 * A file whose first line is "-- outbox:no-transaction" runs statement by
 * statement outside a transaction (CREATE INDEX CONCURRENTLY); its
 * statements are separated by lines reading "-- outbox:next". Before such a
 * file runs, invalid indexes left by an interrupted build are dropped.
 */
#ifndef OUTBOX_MIGRATE_H
#define OUTBOX_MIGRATE_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stdio.h>

#include "base/base.h"
#include "pgconn.h"
#include "schema.h"
#include "store.h"

/*
 * Expands the placeholders of sql for table t. Returns a malloc'd string
 * the caller frees, or NULL when out of memory.
 */
char *migrate_expand(const char *sql, const struct outbox_table *t);

/*
 * The session migrate and contract steps run on: opt's table parsed into
 * t, connected with po (filled here: opt's conninfo and lock_timeout, no
 * statement_timeout, so index builds take their time). NULL with *rc
 * (STORE_ERROR, STORE_RECONNECT) and err.
 */
PGconn *migrate_session(const struct store_options *opt, struct outbox_table *t,
			struct pgconn_options *po, int *rc, char *err,
			size_t errlen);

/*
 * Takes the session-level advisory lock that migrate and contract steps of
 * table t run under, waiting at most a few seconds; 0, or -1 with err.
 * migrate_unlock() gives it back.
 */
int migrate_lock(PGconn *conn, const struct outbox_table *t, char *err,
		 size_t errlen);
/*
 * 0 when this session holds the migration lock, asked in a statement of
 * its own; -1 with err otherwise. Behind a transaction-mode pooler each
 * statement may run on another server session, or on the same one after
 * the pool's DISCARD ALL let the lock go: the lock would guard nothing,
 * and might stay held by a pooled server session. migrate_lock() asks
 * once it has the lock, and each step again before it runs.
 */
int migrate_lock_held(PGconn *conn, const struct outbox_table *t, char *err,
		      size_t errlen);
void migrate_unlock(PGconn *conn, const struct outbox_table *t);

/* How long a step outside a transaction may wait for its locks. */
enum ddl_wait {
	/* A lock that blocks the application's writes (a trigger on the
	 * table): DDL_LOCK_TIMEOUT, retried, so the inserts queued behind
	 * it wait that long at most. */
	DDL_WAIT_SHORT,
	/* SHARE UPDATE EXCLUSIVE (CREATE INDEX CONCURRENTLY, VALIDATE
	 * CONSTRAINT), which no write waits for: as long as it takes. Such a
	 * step also waits for every older snapshot, and cut short by a lock
	 * timeout a concurrent build leaves an invalid index that IF NOT
	 * EXISTS would then take for built. */
	DDL_WAIT_UNBOUNDED,
};

/*
 * Outside a transaction: sql, retried while it could not get its lock
 * within wait (at most a few dozen times). 0, or -1 with err.
 */
int migrate_exec_retrying(PGconn *conn, const char *sql, enum ddl_wait wait,
			  char *err, size_t errlen);

struct migrate_watch;

/* migrate_exec_retrying() reporting an index build's progress through w
 * (may be NULL; below). */
int migrate_exec_watched(PGconn *conn, const char *sql, enum ddl_wait wait,
			 struct migrate_watch *w, char *err, size_t errlen);

/*
 * One statement of a migration outside a transaction, with
 * DDL_WAIT_UNBOUNDED when it takes no lock a writer waits for (a
 * concurrent index build or drop, a VALIDATE) and DDL_WAIT_SHORT
 * otherwise, except that a CREATE INDEX CONCURRENTLY IF NOT
 * EXISTS on t, when t is partitioned, is built on the parent alone and
 * then concurrently on each partition, each attached as it is built
 * (migrate_index.c). 0, or -1 with err.
 */
int migrate_statement(PGconn *conn, const struct outbox_table *t,
		      const char *stmt, struct migrate_watch *w, char *err,
		      size_t errlen);

/* Drops, concurrently, the invalid indexes on t, its partitions and its
 * claims' table (builds cut short: a REINDEX's or CREATE INDEX's
 * CONCURRENTLY, a migration's). 0, or -1 with err. */
int migrate_drop_invalid_indexes(PGconn *conn, const struct outbox_table *t,
				 FILE *out, char *err, size_t errlen);

/* The truth of sql's one boolean, asked with its n parameter values: 1
 * or 0 (0 too when no row came), or -1 with err. */
int migrate_ask_n(PGconn *conn, const char *sql, int n,
		  const char *const *values, char *err, size_t errlen);

/*
 * The statements of sql (a migration's body, not yet expanded, its
 * statements cut at "-- outbox:next") outside a transaction, each by
 * migrate_statement(), after dropping the invalid indexes a run cut short
 * left on t and its partitions. Errors name the body as name. 0, or -1
 * with err.
 */
int migrate_body(PGconn *conn, const struct outbox_table *t, const char *sql,
		 FILE *out, struct migrate_watch *w, const char *name,
		 char *err, size_t errlen);

/*
 * Applies every migration not yet recorded, printing one line per
 * migration to out (may be NULL). conn must not be inside a transaction.
 * Returns 0, or -1 with err saying which migration failed and why.
 */
int migrate_run(PGconn *conn, const struct outbox_table *t, FILE *out,
		char *err, size_t errlen);

/*
 * migrate_run() reporting the progress of its index builds: about every
 * second, pg_stat_progress_create_index of the building session, read on
 * a second session connected with po (opened at the first report;
 * session is the caller's to close).
 */
struct migrate_watch {
	const struct store_progress *progress;
	const struct pgconn_options *po;
	PGconn *session;
	bool tried;    /* a connect was tried (once) */
	bool reported; /* the current build was reported */
};

int migrate_run_watched(PGconn *conn, const struct outbox_table *t, FILE *out,
			struct migrate_watch *w, char *err, size_t errlen);

/*
 * Creates (on) or drops the statement-level NOTIFY trigger of migration
 * 002, so `migrate` leaves the table matching OUTBOX_LISTEN. Returns 0, or
 * -1 with err.
 */
int migrate_notify_trigger(PGconn *conn, const struct outbox_table *t, bool on,
			   char *err, size_t errlen);

/*
 * Sets the room a plain table keeps in its pages by history
 * (migrate_room.c): fillfactor 70 with history, the default without,
 * printing to out (may be NULL) what it changed. Returns 0, or -1 with
 * err.
 */
int migrate_room(PGconn *conn, const struct outbox_table *t, bool history,
		 FILE *out, char *err, size_t errlen);

/*
 * A table partitioned by `migrate --partition`: the index of finished rows
 * split by status (migrate_terminal.c), each part built without blocking
 * writers, the old index dropped last, printing to out (may be NULL) what
 * it did. Nothing on a plain table or once done. Under the migration
 * lock. Returns 0, or -1 with err.
 */
int migrate_terminal(PGconn *conn, const struct outbox_table *t, FILE *out,
		     struct migrate_watch *w, char *err, size_t errlen);

/*
 * A table partitioned by an earlier `migrate --partition`: its default
 * partition's own identity on seq dropped (migrate_identity.c), printing
 * to out (may be NULL) that it did. Nothing on a plain table or once
 * done. Under the migration lock. Returns 0, or -1 with err.
 */
int migrate_default_identity(PGconn *conn, const struct outbox_table *t,
			     FILE *out, char *err, size_t errlen);

/*
 * seq's sequence moved past the table's rows where a copy left it behind
 * them (migrate_seq.c), printing to out (may be NULL) what it moved.
 * Under the migration lock. Returns 0, or -1 with err.
 */
int migrate_catch_up_seq(PGconn *conn, const struct outbox_table *t, FILE *out,
			 char *err, size_t errlen);

#endif
