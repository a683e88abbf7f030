/* SPDX-License-Identifier: MIT */
/*
 * Test hooks of the store, for the store's own tests only: the raw
 * session (to watch its notices) and diagnostic session SQL (auto_explain
 * and plan settings). Nothing in the relay includes this.
 */
#ifndef OUTBOX_STORE_TEST_H
#define OUTBOX_STORE_TEST_H

#include <libpq-fe.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "store.h"

/* The session of s; owned by the store, replaced by a reconnect. */
PGconn *store_conn(struct store *s);

/* What store_lease_commit() asks after a COMMIT whose reply was lost,
 * on a session connected again: whether transaction xid committed (1),
 * did not (0), or is unknown (-1, err says why). */
int store_commit_status(struct store *s, const char *xid, char *err,
			size_t errlen);

/* The claim session of s, open once s leased a batch (NULL before). */
PGconn *store_claim_conn(struct store *s);

/* store_open() that also runs session_sql after the session settings. */
int store_open_traced(struct store **out, const struct store_options *opt,
		      const char *session_sql, char *err, size_t errlen);

/* Rolls the lease of b back leaving its claim as it is, as a lease lost
 * after the hand-over ends (a failed mark, a COMMIT refused): the sweeper
 * charges the claim's rows. store_lease_abort() is for a lease ended before
 * the hand-over, and gives the attempt back. */
int store_lease_rollback_charged(struct store *s, struct lease_batch *b,
				 char *err, size_t errlen);

/* The due turn's moves (due_turn.c), for its unit test: on to (at_us,
 * seq) with the late scan's floor written_floor if no move back came
 * since gen (true when it moved), and back to (at_us, seq), its floor
 * down to written_floor if that is lower. */
bool store_due_turn_on(struct store_due_turn *t, uint64_t gen, int64_t at_us,
		       int64_t seq, uint64_t written_floor);
void store_due_turn_back(struct store_due_turn *t, int64_t at_us, int64_t seq,
			 uint64_t written_floor);

/* Every store of the process runs as when a pool was seen to keep each
 * client's prepared statements itself (prepare_mode.c), as with
 * OUTBOX_PG_PREPARE=on from then on. */
void store_pool_keeps_statements(void);

/* The statement timeout of the validation of the days ahead's CHECK
 * (partitions.c), until_midnight_ms before the first of them begins: up
 * to a minute before it, at most VALIDATE_MAX_STATEMENTS statement
 * timeouts (none when 0); a second when less would be left. */
int64_t store_validate_bound_ms(int64_t until_midnight_ms,
				int64_t statement_timeout_ms);

/* Calls fn(arg) each time store_partitions_tend() on s has listed the
 * days past retention, before it drops the first: where another replica's
 * drop may come between. */
void store_on_partitions_listed(struct store *s, void (*fn)(void *arg),
				void *arg);

/* Calls fn(arg, attempt) before each try of store_partitions_tend() on s
 * to drop the check of the days ahead it did not make (attempt 0, 1...):
 * where another replica's cleaner may hold the cleaner's lock. */
void store_on_ahead_drop_try(struct store *s,
			     void (*fn)(void *arg, int attempt), void *arg);

/* The keys one ordered lease's walk steps to at most (at least 1;
 * KEY_WALK_CAP by default), so a test reaches the cap with a few keys.
 * Before the store's first lease: it rebuilds the lease statement. */
void store_set_key_walk_cap(struct store *s, size_t keys);

/* The floor of key in s's key map (the seq below which the key had no
 * live row), or -1 when the key is not in it. */
int64_t store_key_map_floor(const struct store *s, const char *key);

/* The seq up to which key's next descent looks first (the key's floor and
 * four of the larger of its rows' last two spacings), or -1 for none
 * (fewer than two seen, or the key not in the map). */
int64_t store_key_map_bound(const struct store *s, const char *key);

/* Makes the floors' moves the process's other stores shared since s
 * last looked, as s's next ordered lease does first. */
void store_key_map_catch_up(struct store *s);

/* Makes s's next ordered lease build its key map anew first, as a rescan
 * does. */
void store_key_map_expire(struct store *s);

/* How many scheduled key-map builds failed and were left for the map of
 * the last build, and how many scheduled rescans failed (each spaced as
 * one that took that long). */
unsigned store_key_map_builds_failed(const struct store *s);
unsigned store_rescans_failed(const struct store *s);

/* When the next scan from the start is due after one that ended at
 * ended_ms and took took_ms (lease_floors.c), for its unit test. */
int64_t store_rescan_due(const struct store *s, int64_t ended_ms,
			 int64_t took_ms);

/* store_contract() waiting settle_ms, not STORE_CONTRACT_SETTLE_MS, for
 * the heartbeats of relays that opened the table before a step's record. */
int store_contract_settled(const struct store_options *opt, int settle_ms,
			   FILE *out, char *err, size_t errlen);

/* store_partition() waiting settle_ms likewise. */
int store_partition_settled(const struct store_options *opt, int settle_ms,
			    FILE *out, char *err, size_t errlen);

/* The partition step's statement alone on conn, neither gated by the
 * relays' protocol nor recorded: the partitioned shape of the tests. */
int store_partition_unrecorded(PGconn *conn, const struct outbox_table *t,
			       char *err, size_t errlen);

/* The statements of a migration outside a transaction (sql, a template
 * of sql/), as migrate runs them, on conn for t, not recorded: a later
 * migration's index on the partitioned table, say. */
int store_migration_unrecorded(PGconn *conn, const struct outbox_table *t,
			       const char *sql, char *err, size_t errlen);

#endif
