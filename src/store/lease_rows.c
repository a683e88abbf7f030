/* SPDX-License-Identifier: MIT */
/*
 * The lease statement's result, read (docs/design.md §4): every column in
 * binary, decoded into the batch's events without copying the payload,
 * and the floors the session's next lease starts from.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
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
	LC_CREATED_AT,
	LC_ATTEMPTS,
	LC_MAX_ATTEMPTS,
	LC_LEASE_ID,
	LC_XID,
	LC_TID,
	LC_NEXT_ATTEMPT_AT,
	LC_CLAIMS_FLOOR,
	LC_WRITTEN_FLOOR,
	LC_SUSPECT,
	LC_LATE_LEFT,
	LC_KEY_CURSOR,	  /* ordered mode only */
	LC_WALKED_KEYS,	  /* ordered mode with the key map only */
	LC_WALKED_FLOORS, /* the same */
	LC_FOUND_KEYS,	  /* the same */
	LC_FOUND_FLOORS,  /* the same */
};

static const char *col(PGresult *res, int row, int c)
{
	return PQgetisnull(res, row, c) ? NULL : PQgetvalue(res, row, c);
}

/* The lease's columns arrive in binary (docs/design.md §4): integers in
 * network byte order, uuid as 16 bytes, timestamptz as microseconds since
 * 2000-01-01. A value of the wrong width means the table is not the one the
 * statement was written for, and the batch is refused. */
bool store_col_be(const PGresult *res, int row, int c, int width, uint64_t *out)
{
	if (PQgetisnull(res, row, c) || PQgetlength(res, row, c) != width)
		return false;
	const unsigned char *p = (const unsigned char *)PQgetvalue(res, row, c);
	uint64_t v = 0;
	for (int i = 0; i < width; i++)
		v = v << 8 | p[i];
	*out = v;
	return true;
}

static bool col_uuid(PGresult *res, int row, int c, char out[37])
{
	if (PQgetisnull(res, row, c) || PQgetlength(res, row, c) != 16)
		return false;
	static const char hex[] = "0123456789abcdef";
	const unsigned char *p = (const unsigned char *)PQgetvalue(res, row, c);
	char *o = out;
	for (int i = 0; i < 16; i++) {
		if (i == 4 || i == 6 || i == 8 || i == 10)
			*o++ = '-';
		*o++ = hex[p[i] >> 4];
		*o++ = hex[p[i] & 15];
	}
	*o = '\0';
	return true;
}

/* Microseconds from the Unix epoch to Postgres's, 2000-01-01. */
#define PG_EPOCH_US INT64_C(946684800000000)

/* Writes v as exactly width decimal digits (v < 10^width). */
static char *put_digits(char *p, unsigned v, int width)
{
	for (int i = width - 1; i >= 0; i--) {
		p[i] = (char)('0' + v % 10);
		v /= 10;
	}
	return p + width;
}

/* The seconds part of a time, kept across the rows of one lease: rows
 * leased together were mostly made within the same second. */
struct time_cache {
	int64_t secs;
	bool valid;
	char head[19]; /* "YYYY-MM-DDTHH:MM:SS", not terminated */
};

/* created_at as RFC 3339 UTC with microseconds, the CloudEvents time
 * (run per leased row, so without snprintf). */
static void format_time(int64_t unix_us, struct time_cache *tc, char out[40])
{
	int64_t secs = unix_us / 1000000, us = unix_us % 1000000;
	if (us < 0) {
		us += 1000000;
		secs -= 1;
	}
	if (!tc->valid || tc->secs != secs) {
		time_t t = (time_t)secs;
		struct tm tm;
		/* Years outside 0..9999 cannot be written as RFC 3339. */
		if (!gmtime_r(&t, &tm) || tm.tm_year < -1900 ||
		    tm.tm_year > 9999 - 1900) {
			tc->valid = false;
			out[0] = '\0';
			return;
		}
		char *p =
		    put_digits(tc->head, (unsigned)(tm.tm_year + 1900), 4);
		*p++ = '-';
		p = put_digits(p, (unsigned)tm.tm_mon + 1, 2);
		*p++ = '-';
		p = put_digits(p, (unsigned)tm.tm_mday, 2);
		*p++ = 'T';
		p = put_digits(p, (unsigned)tm.tm_hour, 2);
		*p++ = ':';
		p = put_digits(p, (unsigned)tm.tm_min, 2);
		*p++ = ':';
		put_digits(p, (unsigned)tm.tm_sec, 2);
		tc->secs = secs;
		tc->valid = true;
	}
	memcpy(out, tc->head, sizeof(tc->head));
	char *p = out + sizeof(tc->head);
	*p++ = '.';
	p = put_digits(p, (unsigned)us, 6);
	*p++ = 'Z';
	*p = '\0';
}

/* "(block,offset)" of a ctid, without snprintf. */
static void format_tid(uint64_t tid, char out[24])
{
	char digits[10];
	unsigned parts[2] = {(unsigned)(tid >> 16), (unsigned)(tid & 0xffff)};
	char *p = out;
	*p++ = '(';
	for (int k = 0; k < 2; k++) {
		int n = 0;
		unsigned v = parts[k];
		do {
			digits[n++] = (char)('0' + v % 10);
			v /= 10;
		} while (v);
		while (n > 0)
			*p++ = digits[--n];
		*p++ = k == 0 ? ',' : ')';
	}
	*p = '\0';
}

/* Row i of a lease result as an event pointing into res and text. */
static bool event_of(PGresult *res, int i, struct time_cache *tc,
		     struct lease_text *text, struct outbox_event *e)
{
	uint64_t seq, created, attempts, max_attempts, tid;
	if (!col_uuid(res, i, LC_ID, text->id) ||
	    !store_col_be(res, i, LC_TID, 6, &tid) ||
	    !store_col_be(res, i, LC_SEQ, 8, &seq) ||
	    !store_col_be(res, i, LC_CREATED_AT, 8, &created) ||
	    !store_col_be(res, i, LC_ATTEMPTS, 4, &attempts) ||
	    !store_col_be(res, i, LC_MAX_ATTEMPTS, 4, &max_attempts))
		return false;
	/* tid's binary form: block number (4 bytes), then offset (2). */
	format_tid(tid, text->tid);
	e->id = text->id;
	e->seq = (int64_t)seq;
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
	/* 'infinity' (the largest value) and times near it would overflow
	 * the move to the Unix epoch: they stay at the range's end, a year
	 * format_time() cannot write, as it cannot write '-infinity's. */
	int64_t pg_us = (int64_t)created;
	e->created_at_us =
	    pg_us > INT64_MAX - PG_EPOCH_US ? INT64_MAX : pg_us + PG_EPOCH_US;
	format_time(e->created_at_us, tc, text->time);
	e->time = text->time;
	e->attempts = (int)(int32_t)(uint32_t)attempts;
	e->max_attempts = (int)(int32_t)(uint32_t)max_attempts;
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
	return true;
}

/* Insertion order: the rows come back in the order of their place in the
 * table (read by ctid), and a batch goes out in the order it was made. */
static int by_seq(const void *a, const void *b)
{
	const struct outbox_event *x = a, *y = b;
	return (x->seq > y->seq) - (x->seq < y->seq);
}

/* Ordered mode: where the next walk starts, from the lease's result
 * (statements_lease.c); NULL keeps the place. -1 when out of memory. */
static int keep_key_cursor(struct store *s, const PGresult *res)
{
	if (PQntuples(res) < 1 || PQnfields(res) <= LC_KEY_CURSOR ||
	    PQgetisnull(res, 0, LC_KEY_CURSOR))
		return 0;
	char *cursor = strndup(PQgetvalue(res, 0, LC_KEY_CURSOR),
			       (size_t)PQgetlength(res, 0, LC_KEY_CURSOR));
	if (!cursor)
		return -1;
	free(s->key_cursor);
	s->key_cursor = cursor;
	if (store_key_map_on(s))
		key_map_turn_taken(s);
	return 0;
}

/* Ordered mode with the key map: merges what the lease returned on its
 * first row into the session's map (key_map.c) and takes its discovery
 * floor, and sizes the next window: back to four batches once a batch
 * filled, four times larger (to the cap) when a lease walked its whole
 * window, short of the whole map, without filling one. Out of memory or
 * in an unexpected form, the map is built anew before the next lease. */
static void keep_key_map(struct store *s, const PGresult *res)
{
	if (PQntuples(res) < 1 || PQnfields(res) <= LC_FOUND_FLOORS ||
	    !store_key_map_on(s))
		return;
	size_t walked;
	uint64_t disc;
	if (key_map_merge(s, res, LC_WALKED_KEYS, LC_WALKED_FLOORS,
			  LC_FOUND_KEYS, LC_FOUND_FLOORS, &walked) != 0 ||
	    !store_col_be(res, 0, LC_WRITTEN_FLOOR, 8, &disc)) {
		s->key_map_built = false;
		return;
	}
	s->key_map_disc = disc;
	if (s->key_window_used && walked >= s->key_window_used)
		s->key_window *= 4;
	else if (walked < s->key_window_used)
		s->key_window = 0;
}

bool store_lease_found_none(struct store *s, const PGresult *res)
{
	if (!s->opt.ordered || PQntuples(res) != 1 ||
	    !PQgetisnull(res, 0, LC_ID))
		return false;
	/* Out of memory: the place is kept, the next walk starts there
	 * again. */
	(void)keep_key_cursor(s, res);
	keep_key_map(s, res);
	return true;
}

int store_take_rows(struct store *s, PGresult *res, struct lease_batch *out,
		    char *err, size_t errlen)
{
	int n = PQntuples(res);
	struct lease_rows *rows =
	    calloc(1, sizeof(*rows) + (size_t)n * sizeof(rows->events[0]));
	struct lease_text *text = calloc((size_t)n, sizeof(*text));
	uint64_t xid;
	if (!rows || !text) {
		free(rows);
		free(text);
		PQclear(res);
		snprintf(err, errlen, "lease: out of memory for %d rows", n);
		return STORE_ERROR;
	}
	rows->res = res;
	rows->text = text;
	rows->n = (size_t)n;
	rows->s = s;
	rows->conn_gen = s->ses->conn_gen;
	out->rows = rows;
	out->events = rows->events;
	out->n = (size_t)n;
	char lease_id[37];
	bool ok = store_col_be(res, 0, LC_XID, 8, &xid) &&
		  col_uuid(res, 0, LC_LEASE_ID, lease_id);
	struct time_cache tc = {.valid = false};
	int64_t oldest = INT64_MAX, oldest_seq = INT64_MAX;
	struct due_taken d = {.n = (size_t)n,
			      .rescan = s->scan_from_us == INT64_MIN,
			      .reach_us = INT64_MIN,
			      .reach_seq = INT64_MIN,
			      .low_us = INT64_MAX,
			      .low_seq = INT64_MAX};
	int64_t bytes = 0;
	for (int i = 0; ok && i < n; i++) {
		uint64_t u = 0, sus = 0;
		ok = event_of(res, i, &tc, &text[i], &out->events[i]) &&
		     store_col_be(res, i, LC_NEXT_ATTEMPT_AT, 8, &u) &&
		     store_col_be(res, i, LC_SUSPECT, 1, &sus);
		int64_t due = (int64_t)u, seq = out->events[i].seq;
		bytes += (int64_t)out->events[i].payload_len;
		if (ok && due_key_below(due, seq, d.low_us, d.low_seq)) {
			d.low_us = due;
			d.low_seq = seq;
		}
		/* A row below the scan the lease ran from came from the
		 * late scan, and a crash suspect from a scan of its own:
		 * the floor stays where the due scan has been. In ordered
		 * mode a keyed row came from the key walk, which has no
		 * floor. */
		if (!ok || sus ||
		    due_key_below(due, seq, s->scan_from_us,
				  s->scan_from_seq) ||
		    (s->opt.ordered && out->events[i].partition_key))
			continue;
		if (due_key_below(due, seq, oldest, oldest_seq)) {
			oldest = due;
			oldest_seq = seq;
		}
		if (due_key_below(d.reach_us, d.reach_seq, due, seq)) {
			d.reach_us = due;
			d.reach_seq = seq;
			d.found_due = true;
		}
	}
	if (!ok) {
		snprintf(err, errlen,
			 "lease: a column came back in an unexpected form (is "
			 "the table the one `outbox-relay migrate` made?)");
		return STORE_ERROR;
	}
	snprintf(rows->xid, sizeof(rows->xid), "%llu", (unsigned long long)xid);
	snprintf(out->lease_id, sizeof(out->lease_id), "%s", lease_id);
	memcpy(rows->lease_id, out->lease_id, sizeof(rows->lease_id));
	qsort(out->events, out->n, sizeof(out->events[0]), by_seq);
	s->open_lease = rows;
	s->open_lease_failed = false;
	if (oldest != INT64_MAX) {
		s->floor_us = oldest;
		s->floor_seq = oldest_seq;
		s->floor_gen = s->ses->conn_gen;
	}
	uint64_t written_floor;
	if (store_col_be(res, 0, LC_WRITTEN_FLOOR, 8, &written_floor)) {
		s->written_floor = written_floor;
		d.written_floor = written_floor;
		d.written_floor_ok = true;
	}
	/* The window stops adding rows once the bytes before a row reach
	 * the budget, so rows it left locked mean these reached it. */
	d.cut = s->opt.batch_bytes > 0 && bytes >= s->opt.batch_bytes;
	uint64_t late_left = 0;
	if (store_col_be(res, 0, LC_LATE_LEFT, 1, &late_left) && late_left)
		d.cut = true;
	due_turn_taken(s, &d);
	if (keep_key_cursor(s, res) != 0) {
		snprintf(err, errlen, "lease: out of memory");
		return STORE_ERROR;
	}
	if (store_key_map_on(s))
		key_map_note_from(s, rows);
	keep_key_map(s, res);
	uint64_t claims_floor;
	if (store_col_be(res, 0, LC_CLAIMS_FLOOR, 8, &claims_floor)) {
		s->claims_floor = claims_floor;
		s->claims_gen = s->ses->conn_gen;
	}
	return 0;
}

bool store_floor_text(int64_t pg_us, char out[40])
{
	struct time_cache tc = {.valid = false};
	/* Past what Unix time holds (a time written by hand near the end
	 * of Postgres's range): no text, as for any year RFC 3339 lacks. */
	if (pg_us > INT64_MAX - PG_EPOCH_US) {
		out[0] = '\0';
		return false;
	}
	format_time(pg_us + PG_EPOCH_US, &tc, out);
	return out[0] != '\0';
}
