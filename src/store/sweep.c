/* SPDX-License-Identifier: MIT */
/*
 * The sweeper's and the cleaner's batches: each its own short transaction
 * under a transaction-level advisory lock, so one replica at a time does
 * the work and a crashed one holds nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "locks.h"
#include "store_internal.h"

/* A batch statement failed inside its transaction: end the transaction
 * (unless the session is gone) and say what the caller should do. */
static int abandon_batch(struct store *s, int rc)
{
	if (rc != STORE_RECONNECT) {
		char ignored[64];
		store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
	}
	return store_public_rc(rc);
}

/* Claims emptied per statement (the statement's LIMIT). */
#define SWEEP_CLAIMS 100

/* One sweep batch in its own locked transaction: *more says whether a
 * full batch suggests another. */
static int sweep_batch_once(struct store *s, enum stmt st,
			    struct sweep_result *r, bool *more, char *err,
			    size_t errlen)
{
	bool got;
	*more = false;
	/* The claims' rows are looked up by key (statements.c). */
	int rc = store_begin_locked(s, LOCK_NS_SWEEP,
				    st == ST_SWEEP_CLAIMS ? PLANS_INDEXED
							  : PLANS_AS_SET,
				    &got, err, errlen);
	if (rc != 0)
		return rc;
	if (!got) {
		r->skipped = true;
		return store_finish_tx(s, TX_ROLLBACK, err, errlen);
	}
	PGresult *res =
	    store_run(s, st, 0, NULL, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res && st != ST_SWEEP && store_err_undefined_table(err)) {
		char why[256];
		if (store_finish_tx(s, TX_ROLLBACK, why, sizeof(why)) == 0 &&
		    store_claims_table_gone(s)) {
			/* A table made by hand, without claims: nothing to
			 * sweep. */
			s->claims_missing = true;
			return 0;
		}
		return store_public_rc(rc);
	}
	if (!res)
		return abandon_batch(s, rc);
	if (st == ST_SWEEP_CLAIMS) {
		size_t emptied = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
		r->to_failed += strtoull(PQgetvalue(res, 0, 1), NULL, 10);
		r->to_pending += strtoull(PQgetvalue(res, 0, 2), NULL, 10);
		*more = emptied >= SWEEP_CLAIMS;
	} else {
		int n = PQntuples(res);
		for (int i = 0; i < n; i++) {
			if (strcmp(PQgetvalue(res, i, 0), "failed") == 0)
				r->to_failed++;
			else
				r->to_pending++;
		}
		*more = n >= SWEEP_BATCH;
	}
	PQclear(res);
	return store_finish_tx(s, TX_COMMIT, err, errlen);
}

/* A batch that an old row the current schema refuses made fail runs
 * again once that row is failed (refused.c): otherwise it would fail each
 * tick, and the rows of every claim in it would stay out of the leases. */
static int sweep_batch(struct store *s, enum stmt st, struct sweep_result *r,
		       bool *more, char *err, size_t errlen)
{
	int rc = sweep_batch_once(s, st, r, more, err, errlen);
	if (rc == STORE_ERROR && store_fail_refused_after(s, err))
		rc = sweep_batch_once(s, st, r, more, err, errlen);
	return rc;
}

/* The claims of aborted lease transactions (docs/design.md §4), then rows
 * left in_flight by relays of the row lease, then claims of workers long
 * gone. */
int store_sweep(struct store *s, size_t max_rows, struct sweep_result *r,
		char *err, size_t errlen)
{
	static const enum stmt passes[] = {ST_SWEEP_CLAIMS, ST_SWEEP};
	memset(r, 0, sizeof(*r));
	/* Made since this session looked (`migrate` run on a table made by
	 * hand, its relays running): workers connected since write claims,
	 * whose dead ones leases skip until swept. */
	if (s->claims_missing && store_claims_table_there(s) == 1)
		s->claims_missing = false;
	for (size_t p = 0; p < sizeof(passes) / sizeof(passes[0]); p++) {
		bool more = passes[p] != ST_SWEEP_CLAIMS || !s->claims_missing;
		while (more && r->to_pending + r->to_failed < max_rows) {
			int rc =
			    sweep_batch(s, passes[p], r, &more, err, errlen);
			if (rc != 0 || r->skipped)
				return rc;
		}
	}
	int rc;
	if (s->claims_missing)
		return 0;
	PGresult *res = store_run(s, ST_PRUNE_CLAIMS, 0, NULL, PGRES_TUPLES_OK,
				  0, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	/* Worth a line: it happens after a restore or an upgrade into
	 * another cluster (docs/runbook.md), and says the copy worked. */
	if (strcmp(PQgetvalue(res, 0, 0), "0") != 0)
		log_fields(LOG_WARN,
			   "dropped claims from another cluster or from "
			   "before a restore; their pending rows are leased "
			   "again, no attempt charged",
			   "claims", PQgetvalue(res, 0, 0), NULL);
	r->foreign_claims = strtoull(PQgetvalue(res, 0, 0), NULL, 10);
	r->open = strtoull(PQgetvalue(res, 0, 1), NULL, 10);
	PQclear(res);
	return 0;
}

/* One cleaner batch: its deletions and how many rows it scanned; the
 * cursor moves past the scanned rows. */
static int clean_batch(struct store *s, enum stmt st, char *cursor,
		       size_t cursor_len, const char *retention,
		       size_t *deleted, size_t *scanned, char *err,
		       size_t errlen)
{
	int rc;
	const char *values[2] = {cursor, retention};
	PGresult *res =
	    store_run(s, st, 2, values, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		return abandon_batch(s, rc);
	*deleted = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
	*scanned = (size_t)strtoull(PQgetvalue(res, 0, 1), NULL, 10);
	if (*scanned > 0)
		snprintf(cursor, cursor_len, "%s",
			 PQgetvalue(res, 0, *deleted > 0 ? 2 : 3));
	PQclear(res);
	return store_finish_tx(s, TX_COMMIT, err, errlen);
}

static int clean_status(struct store *s, enum stmt st, int64_t retention_ms,
			size_t max_rows, int64_t pause_ms, size_t *deleted,
			bool *skipped, char *err, size_t errlen)
{
	char cursor[64] = "-infinity";
	char retention[32];
	snprintf(retention, sizeof(retention), "%lld", (long long)retention_ms);
	*deleted = 0;
	while (*deleted < max_rows) {
		bool got;
		size_t n = 0, scanned = 0;
		int rc = store_begin_locked(s, LOCK_NS_CLEAN, PLANS_CUSTOM,
					    &got, err, errlen);
		if (rc != 0)
			return rc;
		if (!got) {
			*skipped = true;
			return store_finish_tx(s, TX_ROLLBACK, err, errlen);
		}
		rc = clean_batch(s, st, cursor, sizeof(cursor), retention, &n,
				 &scanned, err, errlen);
		if (rc != 0)
			return rc;
		*deleted += n;
		if (scanned < (size_t)s->opt.clean_batch_size)
			return 0;
		clock_sleep_ms(pause_ms);
	}
	return 0;
}

int store_clean(struct store *s, int64_t retention_ms,
		int64_t failed_retention_ms, size_t max_rows, int64_t pause_ms,
		struct clean_result *r, char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	/* max_rows caps the whole tick, sent and failed together. */
	int rc = clean_status(
	    s, s->clean_default ? ST_CLEAN_SENT_DEFAULT : ST_CLEAN_SENT,
	    retention_ms, max_rows, pause_ms, &r->sent_deleted, &r->skipped,
	    err, errlen);
	if (rc != 0 || r->skipped || failed_retention_ms <= 0 ||
	    r->sent_deleted >= max_rows)
		return rc;
	return clean_status(
	    s, s->clean_default ? ST_CLEAN_FAILED_DEFAULT : ST_CLEAN_FAILED,
	    failed_retention_ms, max_rows - r->sent_deleted, pause_ms,
	    &r->failed_deleted, &r->skipped, err, errlen);
}
