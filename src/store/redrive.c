/* SPDX-License-Identifier: MIT */
/*
 * Operator changes to rows: redrive (and replay) of finished rows, and
 * lifting the block of a partition key.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pgconn.h"
#include "store_admin.h"
#include "store_internal.h"

/* Ordered mode: redriving a row whose key already went further would
 * deliver it after its successors. STORE_REFUSED then. */
/* Runs st, a count of matching rows whose key has a later row that rules
 * the redrive out, into *later. */
static int count_later(struct store *s, enum stmt st, int nparams,
		       const char *const *values, long *later, char *err,
		       size_t errlen)
{
	int rc;
	PGresult *res = store_run(s, st, nparams, values, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*later = strtol(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return 0;
}

static int check_order(struct store *s, const struct redrive_filter *f,
		       const char *const *values, char *err, size_t errlen)
{
	char kept[24];
	snprintf(kept, sizeof(kept), "%lld", (long long)f->sent_kept_ms);
	const char *params[5] = {values[0], values[1], values[2], values[3],
				 kept};
	int rc;
	PGresult *res = store_run(
	    s, f->sent ? ST_REDRIVE_CHECK_SENT : ST_REDRIVE_CHECK_FAILED, 5,
	    params, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	long later = strtol(PQgetvalue(res, 0, 0), NULL, 10);
	long gone = strtol(PQgetvalue(res, 0, 1), NULL, 10);
	PQclear(res);
	if (later > 0) {
		snprintf(err, errlen,
			 "%ld matching row%s of a partition key that already "
			 "has a later row sent or in flight: redriving would "
			 "break its order (--force to redrive anyway)",
			 later, later == 1 ? " has a key" : "s have keys");
		return STORE_REFUSED;
	}
	if (gone > 0) {
		snprintf(err, errlen,
			 "%ld matching keyed row%s finished longer ago than "
			 "sent rows are kept (OUTBOX_RETENTION%s): a later "
			 "row of the key may have been sent and deleted "
			 "since, and redriving would then deliver it after "
			 "that row (--force to redrive anyway; `unblock "
			 "--redrive` for a blocked key's row)",
			 gone, gone == 1 ? "" : "s",
			 f->sent_kept_ms == 0 ? "=0: no history" : "");
		return STORE_REFUSED;
	}
	return 0;
}

/* The range's rows, and those of it the destination CHECK refuses as
 * pending (old rows with a control character in exchange or routing_key,
 * docs/design.md §10), which the redrive passes over where one of them
 * failed the whole batch it fell in, each time it ran: said with their
 * count and what to do. */
static int count_matching(struct store *s, bool sent, const char *const *values,
			  size_t *count, char *err, size_t errlen)
{
	int rc;
	PGresult *res = store_run(s, sent ? ST_COUNT_SENT : ST_COUNT_FAILED, 4,
				  values, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*count = (size_t)strtoull(PQgetvalue(res, 0, 0), NULL, 10);
	const char *refused = PQgetvalue(res, 0, 1);
	if (strcmp(refused, "0") != 0)
		log_fields(LOG_WARN,
			   "rows of the range are passed over: the table's "
			   "destination CHECK refuses them as pending (a "
			   "control character in exchange or routing_key, "
			   "written before migration 004); correct the column "
			   "or insert a corrected copy",
			   "rows", refused, "status", sent ? "sent" : "failed",
			   NULL);
	PQclear(res);
	return 0;
}

/* True when err (from store_run) says a NOWAIT lock found its row held;
 * lock_timeout's cancel has the same SQLSTATE, and means a table's lock
 * (the cleaner dropping a day, a migrate), not a lease's row: told by
 * its message where the server writes them in English, and otherwise
 * taken for a held row as before. */
static bool lock_not_available(const char *err)
{
	return strncmp(err, "55P03", 5) == 0 &&
	       strstr(err, "lock timeout") == NULL; /* messages in English */
}

/* The ids a batch statement returned (its first column) as a Postgres
 * array literal; NULL when out of memory. */
static char *batch_ids(const PGresult *res)
{
	int n = PQntuples(res);
	const char **ids = malloc((size_t)(n > 0 ? n : 1) * sizeof(*ids));
	char *arr = NULL;
	if (ids) {
		for (int i = 0; i < n; i++)
			ids[i] = PQgetvalue(res, i, 0);
		arr = store_pg_array(ids, (size_t)n, PG_ARRAY_PLAIN, 0);
	}
	free(ids);
	return arr;
}

/* Ordered mode, inside the batch's transaction: has a later row of the
 * key of a row the batch just redrove (ids) been sent since the check
 * before the first batch? STORE_REFUSED then. */
static int recheck_order(struct store *s, const char *ids, char *err,
			 size_t errlen)
{
	const char *values[1] = {ids};
	long later = 0;
	int rc =
	    count_later(s, ST_REDRIVE_RECHECK, 1, values, &later, err, errlen);
	if (rc != 0 || later == 0)
		return rc;
	snprintf(err, errlen,
		 "%ld matching row%s of a partition key whose later row was "
		 "sent while redrive ran: redriving would break its order "
		 "(--force to redrive anyway)",
		 later, later == 1 ? " is" : "s are");
	return STORE_REFUSED;
}

static int block_at_next_failed(struct store *s, const char *key,
				const char *blocking, char *err, size_t errlen);

/* Inside an ordered batch's transaction: a redriven row that blocked its
 * key lifts the block, as `unblock --redrive` does, and the key's next
 * failed row past it blocks the key in turn. The lease holds back only
 * the rows after a blocking row, so the row went out again while every
 * later row of its key stayed blocked for good, with nothing said. */
static int lift_redriven_blocks(struct store *s, const char *ids, char *err,
				size_t errlen)
{
	if (s->blocked[0] == '(')
		return 0; /* no blocked-keys table: no key is blocked */
	char *sql = store_asprintf("DELETE FROM %s WHERE blocking_id = "
				   "ANY($1::uuid[]) RETURNING partition_key, "
				   "blocking_id::text",
				   s->blocked);
	const char *values[1] = {ids};
	int rc;
	PGresult *res = store_exec(s, "redrive: the blocks of its rows", sql, 1,
				   values, PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	rc = 0;
	for (int i = 0; rc == 0 && i < PQntuples(res); i++) {
		char said[512];
		rc = block_at_next_failed(s, PQgetvalue(res, i, 0),
					  PQgetvalue(res, i, 1), said,
					  sizeof(said));
		if (rc != 0)
			snprintf(err, errlen, "%s", said);
		else
			log_fields(LOG_INFO,
				   "a redriven row blocked its key: the "
				   "block is lifted",
				   "key", PQgetvalue(res, i, 0), "row",
				   PQgetvalue(res, i, 1), "next_block",
				   said[0] ? said : "none", NULL);
	}
	PQclear(res);
	return rc;
}

/* One batch of the ordered redrive, in its own transaction: the batch
 * statement writes each key's next pending row (sql_redrive_ordered), the
 * recheck sees rows sent since the first check, and any refusal rolls
 * the whole batch back. *n counts the rows it moved. */
static int redrive_ordered_batch(struct store *s,
				 const struct redrive_filter *f,
				 const char *const *values, size_t *n,
				 char *err, size_t errlen)
{
	int rc = store_exec_cmd(s, "redrive", PGCONN_BEGIN, 0, NULL, NULL, err,
				errlen);
	if (rc != 0)
		return rc;
	PGresult *res =
	    store_run(s, f->sent ? ST_REDRIVE_SENT : ST_REDRIVE_FAILED, 4,
		      values, PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res && lock_not_available(err)) {
		snprintf(err, errlen,
			 "a later row of a matching row's partition key is "
			 "held by a lease (being published now): redriving "
			 "now would deliver the earlier row after it; "
			 "nothing of this batch changed, run it again");
		rc = STORE_REFUSED;
	}
	if (!res)
		goto fail;
	*n = (size_t)PQntuples(res);
	if (*n > 0 && strtol(PQgetvalue(res, 0, 1), NULL, 10) > 0) {
		/* A key's next row left pending after the statement read it
		 * (a lease's commit): its lock passed it over, and the row
		 * behind it may be out now. */
		PQclear(res);
		snprintf(err, errlen,
			 "a later row of a matching row's partition key "
			 "changed while the batch ran (a relay finished it): "
			 "nothing of this batch changed, run it again");
		rc = STORE_REFUSED;
		goto fail;
	}
	char *ids = *n > 0 ? batch_ids(res) : NULL;
	PQclear(res);
	if (*n > 0 && !ids) {
		snprintf(err, errlen, "redrive: out of memory");
		rc = STORE_ERROR;
		goto fail;
	}
	rc = f->force || !ids ? 0 : recheck_order(s, ids, err, errlen);
	if (rc == 0 && ids && !f->sent)
		rc = lift_redriven_blocks(s, ids, err, errlen);
	free(ids);
	if (rc != 0)
		goto fail;
	return store_finish_tx(s, TX_COMMIT, err, errlen);
fail : {
	char ignored[64];
	store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
	return store_public_rc(rc);
}
}

/* One batch of at most REDRIVE_BATCH rows, its own autocommit statement
 * (ordered mode: its own transaction), so what is done stays done; *n
 * counts the rows it moved. */
static int redrive_batch(struct store *s, const struct redrive_filter *f,
			 const char *const *values, size_t *n, char *err,
			 size_t errlen)
{
	int rc;
	if (s->opt.ordered)
		return redrive_ordered_batch(s, f, values, n, err, errlen);
	PGresult *res =
	    store_run(s, f->sent ? ST_REDRIVE_SENT : ST_REDRIVE_FAILED, 4,
		      values, PGRES_COMMAND_OK, 0, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*n = (size_t)strtoull(PQcmdTuples(res), NULL, 10);
	PQclear(res);
	return 0;
}

/* Adds a batch's n to *count and asks the watcher (total 0: unknown)
 * whether to go on. */
static bool batch_done(const struct redrive_filter *f, size_t n, size_t total,
		       size_t *count)
{
	*count += n;
	struct store_progress_info p = {.what = "redrive",
					.done = (int64_t)*count,
					.total = (int64_t)total};
	return !f->progress || f->progress->fn(f->progress->ctx, &p);
}

/* Redrives batch after batch until one comes back short, or the watcher
 * asks to stop. */
static int redrive_batches(struct store *s, const struct redrive_filter *f,
			   const char *const *values, size_t total,
			   size_t *count, char *err, size_t errlen)
{
	for (;;) {
		size_t n = 0;
		int rc = redrive_batch(s, f, values, &n, err, errlen);
		if (rc != 0)
			return rc;
		if (!batch_done(f, n, total, count) || n < REDRIVE_BATCH)
			return 0;
	}
}

/* The first slice's width; each slice after is twice or half the one
 * before. */
#define SLICE_US INT64_C(1000000)

/* The matching sent rows' span of finished_at, [*lo, *hi) in
 * microseconds since 2000-01-01; *lo == *hi when none matches. */
static int span_sent(struct store *s, const char *const *values, int64_t *lo,
		     int64_t *hi, char *err, size_t errlen)
{
	int rc;
	PGresult *res = store_run(s, ST_SPAN_SENT, 4, values, PGRES_TUPLES_OK,
				  0, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*lo = *hi = 0;
	if (!PQgetisnull(res, 0, 0)) {
		*lo = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
		*hi = strtoll(PQgetvalue(res, 0, 1), NULL, 10);
	}
	PQclear(res);
	return 0;
}

/*
 * Sent rows, batch after batch through their span of finished_at in
 * slices. On a partitioned table the daily partitions index sent rows
 * with a BRIN (migrate_terminal.c), which gives neither an order nor an
 * early stop: a batch statement's `ORDER BY finished_at LIMIT` over the
 * whole range would read every page of it for each batch. So each batch
 * gets a slice of the span as its range, sized to about one batch: a
 * slice that fills its batch may hold more and is taken again, halved
 * (down to a microsecond: rows of one mark share their finished_at, and
 * each full batch moves its rows out of sent, so the slice empties); one
 * that does not is passed, and the next doubled. A slice cut short by
 * rows another session holds (SKIP LOCKED) is passed as a short batch
 * ends the unsliced loop. Rows finished after the span was read are not
 * in it.
 */
static int redrive_sliced(struct store *s, const struct redrive_filter *f,
			  const char *const *values, size_t total,
			  size_t *count, char *err, size_t errlen)
{
	int64_t at = 0, end = 0, width = SLICE_US;
	int rc = span_sent(s, values, &at, &end, err, errlen);
	if (rc != 0)
		return rc;
	char from[40], to[40];
	if (at < end &&
	    (!store_floor_text(at, from) || !store_floor_text(end, to)))
		/* Written by hand out of the years a slice can name. */
		return redrive_batches(s, f, values, total, count, err, errlen);
	while (at < end) {
		int64_t next = end - at > width ? at + width : end;
		store_floor_text(at, from);
		store_floor_text(next, to);
		const char *slice[4] = {values[0], values[1], from, to};
		size_t n = 0;
		rc = redrive_batch(s, f, slice, &n, err, errlen);
		if (rc != 0)
			return rc;
		if (!batch_done(f, n, total, count))
			return 0;
		if (n == REDRIVE_BATCH) {
			width = width > 1 ? width / 2 : 1;
			continue;
		}
		at = next;
		if (width < INT64_MAX / 2)
			width *= 2;
	}
	return 0;
}

/* Names each id of --id that is not a row of the status asked for (one
 * not in the table: deleted after its retention, or never written; one
 * pending, sent or failed where the other was asked), which the report's
 * count alone left the operator to guess. */
static int tell_unmatched_ids(struct store *s, const char *ids, bool sent,
			      char *err, size_t errlen)
{
	const char *want = sent ? "sent" : "failed";
	char *sql = store_asprintf(
	    "SELECT x.id::text, t.status FROM unnest($1::uuid[]) WITH "
	    "ORDINALITY x(id, n) LEFT JOIN %s t ON t.id = x.id WHERE t.id "
	    "IS NULL OR t.status <> '%s' ORDER BY x.n",
	    s->table.quoted, want);
	const char *values[1] = {ids};
	int rc;
	PGresult *res = store_exec(s, "redrive: the ids given", sql, 1, values,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	for (int i = 0; i < PQntuples(res); i++)
		log_fields(LOG_WARN,
			   PQgetisnull(res, i, 1)
			       ? "an id given is not in the table (deleted "
				 "after its retention, or never written)"
			       : "an id given is not a row of the status "
				 "asked for",
			   "id", PQgetvalue(res, i, 0), "status",
			   PQgetisnull(res, i, 1) ? "none"
						  : PQgetvalue(res, i, 1),
			   "asked", want, NULL);
	PQclear(res);
	return 0;
}

/* A replay whose range starts before the sent rows kept (its
 * OUTBOX_RETENTION, sent_kept_ms) finds only what retention left: the
 * report's count would read as the whole range replayed. */
static void tell_retention(struct store *s, const struct redrive_filter *f)
{
	if (!f->sent || !f->since || f->sent_kept_ms < 0)
		return;
	char kept[32], why[256];
	snprintf(kept, sizeof(kept), "%lld", (long long)f->sent_kept_ms);
	const char *values[2] = {f->since, kept};
	int rc;
	PGresult *res =
	    store_exec(s, "redrive: the retention",
		       "SELECT $1::timestamptz < now() - "
		       "make_interval(secs => $2::float8 / 1000)",
		       2, values, PGRES_TUPLES_OK, &rc, why, sizeof(why));
	if (res && strcmp(PQgetvalue(res, 0, 0), "t") == 0)
		log_fields(LOG_WARN,
			   f->sent_kept_ms == 0
			       ? "sent rows are deleted as they are marked "
				 "(OUTBOX_RETENTION=0): none is left to replay"
			       : "the range starts before the sent rows kept "
				 "(OUTBOX_RETENTION): rows sent before then "
				 "may be gone, and are not replayed",
			   "since", f->since, NULL);
	PQclear(res);
}

/* A redrive without OUTBOX_ORDERING=partition of a table with a blocked
 * key: refused as beside ordered relays (below), whose registry rows may
 * all be gone (every relay stopped, a crashed one pruned): a block says
 * an ordered relay ran, and the plain way would not lift it. */
static int refuse_beside_blocked(struct store *s, char *err, size_t errlen)
{
	char *sql = store_asprintf("SELECT partition_key FROM %s b LIMIT 1",
				   s->blocked);
	int rc;
	PGresult *res = store_exec(s, "redrive: the blocked keys", sql, 0, NULL,
				   PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	rc = 0;
	if (PQntuples(res) > 0) {
		snprintf(err, errlen,
			 "redrive: key %.200s of %s is blocked (a relay with "
			 "OUTBOX_ORDERING=partition and "
			 "OUTBOX_ORDERING_ON_FAILURE=block ran on it), and "
			 "this command runs without OUTBOX_ORDERING=partition: "
			 "set it and OUTBOX_ORDERING_ON_FAILURE=block for it, "
			 "so that it keeps the keys' order and lifts the "
			 "blocks of the rows it moves",
			 PQgetvalue(res, 0, 0), s->table.literal);
		rc = STORE_REFUSED;
	}
	PQclear(res);
	return rc;
}

/* A redrive without OUTBOX_ORDERING=partition, of a table whose registry
 * holds a relay that records it (migration 014): refused, since the plain
 * way keeps no key's order (no check of later rows sent, no write of the
 * key's next row against leases of older snapshots) and lifts no block,
 * so a redriven blocking row went out while its key's later rows stayed
 * blocked for good. A registry without the record (relays before 014, a
 * table made by hand) tells nothing. */
static int refuse_beside_ordered(struct store *s, char *err, size_t errlen)
{
	struct names n;
	admin_names_of(&s->table, &n);
	/* to_jsonb() reads a column a registry before 014 does not have. */
	char *sql = store_asprintf(
	    "SELECT id, greatest(0, extract(epoch FROM now() - "
	    "last_seen_at))::bigint FROM %s r WHERE to_jsonb(r)->>'ordering' "
	    "= 'partition' ORDER BY last_seen_at DESC, id LIMIT 1",
	    n.registry);
	int rc;
	/* Unprefixed, so that the SQLSTATE leads the error: a table made by
	 * hand has no registry, and was refused for "42P01" not read. */
	PGresult *res = store_exec(s, NULL, sql, 0, NULL, PGRES_TUPLES_OK, &rc,
				   err, errlen);
	free(sql);
	if (!res) {
		if (!store_err_undefined_table(err))
			return store_public_rc(rc);
		return 0;
	}
	rc = 0;
	if (PQntuples(res) > 0) {
		snprintf(
		    err, errlen,
		    "redrive: the relays of %s keep each key's order "
		    "(relay %s records OUTBOX_ORDERING=partition in the "
		    "registry, last seen %s s ago), and this command runs "
		    "without it: set OUTBOX_ORDERING=partition (and the "
		    "relays' OUTBOX_ORDERING_ON_FAILURE) for it, so that it "
		    "keeps their order and lifts the blocks of the rows it "
		    "moves (a relay gone for good leaves the registry a day "
		    "after its last heartbeat, or when its row is deleted)",
		    s->table.literal, PQgetvalue(res, 0, 0),
		    PQgetvalue(res, 0, 1));
		rc = STORE_REFUSED;
	}
	PQclear(res);
	return rc;
}

int store_redrive(struct store *s, const struct redrive_filter *given,
		  size_t *count, char *err, size_t errlen)
{
	if (!s->opt.ordered) {
		int rc = refuse_beside_ordered(s, err, errlen);
		if (rc == 0)
			rc = refuse_beside_blocked(s, err, errlen);
		if (rc != 0)
			return rc;
	}
	struct redrive_filter kept = *given;
	const struct redrive_filter *f = &kept;
	if ((given->sent && given->since) ||
	    (s->opt.ordered && !given->force)) {
		/* Since when a later row of a key may have been deleted
		 * (store_admin_kept()). */
		struct store_kept own = {.sent_ms = given->sent_kept_ms,
					 .failed_ms = -1};
		kept.sent_kept_ms =
		    store_admin_kept(s, own, STORE_KEPT_SINCE).sent_ms;
	}
	int rc = 0;
	char *ids = NULL;
	*count = 0;
	if (f->n_ids > 0) {
		ids = store_pg_array(f->ids, f->n_ids, PG_ARRAY_PLAIN, 0);
		if (!ids) {
			snprintf(err, errlen, "redrive: out of memory");
			return STORE_ERROR;
		}
	}
	const char *values[4] = {ids, f->type, f->since, f->until};
	tell_retention(s, f);
	if (ids)
		rc = tell_unmatched_ids(s, ids, f->sent, err, errlen);
	if (rc == 0 && s->opt.ordered && !f->force)
		rc = check_order(s, f, values, err, errlen);
	size_t total = 0;
	if (rc == 0 && (f->dry_run || f->count_first))
		rc = count_matching(s, f->sent, values, &total, err, errlen);
	if (rc == 0 && f->dry_run)
		*count = total;
	else if (rc == 0 && f->sent)
		rc = redrive_sliced(s, f, values, total, count, err, errlen);
	else if (rc == 0)
		rc = redrive_batches(s, f, values, total, count, err, errlen);
	free(ids);
	return rc;
}

/* The blocking row of key, removed from the blocked keys; STORE_REFUSED
 * when key is not blocked. */
static int take_block(struct store *s, const char *key, char *blocking,
		      size_t blocking_len, char *err, size_t errlen)
{
	int rc;
	const char *values[1] = {key};
	PGresult *res = store_run(s, ST_UNBLOCK, 1, values, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	if (!res)
		return rc;
	if (PQntuples(res) == 0) {
		PQclear(res);
		snprintf(err, errlen, "partition key '%.200s' is not blocked",
			 key);
		return STORE_REFUSED;
	}
	snprintf(blocking, blocking_len, "%s", PQgetvalue(res, 0, 0));
	PQclear(res);
	return 0;
}

/* After the block at row blocking is lifted: the key's next failed row
 * past it blocks the key in turn. Such a row failed ahead of its turn while
 * the key was blocked (an old row the destination CHECK refused, failed
 * before the session's first lease) and held the block until an earlier
 * row's failure took it (store_block_tail): lifting the earlier block
 * must not let the key go on past it. Read by the index of finished rows
 * (the failed ones, few). */
static int block_at_next_failed(struct store *s, const char *key,
				const char *blocking, char *err, size_t errlen)
{
	const char *T = s->table.quoted;
	char *sql = store_asprintf(
	    "INSERT INTO %s (partition_key, blocking_id, reason) SELECT "
	    "o.partition_key, o.id, o.last_error FROM %s o WHERE o.status = "
	    "'failed' AND o.partition_key = $1 AND o.seq > (SELECT x.seq FROM "
	    "%s x WHERE x.id = $2::uuid) ORDER BY o.seq LIMIT 1 ON CONFLICT "
	    "(partition_key) DO NOTHING RETURNING blocking_id::text",
	    s->blocked, T, T);
	const char *values[2] = {key, blocking};
	int rc;
	PGresult *res = store_exec(s, "unblock: the next failed row", sql, 2,
				   values, PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	if (PQntuples(res) == 1)
		snprintf(err, errlen,
			 "; blocked again at its next failed row %s, which "
			 "failed ahead of its turn: the key goes on up to it "
			 "(unblock it in turn to go past it)",
			 PQgetvalue(res, 0, 0));
	else
		err[0] = '\0';
	PQclear(res);
	return 0;
}

/* What became of the blocking row a skip passes over, for the operator
 * (into note): still failed, or no longer (redriven or sent since, or set
 * by hand), where "it stays failed" would be wrong: a pending one goes
 * first. */
static int skipped_row_note(struct store *s, const char *blocking, char *note,
			    size_t notelen, char *err, size_t errlen)
{
	char *sql = store_asprintf(
	    "SELECT coalesce((SELECT status FROM %s WHERE id = $1::uuid), "
	    "'deleted')",
	    s->table.quoted);
	const char *values[1] = {blocking};
	int rc;
	PGresult *res = store_exec(s, "unblock: the blocking row", sql, 1,
				   values, PGRES_TUPLES_OK, &rc, err, errlen);
	free(sql);
	if (!res)
		return store_public_rc(rc);
	const char *status = PQgetvalue(res, 0, 0);
	if (strcmp(status, "failed") == 0)
		snprintf(note, notelen, "; its blocking row stays failed");
	else if (strcmp(status, "pending") == 0)
		snprintf(note, notelen,
			 "; its blocking row %s is pending, not failed "
			 "(redriven since), and goes first",
			 blocking);
	else
		snprintf(note, notelen,
			 "; its blocking row %s is %s, no longer failed",
			 blocking, status);
	PQclear(res);
	return 0;
}

int store_unblock(struct store *s, const char *key, bool redrive, char *err,
		  size_t errlen)
{
	int rc;
	char blocking[64];
	if (s->blocked[0] == '(') {
		/* No blocked-keys table (store.c reads an empty stand-in): no
		 * key can be blocked. */
		snprintf(err, errlen,
			 "partition key '%.200s' is not blocked: %s has no "
			 "blocked-keys table (`outbox-relay migrate` creates "
			 "it)",
			 key, s->table.literal);
		return STORE_REFUSED;
	}
	rc = store_exec_cmd(s, "unblock", PGCONN_BEGIN, 0, NULL, NULL, err,
			    errlen);
	if (rc != 0)
		return rc;
	rc = take_block(s, key, blocking, sizeof(blocking), err, errlen);
	if (rc != 0)
		goto fail;
	const char *values[1] = {redrive ? blocking : key};
	PGresult *res =
	    store_run(s, redrive ? ST_UNBLOCK_REDRIVE : ST_UNBLOCK_SKIP, 1,
		      values, PGRES_COMMAND_OK, 0, &rc, err, errlen);
	if (!res)
		goto fail;
	bool redriven = strcmp(PQcmdTuples(res), "1") == 0;
	PQclear(res);
	char note[160] = "";
	if (!redrive && (rc = skipped_row_note(s, blocking, note, sizeof(note),
					       err, errlen)) != 0)
		goto fail;
	if (redrive && !redriven) {
		/* Lifting the block would let the key go on without the
		 * row the operator asked to send again. */
		snprintf(err, errlen,
			 "the blocking row %s of partition key '%.200s' is no "
			 "longer failed (redriven, sent or deleted since): "
			 "nothing to redrive, and the key stays blocked "
			 "(`unblock --skip` lets it go on)",
			 blocking, key);
		rc = STORE_REFUSED;
		goto fail;
	}
	if ((rc = block_at_next_failed(s, key, blocking, err, errlen)) != 0)
		goto fail;
	if (note[0]) {
		char next[512];
		snprintf(next, sizeof(next), "%s", err);
		snprintf(err, errlen, "%s%s", note, next);
	}
	rc = store_finish_tx(s, TX_COMMIT, note, sizeof(note));
	if (rc != 0)
		snprintf(err, errlen, "%s", note);
	return rc;
fail : {
	char ignored[64];
	store_finish_tx(s, TX_ROLLBACK, ignored, sizeof(ignored));
	return store_public_rc(rc);
}
}
