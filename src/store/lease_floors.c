/* SPDX-License-Identifier: MIT */
/*
 * Where a lease scans from (docs/design.md §4, "A held snapshot"): the
 * session's floors, and when a lease rescans from the start instead: the
 * schedule of the process's rescans and the paused destinations' list
 * last seen.
 */
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "store_internal.h"
#include "store_test.h"

/*
 * Where this lease's due scan starts (docs/design.md §4, "A held
 * snapshot"): at the lowest (next_attempt_at, seq), the due scan's key,
 * of this session's previous batch's due rows (the key, not the time
 * alone: rows one producer transaction wrote share their next_attempt_at,
 * and a floor of the time alone stepped over every finished one of them
 * at every lease), or from the start of the index ("-infinity") when a
 * rescan is due or the session was connected anew (a restore or a
 * failover behind a reconnect may have made rows pending again below
 * both floors). Below the floor are only rows this session has no
 * reason to look for at once: every row of its previous batch that went
 * back to pending (released, or retried with a later next_attempt_at) is
 * at or above it, or, if the late scan had it, written at or after the
 * late scan's floor ($6). Rows committed below the floor since the
 * previous lease (a producer transaction that began long ago, a
 * redrive) are the late scan's: their writers are at or above that
 * floor. What else may lie below (a row with no writer, a row another
 * relay let go and never leased again) waits for the next rescan: one
 * per OUTBOX_LEASE_RESCAN_INTERVAL for the process (rescan_scheduled()),
 * or RESCAN_COST_FACTOR times the last rescan's duration when that is
 * longer, and at once when a paused destination is lifted (its rows
 * were left out, at any age). In ordered mode the floor is the unkeyed
 * rows' only: the keyed rows are the key walk's, which reads each key's
 * first live row at every lease (statements_lease.c).
 */
/* The time of the session's floor as the lease's $4 (its seq, floor_seq,
 * goes in the lease's last parameter, store_lease()): '-infinity' when it
 * has none or keeps none (OUTBOX_LEASE_RESCAN_INTERVAL=0), has no late
 * scan floor yet on a table with the column, or read its floors on a
 * session that has since been connected anew. */
static bool floor_of(const struct store *s, char floor[40])
{
	if (s->floor_gen != 0 && s->floor_gen == s->ses->conn_gen &&
	    s->opt.lease_rescan_ms > 0 &&
	    (s->written_missing || s->written_floor != 0) &&
	    store_floor_text(s->floor_us, floor))
		return true;
	snprintf(floor, 40, "-infinity");
	return false;
}

/* Whether the schedule makes this lease a rescan. A shared schedule is
 * taken by the first store past its due time, which moves it one
 * interval on at once, so no other store of the process rescans while
 * this one does; the rescan's end sets it again (rescan_done()). */
static bool rescan_scheduled(const struct store *s, int64_t now_ms)
{
	struct store_rescan_pace *pace = s->opt.rescan_pace;
	if (!pace)
		return now_ms >= s->rescan_at_ms;
	long long due = atomic_load(&pace->due_ms);
	return now_ms >= due &&
	       atomic_compare_exchange_strong(
		   &pace->due_ms, &due,
		   (long long)(now_ms + s->opt.lease_rescan_ms));
}

void store_paused_keys_free(struct store *s)
{
	for (size_t i = 0; i < s->rescan_paused_n; i++)
		free(s->rescan_paused_keys[i]);
	free(s->rescan_paused_keys);
	s->rescan_paused_keys = NULL;
	s->rescan_paused_n = 0;
}

/* Whether some key of a is not among b's. */
static bool some_not_in(const char *const *a, size_t na, const char *const *b,
			size_t nb)
{
	for (size_t i = 0; i < na; i++) {
		bool in = false;
		for (size_t j = 0; j < nb && !in; j++)
			in = strcmp(a[i], b[j]) == 0;
		if (!in)
			return true;
	}
	return false;
}

/* Whether a destination the last list seen paused is not in paused: its
 * rows, left behind the floor while it was, are due now. Only a lifted
 * pause needs a rescan: one added makes no row due, and taken for a
 * change like any, a pause added during a long hold made every lease a
 * rescan past the statement timeout until one went through. Before any
 * list was seen: true. */
bool store_paused_lifted(const struct store *s, const char *const *paused,
			 size_t n)
{
	return !s->rescan_paused_keys ||
	       some_not_in((const char *const *)s->rescan_paused_keys,
			   s->rescan_paused_n, paused, n);
}

bool store_paused_added(const struct store *s, const char *const *paused,
			size_t n)
{
	return !s->rescan_paused_keys ||
	       some_not_in(paused, n,
			   (const char *const *)s->rescan_paused_keys,
			   s->rescan_paused_n);
}

/* Takes paused as the list seen. */
void store_paused_seen(struct store *s, const char *const *paused, size_t n)
{
	char **keys = calloc(n ? n : 1, sizeof(*keys));
	size_t copied = 0;
	while (keys && copied < n && (keys[copied] = strdup(paused[copied])))
		copied++;
	if (copied < n) {
		/* Out of memory: nothing taken as seen, so the next lease
		 * looks again. */
		for (size_t i = 0; keys && i < copied; i++)
			free(keys[i]);
		free(keys);
		return;
	}
	store_paused_keys_free(s);
	s->rescan_paused_keys = keys;
	s->rescan_paused_n = n;
}

/* paused_changed: a pause was lifted since the last list seen, and rows
 * left behind the floor while their destination was paused are due now.
 * A lifted pause is taken as seen only once a lease's statement ran
 * (store_lease()): a lease that failed would have used it up, and the
 * resumed rows waited for the next rescan. */
bool store_lease_rescans(struct store *s, bool paused_changed, int64_t now_ms,
			 char floor[40])
{
	if (!floor_of(s, floor) || paused_changed ||
	    rescan_scheduled(s, now_ms)) {
		snprintf(floor, 40, "-infinity");
		return true;
	}
	return false;
}

/*
 * The claim floor as the lease's $5 (docs/design.md §4, "A held snapshot"):
 * the transaction id the session's last lease returned, below which every
 * claim is settled, so the claims read starts there. '0' reads every claim:
 * at a session's first lease, after a reconnect, always with
 * OUTBOX_LEASE_RESCAN_INTERVAL=0, and otherwise once per that interval (or
 * RESCAN_COST_FACTOR times the last full read's duration), so a floor that
 * outlived what it was computed from (a database restored under a relay
 * that reached it through a pooler, which kept its session) cannot hide a
 * claim for longer.
 */
bool store_claims_floor_of(const struct store *s, int64_t now_ms, char out[24])
{
	bool full = s->claims_floor == 0 || s->claims_gen != s->ses->conn_gen ||
		    s->opt.lease_rescan_ms == 0 ||
		    now_ms >= s->claims_rescan_at_ms;
	snprintf(out, 24, "%llu",
		 full ? 0ULL : (unsigned long long)s->claims_floor);
	return full;
}

int64_t store_rescan_due(const struct store *s, int64_t ended_ms,
			 int64_t took_ms)
{
	int64_t paced = took_ms > RESCAN_PACE_MAX_MS / RESCAN_COST_FACTOR
			    ? RESCAN_PACE_MAX_MS
			    : RESCAN_COST_FACTOR * took_ms;
	return ended_ms + (paced > s->opt.lease_rescan_ms
			       ? paced
			       : s->opt.lease_rescan_ms);
}

int64_t store_failed_scan_took(const struct store *s, int64_t took_ms)
{
	return strcmp(s->ses->failed_state, "57014") == 0 ? took_ms : 0;
}

unsigned store_rescans_failed(const struct store *s)
{
	return s->rescans_failed;
}

void store_rescan_done(struct store *s, int64_t ended_ms, int64_t took_ms)
{
	int64_t due = store_rescan_due(s, ended_ms, took_ms);
	if (s->opt.rescan_pace)
		atomic_store(&s->opt.rescan_pace->due_ms, (long long)due);
	else
		s->rescan_at_ms = due;
}
