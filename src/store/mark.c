/* SPDX-License-Identifier: MIT */
/*
 * Marks: concluding a lease's rows inside its transaction, and the commit
 * that makes them take effect (docs/design.md §4). The rows are locked by
 * that transaction, so a mark needs no lease id fence: a relay whose
 * transaction ended (its session killed past the lease, its connection
 * lost) cannot run one, and its COMMIT fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* How long a lost COMMIT reply may leave the server still finishing the
 * transaction before pg_xact_status() settles. */
#define COMMIT_STATUS_TRIES 20
#define COMMIT_STATUS_PAUSE_MS 250

/* The statement of a mark; -1 for the release, which writes nothing: the
 * row's lock goes with the transaction and no attempt is charged. */
static int mark_stmt(const struct store *s, enum store_mark kind)
{
	switch (kind) {
	case MARK_SENT:
		return s->opt.delete_sent ? ST_SENT_DELETE : ST_SENT;
	case MARK_RETRY:
		return ST_RETRY;
	case MARK_TRANSPORT:
		return ST_TRANSPORT;
	case MARK_FAILED:
		return ST_FAILED;
	case MARK_RELEASE:
		break;
	}
	return -1;
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
	if (!s->in_lease) {
		snprintf(err, errlen, "mark: the lease transaction has ended");
		r->lost = n;
		return STORE_RECONNECT;
	}
	int st = mark_stmt(s, kind);
	if (st < 0) {
		r->marked = n;
		return 0;
	}
	id_arr = store_pg_array(ids, n, false, 0);
	if (reasons)
		reason_arr = store_pg_array(reasons, n, true, STORE_ERROR_MAX);
	if (!id_arr || (reasons && !reason_arr)) {
		snprintf(err, errlen, "mark: out of memory");
		goto out;
	}
	const char *values[5] = {id_arr, lease_id, s->ce_source, s->leased_by,
				 reason_arr};
	int nparams = st == ST_SENT_DELETE ? 1 : reasons ? 5 : 4;
	int rc;
	PGresult *res = store_run(s, (enum stmt)st, nparams, values,
				  PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res) {
		ret = store_public_rc(rc);
		goto out;
	}
	r->marked = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
	/* Only a row deleted or concluded outside the relay (by hand) can be
	 * missing: nothing else can touch a locked row. */
	r->lost = n - r->marked;
	PQclear(res);
	ret = 0;
out:
	free(id_arr);
	free(reason_arr);
	return ret;
}

/* After the COMMIT's reply was lost: 1 committed, 0 not, -1 unknown. */
static int committed_after_all(struct store *s, const char *xid, char *err,
			       size_t errlen)
{
	char why[256] = "";
	bool connected = false;
	for (int i = 0; i < COMMIT_STATUS_TRIES; i++) {
		if (!connected && store_reconnect(s, why, sizeof(why)) != 0) {
			clock_sleep_ms(COMMIT_STATUS_PAUSE_MS);
			continue;
		}
		connected = true;
		int rc;
		const char *values[1] = {xid};
		PGresult *res =
		    store_run(s, ST_XACT_STATUS, 1, values, PGRES_TUPLES_OK, 0,
			      &rc, why, sizeof(why));
		if (!res) {
			connected = rc != STORE_RECONNECT;
			continue;
		}
		char status[32];
		snprintf(status, sizeof(status), "%s", PQgetvalue(res, 0, 0));
		PQclear(res);
		if (strcmp(status, "committed") == 0)
			return 1;
		if (strcmp(status, "in progress") != 0)
			return 0;
		clock_sleep_ms(COMMIT_STATUS_PAUSE_MS);
	}
	snprintf(err, errlen,
		 "%s; whether the lease transaction committed "
		 "is unknown",
		 why);
	return -1;
}

int store_lease_commit(struct lease_batch *b, char *err, size_t errlen)
{
	if (!b->rows)
		return 0;
	struct store *s = b->rows->s;
	if (!s->in_lease || s->conn_gen != b->rows->conn_gen) {
		snprintf(err, errlen, "the lease transaction has ended");
		return STORE_RECONNECT;
	}
	int rc = store_lease_end(s, true, err, errlen);
	if (rc != STORE_RECONNECT)
		return rc;
	/* The reply was lost, maybe after the commit. */
	char why[512];
	snprintf(why, sizeof(why), "%s", err);
	int done = committed_after_all(s, b->rows->xid, err, errlen);
	if (done == 1)
		return 0;
	if (done == 0)
		snprintf(err, errlen,
			 "%s; the lease transaction did not commit", why);
	return STORE_RECONNECT;
}
