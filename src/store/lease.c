/* SPDX-License-Identifier: MIT */
/*
 * Leasing (docs/design.md §4): the lock lease, its claim and renewal, and
 * what the workers ask before leasing (operator pauses, when the next
 * row is due).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/base.h"
#include "guards.h"
#include "store_internal.h"
#include "store_test.h"

/* True while rows' lease transaction is open on its session. */
static bool lease_open(const struct lease_rows *rows)
{
	return (rows->s->ses->leasing == rows->s) &&
	       rows->s->ses->conn_gen == rows->conn_gen;
}

bool store_lease_held(struct store *s, const struct lease_batch *b)
{
	if (!b->rows || b->rows->s != s || !lease_open(b->rows))
		return false;
	/* A session the server ended (killed, restarted, past the lease
	 * timeout) has said so with a FATAL and closed its socket: reading
	 * what arrived tells, without a round trip (libpq's socket never
	 * blocks). One read may bring the FATAL alone, the connection still
	 * OK until a later read finds the socket's end: parsing it
	 * (PQisBusy) hands it to the session's notice receiver, which marks
	 * the session ended. */
	PGconn *conn = s->ses->conn;
	if (PQconsumeInput(conn) != 1)
		return false;
	(void)PQisBusy(conn);
	return !s->ses->server_ended && PQstatus(conn) == CONNECTION_OK;
}

void lease_batch_release(struct lease_batch *b)
{
	if (b->rows) {
		if (b->rows->s->open_lease == b->rows)
			b->rows->s->open_lease = NULL;
		PQclear(b->rows->res);
		free(b->rows->text);
		free(b->rows);
	}
	memset(b, 0, sizeof(*b));
}

/*
 * How long a claim session's statement may wait for its reply: a
 * twentieth of the lease timeout, from 250 ms to 3 s. It runs while the
 * lease transaction holds its own session's server connection; behind a
 * transaction-mode pooler it needs a second one, and when every server
 * connection of the pool is held by a lease waiting for its claim,
 * nothing moves until the server ends them at the lease timeout. A
 * healthy claim takes milliseconds; past this wait the lease is given
 * up (give_lease_up()), which gives its server connection back.
 */
static int64_t claim_wait_ms(const struct store *s)
{
	int64_t ms = s->opt.lease_timeout_ms / 20;
	return ms < 250 ? 250 : ms > 3000 ? 3000 : ms;
}

/* The claim session its stores' claim stores share, made (unconnected)
 * on first use; NULL when out of memory. */
static struct store_session *claim_ses(struct store *s)
{
	struct store_session *ses = s->ses->claim;
	if (!ses && (ses = calloc(1, sizeof(*ses)))) {
		ses->reply_wait_ms = claim_wait_ms(s);
		/* Given its lease up, a claim waits for its fate as long as
		 * the server would let any lease live. */
		ses->reply_wait_after_ms = s->opt.lease_timeout_ms;
		ses->users = 1; /* the lease session's reference */
		s->ses->claim = ses;
	}
	return ses;
}

/* Opens the claim store on first use, on the claim session: its own
 * connection, so a claim commits while the lease transaction stays open
 * (the claim stores of one session's stores share it, so claims do not
 * multiply sessions with tables either); connects it again when a late
 * reply closed it. */
static int claim_session(struct store *s, char *err, size_t errlen)
{
	if (s->claim && !s->claim->ses->conn) {
		s->claim->ses->reply_late = false; /* the connect's own */
		return store_public_rc(store_reconnect(s->claim, err, errlen));
	}
	if (s->claim)
		return 0;
	struct store_session *ses = claim_ses(s);
	if (!ses) {
		snprintf(err, errlen, "claim session: out of memory");
		return STORE_ERROR;
	}
	char app[200];
	snprintf(app, sizeof(app), "%s/claim", s->app_name);
	struct store_options o = s->opt;
	o.app_name = app;
	o.leased_by = NULL;
	int rc = store_open_on(&s->claim, &o, ses, s->extra_sql, err, errlen);
	return rc == 0 ? 0 : store_public_rc(rc);
}

/*
 * Takes ids[] (all of the lease's rows when ids is NULL) out of the claim of
 * lease lease_id, committed on the claim session: rows never handed to the
 * broker owe no attempt, whatever becomes of the lease afterwards
 * (docs/design.md §4). Run while the lease transaction still holds them,
 * so they come back uncharged; a failure leaves them in the claim, and a
 * lease that then aborts has them charged, as before.
 */
int store_claim_release(struct store *s, const char *lease_id,
			const char *const *ids, size_t n, char *err,
			size_t errlen)
{
	if (s->claims_missing || !s->claim || !s->claim_key)
		return 0;
	int rc = claim_session(s, err, errlen);
	if (rc != 0)
		return rc;
	char *arr = NULL;
	if (ids) {
		arr = store_pg_array(ids, n, PG_ARRAY_PLAIN, 0);
		if (!arr) {
			snprintf(err, errlen, "claim release: out of memory");
			return STORE_ERROR;
		}
	}
	const char *values[3] = {s->claim_key, lease_id, arr};
	PGresult *res = store_run(s->claim, ST_CLAIM_RELEASE, 3, values,
				  PGRES_COMMAND_OK, 0, &rc, err, errlen);
	free(arr);
	if (res) {
		PQclear(res);
		return 0;
	}
	/* After a late reply the next claim statement connects again
	 * (claim_session()): the pool may have no server connection now. */
	if (rc == STORE_RECONNECT && !s->claim->ses->reply_late) {
		char why[256];
		store_reconnect(s->claim, why, sizeof(why));
	}
	return store_public_rc(rc);
}

/* Ends the open lease with ROLLBACK after its claim gave up every row:
 * nothing of it was handed over. */
static void end_unhanded(struct store *s, const char *lease_id)
{
	char why[256];
	if (lease_id[0] &&
	    store_claim_release(s, lease_id, NULL, 0, why, sizeof(why)) != 0)
		log_warn("a lease ended before its rows were handed over, but "
			 "its claim could not give them up (the sweeper "
			 "charges them an attempt): %s",
			 why);
	if (s->ses->leasing == s)
		store_lease_end(s, TX_ROLLBACK, why, sizeof(why));
}

int store_lease_abort(struct store *s, struct lease_batch *b, char *err,
		      size_t errlen)
{
	if (!b->rows || b->rows->s != s || !lease_open(b->rows))
		return 0;
	char why[256];
	if (store_claim_release(s, b->lease_id, NULL, 0, why, sizeof(why)) != 0)
		log_warn("the lease was ended before its rows were handed "
			 "over, but its claim could not give them up (the "
			 "sweeper charges them an attempt): %s",
			 why);
	return store_lease_end(s, TX_ROLLBACK, err, errlen);
}

int store_lease_rollback_charged(struct store *s, struct lease_batch *b,
				 char *err, size_t errlen)
{
	if (!b->rows || b->rows->s != s || !lease_open(b->rows))
		return 0;
	return store_lease_end(s, TX_ROLLBACK, err, errlen);
}

/* The claims table vanished since the session looked (a table dropped
 * by hand): go on as without one; the ops thread's side-table check
 * tells people. */
static void no_claims(struct store *s, const char *err)
{
	log_debug("no claims table: %s", err);
	s->claims_missing = true;
}

/* Settles this worker's claim of a lease that aborted (a failed mark, a
 * rolled-back batch, a lost session), as the sweeper would: its rows owe
 * the attempt and come back as crash suspects. */
static int settle_own_claim(struct store *s, const char *key, char *err,
			    size_t errlen)
{
	int rc;
	const char *values[1] = {key};
	PGresult *res = store_run(s->claim, ST_SETTLE_OWN, 1, values,
				  PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res && store_fail_refused_after(s->claim, err))
		res = store_run(s->claim, ST_SETTLE_OWN, 1, values,
				PGRES_TUPLES_OK, 0, &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	log_fields(LOG_INFO,
		   "settled the claim of a lease that did not commit; its "
		   "rows come back as crash suspects",
		   "failed", PQgetvalue(res, 0, 1), "suspects",
		   PQgetvalue(res, 0, 2), NULL);
	PQclear(res);
	return 0;
}

#define CLAIM_ENDED_WHY "the lease transaction had ended when its claim ran"

/* What a claim statement's row says (statements.c, sql_claim). */
enum claim_outcome {
	CLAIM_WRITTEN,
	CLAIM_NOT_WRITTEN,    /* not sent, or refused by the caller */
	CLAIM_PREV_UNSETTLED, /* the worker's previous claim owes its rows */
	CLAIM_LEASE_ENDED,    /* the lease transaction is not in progress */
};

static enum claim_outcome claim_outcome(const PGresult *res)
{
	if (PQntuples(res) != 1 || strcmp(PQgetvalue(res, 0, 0), "t") != 0)
		return CLAIM_PREV_UNSETTLED;
	return strcmp(PQgetvalue(res, 0, 1), "0") != 0 ? CLAIM_WRITTEN
						       : CLAIM_LEASE_ENDED;
}

/* Records, committed, which rows the open lease holds: the sweeper charges
 * their attempt if the transaction aborts (docs/design.md §4). The claim
 * is named holder#xid, the lease transaction's id: known before the reply,
 * so a claim whose reply was lost is still the one a release gives up. */
static int write_claim_now(struct store *s, const struct lease_batch *b,
			   char *err, size_t errlen)
{
	if (s->claims_missing)
		return 0;
	int rc = claim_session(s, err, errlen);
	if (rc != 0)
		return rc;
	const char **ids = malloc(b->n * sizeof(*ids));
	char *arr = NULL;
	char *key = store_asprintf("%s#%s", s->leased_by, b->rows->xid);
	if (ids) {
		for (size_t i = 0; i < b->n; i++)
			ids[i] = b->events[i].id;
		arr = store_pg_array(ids, b->n, PG_ARRAY_PLAIN, 0);
	}
	free(ids);
	if (!arr || !key) {
		free(arr);
		free(key);
		snprintf(err, errlen, "claim: out of memory");
		return STORE_ERROR;
	}
	char *prev = s->claim_key;
	const char *values[6] = {key, b->lease_id,  b->rows->xid,
				 arr, s->ce_source, prev};
	PGresult *res = store_run(s->claim, ST_CLAIM, 6, values,
				  PGRES_TUPLES_OK, 0, &rc, err, errlen);
	/* Written, or perhaps written (an error may hide a commit): the
	 * claim's key is kept only then. */
	int got = res ? claim_outcome(res) : CLAIM_WRITTEN;
	if (got == CLAIM_PREV_UNSETTLED) {
		/* The previous claim is unsettled: settle it, then again. */
		PQclear(res);
		res = NULL;
		got = CLAIM_NOT_WRITTEN;
		rc = settle_own_claim(s, prev, err, errlen);
		if (rc == 0) {
			res = store_run(s->claim, ST_CLAIM, 6, values,
					PGRES_TUPLES_OK, 0, &rc, err, errlen);
			got = res ? claim_outcome(res) : CLAIM_WRITTEN;
		}
		if (got == CLAIM_PREV_UNSETTLED) {
			PQclear(res);
			res = NULL;
			got = CLAIM_NOT_WRITTEN;
			snprintf(err, errlen,
				 "claim: this worker's previous lease is not "
				 "settled yet: its transaction is still in "
				 "progress (a session lost half-open), or a "
				 "sweep is settling it now; leasing again once "
				 "it is");
			rc = STORE_ERROR;
		}
	}
	if (got == CLAIM_LEASE_ENDED) {
		/* The lease's session is what failed: the claim's is fine. */
		PQclear(res);
		free(arr);
		free(key);
		snprintf(err, errlen, "claim: %s; no row was handed over",
			 CLAIM_ENDED_WHY);
		return STORE_RECONNECT;
	}
	bool written = got == CLAIM_WRITTEN;
	free(arr);
	if (written) {
		/* From now on the claim releases and renewals move, and the
		 * one the next claim replaces. */
		s->claim_key = key;
		free(prev);
	} else {
		free(key);
	}
	if (!res && store_err_undefined_table(err) &&
	    store_claims_table_gone(s)) {
		no_claims(s, err);
		return 0;
	}
	if (!res) {
		if (rc == STORE_RECONNECT && !s->claim->ses->reply_late) {
			char why[256];
			store_reconnect(s->claim, why, sizeof(why));
		}
		return store_public_rc(rc);
	}
	PQclear(res);
	return 0;
}

/* Called once, from inside the claim's wait, when its reply is late:
 * the lease is rolled back at once, which gives its server connection
 * back to a pool the claim may be waiting for, and the claim's wait goes
 * on to learn its fate (store_lease()). */
static void give_lease_up(void *arg)
{
	struct store *s = arg;
	char why[256];
	if (s->ses->leasing == s)
		store_lease_end(s, TX_ROLLBACK, why, sizeof(why));
	s->lease_given_up = true;
}

static int write_claim(struct store *s, const struct lease_batch *b, char *err,
		       size_t errlen)
{
	struct store_session *ses = claim_ses(s);
	if (!ses) {
		snprintf(err, errlen, "claim session: out of memory");
		return STORE_ERROR;
	}
	/* Between half the wait and all of it, so that of leases whose
	 * claims wait for a pool together one gives up first, and the
	 * connection it gives back lets another's claim through. */
	int64_t wait = claim_wait_ms(s);
	uint32_t r;
	if (getrandom(&r, sizeof(r), 0) == (ssize_t)sizeof(r))
		wait = wait / 2 + (int64_t)(r % (uint32_t)(wait / 2 + 1));
	s->lease_given_up = false;
	s->claim_waited_ms = wait;
	ses->reply_wait_ms = wait;
	ses->on_late = give_lease_up;
	ses->on_late_arg = s;
	int rc = write_claim_now(s, b, err, errlen);
	ses->on_late = NULL;
	ses->reply_wait_ms = claim_wait_ms(s);
	return rc;
}

/* BEGIN, the lease statement, and for a non-empty lease its claim. An
 * empty lease ends its transaction at once; a lease whose claim cannot be
 * written is rolled back (nothing was handed over). */
int store_lease(struct store *s, const char *const *paused, size_t n_paused,
		const char *default_destination, struct lease_batch *out,
		char *err, size_t errlen)
{
	int rc;
	char why[256];
	memset(out, 0, sizeof(*out));
	if (s->ses->leasing && s->ses->leasing != s) {
		snprintf(err, errlen,
			 "lease: another table's lease is open on this "
			 "session; conclude it first");
		return STORE_ERROR;
	}
	if (s->ses->leasing == s) {
		/* A caller that dropped a batch without concluding it: leasing
		 * inside that transaction would keep its rows locked. */
		log_error("a lease was left open without being concluded; "
			  "rolling it back");
		store_lease_end(s, TX_ROLLBACK, why, sizeof(why));
	}
	/* Once per session in ordered mode, before its first lease: old
	 * rows the destination CHECK refuses are failed, with the reason,
	 * so a key meets them as failed rows (under block, its block) and
	 * not as rows that fail the mark of the batch carrying them. The
	 * relay refuses a table older than schema 004 (store.c), so the
	 * CHECK is in place and no new row can break it: once is enough.
	 * It scans nothing once the CHECK is valid. */
	if (s->opt.ordered && s->refused_gen != s->ses->conn_gen) {
		size_t failed;
		rc = store_fail_refused(s, &failed, err, errlen);
		if (rc != 0)
			return store_public_rc(rc);
		s->refused_gen = s->ses->conn_gen;
	}
	char *paused_arr =
	    store_pg_array(paused, n_paused, PG_ARRAY_QUOTED, 4096);
	if (!paused_arr) {
		snprintf(err, errlen, "lease: out of memory");
		return STORE_ERROR;
	}
	char floor[40], claims_floor[24], written_floor[24];
	int64_t started_ms = clock_ms();
	bool lifted = store_paused_lifted(s, paused, n_paused);
	bool paused_changed = lifted || store_paused_added(s, paused, n_paused);
	bool rescan = store_lease_rescans(s, lifted, started_ms, floor);
	bool keymap = store_key_map_on(s);
	struct key_map_args map = {0};
	if (keymap && (rc = key_map_args(s, started_ms, &map, err, errlen))) {
		free(paused_arr);
		return rc;
	}
	bool claims_full = store_claims_floor_of(s, started_ms, claims_floor);
	/* A rescan reads from the start: no late scan ($6 NULL). */
	s->scan_from_us = rescan ? INT64_MIN : s->floor_us;
	s->scan_from_seq = rescan ? INT64_MIN : s->floor_seq;
	/* Unordered, the relay's stores start where the latest of them
	 * ended (due_turn.c), with the late scan's floor that goes with it. */
	uint64_t late_floor = s->written_floor;
	if (due_turn_begin(s, rescan, &s->scan_from_us, &s->scan_from_seq,
			   &late_floor) &&
	    !store_floor_text(s->scan_from_us, floor)) {
		snprintf(floor, sizeof(floor), "%s", "-infinity");
		s->scan_from_us = INT64_MIN;
		s->scan_from_seq = INT64_MIN;
	}
	char floor_seq[24];
	snprintf(floor_seq, sizeof(floor_seq), "%lld",
		 (long long)s->scan_from_seq);
	snprintf(written_floor, sizeof(written_floor), "%llu",
		 (unsigned long long)late_floor);
	/* Ordered mode's walk takes where the last one stopped ($7), or
	 * with the key map its window, the discovery floor, whether the
	 * window is the whole map and the keys' bounds ($7-$11). The
	 * floor's seq comes last. */
	const char *values[12] = {paused_arr,
				  default_destination ? default_destination
						      : "",
				  s->ce_source,
				  floor,
				  claims_floor,
				  rescan ? NULL : written_floor,
				  keymap ? map.keys : s->key_cursor,
				  map.floors,
				  map.disc,
				  map.whole ? "t" : "f",
				  map.bounds};
	int n_values = store_lease_params(s);
	values[n_values++] = floor_seq;
	/* Binary results: text columns arrive as they are and the payload
	 * needs no unescaping. */
	enum stmt st = s->claims_missing ? ST_LEASE_BARE : ST_LEASE;
	PGresult *res = store_run_leasing(s, st, n_values, values,
					  PGRES_TUPLES_OK, 1, &rc, err, errlen);
	if (!res && rc != STORE_RECONNECT && st == ST_LEASE &&
	    store_err_undefined_table(err)) {
		if (s->ses->leasing == s)
			store_lease_end(s, TX_ROLLBACK, why, sizeof(why));
		/* A table made by hand: lease without claims. */
		if (store_claims_table_gone(s)) {
			no_claims(s, err);
			res = store_run_leasing(s, ST_LEASE_BARE, n_values,
						values, PGRES_TUPLES_OK, 1, &rc,
						err, errlen);
		}
	}
	if (!res && rescan && rc != STORE_RECONNECT) {
		/* A rescan that failed (past the statement timeout: a long
		 * hold's dead entries below the floor, all stepped over) is
		 * spaced as one that took that long, as the key map's build
		 * is: left due, the next lease rescanned and failed the same
		 * way, every lease of a store without a shared schedule and
		 * one every interval with it. The leases from the floor go
		 * on meanwhile. Failed otherwise, it is due again in an
		 * interval. */
		int64_t ended_ms = clock_ms();
		s->rescans_failed++;
		store_rescan_done(
		    s, ended_ms,
		    store_failed_scan_took(s, ended_ms - started_ms));
	}
	if (paused_changed && (res || !lifted))
		store_paused_seen(s, paused, n_paused);
	free(paused_arr);
	key_map_args_free(&map);
	if (res && (rescan || claims_full)) {
		int64_t ended_ms = clock_ms(), took = ended_ms - started_ms;
		if (rescan)
			store_rescan_done(s, ended_ms, took);
		if (claims_full)
			s->claims_rescan_at_ms =
			    store_rescan_due(s, ended_ms, took);
	}
	if (res && store_lease_found_none(s, res)) {
		PQclear(res);
		res = NULL;
	}
	if (res && PQntuples(res) > 0)
		rc = store_take_rows(s, res, out, err, errlen);
	else
		PQclear(res);
	bool claimed = false;
	if (rc == 0 && out->n > 0 && GUARD_CLAIM_BEFORE_HANDOVER) {
		rc = write_claim(s, out, err, errlen);
		claimed = true;
	}
	if (claimed && s->lease_given_up) {
		/* Rolled back while the claim waited. Written nonetheless
		 * (it passed its LIVE test before the rollback and committed
		 * after), or perhaps (no reply at all), it gives its rows up
		 * now, so that no sweep charges them; a claim that ran
		 * after the rollback wrote nothing. */
		char why[256];
		if (rc != STORE_RECONNECT || !strstr(err, CLAIM_ENDED_WHY))
			if (store_claim_release(s, out->lease_id, NULL, 0, why,
						sizeof(why)) != 0)
				log_warn("a lease given up for its late claim "
					 "could not take its rows out of that "
					 "claim, should it have been written "
					 "(the sweeper then charges them an "
					 "attempt): %s",
					 why);
		lease_batch_release(out);
		metrics_add(MC_GIVEN_UP, 1);
		snprintf(err, errlen,
			 "lease given up: its claim had no reply in %lld ms, "
			 "while the lease held its own server connection; "
			 "behind a transaction-mode pooler, every server "
			 "connection of the pool was likely held by a lease "
			 "waiting for its claim (size the pool for the relays' "
			 "lanes plus one); its rows were not handed over and "
			 "owe nothing",
			 (long long)s->claim_waited_ms);
		return STORE_ERROR;
	}
	if (rc != 0 || out->n == 0) {
		/* Nothing was handed over: the rows go back as they were. A
		 * claim whose reply was lost may have committed all the
		 * same; it gives them up first, or a sweep would charge
		 * them. */
		if (claimed)
			end_unhanded(s, out->lease_id);
		else if (s->ses->leasing == s)
			store_lease_end(s, TX_ROLLBACK, why, sizeof(why));
		lease_batch_release(out);
	}
	return store_public_rc(rc);
}

/* Keeps the lease transaction's session from the idle-in-transaction
 * timeout and moves the claim's expiry, which status shows. Every row
 * stays held while the transaction lives: none can be taken from it. */
int store_renew(struct store *s, char *err, size_t errlen)
{
	int rc;
	if (s->ses->leasing != s || !s->open_lease) {
		snprintf(err, errlen, "renew: no lease transaction is open");
		return STORE_RECONNECT;
	}
	PGresult *res = store_run(s, ST_KEEPALIVE, 0, NULL, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	PQclear(res);
	const char *values[2] = {s->claim_key, s->open_lease->lease_id};
	char why[256];
	/* The claim's expiry is for people reading status: a failure to move
	 * it costs nothing the lease needs. */
	res =
	    s->claim && s->claim_key && claim_session(s, why, sizeof(why)) == 0
		? store_run(s->claim, ST_CLAIM_RENEW, 2, values,
			    PGRES_COMMAND_OK, 0, &rc, why, sizeof(why))
		: NULL;
	if (res)
		PQclear(res);
	else if (s->claim && s->claim_key)
		log_warn("claim renewal: %s", why);
	return 0;
}

int store_next_due_ms(struct store *s, int64_t *ms, char *err, size_t errlen)
{
	return store_next_due_since_ms(s, 0, ms, err, errlen);
}

int store_next_due_since_ms(struct store *s, int64_t since_ms, int64_t *ms,
			    char *err, size_t errlen)
{
	int rc;
	char since[24];
	snprintf(since, sizeof(since), "%lld",
		 (long long)(since_ms > 0 ? since_ms : 0));
	const char *values[1] = {since};
	PGresult *res = store_run(s, ST_NEXT_DUE, 1, values, PGRES_TUPLES_OK, 0,
				  &rc, err, errlen);
	if (!res)
		return store_public_rc(rc);
	*ms = strtoll(PQgetvalue(res, 0, 0), NULL, 10);
	PQclear(res);
	return 0;
}

int store_read_pauses(struct store *s, bool *global,
		      char (*keys)[STORE_PAUSE_KEY_MAX], size_t max_keys,
		      size_t *n, char *err, size_t errlen)
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
			snprintf(keys[(*n)++], STORE_PAUSE_KEY_MAX, "%s", d);
	}
	PQclear(res);
	return 0;
}
