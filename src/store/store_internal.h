/* SPDX-License-Identifier: MIT */
/*
 * Inside the store: the struct store every file of src/store/ shares, the
 * statement ids, and the helpers that run them. Never included outside
 * src/store/ (tests of the store excepted).
 *
 * Ownership: struct store owns its session (conn), its copies of the
 * option strings and every statement text in sql[]; store_close() frees
 * them all.
 */
#ifndef OUTBOX_STORE_INTERNAL_H
#define OUTBOX_STORE_INTERNAL_H

#include <libpq-fe.h>
#include <stdbool.h>
#include <stddef.h>

#include "base/base.h"
#include "store.h"

enum stmt {
	ST_LEASE,
	ST_RENEW,
	ST_SENT,
	ST_RETRY,
	ST_TRANSPORT,
	ST_FAILED,
	ST_RELEASE,
	ST_RECHECK,
	ST_SWEEP,
	ST_CLEAN_SENT,
	ST_CLEAN_FAILED,
	ST_NEXT_DUE,
	ST_REDRIVE_FAILED,
	ST_REDRIVE_SENT,
	ST_COUNT_FAILED,
	ST_COUNT_SENT,
	ST_CONTROL,
	ST_CLASSIFY,
	ST_REPAIR,
	ST_REDRIVE_CHECK,
	ST_UNBLOCK,
	ST_UNBLOCK_SKIP,
	ST_UNBLOCK_REDRIVE,
	ST_VERSION,
	ST_COUNT
};

/*
 * Internal only, never returned by a public function: a serialization
 * failure or deadlock, so the statement may run again.
 */
#define STORE_RETRY_STATEMENT (-100)

#define SWEEP_BATCH 500
#define REDRIVE_BATCH 1000

struct store {
	struct store_options opt;
	struct outbox_table table;
	char *conninfo;
	char *app_name;
	char *leased_by;
	char *ce_source;
	char *extra_sql;   /* test hook (store_test.h); NULL otherwise */
	char blocked[160]; /* the blocked-keys table, quoted */
	PGconn *conn;
	char *sql[ST_COUNT];
	bool prepared[ST_COUNT];
};

/* A leased batch's rows: the result they point into, and the events. */
struct lease_rows {
	PGresult *res;
	struct outbox_event events[];
};

/* statements.c: fills s->sql[]; -1 when out of memory. */
int store_build_statements(struct store *s);
extern const char *const store_stmt_names[ST_COUNT];

/* vasprintf that returns NULL when out of memory. */
char *store_asprintf(const char *fmt, ...)
    __attribute__((format(printf, 1, 2)));

/*
 * Runs statement st. Returns the result (caller clears) when its status is
 * want; otherwise NULL with err set and *rc STORE_RECONNECT, STORE_ERROR
 * or STORE_RETRY_STATEMENT.
 */
PGresult *store_run(struct store *s, enum stmt st, int nparams,
		    const char *const *values, ExecStatusType want,
		    int result_format, int *rc, char *err, size_t errlen);

/* What a failed store_run() means to a public caller. */
static inline int store_public_rc(int rc)
{
	return rc == STORE_RETRY_STATEMENT ? STORE_ERROR : rc;
}

/*
 * A Postgres array literal: {a,b,c} for uuids; {"x","y"} with escapes for
 * text (quoted = true), each item cut to max_item bytes on a UTF-8
 * boundary. Malloc'd; NULL when out of memory.
 */
char *store_pg_array(const char *const *items, size_t n, bool quoted,
		     size_t max_item);

/*
 * BEGIN; try the transaction-level advisory lock of ns for the table.
 * custom_plans plans the transaction's statements for their values,
 * whatever the role's or database's plan_cache_mode.
 */
int store_begin_locked(struct store *s, int ns, bool custom_plans, bool *got,
		       char *err, size_t errlen);

/* COMMIT (commit) or ROLLBACK the open transaction. */
int store_finish_tx(struct store *s, bool commit, char *err, size_t errlen);

/*
 * The NOTIFY channel of the table as an SQL text expression: the one
 * place that names it (migration 002's trigger function and the
 * listener both use it).
 */
void store_channel_sql(const struct outbox_table *t, char *out, size_t outlen);

#endif
