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
		store_finish_tx(s, false, ignored, sizeof(ignored));
	}
	return store_public_rc(rc);
}

int store_sweep(struct store *s, size_t max_rows, struct sweep_result *r,
		char *err, size_t errlen)
{
	memset(r, 0, sizeof(*r));
	for (;;) {
		bool got;
		int rc = store_begin_locked(s, LOCK_NS_SWEEP, false, &got, err,
					    errlen);
		if (rc != 0)
			return rc;
		if (!got) {
			r->skipped = true;
			return store_finish_tx(s, false, err, errlen);
		}
		PGresult *res = store_run(s, ST_SWEEP, 0, NULL, PGRES_TUPLES_OK,
					  0, &rc, err, errlen);
		if (!res)
			return abandon_batch(s, rc);
		int n = PQntuples(res);
		for (int i = 0; i < n; i++) {
			if (strcmp(PQgetvalue(res, i, 0), "failed") == 0)
				r->to_failed++;
			else
				r->to_pending++;
		}
		PQclear(res);
		rc = store_finish_tx(s, true, err, errlen);
		if (rc != 0)
			return rc;
		if (n < SWEEP_BATCH || r->to_pending + r->to_failed >= max_rows)
			return 0;
	}
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
	return store_finish_tx(s, true, err, errlen);
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
		int rc = store_begin_locked(s, LOCK_NS_CLEAN, true, &got, err,
					    errlen);
		if (rc != 0)
			return rc;
		if (!got) {
			*skipped = true;
			return store_finish_tx(s, false, err, errlen);
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
	int rc =
	    clean_status(s, ST_CLEAN_SENT, retention_ms, max_rows, pause_ms,
			 &r->sent_deleted, &r->skipped, err, errlen);
	if (rc != 0 || r->skipped || failed_retention_ms <= 0 ||
	    r->sent_deleted >= max_rows)
		return rc;
	return clean_status(s, ST_CLEAN_FAILED, failed_retention_ms,
			    max_rows - r->sent_deleted, pause_ms,
			    &r->failed_deleted, &r->skipped, err, errlen);
}
