/* SPDX-License-Identifier: MIT */
/*
 * Marks: moving a lease's rows out of in_flight, fenced by the lease id,
 * and recognizing a mark whose reply was lost with the connection.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

#define MARK_TRIES 3

static enum stmt mark_stmt(enum store_mark kind)
{
	switch (kind) {
	case MARK_SENT:
		return ST_SENT;
	case MARK_RETRY:
		return ST_RETRY;
	case MARK_TRANSPORT:
		return ST_TRANSPORT;
	case MARK_FAILED:
		return ST_FAILED;
	case MARK_RELEASE:
		break;
	}
	return ST_RELEASE;
}

/*
 * The terminal states a row reaches through each mark, for the lost-reply
 * check; NULL for marks that leave rows pending. Only terminal rows are
 * recognized: the sweeper also returns rows to pending under their last
 * lease id, so a pending row says nothing about whose mark moved it.
 */
static const char *mark_targets(enum store_mark kind)
{
	switch (kind) {
	case MARK_SENT:
		return "{sent}";
	case MARK_RETRY:
	case MARK_FAILED:
		return "{failed}";
	case MARK_TRANSPORT:
	case MARK_RELEASE:
		break;
	}
	return NULL;
}

/* Counts rows of ids already in kind's target state under lease_id. */
static int recheck(struct store *s, enum store_mark kind, const char *arr,
		   const char *lease_id, size_t *count, char *err,
		   size_t errlen)
{
	int rc;
	const char *values[3] = {arr, lease_id, mark_targets(kind)};
	PGresult *res = store_run(s, ST_RECHECK, 3, values, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*count = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return 0;
}

/* Runs the mark statement, reconnecting after a lost connection and
 * running it again after a serialization failure, MARK_TRIES times in
 * all. *marked counts the rows it moved. */
static int run_mark(struct store *s, enum stmt st, int nparams,
		    const char *const *values, size_t *marked, char *err,
		    size_t errlen)
{
	for (int attempt = 1;; attempt++) {
		int rc;
		PGresult *res = store_run(s, st, nparams, values,
					  PGRES_TUPLES_OK, 0, &rc, err, errlen);
		if (res) {
			*marked =
			    (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
			PQclear(res);
			return 0;
		}
		if (attempt >= MARK_TRIES ||
		    (rc != STORE_RECONNECT && rc != STORE_RETRY_STATEMENT))
			return store_public_rc(rc);
		if (rc == STORE_RECONNECT) {
			/* The reply may have been lost after the commit;
			 * the recheck recognizes that. */
			char why[256];
			log_warn("mark: %s; reconnecting to retry", err);
			if (store_reconnect(s, why, sizeof(why)) != 0) {
				snprintf(err, errlen, "mark: reconnect: %s",
					 why);
				return STORE_RECONNECT;
			}
		}
	}
}

/* Rows not moved now were either moved by an earlier try of this mark
 * whose reply was lost, or are lost leases. The check runs on every
 * shortfall, not only after a reconnect: it also tells a retried mark from
 * a stale one. */
static int account_shortfall(struct store *s, enum store_mark kind,
			     const char *id_arr, const char *lease_id, size_t n,
			     struct mark_result *r, char *err, size_t errlen)
{
	size_t in_target = 0;
	int rc = mark_targets(kind) ? recheck(s, kind, id_arr, lease_id,
					      &in_target, err, errlen)
				    : 0;
	if (rc != 0)
		return rc;
	size_t others = n - r->marked;
	size_t done_before = in_target > r->marked ? in_target - r->marked : 0;
	if (done_before > others)
		done_before = others;
	r->already = done_before;
	r->lost = others - done_before;
	return 0;
}

int store_mark(struct store *s, enum store_mark kind, const char *lease_id,
	       const char *const *ids, const char *const *reasons, size_t n,
	       struct mark_result *r, char *err, size_t errlen)
{
	int ret = STORE_ERROR;
	char *id_arr = NULL, *reason_arr = NULL;
	memset(r, 0, sizeof(*r));
	if (n == 0)
		return 0;
	id_arr = store_pg_array(ids, n, false, 0);
	if (reasons)
		reason_arr = store_pg_array(reasons, n, true, STORE_ERROR_MAX);
	if (!id_arr || (reasons && !reason_arr)) {
		snprintf(err, errlen, "mark: out of memory");
		goto out;
	}
	const char *values[3] = {id_arr, lease_id, reason_arr};
	ret = run_mark(s, mark_stmt(kind), reasons ? 3 : 2, values, &r->marked,
		       err, errlen);
	if (ret == 0 && r->marked < n)
		ret = account_shortfall(s, kind, id_arr, lease_id, n, r, err,
					errlen);
out:
	free(id_arr);
	free(reason_arr);
	return ret;
}
