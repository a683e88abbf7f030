/* SPDX-License-Identifier: MIT */
/*
 * Running statements: the one runner every statement of the store goes
 * through (store_run() for the prepared ones, store_exec() for the rest),
 * each with its transaction's settings in the same round trip (libpq's
 * pipeline mode; the session carries none, docs/design.md §4), the lease
 * transaction's pipelined opening, and transaction control.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "pgconn.h"
#include "store_internal.h"

static struct stmt_name stmt_name(const struct store *s, const char *what,
				  uint64_t hash)
{
	return store_stmt_name(store_pooled(s) ? NULL : s->tag, what, hash);
}

/* What s prepared belongs to the session's generation it was prepared
 * in: after a reconnect, by this store or another of its session, none
 * of it is there any more. */
static void sync_prepared(struct store *s)
{
	if (s->prepared_gen != s->ses->conn_gen) {
		memset(s->prepared, 0, sizeof(s->prepared));
		memset(s->tx_prepared, 0, sizeof(s->tx_prepared));
		s->prepared_gen = s->ses->conn_gen;
	}
}

/* Whether name is among those the lease transaction's connection has. */
static bool pool_has(const struct store *s, const char *name)
{
	size_t n = strlen(name);
	for (const char *p = s->pool_have; p && (p = strstr(p, name)); p += n)
		if ((p == s->pool_have || p[-1] == ' ') && p[n] == ' ')
			return true;
	return false;
}

/* Learns the probe's answer (its last column: names, each followed by a
 * space) for the lease transaction now open, and frees it; false with
 * *rc and err set when out of memory. */
static bool pool_learnt(struct store *s, PGresult *probe, int *rc, char *err,
			size_t errlen)
{
	free(s->pool_have);
	s->pool_have =
	    strdup(probe ? PQgetvalue(probe, 0, PQnfields(probe) - 1) : "");
	PQclear(probe);
	if (s->pool_have)
		return true;
	snprintf(err, errlen, "lease: out of memory");
	*rc = STORE_ERROR;
	return false;
}

static int pool_add(struct store *s, const char *name)
{
	char *more = store_asprintf("%s%s ", s->pool_have, name);
	if (!more)
		return -1;
	free(s->pool_have);
	s->pool_have = more;
	return 0;
}

/* Runs st as a named prepared statement, preparing it on first use
 * (pooled: on the lease transaction's server connection). */
static PGresult *exec_prepared(struct store *s, enum stmt st, int nparams,
			       const char *const *values, int result_format)
{
	/* Built by the caller (run_sql, store_run_leasing). */
	const char *sql = store_sql(s, st);
	struct stmt_name name =
	    stmt_name(s, store_stmt_names[st], store_sql_hash(s, st));
	bool pool = store_pooled(s);
	if (pool ? !pool_has(s, name.text) : !s->prepared[st]) {
		PGresult *res =
		    PQprepare(s->ses->conn, name.text, sql, nparams, NULL);
		if (PQresultStatus(res) != PGRES_COMMAND_OK)
			return res;
		PQclear(res);
		metrics_add(MC_PREPARED, 1);
		/* Pooled, the name is the pool's, which pool_has() tracks.
		 * The flag is for the name on prepares under: set here, it
		 * made a store the process turned back to on (prepare_mode.c)
		 * run that name unprepared, refused (26000) every time. */
		if (pool && pool_add(s, name.text) != 0)
			return NULL; /* libpq's answer when out of memory */
		if (!pool)
			s->prepared[st] = true;
	}
	return PQexecPrepared(s->ses->conn, name.text, nparams, values, NULL,
			      NULL, result_format);
}

/* The runner's verdict on res, the result of a statement whose prepared
 * flag is *prepared (NULL: run unnamed): res when it has the wanted
 * status, else NULL with *rc and err ("what: SQLSTATE: message", what
 * NULL: no prefix) set, and res freed. */
static PGresult *result_of(struct store *s, bool *prepared, const char *what,
			   PGresult *res, ExecStatusType want, int *rc,
			   char *err, size_t errlen)
{
	*rc = 0;
	if (PQresultStatus(res) == want)
		return res;
	const char *state =
	    res ? PQresultErrorField(res, PG_DIAG_SQLSTATE) : NULL;
	snprintf(s->ses->failed_state, sizeof(s->ses->failed_state), "%s",
		 state ? state : "");
	char why[768];
	pgconn_error(s->ses->conn, res, why, sizeof(why));
	if (what)
		snprintf(err, errlen, "%s: %s", what, why);
	else
		snprintf(err, errlen, "%s", why);
	if (pgconn_needs_reconnect(s->ses->conn, res)) {
		store_notice_pool_keeps(s, res, why);
		*rc = STORE_RECONNECT;
	} else {
		*rc = STORE_ERROR;
		if (prepared && state && !store_pooled(s) &&
		    store_preparing(s) &&
		    (strcmp(state, "26000") == 0 ||
		     strcmp(state, "42P05") == 0)) {
			store_stop_preparing(why);
			/* Missing where the flag said prepared: the next run
			 * prepares it again rather than fail each time. */
			if (strcmp(state, "26000") == 0)
				*prepared = false;
		}
		if (pgconn_is_retryable(res))
			*rc = STORE_RETRY_STATEMENT;
	}
	PQclear(res);
	return NULL;
}

/* One statement of a pipeline: prepared under its name when the options
 * say so (*prepared: it is, on this session), or unnamed. Pooled,
 * the lease runs by name unprepared (by_name: the connection is taken to
 * have it), and the probe's result is kept (in *keep). */
struct step {
	struct stmt_name own; /* its name; "" for an ad hoc statement */
	bool *prepared;
	const char *sql;
	int nparams;
	const char *const *values;
	int result_format;
	bool by_name;
	bool parse;  /* pooled: prepared by name first, whatever the flags */
	bool pooled; /* own is a pooled name, which *prepared does not track */
	PGresult **keep;
};

/* Statement st of s->sql (st >= 0) or the ad hoc sql (st -1). */
static struct step step_of(struct store *s, int st, const char *sql,
			   int nparams, const char *const *values,
			   int result_format)
{
	struct step p = {.sql = sql,
			 .nparams = nparams,
			 .values = values,
			 .result_format = result_format};
	if (st >= 0) {
		p.own = stmt_name(s, store_stmt_names[st],
				  store_sql_hash(s, (enum stmt)st));
		p.prepared = &s->prepared[st];
		p.pooled = store_pooled(s);
	}
	return p;
}

/* The name p is prepared under; NULL for an ad hoc statement. */
static const char *step_name(const struct step *p)
{
	return p->own.text[0] ? p->own.text : NULL;
}

/* The settings of a transaction of kind tx, prepared like the statements
 * (a parse and plan per transaction would cost the server more than the
 * settings themselves). */
static struct step settings_step(struct store *s, enum pgconn_tx tx)
{
	static const char *const names[] = {
	    "outbox_tx_statement", "outbox_tx_explicit", "outbox_tx_lease",
	    "outbox_tx_indexed"};
	struct step p = {.own = stmt_name(s, names[tx], s->tx_hash[tx]),
			 .prepared = &s->tx_prepared[tx],
			 .sql = s->tx_settings[tx],
			 .pooled = store_pooled(s)};
	return p;
}

#define PIPELINE_MAX 3

/* What the k-th result of a pipeline answers: step's statement, or its
 * preparation. */
struct expect {
	size_t step;
	bool prepare;
};

/* Queues steps, each preparation that is due just before its statement,
 * then the sync; what each result will answer goes to exp, their number
 * to *sent. False when libpq refused to queue. */
static bool queue_steps(struct store *s, const struct step *steps, size_t n,
			struct expect *exp, size_t *sent)
{
	PGconn *c = s->ses->conn;
	*sent = 0;
	if (PQenterPipelineMode(c) != 1)
		return false;
	for (size_t i = 0; i < n; i++) {
		const struct step *p = &steps[i];
		const char *name = step_name(p);
		bool named =
		    name && (p->by_name || p->parse || store_preparing(s));
		int queued;
		if (named && (p->parse || (!p->by_name && !*p->prepared))) {
			if (PQsendPrepare(c, name, p->sql, p->nparams, NULL) !=
			    1)
				return false;
			log_fields(LOG_DEBUG, "preparing a statement", "name",
				   name, NULL);
			exp[(*sent)++] = (struct expect){i, true};
		}
		queued =
		    named ? PQsendQueryPrepared(c, name, p->nparams, p->values,
						NULL, NULL, p->result_format)
			  : PQsendQueryParams(c, p->sql, p->nparams, NULL,
					      p->values, NULL, NULL,
					      p->result_format);
		if (queued != 1)
			return false;
		exp[(*sent)++] = (struct expect){i, false};
	}
	return PQpipelineSync(c) == 1;
}

/*
 * Runs steps in one round trip (libpq's pipeline mode) and returns as
 * run_sql() does for the result of step `wanted`, or for the first step
 * that failed. Without an explicit BEGIN among them the steps share one
 * implicit transaction, which ends at the sync. lease: step 0 is the
 * lease transaction's BEGIN (s->ses->leasing once it succeeded).
 */
/* Why a pipeline's connection was lost, as result_of() words errors:
 * "what: SQLSTATE: message" (what NULL: no prefix). */
static void pipeline_lost(PGconn *c, const PGresult *failed, const char *what,
			  char *err, size_t errlen)
{
	char why[768];
	pgconn_error(c, failed, why, sizeof(why));
	snprintf(err, errlen, "%s%s%s", what ? what : "", what ? ": " : "",
		 why);
}

/* Whether the next result of c can be read without blocking by
 * deadline_ms (0: no deadline). A read error is left for PQgetResult()
 * to report. */
static bool reply_by(PGconn *c, int64_t deadline_ms)
{
	if (deadline_ms == 0)
		return true;
	while (PQisBusy(c)) {
		int64_t left = deadline_ms - clock_ms();
		if (left <= 0)
			return false;
		struct pollfd p = {.fd = PQsocket(c), .events = POLLIN};
		int n = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
		if (n < 0 && errno != EINTR)
			return true;
		if (n > 0 && PQconsumeInput(c) == 0)
			return true;
	}
	return true;
}

/* Closes a session left mid-pipeline: the next statement finds it
 * unconnected and the caller connects it again. */
static void close_mid_pipeline(struct store *s)
{
	PQfinish(s->ses->conn);
	s->ses->conn = NULL;
	s->ses->leasing = NULL;
}

/* A reply that did not come by its deadline: what the statement did is
 * unknown and the connection is mid-pipeline, so it is closed. */
static void reply_late(struct store *s, const char *what, int64_t wait_ms,
		       char *err, size_t errlen)
{
	snprintf(err, errlen, "%s%sno reply in %lld ms", what ? what : "",
		 what ? ": " : "", (long long)wait_ms);
	close_mid_pipeline(s);
	s->ses->reply_late = true;
}

static PGresult *run_pipeline(struct store *s, const char *what,
			      const struct step *steps, size_t n, size_t wanted,
			      bool lease, ExecStatusType want, int *rc,
			      char *err, size_t errlen)
{
	PGconn *c = s->ses->conn;
	PGresult *res = NULL, *failed = NULL;
	bool *failed_prepared = NULL;
	struct expect exp[2 * PIPELINE_MAX];
	size_t sent, k = 0;

	*rc = 0;
	s->ses->failed_state[0] = '\0';
	int64_t wait_ms = s->ses->reply_wait_ms;
	int64_t deadline_ms = wait_ms > 0 ? clock_ms() + wait_ms : 0;
	s->ses->reply_late = false;
	if (n > PIPELINE_MAX || !queue_steps(s, steps, n, exp, &sent)) {
		pipeline_lost(c, NULL, what, err, errlen);
		/* The pipeline's state is unknown, and its session, in
		 * pipeline mode with steps queued, could run no statement of
		 * another shape until it was connected again. */
		if (n <= PIPELINE_MAX)
			close_mid_pipeline(s);
		*rc = STORE_RECONNECT;
		return NULL;
	}
	/* Result k, then NULL, for each; then the sync. Once a statement
	 * failed, the rest come back PGRES_PIPELINE_ABORTED. */
	for (;;) {
		if (!reply_by(c, deadline_ms)) {
			if (s->ses->on_late) {
				/* Once: the wait goes on after it. */
				void (*late)(void *) = s->ses->on_late;
				s->ses->on_late = NULL;
				late(s->ses->on_late_arg);
				wait_ms += s->ses->reply_wait_after_ms;
				deadline_ms += s->ses->reply_wait_after_ms;
				continue;
			}
			PQclear(failed);
			PQclear(res);
			reply_late(s, what, wait_ms, err, errlen);
			*rc = STORE_RECONNECT;
			return NULL;
		}
		PGresult *r = PQgetResult(c);
		if (!r) {
			if (PQstatus(c) == CONNECTION_BAD || ++k > sent)
				break;
			continue;
		}
		ExecStatusType status = PQresultStatus(r);
		if (status == PGRES_PIPELINE_SYNC) {
			PQclear(r);
			break;
		}
		if (k >= sent) {
			PQclear(r);
			continue;
		}
		const struct expect *e = &exp[k];
		bool fine =
		    status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
		if (e->prepare) {
			if (!steps[e->step].pooled)
				*steps[e->step].prepared =
				    status == PGRES_COMMAND_OK;
			if (status == PGRES_COMMAND_OK)
				metrics_add(MC_PREPARED, 1);
		} else if (lease && e->step == 0 && status == PGRES_COMMAND_OK)
			s->ses->leasing = s;
		if (!e->prepare && e->step == wanted && fine && !res) {
			res = r;
		} else if (!e->prepare && steps[e->step].keep && fine &&
			   !*steps[e->step].keep) {
			*steps[e->step].keep = r;
		} else if (!failed && !fine &&
			   status != PGRES_PIPELINE_ABORTED) {
			failed = r;
			failed_prepared = steps[e->step].prepared;
		} else {
			PQclear(r);
		}
	}
	if (PQstatus(c) == CONNECTION_BAD || PQexitPipelineMode(c) != 1) {
		pipeline_lost(c, failed, what, err, errlen);
		store_notice_pool_keeps(s, failed, err);
		PQclear(failed);
		PQclear(res);
		*rc = STORE_RECONNECT;
		return NULL;
	}
	if (failed) {
		PQclear(res);
		return result_of(s, failed_prepared, what, failed, want, rc,
				 err, errlen);
	}
	return result_of(s, steps[wanted].prepared, what, res, want, rc, err,
			 errlen);
}

/* Whether sql (one of the store's own statements) starts or ends an
 * explicit transaction. */
static bool opens_tx(const char *sql)
{
	return strncmp(sql, "BEGIN", 5) == 0;
}

static bool ends_tx(const char *sql)
{
	return strcmp(sql, "COMMIT") == 0 || strcmp(sql, "ROLLBACK") == 0;
}

/*
 * Pooled (see pooled()), a statement outside any transaction is a
 * transaction of its own, on a server connection nothing tells of in
 * advance, so it cannot ask first: it runs by name, and where the name is
 * missing (26000) it is prepared and run at once; where it was last
 * prepared so, it is prepared first, and where the name is there already
 * (42P05) it runs by name. Either failure comes before the statement ran,
 * so it is simply sent again, the other way. Each store keeps, per
 * statement, the way that last worked, which settles on by name behind a
 * pool that keeps statements and on prepared first behind one that
 * throws them away after each transaction (server_reset_query_always).
 * After three misses in a row it runs unnamed.
 */
static PGresult *run_autocommit_pooled(struct store *s, int st,
				       const char *what, struct step settings,
				       struct step stmt, ExecStatusType want,
				       int *rc, char *err, size_t errlen)
{
	bool parse = s->pool_parse[st];
	struct step steps[2] = {settings, stmt};
	for (int tries = 0; tries < 3; tries++) {
		steps[1].by_name = !parse;
		steps[1].parse = parse;
		PGresult *res = run_pipeline(s, what, steps, 2, 1, false, want,
					     rc, err, errlen);
		if (res) {
			s->pool_parse[st] = parse;
			return res;
		}
		if (*rc == STORE_RECONNECT ||
		    strcmp(s->ses->failed_state, parse ? "42P05" : "26000") !=
			0)
			return NULL;
		parse = !parse;
	}
	steps[1].by_name = steps[1].parse = false;
	steps[1].own.text[0] = '\0';
	return run_pipeline(s, what, steps, 2, 1, false, want, rc, err, errlen);
}

/*
 * A statement outside any transaction of ours takes the settings its
 * transaction needs in the same round trip (pgconn_tx_settings()): a BEGIN
 * is followed by those of an explicit transaction, any other statement is
 * preceded by those of a single statement (one that reads by index,
 * store_stmt_indexed, by those of PGCONN_TX_INDEXED), in its implicit
 * transaction.
 * Inside a transaction the settings it opened with hold.
 */
static PGresult *run_outside_tx(struct store *s, int st, const char *what,
				const char *sql, int nparams,
				const char *const *values, ExecStatusType want,
				int result_format, int *rc, char *err,
				size_t errlen)
{
	struct step stmt = step_of(s, st, sql, nparams, values, result_format);
	if (!opens_tx(sql)) {
		enum pgconn_tx tx = st >= 0 && store_stmt_indexed[st]
					? PGCONN_TX_INDEXED
					: PGCONN_TX_STATEMENT;
		if (st >= 0 && store_pooled(s))
			return run_autocommit_pooled(s, st, what,
						     settings_step(s, tx), stmt,
						     want, rc, err, errlen);
		struct step steps[2] = {settings_step(s, tx), stmt};
		return run_pipeline(s, what, steps, 2, 1, false, want, rc, err,
				    errlen);
	}
	struct step steps[2] = {stmt, settings_step(s, PGCONN_TX_EXPLICIT)};
	PGresult *res =
	    run_pipeline(s, what, steps, 2, 0, false, want, rc, err, errlen);
	if (!res && *rc != STORE_RECONNECT &&
	    PQtransactionStatus(s->ses->conn) != PQTRANS_IDLE) {
		/* The BEGIN went through and its settings did not: the
		 * caller holds no transaction, so none is left open. */
		PGresult *r = PQexec(s->ses->conn, "ROLLBACK");
		PQclear(r);
	}
	return res;
}

/* Every statement of the store runs here, but the lease transaction's
 * pipelined opening (store_run_leasing). st >= 0: statement st of s->sql
 * (sql NULL), prepared when the options say so; -1: sql, unprepared. */
static PGresult *run_sql(struct store *s, int st, const char *what,
			 const char *sql, int nparams,
			 const char *const *values, ExecStatusType want,
			 int result_format, int *rc, char *err, size_t errlen)
{
	*rc = 0;
	if (!s->ses->conn) {
		snprintf(err, errlen, "%s%snot connected to postgres",
			 what ? what : "", what ? ": " : "");
		*rc = STORE_RECONNECT;
		return NULL;
	}
	sync_prepared(s);
	if ((*rc = store_check_session(s, err, errlen)) != 0)
		return NULL;
	/* After the check: it may have dropped the texts to build anew. */
	if (st >= 0)
		sql = store_sql(s, (enum stmt)st);
	if (!sql) {
		snprintf(err, errlen, "%s: out of memory",
			 what ? what : "statement");
		*rc = STORE_ERROR;
		return NULL;
	}
	if (PQtransactionStatus(s->ses->conn) == PQTRANS_IDLE && !ends_tx(sql))
		return run_outside_tx(s, st, what, sql, nparams, values, want,
				      result_format, rc, err, errlen);
	PGresult *res = st >= 0 && store_preparing(s)
			    ? exec_prepared(s, (enum stmt)st, nparams, values,
					    result_format)
			    : PQexecParams(s->ses->conn, sql, nparams, NULL,
					   values, NULL, NULL, result_format);
	return result_of(s, st >= 0 ? &s->prepared[st] : NULL, what, res, want,
			 rc, err, errlen);
}

PGresult *store_run(struct store *s, enum stmt st, int nparams,
		    const char *const *values, ExecStatusType want,
		    int result_format, int *rc, char *err, size_t errlen)
{
	return run_sql(s, (int)st, NULL, NULL, nparams, values, want,
		       result_format, rc, err, errlen);
}

PGresult *store_exec(struct store *s, const char *what, const char *sql,
		     int nparams, const char *const *values,
		     ExecStatusType want, int *rc, char *err, size_t errlen)
{
	return run_sql(s, -1, what, sql, nparams, values, want, 0, rc, err,
		       errlen);
}

int store_exec_cmd(struct store *s, const char *what, const char *sql,
		   int nparams, const char *const *values, size_t *rows,
		   char *err, size_t errlen)
{
	int rc;
	PGresult *res = store_exec(s, what, sql, nparams, values,
				   PGRES_COMMAND_OK, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	if (rows)
		*rows = (size_t)strtoull(PQcmdTuples(res), NULL, 10);
	PQclear(res);
	return 0;
}

int store_begin_locked(struct store *s, int ns, enum plan_mode plans, bool *got,
		       char *err, size_t errlen)
{
	char sql[512];
	*got = false;
	int rc =
	    store_exec_cmd(s, NULL, PGCONN_BEGIN, 0, NULL, NULL, err, errlen);
	if (rc != 0)
		return rc;
	snprintf(sql, sizeof(sql),
		 "SELECT pg_try_advisory_xact_lock(%d, hashtext(%s))%s", ns,
		 s->table.literal,
		 plans == PLANS_CUSTOM
		     ? ", set_config('plan_cache_mode', 'force_custom_plan', "
		       "true)"
		 : plans == PLANS_INDEXED ? PGCONN_INDEXED_SETTINGS
					  : "");
	PGresult *res = store_exec(s, NULL, sql, 0, NULL, PGRES_TUPLES_OK, &rc,
				   err, errlen);
	if (!res) {
		char ignored[64];
		store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
		return store_public_rc(rc);
	}
	*got = strcmp(PQgetvalue(res, 0, 0), "t") == 0;
	PQclear(res);
	return 0;
}

/* Runs a transaction-control statement; its command tag goes to tag
 * (NULL: not wanted). 0, or STORE_RECONNECT / STORE_ERROR with err. */
static int exec_control(struct store *s, const char *sql, char *tag,
			size_t taglen, char *err, size_t errlen)
{
	int rc;
	PGresult *res = store_exec(s, NULL, sql, 0, NULL, PGRES_COMMAND_OK, &rc,
				   err, errlen);
	if (!res)
		return store_public_rc(rc);
	if (tag)
		snprintf(tag, taglen, "%s", PQcmdStatus(res));
	PQclear(res);
	return 0;
}

int store_finish_tx(struct store *s, enum tx_end end, char *err, size_t errlen)
{
	return exec_control(s, end == TX_COMMIT ? "COMMIT" : "ROLLBACK", NULL,
			    0, err, errlen);
}

PGresult *store_run_leasing(struct store *s, enum stmt st, int nparams,
			    const char *const *values, ExecStatusType want,
			    int result_format, int *rc, char *err,
			    size_t errlen)
{
	*rc = 0;
	if (!s->ses->conn) {
		snprintf(err, errlen, "not connected to postgres");
		*rc = STORE_RECONNECT;
		return NULL;
	}
	sync_prepared(s);
	if ((*rc = store_check_session(s, err, errlen)) != 0)
		return NULL;
	const char *sql = store_sql(s, st);
	if (!sql) {
		snprintf(err, errlen, "store: out of memory");
		*rc = STORE_ERROR;
		return NULL;
	}
	/* One round trip instead of one per statement: a lease's latency
	 * is mostly waiting for the server. */
	struct step steps[3] = {
	    step_of(s, -1, PGCONN_BEGIN, 0, NULL, 0),
	    settings_step(s, PGCONN_TX_LEASE),
	    step_of(s, (int)st, sql, nparams, values, result_format),
	};
	if (!store_pooled(s))
		return run_pipeline(s, NULL, steps, 3, 2, true, want, rc, err,
				    errlen);
	PGresult *probe = NULL;
	steps[1] = step_of(s, -1, s->lease_probe_sql, 0, NULL, 0);
	steps[1].keep = &probe;
	steps[2].by_name = true;
	PGresult *res =
	    run_pipeline(s, NULL, steps, 3, 2, true, want, rc, err, errlen);
	if (res) {
		if (pool_learnt(s, probe, rc, err, errlen))
			return res;
		PQclear(res);
		return NULL;
	}
	PQclear(probe);
	if (*rc == STORE_RECONNECT ||
	    strcmp(s->ses->failed_state, "26000") != 0 || s->ses->leasing != s)
		return NULL;
	/* Not prepared on this connection: the transaction, which holds
	 * nothing, opens again and asks first. */
	if ((*rc = store_lease_end(s, TX_ROLLBACK, err, errlen)) != 0)
		return NULL;
	const struct step open[2] = {
	    step_of(s, -1, PGCONN_BEGIN, 0, NULL, 0),
	    step_of(s, -1, s->lease_probe_sql, 0, NULL, 0)};
	probe = run_pipeline(s, NULL, open, 2, 1, true, PGRES_TUPLES_OK, rc,
			     err, errlen);
	if (!probe || !pool_learnt(s, probe, rc, err, errlen))
		return NULL;
	return result_of(s, &s->prepared[st], NULL,
			 exec_prepared(s, st, nparams, values, result_format),
			 want, rc, err, errlen);
}

int store_lease_end(struct store *s, enum tx_end end, char *err, size_t errlen)
{
	char tag[32] = "";
	s->ses->leasing = NULL;
	free(s->pool_have);
	s->pool_have = NULL;
	int rc = exec_control(s, end == TX_COMMIT ? "COMMIT" : "ROLLBACK", tag,
			      sizeof(tag), err, errlen);
	if (rc == 0 && end == TX_COMMIT && strcmp(tag, "COMMIT") != 0) {
		/* COMMIT of a transaction in which a statement failed rolls
		 * it back, and says so only in the command tag. */
		snprintf(err, errlen,
			 "the lease transaction had failed and was rolled "
			 "back");
		rc = STORE_ERROR;
	}
	due_turn_ended(s, end == TX_COMMIT && rc == 0);
	return rc;
}
