/* SPDX-License-Identifier: MIT */
/*
 * Marks: concluding a lease's rows inside its transaction, and the commit
 * that makes them take effect (docs/design.md §4). The rows are locked by
 * that transaction, so a mark needs no lease id fence: a relay whose
 * transaction ended (its session killed past the lease, its connection
 * lost) cannot run one, and its COMMIT fails.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guards.h"
#include "store_internal.h"
#include "store_test.h"

/* How long a lost COMMIT reply may leave the server still finishing the
 * transaction before pg_xact_status() settles. */
#define COMMIT_STATUS_TRIES 20
#define COMMIT_STATUS_PAUSE_MS 250

/* The statement of a mark; -1 for the release, which writes no row: the
 * row's lock goes with the transaction and no attempt is charged (its id
 * leaves the claim instead). */
static int mark_stmt(const struct store *s, enum mark_kind kind)
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

/* The worker passes the ids the lease gave it, which point into the
 * lease's own text, so finding one is pointer arithmetic; an id copied
 * elsewhere is looked up by value. */
struct lease_text *lease_row_of(const struct lease_rows *rows, const char *id)
{
	/* As integers: relational comparison of pointers into different
	 * objects is undefined. */
	uintptr_t first = (uintptr_t)rows->text;
	uintptr_t end = (uintptr_t)(rows->text + rows->n);
	uintptr_t at = (uintptr_t)id;
	if (at >= first && at < end) {
		size_t k = (size_t)(at - first) / sizeof(rows->text[0]);
		if (id == rows->text[k].id)
			return &rows->text[k];
	}
	for (size_t k = 0; k < rows->n; k++)
		if (strcmp(rows->text[k].id, id) == 0)
			return &rows->text[k];
	return NULL;
}

/* The ctids of ids as a Postgres array literal; NULL with err set when an
 * id is not a row of the open lease or memory ran out. */
static char *tid_array(const struct store *s, const char *const *ids, size_t n,
		       char *err, size_t errlen)
{
	const struct lease_rows *rows = s->open_lease;
	const char **tids = malloc(n * sizeof(*tids));
	char *arr = NULL;
	if (!tids) {
		snprintf(err, errlen, "mark: out of memory");
		return NULL;
	}
	for (size_t i = 0; i < n; i++) {
		const struct lease_text *row =
		    rows ? lease_row_of(rows, ids[i]) : NULL;
		tids[i] = row ? row->tid : NULL;
		if (!tids[i]) {
			snprintf(err, errlen,
				 "mark: row %s is not one of the open lease's",
				 ids[i]);
			goto out;
		}
	}
	arr =
	    store_pg_array(tids, n, PG_ARRAY_QUOTED, sizeof(rows->text[0].tid));
	if (!arr)
		snprintf(err, errlen, "mark: out of memory");
out:
	free(tids);
	return arr;
}

/* Whether a mark's statement returns its count as a row (ordered mode's
 * tail reads the rows it moved) rather than in its command tag. */
static bool counts_in_row(const struct store *s, int st)
{
	return store_mark_has_tail(s, st == ST_RETRY || st == ST_FAILED);
}

int store_mark(struct store *s, enum mark_kind kind, const char *const *ids,
	       const char *const *reasons, size_t n, struct mark_result *r,
	       char *err, size_t errlen)
{
	int ret = STORE_ERROR;
	char *tid_arr = NULL, *reason_arr = NULL, *id_arr = NULL;
	bool res_sent = false; /* a statement reached the session */
	memset(r, 0, sizeof(*r));
	if (n == 0)
		return 0;
	int st = mark_stmt(s, kind);
	/* A row released or retried is pending again once the lease
	 * ends, maybe below a due turn others moved past it (due_turn.c). */
	if (kind != MARK_SENT && kind != MARK_FAILED)
		s->due_turn_let_go = true;
	if (st < 0 && s->open_lease) {
		/* Rows never handed over leave the claim, even of a lease
		 * that already ended: they owe no attempt (§4). A claim that
		 * keeps them costs only that attempt, should the lease
		 * abort. */
		char why[256];
		if (store_claim_release(s, s->open_lease->lease_id, ids, n, why,
					sizeof(why)) != 0)
			log_warn("released rows stay in the lease's claim: %s",
				 why);
	}
	if (s->ses->leasing != s || !s->open_lease) {
		snprintf(err, errlen, "mark: the lease transaction has ended");
		return STORE_RECONNECT;
	}
	if (st < 0) {
		r->marked = n;
		return 0;
	}
	tid_arr = tid_array(s, ids, n, err, errlen);
	if (!tid_arr)
		goto out;
	id_arr = store_pg_array(ids, n, PG_ARRAY_PLAIN, 0);
	if (!id_arr) {
		snprintf(err, errlen, "mark: out of memory");
		goto out;
	}
	if (reasons)
		reason_arr = store_pg_array(reasons, n, PG_ARRAY_QUOTED,
					    STORE_ERROR_MAX);
	if (reasons && !reason_arr) {
		snprintf(err, errlen, "mark: out of memory");
		goto out;
	}
	/* The rows' ids come last: $2 of the delete, $5 of the sent mark,
	 * $6 of the marks with a reason. */
	const char *values[6] = {tid_arr,      s->open_lease->lease_id,
				 s->ce_source, s->leased_by,
				 reason_arr,   NULL};
	int nparams = st == ST_SENT_DELETE ? 2 : reasons ? 6 : 5;
	values[nparams - 1] = id_arr;
	bool in_row = counts_in_row(s, st);
	int rc;
	res_sent = true;
	PGresult *res = store_run(s, (enum stmt)st, nparams, values,
				  in_row ? PGRES_TUPLES_OK : PGRES_COMMAND_OK,
				  0, &rc, err, errlen);
	if (!res && rc == STORE_RECONNECT && !GUARD_MARK_FENCED &&
	    store_reconnect(s, err, errlen) == 0)
		/* Without the fence: the row lease's retry of a lost mark on
		 * a new session, outside any lease (guards.h). */
		res = store_run(s, (enum stmt)st, nparams, values,
				in_row ? PGRES_TUPLES_OK : PGRES_COMMAND_OK, 0,
				&rc, err, errlen);
	if (!res) {
		ret = store_public_rc(rc);
		goto out;
	}
	r->marked = (size_t)strtoull(
	    in_row ? PQgetvalue(res, 0, 0) : PQcmdTuples(res), NULL, 10);
	/* Only a row this lease marked already can be missing: no other
	 * session can change a row the lease holds locked. */
	r->missing = n - r->marked;
	PQclear(res);
	/* Once the lease commits, the keys' floors move past these rows
	 * (key_map_passed). */
	if (s->open_lease && (kind == MARK_SENT || kind == MARK_FAILED))
		for (size_t i = 0; i < n; i++) {
			struct lease_text *row =
			    lease_row_of(s->open_lease, ids[i]);
			if (row)
				row->finished = true;
		}
	ret = 0;
out:
	if (ret != 0 && !res_sent)
		s->open_lease_failed = true;
	free(tid_arr);
	free(reason_arr);
	free(id_arr);
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
		if (!res && strncmp(why, "22023", 5) == 0) {
			/* "transaction ID ... is in the future": asked again
			 * it fails again, as the session was never lost. */
			snprintf(why, sizeof(why),
				 "the server the session reached again has "
				 "not yet given out transaction id %s (a "
				 "restored copy, another cluster)",
				 xid);
			break;
		}
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

int store_commit_status(struct store *s, const char *xid, char *err,
			size_t errlen)
{
	return committed_after_all(s, xid, err, errlen);
}

int store_lease_commit(struct store *s, struct lease_batch *b, char *err,
		       size_t errlen)
{
	if (!b->rows)
		return 0;
	if (b->rows->s != s || s->ses->leasing != s ||
	    s->ses->conn_gen != b->rows->conn_gen) {
		snprintf(err, errlen, "the lease transaction has ended");
		return STORE_RECONNECT;
	}
	if (s->open_lease_failed) {
		int ended = store_lease_end(s, TX_ROLLBACK, err, errlen);
		if (ended != 0)
			return ended;
		snprintf(err, errlen,
			 "a mark of the lease failed before it was sent; the "
			 "lease transaction was rolled back");
		return STORE_ERROR;
	}
	int rc = store_lease_end(s, TX_COMMIT, err, errlen);
	if (rc == 0)
		key_map_passed(s, b->rows);
	if (rc != STORE_RECONNECT)
		return rc;
	/* The reply was lost, maybe after the commit. */
	char why[512];
	snprintf(why, sizeof(why), "%s", err);
	int done = committed_after_all(s, b->rows->xid, err, errlen);
	/* Committed, but its key moves are not shared: the session reached
	 * again may be another server's (an asynchronous standby promoted,
	 * which never saw the commit and gave its transaction id to another),
	 * and a floor moved past a row still pending there would let the
	 * key's next row out first. This store's map is built again on the
	 * new session; the others' floors stay lower, which costs a read. */
	if (done == 1)
		return 0;
	if (done == 0)
		snprintf(err, errlen,
			 "%s; the lease transaction did not commit", why);
	return STORE_RECONNECT;
}
