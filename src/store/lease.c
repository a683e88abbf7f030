/* SPDX-License-Identifier: MIT */
/*
 * Leasing: the lease itself and its renewal, and what the workers ask
 * before leasing (operator pauses, ordered mode's head classification,
 * when the next row is due).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_internal.h"

/* Columns of the lease's RETURNING list, in order. */
enum lease_col {
	LC_ID,
	LC_SEQ,
	LC_TYPE,
	LC_SOURCE,
	LC_SUBJECT,
	LC_CONTENT_TYPE,
	LC_EXCHANGE,
	LC_ROUTING_KEY,
	LC_PARTITION_KEY,
	LC_PAYLOAD,
	LC_HEADERS,
	LC_TIME,
	LC_CREATED_US,
	LC_ATTEMPTS,
	LC_MAX_ATTEMPTS,
	LC_LEASE_ID,
};

void lease_batch_release(struct lease_batch *b)
{
	if (b->rows) {
		PQclear(b->rows->res);
		free(b->rows);
	}
	memset(b, 0, sizeof(*b));
}

static const char *col(PGresult *res, int row, int c)
{
	return PQgetisnull(res, row, c) ? NULL : PQgetvalue(res, row, c);
}

static long long col_ll(PGresult *res, int row, int c)
{
	return strtoll(PQgetvalue(res, row, c), NULL, 10);
}

/* Row i of a lease result as an event pointing into res. */
static void event_of(PGresult *res, int i, struct outbox_event *e)
{
	e->id = col(res, i, LC_ID);
	e->seq = col_ll(res, i, LC_SEQ);
	e->type = col(res, i, LC_TYPE);
	e->source = col(res, i, LC_SOURCE);
	e->subject = col(res, i, LC_SUBJECT);
	e->content_type = col(res, i, LC_CONTENT_TYPE);
	e->exchange = col(res, i, LC_EXCHANGE);
	e->routing_key = col(res, i, LC_ROUTING_KEY);
	e->partition_key = col(res, i, LC_PARTITION_KEY);
	e->payload = (const unsigned char *)PQgetvalue(res, i, LC_PAYLOAD);
	e->payload_len = (size_t)PQgetlength(res, i, LC_PAYLOAD);
	e->headers_json = col(res, i, LC_HEADERS);
	e->time = col(res, i, LC_TIME);
	e->created_at_us = col_ll(res, i, LC_CREATED_US);
	e->attempts = (int)strtol(PQgetvalue(res, i, LC_ATTEMPTS), NULL, 10);
	e->max_attempts =
	    (int)strtol(PQgetvalue(res, i, LC_MAX_ATTEMPTS), NULL, 10);
	/* A table created without our CHECKs may hold NULLs where the relay
	 * expects text; the encoder fails those rows. */
	if (!e->type)
		e->type = "";
	if (!e->content_type)
		e->content_type = "application/octet-stream";
	if (!e->routing_key)
		e->routing_key = "";
	if (!e->headers_json)
		e->headers_json = "null";
	if (!e->source)
		e->source = "";
	if (!e->time)
		e->time = "";
}

int store_lease(struct store *s, const char *const *paused, size_t n_paused,
		const char *default_destination, struct lease_batch *out,
		char *err, size_t errlen)
{
	int rc;
	char timeout[32];
	memset(out, 0, sizeof(*out));
	char *paused_arr = store_pg_array(paused, n_paused, true, 4096);
	if (!paused_arr) {
		snprintf(err, errlen, "lease: out of memory");
		return STORE_ERROR;
	}
	snprintf(timeout, sizeof(timeout), "%lld",
		 (long long)s->opt.lease_timeout_ms);
	const char *values[5] = {timeout, s->leased_by, paused_arr,
				 default_destination ? default_destination : "",
				 s->ce_source};
	/* Binary results: text columns arrive as they are and the payload
	 * needs no unescaping. */
	PGresult *res = store_run(s, ST_LEASE, 5, values, PGRES_TUPLES_OK, 1,
				  &rc, err, errlen);
	free(paused_arr);
	if (!res)
		return store_public_rc(rc);
	int n = PQntuples(res);
	if (n == 0) {
		PQclear(res);
		return 0;
	}
	struct lease_rows *rows =
	    calloc(1, sizeof(*rows) + (size_t)n * sizeof(rows->events[0]));
	if (!rows) {
		PQclear(res);
		/* The rows are leased; the sweeper returns them. */
		snprintf(err, errlen, "lease: out of memory for %d rows", n);
		return STORE_ERROR;
	}
	rows->res = res;
	out->rows = rows;
	out->events = rows->events;
	out->n = (size_t)n;
	snprintf(out->lease_id, sizeof(out->lease_id), "%s",
		 PQgetvalue(res, 0, LC_LEASE_ID));
	for (int i = 0; i < n; i++)
		event_of(res, i, &out->events[i]);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Sets held[i] for each ids[i] among the ids res returned. */
static int match_held(PGresult *res, const char *const *ids, size_t n,
		      bool *held, size_t *n_held)
{
	int m = PQntuples(res);
	const char **kept = malloc(sizeof(*kept) * (size_t)(m > 0 ? m : 1));
	if (!kept)
		return -1;
	for (int i = 0; i < m; i++)
		kept[i] = PQgetvalue(res, i, 0);
	qsort(kept, (size_t)m, sizeof(*kept), cmp_str);
	for (size_t i = 0; i < n; i++) {
		const char *key = ids[i];
		held[i] = bsearch(&key, kept, (size_t)m, sizeof(*kept),
				  cmp_str) != NULL;
		if (held[i])
			(*n_held)++;
	}
	free(kept);
	return 0;
}

int store_renew(struct store *s, const char *lease_id, const char *const *ids,
		size_t n, bool *held, size_t *n_held, char *err, size_t errlen)
{
	int rc;
	*n_held = 0;
	for (size_t i = 0; i < n; i++)
		held[i] = false;
	if (n == 0)
		return 0;
	char *arr = store_pg_array(ids, n, false, 0);
	if (!arr) {
		snprintf(err, errlen, "renew: out of memory");
		return STORE_ERROR;
	}
	const char *values[2] = {arr, lease_id};
	PGresult *res = store_run(s, ST_RENEW, 2, values, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	free(arr);
	if (!res)
		return store_public_rc(rc);
	rc = match_held(res, ids, n, held, n_held);
	PQclear(res);
	if (rc != 0) {
		snprintf(err, errlen, "renew: out of memory");
		return STORE_ERROR;
	}
	return 0;
}

int store_next_due_ms(struct store *s, int64_t *ms, char *err, size_t errlen)
{
	int rc;
	PGresult *res = store_run(s, ST_NEXT_DUE, 0, NULL, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*ms = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return 0;
}

int store_read_pauses(struct store *s, bool *global, char (*keys)[300],
		      size_t max_keys, size_t *n, char *err, size_t errlen)
{
	int rc;
	*global = false;
	*n = 0;
	PGresult *res = store_run(s, ST_CONTROL, 0, NULL, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	for (int i = 0; i < PQntuples(res); i++) {
		const char *d = PQgetvalue(res, i, 0);
		if (strcmp(d, "*") == 0)
			*global = true;
		else if (*n < max_keys)
			snprintf(keys[(*n)++], 300, "%s", d);
	}
	PQclear(res);
	return 0;
}

/* Runs a statement that changes rows; *n counts them. */
static int run_counting(struct store *s, enum stmt st, size_t *n, char *err,
			size_t errlen)
{
	int rc;
	*n = 0;
	PGresult *res =
	    store_run(s, st, 0, NULL, PGRES_COMMAND_OK, 0, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*n = (size_t)strtoull(PQcmdTuples(res), NULL, 10);
	PQclear(res);
	return 0;
}

int store_classify(struct store *s, size_t *n, char *err, size_t errlen)
{
	return run_counting(s, ST_CLASSIFY, n, err, errlen);
}

int store_repair_heads(struct store *s, size_t *n, char *err, size_t errlen)
{
	return run_counting(s, ST_REPAIR, n, err, errlen);
}
