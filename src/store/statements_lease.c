/* SPDX-License-Identifier: MIT */
/*
 * The lease statement (docs/design.md §4 and, for ordered mode, §6): the
 * one statement of a worker's every batch, and so the one whose cost a
 * table queue's floor is measured against. Read postgres-queue-pitfalls
 * and the design before changing it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "guards.h"
#include "store_internal.h"

/*
 * The lock lease (docs/design.md §4): rows are locked, not written, by the
 * transaction that will conclude them. The batch stops adding rows once
 * their payloads reach the byte budget (the first row always goes):
 * octet_length() reads a stored value's size without fetching it. Rows
 * locked but past the budget are left as they are and let go at the end. Rows
 * named by the claim of a lease that aborted are skipped until the sweeper has
 * charged them and made them crash suspects: leased again at once, a row that
 * crashed its relay would take a full batch of neighbours down with it on the
 * next one. (Postgres records an abort before it lets go of the row locks, so
 * such a row is never seen unlocked with its claim still in progress.) The
 * claims are read once, as the statement starts: the dead claims' rows are
 * skipped in the locking scans, and the claims still running then are asked
 * again (late) after every row is locked, when the rows are read back by
 * ctid: a lease that died between the two had its rows unlocked and its
 * claim dead, and without the second look they would be leased at once, as
 * no suspects, in a full batch. (A claim that committed cannot die later,
 * and one written after the statement began is not visible to it either
 * way, so the running ones are all the late look needs; issue 25, the
 * model's early_exclusion mutant, docs/model.md.) The
 * late look is an InitPlan of the read back's filter: Postgres runs an
 * InitPlan when its value is first needed, here on the first row the TID
 * scan returns, after that scan evaluated its TID list, the picked rows,
 * which locked them all. No store test forces the race (the model does).
 * Rows it leaves out stay locked by this transaction until it ends, like
 * rows past the byte budget. The
 * batch size is a literal so a generic plan never estimates the LIMIT as 10 %
 * of the table; the lease id is made once in its own CTE; a crash suspect is
 * leased at most one per batch, ahead of the due rows (UNION ALL keeps its
 * branches' order, and so does the window over it). CTEs are read lazily, so
 * the due CTE locks only what fits; the batch's LIMIT comes before the
 * window, which reads a row ahead of the one it returns: after it, a
 * full batch held one row more than it took, one the due turn could pass
 * (due_turn.c).
 *
 * $4, the scan floor (docs/design.md §4, "A held snapshot"), with its seq
 * in the last parameter (store_lease_params()): the due scan starts at the
 * lowest (next_attempt_at, seq) of the worker's previous batch, not at the
 * start of the index, because under an old snapshot the entries of
 * every row finished since it was taken can be neither removed nor marked
 * dead, and a scan from the start steps over all of them. '-infinity' scans
 * from the start; lease.c says when.
 *
 * $5, the claim floor (the same section): a transaction id below which
 * every claim is settled, so the claims read starts there, on the index
 * of migration 006, instead of visiting every claim version a held
 * snapshot keeps. The statement returns the next one with each row: the
 * lower of the oldest writer of a claim still open (running, or aborted
 * and not swept: it stays in reach until it settles) and the snapshot's
 * xmin (every transaction below it had ended when the statement began,
 * so a claim this snapshot does not see has a writer at or above it).
 * A floor past the cluster's next transaction id (a database restored
 * under a running relay) reads every claim. Claims of relays of version
 * 005 have no writer and are always read, by a second index scan: lease
 * transactions plan without bitmap scans, and an OR of the two would
 * read the whole table.
 *
 * $6, the late scan's floor (the same section): the xmin of the
 * snapshot of this session's previous lease. A row that lease could not
 * see (its writer still running, or not begun) has a writer at or above
 * it, so the late scan reads the written_by index of migration 007 from
 * there for rows below the scan floor: a row committed late by a long
 * transaction is leased by the next lease, and the scan reads the rows
 * of the last moments, not every entry a held snapshot keeps. Its rows
 * come before the due rows (older keys). The statement returns the next
 * floor: the lower of this snapshot's xmin and the oldest writer of the
 * late rows it picked (one of them released goes back below the scan
 * floor, and the late scan must meet it again; those it did not pick
 * have writers at or above it, read in that order). NULL skips the scan
 * (a rescan reads from the start of the index anyway).
 *
 * What it costs Postgres is measured per batch (docs/design.md §4, "the
 * statements' own cost"): the locking scans carry only each row's ctid and
 * size, so the byte-budget window copies no payload; the picked rows are read
 * back by ctid (a locked row cannot move while its lock is held), which costs a
 * heap fetch where a primary-key lookup costs an index descent; every
 * column goes out in its binary form (uuid, int8, timestamptz), so no text
 * conversion runs on the server. pg_current_xact_id_if_assigned(): locking a
 * row assigned the transaction an id; an empty lease gets none and writes
 * nothing.
 */
/* One step of ordered mode's key walk (docs/design.md §6): the first
 * live row of the first key past a key (%2$s), read from key_idx, one
 * descent; %3$d says which of the two walks (keyed_sql) found it, %4$s
 * how many keys this lease's walk has stepped to so far. */
#define KEY_STEP                                                               \
	"SELECT o.partition_key AS pk, o.ctid AS tid, o.xmin AS xm, o.seq "    \
	"AS sq, o.next_attempt_at AS at, o.status AS st, o.suspect AS sus, "   \
	"o.exchange AS ex, o.routing_key AS rk, o.id, %3$d AS w, %4$s AS n "   \
	"FROM %1$s o WHERE o.status IN ('pending', 'in_flight') AND "          \
	"o.partition_key IS NOT NULL AND o.partition_key %2$s ORDER BY "       \
	"o.partition_key, o.seq LIMIT 1"

/* A walk named name: from the first key past from (the lease's n0-th
 * step), then key after key while the lease has stepped to fewer than
 * cap keys and until (on the last key walked, k) holds. */
static char *walk_sql(const char *T, const char *name, const char *from, int w,
		      const char *n0, size_t cap, const char *until)
{
	char *first = store_asprintf(KEY_STEP, T, from, w, n0);
	char *next = store_asprintf(KEY_STEP, T, "> k.pk", w, "k.n + 1");
	char *sql = first && next
			? store_asprintf("%s AS ((%s) UNION ALL "
					 "SELECT n.* FROM %s k CROSS "
					 "JOIN LATERAL (%s) n WHERE k.n < "
					 "%zu%s), ",
					 name, first, name, next, cap, until)
			: NULL;
	free(first);
	free(next);
	return sql;
}

/* A candidate of the key walk (c) whose key is not stopped by a blocking
 * row below it (NOT_BLOCKED_BEFORE). */
static char *not_blocked_sql(const struct store *s)
{
	return store_asprintf("AND " NOT_BLOCKED_BEFORE("c.pk", "c.sq"),
			      s->blocked, s->table.quoted);
}

/*
 * Ordered mode's keyed rows (docs/design.md §6, "The key lock"): for each
 * key its first live row, and only while it is pending, due, not a dead
 * claim's, not bound for a paused destination and its key not blocked.
 * The lock of the lease's transaction is what says the key is out: a key
 * whose first row another lease holds is skipped (SKIP LOCKED), and a
 * later row of a key is never a candidate while an earlier one lives, so
 * no row is written to say which row heads its key. A row in backoff
 * holds its key by being first and not due.
 *
 * Under block a key stops at the row that blocked it: its rows before
 * that one (a key blocked while its first row was out, by an old row
 * further down that the destination CHECK refuses) still go, in order.
 * A blocking row gone from the table stops the whole key.
 *
 * The walk goes from key to key along key_idx, one descent a key, from
 * the key after $7 (where this session's previous keyed lease stopped) to
 * the last, then from the first up to $7 (NULL: from the first), so every
 * key gets its turn however many there are; it stops once the batch is
 * full (the lateral lock and the LIMIT pull it a row at a time), or
 * after key_walk_cap keys (KEY_WALK_CAP): with many keys and few due (a
 * broker outage puts every key's first row in backoff) a lease then
 * costs at most that many descents, and the next goes on from there
 * (measured: 100,000 keys none due, 452 ms walked whole).
 *
 * The walk reads with the statement's snapshot and locks after: a
 * redrive that commits in between puts an earlier row of the key back
 * while this lease goes on to lock the row it found first. The redrive
 * writes that row (sql_redrive_ordered), and the lock takes a row only
 * if its version is still the one the walk read (xmin): Postgres locks
 * the newest version of a row updated since the snapshot and rechecks
 * the conditions on it, which that one fails (docs/model.md, the
 * key_early mutant). A crash suspect among the first rows is leased only
 * if the unkeyed suspect branch found none, and one a batch.
 */
static char *keyed_sql(const struct store *s, bool claims)
{
	const char *T = s->table.quoted;
	/* The second walk runs only when the first ended before the cap;
	 * by then the first was read whole, so counting it reads nothing
	 * new. */
	size_t cap = s->key_walk_cap;
	char *on = walk_sql(T, "walk_on", "> $7::text", 0, "1::int8", cap, "");
	char *from = store_asprintf(
	    ">= '' AND (SELECT count(*) FROM walk_on) < %zu", cap);
	char *round =
	    from ? walk_sql(T, "walk_round", from, 1,
			    "(SELECT count(*) FROM walk_on) + 1", cap,
			    " AND ($7::text IS NULL OR k.pk < $7::text)")
		 : NULL;
	free(from);
	char *not_blocked = not_blocked_sql(s);
	char *sql =
	    on && round && not_blocked
		? store_asprintf(
		      "%s%scand AS (SELECT c.*, count(*) FILTER (WHERE c.sus) "
		      "OVER (ROWS UNBOUNDED PRECEDING) AS ns FROM (SELECT * "
		      "FROM walk_on UNION ALL SELECT * FROM walk_round WHERE "
		      "$7::text IS NULL OR pk <= $7::text) c WHERE c.st = "
		      "'pending' AND c.at <= now() AND NOT (coalesce(c.ex, $2) "
		      "= ANY($1::text[]) OR coalesce(c.ex, $2) || chr(31) || "
		      "coalesce(c.rk, '') = ANY($1::text[])) %s %s), "
		      "keyed AS MATERIALIZED (SELECT l.tid, c.id AS rid, "
		      "l.bytes, c.sus, c.at, c.sq, c.pk, c.w FROM cand c "
		      "CROSS JOIN LATERAL (SELECT o.ctid AS tid, "
		      "coalesce(octet_length(o.payload), 0) AS bytes FROM %s o "
		      "WHERE "
		      "o.ctid = c.tid AND o.id = c.id AND o.xmin = c.xm AND "
		      "o.status = 'pending' " GUARD_LEASE_LOCK ") l WHERE NOT "
		      "c.sus OR (c.ns = 1 AND NOT EXISTS (SELECT 1 FROM "
		      "suspect)) LIMIT %d), ",
		      on, round,
		      claims
			  ? "AND NOT c.id = ANY(ARRAY(SELECT x FROM crashed))"
			  : "",
		      not_blocked, T, s->opt.batch_size)
		: NULL;
	free(on);
	free(round);
	free(not_blocked);
	return sql;
}

/* The key map's discovery floor, $9 (lease.c): as WRITTEN_FLOOR, a floor
 * past the cluster's next transaction id reads every writer. */
#define KEY_MAP_FLOOR                                                          \
	"(CASE WHEN $9::xid8 > pg_snapshot_xmax(pg_current_snapshot()) THEN "  \
	"'0'::xid8 ELSE $9::xid8 END)"

/* A descent of key_idx to key m.k's first live row of seq %2$s. */
#define KEY_DESCENT                                                            \
	"SELECT o.ctid AS tid, o.xmin AS xm, o.seq AS sq, o.next_attempt_at "  \
	"AS at, o.status AS st, o.suspect AS sus, o.exchange AS ex, "          \
	"o.routing_key AS rk, o.id FROM %1$s o WHERE o.status IN ('pending', " \
	"'in_flight') AND o.partition_key IS NOT NULL AND o.partition_key = "  \
	"m.k AND o.seq %2$s ORDER BY o.seq LIMIT 1"

/*
 * Ordered mode's keyed rows with the key map (docs/design.md §6, "The key
 * map"), on a table with written_by: the walk steps from key to key of a
 * window of the session's map ($7, $8, $11: keys in the walk's order,
 * each with the seq below which it had no live row as this session's
 * previous lease or the map's build saw it, and the bound its descent
 * reads up to first), each one descent of key_idx from the key's floor.
 * key_idx's entries below a floor are of rows finished before it, and a held
 * snapshot keeps every one of them: the walk along the index read them all at
 * every lease. Here a descent steps over the rows of its key finished since the
 * previous lease, and the step to the next key reads no index at all.
 *
 * The discovery: the keyed rows written by a transaction at or after $9
 * (the xmin of the previous lease's snapshot, so every row it could not
 * see) lower their keys' floors in the window, and, when the window is
 * the whole map ($10), keys not in it are new and walked after it from
 * their discovered rows. It reads in writer order, as the late scan
 * does: with no sort allowed, that order is its own index's, where
 * Postgres, left to choose, read the whole pending index for it (54,302
 * buffers a lease 40 s into a held snapshot, 1,000 events/s).
 *
 * The walk reads the window straight from its arrays, in their order
 * (the unnest's, then the new keys'), and a key's discovered floor from
 * one JSON object of the discoveries, looked up by key: a join of the
 * window to the discoveries built a hash of the whole window at every
 * lease and sorted it back into order, a fifth of the lease's time
 * before its first descent (docs/benchmark.md, "Ordered mode: the
 * window read in its order").
 *
 * The descents are pulled a key at a time by the lock, as the walk along
 * the index was. What comes back, on the first row, is what the session
 * merges into its map (lease_rows.c): each key walked with its first live
 * row's seq (NULL: none, the key leaves the map), and the keys
 * discovered but not walked with their lowest new seq. When the batch
 * filled, the walk stopped at its last row's key, so the keys up to it
 * are the ones walked; otherwise it was read whole.
 */
static char *keyed_map_sql(const struct store *s, bool claims)
{
	const char *T = s->table.quoted;
	char *not_blocked = not_blocked_sql(s);
	/* The key's descent up to its bound (m.b; NULL: none) first, then
	 * past it only when that found nothing: one search, in two parts
	 * (key_map.c, key_map_bound). A key without a bound runs the first
	 * alone, unbounded: an index scan of a NULL bound starts no descent,
	 * but starting one for every key made a lease of keys without
	 * bounds dearer (docs/benchmark.md, "Ordered mode: the descent's
	 * bound"). */
	char *near = store_asprintf(
	    KEY_DESCENT, T,
	    ">= m.f AND o.seq <= coalesce(m.b, 9223372036854775807)");
	char *past = store_asprintf(KEY_DESCENT, T, ">= m.f AND o.seq > m.b");
	if (!not_blocked || !near || !past) {
		free(not_blocked);
		free(near);
		free(past);
		return NULL;
	}
	char *sql = store_asprintf(
	    "disc AS MATERIALIZED (SELECT partition_key AS k, min(seq) AS f "
	    "FROM (SELECT partition_key, seq FROM %1$s WHERE status = "
	    "'pending' AND written_by IS NOT NULL AND written_by "
	    ">= " KEY_MAP_FLOOR " AND " WRITTEN_HERE
	    " AND partition_key IS NOT NULL ORDER BY written_by) d GROUP BY "
	    "partition_key), "
	    "dj AS MATERIALIZED (SELECT jsonb_object_agg(k, f) AS j FROM "
	    "disc), "
	    "fresh AS MATERIALIZED (SELECT d.k, d.f, %2$zu + row_number() "
	    "OVER () AS n FROM disc d WHERE $10::bool AND d.k NOT IN (SELECT "
	    "unnest($7::text[]))), "
	    "walk AS (SELECT m.k AS pk, m.n, d.* FROM (SELECT w.k, "
	    "least(w.f, ((SELECT j FROM dj) ->> w.k)::int8) AS f, w.b, w.n "
	    "FROM unnest($7::text[], $8::int8[], $11::int8[]) WITH "
	    "ORDINALITY AS w(k, f, b, n) UNION ALL SELECT k, f, NULL::int8, n "
	    "FROM fresh) m LEFT JOIN LATERAL ((%6$s) UNION ALL (%7$s) LIMIT "
	    "1) d ON true), "
	    "cand AS (SELECT c.*, count(*) FILTER (WHERE c.sus) OVER (ROWS "
	    "UNBOUNDED PRECEDING) AS ns FROM walk c WHERE c.st = 'pending' "
	    "AND c.at <= now() AND NOT (coalesce(c.ex, $2) = ANY($1::text[]) "
	    "OR coalesce(c.ex, $2) || chr(31) || coalesce(c.rk, '') = "
	    "ANY($1::text[])) %3$s "
	    "%4$s), "
	    "keyed AS MATERIALIZED (SELECT l.tid, c.id AS rid, l.bytes, c.sus, "
	    "c.at, c.sq, c.pk, c.n FROM cand c CROSS JOIN LATERAL (SELECT "
	    "o.ctid AS tid, coalesce(octet_length(o.payload), 0) AS bytes FROM "
	    "%1$s o "
	    "WHERE o.ctid = c.tid AND o.id = c.id AND o.xmin = c.xm AND "
	    "o.status = "
	    "'pending' " GUARD_LEASE_LOCK ") l WHERE NOT c.sus OR (c.ns = 1 "
	    "AND NOT EXISTS (SELECT 1 FROM suspect)) LIMIT %5$d), "
	    "upd AS MATERIALIZED (SELECT pk AS k, sq AS f FROM walk LIMIT "
	    "(SELECT least(x, cardinality($7::text[])) + (SELECT count(*) "
	    "FROM fresh WHERE n <= x) FROM (SELECT CASE WHEN (SELECT "
	    "count(*) FROM keyed) >= %5$d THEN (SELECT max(n) FROM keyed) "
	    "ELSE coalesce((SELECT max(n) FROM fresh), "
	    "cardinality($7::text[])) END AS x) l)), "
	    "found AS MATERIALIZED (SELECT k, f FROM disc WHERE NOT EXISTS "
	    "(SELECT 1 FROM upd u WHERE u.k = disc.k)), "
	    "next_map AS MATERIALIZED (SELECT (SELECT array_agg(k) FROM "
	    "upd) AS wk, (SELECT array_agg(f) FROM upd) AS wf, (SELECT "
	    "array_agg(k) FROM found) AS dk, (SELECT array_agg(f) FROM found) "
	    "AS df), ",
	    T, s->key_walk_cap,
	    claims ? "AND NOT c.id = ANY(ARRAY(SELECT x FROM crashed))" : "",
	    not_blocked, s->opt.batch_size, near, past);
	free(not_blocked);
	free(near);
	free(past);
	return sql;
}

/* The build of the key map (docs/design.md §6, "The key map"): every key
 * with a live row and its first live row's seq, by the walk along
 * key_idx, one descent a key; and the xmin of its snapshot, the first
 * discovery floor (a row it could not see has a writer at or above it).
 * At a session's first ordered lease, after a reconnect and at each
 * rescan: under a held snapshot it steps over every entry the snapshot
 * keeps, as the walk did at every lease. */
char *sql_key_map(const struct store *s)
{
	const char *T = s->table.quoted;
	return store_asprintf(
	    "WITH RECURSIVE w AS ((SELECT partition_key AS pk, seq AS sq FROM "
	    "%1$s WHERE status IN ('pending', 'in_flight') AND partition_key "
	    "IS NOT NULL ORDER BY partition_key, seq LIMIT 1) UNION ALL "
	    "SELECT n.pk, n.sq FROM w CROSS JOIN LATERAL (SELECT "
	    "o.partition_key AS pk, o.seq AS sq FROM %1$s o WHERE o.status IN "
	    "('pending', 'in_flight') AND o.partition_key IS NOT NULL AND "
	    "o.partition_key > w.pk ORDER BY o.partition_key, o.seq LIMIT 1) "
	    "n) SELECT array_agg(pk), array_agg(sq), "
	    "pg_snapshot_xmin(pg_current_snapshot()) FROM w",
	    T);
}

static char *lease_sql(const struct store *s, bool claims)
{
	const char *T = s->table.quoted;
	int n = s->opt.batch_size;
	bool ordered = s->opt.ordered;
	/* One read of the claims table per lease: under a held snapshot
	 * it keeps a version of every claim written since, and a read
	 * visits them all. The claims whose transaction is still running
	 * are kept with their ids, and only they are asked again late. */
	char *crashed =
	    claims ? store_asprintf(
			 "open_claims AS MATERIALIZED (SELECT written_by, xid, "
			 "ids, st FROM (SELECT written_by, xid, ids, %s AS st "
			 "FROM (SELECT written_by, xid, ids FROM %s WHERE "
			 "written_by >= " CLAIMS_FLOOR " UNION ALL SELECT "
			 "written_by, xid, ids FROM %s WHERE written_by IS "
			 "NULL) a WHERE cardinality(ids) > 0) c WHERE st IN "
			 "('aborted', 'in progress')), crashed AS MATERIALIZED "
			 "(SELECT unnest(ids) AS x FROM open_claims WHERE st = "
			 "'aborted'), ",
			 CLAIM_XACT_STATUS("xid"), s->claims, s->claims)
		   : strdup("");
	const char *skip_crashed =
	    claims ? "AND NOT id = ANY(ARRAY(SELECT x FROM crashed)) " : "";
	char *late =
	    claims ? strdup("late AS MATERIALIZED (SELECT unnest(ids) AS x "
			    "FROM open_claims WHERE st = 'aborted' OR "
			    "pg_xact_status(xid) = 'aborted'), ")
		   : strdup("");
	const char *skip_late =
	    claims ? " AND NOT t.id = ANY(ARRAY(SELECT x FROM late))" : "";
	bool keymap = store_key_map_on(s);
	char *keyed = keymap	? keyed_map_sql(s, claims)
		      : ordered ? keyed_sql(s, claims)
				: strdup("");
	/* Rows bound for a paused destination (or destination + routing
	 * key) are not leased; $1 is the paused list, $2 the default. In
	 * ordered mode the unkeyed rows only (keyed ones are the walk's):
	 * the partial index of 002 holds them (and old relays' heads). */
	const char *not_paused =
	    ordered ? "partition_key IS NULL AND NOT "
		      "(coalesce(exchange, $2) = ANY($1::text[]) OR "
		      "coalesce(exchange, $2) || chr(31) || "
		      "coalesce(routing_key, '') = "
		      "ANY($1::text[]))"
		    : "NOT (coalesce(exchange, $2) = ANY($1::text[]) OR "
		      "coalesce(exchange, $2) || chr(31) || "
		      "coalesce(routing_key, '') = "
		      "ANY($1::text[]))";
	/* The late scan: rows below the floor ($4) written by a transaction
	 * at or after $6, the xmin of this session's previous lease's
	 * snapshot: the rows that lease could not see yet (in ordered mode
	 * unkeyed ones: keyed rows are the walk's, which has no floor). */
	bool has_below = !s->written_missing;
	int floor_seq = store_lease_params(s) + 1;
	char *below =
	    !has_below
		? strdup("")
		: store_asprintf(
		      "below AS MATERIALIZED (SELECT ctid AS tid, id AS rid, "
		      "coalesce(octet_length(payload), 0) AS bytes, written_by "
		      "AS w FROM "
		      "%s WHERE status = 'pending' AND NOT suspect AND "
		      "written_by >= " WRITTEN_FLOOR " AND " WRITTEN_HERE
		      " AND next_attempt_at <= "
		      "$4::timestamptz AND (next_attempt_at, seq) < "
		      "($4::timestamptz, $%d::int8) AND next_attempt_at <= "
		      "now() AND %s %sORDER BY written_by LIMIT "
		      "%d " GUARD_LEASE_LOCK "), ",
		      T, floor_seq, not_paused, skip_crashed, n);
	/* What the byte window takes from, in order: a suspect first, then
	 * the late rows, then the due ones. Ordered mode merges the keyed
	 * rows with the unkeyed by next_attempt_at, so neither kind waits
	 * for a backlog of the other; its late rows go first among them. */
	char *rows =
	    ordered ? store_asprintf(
			  "SELECT tid, rid, bytes, w FROM (SELECT tid, rid, "
			  "bytes, NULL::xid8 AS w, 0 AS o, now() AS at, "
			  "0::int8 AS sq FROM suspect %sUNION ALL SELECT tid, "
			  "rid, bytes, NULL::xid8, CASE WHEN sus THEN 0 ELSE "
			  "1 END, at, sq FROM keyed UNION ALL SELECT tid, "
			  "rid, bytes, NULL::xid8, 1, at, sq FROM due) m "
			  "ORDER BY o, at, sq",
			  has_below ? "UNION ALL SELECT tid, rid, bytes, w, 1, "
				      "'-infinity'::timestamptz, 0::int8 FROM "
				      "below "
				    : "")
		    : store_asprintf("SELECT tid, rid, bytes, NULL::xid8 AS w "
				     "FROM suspect %sUNION ALL SELECT tid, "
				     "rid, bytes, NULL::xid8 FROM due",
				     has_below ? "UNION ALL SELECT tid, rid, "
						 "bytes, w FROM below "
					       : "");
	/* The next late scan's floor: the lowest writer of every late row
	 * read, taken or not (a suspect filling the batch, the byte budget,
	 * ordered mode's ties); those its LIMIT left have writers above
	 * them. From the picked rows alone it passed a late row left out,
	 * which then waited for the next rescan. */
	const char *written_floor =
	    !has_below
		? "$6::xid8" /* unused, but every lease takes it */
		: "(SELECT least(pg_snapshot_xmin(pg_current_snapshot()), "
		  "min(w)) FROM below)";
	/* Whether the late scan held rows the batch left out (a suspect
	 * first, the byte budget): let go at the lease's end below a due
	 * turn that others, stepping over them as held, may have moved on
	 * with a floor past their writers, so the lease moves the turn and
	 * its floor back (due_turn.c). */
	const char *late_left =
	    !has_below ? "false"
		       : "(SELECT count(*) FROM picked WHERE w IS NOT NULL) "
			 "< (SELECT count(*) FROM below)";
	/* Where the next keyed lease's walk starts: after the last key this
	 * one took, in the walk's order, when the batch filled; otherwise
	 * the walk ended (at the cap, or having come round) and was read
	 * whole, and the next goes on from its last key. NULL (no key at
	 * all) keeps the place. An ordered lease that picked nothing still
	 * returns one row, every column NULL but these, to carry the place
	 * back (lease.c). */
	char *cursor =
	    keymap ? store_asprintf(
			 ", CASE WHEN (SELECT count(*) FROM keyed) >= %d THEN "
			 "(SELECT k.pk FROM keyed k WHERE k.rid = "
			 "ANY(ARRAY(SELECT rid FROM picked)) ORDER BY k.n "
			 "DESC LIMIT 1) ELSE "
			 "coalesce((SELECT k FROM fresh "
			 "ORDER BY n DESC LIMIT 1), "
			 "($7::text[])[cardinality($7::text[])]) END, CASE "
			 "WHEN row_number() OVER () = "
			 "1 THEN (SELECT wk FROM next_map) END, CASE WHEN "
			 "row_number() OVER () = 1 THEN (SELECT wf FROM "
			 "next_map) END, CASE WHEN row_number() OVER () = 1 "
			 "THEN (SELECT dk FROM next_map) END, CASE WHEN "
			 "row_number() OVER () = 1 THEN (SELECT df FROM "
			 "next_map) END",
			 n)
	    : ordered
		? store_asprintf(
		      ", CASE WHEN (SELECT count(*) FROM keyed) >= %d THEN "
		      "(SELECT k.pk FROM keyed k WHERE k.rid = "
		      "ANY(ARRAY(SELECT rid FROM picked)) ORDER BY k.w "
		      "DESC, k.pk DESC LIMIT 1) ELSE (SELECT a.pk FROM "
		      "(SELECT pk, w, n FROM walk_on UNION ALL SELECT pk, "
		      "w, n FROM walk_round) a ORDER BY a.w DESC, a.n DESC "
		      "LIMIT 1) END",
		      n)
		: strdup("");
	char *from_t = store_asprintf(
	    ordered ? "(SELECT 1) one LEFT JOIN %s t ON " : "%s t WHERE ", T);
	char *sql =
	    crashed && late && keyed && below && rows && cursor && from_t
		? store_asprintf(
		      "WITH %slease AS MATERIALIZED (SELECT "
		      "gen_random_uuid() AS lease_id), %s%s"
		      "suspect AS MATERIALIZED (SELECT ctid AS tid, id AS rid, "
		      "coalesce(octet_length(payload), 0) AS bytes FROM %s "
		      "WHERE status = 'pending' AND suspect AND "
		      "next_attempt_at <= now() AND %s %s"
		      "ORDER BY next_attempt_at, seq LIMIT "
		      "1 " GUARD_LEASE_LOCK "), %s%s"
		      "due AS MATERIALIZED (SELECT ctid AS tid, id AS rid, "
		      "coalesce(octet_length(payload), 0) AS bytes%s FROM %s "
		      "WHERE status = 'pending' AND NOT suspect AND "
		      "next_attempt_at <= now() AND (next_attempt_at, seq) >= "
		      "($4::timestamptz, $%d::int8) AND %s %s"
		      "ORDER BY next_attempt_at, seq LIMIT %d " GUARD_LEASE_LOCK
		      "), "
		      "picked AS (SELECT tid, rid, w FROM (SELECT tid, rid, w, "
		      "sum(bytes) "
		      "OVER (ROWS UNBOUNDED PRECEDING) - bytes AS before FROM "
		      "(%s LIMIT %d) u) q WHERE before < %lld) "
		      "SELECT t.id, t.seq, t.type, coalesce(t.source, %s$3), "
		      "t.subject, t.content_type, t.exchange, t.routing_key, "
		      "t.partition_key, t.payload, t.headers::text, "
		      "t.created_at, t.attempts + 1, t.max_attempts, (SELECT "
		      "lease_id FROM lease), " GUARD_LEASE_XID ", "
		      "t.ctid, t.next_attempt_at, %s, %s, t.suspect, %s%s "
		      "FROM %s"
		      "t.ctid = ANY(ARRAY(SELECT tid FROM picked)) AND t.id = "
		      "ANY(ARRAY(SELECT rid FROM picked))" ROW_ID_RANGE(
			  "rid", "picked") "%s",
		      ordered && !keymap ? "RECURSIVE " : "", crashed, late, T,
		      not_paused, skip_crashed, below, keyed,
		      ordered ? ", next_attempt_at AS at, seq AS sq" : "", T,
		      floor_seq, not_paused, skip_crashed, n, rows, n,
		      (long long)s->opt.batch_bytes,
		      s->relay_source_missing ? "" : "t.relay_source, ",
		      claims ? "(SELECT least(min(written_by), "
			       "pg_snapshot_xmin(pg_current_snapshot())) FROM "
			       "open_claims)"
			     : "$5::xid8",
		      written_floor, late_left, cursor, from_t, skip_late)
		: NULL;
	free(below);
	free(crashed);
	free(late);
	free(keyed);
	free(rows);
	free(cursor);
	free(from_t);
	return sql;
}

char *sql_lease(const struct store *s)
{
	return lease_sql(s, true);
}

/* For a table made by hand without the claims table. */
char *sql_lease_bare(const struct store *s)
{
	return lease_sql(s, false);
}
