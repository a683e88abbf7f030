/* SPDX-License-Identifier: MIT */
/*
 * Ordered mode's key map (docs/design.md §6, "The key map"): each
 * session's keys with a live row and their floors, kept sorted by key
 * (byte order), the window of it each lease walks, and the merge of what
 * the lease or the map's build returns. Owned by its store; only the
 * store's own thread touches it. The key turn the process's stores may
 * share (store.h) is read and moved under its lock.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store_internal.h"
#include "store_test.h"

/* Postgres's type ids of the arrays' elements. */
#define OID_TEXT 25
#define OID_INT8 20

void key_map_clear(struct store *s)
{
	for (size_t i = 0; i < s->key_map_n; i++)
		free(s->key_map[i].key);
	free(s->key_map);
	s->key_map = NULL;
	s->key_map_n = 0;
}

/* One-dimensional array in Postgres's binary form: its element count and
 * where its elements start, or false when it is not one of type oid. */
struct bin_array {
	const unsigned char *p, *end;
	size_t n;
};

static uint32_t be32(const unsigned char *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 |
	       (uint32_t)p[2] << 8 | p[3];
}

static bool array_open(const PGresult *res, int row, int col, uint32_t oid,
		       struct bin_array *a)
{
	a->n = 0;
	a->p = a->end = NULL;
	if (PQgetisnull(res, row, col))
		return true; /* array_agg of no row */
	const unsigned char *p =
	    (const unsigned char *)PQgetvalue(res, row, col);
	int len = PQgetlength(res, row, col);
	if (len < 12 || be32(p + 8) != oid)
		return false;
	uint32_t ndim = be32(p);
	if (ndim == 0)
		return true;
	if (ndim != 1 || len < 20)
		return false;
	a->n = be32(p + 12);
	a->p = p + 20;
	a->end = p + len;
	return true;
}

/* The next element: its bytes and length, -1 for NULL; false when the
 * array ends early. */
static bool array_next(struct bin_array *a, const unsigned char **v, int *len)
{
	if (a->end - a->p < 4)
		return false;
	*len = (int)(int32_t)be32(a->p);
	a->p += 4;
	*v = a->p;
	if (*len < 0)
		return true;
	if (a->end - a->p < *len)
		return false;
	a->p += *len;
	return true;
}

static int64_t be64(const unsigned char *p)
{
	return (int64_t)((uint64_t)be32(p) << 32 | be32(p + 4));
}

/* An entry of the map or of an update: floor -1 drops the key, and an
 * update with min set only lowers a floor (or adds the key). */
struct update {
	char *key;
	int64_t floor;
	bool min;
};

static int by_key(const void *a, const void *b)
{
	return strcmp(((const struct update *)a)->key,
		      ((const struct update *)b)->key);
}

/* Reads the pairs of arrays at columns kc and fc of row 0 into ups[*n...]
 * (each key strdup'ed). */
static bool read_pairs(const PGresult *res, int kc, int fc, bool min,
		       struct update *ups, size_t *n, size_t room)
{
	struct bin_array ka, fa;
	if (!array_open(res, 0, kc, OID_TEXT, &ka) ||
	    !array_open(res, 0, fc, OID_INT8, &fa) || ka.n != fa.n ||
	    *n + ka.n > room)
		return false;
	for (size_t i = 0; i < ka.n; i++) {
		const unsigned char *k, *f;
		int kl, fl;
		if (!array_next(&ka, &k, &kl) || !array_next(&fa, &f, &fl) ||
		    kl < 0 || (fl >= 0 && fl != 8))
			return false;
		char *key = strndup((const char *)k, (size_t)kl);
		if (!key)
			return false;
		ups[(*n)++] = (struct update){
		    .key = key, .floor = fl < 0 ? -1 : be64(f), .min = min};
	}
	return true;
}

static size_t array_len(const PGresult *res, int col)
{
	struct bin_array a;
	return array_open(res, 0, col, OID_TEXT, &a) ? a.n : 0;
}

static void free_updates(struct update *ups, size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ups[i].key);
	free(ups);
}

/* A walk read e's key: when its floor last moved past a finished row, how
 * far on the key's next live row was. A floor a discovery lowered below
 * that row measures nothing. */
static void learn_spacing(struct key_floor *e)
{
	int64_t d = e->floor - e->passed;
	if (e->passed > 0 && d > 0) {
		if (e->spacing > 0)
			e->gap = d > e->spacing ? d : e->spacing;
		e->spacing = d;
	}
	e->passed = 0;
}

/* Applies ups (sorted by key) to the map in one pass. */
static int apply(struct store *s, struct update *ups, size_t n)
{
	struct key_floor *out =
	    malloc((s->key_map_n + n + 1) * sizeof(*s->key_map));
	if (!out)
		return -1;
	size_t i = 0, j = 0, m = 0;
	while (i < s->key_map_n || j < n) {
		int c = i == s->key_map_n ? 1
			: j == n	  ? -1
				 : strcmp(s->key_map[i].key, ups[j].key);
		if (c < 0) {
			out[m++] = s->key_map[i++];
			continue;
		}
		struct update *u = &ups[j++];
		struct key_floor e = {.key = u->key, .floor = u->floor};
		u->key = NULL;
		if (c == 0) {
			struct key_floor *had = &s->key_map[i++];
			free(had->key);
			e.passed = had->passed;
			e.spacing = had->spacing;
			e.gap = had->gap;
			if (u->min && had->floor < e.floor)
				e.floor = had->floor;
			if (!u->min)
				learn_spacing(&e);
		}
		if (e.floor < 0)
			free(e.key);
		else
			out[m++] = e;
	}
	free(s->key_map);
	s->key_map = out;
	s->key_map_n = m;
	return 0;
}

int key_map_merge(struct store *s, const PGresult *res, int walked_keys,
		  int walked_floors, int found_keys, int found_floors,
		  size_t *walked)
{
	size_t room = array_len(res, walked_keys) + array_len(res, found_keys);
	struct update *ups = calloc(room + 1, sizeof(*ups));
	size_t n = 0;
	bool ok =
	    ups &&
	    read_pairs(res, walked_keys, walked_floors, false, ups, &n, room) &&
	    read_pairs(res, found_keys, found_floors, true, ups, &n, room);
	*walked = array_len(res, walked_keys);
	if (ok) {
		qsort(ups, n, sizeof(*ups), by_key);
		ok = apply(s, ups, n) == 0;
	}
	free_updates(ups, n);
	return ok ? 0 : -1;
}

static int key_is(const void *key, const void *entry)
{
	return strcmp(key, ((const struct key_floor *)entry)->key);
}

/* key's entry in the map (sorted by key), or NULL. An empty map has no
 * array at all, which bsearch() may not be given. */
static struct key_floor *key_entry(const struct store *s, const char *key)
{
	if (s->key_map_n == 0)
		return NULL;
	return bsearch(key, s->key_map, s->key_map_n, sizeof(*s->key_map),
		       key_is);
}

/*
 * A lease takes a key's first live row only, and the walk left the key's
 * floor at that row's seq; once the lease's marks of it as sent or failed
 * commit, no live row of the key is below the next seq but rows its
 * snapshot could not see, which the next lease's discovery finds (their
 * writers are at or above its floor, the xmin of this lease's snapshot).
 * Moved past it, the next descent of the key does not fetch the finished
 * row again (docs/design.md §6, "The key map"). A floor other than the
 * row's seq (lowered by a discovery since) stays.
 */
void key_map_passed(struct store *s, const struct lease_rows *rows)
{
	if (!store_key_map_on(s))
		return;
	struct store_key_turn *t = s->opt.key_turn;
	bool locked = false; /* the turn's lock, taken once for the lease */
	for (size_t k = 0; k < rows->n; k++) {
		const struct outbox_event *e = &rows->events[k];
		const struct lease_text *row = lease_row_of(rows, e->id);
		if (!row || !row->finished || !e->partition_key)
			continue;
		struct key_floor *f = key_entry(s, e->partition_key);
		if (f && f->floor == e->seq) {
			f->floor = e->seq + 1;
			f->passed = e->seq;
		}
		if (!t || row->from < 0)
			continue;
		if (!locked) {
			pthread_mutex_lock(&t->lock);
			locked = true;
			if (!t->passes)
				t->passes =
				    calloc(KEY_PASSES, sizeof(*t->passes));
		}
		char *key = t->passes ? strdup(e->partition_key) : NULL;
		if (!key)
			continue; /* out of memory: the others' floors stay */
		struct key_pass *p = &t->passes[t->n_passes++ % KEY_PASSES];
		free(p->key);
		*p = (struct key_pass){key, row->from, e->seq, s->key_map_disc};
	}
	if (locked)
		pthread_mutex_unlock(&t->lock);
}

/*
 * The floors' moves the process's other stores shared since this one
 * last looked (docs/design.md §6, "The key map", *Shared moves*). Another
 * store's lease walked a key from a floor `from` in its window and took
 * the key's first live row at `seq`, as its snapshot saw it, and its marks
 * finishing that row committed: every row of the key live now in [from,
 * seq] was one its snapshot could not see, or made live since, so its
 * writer is at or above that lease's discovery floor. A floor of this
 * store in [from, seq] moves past seq, and its discovery floor comes down
 * to that lease's, so that its next discovery reads those writers. A
 * floor below from may stand on a row that lease's snapshot saw live
 * below its own floor, and stays.
 */
static void key_map_catch_up(struct store *s)
{
	struct store_key_turn *t = s->opt.key_turn;
	if (!t)
		return;
	pthread_mutex_lock(&t->lock);
	uint64_t j = s->key_passes_read;
	if (t->n_passes - j > KEY_PASSES)
		j = t->n_passes - KEY_PASSES;
	for (; j < t->n_passes; j++) {
		const struct key_pass *p = &t->passes[j % KEY_PASSES];
		struct key_floor *f = key_entry(s, p->key);
		if (!f || f->floor < p->from || f->floor > p->seq)
			continue;
		f->floor = p->seq + 1;
		f->passed = p->seq;
		if (p->written < s->key_map_disc)
			s->key_map_disc = p->written;
	}
	s->key_passes_read = t->n_passes;
	pthread_mutex_unlock(&t->lock);
}

void key_map_note_from(struct store *s, struct lease_rows *rows)
{
	for (size_t k = 0; k < rows->n; k++) {
		const struct outbox_event *e = &rows->events[k];
		struct lease_text *row = lease_row_of(rows, e->id);
		if (!row)
			continue;
		const struct key_floor *f =
		    e->partition_key ? key_entry(s, e->partition_key) : NULL;
		row->from = f ? f->floor : -1;
	}
}

void store_key_map_catch_up(struct store *s)
{
	key_map_catch_up(s);
}

unsigned store_key_map_builds_failed(const struct store *s)
{
	return s->key_map_builds_failed;
}

int64_t store_key_map_floor(const struct store *s, const char *key)
{
	const struct key_floor *f = key_entry(s, key);
	return f ? f->floor : -1;
}

/*
 * The seq a key's next descent looks up to first (docs/design.md §6,
 * "The key map", *The descent's bound*), -1 for none: a descent of
 * key_idx reads every entry of its key on the leaf page it lands on, a
 * hundred or more under a backlog, though it wants the first; bounded,
 * it reads those up to the bound. Four of the larger of the key's last
 * two spacings past its floor: a key's rows come about as far apart as
 * the last three. A key whose next row lies further, or that has none,
 * is read again unbounded, a second descent: so the bound waits for two
 * spacings, and a key of two rows or fewer never has one. The bound
 * changes what a descent costs, never what it finds.
 */
static int64_t key_map_bound(const struct key_floor *f)
{
	if (f->gap <= 0 || f->gap > (INT64_MAX - f->floor) / 4)
		return -1;
	return f->floor + 4 * f->gap;
}

int64_t store_key_map_bound(const struct store *s, const char *key)
{
	const struct key_floor *f = key_entry(s, key);
	return f ? key_map_bound(f) : -1;
}

/*
 * The build's map replaces the old one, floors and all, but a key keeps
 * the spacings its rows came at (not the finished row its floor passed:
 * the build's floor is the key's first live row). The bound changes only
 * what a descent costs (key_map_bound), and where a build is cheap one
 * comes every OUTBOX_LEASE_RESCAN_INTERVAL: with the spacings forgotten,
 * a key would wait for three more of its rows after each before its
 * descents were bounded again.
 */
int key_map_replace(struct store *s, const PGresult *res, int keys, int floors)
{
	size_t room = array_len(res, keys);
	struct update *ups = calloc(room + 1, sizeof(*ups));
	size_t n = 0;
	bool ok = ups && read_pairs(res, keys, floors, false, ups, &n, room);
	struct key_floor *out = ok ? malloc((n + 1) * sizeof(*out)) : NULL;
	if (out) {
		qsort(ups, n, sizeof(*ups), by_key);
		size_t m = 0;
		for (size_t j = 0; j < n; j++) {
			if (ups[j].floor < 0)
				continue;
			const struct key_floor *had = key_entry(s, ups[j].key);
			out[m++] = (struct key_floor){
			    .key = ups[j].key,
			    .floor = ups[j].floor,
			    .spacing = had ? had->spacing : 0,
			    .gap = had ? had->gap : 0};
			ups[j].key = NULL;
		}
		key_map_clear(s);
		s->key_map = out;
		s->key_map_n = m;
	}
	free_updates(ups, n);
	return out ? 0 : -1;
}

void store_key_map_expire(struct store *s)
{
	s->key_map_at_ms = INT64_MIN;
}

int store_key_turn_init(struct store_key_turn *t)
{
	t->cursor = NULL;
	t->gen = 0;
	t->passes = NULL;
	t->n_passes = 0;
	return pthread_mutex_init(&t->lock, NULL) == 0 ? 0 : -1;
}

void store_key_turn_destroy(struct store_key_turn *t)
{
	pthread_mutex_destroy(&t->lock);
	free(t->cursor);
	t->cursor = NULL;
	for (size_t i = 0; t->passes && i < KEY_PASSES; i++)
		free(t->passes[i].key);
	free(t->passes);
	t->passes = NULL;
	t->n_passes = 0;
}

/* Moves the shared turn to key (a copy), when given one; out of memory,
 * it stays where it was, which only costs a walk some steps. */
static void turn_to(struct store_key_turn *t, const char *key)
{
	char *copy = key ? strdup(key) : NULL;
	if (!copy)
		return;
	free(t->cursor);
	t->cursor = copy;
}

void key_map_turn_taken(struct store *s)
{
	struct store_key_turn *t = s->opt.key_turn;
	if (!t || !s->key_cursor)
		return;
	pthread_mutex_lock(&t->lock);
	if (t->gen == s->key_turn_gen)
		turn_to(t, s->key_cursor);
	pthread_mutex_unlock(&t->lock);
}

/* The first entry past cursor in byte order (0 past the last). */
static size_t window_start(const struct store *s, const char *cursor)
{
	if (!cursor)
		return 0;
	size_t lo = 0, hi = s->key_map_n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(s->key_map[mid].key, cursor) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo == s->key_map_n ? 0 : lo;
}

/* The key a full batch taken from the first keys of the window of want
 * keys from start would end on (NULL for an empty map). */
static const char *window_ends_at(const struct store *s, size_t want,
				  size_t start)
{
	size_t n = s->key_map_n < want ? s->key_map_n : want;
	size_t batch = (size_t)s->opt.batch_size;
	if (!n)
		return NULL;
	return s->key_map[(start + (batch < n ? batch : n) - 1) % s->key_map_n]
	    .key;
}

/* The window of want keys from the map's entry start on: its keys, their
 * floors and their bounds (NULL: none), as array literals. */
static int key_map_window(const struct store *s, size_t want, size_t start,
			  struct key_map_args *a)
{
	size_t n = s->key_map_n < want ? s->key_map_n : want;
	const char **items = malloc((n + 1) * sizeof(*items));
	char *fl = malloc(n * 21 + 3), *bo = malloc(n * 21 + 3);
	if (!items || !fl || !bo) {
		free(items);
		free(fl);
		free(bo);
		return -1;
	}
	size_t at = 0, bt = 0;
	fl[at++] = bo[bt++] = '{';
	for (size_t i = 0; i < n; i++) {
		const struct key_floor *e =
		    &s->key_map[(start + i) % s->key_map_n];
		const char *sep = i ? "," : "";
		int64_t bound = key_map_bound(e);
		items[i] = e->key;
		at += (size_t)snprintf(fl + at, 22, "%s%lld", sep,
				       (long long)e->floor);
		bt += (size_t)(bound < 0 ? snprintf(bo + bt, 22, "%sNULL", sep)
					 : snprintf(bo + bt, 22, "%s%lld", sep,
						    (long long)bound));
	}
	fl[at++] = bo[bt++] = '}';
	fl[at] = bo[bt] = '\0';
	a->keys = store_pg_array(items, n, PG_ARRAY_QUOTED, SIZE_MAX);
	free(items);
	if (!a->keys) {
		free(fl);
		free(bo);
		return -1;
	}
	a->floors = fl;
	a->bounds = bo;
	a->whole = n == s->key_map_n;
	return 0;
}

/*
 * Whether the key map is built anew before this lease (docs/design.md
 * §6, "The key map"): at a session's first ordered lease, after a
 * reconnect, and on a schedule of its own, the rescans' (once per
 * OUTBOX_LEASE_RESCAN_INTERVAL, or RESCAN_COST_FACTOR times the last
 * build's duration when that is longer): a build meets the rows that became
 * live with no writer (by hand), as a rescan does for unkeyed rows, and a map
 * that outlived what it was built from (a database restored under a pooler that
 * kept the session) lasts no longer. Not the due scan's rescans: in ordered
 * mode with keyed rows alone the due scan has no floor and rescans every lease.
 */
static bool key_map_due(const struct store *s, int64_t now_ms)
{
	return !s->key_map_built || s->key_map_gen != s->ses->conn_gen ||
	       now_ms >= s->key_map_at_ms;
}

/* Builds the key map anew (statements_lease.c, sql_key_map). */
static int key_map_build(struct store *s, char *err, size_t errlen)
{
	int rc;
	int64_t started_ms = clock_ms();
	PGresult *res = store_run(s, ST_KEY_MAP, 0, NULL, PGRES_TUPLES_OK, 1,
				  &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	uint64_t disc;
	bool ok = store_col_be(res, 0, 2, 8, &disc) &&
		  key_map_replace(s, res, 0, 1) == 0;
	PQclear(res);
	if (!ok) {
		s->key_map_built = false;
		snprintf(err, errlen,
			 "key map: its build came back in an unexpected form, "
			 "or out of memory");
		return STORE_ERROR;
	}
	s->key_map_disc = disc;
	s->key_map_gen = s->ses->conn_gen;
	s->key_map_built = true;
	/* A map just walked is at least as far as the moves before it. */
	struct store_key_turn *t = s->opt.key_turn;
	if (t) {
		pthread_mutex_lock(&t->lock);
		s->key_passes_read = t->n_passes;
		pthread_mutex_unlock(&t->lock);
	}
	int64_t ended_ms = clock_ms();
	s->key_map_at_ms = store_rescan_due(s, ended_ms, ended_ms - started_ms);
	return 0;
}

int key_map_args(struct store *s, int64_t now_ms, struct key_map_args *a,
		 char *err, size_t errlen)
{
	memset(a, 0, sizeof(*a));
	if (key_map_due(s, now_ms)) {
		bool current =
		    s->key_map_built && s->key_map_gen == s->ses->conn_gen;
		int64_t started_ms = clock_ms();
		int rc = key_map_build(s, err, errlen);
		/* A scheduled build that failed (its walk past the statement
		 * timeout under a held snapshot, say) leaves the map it would
		 * have replaced, which is still safe to lease by: its floors
		 * never pass a live row. Failing the lease instead had every
		 * lease of the session try the same walk and fail again, and
		 * no ordered row went out until one finished. It is tried
		 * again as a build that took that long would be. */
		if (rc != 0 &&
		    (rc == STORE_RECONNECT || !current || !s->key_map_built))
			return rc;
		if (rc != 0) {
			int64_t ended_ms = clock_ms();
			s->key_map_builds_failed++;
			log_fields(LOG_WARN,
				   "key map: its scheduled build failed; "
				   "leasing by the map of the last one",
				   "error", err, NULL);
			s->key_map_at_ms = store_rescan_due(
			    s, ended_ms,
			    store_failed_scan_took(s, ended_ms - started_ms));
			err[0] = '\0';
		}
	}
	key_map_catch_up(s);
	/* Four batches of keys at least, the cap at most (lease_rows.c
	 * sizes it after each lease). */
	size_t least = 4 * (size_t)s->opt.batch_size;
	if (s->key_window < least)
		s->key_window = least;
	if (s->key_window > s->key_walk_cap)
		s->key_window = s->key_walk_cap;
	snprintf(a->disc, sizeof(a->disc), "%llu",
		 (unsigned long long)s->key_map_disc);
	/* With a shared turn the walk begins past the key the latest lease
	 * of any of the process's stores will end on, and this one takes
	 * the turn on past its own batch at once. */
	struct store_key_turn *t = s->opt.key_turn;
	size_t start;
	if (t) {
		pthread_mutex_lock(&t->lock);
		start = window_start(s, t->cursor ? t->cursor : s->key_cursor);
		turn_to(t, window_ends_at(s, s->key_window, start));
		s->key_turn_gen = ++t->gen;
		pthread_mutex_unlock(&t->lock);
	} else {
		start = window_start(s, s->key_cursor);
	}
	if (key_map_window(s, s->key_window, start, a) != 0) {
		snprintf(err, errlen, "lease: out of memory");
		return STORE_ERROR;
	}
	s->key_window_used = a->whole ? 0 : s->key_window;
	return 0;
}

void key_map_args_free(struct key_map_args *a)
{
	free(a->keys);
	free(a->floors);
	free(a->bounds);
	a->keys = a->floors = a->bounds = NULL;
}
